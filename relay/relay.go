// Package relay delivers outbox rows: it claims ready rows in batches,
// publishes them through each destination's sink.Publisher, and writes
// each outcome back, under the delivery contract: at least once, in id
// order per key, retrying transient failures, deferring rows while a
// destination is down, and dead-lettering what cannot be delivered.
package relay

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/internal/testsignal"
	"github.com/outbox-relay/outbox-relay/relay/flow"
)

// Dead-letter policies of a destination.
const (
	// OnDeadLetterRelease lets a key's later rows go on after one of its
	// rows is dead-lettered; OnDeadLetterBlock parks the key.
	OnDeadLetterRelease = flow.OnDeadLetterRelease
	OnDeadLetterBlock   = flow.OnDeadLetterBlock
)

// Order scopes: the rows of one key that keep their order among
// themselves.
const (
	// OrderScopeDestination delivers a key's rows in id order within each
	// destination, independently across destinations: one destination's
	// outage, backoff or parked key never holds back another's rows.
	OrderScopeDestination = "destination"
	// OrderScopeTopic delivers a key's rows in id order within each
	// destination and topic (the topic the destination receives, after
	// routing).
	OrderScopeTopic = "topic"
	// OrderScopeGlobal delivers a key's rows in id order across every
	// topic and destination: a row waits for every earlier row of its key,
	// wherever that one goes.
	OrderScopeGlobal = "global"
)

// ValidateOrderScope checks an order scope's name.
func ValidateOrderScope(scope string) error {
	switch scope {
	case "", OrderScopeDestination, OrderScopeTopic, OrderScopeGlobal:
		return nil
	}
	return fmt.Errorf("order_scope is %q; use destination, topic or global", scope)
}

// Relay delivers outbox rows until its context ends. Its workers claim
// batches and carry each through the planner (routing, key runs, the
// destinations' admission), the publishers and the destinations'
// settlement, then complete the claim; leased deliveries, the cleaner and
// the wake-up listener run beside them.
type Relay struct {
	cfg       Config
	log       *slog.Logger
	dests     []*flow.Dest
	planner   *planner
	sources   []*source // one per outbox
	turns     *turns
	fleet     *flow.Replica // nil: flow control per process
	fleetSync *service      // runs the fleet's syncs
	pinging   *service      // pings the destinations whose breakers are open
	epoch     time.Time     // a monotonic origin for the workers' busySince
	// unleased is whether a live replica claims without leasing
	// partitions, as the fleet last said.
	unleased atomic.Bool
	// breakerChanged, cleaned and leaseWritten tell tests of the
	// destinations' breakers, the cleaners' deletes and the leased
	// write-backs.
	breakerChanged testsignal.Signal[BreakerChange]
	cleaned        testsignal.Signal[cleanedBatch]
	leaseWritten   testsignal.Signal[int]
}

// New returns a Relay for cfg.
func New(cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.assemble(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, log: cfg.Logger, epoch: time.Now()}
	for _, d := range cfg.Destinations {
		r.dests = append(r.dests, flow.NewDest(d, r.cfg.destSettings(&r.breakerChanged)))
	}
	r.planner = newPlanner(&r.cfg, r.dests)
	for i, o := range r.cfg.Outboxes {
		r.sources = append(r.sources, newSource(r, i, o))
	}
	r.turns = newTurns(cfg.Workers, len(r.sources))
	r.pinging = newService("pinger", r.pingDown)
	wakeWorkers := func() {
		for _, s := range r.sources {
			s.wakeAll()
		}
	}
	for _, d := range r.dests {
		d.Freed = wakeWorkers
		d.OnRelease(func() {
			for _, s := range r.sources {
				s.releaseSoon()
			}
		})
	}
	if cfg.Fleet != nil {
		r.fleet = flow.NewReplica(*cfg.Fleet, r.dests, r.cfg.QueryTimeout, r.log)
		r.fleetSync = newService("fleet sync", r.fleet.Run)
		r.fleet.WakeWorkers = wakeWorkers
		r.fleet.Quiet = r.quiet
		r.fleet.Unleased = func(present bool) {
			if r.unleased.Swap(present) != present {
				if present {
					r.log.Warn("a replica of an older relay claims rows without leasing partitions: key checks read from the lowest pending row until it is gone")
				} else {
					r.log.Info("every replica leases its partitions: claims read from their floors")
				}
			}
			for _, s := range r.sources {
				s.store.SetForeignClaimers(present)
			}
		}
	}
	return r, nil
}

// Stats returns what the relay has done so far, in all outboxes.
func (r *Relay) Stats() Stats {
	var sum Stats
	for _, s := range r.sources {
		sum.add(s.tally.stats())
	}
	return sum
}

// Run delivers rows until ctx ends, then stops claiming and lets in-flight
// batches finish for up to DrainTimeout before abandoning them (their rows
// stay pending and are delivered again later). It returns nil after a
// clean stop.
func (r *Relay) Run(ctx context.Context) error {
	// A failing service stops the relay, and so does an outbox that
	// cannot be prepared.
	ctx, fails := withFailures(ctx)
	defer fails.stop()
	g, ctx := errgroup.WithContext(ctx)
	// inflight outlives ctx by the drain timeout: publishes use it.
	inflight, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	stopDrain := context.AfterFunc(ctx, func() {
		t := time.NewTimer(r.cfg.DrainTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			abandon()
		case <-inflight.Done():
		}
	})
	defer stopDrain()

	if r.fleet != nil {
		// The first sync comes before any claim: a replica that starts
		// while a destination's breaker is open elsewhere sends it nothing.
		r.fleet.Sync(ctx)
		r.fleetSync.start(ctx, fails)
	}
	for _, s := range r.sources {
		s.run(g, ctx, inflight, fails)
	}
	r.pinging.start(ctx, fails)
	r.log.Info("relay started", slog.Int("outboxes", len(r.sources)), slog.Int("workers", r.cfg.Workers), slog.Int("batch_size", r.cfg.BatchSize))
	err := g.Wait()
	r.pinging.stop()
	for _, s := range r.sources {
		s.stop(ctx)
	}
	if r.fleet != nil {
		r.fleetSync.stop()
		r.fleet.Leave(ctx)
	}
	r.log.Info("relay stopped", slog.Int64("delivered", r.Stats().Delivered))
	return cmp.Or(err, fails.first())
}

