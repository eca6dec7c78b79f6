package relay_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// settled records what the relay reports of each row: the lag of delivered
// rows by destination, and every deferral's reason.
type settled struct {
	mu       sync.Mutex
	lags     map[string][]time.Duration
	commits  map[string][]time.Time // when each delivered row was committed, beside lags
	deferred map[string]int
}

func (o *settled) Claimed(time.Duration, int) {}

func (o *settled) Settled(destination string, kind store.OutcomeKind, reason string, lag time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch kind {
	case store.Sent:
		if o.lags == nil {
			o.lags, o.commits = map[string][]time.Duration{}, map[string][]time.Time{}
		}
		o.lags[destination] = append(o.lags[destination], lag)
		o.commits[destination] = append(o.commits[destination], time.Now().Add(-lag))
	case store.Deferred:
		if o.deferred == nil {
			o.deferred = map[string]int{}
		}
		o.deferred[reason]++
	}
}

// p99 returns the 99th percentile lag of destination's delivered rows and
// how many there were.
func (o *settled) p99(destination string) (time.Duration, int) {
	return o.p99Between(destination, time.Time{}, time.Now().Add(time.Hour))
}

// p99Between is p99 for the rows committed from from to to.
func (o *settled) p99Between(destination string, from, to time.Time) (time.Duration, int) {
	o.mu.Lock()
	var lags []time.Duration
	for i, at := range o.commits[destination] {
		if !at.Before(from) && at.Before(to) {
			lags = append(lags, o.lags[destination][i])
		}
	}
	o.mu.Unlock()
	if len(lags) == 0 {
		return 0, 0
	}
	slices.Sort(lags)
	return lags[(len(lags)*99+99)/100-1], len(lags)
}

// checkHealthy checks that destination delivered rows with a p99 commit
// to ack under a second, and that its breaker deferred none, and returns
// how many it delivered.
func (o *settled) checkHealthy(t *testing.T, destination string) int {
	t.Helper()
	p99, n := o.p99(destination)
	if n == 0 || p99 >= time.Second {
		t.Errorf("healthy rows: p99 commit to ack %s over %d rows, want under 1s", p99, n)
	}
	t.Logf("healthy rows: p99 commit to ack %s over %d rows", p99, n)
	if d := o.deferrals(relay.DeferCircuitOpen) + o.deferrals(relay.DeferDestinationFailing); d != 0 {
		t.Errorf("%d rows deferred by the breaker of %s; failures of a topic or of rows must not pause it", d, destination)
	}
	return n
}

func (o *settled) deferrals(reason string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.deferred[reason]
}

// produce commits one transaction every few milliseconds for d: tx(n)
// returns the statement of the n-th. Commits are paced, as applications
// make them; the relay is not waited for.
func produce(t *testing.T, s *pgtest.Schema, d time.Duration, tx func(n int) string, each func()) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(d)
	for n := 0; time.Now().Before(end); n++ {
		<-tick.C
		insert(t, s, tx(n))
		if each != nil {
			each()
		}
	}
}

// pausedTopic reports whether destination dest has topic (partition -1) or
// one of its partitions paused.
func pausedTopic(r *relay.Relay, dest, topic string, partition int) bool {
	for _, d := range r.Destinations() {
		if d.Name != dest {
			continue
		}
		for _, p := range d.Paused {
			if p.Topic == topic && p.Partition == partition {
				return true
			}
		}
	}
	return false
}

