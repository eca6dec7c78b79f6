// Package bench measures the relay end to end against a real PostgreSQL and
// an in-process Kafka-protocol broker: backlog drain throughput beside the
// SQL ceiling of its own claim and write-back, commit-to-ack latency under
// offered load, the wake-up trigger's cost to producers, a naive relay as a
// baseline, and claim times while ANALYZE and VACUUM run.
package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/procfs"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
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
	// FairnessRows is the backlog of the busy outbox in the fairness
	// scenario, and FairnessRate the rows per second offered to the quiet
	// one meanwhile.
	FairnessRows, FairnessRate int
	// Only, when set, runs just the scenario groups it names
	// (comma-separated: drain, latency, producer, baseline, claim, fleet,
	// fairness).
	Only string
	// BrokerStores has the in-process broker keep the records it
	// acknowledges. By default it checks each produced batch (framing,
	// CRC, offsets) and acknowledges it, but discards its records: a broker
	// on machines of its own costs the relay's nothing to store them, and
	// this one stores them in memory segments that grow by copying, on the
	// cores the relay and PostgreSQL share.
	BrokerStores bool
	// Match, when set, runs just the drain scenarios whose name (such as
	// "delete-on-send, 10k keys, 2 worker(s)") contains it.
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
	r := &runner{cfg: cfg}
	steps := []struct {
		group string
		run   func(context.Context) error
	}{
		{"drain", r.drains}, {"latency", r.latencies}, {"producer", r.producers},
		{"baseline", r.naive}, {"claim", r.claimsUnderMaintenance},
		{"fleet", r.fleetCost}, {"fairness", r.fairness},
	}
	for _, step := range steps {
		if cfg.Only != "" && !slices.Contains(strings.Split(cfg.Only, ","), step.group) {
			continue
		}
		if err := step.run(ctx); err != nil {
			return r.results, err
		}
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
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	m, err := migrations.New(db, name)
	if err == nil {
		_, err = m.Up(ctx)
	}
	if err != nil {
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
		[]string{"outbox_pending_idx", "outbox_key_parked_idx", "outbox_dead_letter_idx", "outbox_sent_idx"})
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

// drains measures backlog drain throughput of the relay and of its SQL
// alone, for each write-back mode, key distribution and worker count. The
// SQL ceiling is measured before and after each drain, and the relay's
// share is of their mean, so a change in the machine's speed during the
// scenario weighs on both sides alike. The 10k-keys scenarios with 2
// workers repeat the drain cfg.Pairs times (ceiling, drain, ceiling,
// drain, ceiling) and report the means.
func (r *runner) drains(ctx context.Context) error {
	for _, keep := range []bool{false, true} {
		mode := "delete-on-send"
		if keep {
			mode = "mark-sent"
		}
		for _, dist := range distributions {
			for _, workers := range []int{1, 2} {
				pairs := 1
				if dist.name == "10k keys" && workers == 2 {
					pairs = max(r.cfg.Pairs, 1)
				}
				name := fmt.Sprintf("%s, %s, %d worker(s)", mode, dist.name, workers)
				if !strings.Contains(name, r.cfg.Match) {
					continue
				}
				ceilings, drained := make([]float64, 0, pairs+1), make([]float64, 0, pairs)
				var drainUse, ceilingUse usage
				for i := 0; i <= pairs; i++ {
					if i > 0 {
						got, use, err := r.drain(ctx, keep, dist.expr, workers)
						if err != nil {
							return fmt.Errorf("%s: %w", name, err)
						}
						drainUse = drainUse.add(use)
						drained = append(drained, got)
					}
					c, use, err := r.sqlCeiling(ctx, keep, dist.expr, workers)
					if err != nil {
						return fmt.Errorf("%s: SQL ceiling: %w", name, err)
					}
					ceilingUse = ceilingUse.add(use)
					ceilings = append(ceilings, c)
				}
				// The ceiling of each drain is the mean of the two beside
				// it; the figures are the means over the drains.
				var ceiling, got float64
				for i, d := range drained {
					ceiling += (ceilings[i] + ceilings[i+1]) / 2 / float64(pairs)
					got += d / float64(pairs)
				}
				ceilingNote := fmt.Sprintf("mean of %.0f before and %.0f after the drain", ceilings[0], ceilings[1])
				drainNote := fmt.Sprintf("%.0f%% of the SQL ceiling; %s",
					100*got/ceiling, drainUse.against(ceilingUse, pairs*r.cfg.Rows, (pairs+1)*r.cfg.Rows))
				if pairs > 1 {
					ceilingNote = fmt.Sprintf("%s before, between and after %d drains; the mean, over the drains, of the two beside each",
						list(ceilings), pairs)
					drainNote = fmt.Sprintf("mean of %s; %s", list(drained), drainNote)
				}
				r.add(Result{Group: "ceiling", Name: name, Value: ceiling, Unit: "rows/s", Detail: ceilingNote})
				r.add(Result{Group: "drain", Name: name, Value: got, Unit: "rows/s", Detail: drainNote})
			}
		}
	}
	return nil
}

// usage is the CPU time spent over the timed part of drains or ceilings
// (not their backlog fills): this process's (relay, Kafka client and
// in-process broker, or the SQL ceiling's loop), in user and system mode,
// and, where the kernel reports them (Linux), the whole machine's busy
// and idle time, summed over its CPUs. What the machine spent beside this
// process is every other process's, mostly PostgreSQL's on a quiet
// machine, and the kernel's for work it does outside any process's time,
// such as delivering loopback traffic.
type usage struct {
	process, busy, idle time.Duration
}

// usageNow reads the CPU time used so far.
func usageNow() usage {
	var u usage
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		u.process = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	u.busy, u.idle = machineCPU()
	return u
}

// machineCPU reads the busy and idle time of every CPU since boot from
// the kernel's /proc/stat; zero where there is none. Time spent waiting
// for I/O counts as idle (with fsync on, PostgreSQL's WAL flushes among
// it); time stolen by a hypervisor counts as neither. The kernel counts
// in ticks of a hundredth of a second, so over a short stretch these
// figures are coarse beside the process's own.
func machineCPU() (busy, idle time.Duration) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, 0
	}
	st, err := fs.Stat()
	if err != nil {
		return 0, 0
	}
	t := st.CPUTotal
	seconds := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	return seconds(t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ), seconds(t.Idle + t.Iowait)
}

