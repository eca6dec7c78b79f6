package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
	"github.com/outbox-relay/outbox-relay/relay/webhook"
)

func TestValidateRoutes(t *testing.T) {
	err := relay.ValidateRoutes([]relay.Route{
		{Topics: []string{"orders.*"}, Destination: "kafka"},
		{Topics: []string{"[bad"}, Destination: "hooks"},
		{Destination: "kafka"},
	}, []string{"kafka"})
	for _, want := range []string{`route 2: topic pattern "[bad" is not a valid glob`, `route 2: destination "hooks" is not defined`, "route 3 has no topics"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	_, err = relay.New(relay.Config{Store: &store.Store{}, Destinations: []relay.Destination{{Name: "a", Publisher: &fakePublisher{}}, {Name: "a"}}})
	for _, want := range []string{"destination a needs a publisher", "destination a is defined twice", "destinations need routes"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// breaker returns the breaker state of the destination called name.
func (h *harness) breaker(name string) relay.BreakerState {
	for _, d := range h.relay.Destinations() {
		if d.Name == name {
			return d.Breaker
		}
	}
	h.t.Fatalf("no destination %s", name)
	return 0
}

// breakerBecomes waits until the breaker of the destination called name
// changes to state.
func (h *harness) breakerBecomes(name string, state relay.BreakerState) {
	h.t.Helper()
	h.signals.BreakerChanged.WaitFor(h.t, "the breaker of "+name+" "+state.String(), func(c relay.BreakerChange) bool {
		return c.Destination == name && c.To == state
	})
}

// allBreakers checks that every destination's breaker is in state want.
func (h *harness) allBreakers(t *testing.T, want relay.BreakerState, when string) {
	t.Helper()
	for _, d := range h.relay.Destinations() {
		if d.Breaker != want {
			t.Errorf("destination %s: breaker %s %s, want %s", d.Name, d.Breaker, when, want)
		}
	}
}

// topicsSeen lists the topics a fake publisher was given.
func (f *fakePublisher) topicsSeen() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for _, call := range f.calls {
		for _, r := range call {
			out[r.Topic]++
		}
	}
	return out
}

func TestRoutesSendEachTopicToItsDestination(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	orders, hooks := &fakePublisher{}, &fakePublisher{}
	// Keys alternate between destinations, so order holds across them.
	insert(t, s, `INSERT INTO outbox (topic, key, payload)
SELECT (ARRAY['orders.placed', 'billing.invoice', 'audit.login', 'stray'])[1 + g % 4], 'k' || (g % 7), g::text::bytea
FROM generate_series(1, 400) g`)
	h := start(t, s, nil, options{keepSent: true, cfg: relay.Config{
		Destinations: []relay.Destination{{Name: "kafka", Publisher: orders}, {Name: "billing", Publisher: hooks}},
		Routes: []relay.Route{
			{Topics: []string{"billing.*"}, Destination: "billing"},
			{Topics: []string{"orders.*"}, Destination: "kafka"},
			{Topics: []string{"audit.?ogin"}, Destination: "kafka", Topic: "audit"},
		},
	}})
	testwait.For(t, "every row delivered or dead-lettered", func() bool { return count(t, s.Pool, "status = 'pending'") == 0 })
	h.stop()
	if got := orders.topicsSeen(); len(got) != 2 || got["orders.placed"] != 100 || got["audit"] != 100 {
		t.Errorf("kafka destination got %v; want 100 orders.placed and 100 audit (renamed)", got)
	}
	if got := hooks.topicsSeen(); len(got) != 1 || got["billing.invoice"] != 100 {
		t.Errorf("billing destination got %v; want 100 billing.invoice", got)
	}
	if n := count(t, s.Pool, `status = 'dead_lettered' AND dead_letter_reason = 'no_route' AND topic = 'stray'
AND retry_count = 0 AND last_error = 'no route matches topic "stray"'`); n != 100 {
		t.Errorf("%d unroutable rows dead-lettered no_route, want 100", n)
	}
	// Keys span both destinations: each saw its share of a key in order.
	keys := keysOf(t, s)
	checkKeyOrder(t, orders.published(), keys)
	checkKeyOrder(t, hooks.published(), keys)
}

// switchable fails every publish with err while down is set, and counts
// the calls it got while down.
type switchable struct {
	fakePublisher
	down      atomic.Bool
	err       error
	callsDown atomic.Int32
	firstUp   chan int // the size of the first call after coming back
	once      sync.Once
}

func (p *switchable) Publish(ctx context.Context, recs []sink.Record) []error {
	if p.down.Load() {
		p.callsDown.Add(1)
		errs := make([]error, len(recs))
		for i := range errs {
			errs[i] = p.err
		}
		return errs
	}
	p.once.Do(func() { p.firstUp <- len(recs) })
	return p.fakePublisher.Publish(ctx, recs)
}

func TestBreakerIsolatesAFailingDestination(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	healthy := &fakePublisher{}
	failing := &switchable{err: sink.Systemic(errors.New("dial tcp: connection refused")), firstUp: make(chan int, 1)}
	failing.down.Store(true)
	insert(t, s, `INSERT INTO outbox (topic, key, payload)
SELECT CASE WHEN g % 2 = 0 THEN 'hooks' ELSE 'events' END, 'k' || (g % 5), 'x' FROM generate_series(1, 200) g`)
	h := start(t, s, nil, options{keepSent: true, cfg: relay.Config{
		Destinations: []relay.Destination{{Name: "kafka", Publisher: healthy}, {Name: "hooks", Publisher: failing}},
		Routes:       []relay.Route{{Topics: []string{"hooks"}, Destination: "hooks"}, {Topics: []string{"*"}, Destination: "kafka"}},
		Pause:        relay.PauseConfig{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond},
	}})
	// Keys mix both destinations: a key's events rows behind a waiting
	// hooks row wait too. Unkeyed traffic shows the healthy side flowing.
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 'events', 'y' FROM generate_series(1, 300)`)
	testwait.For(t, "the healthy destination's unkeyed rows delivered", func() bool {
		return count(t, s.Pool, "topic = 'events' AND key IS NULL AND status = 'pending'") == 0
	})
	h.breakerBecomes("hooks", relay.BreakerOpen)
	if n := count(t, s.Pool, "retry_count > 0 OR status = 'dead_lettered'"); n != 0 {
		t.Fatalf("%d rows burned attempts while their destination was down", n)
	}
	if b := h.breaker("kafka"); b != relay.BreakerClosed {
		t.Fatalf("the healthy destination's breaker is %s", b)
	}
	// The destination comes back: a probe of a few rows, then the
	// backlog.
	failing.down.Store(false)
	select {
	case n := <-failing.firstUp:
		if n < 1 || n > 4 {
			t.Errorf("the first publish after the outage carried %d rows; a half-open probe carries one to four of a topic", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no probe after the destination came back")
	}
	testwait.For(t, "the backlog drained", func() bool { return count(t, s.Pool, "status <> 'sent'") == 0 })
	h.stop()
	keys := keysOf(t, s)
	checkKeyOrder(t, failing.published(), keys)
	h.allBreakers(t, relay.BreakerClosed, "after recovery")
	// While down, the breaker kept calls to a trickle of probes.
	if calls := failing.callsDown.Load(); calls > 60 {
		t.Errorf("%d publish calls to the failing destination while it was down", calls)
	}
}

// noAnswer is a transient failure of a whole destination: it answered
// nothing.
var noAnswer = sink.DestinationFailure(sink.ClassTransient, errors.New("read tcp: connection reset by peer"))

func TestBreakerOpensAfterConsecutiveTransientFailures(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	p := &fakePublisher{fail: func(sink.Record, int) error { return noAnswer }}
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 't', 'x' FROM generate_series(1, 50)`)
	h := start(t, s, nil, options{
		policy: retry.PolicyConfig{MaxAttempts: 1000, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		cfg: relay.Config{
			Destinations: []relay.Destination{{Name: "hooks", Publisher: p, Breaker: relay.BreakerConfig{Failures: 3}}},
			Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "hooks"}},
			BatchSize:    1, Pause: relay.PauseConfig{Base: time.Hour, Max: time.Hour},
			// One worker: a second may have a call under way when the
			// breaker opens, which it cannot take back.
			Workers: 1,
		},
	})
	h.breakerBecomes("hooks", relay.BreakerOpen)
	claims := h.relay.Stats().Claims
	testwait.For(t, "more claims while the breaker is open", func() bool { return h.relay.Stats().Claims > claims+5 })
	h.stop()
	if n := count(t, s.Pool, "true"); n != 50 {
		t.Fatalf("%d rows left, want all 50", n)
	}
	if st := h.relay.Destinations()[0]; st.Breaker != relay.BreakerOpen || st.OpenUntil.IsZero() {
		t.Fatalf("destination status %+v, want open with a probe time", st)
	}
	var attempts int
	if err := s.Pool.QueryRow(context.Background(), "SELECT sum(retry_count) FROM outbox").Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 3 {
		t.Fatalf("%d attempts; the breaker should open after 3 consecutive failures and take no more", attempts)
	}
}

