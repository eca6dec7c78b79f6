package relay_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/fleet"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// endpoint is one destination that several replicas publish to: it
// counts the rows in flight across all of them, and each replica's
// attempts.
type endpoint struct {
	mu        sync.Mutex
	delay     time.Duration
	failing   bool
	inFlight  int
	most      int // the most rows in flight at once
	publishes int // publishes in flight now
	mostPubs  int // the most publishes in flight at once while failing
	attempts  map[string]int
	first     map[string]time.Time // each replica's first attempt
	delivered map[int64]bool
	// Rows in flight over time: their sum over the time from the first
	// publish to the last answer, in row-seconds.
	area           float64
	began, changed time.Time
}

func newEndpoint(delay time.Duration, failing bool) *endpoint {
	return &endpoint{delay: delay, failing: failing, attempts: map[string]int{}, first: map[string]time.Time{}, delivered: map[int64]bool{}}
}

func (e *endpoint) replica(name string) sink.Publisher { return endpointReplica{e, name} }

type endpointReplica struct {
	e    *endpoint
	name string
}

func (p endpointReplica) Publish(ctx context.Context, recs []sink.Record) []error {
	e := p.e
	e.mu.Lock()
	e.account()
	e.inFlight += len(recs)
	e.most = max(e.most, e.inFlight)
	e.publishes++
	failing := e.failing
	if failing {
		e.mostPubs = max(e.mostPubs, e.publishes)
	}
	e.attempts[p.name] += len(recs)
	if e.first[p.name].IsZero() {
		e.first[p.name] = time.Now()
	}
	delay := e.delay
	e.mu.Unlock()
	time.Sleep(delay) // the endpoint's round trip
	e.mu.Lock()
	defer e.mu.Unlock()
	e.account()
	e.inFlight -= len(recs)
	e.publishes--
	errs := make([]error, len(recs))
	for i, r := range recs {
		if failing {
			errs[i] = sink.Systemic(errors.New("connection refused"))
			continue
		}
		e.delivered[r.ID] = true
	}
	return errs
}

// account adds the rows in flight since the last change to the area.
func (e *endpoint) account() {
	now := time.Now()
	if e.began.IsZero() {
		e.began = now
	} else {
		e.area += float64(e.inFlight) * now.Sub(e.changed).Seconds()
	}
	e.changed = now
}

// averageInFlight is how many rows were in flight on average, from the
// first publish to the last answer.
func (e *endpoint) averageInFlight() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if span := e.changed.Sub(e.began).Seconds(); span > 0 {
		return e.area / span
	}
	return 0
}

func (e *endpoint) snapshot() (attempts map[string]int, delivered int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	attempts = map[string]int{}
	for k, v := range e.attempts {
		attempts[k] = v
	}
	return attempts, len(e.delivered)
}

// replicas starts n relays named r0, r1, … on s, sharing flow control
// through the coordination tables of coord, each publishing to e.
func startReplicas(t *testing.T, s, coord *pgtest.Schema, e *endpoint, names []string, dest relay.Destination, pause time.Duration) []*harness {
	t.Helper()
	store, err := fleet.New(coord.Pool, coord.Name)
	if err != nil {
		t.Fatal(err)
	}
	var hs []*harness
	for _, name := range names {
		d := dest
		d.Name, d.Publisher = "endpoint", e.replica(name)
		cfg := relay.Config{
			Destinations: []relay.Destination{d},
			Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "endpoint"}},
			Workers:      3, BatchSize: 10,
			Pause: relay.PauseConfig{Base: pause, Max: pause},
			Fleet: &relay.FleetConfig{Fleet: store, Replica: name, Interval: 20 * time.Millisecond, Lease: 2 * time.Second},
		}
		hs = append(hs, start(t, s, nil, options{cfg: cfg, claimer: name}))
	}
	return hs
}