func (u usage) add(v usage) usage {
	return usage{process: u.process + v.process, busy: u.busy + v.busy, idle: u.idle + v.idle}
}

func (u usage) since(start usage) usage {
	return usage{process: u.process - start.process, busy: u.busy - start.busy, idle: u.idle - start.idle}
}

// against describes u, over n rows drained, beside the ceilings' c, over
// m rows: CPU a row, this process's and the rest of the machine's, and
// the machine's idle share.
func (u usage) against(c usage, n, m int) string {
	s := fmt.Sprintf("this process's CPU %.1f µs a row against the ceiling's %.1f", perRow(u.process, n), perRow(c.process, m))
	if u.busy > 0 && c.busy > 0 {
		s += fmt.Sprintf(", the rest of the machine's %.1f against %.1f, the machine idle %.0f%% of the time against %.0f%%",
			perRow(max(u.busy-u.process, 0), n), perRow(max(c.busy-c.process, 0), m),
			100*float64(u.idle)/float64(u.busy+u.idle), 100*float64(c.idle)/float64(c.busy+c.idle))
	}
	return s
}

// perRow is d a row over n rows, in microseconds.
func perRow(d time.Duration, n int) float64 {
	return float64(d) / float64(time.Microsecond) / float64(max(n, 1))
}

