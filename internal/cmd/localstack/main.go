// Command localstack runs a throwaway local outbox stack for trying the
// relay out: a PostgreSQL cluster with the outbox schema migrated. With
// OUTBOX_DATABASE_URL set it uses that database instead. Ctrl-C stops
// everything and removes what it created.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/internal/pgserver"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "localstack:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	dsn := os.Getenv("OUTBOX_DATABASE_URL")
	if dsn == "" {
		fmt.Println("starting a throwaway PostgreSQL cluster ...")
		srv, err := pgserver.Start(ctx, pgserver.Options{})
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
	fmt.Println("database:", config.RedactURL(dsn))

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	m, err := migrations.New(db, migrations.DefaultSchema)
	if err != nil {
		return err
	}
	res, err := m.Up(ctx)
	if err != nil {
		return err
	}
	for _, r := range res {
		fmt.Printf("applied migration %s\n", r.Source.Path)
	}

	producer, err := outbox.NewProducer(outbox.ProducerConfig{})
	if err != nil {
		return err
	}
	if _, err := producer.Write(ctx, pool, outbox.Message{
		Topic: "orders.placed", Key: "order-1", Payload: []byte(`{"order_id":1,"total_cents":4999}`),
		Headers: map[string]string{"content-type": "application/json"},
	}); err != nil {
		return err
	}
	fmt.Printf(`
The outbox is ready and holds a first message. Try:

  psql '%s' -c "INSERT INTO outbox (topic, key, payload) VALUES ('orders.placed', 'order-2', '{\"order_id\":2}')"
  psql '%s' -c "SELECT id, event_id, topic, key, status, created_at FROM outbox ORDER BY id"

Delivery to Kafka arrives with 'outbox-relay run'. Press Ctrl-C to stop and clean up.
`, dsn, dsn)

	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Println()
			return nil
		case <-tick.C:
			var pending, oldestUS int64
			err := pool.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)) * 1e6, 0)::bigint
				FROM outbox WHERE status = 'pending'`).Scan(&pending, &oldestUS)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			fmt.Printf("\rpending %d, oldest pending %s   ", pending, (time.Duration(oldestUS) * time.Microsecond).Round(time.Second))
		}
	}
}
