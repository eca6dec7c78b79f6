package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.ProcessTests) }

// fakePublisher records what it is asked to publish and fails what fail
// says to.
type fakePublisher struct {
	mu    sync.Mutex
	calls [][]sink.Record
	fail  func(r sink.Record, attempt int) error
	seen  map[int64]int
}

func (f *fakePublisher) Publish(ctx context.Context, recs []sink.Record) []error {
	errs := make([]error, len(recs))
	if err := ctx.Err(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = map[int64]int{}
	}
	f.calls = append(f.calls, recs)
	failedKeys := map[string]bool{}
	for i, r := range recs {
		f.seen[r.ID]++
		if r.HasKey && failedKeys[r.Key] {
			errs[i] = sink.ErrNotSent
			continue
		}
		if f.fail != nil {
			errs[i] = f.fail(r, f.seen[r.ID])
		}
		if errs[i] != nil && r.HasKey {
			failedKeys[r.Key] = true
		}
	}
	return errs
}

// published lists the ids acknowledged so far, in publish order.
func (f *fakePublisher) published() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int64
	seen := map[int64]int{}
	for _, call := range f.calls {
		failedKeys := map[string]bool{}
		for _, r := range call {
			seen[r.ID]++
			var err error
			if r.HasKey && failedKeys[r.Key] {
				continue
			}
			if f.fail != nil {
				err = f.fail(r, seen[r.ID])
			}
			if err != nil {
				if r.HasKey {
					failedKeys[r.Key] = true
				}
				continue
			}
			out = append(out, r.ID)
		}
	}
	return out
}

type harness struct {
	t      *testing.T
	schema *pgtest.Schema
	store  *store.Store
	relay  *relay.Relay
	// signals say what the relay did, from before it started.
	signals relay.TestSignals
	cancel  context.CancelFunc
	done    chan error
}

type options struct {
	keepSent bool
	// claimer leases the outbox's partitions, as a replica does.
	claimer  string
	policy   retry.PolicyConfig
	listener bool
	// outboxBatch, when set, is the outbox's own batch size (the relay's
	// is cfg.BatchSize).
	outboxBatch int
	cfg         relay.Config
}

