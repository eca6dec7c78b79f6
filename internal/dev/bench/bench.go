// Package bench measures the relay end to end against a real PostgreSQL and
// an in-process Kafka-protocol broker: backlog drain throughput of the
// outbox-relay binary as users run it, beside the raw SQL ceiling of the
// table and the ceiling of the relay's own claim, commit-to-ack latency
// under offered load, the wake-up trigger's cost to producers, a naive
// relay as a baseline, claim times while ANALYZE and VACUUM run, what
// sharing flow control with a fleet costs, two outboxes' fairness, and a
// soak under a held snapshot.
//
// bench.go holds the run, the scenarios' environment and backlog fill;
// binary.go the binary's drains and the ceilings; drain.go the relay's
// drains in process, latency.go the latency runs, costs.go
// the triggers' cost, the naive baseline and claims under maintenance,
// fleet.go the fleet and fairness runs, soak.go the soak, dbcost.go what
// the database spends, report.go the table and chart.
package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Config sizes a run.
type Config struct {
	// URL is the database to use; each scenario gets a schema of its own.
	URL string
	// Rows is the backlog of each drain scenario.
	Rows int
	// Pairs is how many drains the 10k-keys scenarios with 2 workers,
	// which carry the throughput targets, each measure between ceilings;
	// the others measure one. Zero means one.
	Pairs int
	// BinaryRounds is how many pairs of drains, the bare SQL's and the
	// binary's, each user series alternates for each number of processes;
	// figures are their medians. Zero means one.
	BinaryRounds int
	// BatchSize is the claim batch of the relay and of the SQL ceiling.
	BatchSize int
	// PayloadBytes is the size of each message.
	PayloadBytes int
	// Rates are the offered loads (rows/s) of the latency scenarios, each
	// run for LatencyFor.
	Rates      []int
	LatencyFor time.Duration
	// ProducersFor is how long producers write with the wake-up trigger,
	// and again without it, in alternating rounds.
	ProducersFor time.Duration
	// NaiveRows is the backlog of the naive relay (one row per
	// transaction); it also stops after NaiveFor.
	NaiveRows int
	NaiveFor  time.Duration
	// UserRows are the backlogs drained by the outbox-relay binary with
	// its default configuration, against the raw SQL ceiling; Binary is
	// the binary, built from this module when empty.
	UserRows []int
	Binary   string
	// LargeRows, when set, is one more backlog drained by the binary, with
	// 10k keys, compared with the first of UserRows.
	LargeRows int
	// FairnessRows is the backlog of the busy outbox in the fairness
	// scenario, and FairnessRate the rows per second offered to the quiet
	// one meanwhile.
	FairnessRows, FairnessRate int
	// FleetOutage is how long the endpoint of the fleet's outage scenario
	// answers 503 while producers write (8s when zero).
	FleetOutage time.Duration
	// ConsoleLetters are the dead letters beside a backlog of Rows over
	// which the console's pages are timed.
	ConsoleLetters int
	// ConsoleRows are the pending rows beside them; Rows when zero.
	ConsoleRows int
	// SoakFor is how long the soak offers the binary SoakRate rows a
	// second, with a snapshot held and again without; it reports every
	// SoakMinute (a minute when zero), then idles SoakIdle on the empty
	// outbox. When zero, that is a minute, or, for soaks longer than the
	// relay's look below its floor (store.SweepEvery, a read of every
	// index entry a held snapshot keeps), that interval: the idle cost
	// then counts one look, spread over its interval, as the relay spends
	// it. Zero SoakFor skips the soak.
	SoakFor, SoakMinute, SoakIdle time.Duration
	SoakRate                      int
	// CaptureFor is how long each round of the capture scenario offers
	// each of CaptureRates messages a second (1k, SoakRate and 20k when
	// empty), into the table and into the write-ahead log in turn,
	// CaptureRounds times (3 when zero). Zero CaptureFor skips it.
	CaptureFor    time.Duration
	CaptureRates  []int
	CaptureRounds int
	// CaptureBacklog is the backlog the capture scenario drains in each
	// mode (1M when zero).
	CaptureBacklog int
	// Only, when set, runs just the scenario groups it names
	// (comma-separated: binary, drain, latency, producer, baseline, claim,
	// fleet, fairness, console, soak, capture). Without it every group runs but drain, the
	// relay's drains in process, beside its own claim: the binary's
	// measure what users run.
	Only string
	// BrokerStores has the in-process broker keep the records it
	// acknowledges. By default it checks each produced batch (framing,
	// CRC, offsets) and acknowledges it, but discards its records: a broker
	// on machines of its own costs the relay's nothing to store them, and
	// this one stores them in memory segments that grow by copying, on the
	// cores the relay and PostgreSQL share.
	BrokerStores bool
	// Match, when set, runs just the drain and fleet scenarios whose name
	// (such as "1M rows, 10k keys, delete-on-send, 2 processes") contains
	// it.
	Match string
	// Logf reports progress; nil is silent.
	Logf func(format string, args ...any)
}