func TestRetryBudgetLimitsFailingRetries(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	p := &fakePublisher{fail: func(sink.Record, int) error { return errors.New("500 Internal Server Error") }}
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 't', 'x' FROM generate_series(1, 40)`)
	start := time.Now()
	h := startRelay(t, s, retry.PolicyConfig{MaxAttempts: 1000, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}, relay.Config{
		Destinations: []relay.Destination{{Name: "hooks", Publisher: p, Breaker: relay.BreakerConfig{Failures: 1 << 20},
			RetryBudget: relay.RetryBudgetConfig{Ratio: 0.001, MinPerSecond: 1}}},
		Routes: []relay.Route{{Topics: []string{"*"}, Destination: "hooks"}},
	})
	testwait.For(t, "retries over budget deferred", func() bool { return h.relay.Stats().Deferred >= 30 })
	h.stop()
	var attempts int
	if err := s.Pool.QueryRow(context.Background(), "SELECT sum(retry_count) FROM outbox").Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	// 40 first attempts, a burst of 10 retries (ten seconds of the floor),
	// one more per second since, and 40 × 0.001 earned.
	limit := 40 + 10 + int(time.Since(start).Seconds()) + 1
	if attempts < 40 || attempts > limit {
		t.Fatalf("%d attempts; the budget allows between 40 and %d", attempts, limit)
	}
}

// startRelay is start with a policy and a configuration.
func startRelay(t *testing.T, s *pgtest.Schema, policy retry.PolicyConfig, cfg relay.Config) *harness {
	t.Helper()
	return start(t, s, nil, options{policy: policy, cfg: cfg})
}

// gate holds every publish until released, counting rows in flight.
type gate struct {
	release  chan struct{}
	inFlight atomic.Int32
	peak     atomic.Int32
	sent     atomic.Int32
}

func (g *gate) Publish(ctx context.Context, recs []sink.Record) []error {
	n := g.inFlight.Add(int32(len(recs)))
	defer g.inFlight.Add(-int32(len(recs)))
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
	errs := make([]error, len(recs))
	select {
	case <-g.release:
		g.sent.Add(int32(len(recs)))
	case <-ctx.Done():
		for i := range errs {
			errs[i] = ctx.Err()
		}
	}
	return errs
}

func TestBulkheadBoundsASlowDestination(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	slow := &gate{release: make(chan struct{})}
	fast := &fakePublisher{}
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 'slow', 'x' FROM generate_series(1, 20)`)
	h := start(t, s, nil, options{cfg: relay.Config{
		Workers:      3,
		Destinations: []relay.Destination{{Name: "slow", Publisher: slow, MaxInFlight: 2}, {Name: "fast", Publisher: fast}},
		Routes:       []relay.Route{{Topics: []string{"slow"}, Destination: "slow"}, {Topics: []string{"*"}, Destination: "fast"}},
	}})
	testwait.For(t, "the slow destination's bulkhead full", func() bool { return slow.inFlight.Load() == 2 })
	// With the bulkhead full, other destinations' rows still flow.
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 'fast', 'y' FROM generate_series(1, 100)`)
	testwait.For(t, "the fast destination's rows delivered", func() bool { return count(t, s.Pool, "topic = 'fast'") == 0 })
	close(slow.release)
	testwait.For(t, "the slow rows delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	h.stop()
	if p := slow.peak.Load(); p > 2 {
		t.Fatalf("%d rows of the slow destination in flight at once; the bulkhead allows 2", p)
	}
	if n := count(t, s.Pool, "true"); n != 0 || slow.sent.Load() != 20 {
		t.Fatalf("rows left %d, slow sent %d", n, slow.sent.Load())
	}
}

// TestHTTPOutageWhileKafkaFlows runs the real sinks: an HTTP endpoint that
// refuses connections for a while, beside Kafka traffic.
func TestHTTPOutageWhileKafkaFlows(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	cluster := kafkatest.NewCluster(t, []string{"orders", "payments"})
	k := newKafka(t, cluster)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // refusing connections until the server starts below
	hook, err := webhook.New(webhook.Config{Name: "hooks", URL: "http://" + addr + "/events", AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer hook.Close()

	insert(t, s, `INSERT INTO outbox (topic, key, payload)