// list formats rates as "55.2k, 61.0k and 58.4k".
func list(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.1fk", x/1000)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

func (r *runner) drain(ctx context.Context, keep bool, keyExpr string, workers int) (float64, usage, error) {
	return r.drainWith(ctx, keep, keyExpr, workers, nil, nil)
}

// drainWith is drain with the relay's configuration changed by tune, and
// after told of the relay once the backlog is drained.
func (r *runner) drainWith(ctx context.Context, keep bool, keyExpr string, workers int,
	tune func(*relay.Config, *env) error, after func(*relay.Relay)) (float64, usage, error) {
	e, err := r.newEnv(ctx, int32(workers+4))
	if err != nil {
		return 0, usage{}, err
	}
	defer e.close()
	if err := r.fill(ctx, e, r.cfg.Rows, keyExpr); err != nil {
		return 0, usage{}, err
	}
	pub, err := r.publisher(e)
	if err != nil {
		return 0, usage{}, err
	}
	defer pub.Close()
	store, err := outbox.NewStore(e.relayPool, outbox.StoreConfig{Schema: e.schema, KeepSent: keep})
	if err != nil {
		return 0, usage{}, err
	}
	cfg := relay.Config{
		Store: store, Publisher: pub, Workers: workers, BatchSize: r.cfg.BatchSize,
		MaxBatchBytes: r.cfg.BatchSize * (r.cfg.PayloadBytes + relay.RecordOverhead + 64), PayloadCap: r.cfg.PayloadBytes * 2,
		PollInterval: 5 * time.Millisecond,
	}
	if keep {
		cfg.SentRetention = time.Hour
	}
	if tune != nil {
		if err := tune(&cfg, e); err != nil {
			return 0, usage{}, err
		}
	}
	rel, err := relay.New(cfg)
	if err != nil {
		return 0, usage{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start, startUse := time.Now(), usageNow()
	go func() { done <- rel.Run(runCtx) }()
	err = waitUntil(ctx, 10*time.Minute, func() bool { return rel.Stats().Delivered >= int64(r.cfg.Rows) })
	elapsed, use := time.Since(start), usageNow().since(startUse)
	stop()
	if runErr := <-done; runErr != nil {
		return 0, usage{}, runErr
	}
	if err != nil {
		return 0, usage{}, fmt.Errorf("drain: %w (delivered %d of %d)", err, rel.Stats().Delivered, r.cfg.Rows)
	}
	if after != nil {
		after(rel)
	}
	return float64(r.cfg.Rows) / elapsed.Seconds(), use, nil
}

// sqlCeiling drains a backlog with the relay's own claim and write-back
// statements and nothing else: no publish.
func (r *runner) sqlCeiling(ctx context.Context, keep bool, keyExpr string, workers int) (float64, usage, error) {
	e, err := r.newEnv(ctx, int32(workers+2))
	if err != nil {
		return 0, usage{}, err
	}
	defer e.close()
	if err := r.fill(ctx, e, r.cfg.Rows, keyExpr); err != nil {
		return 0, usage{}, err
	}
	store, err := outbox.NewStore(e.relayPool, outbox.StoreConfig{Schema: e.schema, KeepSent: keep})
	if err != nil {
		return 0, usage{}, err
	}
	var done atomic.Int64
	start, startUse := time.Now(), usageNow()
	err = parallel(workers, func(int) error {
		for done.Load() < int64(r.cfg.Rows) {
			if _, err := claimAndAck(ctx, store, r.cfg.BatchSize, &done); err != nil {
				return err
			}
		}
		return nil
	})
	return float64(r.cfg.Rows) / time.Since(start).Seconds(), usageNow().since(startUse), err
}

func claimAndAck(ctx context.Context, store *outbox.Store, limit int, done *atomic.Int64) (time.Duration, error) {
	start := time.Now()
	c, err := store.Claim(ctx, outbox.ClaimParams{Limit: limit, PayloadCap: 1 << 20})
	if err != nil {
		return 0, err
	}
	took := time.Since(start)
	outcomes := make([]outbox.Outcome, len(c.Records))
	for i, rec := range c.Records {
		outcomes[i] = outbox.Outcome{ID: rec.ID, Kind: outbox.Sent}
	}
	if err := c.Complete(ctx, outcomes); err != nil {
		return 0, err
	}
	done.Add(int64(len(outcomes)))
	return took, nil
}

// ackTimes wraps a publisher and records when each event was acknowledged.
type ackTimes struct {
	inner relay.Publisher
	mu    sync.Mutex
	at    map[uuid.UUID]time.Time
}

func (a *ackTimes) Publish(ctx context.Context, recs []outbox.Record) []error {
	errs := a.inner.Publish(ctx, recs)
	now := time.Now()
	a.mu.Lock()
	for i, rec := range recs {
		if errs[i] == nil {
			if _, seen := a.at[rec.EventID]; !seen {
				a.at[rec.EventID] = now
			}
		}
	}
	a.mu.Unlock()
	return errs
}

// latencies measures commit-to-ack latency under offered load from
// concurrent producers, with LISTEN/NOTIFY wake-ups.
//
// Then, at the lowest rate, one row in twenty goes to a topic the cluster
// does not have: the healthy rows' latency beside failing rows on the same
// destination, which must pause only the failing topic. And the same
// load in strict order, whose producers do not serialise their keys.
func (r *runner) latencies(ctx context.Context) error {
	for _, rate := range r.cfg.Rates {
		lat, st, err := r.latency(ctx, rate, 0, false)
		if err != nil {
			return fmt.Errorf("latency at %d rows/s: %w", rate, err)
		}
		achieved := float64(len(lat)) / r.cfg.LatencyFor.Seconds()
		for _, q := range []float64{50, 95, 99} {
			r.add(Result{Group: "latency", Name: fmt.Sprintf("p%.0f commit→ack at %d rows/s offered", q, rate),
				Value: ms(percentile(lat, q)), Unit: "ms", Detail: fmt.Sprintf("%d rows, %.0f rows/s committed, %d batches, %d retried, %d deferred",
					len(lat), achieved, st.Batches, st.Retried, st.Deferred)})
		}
	}
	if len(r.cfg.Rates) == 0 {
		return nil
	}
	const failEvery = 20
	rate := slices.Min(r.cfg.Rates)
	lat, st, err := r.latency(ctx, rate, failEvery, false)
	if err != nil {
		return fmt.Errorf("latency at %d rows/s with failing rows: %w", rate, err)
	}
	for _, q := range []float64{50, 99} {
		r.add(Result{Group: "latency", Name: fmt.Sprintf("p%.0f commit→ack of healthy rows at %d rows/s offered, %d%% failing", q, rate, 100/failEvery),
			Value: ms(percentile(lat, q)), Unit: "ms", Detail: fmt.Sprintf("%d healthy rows; the failing rows go to a topic the cluster lacks; %d batches, %d retried, %d deferred",
				len(lat), st.Batches, st.Retried, st.Deferred)})
	}
	lat, st, err = r.latency(ctx, rate, 0, true)
	if err != nil {
		return fmt.Errorf("latency at %d rows/s in strict order: %w", rate, err)
	}
	for _, q := range []float64{50, 99} {
		r.add(Result{Group: "latency", Name: fmt.Sprintf("p%.0f commit→ack at %d rows/s offered, strict order", q, rate),
			Value: ms(percentile(lat, q)), Unit: "ms", Detail: fmt.Sprintf("%d rows; each waits for the transactions that could still commit a smaller id; %d batches, %d claims",
				len(lat), st.Batches, st.Claims)})
	}
	return nil
}

// latency offers rate rows/s for LatencyFor and returns the commit-to-ack
// latency of each row. With failEvery > 0, one row in failEvery goes to a
// topic the cluster lacks, without a key, and only the others are
// measured. strict claims in strict order.
func (r *runner) latency(ctx context.Context, rate, failEvery int, strict bool) (lat []time.Duration, st relay.Stats, err error) {
	const producers, workers = 8, 2
	e, err := r.newEnv(ctx, workers+4+producers)
	if err != nil {
		return nil, st, err
	}
	defer e.close()
	pub, err := r.publisher(e)
	if err != nil {
		return nil, st, err
	}
	defer pub.Close()
	acks := &ackTimes{inner: pub, at: map[uuid.UUID]time.Time{}}
	store, err := outbox.NewStore(e.relayPool, outbox.StoreConfig{Schema: e.schema, StrictOrder: strict})
	if err != nil {
		return nil, st, err
	}
	listener, err := outbox.NewListener(e.relayPool, outbox.ListenerConfig{Schema: e.schema})
	if err != nil {
		return nil, st, err
	}
	rel, err := relay.New(relay.Config{Store: store, Publisher: acks, Listener: listener, Workers: workers, BatchSize: r.cfg.BatchSize})
	if err != nil {
		return nil, st, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rel.Run(runCtx) }()
	defer func() { stop(); <-done }()
	// Let the listener come up before the clock starts.
	if err := waitUntil(ctx, 10*time.Second, listener.Healthy); err != nil {
		return nil, st, fmt.Errorf("listener: %w", err)
	}

	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: e.schema})
	if err != nil {
		return nil, st, err
	}
	// Each producer commits transactions of perTx rows at a steady pace,
	// at most 100 a second: with fsync on, commits are the producers'
	// limit, not the relay's.
	perTx := max(1, rate/producers/100)
	interval := time.Duration(float64(time.Second) * float64(perTx*producers) / float64(rate))
	payload := make([]byte, r.cfg.PayloadBytes)
	var mu sync.Mutex
	committed := map[uuid.UUID]time.Time{}
	deadline := time.Now().Add(r.cfg.LatencyFor)
	err = parallel(producers, func(int) error {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		msgs := make([]outbox.Message, perTx)
		n := 0
		for time.Now().Before(deadline) {
			<-tick.C
			for i := range msgs {
				msgs[i] = outbox.Message{Topic: "bench", Key: "key-" + uuid.NewString()[:4], Payload: payload}
				if n++; failEvery > 0 && n%failEvery == 0 {
					msgs[i] = outbox.Message{Topic: "bench-missing", Payload: payload}
				}
			}
			var ids []uuid.UUID
			err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				var err error
				ids, err = producer.Write(ctx, tx, msgs...)
				return err
			})
			if err != nil {
				return err
			}
			now := time.Now()
			mu.Lock()
			for i, id := range ids {
				if msgs[i].Topic == "bench" {
					committed[id] = now
				}
			}
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, st, err
	}
	if err := waitUntil(ctx, time.Minute, func() bool { return rel.Stats().Delivered >= int64(len(committed)) }); err != nil {
		return nil, st, err
	}
	acks.mu.Lock()
	defer acks.mu.Unlock()
	lat = make([]time.Duration, 0, len(committed))
	for id, c := range committed {
		a, ok := acks.at[id]
		if !ok {
			return nil, st, fmt.Errorf("event %s committed but never acknowledged", id)
		}
		// An ack can land before the producer reads the clock after its
		// commit returns: that is a latency of about zero.
		lat = append(lat, max(0, a.Sub(c)))
	}
	return lat, rel.Stats(), nil
}

// producers measures what each of the table's triggers costs producers:
// the wake-up trigger, and the one that gives an inserting transaction
// its id first (strict order), which every producer pays, strict or not.
func (r *runner) producers(ctx context.Context) error {
	for _, t := range []struct{ trigger, what string }{
		{"outbox_notify", "the wake-up trigger"},
		{"outbox_xid_first", "the strict-order trigger"},
	} {
		if err := r.triggerCost(ctx, t.trigger, t.what); err != nil {
			return fmt.Errorf("cost of %s: %w", t.what, err)
		}
	}
	return nil
}

// triggerCost measures producer throughput, single-row transactions from
// 8 connections, with and without one trigger. The two alternate in short
// rounds on one table (ABBA order), so a change in the disk's speed during
// the run weighs on both alike, and the trigger's cost is the median of
// the rounds' own.
func (r *runner) triggerCost(ctx context.Context, trigger, what string) error {
	const producers, rounds = 8, 16
	e, err := r.newEnv(ctx, producers+1)
	if err != nil {
		return err
	}
	defer e.close()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: e.schema})
	if err != nil {
		return err
	}
	payload := make([]byte, r.cfg.PayloadBytes)
	write := func() error {
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := producer.Write(ctx, tx, outbox.Message{Topic: "bench", Key: "k", Payload: payload})
			return err
		})
	}
	var rows [2]int64 // without, with
	var took [2]time.Duration
	var costs []float64 // of each round
	for i := range rounds {
		var rate [2]float64
		order := []int{1, 0}
		if i%2 == 1 {
			order = []int{0, 1}
		}
		for _, on := range order {
			state := "DISABLE"
			if on == 1 {
				state = "ENABLE"
			}
			if _, err := e.pool.Exec(ctx, "ALTER TABLE outbox "+state+" TRIGGER "+trigger); err != nil {
				return err
			}
			start := time.Now()
			n, err := repeatFor(producers, r.cfg.ProducersFor/rounds, write)
			if err != nil {
				return err
			}
			elapsed := time.Since(start)
			rows[on] += n
			took[on] += elapsed
			rate[on] = float64(n) / elapsed.Seconds()
		}
		costs = append(costs, 1-rate[1]/rate[0])
	}
	with := float64(rows[1]) / took[1].Seconds()
	without := float64(rows[0]) / took[0].Seconds()
	// A burst of background work (a checkpoint, autovacuum) can land in
	// one round: the median of the rounds' own costs is not moved by it.
	slices.Sort(costs)
	median := (costs[(rounds-1)/2] + costs[rounds/2]) / 2
	each := (r.cfg.ProducersFor / rounds).Round(time.Millisecond)
	detail := fmt.Sprintf("%d rounds, each %s with the trigger and %s without, in alternating order", rounds, each, each)
	r.add(Result{Group: "producer", Name: "insert, 1 row per transaction, with " + what, Value: with, Unit: "rows/s", Detail: detail})
	r.add(Result{Group: "producer", Name: "insert, 1 row per transaction, without " + what, Value: without, Unit: "rows/s", Detail: detail})
	r.add(Result{Group: "producer", Name: "cost of " + what, Value: 100 * median, Unit: "%",
		Detail: fmt.Sprintf("median of the %d rounds' costs (%.1f%% to %.1f%%); %.1f%% from the totals above",
			rounds, 100*costs[0], 100*costs[rounds-1], 100*(1-with/without))})
	return nil
}