func start(t *testing.T, s *pgtest.Schema, pub sink.Publisher, o options) *harness {
	t.Helper()
	st, err := store.New(s.Pool, store.Config{Schema: s.Name, KeepSent: o.keepSent, Claimer: o.claimer, ClaimLease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if o.policy.BaseDelay == 0 {
		o.policy.BaseDelay = 5 * time.Millisecond
		o.policy.MaxDelay = 20 * time.Millisecond
	}
	policy, err := retry.NewPolicy(o.policy)
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.cfg
	cfg.Store, cfg.Policy = st, policy
	if pub != nil {
		cfg.Publisher = pub
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if o.keepSent && cfg.SentRetention == 0 {
		cfg.SentRetention = time.Hour
	}
	if cfg.Pause.Base == 0 {
		cfg.Pause = relay.PauseConfig{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	}
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if o.listener {
		l, err := store.NewListener(s.Pool, store.ListenerConfig{Schema: s.Name, Logger: cfg.Logger})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listener = l
	}
	if o.outboxBatch > 0 {
		cfg.Outboxes = []relay.Outbox{{Name: relay.DefaultOutbox, Store: st, Listener: cfg.Listener, BatchSize: o.outboxBatch}}
		cfg.Store, cfg.Listener = nil, nil
	}
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, schema: s, store: st, relay: r, signals: r.InitTestSignals(), cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- r.Run(ctx) }()
	t.Cleanup(func() { h.stop() })
	return h
}

// stop cancels the relay and waits for Run to return.
func (h *harness) stop() {
	h.cancel()
	select {
	case err, ok := <-h.done:
		if ok && err != nil {
			h.t.Errorf("relay.Run: %v", err)
		}
		if ok {
			close(h.done)
		}
	case <-time.After(time.Minute):
		h.t.Fatal("relay did not stop within a minute")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

func count(t *testing.T, pool *pgxpool.Pool, where string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func insert(t *testing.T, s *pgtest.Schema, sql string, args ...any) {
	t.Helper()
	if _, err := s.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// checkKeyOrder checks that, for every key, ids were published in order.
func checkKeyOrder(t *testing.T, published []int64, keyOf map[int64]string) {
	t.Helper()
	last := map[string]int64{}
	for _, id := range published {
		k := keyOf[id]
		if k == "" {
			continue
		}
		if id < last[k] {
			t.Fatalf("key %s: id %d published after %d", k, id, last[k])
		}
		last[k] = id
	}
}

func keysOf(t *testing.T, s *pgtest.Schema) map[int64]string {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `SELECT id, coalesce(key, '') FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]string{}
	for rows.Next() {
		var id int64
		var k string
		if err := rows.Scan(&id, &k); err != nil {
			t.Fatal(err)
		}
		out[id] = k
	}
	return out
}

func newKafka(t *testing.T, c *kfake.Cluster) *kafka.Publisher {
	t.Helper()
	p, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs(), DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestDeliversBacklogToKafkaInKeyOrder(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	c := kafkatest.NewCluster(t, []string{"orders", "payments"})
	insert(t, s, `INSERT INTO outbox (topic, key, payload)
		SELECT CASE WHEN g % 3 = 0 THEN 'payments' ELSE 'orders' END,
		       CASE WHEN g % 10 = 0 THEN NULL ELSE 'k' || (g % 20) END, g::text::bytea
		FROM generate_series(1, 3000) g`)
	keyOf := keysOf(t, s)
	start(t, s, newKafka(t, c), options{cfg: relay.Config{Workers: 2, BatchSize: 100}})
	testwait.For(t, "the backlog to drain", func() bool { return count(t, s.Pool, "true") == 0 })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	total := 0
	for _, topic := range []string{"orders", "payments"} {
		recs := kafkatest.Consume(ctx, t, c.ListenAddrs(), topic, map[string]int{"orders": 2000, "payments": 1000}[topic])
		// Partition order is publish order for the key's messages.
		sort.SliceStable(recs, func(i, j int) bool {
			if recs[i].Partition != recs[j].Partition {
				return recs[i].Partition < recs[j].Partition
			}
			return recs[i].Offset < recs[j].Offset
		})
		var ids []int64
		for _, r := range recs {
			id, _ := strconv.ParseInt(r.Headers[kafka.HeaderID], 10, 64)
			ids = append(ids, id)
		}
		// Order across topics cannot be observed; within one it can.
		checkKeyOrder(t, ids, keyOf)
		total += len(ids)
	}
	if total != 3000 {
		t.Fatalf("consumed %d messages, want 3000", total)
	}
}

// Only the failed rows are retried; the failed key's later rows wait
// untouched behind it while everything else is delivered.
func TestPartialBatchFailure(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, key, payload) VALUES
		('t', 'K', 'a'), ('t', 'K', 'b'), ('t', 'J', 'c'), ('t', NULL, 'd'), ('t', 'K', 'e')`)
	pub := &fakePublisher{fail: func(r sink.Record, attempt int) error {
		if string(r.Payload) == "a" && attempt == 1 {
			return sink.Transient(errors.New("leader moved"), 0)
		}
		return nil
	}}
	// A long backoff keeps "a" waiting so the state can be looked at.
	h := start(t, s, pub, options{policy: retry.PolicyConfig{BaseDelay: time.Hour, MaxDelay: time.Hour, Strategy: retry.StrategyNone}})
	testwait.For(t, "c and d to be delivered", func() bool { return count(t, s.Pool, "payload IN ('c', 'd')") == 0 })
	// Before a's attempt every row has its insert's time: wait for a's
	// retry, and K's later rows deferred behind it. c and d may go in
	// another worker's batch, ahead of a's.
	testwait.For(t, "K's later rows to be deferred", func() bool {
		return count(t, s.Pool, `key = 'K' AND next_attempt_at = (SELECT next_attempt_at FROM outbox WHERE payload = 'a' AND retry_count > 0)`) == 3
	})
	if n := count(t, s.Pool, `payload = 'a' AND retry_count = 1 AND last_error = 'leader moved'`); n != 1 {
		t.Fatal("the failed row did not count its attempt")
	}
	if n := count(t, s.Pool, `payload IN ('b', 'e') AND retry_count = 0 AND last_error IS NULL AND status = 'pending'`); n != 2 {
		t.Fatal("K's later rows were touched")
	}
	h.stop()

	// Time passes: the retry succeeds and K drains in order.
	insert(t, s, `UPDATE outbox SET next_attempt_at = now()`)
	start(t, s, pub, options{})
	testwait.For(t, "everything delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	var order []string
	for _, id := range pub.published() {
		order = append(order, strconv.FormatInt(id, 10))
	}
	if got := fmt.Sprint(order); got != "[3 4 1 2 5]" {
		t.Fatalf("published ids %s, want [3 4 1 2 5]", got)
	}
}

// A key whose head is in backoff holds back its later rows while other
// keys keep flowing.
func TestHeadInBackoffHoldsOnlyItsKey(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'stuck', 'head')`)
	insert(t, s, `INSERT INTO outbox (topic, key, payload)
		SELECT 't', CASE WHEN g % 5 = 0 THEN 'stuck' ELSE 'k' || (g % 7) END, 'x' FROM generate_series(1, 500) g`)
	pub := &fakePublisher{fail: func(r sink.Record, _ int) error {
		if string(r.Payload) == "head" {
			return sink.Transient(errors.New("503"), 0)
		}
		return nil
	}}
	start(t, s, pub, options{
		policy: retry.PolicyConfig{BaseDelay: time.Hour, MaxDelay: time.Hour},
		cfg:    relay.Config{Workers: 2, BatchSize: 50},
	})
	testwait.For(t, "other keys to drain", func() bool { return count(t, s.Pool, "key <> 'stuck'") == 0 })
	if n := count(t, s.Pool, "key = 'stuck' AND retry_count = 0 AND status = 'pending'"); n != 100 {
		t.Fatalf("%d of the stuck key's later rows wait untouched, want 100", n)
	}
	keyOf := keysOf(t, s)
	for _, id := range pub.published() {
		if keyOf[id] == "stuck" {
			t.Fatalf("row %d of the stuck key was acknowledged while its head waits", id)
		}
	}
	// Later rows may ride in the head's own call (the sink stops at the
	// failed head), but are never handed over without it.
	for _, call := range pub.calls {
		withHead := false
		for _, r := range call {
			withHead = withHead || string(r.Payload) == "head"
			if r.Key == "stuck" && !withHead {
				t.Fatalf("row %d of the stuck key was handed over without its head", r.ID)
			}
		}
	}
}

// A hot key travels in runs, in order, many rows per batch.
func TestHotKeyRunInOneBatch(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'hot', g::text::bytea FROM generate_series(1, 300) g`)
	pub := &fakePublisher{}
	h := start(t, s, pub, options{cfg: relay.Config{Workers: 1, BatchSize: 500}})
	// The relay counts a batch once its write-back has committed.
	testwait.For(t, "the hot key to drain", func() bool { return h.relay.Stats().Delivered >= 300 })
	if n := count(t, s.Pool, "true"); n != 0 {
		t.Fatalf("%d rows left after 300 were delivered", n)
	}
	if len(pub.calls) != 1 || len(pub.calls[0]) != 300 {
		t.Fatalf("%d publish calls (first of %d rows), want one call with all 300", len(pub.calls), len(pub.calls[0]))
	}
	for i, r := range pub.calls[0] {
		if r.ID != int64(i+1) {
			t.Fatalf("position %d holds id %d", i, r.ID)
		}
	}
	if st := h.relay.Stats(); st.Delivered != 300 {
		t.Fatalf("stats %+v", st)
	}
}

func TestExhaustedAttemptsAndMaxAge(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'a', 'young')`)
	insert(t, s, `INSERT INTO outbox (topic, key, payload, created_at) VALUES ('t', 'b', 'old', now() - interval '2 hours')`)
	pub := &fakePublisher{fail: func(sink.Record, int) error {
		return sink.Transient(errors.New("HTTP 503 Service Unavailable"), 0)
	}}
	start(t, s, pub, options{policy: retry.PolicyConfig{MaxAttempts: 3, MaxAge: time.Hour, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})
	testwait.For(t, "both dead-lettered", func() bool { return count(t, s.Pool, "status = 'dead_lettered'") == 2 })
	if n := count(t, s.Pool, `payload = 'young' AND dead_letter_reason = 'retries_exhausted' AND retry_count = 3
		AND last_error = 'HTTP 503 Service Unavailable' AND jsonb_array_length(error_history) = 3 AND dead_lettered_at IS NOT NULL`); n != 1 {
		t.Fatal("the young row was not dead-lettered retries_exhausted after 3 attempts")
	}
	if n := count(t, s.Pool, `payload = 'old' AND dead_letter_reason = 'max_age_exceeded' AND retry_count = 1`); n != 1 {
		t.Fatal("the old row was not dead-lettered max_age_exceeded at its first failure")
	}
}

func TestOnDeadLetterReleaseAndBlock(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{relay.OnDeadLetterRelease, relay.OnDeadLetterBlock} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := pgtest.NewSchema(t)
			insert(t, s, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'K', 'poison'), ('t', 'K', 'next'), ('t', 'J', 'other')`)
			pub := &fakePublisher{fail: func(r sink.Record, _ int) error {
				if string(r.Payload) == "poison" {
					return sink.Permanent(errors.New("HTTP 422"), "")
				}
				return nil
			}}
			start(t, s, pub, options{cfg: relay.Config{OnDeadLetter: mode}})
			testwait.For(t, "the other key delivered", func() bool { return count(t, s.Pool, "payload = 'other'") == 0 })
			testwait.For(t, "the poison row dead-lettered", func() bool {
				return count(t, s.Pool, "payload = 'poison' AND status = 'dead_lettered' AND dead_letter_reason = 'permanent' AND retry_count = 1") == 1
			})
			if mode == relay.OnDeadLetterRelease {
				testwait.For(t, "K's next row delivered", func() bool { return count(t, s.Pool, "payload = 'next'") == 0 })
				if count(t, s.Pool, "key_parked") != 0 {
					t.Fatal("release mode parked the key")
				}
				return
			}
			testwait.For(t, "K's next row deferred behind the parked key", func() bool {
				return count(t, s.Pool, "payload = 'next' AND next_attempt_at > now() + interval '1 minute'") == 1
			})
			if count(t, s.Pool, "payload = 'poison' AND key_parked") != 1 || count(t, s.Pool, "payload = 'next' AND retry_count = 0") != 1 {
				t.Fatal("block mode did not park the key untouched")
			}
		})
	}
}