// writeBackContext bounds a write-back by timeout, detached from ctx: a publish that
// happened is acknowledged even while the relay stops. It starts after the
// publish, so a long publish timeout cannot eat into it.
func writeBackContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), timeout)
}

// closedTopics returns the known topics whose rows no destination takes
// now (its breaker open or probing, its bulkhead full, or the topic
// paused), and how long the earliest of them stays so: the claim leaves
// them out. A destination whose bulkhead alone is full stays open to one
// claim at a time, whose batch waits for a slot: waits records those
// (nil: the claim cannot wait). room is how many rows the destinations
// open to the claim can take: their free slots, and the whole share of
// those it waits on; -1 when one has no in-flight limit. A claim need not
// take more: the rest would only be given back.
func (r *Relay) closedTopics(now time.Time, waits *flow.SlotWaits) (topics []string, left time.Duration, room int) {
	var wait func(*flow.Dest) bool
	if waits != nil {
		wait = waits.Take
	}
	open := 0
	addRoom := func(d *flow.Dest) {
		open++
		if room < 0 {
			return
		}
		free, limit, ok := d.Room()
		switch {
		case !ok:
			room = -1
		case waits.Holds(d):
			room += limit
		default:
			room += free
		}
	}
	var closed map[int]bool
	var paused map[int]map[string]bool
	var soonest time.Duration
	shut := func(left time.Duration) {
		if soonest == 0 || left < soonest {
			soonest = left
		}
	}
	for i, d := range r.dests {
		blocked, until, topics, left := d.Closed(now, wait)
		if blocked {
			if closed == nil {
				closed = map[int]bool{}
			}
			closed[i] = true
			shut(until.Sub(now))
			continue
		}
		addRoom(d)
		if len(topics) == 0 {
			continue
		}
		if paused == nil {
			paused = map[int]map[string]bool{}
		}
		paused[i] = map[string]bool{}
		for _, t := range topics {
			paused[i][t] = true
		}
		shut(left)
	}
	if open == 0 {
		room = -1 // nothing to size the claim by
	}
	if closed == nil && paused == nil {
		return nil, 0, room
	}
	return r.planner.router.topicsOf(func(rt routing) bool { return closed[rt.dest] || paused[rt.dest][rt.topic] }), soonest, room
}

// nextReopen is when the earliest open breaker lets a probe through, or
// zero.
func (r *Relay) nextReopen() time.Time {
	var soonest time.Time
	for _, d := range r.dests {
		if state, until := d.BreakerState(); state == BreakerOpen && (soonest.IsZero() || until.Before(soonest)) {
			soonest = until
		}
	}
	return soonest
}

// WedgedAfter is how long a worker may be on one batch before Wedged
// reports it: twice the longest a batch can take, which is its claim, two
// publishes (a batch claimed ahead waits for the one before it), the wait
// for a turn (bounded by the publish timeout) and two write-backs, each
// bounded by its timeout.
func (r *Relay) WedgedAfter() time.Duration {
	return 2 * (3*r.cfg.PublishTimeout + 3*r.cfg.QueryTimeout)
}

// Wedged reports a worker that has been on one batch for longer than
// WedgedAfter: stuck in a call that ignores its deadline, which only a
// restart ends. A waiting worker is never wedged: it claims again at least
// every poll interval.
func (r *Relay) Wedged() error {
	bound := r.WedgedAfter()
	now := int64(time.Since(r.epoch)) + 1
	for _, s := range r.sources {
		for _, w := range s.workers {
			if since := w.busySince.Load(); since != 0 && time.Duration(now-since) > bound {
				who := fmt.Sprintf("worker %d", w.id)
				if len(r.sources) > 1 {
					who = fmt.Sprintf("worker %d of outbox %s", w.id, s.name)
				}
				return fmt.Errorf("%s has been on one batch for %s, longer than any batch can take (%s): wedged",
					who, time.Duration(now-since).Round(time.Second), bound)
			}
		}
	}
	return nil
}

// quiet reports that no batch is in flight and every breaker is closed.
func (r *Relay) quiet() bool {
	for _, s := range r.sources {
		if !s.inflight.empty() {
			return false
		}
	}
	for _, d := range r.dests {
		if state, _ := d.BreakerState(); state != BreakerClosed || d.Lends() {
			return false
		}
	}
	return true
}

// stirFleet ends a resting fleet's rest: rows were claimed.
func (r *Relay) stirFleet() {
	if r.fleet != nil {
		r.fleet.Stir()
	}
}

// Fleet reports the relay's view of its fleet, and false when it has
// none.
func (r *Relay) Fleet() (FleetStatus, bool) {
	if r.fleet == nil {
		return FleetStatus{}, false
	}
	return r.fleet.Snapshot(), true
}

// Destinations reports the state of every destination.
func (r *Relay) Destinations() []DestinationStatus {
	out := make([]DestinationStatus, 0, len(r.dests))
	for _, d := range r.dests {
		out = append(out, d.Status())
	}
	return out
}