// Result is one measured figure.
type Result struct {
	Group  string  `json:"group"`
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	Detail string  `json:"detail,omitempty"`
}

// Key distributions of the drain scenarios.
var distributions = []struct{ name, expr string }{
	{"10k keys", "'key-' || (g % 10000)"},
	{"hot key", "'hot'"},
	{"no keys", "NULL"},
}

// Run runs every scenario and returns the figures in report order.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	cfg.SoakMinute = cmp.Or(cfg.SoakMinute, time.Minute)
	cfg.FleetOutage = cmp.Or(cfg.FleetOutage, 8*time.Second)
	if cfg.SoakIdle == 0 {
		cfg.SoakIdle = time.Minute
		if cfg.SoakFor > store.SweepEvery {
			cfg.SoakIdle = store.SweepEvery
		}
	}
	cfg.SoakRate = cmp.Or(cfg.SoakRate, 2000)
	if len(cfg.CaptureRates) == 0 {
		cfg.CaptureRates = []int{1000, cfg.SoakRate, 20000}
	}
	cfg.CaptureRounds = cmp.Or(cfg.CaptureRounds, 3)
	cfg.CaptureBacklog = cmp.Or(cfg.CaptureBacklog, 1_000_000)
	r := &runner{cfg: cfg}
	steps := []struct {
		group     string
		run       func(context.Context) error
		byDefault bool
	}{
		{"binary", r.users, true}, {"drain", r.drains, false}, {"latency", r.latencies, true},
		{"producer", r.producers, true}, {"baseline", r.naive, true}, {"claim", r.claimsUnderMaintenance, true},
		{"fleet", r.fleetCost, true}, {"fairness", r.fairness, true}, {"console", r.consolePages, true},
		{"soak", r.soaks, true}, {"capture", r.captures, true},
	}
	for _, step := range steps {
		if cfg.Only == "" && !step.byDefault || cfg.Only != "" && !slices.Contains(strings.Split(cfg.Only, ","), step.group) {
			continue
		}
		began := time.Now()
		if err := step.run(ctx); err != nil {
			return r.results, err
		}
		cfg.Logf("%s: %s", step.group, time.Since(began).Round(time.Second))
	}
	return r.results, nil
}

type runner struct {
	cfg     Config
	results []Result
	schemaN int
}

func (r *runner) add(res Result) {
	r.cfg.Logf("%-10s %-44s %12.1f %s %s", res.Group, res.Name, res.Value, res.Unit, res.Detail)
	r.results = append(r.results, res)
}

// env is one scenario's schema, pools and broker. The relay's pool has
// synchronous_commit off, as outbox-relay run sets it; producers' commits
// stay durable.
type env struct {
	schema    string
	pool      *pgxpool.Pool // producers and set-up
	relayPool *pgxpool.Pool
	cluster   *kfake.Cluster
}

func (r *runner) newEnv(ctx context.Context, conns int32) (*env, error) {
	r.schemaN++
	name := fmt.Sprintf("bench_%d_%d", time.Now().UnixNano()%1_000_000, r.schemaN)
	pc, err := pgxpool.ParseConfig(r.cfg.URL)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = conns
	pc.ConnConfig.RuntimeParams["search_path"] = name
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	rc := pc.Copy()
	rc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	relayPool, err := pgxpool.NewWithConfig(ctx, rc)
	if err != nil {
		pool.Close()
		return nil, err
	}
	// Each scenario's schema is a copy of one migrated once: the
	// migrations one by one took a third of a second each.
	if err := pgtest.CreateSchema(ctx, pool, r.cfg.URL, name); err != nil {
		pool.Close()
		relayPool.Close()
		return nil, err
	}
	// Start each scenario without the previous one's dirty pages: a
	// checkpoint landing mid-measurement would be charged to it. Needs a
	// superuser; elsewhere the scenario just runs without it.
	_, _ = pool.Exec(ctx, "CHECKPOINT")
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(6, "bench")}
	if !r.cfg.BrokerStores {
		opts = append(opts, kfake.BlackholeProduce())
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		pool.Close()
		relayPool.Close()
		return nil, err
	}
	return &env{schema: name, pool: pool, relayPool: relayPool, cluster: c}, nil
}