// naive drains a backlog the simplest way: one row per transaction, one
// message per publish, through the relay's own Kafka sink, so that the
// ratio is the batching's.
func (r *runner) naive(ctx context.Context) error {
	e, err := r.newEnv(ctx, 2)
	if err != nil {
		return err
	}
	defer e.close()
	if err := r.fill(ctx, e, r.cfg.NaiveRows, distributions[0].expr); err != nil {
		return err
	}
	pub, err := r.publisher(e)
	if err != nil {
		return err
	}
	defer pub.Close()
	start := time.Now()
	deadline := start.Add(r.cfg.NaiveFor)
	n := 0
	for n < r.cfg.NaiveRows && time.Now().Before(deadline) {
		err := pgx.BeginFunc(ctx, e.relayPool, func(tx pgx.Tx) error {
			var key *string
			rec := outbox.Record{Topic: "bench"}
			err := tx.QueryRow(ctx, `SELECT id, event_id, key, payload FROM outbox WHERE status = 'pending' AND next_attempt_at <= now()
				ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&rec.ID, &rec.EventID, &key, &rec.Payload)
			if err != nil {
				return err
			}
			if key != nil {
				rec.Key, rec.HasKey = *key, true
			}
			if err := pub.Publish(ctx, []outbox.Record{rec})[0]; err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "DELETE FROM outbox WHERE id = $1", rec.ID)
			return err
		})
		if err != nil {
			return fmt.Errorf("naive relay: %w", err)
		}
		n++
	}
	naive := float64(n) / time.Since(start).Seconds()
	r.add(Result{Group: "baseline", Name: "naive relay, 1 row per transaction", Value: naive, Unit: "rows/s"})
	best := 0.0
	for _, res := range r.results {
		if res.Group == "drain" && strings.HasPrefix(res.Name, "delete-on-send") {
			best = math.Max(best, res.Value)
		}
	}
	if best > 0 {
		r.add(Result{Group: "baseline", Name: "relay (best delete-on-send drain) ÷ naive", Value: best / naive, Unit: "×"})
	}
	return nil
}

// claimsUnderMaintenance times every claim of a drain while ANALYZE and
// VACUUM run on the table over and over, with autovacuum set to fire
// often.
func (r *runner) claimsUnderMaintenance(ctx context.Context) error {
	e, err := r.newEnv(ctx, 4)
	if err != nil {
		return err
	}
	defer e.close()
	if err := r.fill(ctx, e, r.cfg.Rows, distributions[0].expr); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_vacuum_threshold = 1000,
		autovacuum_vacuum_scale_factor = 0, autovacuum_analyze_threshold = 1000, autovacuum_analyze_scale_factor = 0)`); err != nil {
		return err
	}
	store, err := outbox.NewStore(e.relayPool, outbox.StoreConfig{Schema: e.schema})
	if err != nil {
		return err
	}
	maintCtx, stopMaint := context.WithCancel(ctx)
	maintDone := make(chan int)
	go func() {
		rounds := 0
		for maintCtx.Err() == nil {
			for _, stmt := range []string{"ANALYZE outbox", "VACUUM outbox"} {
				if _, err := e.pool.Exec(maintCtx, stmt); err == nil {
					rounds++
				}
			}
		}
		maintDone <- rounds
	}()
	var done atomic.Int64
	var took []time.Duration
	for done.Load() < int64(r.cfg.Rows) {
		d, err := claimAndAck(ctx, store, r.cfg.BatchSize, &done)
		if err != nil {
			stopMaint()
			<-maintDone
			return err
		}
		took = append(took, d)
	}
	stopMaint()
	rounds := <-maintDone
	detail := fmt.Sprintf("%d claims, %d ANALYZE/VACUUM runs", len(took), rounds)
	r.add(Result{Group: "claim", Name: "claim p99 during ANALYZE and VACUUM", Value: ms(percentile(took, 99)), Unit: "ms", Detail: detail})
	r.add(Result{Group: "claim", Name: "claim max during ANALYZE and VACUUM", Value: ms(slices.Max(took)), Unit: "ms", Detail: detail})
	return nil
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
