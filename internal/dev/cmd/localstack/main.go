// Command localstack runs the relay on a throwaway local stack, for trying it
// out: a PostgreSQL cluster with the outbox schema, an in-process
// Kafka-protocol broker, the outbox-relay binary, and a demo producer that
// places orders for a few hundred customers in real transactions, some of
// which roll back, with a notification to a webhook for some. The demo
// shows what goes wrong as well: the webhook sometimes answers 503 with
// Retry-After, the broker is down for ten seconds every minute, and a few
// messages are poison (too large for the broker, or refused by the
// webhook), so breakers open and close, rows are retried, and dead letters
// appear in the console. A progress line shows what flows. With
// OUTBOX_DATABASE_URL or OUTBOX_KAFKA_BROKERS set it uses those instead
// (and leaves that broker alone). Ctrl-C stops everything and removes what
// it created.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgserver"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// term is the demo's terminal: the progress line, and every other line
// above it.
var term = newScreen(os.Stdout)

const (
	topic        = "orders"
	notifyTopic  = "notifications"
	maxOrderSize = 64 << 10 // the orders topic's max.message.bytes
)

func main() {
	relayBin := flag.String("relay", "bin/outbox-relay", "the outbox-relay binary to run")
	rate := flag.Int("rate", 200, "order transactions per second")
	customers := flag.Int("customers", 300, "distinct customers (message keys)")
	capture := flag.String("capture", "table", "where the producer writes: table (the outbox table) or log (the write-ahead log, with outbox_emit)")
	sinkKind := flag.String("sink", "kafka", "where the orders go: kafka (an in-process Kafka-protocol broker), nats (an in-process NATS server with JetStream), pubsub (Pub/Sub's in-process emulator), redis or rabbitmq (a local redis-server or RabbitMQ node), sqs (a local SQS emulator)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *relayBin, *sinkKind, *capture, *rate, *customers); err != nil {
		term.Done()
		fmt.Fprintln(os.Stderr, "localstack:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, relayBin, sinkKind, capture string, rate, customers int) error {
	switch sinkKind {
	case "kafka", "nats", "pubsub", "redis", "rabbitmq", "sqs":
	default:
		return fmt.Errorf("-sink %s: use kafka, nats, pubsub, redis, rabbitmq or sqs", sinkKind)
	}
	if capture != "table" && capture != "log" {
		return fmt.Errorf("-capture %s: use table or log", capture)
	}
	dsn := os.Getenv("OUTBOX_DATABASE_URL")
	if dsn == "" {
		fmt.Println("starting a throwaway PostgreSQL cluster ...")
		// Logical decoding, for capture from the log.
		srv, err := pgserver.Start(context.WithoutCancel(ctx), pgserver.Options{Settings: map[string]string{"wal_level": "logical"}})
		if err != nil {
			return err
		}
		defer func() {
			if err := srv.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "localstack: stop PostgreSQL:", err)
				return
			}
			fmt.Println("PostgreSQL stopped and its directory removed")
		}()
		dsn = srv.DSN("postgres")
	}
	// The orders' destination: its environment and configuration for the
	// relay, and how many orders reached it.
	var (
		ordersEnv  []string
		ordersYAML = ordersToKafka
		where      string
		stored     func(ctx context.Context, last int64) int64
	)
	switch sinkKind {
	case "kafka":
		brokers := os.Getenv("OUTBOX_KAFKA_BROKERS")
		if brokers == "" {
			fmt.Println("starting an in-process Kafka-protocol broker ...")
			c, err := kfake.NewCluster(kfake.NumBrokers(1))
			if err != nil {
				return err
			}
			defer func() {
				c.Close()
				fmt.Println("broker stopped")
			}()
			if err := c.CreateTopic(topic, 3, map[string]string{"max.message.bytes": strconv.Itoa(maxOrderSize)}); err != nil {
				return err
			}
			go brokerOutages(ctx, c)
			brokers = strings.Join(c.ListenAddrs(), ",")
		}
		var delivered atomic.Int64
		go consume(ctx, brokers, &delivered)
		stored = func(context.Context, int64) int64 { return delivered.Load() }
		ordersEnv, where = []string{"OUTBOX_KAFKA_BROKERS=" + brokers}, "brokers: "+brokers
	case "nats":
		fmt.Println("starting an in-process NATS server with JetStream ...")
		n, err := startNATS()
		if err != nil {
			return err
		}
		defer func() {
			n.close()
			fmt.Println("NATS server stopped and its directory removed")
		}()
		go outages(ctx, "NATS server", "the stream's", n.stop, n.start)
		stored, ordersYAML, where = n.stored, ordersToNATS(n.url), "NATS: "+n.url+" (stream ORDERS)"
	case "pubsub":
		fmt.Println("starting Pub/Sub's in-process emulator ...")
		srv, err := startPubSub()
		if err != nil {
			return err
		}
		defer func() {
			_ = srv.Close()
			fmt.Println("Pub/Sub emulator stopped")
		}()
		stored = func(context.Context, int64) int64 { return int64(len(srv.Messages())) }
		ordersYAML, where = ordersToPubSub(srv.Addr), "Pub/Sub emulator: "+srv.Addr+" (project "+pubsubProject+", topic orders)"
	case "redis", "rabbitmq", "sqs":
		start := map[string]func() (*localServer, error){"redis": startRedis, "rabbitmq": startRabbitMQ, "sqs": startSQS}[sinkKind]
		fmt.Printf("starting a throwaway %s ...\n", sinkKind)
		srv, err := start()
		if err != nil {
			return err
		}
		defer func() {
			srv.stop()
			fmt.Printf("%s stopped and its directory removed\n", srv.name)
		}()
		go outages(ctx, srv.name, srv.name+"'s", srv.halt, srv.relaunch)
		stored, ordersYAML, where = srv.stored, srv.orders, srv.name+": orders"
		ordersEnv = []string{"LOCALSTACK_RABBITMQ_PASSWORD=guest", "LOCALSTACK_SQS_SECRET=localstack"}
	}
	hook, stopHook, err := startWebhook()
	if err != nil {
		return err
	}
	defer stopHook()
	cfgFile, err := writeConfig(hook.url, ordersYAML)
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Dir(cfgFile))
	fmt.Println("database:", config.RedactURL(dsn))
	fmt.Println(where)

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return err
	}
	if capture == "log" {
		// As an operator would: 'outbox-relay capture setup'.
		setup := exec.CommandContext(ctx, relayBin, "capture", "setup")
		setup.Env = append(os.Environ(), "OUTBOX_DATABASE_URL="+dsn, "OUTBOX_RELAY_CAPTURE=log")
		setup.Stdout, setup.Stderr = os.Stdout, os.Stderr
		if err := setup.Run(); err != nil {
			return fmt.Errorf("capture setup: %w", err)
		}
	}

	adminAddr, err := freeAddr(envOr("OUTBOX_ADMIN_LISTEN", ""))
	if err != nil {
		return err
	}
	token := envOr("OUTBOX_ADMIN_TOKEN", rand.Text())
	relay := exec.Command(relayBin, "run")
	relay.Env = append(os.Environ(),
		"OUTBOX_DATABASE_URL="+dsn,
		"OUTBOX_ADMIN_LISTEN="+adminAddr, "OUTBOX_ADMIN_TOKEN="+token, "OUTBOX_ADMIN_ROLES=admin=operator", "OUTBOX_CONFIG="+cfgFile,
		// The console's trends fill within seconds, not at the minute.
		"OUTBOX_ADMIN_HISTORY_INTERVAL="+envOr("OUTBOX_ADMIN_HISTORY_INTERVAL", "5s"),
		"OUTBOX_LOG_LEVEL="+envOr("OUTBOX_LOG_LEVEL", "warn"),
		"OUTBOX_RELAY_CAPTURE="+capture)
	relay.Env = append(relay.Env, ordersEnv...)
	// Its log lines go above the progress line, never onto it.
	relay.Stdout, relay.Stderr = term.Lines(os.Stdout), term.Lines(os.Stderr)
	// Its own process group: Ctrl-C reaches it through us, as SIGTERM.
	relay.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := relay.Start(); err != nil {
		return fmt.Errorf("start %s (run 'make build' first): %w", relayBin, err)
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Wait() }()
	defer func() {
		_ = relay.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-relayDone:
			term.Printf("relay stopped: %s", exitText(err))
		case <-time.After(time.Minute):
			_ = relay.Process.Kill()
		}
	}()
	fmt.Printf("relay started (pid %d); demo producer: %d order transactions/s over %d customers, 1 in 10 rolled back\n",
		relay.Process.Pid, rate, customers)
	if sinkKind == "pubsub" {
		fmt.Println("trouble on purpose: the webhook answers 503 to 1 request in 8 (the emulator has no outages),")
	} else {
		fmt.Printf("trouble on purpose: the webhook answers 503 to 1 request in 8, the %s is down 10 s a minute,\n",
			map[string]string{"kafka": "in-process broker", "nats": "NATS server", "redis": "redis-server", "rabbitmq": "RabbitMQ node", "sqs": "SQS emulator"}[sinkKind])
	}
	fmt.Printf("and 1 order in 2,000 is too large for the %s, 1 notification in 400 refused by the webhook\n", map[string]string{"kafka": "broker", "nats": "server", "pubsub": "destination", "redis": "stream", "rabbitmq": "exchange", "sqs": "queue"}[sinkKind])
	fmt.Printf("console: http://%s/console/ (log in with the token %s)\n", adminAddr, token)
	fmt.Printf("dead-letter API: curl -H 'Authorization: Bearer %s' http://%s/api/v1/stats\n", token, adminAddr)
	fmt.Println("Press Ctrl-C to stop and clean up.")
	fmt.Println()

	var produced atomic.Int64
	go produce(ctx, pool, capture == "log", rate, customers, &produced)
	var d int64

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, lastAt := int64(0), time.Now()
	for {
		select {
		case <-ctx.Done():
			term.Done()
			return nil
		case err := <-relayDone:
			relayDone <- err
			return fmt.Errorf("the relay exited: %s", exitText(err))
		case now := <-tick.C:
			var pending, dead, oldestMS int64
			err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending'),
				count(*) FILTER (WHERE status = 'dead_lettered'),
				coalesce((extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'pending')) * 1000)::bigint, 0)
				FROM outbox`).Scan(&pending, &dead, &oldestMS)
			if err != nil {
				if ctx.Err() != nil {
					continue
				}
				return err
			}
			d = stored(ctx, d)
			perSec := float64(d-last) / now.Sub(lastAt).Seconds()
			last, lastAt = d, now
			term.Status(fmt.Sprintf("produced %7d | delivered %7d (%6.0f/s) | webhook %5d | pending %5d | dead-lettered %d | oldest pending %6s",
				produced.Load(), d, perSec, hook.delivered.Load(), pending, dead, (time.Duration(oldestMS) * time.Millisecond).String()))
		}
	}
}

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	m, err := migrations.New(db, migrations.DefaultSchema)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS demo_orders (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		customer text NOT NULL,
		total_cents int NOT NULL,
		placed_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// produce places orders: each transaction inserts an order and its outbox
// message, keyed by customer, and one in ten rolls back.
func produce(ctx context.Context, pool *pgxpool.Pool, emit bool, rate, customers int, produced *atomic.Int64) {
	producer, err := outbox.NewProducer(outbox.ProducerConfig{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "localstack: producer:", err)
		return
	}
	// Into the table, or with capture from the log into the log.
	write := func(ctx context.Context, tx pgx.Tx, m outbox.Message) ([]uuid.UUID, error) {
		return producer.Write(ctx, tx, m)
	}
	if emit {
		write = func(ctx context.Context, tx pgx.Tx, m outbox.Message) ([]uuid.UUID, error) {
			return producer.Emit(ctx, tx, m)
		}
	}
	rng := mrand.New(mrand.NewPCG(mrand.Uint64(), mrand.Uint64()))
	tick := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	defer tick.Stop()
	errRollback := errors.New("the customer changed their mind")
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		customer := fmt.Sprintf("customer-%d", rng.IntN(customers))
		total := 100 + rng.IntN(50_000)
		rollback := rng.IntN(10) == 0
		notes := ""
		if rng.IntN(2000) == 0 {
			notes = strings.Repeat("gift wrap, ", maxOrderSize/10) // poison: too large for the topic
		}
		notify := rng.IntN(5) == 0
		poison := rng.IntN(400) == 0
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO demo_orders (customer, total_cents) VALUES ($1, $2) RETURNING id`,
				customer, total).Scan(&id); err != nil {
				return err
			}
			_, err := write(ctx, tx, outbox.Message{
				Topic:   topic,
				Key:     customer,
				Payload: fmt.Appendf(nil, `{"order_id":%d,"customer":%q,"total_cents":%d,"notes":%q}`, id, customer, total, notes),
				Headers: map[string]string{"content-type": "application/json", "type": "order.placed"},
			})
			if err != nil {
				return err
			}
			if notify {
				_, err = write(ctx, tx, outbox.Message{
					Topic:   notifyTopic,
					Key:     customer,
					Payload: fmt.Appendf(nil, `{"order_id":%d,"customer":%q,"email":true,"poison":%t}`, id, customer, poison),
					Headers: map[string]string{"content-type": "application/json", "type": "order.notification"},
				})
				if err != nil {
					return err
				}
			}
			if rollback {
				return errRollback
			}
			return nil
		})
		switch {
		case err == nil:
			produced.Add(1)
		case errors.Is(err, errRollback) || ctx.Err() != nil:
		default:
			term.Errorf("localstack: producer: %v", err)
		}
	}
}

// consume counts the messages that reach the topic.
func consume(ctx context.Context, brokers string, delivered *atomic.Int64) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "localstack: consumer:", err)
		return
	}
	defer cl.Close()
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		delivered.Add(int64(fetches.NumRecords()))
	}
}

// freeAddr returns addr, or when it is empty a free loopback address for
// the relay's admin listener.
func freeAddr(addr string) (string, error) {
	if addr != "" {
		return addr, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port for the admin listener: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func exitText(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}
