package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// outboxSchema is an outbox of the test: its database and schema, and a
// pool whose search path is the schema.
type outboxSchema struct {
	name, dsn, schema string
	pool              *pgxpool.Pool
}

func (o outboxSchema) topic() string { return o.name + "-events" }

// insertKeyed adds n rows to the outbox over 40 keys.
func (o outboxSchema) insertKeyed(t *testing.T, n int) {
	t.Helper()
	if _, err := o.pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
		SELECT $1, 'key-' || (g % 40), g::text::bytea FROM generate_series(1, $2::int) g`, o.topic(), n); err != nil {
		t.Fatal(err)
	}
}

func searchPathPool(t *testing.T, dsn, schema string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Three relay processes serve three outboxes, two schemas in one
// PostgreSQL cluster and one in another, and are SIGKILLed at random
// while rows arrive: every row of every outbox is delivered, in per-key
// order. Then the second cluster stops: only its outbox waits, readiness
// says which, and it catches up when the cluster is back. The dead-letter
// command line acts on the outbox it names.
func TestRunSeveralOutboxesThroughKills(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	srv := pgtest.NewServer(t)
	shared := pgtest.NewDatabase(t)
	other := srv.DSN("postgres")
	outboxes := []outboxSchema{
		{name: "tenant-a", dsn: shared, schema: "tenant_a"},
		{name: "tenant-b", dsn: shared, schema: "tenant_b"},
		{name: "shard-2", dsn: other, schema: "shard2"},
	}
	c := kafkatest.NewCluster(t, []string{"tenant-a-events", "tenant-b-events", "shard-2-events"}, kfake.DefaultNumPartitions(3))
	// The shared database comes from database.url; the other outbox names
	// its own in a file, as a mounted Secret would.
	otherURL := writeFile(t, "shard-2-url", []byte(other))
	cfgFile := writeFile(t, "relay.yaml", []byte(fmt.Sprintf(`
outboxes:
  - name: tenant-a
    schema: tenant_a
  - name: tenant-b
    schema: tenant_b
    workers: 1
  - name: shard-2
    url_file: %s
    schema: shard2
`, otherURL)))
	env := relayEnv(shared, c,
		"OUTBOX_CONFIG="+cfgFile,
		"OUTBOX_RELAY_BATCH_SIZE=100",
		"OUTBOX_RELAY_WORKERS=3",
		"OUTBOX_DATABASE_MAX_CONNS=6",
		"OUTBOX_DATABASE_QUERY_TIMEOUT=3s",
		"OUTBOX_RETRY_BASE_DELAY=5ms",
		"OUTBOX_RETRY_MAX_DELAY=100ms",
		"OUTBOX_LOG_LEVEL=warn",
		"OUTBOX_COORDINATION_LEASE=2s",
	)
	if r := runBinary(t, env, "migrate", "up"); r.code != 0 {
		t.Fatalf("migrate up: %d %s %s", r.code, r.stdout, r.stderr)
	} else {
		for _, o := range outboxes {
			if want := fmt.Sprintf("outbox %s (schema %s):", o.name, o.schema); !strings.Contains(r.stdout, want) {
				t.Errorf("migrate up does not say %q:\n%s", want, r.stdout)
			}
		}
	}
	for i := range outboxes {
		outboxes[i].pool = searchPathPool(t, outboxes[i].dsn, outboxes[i].schema)
		outboxes[i].insertKeyed(t, 2000)
	}

	// Rows keep arriving while three relays are killed and restarted.
	producing := make(chan struct{})
	var prodWG sync.WaitGroup
	for _, o := range outboxes {
		prodWG.Go(func() {
			for range 20 {
				o.insertKeyed(t, 100)
			}
		})
	}
	go func() { prodWG.Wait(); close(producing) }()
	killAtRandom(t, env, 3, 3, producing)
	if t.Failed() {
		return
	}
	left := 0
	for _, o := range outboxes {
		left += countRows(t, o.pool, "true")
	}
	t.Logf("%d of %d rows left after the kills", left, 3*(2000+20*100)) // duplicates below show kills mid-delivery
	var final []*relayProcess
	for range 3 {
		final = append(final, startRelay(t, append(env, "OUTBOX_LOG_LEVEL=info")))
	}
	for _, o := range outboxes {
		testwait.Within(t, 2*time.Minute, o.name+" to drain", func() bool { return countRows(t, o.pool, "true") == 0 })
	}
	// The killed replicas left their entries in the coordination tables;
	// their leases end and the fleet is the three that run.
	testwait.Within(t, time.Minute, "the fleet to forget the killed replicas", func() bool {
		_, metrics := get(t, adminAddr(t, final[0]), "/metrics")
		return strings.Contains(metrics, "outbox_fleet_replicas 3\n") && strings.Contains(metrics, "outbox_fleet_coordination_up 1\n")
	})

	// The second cluster stops: the outboxes of the first go on.
	if err := srv.Halt(ctx); err != nil {
		t.Fatal(err)
	}
	for _, o := range outboxes[:2] {
		o.insertKeyed(t, 500)
	}
	for _, o := range outboxes[:2] {
		testwait.Within(t, time.Minute, o.name+" to drain while shard-2 is down", func() bool { return countRows(t, o.pool, "true") == 0 })
	}
	addr := adminAddr(t, final[0])
	code, body := get(t, addr, "/readyz")
	var rd struct {
		Problems []string
		Outboxes []struct{ Name, Database string }
	}
	if err := json.Unmarshal([]byte(body), &rd); err != nil {
		t.Fatalf("readyz: %v\n%s", err, body)
	}
	if code != 503 || !strings.Contains(strings.Join(rd.Problems, "\n"), "outbox shard-2: database: not reachable") ||
		len(rd.Outboxes) != 3 || rd.Outboxes[0].Database != "ok" || rd.Outboxes[1].Database != "ok" ||
		!strings.HasPrefix(rd.Outboxes[2].Database, "not reachable") {
		t.Errorf("readyz with shard-2 down: %d\n%s", code, body)
	}
	if _, metrics := get(t, addr, "/metrics"); !strings.Contains(metrics, `outbox_delivered_total{destination="kafka",outbox="tenant-b"}`) ||
		!strings.Contains(metrics, `outbox_dead_letters{outbox="tenant-a",reason="permanent"} 0`) {
		t.Errorf("the metrics do not name the outboxes:\n%s", metrics)
	}
	if err := srv.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	outboxes[2].pool.Reset() // its connections died with the server
	outboxes[2].insertKeyed(t, 500)
	testwait.Within(t, time.Minute, "shard-2 to catch up", func() bool { return countRows(t, outboxes[2].pool, "true") == 0 })
	for _, p := range final {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range final {
		if code := p.wait(t, time.Minute); code != 0 {
			t.Errorf("relay exit code %d after SIGTERM; output:\n%s", code, p.output)
		}
	}

	// Every row of every outbox, first deliveries in per-key order.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i, o := range outboxes {
		want := 2000 + 20*100 + 500
		recs := kafkatest.ConsumeAll(cctx, t, c, o.topic())
		sort.SliceStable(recs, func(i, j int) bool {
			if recs[i].Partition != recs[j].Partition {
				return recs[i].Partition < recs[j].Partition
			}
			return recs[i].Offset < recs[j].Offset
		})
		seen := map[int64]bool{}
		last := map[string]int64{}
		for _, r := range recs {
			id, err := strconv.ParseInt(r.Headers[kafka.HeaderID], 10, 64)
			if err != nil {
				t.Fatalf("%s: a message without a row id: %v", o.name, r.Headers)
			}
			if seen[id] {
				continue // a duplicate: only first deliveries are ordered
			}
			seen[id] = true
			if k := string(r.Key); id < last[k] {
				t.Errorf("%s: key %s: row %d first delivered after row %d", o.name, k, id, last[k])
			} else {
				last[k] = id
			}
		}
		if len(seen) != want {
			t.Errorf("outbox %d (%s): %d rows delivered, want %d", i, o.name, len(seen), want)
		}
		t.Logf("%s: %d rows, %d messages", o.name, len(seen), len(recs))
	}

	// The dead-letter command line needs to know which outbox.
	if r := runBinary(t, env, "dlq", "list"); r.code != 2 || !strings.Contains(r.stderr, "several outboxes: choose one with --outbox (tenant-a, tenant-b, shard-2)") {
		t.Errorf("dlq list without --outbox: %d %s", r.code, r.stderr)
	}
	if r := runBinary(t, env, "dlq", "stats", "--outbox", "shard-2"); r.code != 0 {
		t.Errorf("dlq stats --outbox shard-2: %d %s", r.code, r.stderr)
	}
	if r := runBinary(t, env, "dlq", "list", "--outbox", "tenant-c"); r.code != 2 || !strings.Contains(r.stderr, "--outbox tenant-c: no such outbox") {
		t.Errorf("dlq list --outbox tenant-c: %d %s", r.code, r.stderr)
	}
}