// A topic the cluster does not have fails its rows on every attempt. It
// pauses alone: the healthy topics of the same cluster keep their latency,
// the destination's breaker stays closed, and the missing topic's rows,
// whose probes fail, count no attempt for them: they end as dead letters
// at retry.max_age.
func TestMissingTopicDoesNotStallItsCluster(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	s := pgtest.NewSchema(t)
	c := kafkatest.NewCluster(t, []string{"orders", "payments"})
	obs := &settled{}
	h := start(t, s, nil, options{
		policy: retry.PolicyConfig{MaxAttempts: 4, MaxAge: 2 * time.Second, BaseDelay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond},
		cfg: relay.Config{
			Destinations: []relay.Destination{{Name: "kafka", Publisher: newKafka(t, c)}},
			Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "kafka"}},
			Observer:     obs,
			Pause:        relay.PauseConfig{Base: 50 * time.Millisecond, Max: 400 * time.Millisecond},
		},
	})
	var sawPause atomic.Bool
	produce(t, s, 3*time.Second, func(n int) string {
		q := fmt.Sprintf(`INSERT INTO outbox (topic, key, payload) VALUES
    ('orders', 'o-%d', 'order'), ('payments', 'p-%d', 'payment')`, n%50, n%50)
		if n%10 == 0 { // one transaction in ten carries a typo
			q += `, ('orders-typo', NULL, 'a'), ('orders-typo', NULL, 'b'), ('orders-typo', NULL, 'c')`
		}
		return q
	}, func() {
		if !sawPause.Load() && pausedTopic(h.relay, "kafka", "orders-typo", -1) {
			sawPause.Store(true)
		}
	})
	testwait.For(t, "the healthy rows delivered and the missing topic's dead-lettered", func() bool {
		return count(t, s.Pool, "status = 'pending'") == 0
	})
	h.stop()
	typos := count(t, s.Pool, "topic = 'orders-typo'")
	if n := count(t, s.Pool, `topic = 'orders-typo' AND status = 'dead_lettered' AND dead_letter_reason = 'max_age_exceeded'
AND retry_count < 4 AND last_error LIKE '%Unknown Topic Or Partition%'`); n != typos || n == 0 {
		t.Errorf("%d of %d missing-topic rows dead-lettered max_age_exceeded before their 4 attempts", n, typos)
	}
	if n := count(t, s.Pool, "topic <> 'orders-typo'"); n != 0 {
		t.Errorf("%d healthy rows left in the table, want all delivered and deleted", n)
	}
	n := obs.checkHealthy(t, "kafka")
	if !sawPause.Load() {
		t.Error("the missing topic was never reported paused")
	}
	if pausedTopic(h.relay, "kafka", "orders-typo", -1) {
		// Nothing probes it once its rows are gone; it is forgotten after
		// the longest cool-down, or stays half-open till then.
		for _, d := range h.relay.Destinations() {
			for _, p := range d.Paused {
				if p.State == relay.BreakerOpen && time.Until(p.OpenUntil) > time.Second {
					t.Errorf("pause %+v outlasts the longest cool-down", p)
				}
			}
		}
	}
	var got []kafkatest.Record
	for _, topic := range []string{"orders", "payments"} {
		got = append(got, kafkatest.ConsumeAll(context.Background(), t, c, topic)...)
	}
	if len(got) != n {
		t.Errorf("kafka holds %d healthy messages, the relay delivered %d", len(got), n)
	}
}

// An endpoint that answers 500 to one payload shape and 2xx to the rest:
// the failing rows follow the retry policy, every other row keeps its
// latency, and the breaker stays closed.
func TestEndpointFailingOneShapeKeepsDelivering(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"type":"refund"`) {
			http.Error(w, "refunds are not supported yet", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	obs := &settled{}
	h := start(t, s, nil, options{
		policy: retry.PolicyConfig{MaxAttempts: 4, BaseDelay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond},
		cfg: relay.Config{
			Destinations: []relay.Destination{hookDestination(t, "hooks", srv.URL)},
			Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "hooks"}},
			Observer:     obs,
			Pause:        relay.PauseConfig{Base: 50 * time.Millisecond, Max: 400 * time.Millisecond},
		},
	})
	produce(t, s, 3*time.Second, func(n int) string {
		q := fmt.Sprintf(`INSERT INTO outbox (topic, key, payload) VALUES
    ('orders', 'o-%d', '{"type":"order"}'), ('payments', 'p-%d', '{"type":"payment"}')`, n%50, n%50)
		if n%10 == 0 {
			q += `, ('payments', NULL, '{"type":"refund"}')`
		}
		return q
	}, nil)
	testwait.For(t, "the healthy rows delivered and the refunds dead-lettered", func() bool {
		return count(t, s.Pool, "status = 'pending'") == 0
	})
	h.stop()
	refunds := count(t, s.Pool, `payload = '{"type":"refund"}'`)
	if n := count(t, s.Pool, `payload = '{"type":"refund"}' AND status = 'dead_lettered' AND dead_letter_reason = 'retries_exhausted'
AND retry_count = 4 AND last_error LIKE '%500 Internal Server Error%refunds are not supported%'`); n != refunds || n == 0 {
		t.Errorf("%d of %d refunds dead-lettered retries_exhausted after 4 attempts", n, refunds)
	}
	if n := count(t, s.Pool, `payload <> '{"type":"refund"}'`); n != 0 {
		t.Errorf("%d healthy rows left in the table", n)
	}
	obs.checkHealthy(t, "hooks")
}

// An endpoint that fails every row it is given is failing as a whole: once
// enough distinct rows have failed for long enough with no success, or a
// row has failed a third time beside others (here: the first batch of
// ten, retried at once), its breaker opens, and the rest wait without
// counting attempts.
func TestEndpointFailingEveryRowOpensTheBreaker(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	p := &fakePublisher{fail: func(sink.Record, int) error { return errors.New("500 Internal Server Error") }}
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 't', 'x' FROM generate_series(1, 300)`)
	h := start(t, s, nil, options{
		policy: retry.PolicyConfig{MaxAttempts: 1000, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond},
		cfg: relay.Config{
			Destinations: []relay.Destination{{Name: "hooks", Publisher: p,
				Breaker: relay.BreakerConfig{FailingRows: 20, FailingFor: 100 * time.Millisecond}}},
			Routes:    []relay.Route{{Topics: []string{"*"}, Destination: "hooks"}},
			BatchSize: 10, Pause: relay.PauseConfig{Base: time.Hour, Max: time.Hour},
			// One worker: a second may have a call under way when the
			// breaker opens, which it cannot take back.
			Workers: 1,
		},
	})
	h.breakerBecomes("hooks", relay.BreakerOpen)
	// The batch whose failures opened the breaker is written back after
	// it opened: its rows were attempted before, and count.
	atOpen := count(t, s.Pool, "retry_count > 0")
	moreClaims := func() {
		claims := h.relay.Stats().Claims
		testwait.For(t, "more claims while the breaker is open", func() bool { return h.relay.Stats().Claims > claims+5 })
	}
	moreClaims()
	attempts := count(t, s.Pool, "retry_count > 0")
	moreClaims()
	h.stop()
	if n := count(t, s.Pool, "retry_count > 0"); n < 10 || n != attempts || n > atOpen+10 {
		t.Fatalf("%d rows attempted, %d when the breaker opened, %d after its batch; want at least a batch, at most one batch more, and none after",
			n, atOpen, attempts)
	}
	if n := count(t, s.Pool, "retry_count > 3"); n != 0 {
		t.Fatalf("%d rows counted more than three attempts before the breaker opened", n)
	}
	if n := count(t, s.Pool, "true"); n != 300 {
		t.Fatalf("%d rows left, want all 300", n)
	}
}