func TestUndeliverableRowsDeadLetteredWithoutAttempt(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, key, payload, headers) VALUES
		('t', 'K', repeat('x', 2000)::bytea, '{}'),
		('t', 'K', 'fine', '{}'),
		('t', NULL, 'bad headers', '{"retries": 3}')`)
	pub := &fakePublisher{}
	start(t, s, pub, options{cfg: relay.Config{PayloadCap: 1000, MaxBatchBytes: 1000}})
	testwait.For(t, "the fine row delivered", func() bool { return count(t, s.Pool, "payload = 'fine'") == 0 })
	if n := count(t, s.Pool, `dead_letter_reason = 'too_large' AND retry_count = 0 AND last_error LIKE '%2000 bytes%'`); n != 1 {
		t.Fatal("oversized row not dead-lettered too_large without an attempt")
	}
	if n := count(t, s.Pool, `dead_letter_reason = 'invalid_message' AND last_error = 'header "retries" is a number, not a string'`); n != 1 {
		t.Fatal("row with a non-string header not dead-lettered invalid_message")
	}
	for _, call := range pub.calls {
		for _, r := range call {
			if r.Undeliverable != "" {
				t.Fatalf("undeliverable row %d was published", r.ID)
			}
		}
	}
}

// MessageSizeTooLarge from the broker dead-letters the row on its first
// attempt while the rest of the batch is delivered.
func TestBrokerMessageSizeTooLarge(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	c := kafkatest.NewCluster(t, nil)
	if err := c.CreateTopic("small", 1, map[string]string{"max.message.bytes": "2000"}); err != nil {
		t.Fatal(err)
	}
	insert(t, s, `INSERT INTO outbox (topic, key, payload) VALUES
		('small', 'K', 'first'), ('small', 'K', repeat('x', 5000)::bytea), ('small', 'K', 'third'), ('small', NULL, 'fourth')`)
	start(t, s, newKafka(t, c), options{keepSent: true})
	testwait.For(t, "the batch settled", func() bool { return count(t, s.Pool, "status = 'pending'") == 0 })
	if n := count(t, s.Pool, `status = 'dead_lettered' AND dead_letter_reason = 'too_large' AND retry_count = 1 AND octet_length(payload) = 5000`); n != 1 {
		t.Fatal("the oversized row was not dead-lettered too_large on its first attempt")
	}
	if n := count(t, s.Pool, `status = 'sent' AND retry_count = 0`); n != 3 {
		t.Fatalf("%d rows sent on their first attempt, want 3", n)
	}
}

// While the broker is down rows are deferred without counting attempts; when
// it comes back the backlog drains with nothing dead-lettered.
func TestBrokerOutageDoesNotBurnRetries(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	addr := c.ListenAddrs()[0]
	_, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	pub := newKafka(t, c)
	c.Close() // the broker goes down

	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 'orders', 'k' || (g % 10), 'x' FROM generate_series(1, 200) g`)
	h := start(t, s, pub, options{keepSent: true, policy: retry.PolicyConfig{MaxAttempts: 2}})
	testwait.For(t, "deliveries deferred during the outage", func() bool { return h.relay.Stats().Deferred >= 10 })
	if n := count(t, s.Pool, "retry_count > 0"); n != 0 {
		t.Fatalf("%d rows counted an attempt while the broker was unreachable", n)
	}

	// The broker comes back on the same address.
	kafkatest.NewCluster(t, []string{"orders"}, kfake.Ports(port))
	testwait.For(t, "the backlog to drain", func() bool { return count(t, s.Pool, "status = 'sent'") == 200 })
	if n := count(t, s.Pool, "retry_count > 0 OR status = 'dead_lettered'"); n != 0 {
		t.Fatalf("%d rows burned attempts or were dead-lettered during the outage", n)
	}
	if n := count(t, s.Pool, "last_error LIKE '%connection refused%'"); n == 0 {
		t.Fatal("deferred rows do not record the outage's error")
	}
}