SELECT (ARRAY['orders', 'payments', 'hooks.order'])[1 + g % 3], 'k' || (g % 9), g::text::bytea FROM generate_series(1, 300) g`)
	h := start(t, s, nil, options{cfg: relay.Config{
		Destinations: []relay.Destination{{Name: "kafka", Publisher: k}, {Name: "hooks", Publisher: hook}},
		Routes:       []relay.Route{{Topics: []string{"hooks.*"}, Destination: "hooks"}, {Topics: []string{"*"}, Destination: "kafka"}},
		Pause:        relay.PauseConfig{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond},
	}})
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 'orders', 'u' FROM generate_series(1, 2000)`)
	testwait.For(t, "unkeyed Kafka rows delivered during the HTTP outage", func() bool {
		return count(t, s.Pool, "key IS NULL") == 0
	})
	if n := count(t, s.Pool, "retry_count > 0 OR status = 'dead_lettered'"); n != 0 {
		t.Fatalf("%d rows burned attempts during the HTTP outage", n)
	}
	if n := count(t, s.Pool, "topic = 'hooks.order' AND last_error LIKE '%connection refused%'"); n == 0 {
		t.Fatal("no HTTP row records the refused connection")
	}
	h.breakerBecomes("hooks", relay.BreakerOpen)

	var mu sync.Mutex
	var got []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
	})}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the endpoint's port was taken meanwhile: %v", err)
	}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	defer srv.Close()
	testwait.For(t, "the HTTP backlog drained", func() bool { return count(t, s.Pool, "true") == 0 })
	h.stop()
	mu.Lock()
	defer mu.Unlock()
	if len(got) < 100 {
		t.Fatalf("the endpoint received %d requests, want 100", len(got))
	}
	h.allBreakers(t, relay.BreakerClosed, "after recovery")
	ctx := context.Background()
	if n := len(kafkatest.ConsumeAll(ctx, t, cluster, "orders")) + len(kafkatest.ConsumeAll(ctx, t, cluster, "payments")); n < 2200 {
		t.Fatalf("kafka got %d messages, want 2200", n)
	}
}