// poisoned fails every row while down (the destination is unreachable);
// otherwise it fails the rows whose payload is "poison" on their own. It
// counts the probes (publishes while the breaker is half-open) in which
// no row went through.
type poisoned struct {
	fakePublisher
	down         atomic.Bool
	breaker      atomic.Pointer[func() relay.BreakerState]
	failedProbes atomic.Int32
}

var errUnreachable = sink.Systemic(errors.New("dial tcp: connection refused"))

func (p *poisoned) Publish(ctx context.Context, recs []sink.Record) []error {
	if p.down.Load() {
		errs := make([]error, len(recs))
		for i := range errs {
			errs[i] = errUnreachable
		}
		return errs
	}
	probe := false
	if state := p.breaker.Load(); state != nil {
		probe = (*state)() == relay.BreakerHalfOpen
	}
	errs := p.fakePublisher.Publish(ctx, recs)
	if probe && !slices.Contains(errs, nil) {
		p.failedProbes.Add(1)
	}
	return errs
}

// After an outage, the oldest ready rows of a destination may be rows that
// fail on their own. The half-open probe must still find the destination
// healthy: it takes rows of several keys, first attempts before retries,
// and rows failing on their own do not fail it.
func TestProbeIsNotPoisonedByFailingRows(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	p := &poisoned{fakePublisher: fakePublisher{fail: func(r sink.Record, _ int) error {
		if string(r.Payload) == "poison" {
			return errors.New("500 Internal Server Error")
		}
		return nil
	}}}
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 't', 'poison' FROM generate_series(1, 40)`)
	h := start(t, s, nil, options{
		keepSent: true,
		policy:   retry.PolicyConfig{MaxAttempts: 1 << 20, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		cfg: relay.Config{
			// One worker, whose claims hold the poison rows and the healthy
			// ones together: the probe is made of one worker's batch, and
			// with two, the one that takes it may hold only poison rows
			// while the other holds the healthy ones.
			Workers: 1,
			// Only the probe is under test: rows failing on their own
			// never open this breaker.
			Destinations: []relay.Destination{{Name: "hooks", Publisher: p, Breaker: relay.BreakerConfig{FailingRows: 1 << 20}}},
			Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "hooks"}},
			Pause:        relay.PauseConfig{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		},
	})
	state := func() relay.BreakerState { return h.breaker("hooks") }
	p.breaker.Store(&state)
	testwait.For(t, "every poison row attempted", func() bool { return count(t, s.Pool, "retry_count = 0") == 0 })
	p.down.Store(true)
	h.breakerBecomes("hooks", relay.BreakerOpen)
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'ok' FROM generate_series(1, 100) g`)
	// A long outage: every poison row's backoff is over, and they are the
	// oldest ready rows.
	insert(t, s, `UPDATE outbox SET next_attempt_at = now() - interval '1 minute' WHERE payload = 'poison'`)
	p.down.Store(false)
	testwait.For(t, "the healthy rows delivered after the outage", func() bool {
		return count(t, s.Pool, "payload = 'ok' AND status = 'sent'") == 100
	})
	if b := h.breaker("hooks"); b != relay.BreakerClosed {
		t.Fatalf("breaker %s after the healthy rows went through, want closed", b)
	}
	if n := p.failedProbes.Load(); n > 1 {
		t.Fatalf("%d probes after the outage failed without a success: rows failing on their own poisoned them", n)
	}
	if n := count(t, s.Pool, "payload = 'ok' AND retry_count > 0"); n != 0 {
		t.Fatalf("%d healthy rows counted attempts", n)
	}
}