func TestFleetSharesTheInFlightLimit(t *testing.T) {
	s := pgtest.NewSchema(t)
	e := newEndpoint(10*time.Millisecond, false)
	const limit = 4
	startReplicas(t, s, s, e, []string{"r0", "r1", "r2"}, relay.Destination{MaxInFlight: limit}, time.Second)
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || (g % 50), 'x' FROM generate_series(1, 600) g`)
	testwait.For(t, "every row delivered", func() bool { _, n := e.snapshot(); return n == 600 })
	attempts, _ := e.snapshot()
	if e.most > limit {
		t.Errorf("%d rows were in flight at once across the replicas; the fleet's limit is %d", e.most, limit)
	}
	for name, n := range attempts {
		if n == 0 {
			t.Errorf("replica %s delivered nothing: %v", name, attempts)
		}
	}
	t.Logf("most in flight %d of %d; rows per replica %v", e.most, limit, attempts)
}

// Replicas whose rows want no slots of a destination lend theirs to one
// whose rows do: every key here falls in one partition, so one replica
// claims every row, and its even split of the limit is 3 slots of 9. The
// others, which have no rows, lend all of theirs (their workers finding
// the bulkhead full is no demand); the fleet records the lend within a
// few syncs, and the busy replica uses the slots lent.
func TestFleetLendsIdleSlots(t *testing.T) {
	testwait.SkipShort(t)
	s := pgtest.NewSchema(t)
	e := newEndpoint(50*time.Millisecond, false)
	const limit = 9
	startReplicas(t, s, s, e, []string{"r0", "r1", "r2"}, relay.Destination{MaxInFlight: limit}, time.Second)
	partitionsSettled(t, s, 3)
	var busy string
	if err := s.Pool.QueryRow(context.Background(), `SELECT owner FROM outbox_claim_partitions WHERE part = 0`).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	insert(t, s, `INSERT INTO outbox (topic, key, payload)
		SELECT 't', k, 'x' FROM (SELECT 'k' || g AS k FROM generate_series(1, 100000) g) keys
		WHERE outbox_partition(k, 0) = 0 LIMIT 600`)
	testwait.For(t, "the idle replicas to lend their slots", func() bool {
		var lent bool
		if err := s.Pool.QueryRow(context.Background(), `SELECT coalesce(bool_and(CASE WHEN replica = $1 THEN slots >= 5 ELSE slots <= 1 END), false)
			FROM outbox_fleet_shares WHERE destination = 'endpoint'`, busy).Scan(&lent); err != nil {
			t.Fatal(err)
		}
		return lent
	})
	testwait.For(t, "every row delivered", func() bool { _, n := e.snapshot(); return n == 600 })
	attempts, _ := e.snapshot()
	t.Logf("on average %.2f rows in flight of %d, at most %d; rows per replica %v", e.averageInFlight(), limit, e.most, attempts)
	if e.most > limit {
		t.Errorf("%d rows were in flight at once; the fleet's limit is %d", e.most, limit)
	}
	if e.most < 7 {
		t.Errorf("at most %d rows in flight: %s did not use the slots the others lend", e.most, busy)
	}
}

// partitionsSettled waits until n replicas hold the outbox's partitions
// between them, every one held.
func partitionsSettled(t *testing.T, s *pgtest.Schema, n int) {
	t.Helper()
	testwait.For(t, "the replicas to share the partitions", func() bool {
		var owners, free int
		if err := s.Pool.QueryRow(context.Background(),
			`SELECT count(DISTINCT owner), count(*) FILTER (WHERE owner IS NULL) FROM outbox_claim_partitions`).Scan(&owners, &free); err != nil {
			t.Fatal(err)
		}
		return owners == n && free == 0
	})
}

func TestFleetSharesTheBreaker(t *testing.T) {
	s := pgtest.NewSchema(t)
	e := newEndpoint(5*time.Millisecond, true)
	const pause = 500 * time.Millisecond
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'x' FROM generate_series(1, 100) g`)

	// r0 alone finds the endpoint down and opens the fleet's breaker.
	first := startReplicas(t, s, s, e, []string{"r0"}, relay.Destination{}, pause)[0]
	first.breakerBecomes("endpoint", relay.BreakerOpen)
	var until time.Time
	testwait.For(t, "the fleet's breaker to open", func() bool {
		return s.Pool.QueryRow(context.Background(), "SELECT open_until FROM outbox_fleet_breakers WHERE destination = 'endpoint' AND state = 'open'").Scan(&until) == nil
	})

	// Replicas that start now send nothing until the cool-down ends: their
	// first sync, before any claim, finds the breaker open.
	rest := startReplicas(t, s, s, e, []string{"r1", "r2"}, relay.Destination{}, pause)
	for _, h := range rest {
		h.breakerBecomes("endpoint", relay.BreakerOpen)
	}
	rest[0].signals.BreakerChanged.WaitFor(t, "the cool-down to end", func(c relay.BreakerChange) bool { return c.To == relay.BreakerHalfOpen })
	e.mu.Lock()
	e.mostPubs = 0 // r0's publishes before it opened the breaker
	e.mu.Unlock()

	// Probes fail for a while: never more than one at a time, from
	// whichever replica holds the probe.
	total := func() int {
		attempts, _ := e.snapshot()
		var n int
		for _, v := range attempts {
			n += v
		}
		return n
	}
	before := total()
	testwait.For(t, "a few probes", func() bool { return total() >= before+2*8 })
	e.mu.Lock()
	most := e.mostPubs
	firsts := maps.Clone(e.first)
	e.failing = false
	e.mu.Unlock()
	if most > 1 {
		t.Errorf("%d probes ran at once across the fleet; want one", most)
	}
	for _, name := range []string{"r1", "r2"} {
		if at := firsts[name]; !at.IsZero() && at.Before(until) {
			t.Errorf("replica %s, started while the fleet's breaker was open, sent a row %s before the cool-down ended", name, until.Sub(at))
		}
	}
	testwait.For(t, "every row delivered after the endpoint recovers", func() bool { _, n := e.snapshot(); return n == 100 })
	for i, h := range append(rest, first) {
		testwait.For(t, fmt.Sprintf("replica %d's breaker to close", i), func() bool { return h.breaker("endpoint") == relay.BreakerClosed })
	}
}