func TestBreakerHalfOpensWithoutTraffic(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	p := &fakePublisher{fail: func(sink.Record, int) error { return noAnswer }}
	insert(t, s, `INSERT INTO outbox (topic, payload) VALUES ('t', 'x')`)
	// The failed row waits an hour; the breaker's cool-down is short. It
	// must not stay open for want of a row to probe it with.
	h := start(t, s, nil, options{
		policy: retry.PolicyConfig{BaseDelay: time.Hour, MaxDelay: time.Hour, Strategy: retry.StrategyNone},
		cfg: relay.Config{
			Destinations: []relay.Destination{{Name: "hooks", Publisher: p, Breaker: relay.BreakerConfig{Failures: 1}}},
			Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "hooks"}},
			Pause:        relay.PauseConfig{Base: 20 * time.Millisecond, Max: 20 * time.Millisecond},
		},
	})
	testwait.For(t, "one attempt", func() bool { return count(t, s.Pool, "retry_count = 1") == 1 })
	h.breakerBecomes("hooks", relay.BreakerHalfOpen)
	h.stop()
}

// stampPublisher records when each row was published.
type stampPublisher struct {
	mu    sync.Mutex
	times []time.Time
	ids   map[int64]int
}

func (p *stampPublisher) Publish(_ context.Context, recs []sink.Record) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ids == nil {
		p.ids = map[int64]int{}
	}
	now := time.Now()
	for _, r := range recs {
		p.times = append(p.times, now)
		p.ids[r.ID]++
	}
	return make([]error, len(recs))
}

func (p *stampPublisher) sent() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.times)
}