// blockingPublisher holds every publish until released or its context ends.
type blockingPublisher struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockingPublisher) Publish(ctx context.Context, recs []sink.Record) []error {
	b.once.Do(func() { close(b.started) })
	errs := make([]error, len(recs))
	select {
	case <-b.release:
	case <-ctx.Done():
		for i := range errs {
			errs[i] = ctx.Err()
		}
	}
	return errs
}

func TestStopDrainsInFlightBatch(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 't', 'x' FROM generate_series(1, 10)`)
	pub := &blockingPublisher{started: make(chan struct{}), release: make(chan struct{})}
	h := start(t, s, pub, options{cfg: relay.Config{Workers: 1, DrainTimeout: time.Minute}})
	<-pub.started
	h.cancel() // stop claiming; the batch in flight may finish
	close(pub.release)
	h.stop()
	if n := count(t, s.Pool, "true"); n != 0 {
		t.Fatalf("%d rows left after a drained stop, want 0", n)
	}
}

func TestStopAbandonsBatchAfterDrainTimeout(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 't', 'x' FROM generate_series(1, 10)`)
	pub := &blockingPublisher{started: make(chan struct{}), release: make(chan struct{})}
	h := start(t, s, pub, options{cfg: relay.Config{Workers: 1, DrainTimeout: 50 * time.Millisecond}})
	<-pub.started
	h.stop() // the publish never finishes: abandoned after the drain timeout
	if n := count(t, s.Pool, "status = 'pending' AND retry_count = 0 AND last_error IS NULL"); n != 10 {
		t.Fatalf("%d rows pending and untouched after an abandoned batch, want 10", n)
	}
}