func TestFleetOutOfReachFallsBackToPerProcess(t *testing.T) {
	s := pgtest.NewSchema(t)
	srv := pgtest.NewServer(t)
	coord := pgtest.NewSchemaIn(t, srv.DSN("postgres"))
	e := newEndpoint(time.Millisecond, false)
	hs := startReplicas(t, s, coord, e, []string{"r0", "r1"}, relay.Destination{MaxInFlight: 4}, time.Second)
	up := func(want bool) func() bool {
		return func() bool {
			for _, h := range hs {
				if st, ok := h.relay.Fleet(); !ok || st.Up != want {
					return false
				}
			}
			return true
		}
	}
	testwait.For(t, "both replicas to share flow control and see each other", func() bool {
		for _, h := range hs {
			if st, _ := h.relay.Fleet(); !st.Up || st.Replicas != 2 {
				return false
			}
		}
		return true
	})

	// The coordination database stops answering: past the lease, each
	// replica has its own flow control, and rows keep going.
	if err := srv.Halt(context.Background()); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "both replicas to fall back to per-process flow control", up(false))
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || (g % 10), 'x' FROM generate_series(1, 200) g`)
	testwait.For(t, "rows delivered without the fleet", func() bool { _, n := e.snapshot(); return n == 200 })

	if err := srv.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "both replicas to share flow control again", up(true))
}

// countingFleet counts a fleet's syncs.
type countingFleet struct {
	relay.Fleet
	syncs atomic.Int64
}

func (c *countingFleet) Sync(ctx context.Context, req relay.FleetSync) (relay.FleetView, error) {
	v, err := c.Fleet.Sync(ctx, req)
	c.syncs.Add(1)
	return v, err
}

// waitingPublisher holds each batch until the fleet has synced three more
// times, and says whether it did.
type waitingPublisher struct {
	fleet  *countingFleet
	synced chan bool
}

func (p waitingPublisher) Publish(ctx context.Context, recs []sink.Record) []error {
	from := p.fleet.syncs.Load()
	ok, _ := testwait.Poll(30*time.Second, func() (bool, string) { return p.fleet.syncs.Load() >= from+3, "" })
	p.synced <- ok
	return make([]error, len(recs))
}

// A replica with nothing in flight and its breakers closed syncs with the
// fleet at a quarter of its lease, here 15 minutes; the rows it claims
// end the rest at once, and it syncs every interval while they are in
// flight, then rests again.
func TestFleetRestsWhileQuiet(t *testing.T) {
	s := pgtest.NewSchema(t)
	store, err := fleet.New(s.Pool, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	cf := &countingFleet{Fleet: store}
	pub := waitingPublisher{fleet: cf, synced: make(chan bool, 10)}
	h := start(t, s, pub, options{cfg: relay.Config{
		Fleet: &relay.FleetConfig{Fleet: cf, Replica: "r0", Interval: 10 * time.Millisecond, Lease: time.Hour},
	}})
	testwait.For(t, "the quiet replica to rest", h.relay.FleetResting)
	insert(t, s, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', 'x')`)
	select {
	case ok := <-pub.synced:
		if !ok {
			t.Fatal("the replica did not sync every interval while a batch was in flight")
		}
	case <-time.After(time.Minute):
		t.Fatal("no batch published")
	}
	testwait.For(t, "the row delivered", func() bool { return count(t, s.Pool, "status = 'pending'") == 0 })
	testwait.For(t, "the replica to rest again", h.relay.FleetResting)
}

// A steady trickle leaves nothing in flight between its batches; the
// replica must not take each gap for quiet and sync on every batch: it
// rests only once no batch has come for a few intervals.
func TestFleetDoesNotRestBetweenBatches(t *testing.T) {
	s := pgtest.NewSchema(t)
	store, err := fleet.New(s.Pool, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	cf := &countingFleet{Fleet: store}
	h := start(t, s, &fakePublisher{}, options{cfg: relay.Config{
		Fleet: &relay.FleetConfig{Fleet: cf, Replica: "r0", Interval: time.Hour, Lease: 4 * time.Hour},
	}})
	testwait.For(t, "the quiet replica to rest", h.relay.FleetResting)
	before := cf.syncs.Load()
	for i := range 10 {
		insert(t, s, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', 'x')`)
		testwait.For(t, fmt.Sprintf("row %d delivered", i+1), func() bool { return count(t, s.Pool, "status = 'pending'") == 0 })
	}
	// The first batch ends the rest; the others find the replica awake,
	// its next sync an interval (an hour) away.
	if n := cf.syncs.Load() - before; n > 2 {
		t.Errorf("%d syncs for 10 batches one after another, want 1 (2 at most)", n)
	}
}