// topicDenied fails the rows of topic "secret" as a topic authorization
// failure while denied.
type topicDenied struct {
	fakePublisher
	denied atomic.Bool
	calls  atomic.Int32 // publishes carrying a secret row while denied
}

func (p *topicDenied) Publish(ctx context.Context, recs []sink.Record) []error {
	if !p.denied.Load() {
		return p.fakePublisher.Publish(ctx, recs)
	}
	errs := p.fakePublisher.Publish(ctx, recs)
	carried := false
	for i, r := range recs {
		if r.Topic == "secret" && !errors.Is(errs[i], sink.ErrNotSent) {
			errs[i] = sink.TopicFailure(sink.ClassSystemic, errors.New("kafka: [29] Topic Authorization Failed"))
			carried = true
		}
	}
	if carried {
		p.calls.Add(1)
	}
	return errs
}

// A topic the relay may not write to pauses alone and counts no attempts:
// an outage of permissions, not of the messages. The rest of the
// destination flows, and the topic resumes once the permission is back.
func TestTopicAuthorizationPausesTheTopicOnly(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	p := &topicDenied{}
	p.denied.Store(true)
	h := start(t, s, nil, options{keepSent: true, cfg: relay.Config{
		Destinations: []relay.Destination{{Name: "kafka", Publisher: p}},
		Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "kafka"}},
		Pause:        relay.PauseConfig{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond},
	}})
	insert(t, s, `INSERT INTO outbox (topic, key, payload)
SELECT CASE WHEN g % 4 = 0 THEN 'secret' ELSE 'public' END, 'k' || (g % 10), 'x' FROM generate_series(1, 400) g`)
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 'public', 'unkeyed' FROM generate_series(1, 200)`)
	testwait.For(t, "the other topic's unkeyed rows delivered", func() bool {
		return count(t, s.Pool, "key IS NULL AND status = 'pending'") == 0
	})
	testwait.For(t, "the topic reported paused", func() bool { return pausedTopic(h.relay, "kafka", "secret", -1) })
	if n := count(t, s.Pool, "retry_count > 0 OR status = 'dead_lettered'"); n != 0 {
		t.Fatalf("%d rows burned attempts while their topic was not authorized", n)
	}
	if b := h.breaker("kafka"); b != relay.BreakerClosed {
		t.Fatalf("destination breaker %s; a topic's authorization must not pause the destination", b)
	}
	testwait.For(t, "a row of the paused topic recording why", func() bool {
		return count(t, s.Pool, "topic = 'secret' AND last_error LIKE '%Topic Authorization Failed%'") > 0
	})
	p.denied.Store(false)
	testwait.For(t, "every row delivered once the permission is back", func() bool {
		return count(t, s.Pool, "status <> 'sent'") == 0
	})
	testwait.For(t, "the pause forgotten", func() bool { return !pausedTopic(h.relay, "kafka", "secret", -1) })
	h.stop()
	checkKeyOrder(t, p.published(), keysOf(t, s))
	if n := count(t, s.Pool, "retry_count > 0"); n != 0 {
		t.Fatalf("%d rows counted attempts", n)
	}
	// Paused, the topic was probed now and then, not on every batch.
	if calls := p.calls.Load(); calls > 40 {
		t.Errorf("%d publishes carried rows of the paused topic", calls)
	}
}

// A partition without a leader pauses alone: the keys of the other
// partitions keep flowing, its own rows count no attempts, and they go
// once it has a leader again.
func TestPartitionWithoutLeaderPausesAlone(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	c := kafkatest.NewCluster(t, []string{"events"}, kfake.DefaultNumPartitions(3))
	fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "events", Partitions: []int32{1},
		Err: kerr.NotLeaderForPartition, Count: -1})
	k := newKafka(t, c)
	h := start(t, s, nil, options{keepSent: true, cfg: relay.Config{
		Destinations: []relay.Destination{{Name: "kafka", Publisher: k}},
		Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "kafka"}},
		Pause:        relay.PauseConfig{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond},
	}})
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 'events', 'k' || (g % 30), 'x' FROM generate_series(1, 600) g`)
	// The keys of partition 1, once the sink knows the partitions.
	blocked := map[string]bool{}
	testwait.For(t, "the partition paused and the other partitions' rows delivered", func() bool {
		if !pausedTopic(h.relay, "kafka", "events", 1) {
			return false
		}
		for i := range 30 {
			key := fmt.Sprintf("k%d", i)
			if part, ok := k.Partition(sink.Record{Topic: "events", Key: key, HasKey: true}); ok && part == 1 {
				blocked[key] = true
			}
		}
		for i := range 30 {
			key := fmt.Sprintf("k%d", i)
			if !blocked[key] && count(t, s.Pool, "key = $1 AND status = 'pending'", key) > 0 {
				return false
			}
		}
		return true
	})
	if len(blocked) == 0 || len(blocked) == 30 {
		t.Fatalf("%d of 30 keys map to partition 1; the partitions were not known", len(blocked))
	}
	if n := count(t, s.Pool, "retry_count > 0 OR status = 'dead_lettered'"); n != 0 {
		t.Fatalf("%d rows burned attempts while their partition had no leader", n)
	}
	if b := h.breaker("kafka"); b != relay.BreakerClosed {
		t.Fatalf("destination breaker %s; one partition must not pause the cluster", b)
	}
	// New rows for the paused partition wait for its probes rather than
	// going to the broker with every batch.
	hits := fault.Hits()
	began := time.Now()
	produce(t, s, time.Second, func(n int) string {
		return fmt.Sprintf(`INSERT INTO outbox (topic, key, payload) VALUES ('events', 'k%d', 'y')`, n%30)
	}, nil)
	// A probe at most every pause_base (20ms).
	if sent, most := fault.Hits()-hits, int(time.Since(began)/(20*time.Millisecond))+2; sent > most {
		t.Errorf("%d requests to the paused partition in %s, want at most %d (its probes)", sent, time.Since(began), most)
	}
	fault.Remove()
	testwait.For(t, "every row delivered once the partition has a leader", func() bool {
		return count(t, s.Pool, "status <> 'sent'") == 0
	})
	h.stop()
	recs := kafkatest.ConsumeAll(context.Background(), t, c, "events")
	last := map[string]int64{}
	for _, r := range recs {
		id, err := strconv.ParseInt(r.Headers["outbox-id"], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if id < last[string(r.Key)] {
			t.Fatalf("key %s: id %d delivered after %d", r.Key, id, last[string(r.Key)])
		}
		last[string(r.Key)] = id
	}
	if want := count(t, s.Pool, "true"); len(recs) < want {
		t.Fatalf("kafka holds %d messages, want %d", len(recs), want)
	}
}

// Failed authentication is an outage of the whole cluster: the breaker
// opens and the rows wait without counting attempts, while a failing topic
// or row would not open it.
func TestSASLFailureOpensTheBreaker(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	c := kafkatest.NewCluster(t, []string{"orders"}, kfake.EnableSASL(), kfake.Superuser("PLAIN", "relay", "s3cret"))
	k, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs(), DialTimeout: time.Second,
		SASL: plain.Mechanism{Username: "relay", Password: "wrong"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 'orders', 'k' || (g % 10), 'x' FROM generate_series(1, 100) g`)
	h := start(t, s, nil, options{policy: retry.PolicyConfig{MaxAttempts: 2}, cfg: relay.Config{
		Destinations: []relay.Destination{{Name: "kafka", Publisher: k}},
		Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "kafka"}},
	}})
	h.breakerBecomes("kafka", relay.BreakerOpen)
	testwait.For(t, "the failure recorded", func() bool {
		return count(t, s.Pool, "last_error LIKE '%authentication failed%'") > 0
	})
	h.stop()
	if n := count(t, s.Pool, "retry_count > 0 OR status <> 'pending'"); n != 0 {
		t.Fatalf("%d rows counted attempts or left pending while the relay could not authenticate", n)
	}
}
