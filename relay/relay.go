// Package relay delivers outbox rows: it claims ready rows in batches,
// publishes them through a Publisher, and writes each outcome back, under
// the delivery contract: at least once, in id order per key, retrying
// transient failures, deferring rows while a destination is down, and
// dead-lettering what cannot be delivered.
package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/internal/testsignal"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Publisher delivers records to a destination. Publish returns one error
// per record, nil for each record the destination acknowledged. Errors are
// classified with the retry package; unclassified errors are transient.
// Records sharing a key are given in id order and must be delivered in that
// order: after a record fails, a Publisher must not send the later records
// of its key, and reports them with retry.ErrNotSent. The records are the
// relay's, read by other workers while they are in flight: a Publisher
// reads them and never changes them.
type Publisher interface {
	Publish(ctx context.Context, records []store.Record) []error
}

// Dead-letter policies of a destination.
const (
	// OnDeadLetterRelease lets a key's later rows go on after one of its
	// rows is dead-lettered.
	OnDeadLetterRelease = "release"
	// OnDeadLetterBlock parks the key at a dead-lettered row until an
	// operator releases it.
	OnDeadLetterBlock = "block"
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

// Defaults of Config.
const (
	DefaultWorkers = 2
	// DefaultBatchSize is the fastest measured with the default workers
	// (docs/performance.md): a claim's fixed costs, its start on the
	// pending index among them, are paid per batch. MaxBatchBytes still
	// bounds a batch of large rows.
	DefaultBatchSize = 2000
	// DefaultMaxBatchBytes keeps a full batch, with the per-record
	// overhead counted, well under a broker's default max.message.bytes
	// (1 MiB).
	DefaultMaxBatchBytes   = 900 << 10
	DefaultPollInterval    = time.Second
	DefaultPublishTimeout  = 15 * time.Second
	DefaultDrainTimeout    = 30 * time.Second
	DefaultQueryTimeout    = 30 * time.Second
	DefaultCleanupInterval = time.Minute
	DefaultCleanupBatch    = 5000
	// DefaultDeadLetterRetention keeps unhandled dead letters until an
	// operator replays or discards them: they are evidence.
	DefaultDeadLetterRetention = retry.Forever
	// DefaultDiscardedRetention is how long discarded rows are kept after
	// an operator discarded them.
	DefaultDiscardedRetention = 14 * 24 * time.Hour
	// DefaultAuditRetention keeps the audit trail.
	DefaultAuditRetention = retry.Forever
	DefaultPauseBase      = time.Second
	DefaultPauseMax       = 30 * time.Second

	// RecordOverhead is counted for each record against MaxBatchBytes,
	// beside its payload, key and headers: a generous allowance for a
	// Kafka record's own lengths and timestamps and the two headers the
	// relay adds. A sink's own batch limit should exceed MaxBatchBytes by
	// some slack, so it never splits what the relay sends as one batch.
	RecordOverhead = 128
)

// Config configures a Relay. Zero values take the defaults.
type Config struct {
	// Store claims rows and writes outcomes back: the relay's one
	// outbox, named DefaultOutbox. Either give Store or Outboxes.
	Store *store.Store
	// Outboxes are the outbox tables the relay delivers from, each with
	// its own workers, listener and maintenance.
	Outboxes []Outbox
	// Destinations are where rows go, chosen by Routes. Either give
	// Destinations and Routes, or a single Publisher: a destination named
	// "default" that every topic is routed to.
	Destinations []Destination
	// Routes map topics to Destinations; a row that no route matches is
	// dead-lettered no_route.
	Routes []Route
	// Publisher is the single destination of a relay without Destinations.
	Publisher Publisher
	// Listener wakes Store's workers when rows are inserted; without one
	// they only poll.
	Listener *store.Listener
	// Policy decides what happens to failed rows. Default retry defaults.
	Policy *retry.Policy
	// Logger receives the relay's logs. Default discards.
	Logger *slog.Logger
	// Observer is told of claims and outcomes, for metrics, for the
	// outboxes without an Observer of their own. Optional.
	Observer Observer

	// Workers is the number of batches published at once, by all
	// outboxes together; each outbox runs this many workers unless it sets
	// its own, and they take turns fairly (see turns). While a backlog
	// lasts, each worker also claims its next batch while it publishes,
	// when the pool has connections to spare: it holds two batches at
	// most. Default 2.
	Workers int
	// BatchSize is the most rows claimed per batch. Default
	// DefaultBatchSize.
	BatchSize int
	// MaxBatchBytes bounds the bytes of one published batch (payloads,
	// keys, headers and RecordOverhead per record); rows past it wait for
	// the next batch. Default 900 KiB.
	MaxBatchBytes int
	// PayloadCap is the largest payload delivered; larger rows are
	// dead-lettered too_large without being loaded. Default MaxBatchBytes,
	// which it must not exceed.
	PayloadCap int
	// PollInterval is the longest a worker sleeps when there is no work
	// and no wake-up. Default 1s.
	PollInterval time.Duration
	// PublishTimeout bounds one publish; a publish that times out has an
	// unknown outcome and is retried. It bounds a batch's wait for a turn
	// too. Default 15s.
	PublishTimeout time.Duration
	// DrainTimeout is how long in-flight batches may finish after Run's
	// context ends before they are abandoned (their rows stay pending).
	// Default 30s.
	DrainTimeout time.Duration
	// QueryTimeout bounds each claim, write-back and cleanup batch: a
	// database that does not answer in time (a crash, a network black
	// hole) is given up on, the connection dropped, and the batch's rows
	// stay pending until the server ends its transaction. Default 30s.
	QueryTimeout time.Duration
	// OnDeadLetter is release (default) or block, for destinations that do
	// not set their own.
	OnDeadLetter string
	// OrderScope is where a key's rows keep their id order, for the
	// outboxes that do not set their own: destination (the default),
	// topic or global (see the OrderScope constants). A parked key parks
	// it in its scope only.
	OrderScope string
	// SentRetention keeps sent rows this long before cleanup; 0 deletes
	// rows as they are sent, retry.Forever keeps them. It must agree with
	// the Store's KeepSent.
	SentRetention time.Duration
	// DeadLetterRetention keeps dead-lettered rows this long after they
	// were dead-lettered. Default retry.Forever: until an operator
	// replays or discards them.
	DeadLetterRetention time.Duration
	// DiscardedRetention keeps discarded rows this long after they were
	// discarded; retry.Forever keeps them. Default 14 days.
	DiscardedRetention time.Duration
	// AuditRetention keeps audit records this long. Default
	// retry.Forever.
	AuditRetention time.Duration
	// CleanupInterval is how often rows past their retention are deleted.
	// Default 1m.
	CleanupInterval time.Duration
	// PauseBase and PauseMax bound the cool-down of a destination's
	// circuit breaker: how long it stays open before a probe. It doubles
	// while probes fail. Defaults 1s and 30s.
	PauseBase, PauseMax time.Duration
	// Fleet, when set, shares each destination's flow control with the
	// relay's other replicas (see FleetConfig). Without it, each relay
	// process has its own.
	Fleet *FleetConfig
}

// Validate reports every problem of c at once, or nil.
func (c *Config) Validate() error {
	errs := c.outboxProblems()
	switch {
	case c.Publisher == nil && len(c.Destinations) == 0:
		errs = append(errs, errors.New("relay: a publisher or destinations are required"))
	case c.Publisher != nil && len(c.Destinations) > 0:
		errs = append(errs, errors.New("relay: give a publisher or destinations, not both"))
	}
	names := make([]string, 0, len(c.Destinations))
	seen := map[string]bool{}
	for i := range c.Destinations {
		d := &c.Destinations[i]
		if err := d.Validate(); err != nil {
			errs = append(errs, err)
		}
		if seen[d.Name] {
			errs = append(errs, fmt.Errorf("relay: destination %s is defined twice", d.Name))
		}
		seen[d.Name] = true
		names = append(names, d.Name)
	}
	if len(c.Destinations) > 0 {
		if len(c.Routes) == 0 {
			errs = append(errs, errors.New("relay: destinations need routes"))
		}
		if err := ValidateRoutes(c.Routes, names); err != nil {
			errs = append(errs, fmt.Errorf("relay: %w", err))
		}
	}
	for name, v := range map[string]int{"workers": c.Workers, "batch_size": c.BatchSize, "max_batch_bytes": c.MaxBatchBytes, "payload_cap": c.PayloadCap} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("relay: %s is %d; it must be positive", name, v))
		}
	}
	if c.PayloadCap > 0 && c.MaxBatchBytes > 0 && c.PayloadCap > c.MaxBatchBytes {
		errs = append(errs, fmt.Errorf("relay: payload_cap %d is above max_batch_bytes %d", c.PayloadCap, c.MaxBatchBytes))
	}
	for name, v := range map[string]time.Duration{"poll_interval": c.PollInterval, "publish_timeout": c.PublishTimeout,
		"drain_timeout": c.DrainTimeout, "sent_retention": c.SentRetention, "dead_letter_retention": c.DeadLetterRetention, "cleanup_interval": c.CleanupInterval,
		"discarded_retention": c.DiscardedRetention, "audit_retention": c.AuditRetention,
		"pause_base": c.PauseBase, "pause_max": c.PauseMax, "query_timeout": c.QueryTimeout} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("relay: %s is %s; it must not be negative", name, v))
		}
	}
	if err := ValidateOnDeadLetter(c.OnDeadLetter); err != nil {
		errs = append(errs, fmt.Errorf("relay: %w", err))
	}
	if err := ValidateOrderScope(c.OrderScope); err != nil {
		errs = append(errs, fmt.Errorf("relay: %w", err))
	}
	if c.Fleet != nil {
		errs = append(errs, c.Fleet.problems()...)
	}
	return errors.Join(errs...)
}

