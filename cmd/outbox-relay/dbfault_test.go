package main

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgserver"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// crashableServer starts a PostgreSQL server of the test's own, to crash
// and restart, durable so that what was committed before a crash survives
// it. It skips the test without local PostgreSQL binaries.
func crashableServer(t *testing.T) *pgserver.Server {
	t.Helper()
	if _, err := pgserver.FindBinaries(); err != nil {
		t.Skip("no local PostgreSQL binaries to start and crash a server of the test's own:", err)
	}
	pg, err := pgserver.Start(context.Background(), pgserver.Options{Durable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	return pg
}

// dbProxy is a TCP proxy in front of PostgreSQL that can turn into a black
// hole: connections stay open and every byte is dropped, both ways.
type dbProxy struct {
	proxy *toxiproxy.Proxy
}

func newDBProxy(t *testing.T, upstreamPort int) *dbProxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "postgres", "127.0.0.1:0", net.JoinHostPort("127.0.0.1", strconv.Itoa(upstreamPort)))
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return &dbProxy{proxy: p}
}

// dsn is a connection string to database through the proxy.
func (d *dbProxy) dsn(database string) string {
	return "postgres://postgres@" + d.proxy.Listen + "/" + database + "?sslmode=disable"
}

func (d *dbProxy) blackHole(t *testing.T) {
	t.Helper()
	for _, stream := range []string{"upstream", "downstream"} {
		if _, err := d.proxy.Toxics.AddToxicJson(strings.NewReader(
			`{"name": "black_hole_` + stream + `", "type": "timeout", "stream": "` + stream + `", "attributes": {"timeout": 0}}`)); err != nil {
			t.Fatal(err)
		}
	}
}

func (d *dbProxy) heal(t *testing.T) {
	t.Helper()
	for _, stream := range []string{"upstream", "downstream"} {
		if err := d.proxy.Toxics.RemoveToxic(context.Background(), "black_hole_"+stream); err != nil {
			t.Fatal(err)
		}
	}
}

// PostgreSQL crashes, and later vanishes behind a network black hole, while
// producers write and the relay delivers. Afterwards every committed row was
// delivered, no rolled-back row was, the same relay process recovered by
// itself each time, and no row counted a failed attempt for the outages.
func TestDatabaseCrashAndBlackHole(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	pg := crashableServer(t)
	if r := runBinary(t, []string{"OUTBOX_DATABASE_URL=" + pg.DSN("postgres")}, "migrate", "up"); r.code != 0 {
		t.Fatalf("migrate up: %s", r.stderr)
	}
	pool, err := pgxpool.New(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	proxy := newDBProxy(t, pg.Port())
	const workers = 2

	c := kafkatest.NewCluster(t, []string{"events"})
	p := startRelay(t, relayEnv(proxy.dsn("postgres"), c,
		"OUTBOX_DATABASE_QUERY_TIMEOUT=2s",
		"OUTBOX_DATABASE_CONNECT_TIMEOUT=2s",
		"OUTBOX_RELAY_PUBLISH_TIMEOUT=2s",
		"OUTBOX_RELAY_BATCH_SIZE=50",
		"OUTBOX_RELAY_WORKERS="+strconv.Itoa(workers),
		// Kept as sent, to check their attempts afterwards.
		"OUTBOX_RELAY_SENT_RETENTION=1h",
	))
	testwait.Within(t, 30*time.Second, "the relay to start", func() bool { return strings.Contains(p.output.String(), "relay started") })

	// Producers write directly, not through the proxy, in small
	// transactions, one in ten rolled back. A commit that fails in the
	// crash has an unknown outcome and is left out of the check.
	producer, err := outbox.NewProducer(outbox.ProducerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		stop   = make(chan struct{})
		prodWG sync.WaitGroup
		writes atomic.Int64
	)
	book := newLedger()
	for w := range 2 {
		prodWG.Add(1)
		go func() {
			defer prodWG.Done()
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				msgs := make([]outbox.Message, 5)
				for i := range msgs {
					msgs[i] = outbox.Message{Topic: "events", Key: "key-" + strconv.Itoa((n*5+i)%50) + "-" + strconv.Itoa(w), Payload: []byte("x")}
				}
				// Errors are expected while the server is down.
				_ = book.write(ctx, pool, producer, msgs, n%10 == 9, nil)
				writes.Add(1)
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		prodWG.Wait()
	}()
	sentSince := func(at time.Time) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE status = 'sent' AND sent_at > $1`, at).Scan(&n); err != nil {
			return 0 // the server is down: not yet
		}
		return n
	}
	failures := func() int {
		out := p.output.String()
		return strings.Count(out, `msg="batch failed"`) + strings.Count(out, `msg="database: `)
	}
	start := time.Now()
	testwait.Within(t, 30*time.Second, "deliveries", func() bool { return sentSince(start) >= 200 })

	// A crash: the server stops at once, and starts again on its own.
	crashed := time.Now()
	before := failures()
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, 60*time.Second, "deliveries after the crash", func() bool { return sentSince(time.Now().Add(-time.Second)) >= 50 && sentSince(crashed) >= 200 })
	if failures() == before {
		t.Errorf("no batch failed in the crash: nothing was in flight, the test proves nothing\n%s", p.output)
	}

	// A black hole: the relay's connections stay open and nothing comes
	// back. Its queries time out, and it keeps trying: every worker fails
	// batch after batch, claims included, rather than wait for an answer.
	// Within 20s: the server ends a transaction left idle by a vanished
	// client only after twice the publish timeout and 30s, and a query
	// sent outside one waits for ever.
	before = failures()
	proxy.blackHole(t)
	holed := time.Now()
	testwait.Within(t, 20*time.Second, "the relay to keep failing in the black hole", func() bool { return failures() > before+2*workers })
	if stuck := sentSince(holed.Add(time.Second)); stuck > 0 {
		t.Errorf("%d rows recorded as sent through a black hole", stuck)
	}
	if !strings.Contains(p.output.String(), "problem=query_timeout") {
		t.Errorf("no failure in the black hole was explained as a query timeout\n%s", p.output)
	}
	healed := time.Now()
	proxy.heal(t)
	testwait.Within(t, 60*time.Second, "deliveries after the black hole", func() bool { return sentSince(healed) >= 200 })

	// Drain and check.
	close(stop)
	prodWG.Wait()
	testwait.Within(t, 90*time.Second, "the outbox to drain", func() bool { return countRows(t, pool, "status = 'pending'") == 0 })
	select {
	case <-p.done:
		t.Fatalf("the relay exited: %v\n%s", p.err, p.output)
	default:
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, time.Minute); code != 0 {
		t.Errorf("exit code %d after SIGTERM; output:\n%s", code, p.output)
	}

	if n := countRows(t, pool, "status <> 'sent' OR retry_count > 0 OR error_history <> '[]'"); n != 0 {
		t.Errorf("%d rows not sent, or with failed attempts counted for the outages", n)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	delivered := map[uuid.UUID]int{}
	for _, r := range kafkatest.ConsumeAll(cctx, t, c, "events") {
		id, err := uuid.Parse(r.Headers[kafka.HeaderEventID])
		if err != nil {
			t.Fatalf("message without a valid event id: %v", r.Headers)
		}
		delivered[id]++
	}
	book.check(t, delivered)
	t.Logf("%d committed rows, %d rolled back, %d transactions; %d batches failed in the outages",
		len(book.committed), len(book.rolledBack), writes.Load(), failures())
}