// stepPublisher acknowledges every record, after running step with the
// publish's number, from 1.
type stepPublisher struct {
	mu    sync.Mutex
	calls int
	ids   []int64
	step  func(call int)
}

func (p *stepPublisher) Publish(ctx context.Context, recs []sink.Record) []error {
	p.mu.Lock()
	p.calls++
	call := p.calls
	p.mu.Unlock()
	p.step(call)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range recs {
		p.ids = append(p.ids, r.ID)
	}
	return make([]error, len(recs))
}

func (p *stepPublisher) published() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.ids...)
}

// awaitClaims waits, from a publish, until the relay has made n claims,
// and marks the test failed if that takes over ten seconds.
func awaitClaims(t *testing.T, rel *atomic.Pointer[relay.Relay], n int64) {
	if ok, saw := testwait.Poll(10*time.Second, func() (bool, string) {
		r := rel.Load()
		return r != nil && r.Stats().Claims >= n, fmt.Sprintf("no claim %d while a batch was publishing", n)
	}); !ok {
		t.Error(saw)
	}
}

// While a backlog lasts, a worker claims its next batch while it publishes
// the current one. Rows of a key in flight are left for later, so per-key
// order holds.
func TestClaimsNextBatchWhilePublishing(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	// Batches of 10 over 15 keys: the batch claimed ahead of the first
	// holds keys of it too.
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || (g % 15), 'x' FROM generate_series(1, 30) g`)
	keyOf := keysOf(t, s)
	var rel atomic.Pointer[relay.Relay]
	pub := &stepPublisher{step: func(call int) {
		if call == 1 {
			awaitClaims(t, &rel, 2)
		}
	}}
	// A claim ahead needs two connections to spare: nothing else here
	// takes one (no cleanup, no polling) until the first publish is over.
	h := start(t, s, pub, options{cfg: relay.Config{Workers: 1, BatchSize: 10, DeadLetterRetention: retry.Forever}})
	rel.Store(h.relay)
	testwait.For(t, "every row published", func() bool { return len(pub.published()) >= 30 })
	testwait.For(t, "delivery", func() bool { return count(t, s.Pool, "true") == 0 })
	got := pub.published()
	if len(got) != 30 {
		t.Fatalf("published %d rows, want 30 once each", len(got))
	}
	checkKeyOrder(t, got, keyOf)
}

// A batch claimed ahead and not yet published when the relay stops is given
// back: its rows are unlocked and untouched.
func TestStopReleasesBatchClaimedAhead(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 't', 'x' FROM generate_series(1, 30)`)
	var rel atomic.Pointer[relay.Relay]
	claimedAhead, release := make(chan struct{}), make(chan struct{})
	pub := &stepPublisher{step: func(call int) {
		if call == 1 {
			awaitClaims(t, &rel, 2)
			close(claimedAhead)
			<-release
		}
	}}
	h := start(t, s, pub, options{cfg: relay.Config{Workers: 1, BatchSize: 10, DrainTimeout: time.Minute, DeadLetterRetention: retry.Forever}})
	rel.Store(h.relay)
	<-claimedAhead
	h.cancel() // the first batch finishes; the one claimed ahead is not published
	close(release)
	h.stop()
	if n := len(pub.published()); n != 10 {
		t.Fatalf("published %d rows, want the first batch's 10", n)
	}
	if n := count(t, s.Pool, "status = 'pending' AND retry_count = 0 AND last_error IS NULL"); n != 20 {
		t.Fatalf("%d rows pending and untouched, want 20", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var unlocked int
	if err := s.Pool.QueryRow(ctx,
		`SELECT count(*) FROM (SELECT id FROM outbox FOR UPDATE SKIP LOCKED) AS o`).Scan(&unlocked); err != nil {
		t.Fatalf("counting unlocked rows: %v", err)
	}
	if unlocked != 20 {
		t.Fatalf("%d of 20 rows unlocked after the relay stopped", unlocked)
	}
}

// With LISTEN/NOTIFY a new row is delivered at once, though the poll
// interval is an hour: end to end. TestListenerWakesOnInsert (outbox)
// checks strictly that the insert's notification is what wakes.
func TestWakeupOnInsert(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	pub := &fakePublisher{}
	start(t, s, pub, options{listener: true, cfg: relay.Config{PollInterval: time.Hour}})
	// The first poll happens at start; wait for the listener to be up.
	testwait.For(t, "the listener", func() bool { return listenerUp(t, s) })
	insert(t, s, `INSERT INTO outbox (topic, payload) VALUES ('t', 'wake up')`)
	testwait.For(t, "the row delivered", func() bool { return count(t, s.Pool, "true") == 0 })
}

func listenerUp(t *testing.T, s *pgtest.Schema) bool {
	var n int
	err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND datname = current_database()`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// A crash between the broker's ack and the write-back: the row stays
// pending and is published again with the same event id; nothing is lost.
func TestCrashAfterPublishBeforeAck(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 'orders', 'k' || (g % 3), g::text::bytea FROM generate_series(1, 20) g`)
	var eventIDs []string
	rows, err := s.Pool.Query(context.Background(), `SELECT event_id::text FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		rows.Scan(&id)
		eventIDs = append(eventIDs, id)
	}
	rows.Close()

	// The relay gets its own pool so its sessions can be cut like a crash
	// would cut them.
	cfg, err := pgxpool.ParseConfig(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	app := "crashing-relay-" + s.Name
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	relayPool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer relayPool.Close()
	crashed := false
	pub := crashAfter{inner: newKafka(t, c), crash: func() {
		if crashed {
			return
		}
		crashed = true
		if _, err := s.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
			t.Error(err)
		}
	}}
	relaySchema := &pgtest.Schema{Name: s.Name, URL: s.URL, Pool: relayPool}
	start(t, relaySchema, pub, options{cfg: relay.Config{Workers: 1}})
	testwait.For(t, "everything delivered", func() bool { return count(t, s.Pool, "true") == 0 })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := kafkatest.Consume(ctx, t, c.ListenAddrs(), "orders", 40) // 20 published twice
	seen := map[string]int{}
	for _, r := range got {
		seen[r.Headers[kafka.HeaderEventID]]++
	}
	for _, id := range eventIDs {
		if seen[id] != 2 {
			t.Errorf("event %s delivered %d times, want twice (once before the crash, once after)", id, seen[id])
		}
	}
}

// crashAfter publishes, then cuts the relay's database sessions before the
// write-back, once.
type crashAfter struct {
	inner sink.Publisher
	crash func()
}

func (c crashAfter) Publish(ctx context.Context, recs []sink.Record) []error {
	errs := c.inner.Publish(ctx, recs)
	c.crash()
	return errs
}

// Run leaves no goroutine behind once it returns and its resources close.
func TestRunLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := pgtest.NewSchema(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	p, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	insert(t, s, `INSERT INTO outbox (topic, payload) VALUES ('orders', 'x')`)
	h := start(t, s, p, options{listener: true})
	testwait.For(t, "delivery", func() bool { return count(t, s.Pool, "true") == 0 })
	h.stop()
	p.Close()
	c.Close()
	s.Pool.Close()
}

// With a retention, sent rows are kept, then deleted once past it.
func TestSentRowsCleanedUpAfterRetention(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 't', 'x' FROM generate_series(1, 30)`)
	h := start(t, s, &fakePublisher{}, options{keepSent: true, cfg: relay.Config{SentRetention: time.Second, CleanupInterval: 20 * time.Millisecond}})
	testwait.For(t, "rows kept as sent", func() bool { return count(t, s.Pool, "status = 'sent'") == 30 })
	h.cleaned("sent rows", 30)
	if n := count(t, s.Pool, "true"); n != 0 {
		t.Fatalf("%d rows left after the cleaner deleted 30", n)
	}
}