// A rate-limited destination gets no more rows per second than its token
// bucket allows, without attempts counted or rows deferred, while another
// destination's rows flow at full speed.
func TestRateLimitPacesItsDestinationOnly(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	const rate, burst, rows = 20, 5, 55
	quota := &stampPublisher{}
	free := &fakePublisher{}
	insert(t, s, fmt.Sprintf(`INSERT INTO outbox (topic, key, payload) SELECT 'quota', 'k' || (g %% 7), 'x' FROM generate_series(1, %d) g`, rows))
	h := start(t, s, nil, options{cfg: relay.Config{
		Workers: 2,
		Destinations: []relay.Destination{
			{Name: "quota", Publisher: quota, RateLimit: relay.RateLimitConfig{PerSecond: rate, Burst: burst}},
			{Name: "free", Publisher: free},
		},
		Routes: []relay.Route{{Topics: []string{"quota"}, Destination: "quota"}, {Topics: []string{"*"}, Destination: "free"}},
	}})
	testwait.For(t, "the burst spent", func() bool { return quota.sent() >= burst })
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 'free', 'y' FROM generate_series(1, 200)`)
	testwait.For(t, "the other destination's rows delivered", func() bool { return count(t, s.Pool, "topic = 'free'") == 0 })
	if n := quota.sent(); n >= rows {
		t.Fatalf("the rate-limited destination had sent all %d rows before 200 rows elsewhere went out", n)
	}
	testwait.For(t, "the rate-limited rows delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	h.stop()

	quota.mu.Lock()
	defer quota.mu.Unlock()
	if len(quota.ids) != rows || len(quota.times) != rows {
		t.Fatalf("%d rows published %d times, want %d once each", len(quota.ids), len(quota.times), rows)
	}
	// A token bucket sends at most burst + rate × window in any window.
	for i, end := range quota.times {
		n := 0
		for _, at := range quota.times[:i+1] {
			if end.Sub(at) < time.Second {
				n++
			}
		}
		if n > burst+rate {
			t.Fatalf("%d rows within one second, above the bucket's %d", n, burst+rate)
		}
	}
	if took, least := quota.times[rows-1].Sub(quota.times[0]), time.Duration(float64(rows-burst)/rate*float64(time.Second)); took < least*95/100 {
		t.Fatalf("%d rows went out in %s; at %d rows/s after a burst of %d they need %s", rows, took, rate, burst, least)
	}
}

// stuckPublisher ignores its deadline until released, as a sink with a
// bug would.
type stuckPublisher struct {
	got     chan struct{}
	release chan struct{}
}

func (p *stuckPublisher) Publish(_ context.Context, recs []sink.Record) []error {
	select {
	case p.got <- struct{}{}:
	default:
	}
	<-p.release
	return make([]error, len(recs))
}

// A worker stuck on one batch for longer than any batch can take is
// reported wedged, so the liveness probe restarts the process; an idle
// relay and one that got unstuck are not.
func TestWedgedWorkerIsReported(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	pub := &stuckPublisher{got: make(chan struct{}, 1), release: make(chan struct{})}
	h := start(t, s, pub, options{cfg: relay.Config{Workers: 2, PublishTimeout: 50 * time.Millisecond, QueryTimeout: 300 * time.Millisecond,
		PollInterval: 10 * time.Millisecond}})
	if bound := h.relay.WedgedAfter(); bound != 2*(3*50*time.Millisecond+3*300*time.Millisecond) {
		t.Fatalf("WedgedAfter = %s", bound)
	}
	insert(t, s, `INSERT INTO outbox (topic, payload) VALUES ('t', 'x')`)
	<-pub.got
	if err := h.relay.Wedged(); err != nil {
		t.Fatalf("wedged at once: %v", err)
	}
	testwait.For(t, "the stuck worker reported", func() bool { return h.relay.Wedged() != nil })
	if err := h.relay.Wedged(); !strings.Contains(err.Error(), "has been on one batch for") || !strings.Contains(err.Error(), "longer than any batch can take (2.1s): wedged") {
		t.Fatalf("Wedged = %v", err)
	}
	close(pub.release)
	testwait.For(t, "the row delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	testwait.For(t, "the worker no longer wedged", func() bool { return h.relay.Wedged() == nil })
	h.stop()
}

// A destination reports the rows being published to it, and none once
// they are answered.
func TestDestinationReportsRowsInFlight(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'p' FROM generate_series(1, 7) g`)
	publishing, release := make(chan struct{}), make(chan struct{})
	pub := &gatedPublisher{before: func(call int) {
		if call == 1 {
			close(publishing)
			<-release
		}
	}}
	h := start(t, s, pub, options{cfg: relay.Config{Workers: 1, BatchSize: 10}})
	<-publishing
	if n := h.relay.Destinations()[0].InFlight; n != 7 {
		t.Errorf("in flight while publishing = %d, want 7", n)
	}
	close(release)
	testwait.For(t, "every row delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	if n := h.relay.Destinations()[0].InFlight; n != 0 {
		t.Errorf("in flight after the publish = %d, want 0", n)
	}
	h.stop()
}