func (e *env) close() {
	e.relayPool.Close()
	_, _ = e.pool.Exec(context.Background(), "DROP SCHEMA "+e.schema+" CASCADE")
	e.pool.Close()
	e.cluster.Close()
}

// fill inserts n ready rows with the given key expression, then vacuums
// them, so that setting their hint bits is not charged to what is
// measured next. Two sessions insert at once, each its half of the ids.
//
// The key index and the event ids' are filled by the insert itself, in
// the scattered order producers give them, which leaves their pages
// about as full as in production. The indexes that the backlog fills in
// id order, or leaves empty, are dropped first and built afterwards,
// which takes less time than inserting into them and packs them as
// appending does. The primary key is rebuilt too: its lower half, not
// inserted at the right-hand end, splits pages half and half.
func (r *runner) fill(ctx context.Context, e *env, n int, keyExpr string) (err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("fill backlog: %w", err)
		}
	}()
	const sessions = 2
	const countIndexes = `SELECT count(*) FROM pg_index WHERE indrelid = 'outbox'::regclass`
	var before, after int
	if err := e.pool.QueryRow(ctx, countIndexes).Scan(&before); err != nil {
		return err
	}
	rows, err := e.pool.Query(ctx, `SELECT format('DROP INDEX %s', i), pg_get_indexdef(i) FROM unnest($1::text[]::regclass[]) AS i`,
		[]string{"outbox_pending_idx", "outbox_claim_idx", "outbox_waiting_idx", "outbox_key_waiting_idx",
			"outbox_key_parked_idx", "outbox_dead_letter_idx", "outbox_sent_idx"})
	if err != nil {
		return err
	}
	indexes, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Drop, Build string }])
	if err != nil {
		return err
	}
	build := []string{"REINDEX INDEX outbox_pkey"}
	for _, index := range indexes {
		if _, err := e.pool.Exec(ctx, index.Drop); err != nil {
			return err
		}
		build = append(build, index.Build)
	}
	insert := fmt.Sprintf(`INSERT INTO outbox (id, topic, key, payload) OVERRIDING SYSTEM VALUE
		SELECT g, 'bench', %s, convert_to(rpad(g::text, %d, 'x'), 'UTF8') FROM generate_series($1::bigint, $2::bigint) g`,
		keyExpr, r.cfg.PayloadBytes)
	if err := parallel(sessions, func(i int) error {
		_, err := e.pool.Exec(ctx, insert, i*n/sessions+1, (i+1)*n/sessions)
		return err
	}); err != nil {
		return err
	}
	// Two sessions build, taking every other index.
	if err := parallel(sessions, func(i int) error {
		for j := i; j < len(build); j += sessions {
			if _, err := e.pool.Exec(ctx, build[j]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	// Every index dropped is back.
	if err := e.pool.QueryRow(ctx, countIndexes).Scan(&after); err != nil {
		return err
	}
	if after != before {
		return fmt.Errorf("the outbox has %d indexes after the fill, want %d", after, before)
	}
	// Rows inserted later are numbered after the backlog.
	if _, err := e.pool.Exec(ctx, "SELECT setval(pg_get_serial_sequence('outbox', 'id'), $1::bigint)", max(n, 1)); err != nil {
		return err
	}
	_, err = e.pool.Exec(ctx, "VACUUM ANALYZE outbox")
	return err
}

func (r *runner) publisher(e *env) (*kafka.Publisher, error) {
	return kafka.New(kafka.Config{Brokers: e.cluster.ListenAddrs()})
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile returns the q-th percentile (nearest rank) of d.
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// repeatFor runs fn over and over in n goroutines for d, and counts the
// calls that succeeded.
func repeatFor(n int, d time.Duration, fn func() error) (int64, error) {
	var done atomic.Int64
	deadline := time.Now().Add(d)
	err := parallel(n, func(int) error {
		for time.Now().Before(deadline) {
			if err := fn(); err != nil {
				return err
			}
			done.Add(1)
		}
		return nil
	})
	return done.Load(), err
}

// parallel runs fn(0) to fn(n-1) concurrently and returns their errors, joined.
func parallel(n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitUntil polls cond until it holds, the timeout passes or ctx ends.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}