// cleaned waits until the cleaner has deleted n rows of what.
func (h *harness) cleaned(what string, n int64) {
	h.t.Helper()
	total := int64(0)
	h.signals.Cleaned.WaitFor(h.t, fmt.Sprintf("the cleaner to delete %d %s", n, what), func(b relay.CleanedBatch) bool {
		if b.What == what {
			total += b.Deleted
		}
		return total >= n
	})
	if total > n {
		h.t.Fatalf("the cleaner deleted %d %s, want %d", total, what, n)
	}
}

// Dead letters, discarded rows and audit records past their retention are
// deleted by the maintenance loop, except a row that parks its key;
// younger ones and pending rows stay. Discarded rows count from when they
// were discarded.
func TestCleanedUpAfterRetention(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, key, payload, next_attempt_at, status, dead_letter_reason, dead_lettered_at, discarded_at, key_parked)
SELECT 't', 'k' || g, 'x', now() + interval '1 hour',
       CASE WHEN g <= 20 THEN 'dead_lettered' WHEN g <= 25 THEN 'discarded' ELSE 'pending' END,
       CASE WHEN g <= 25 THEN 'permanent' END,
       CASE WHEN g <= 20 THEN now() - CASE WHEN g % 5 = 0 THEN interval '1 minute' ELSE interval '2 hours' END
            WHEN g <= 25 THEN now() - interval '2 days' END,
       CASE WHEN g IN (23, 24) THEN now() - interval '2 hours' WHEN g = 25 THEN now() - interval '1 minute' END,
       g = 1