// Relay delivers outbox rows until its context ends. Its workers claim
// batches and carry each through the planner (routing, key runs, the
// destinations' admission), the publishers and the destinations'
// settlement, then complete the claim; leased deliveries, the cleaner and
// the wake-up listener run beside them.
type Relay struct {
	cfg     Config
	log     *slog.Logger
	dests   []*dest
	planner *planner
	sources []*source // one per outbox
	turns   *turns
	fleet   *fleet    // nil: flow control per process
	epoch   time.Time // a monotonic origin for the workers' busySince
	// unleased is whether a live replica claims without leasing
	// partitions, as the fleet last said.
	unleased atomic.Bool
	// breakerChanged, cleaned and leaseWritten tell tests of the
	// destinations' breakers, the cleaners' deletes and the leased
	// write-backs.
	breakerChanged testsignal.Signal[breakerChange]
	cleaned        testsignal.Signal[cleanedBatch]
	leaseWritten   testsignal.Signal[int]
}

// New returns a Relay for cfg.
func New(cfg Config) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, log: cfg.Logger, epoch: time.Now()}
	for _, d := range cfg.Destinations {
		r.dests = append(r.dests, newDest(d, &r.cfg, &r.breakerChanged))
	}
	r.planner = newPlanner(&r.cfg, r.dests)
	for i, o := range r.cfg.Outboxes {
		r.sources = append(r.sources, newSource(r, i, o))
	}
	r.turns = newTurns(cfg.Workers, len(r.sources))
	wakeWorkers := func() {
		for _, s := range r.sources {
			s.wakeAll()
		}
	}
	for _, d := range r.dests {
		d.freed = wakeWorkers
	}
	if cfg.Fleet != nil {
		r.fleet = newFleet(*cfg.Fleet, r.dests, r.cfg.QueryTimeout, r.log)
		r.fleet.wakeWorkers = wakeWorkers
		r.fleet.quiet = r.quiet
		r.fleet.unleased = func(present bool) {
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

// setDefaults fills in what c leaves zero.
func (c *Config) setDefaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Workers, DefaultWorkers)
	def(&c.BatchSize, DefaultBatchSize)
	def(&c.MaxBatchBytes, DefaultMaxBatchBytes)
	def(&c.PayloadCap, c.MaxBatchBytes)
	defDur(&c.PollInterval, DefaultPollInterval)
	defDur(&c.PublishTimeout, DefaultPublishTimeout)
	defDur(&c.DrainTimeout, DefaultDrainTimeout)
	defDur(&c.QueryTimeout, DefaultQueryTimeout)
	defDur(&c.CleanupInterval, DefaultCleanupInterval)
	defDur(&c.DeadLetterRetention, DefaultDeadLetterRetention)
	defDur(&c.DiscardedRetention, DefaultDiscardedRetention)
	defDur(&c.AuditRetention, DefaultAuditRetention)
	defDur(&c.PauseBase, DefaultPauseBase)
	defDur(&c.PauseMax, max(DefaultPauseMax, c.PauseBase))
	if c.OnDeadLetter == "" {
		c.OnDeadLetter = OnDeadLetterRelease
	}
	if c.OrderScope == "" {
		c.OrderScope = OrderScopeDestination
	}
	if c.Policy == nil {
		p, err := retry.NewPolicy(retry.PolicyConfig{})
		if err != nil {
			return err
		}
		c.Policy = p
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Outboxes = c.outboxes()
	if len(c.Destinations) == 0 {
		c.Destinations = []Destination{{Name: "default", Publisher: c.Publisher}}
		c.Routes = []Route{{Topics: []string{"*"}, Destination: "default"}}
	}
	return nil
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
		r.fleet.sync(ctx)
		r.fleet.service.start(ctx, fails)
	}
	for _, s := range r.sources {
		s.run(g, ctx, inflight, fails)
	}
	r.log.Info("relay started", slog.Int("outboxes", len(r.sources)), slog.Int("workers", r.cfg.Workers), slog.Int("batch_size", r.cfg.BatchSize))
	err := g.Wait()
	for _, s := range r.sources {
		s.stop(ctx)
	}
	if r.fleet != nil {
		r.fleet.service.stop()
		r.fleet.leave(ctx)
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
func (r *Relay) closedTopics(now time.Time, waits *slotWaits) (topics []string, left time.Duration, room int) {
	var wait func(*dest) bool
	if waits != nil {
		wait = waits.take
	}
	open := 0
	addRoom := func(d *dest) {
		open++
		if room < 0 {
			return
		}
		free, limit, ok := d.bulk.room()
		switch {
		case !ok:
			room = -1
		case waits.holds(d):
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
		blocked, until, topics, left := d.closed(now, wait)
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
		if state, until := d.breaker.snapshot(); state == BreakerOpen && (soonest.IsZero() || until.Before(soonest)) {
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
		if state, _ := d.breaker.snapshot(); state != BreakerClosed {
			return false
		}
	}
	return true
}

// stirFleet ends a resting fleet's rest: rows were claimed.
func (r *Relay) stirFleet() {
	if r.fleet != nil {
		r.fleet.stir()
	}
}

// Fleet reports the relay's view of its fleet, and false when it has
// none.
func (r *Relay) Fleet() (FleetStatus, bool) {
	if r.fleet == nil {
		return FleetStatus{}, false
	}
	return r.fleet.snapshot(), true
}

// Destinations reports the state of every destination.
func (r *Relay) Destinations() []DestinationStatus {
	out := make([]DestinationStatus, 0, len(r.dests))
	for _, d := range r.dests {
		out = append(out, d.status())
	}
	return out
}