FROM generate_series(1, 30) g`)
	insert(t, s, `INSERT INTO outbox_audit (at, actor, source, action, row_ids)
SELECT now() - CASE WHEN g <= 3 THEN interval '2 hours' ELSE interval '1 minute' END, 'ops', 'cli', 'replay', '{1}'
FROM generate_series(1, 5) g`)
	h := start(t, s, &fakePublisher{}, options{cfg: relay.Config{
		DeadLetterRetention: time.Hour, DiscardedRetention: time.Hour, AuditRetention: time.Hour,
		CleanupInterval: 10 * time.Millisecond,
	}})
	// 16 of the 20 dead letters are two hours old; one of those parks its
	// key.
	h.cleaned("dead letters", 15)
	// Rows 21 and 22 were discarded before that was recorded: they count
	// from when they were dead-lettered, two days ago. Row 25 was
	// discarded a minute ago.
	h.cleaned("discarded rows", 4)
	h.cleaned("audit records", 3)
	if n := count(t, s.Pool, "status = 'dead_lettered'"); n != 5 {
		t.Fatalf("%d dead letters left, want 5", n)
	}
	if n := count(t, s.Pool, "key_parked AND key = 'k1'"); n != 1 {
		t.Fatal("the row that parks its key was deleted")
	}
	if n := count(t, s.Pool, "status = 'discarded' AND key = 'k25'"); n != 1 {
		t.Fatal("the row discarded a minute ago was deleted")
	}
	if n := count(t, s.Pool, "status = 'pending'"); n != 5 {
		t.Fatalf("%d pending rows left, want 5", n)
	}
	var audit int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_audit WHERE at > now() - interval '1 hour'`).Scan(&audit); err != nil || audit != 2 {
		t.Fatalf("%d young audit records left, want 2 (%v)", audit, err)
	}
}

// By default dead letters are evidence, kept until an operator handles
// them, and so is the audit trail; rows discarded two weeks ago go.
func TestDefaultRetentionKeepsUnhandledDeadLetters(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, payload, status, dead_letter_reason, dead_lettered_at, discarded_at)
SELECT 't', 'x', CASE WHEN g <= 3 THEN 'dead_lettered' ELSE 'discarded' END, 'permanent', now() - interval '1 year',
       CASE WHEN g = 4 THEN now() - interval '15 days' WHEN g = 5 THEN now() - interval '13 days' END
FROM generate_series(1, 5) g`)
	insert(t, s, `INSERT INTO outbox_audit (at, actor, source, action, row_ids) VALUES (now() - interval '1 year', 'ops', 'cli', 'discard', '{4}')`)
	h := start(t, s, &fakePublisher{}, options{cfg: relay.Config{CleanupInterval: 10 * time.Millisecond}})
	h.cleaned("discarded rows", 1)
	// The cleaner deletes dead letters before discarded rows, when it
	// deletes them at all: by now it would have.
	if n := count(t, s.Pool, "status = 'dead_lettered'"); n != 3 {
		t.Fatalf("%d unhandled dead letters left, want 3", n)
	}
	if n := count(t, s.Pool, "status = 'discarded'"); n != 1 {
		t.Fatalf("%d discarded rows left, want the one discarded 13 days ago", n)
	}
	// The next run: the audit records would have gone after the first.
	h.signals.Cleaned.WaitFor(t, "another cleanup run", func(b relay.CleanedBatch) bool { return b.What == "discarded rows" })
	var audit int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_audit`).Scan(&audit); err != nil || audit != 1 {
		t.Fatalf("%d audit records left, want 1 (%v)", audit, err)
	}
}

// Large payloads: every publish stays within the batch byte budget, and
// everything is delivered.
func TestBatchByteBudget(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, key, payload)
		SELECT 't', 'k' || (g % 3), convert_to(repeat('x', 300000), 'UTF8') FROM generate_series(1, 12) g`)
	pub := &fakePublisher{}
	const budget = 1 << 20
	start(t, s, pub, options{cfg: relay.Config{Workers: 1, MaxBatchBytes: budget, PayloadCap: 400000}})
	testwait.For(t, "everything delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	for _, call := range pub.calls {
		size := 0
		for _, r := range call {
			size += r.PayloadSize + relay.RecordOverhead + len(r.Key)
		}
		if size > budget {
			t.Fatalf("a publish of %d records carried %d bytes, above the %d budget", len(call), size, budget)
		}
	}
	if len(pub.calls) < 4 {
		t.Fatalf("12 rows of 300 kB went in %d publishes; at most 3 fit in 1 MiB", len(pub.calls))
	}
}

// A backlog of rows that can only be dead-lettered is worked through back
// to back, not one batch per poll interval.
func TestUndeliverableBacklogDoesNotCrawl(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 't', convert_to(repeat('x', 5000), 'UTF8') FROM generate_series(1, 50)`)
	insert(t, s, `INSERT INTO outbox (topic, payload) VALUES ('t', 'small')`)
	pub := &fakePublisher{}
	// An hour between polls: only back-to-back claims can finish this.
	start(t, s, pub, options{cfg: relay.Config{Workers: 1, BatchSize: 10, PayloadCap: 1000, MaxBatchBytes: 4000, PollInterval: time.Hour}})
	testwait.For(t, "every row settled", func() bool { return count(t, s.Pool, "status = 'pending'") == 0 })
	if n := count(t, s.Pool, "dead_letter_reason = 'too_large'"); n != 50 {
		t.Fatalf("%d rows dead-lettered too_large, want 50", n)
	}
}
