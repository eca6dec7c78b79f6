// Package relay delivers outbox rows: it claims ready rows in batches,
// publishes them through a Publisher, and writes each outcome back, under
// the delivery contract: at least once, in id order per key, retrying
// transient failures, deferring rows while a destination is down, and
// dead-lettering what cannot be delivered.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay/retry"
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
	Publish(ctx context.Context, records []outbox.Record) []error
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

// Defaults of Config.
const (
	DefaultWorkers   = 2
	DefaultBatchSize = 500
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
	// DefaultDeadLetterRetention is how long dead-lettered and discarded
	// rows are kept.
	DefaultDeadLetterRetention = 14 * 24 * time.Hour
	DefaultPauseBase           = time.Second
	DefaultPauseMax            = 30 * time.Second

	// RecordOverhead is counted for each record against MaxBatchBytes,
	// beside its payload, key and headers: a generous allowance for a
	// Kafka record's own lengths and timestamps and the two headers the
	// relay adds. A sink's own batch limit should exceed MaxBatchBytes by
	// some slack, so it never splits what the relay sends as one batch.
	RecordOverhead = 128
)

// Config configures a Relay. Zero values take the defaults.
type Config struct {
	// Store claims rows and writes outcomes back. Required.
	Store *outbox.Store
	// Destinations are where rows go, chosen by Routes. Either give
	// Destinations and Routes, or a single Publisher: a destination named
	// "default" that every topic is routed to.
	Destinations []Destination
	// Routes map topics to Destinations; a row that no route matches is
	// dead-lettered no_route.
	Routes []Route
	// Publisher is the single destination of a relay without Destinations.
	Publisher Publisher
	// Listener wakes the workers when rows are inserted; without one they
	// only poll.
	Listener *outbox.Listener
	// Policy decides what happens to failed rows. Default retry defaults.
	Policy *retry.Policy
	// Logger receives the relay's logs. Default discards.
	Logger *slog.Logger
	// Observer is told of claims and outcomes, for metrics. Optional.
	Observer Observer

	// Workers is the number of batches published at once. While a
	// backlog lasts, each worker also claims its next batch while it
	// publishes, when the pool has connections to spare: it holds two
	// batches at most. Default 2.
	Workers int
	// BatchSize is the most rows claimed per batch. Default 500.
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
	// unknown outcome and is retried. Default 15s.
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
	// SentRetention keeps sent rows this long before cleanup; 0 deletes
	// rows as they are sent. It must agree with the Store's KeepSent.
	SentRetention time.Duration
	// DeadLetterRetention keeps dead-lettered and discarded rows this
	// long after they were dead-lettered; a negative value keeps them for
	// ever. Default 14 days.
	DeadLetterRetention time.Duration
	// CleanupInterval is how often rows past their retention are deleted.
	// Default 1m.
	CleanupInterval time.Duration
	// PauseBase and PauseMax bound the cool-down of a destination's
	// circuit breaker: how long it stays open before a probe. It doubles
	// while probes fail. Defaults 1s and 30s.
	PauseBase, PauseMax time.Duration
}

// Validate reports every problem of c at once, or nil.
func (c *Config) Validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("relay: a store is required"))
	}
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
		"drain_timeout": c.DrainTimeout, "sent_retention": c.SentRetention, "cleanup_interval": c.CleanupInterval,
		"pause_base": c.PauseBase, "pause_max": c.PauseMax, "query_timeout": c.QueryTimeout} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("relay: %s is %s; it must not be negative", name, v))
		}
	}
	switch c.OnDeadLetter {
	case "", OnDeadLetterRelease, OnDeadLetterBlock:
	default:
		errs = append(errs, fmt.Errorf("relay: on_dead_letter is %q; use release or block", c.OnDeadLetter))
	}
	return errors.Join(errs...)
}

// Observer is told what the relay does, for metrics. The workers call it
// concurrently; its methods must be quick.
type Observer interface {
	// Claimed reports one claim query: how long it took and how many
	// rows it returned.
	Claimed(elapsed time.Duration, rows int)
	// Settled reports one row's outcome once it is written back: the
	// destination ("" when the row never got one), the kind, the
	// dead-letter reason or the Defer* reason, and for a sent row the
	// time from its creation to the destination's acknowledgement, by
	// the database clock.
	Settled(destination string, kind outbox.OutcomeKind, reason string, lag time.Duration)
}

// Why rows are deferred (Observer.Settled's reason for Deferred rows).
const (
	// DeferKeyWaiting: an earlier row of the key waits for a retry, a
	// delay, or a parked key's release.
	DeferKeyWaiting = "key_waiting"
	// DeferCircuitOpen: the destination's circuit breaker is open.
	DeferCircuitOpen = "circuit_open"
	// DeferRetryBudget: the destination's retries are over budget.
	DeferRetryBudget = "retry_budget"
	// DeferDestinationFailing: the attempt failed in a way that says the
	// destination as a whole cannot be used (a systemic failure).
	DeferDestinationFailing = "destination_failing"
	// DeferTopicPaused: the row's topic is paused, or its attempt failed
	// in a way that says the topic cannot be used now (a systemic failure
	// of the topic, such as its authorization).
	DeferTopicPaused = "topic_paused"
	// DeferPartitionPaused: likewise for the row's partition (no leader).
	DeferPartitionPaused = "partition_paused"
)

// Stats counts what the relay did. Read it with Relay.Stats.
type Stats struct {
	// Claims counts claim queries; Batches those that found rows.
	Claims, Batches, Delivered, Retried, Deferred, DeadLettered int64
}

// Relay delivers outbox rows until its context ends.
type Relay struct {
	cfg      Config
	log      *slog.Logger
	obs      Observer
	leased   sync.WaitGroup // deliveries on a lease, outliving their batch
	dests    []*dest
	router   *router
	wakes    []chan struct{}
	inflight inflightKeys
	sqlBusy  atomic.Int32 // claims and write-backs under way

	claims, batches, delivered, retried, deferred, deadLettered atomic.Int64
}

// New returns a Relay for cfg.
func New(cfg Config) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
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
	def(&cfg.Workers, DefaultWorkers)
	def(&cfg.BatchSize, DefaultBatchSize)
	def(&cfg.MaxBatchBytes, DefaultMaxBatchBytes)
	def(&cfg.PayloadCap, cfg.MaxBatchBytes)
	defDur(&cfg.PollInterval, DefaultPollInterval)
	defDur(&cfg.PublishTimeout, DefaultPublishTimeout)
	defDur(&cfg.DrainTimeout, DefaultDrainTimeout)
	defDur(&cfg.QueryTimeout, DefaultQueryTimeout)
	defDur(&cfg.CleanupInterval, DefaultCleanupInterval)
	defDur(&cfg.DeadLetterRetention, DefaultDeadLetterRetention)
	defDur(&cfg.PauseBase, DefaultPauseBase)
	defDur(&cfg.PauseMax, max(DefaultPauseMax, cfg.PauseBase))
	if cfg.OnDeadLetter == "" {
		cfg.OnDeadLetter = OnDeadLetterRelease
	}
	if cfg.Policy == nil {
		p, err := retry.NewPolicy(retry.PolicyConfig{})
		if err != nil {
			return nil, err
		}
		cfg.Policy = p
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Destinations) == 0 {
		cfg.Destinations = []Destination{{Name: "default", Publisher: cfg.Publisher}}
		cfg.Routes = []Route{{Topics: []string{"*"}, Destination: "default"}}
	}
	r := &Relay{cfg: cfg, log: cfg.Logger, obs: cfg.Observer}
	index := map[string]int{}
	for i, d := range cfg.Destinations {
		index[d.Name] = i
		r.dests = append(r.dests, r.newDest(d))
	}
	r.router = newRouter(cfg.Routes, index)
	r.wakes = make([]chan struct{}, cfg.Workers)
	for i := range r.wakes {
		r.wakes[i] = make(chan struct{}, 1)
	}
	return r, nil
}

// Stats returns what the relay has done so far.
func (r *Relay) Stats() Stats {
	return Stats{
		Claims:       r.claims.Load(),
		Batches:      r.batches.Load(),
		Delivered:    r.delivered.Load(),
		Retried:      r.retried.Load(),
		Deferred:     r.deferred.Load(),
		DeadLettered: r.deadLettered.Load(),
	}
}

// Run delivers rows until ctx ends, then stops claiming and lets in-flight
// batches finish for up to DrainTimeout before abandoning them (their rows
// stay pending and are delivered again later). It returns nil after a
// clean stop.
func (r *Relay) Run(ctx context.Context) error {
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

	g := &errgroup.Group{}
	for i := range r.cfg.Workers {
		g.Go(func() error { return r.work(ctx, inflight, i) })
	}
	listenCtx, stopListen := context.WithCancel(ctx)
	defer stopListen()
	if r.cfg.Listener != nil {
		g.Go(func() error { return r.cfg.Listener.Run(listenCtx, r.wakeAll) })
	}
	if r.cfg.SentRetention > 0 || r.cfg.DeadLetterRetention > 0 {
		g.Go(func() error { return r.cleanup(listenCtx) })
	}
	r.log.Info("relay started", slog.Int("workers", r.cfg.Workers), slog.Int("batch_size", r.cfg.BatchSize))
	err := g.Wait()
	r.leased.Wait()
	r.log.Info("relay stopped", slog.Int64("delivered", r.delivered.Load()))
	return err
}

// wakeAll nudges every idle worker.
func (r *Relay) wakeAll() {
	for _, w := range r.wakes {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// work is one worker's loop: claim, publish, write back; sleep (until a
// wake-up or the poll interval) only when a batch delivered nothing. While
// a backlog lasts, it claims its next batch while it delivers the current
// one (see claimAhead), so the database does not wait on the destination.
func (r *Relay) work(ctx, inflight context.Context, id int) error {
	poll := time.NewTimer(0)
	defer poll.Stop()
	w := &worker{owner: 2 * id, avoid: avoidKeys{}}
	var ahead chan taken // the next batch, being claimed
	defer func() {
		if ahead != nil {
			r.drop(ctx, <-ahead)
		}
	}()
	errDelay := time.Duration(0)
	for {
		if ctx.Err() != nil {
			return nil
		}
		var t taken
		if ahead != nil {
			t, ahead = <-ahead, nil
			if t.err == nil && 2*len(t.claim.Records) < t.limit {
				// Not worth it: the backlog is ending, or its rows are
				// held behind the batch before it (a hot key).
				w.aheadPaused = time.Now().Add(avoidFor)
			}
		} else {
			t = r.take(ctx, w, w.owner, false)
		}
		more, err := false, t.err
		if err == nil {
			if r.claimAhead(w, t) {
				next := make(chan taken, 1)
				go func() { next <- r.take(ctx, w, t.owner^1, true) }()
				ahead = next
			}
			more, err = r.deliver(ctx, inflight, t)
		}
		if err != nil {
			if ahead != nil {
				r.drop(ctx, <-ahead)
				ahead = nil
			}
			if ctx.Err() != nil {
				return nil
			}
			errDelay = min(max(errDelay*2, 100*time.Millisecond), 30*time.Second)
			r.log.Error("batch failed", slog.Int("worker", id), slog.Any("error", err), slog.Duration("retry_in", errDelay))
			if !sleep(ctx, errDelay) {
				return nil
			}
			continue
		}
		errDelay = 0
		// A batch claimed ahead says nothing about the backlog: the one
		// before it was full.
		if more || ahead != nil || t.ahead {
			continue
		}
		// Wake up when a breaker may let a probe through, too.
		wait := r.cfg.PollInterval
		if until := r.nextReopen(); !until.IsZero() {
			wait = max(min(wait, time.Until(until)), time.Millisecond)
		}
		if since := t.claim.HeldSince; !since.IsZero() {
			// Rows wait for older transactions to end (strict order),
			// which no notification announces: look again soon, less
			// often the longer they wait.
			wait = min(wait, max(time.Since(since)/4, heldRecheck))
		}
		poll.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-r.wakes[id]:
		case <-poll.C:
		}
	}
}

// heldRecheck is the shortest wait before a worker claims again while
// rows wait for older transactions (strict order).
const heldRecheck = 2 * time.Millisecond

// worker is what one worker keeps between batches. Its claims run one at a
// time, so they share it without a lock.
type worker struct {
	owner       int // in the in-flight registry; a batch claimed ahead of another has its owner^1
	avoid       avoidKeys
	avgRowBytes int
	aheadPaused time.Time // no claiming ahead before then
}

// taken is a claimed batch not yet delivered.
type taken struct {
	claim    *outbox.Claim
	owner    int        // its keys' owner in the in-flight registry
	inflight inflightID // its entry there
	limit    int
	start    time.Time // when the claim began
	ahead    bool      // claimed while the batch before it was delivered
	err      error
}

// claimAhead reports whether the worker should claim its next batch while
// it delivers t. Only while a backlog lasts: t came back full and is to be
// published. Only while no claim or write-back of the relay is under way:
// claiming ahead fills the time the database would wait on publishes, and
// where the workers keep it busy, more claims at once only contend (each
// must pass over the rows the others have locked). Not for a while after
// a batch claimed ahead came back less than half full: held behind the one
// before it (a hot key, whose rows can only follow it), or left out as a
// key in flight. And only with two connections to spare, so that the
// wake-up listener, maintenance and health checks seldom wait for one (a
// check, not a reservation: two workers looking at once may both go).
// Each worker then holds two batches at most: one publishing, the next
// claimed.
func (r *Relay) claimAhead(w *worker, t taken) bool {
	return t.claim.Claimed == t.limit && len(t.claim.Records) > 0 &&
		r.sqlBusy.Load() == 0 && time.Now().After(w.aheadPaused) && r.cfg.Store.SpareConns() >= 2
}

// take claims a batch for w, its keys in flight under owner until the
// batch is delivered or dropped.
func (r *Relay) take(ctx context.Context, w *worker, owner int, ahead bool) taken {
	start := time.Now()
	limit := r.claimLimit(w.avgRowBytes)
	closed, closedFor := r.closedTopics(start)
	r.sqlBusy.Add(1)
	claimCtx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	claim, err := r.cfg.Store.Claim(claimCtx, outbox.ClaimParams{
		Limit: limit, PayloadCap: r.cfg.PayloadCap, ExcludeKeys: r.inflight.elsewhere(owner, w.avoid.keys(start)),
		ExcludeTopics: closed, ExcludeFor: closedFor,
	})
	cancel()
	r.sqlBusy.Add(-1)
	if err != nil {
		return taken{err: err}
	}
	r.claims.Add(1)
	if r.obs != nil {
		r.obs.Claimed(time.Since(start), len(claim.Records))
	}
	// Size the next claim by the rows that will be published: oversized
	// rows are never loaded and must not shrink it.
	total, n := 0, 0
	for _, rec := range claim.Records {
		if rec.Undeliverable == "" {
			total += recordSize(rec)
			n++
		}
	}
	if n > 0 {
		w.avgRowBytes = total / n
	}
	w.avoid.add(claim.SkippedKeys, start)
	id := r.inflight.add(owner, claim.Records)
	return taken{claim: claim, owner: owner, inflight: id, limit: limit, start: start, ahead: ahead}
}

// drop gives a batch back undelivered: its rows stay as they were.
func (r *Relay) drop(ctx context.Context, t taken) {
	if t.err != nil {
		return
	}
	r.inflight.remove(t.inflight)
	writeCtx, cancel := r.writeBackContext(ctx)
	defer cancel()
	if err := t.claim.Release(writeCtx); err != nil {
		r.log.Warn("releasing a claim failed; its rows are unlocked when the connection closes", slog.Any("error", err))
	}
}

// deliver publishes a claimed batch and writes its outcomes back. more
// reports that it delivered something, so the worker should look again
// before sleeping.
func (r *Relay) deliver(ctx, inflight context.Context, t taken) (more bool, err error) {
	claim, start, limit := t.claim, t.start, t.limit
	defer r.inflight.remove(t.inflight)
	if len(claim.Records) == 0 {
		writeCtx, cancel := r.writeBackContext(ctx)
		defer cancel()
		if claim.Deferred > 0 {
			// The claim's rows were rescheduled: look again at once.
			if err := claim.Complete(writeCtx, nil); err != nil {
				return false, err
			}
			r.count(nil, claim.Deferred)
			r.observe(nil, nil, claim.Deferred)
			return true, nil
		}
		return false, claim.Release(writeCtx)
	}

	all, outcomes := r.plan(claim.Records, time.Now())
	var groups, leased []*group
	for _, g := range all {
		g.claimed, g.start = claim.Now, start
		if g.d.VisibilityTimeout > 0 {
			leased = append(leased, g)
			g.token = uuid.New()
			for _, rec := range g.recs {
				outcomes = append(outcomes, outbox.Outcome{ID: rec.ID, Kind: outbox.Leased, Token: g.token, Delay: g.d.VisibilityTimeout})
			}
		} else {
			groups = append(groups, g)
		}
	}
	handedOff := false
	defer func() {
		for _, g := range groups {
			g.d.bulk.give(len(g.recs))
		}
		if !handedOff {
			for _, g := range leased {
				g.d.bulk.give(len(g.recs))
				g.abandonProbes()
			}
		}
	}()
	r.publish(inflight, groups)
	abandoned := inflight.Err() != nil
	published := 0
	for _, g := range all {
		published += len(g.recs)
	}
	for _, g := range groups {
		outcomes = append(outcomes, r.decide(g, abandoned)...)
	}
	writeCtx, cancel := r.writeBackContext(ctx)
	defer cancel()
	r.sqlBusy.Add(1)
	err = claim.Complete(writeCtx, outcomes)
	r.sqlBusy.Add(-1)
	if err != nil {
		return false, err
	}
	for _, g := range leased {
		g.inflight = r.inflight.add(leasedOwner, g.recs) // taken over from the worker
		r.leased.Add(1)
		go r.deliverLeased(inflight, g, claim.LeaseExpiry)
	}
	handedOff = true
	r.batches.Add(1)
	r.count(outcomes, claim.Deferred)
	r.observe(outcomes, groups, claim.Deferred)
	if claim.Claimed == limit && published > 0 {
		// A full batch: more rows are probably ready than this worker
		// takes; idle workers may help.
		r.wakeAll()
	}
	// Claim again at once after any outcome or rescheduling: rows
	// committed meanwhile may not have notified (one notifier at a time),
	// and a claim that finds nothing is cheap.
	more = len(outcomes) > 0 || claim.Deferred > 0
	r.log.Debug("batch done", slog.Int("claimed", claim.Claimed), slog.Int("published", published),
		slog.Int("outcomes", len(outcomes)), slog.Duration("duration", time.Since(start)))
	return more, nil
}

// writeBackContext bounds a write-back, detached from ctx: a publish that
// happened is acknowledged even while the relay stops. It starts after the
// publish, so a long publish timeout cannot eat into it.
func (r *Relay) writeBackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), r.cfg.QueryTimeout)
}

// group is a batch's rows for one destination, in id order, and what its
// publish returned.
type group struct {
	d     *dest
	recs  []outbox.Record
	errs  []error
	probe bool      // the breaker's half-open probe
	gen   int       // the breaker state the group was admitted in
	token uuid.UUID // the lease, for a destination with a visibility timeout
	// pauses are the paused topics and partitions whose probe the group
	// carries; parts, by index into recs, the partition of each row
	// admitted as a partition's probe.
	pauses map[subject]admission
	parts  map[int]int
	mix    *probeMix // what a destination probe holds so far
	// inflight is a leased group's entry in the in-flight registry.
	inflight inflightID

	claimed time.Time // the database clock at the claim
	start   time.Time // the local clock when the claim began
	done    time.Time // the local clock when the publish returned
}

// acked is when the group's publish returned, by the database clock.
func (g *group) acked() time.Time { return g.claimed.Add(g.done.Sub(g.start)) }

// abandonProbes gives back the probe slots of a group whose publish never
// finished, or never started.
func (g *group) abandonProbes() {
	if g.probe {
		g.d.breaker.abandoned(g.gen)
	}
	for s, a := range g.pauses {
		if a.probe {
			g.d.pauses.abandoned(s, a.gen)
		}
	}
}

// plan routes the claimed rows and picks those to publish now, per
// destination, in id order. Undeliverable and unroutable rows get their
// dead-letter outcome here; rows of a destination whose breaker is open, or
// retries over its budget, are deferred without counting an attempt. A
// key's rows travel together only while they go to one destination and
// topic, so that a failure in one place can never let a later row of the
// key through in another; and once the batch's byte budget or a
// destination's bulkhead is spent, the remaining rows wait for the next
// batch, untouched.
func (r *Relay) plan(recs []outbox.Record, now time.Time) ([]*group, []outbox.Outcome) {
	type keyRun struct {
		dest    int
		topic   string
		stopped bool
	}
	// Sized for the batch, as growing them showed in profiles of drains.
	runs := make(map[string]*keyRun, len(recs))
	runBuf := make([]keyRun, 0, len(recs)) // never grows: pointers stay valid
	groups := map[int]*group{}
	var order []*group
	admitted := map[int]admission{}
	var pauses planPauses
	var outcomes []outbox.Outcome
	bytes := 0
	full := false
	for _, rec := range recs {
		rt := r.router.route(rec.Topic)
		if rec.Undeliverable == "" && rt.dest < 0 {
			rec.Undeliverable = fmt.Sprintf("no route matches topic %q", rec.Topic)
			rec.UndeliverableReason = outbox.ReasonNoRoute
		}
		var run *keyRun
		if rec.HasKey {
			run = runs[rec.Key]
			if run == nil {
				runBuf = append(runBuf, keyRun{dest: rt.dest, topic: rt.topic})
				run = &runBuf[len(runBuf)-1]
				runs[rec.Key] = run
			}
			if run.stopped || run.dest != rt.dest || run.topic != rt.topic {
				run.stopped = true
				continue
			}
		}
		stop := func() {
			if run != nil {
				run.stopped = true
			}
		}
		var d *dest
		if rt.dest >= 0 {
			d = r.dests[rt.dest]
		}
		if rec.Undeliverable != "" {
			// Without a destination, the relay's own policy applies.
			park := rec.HasKey && ((d != nil && d.block) || (d == nil && r.cfg.OnDeadLetter == OnDeadLetterBlock))
			o := outbox.Outcome{ID: rec.ID, Kind: outbox.DeadLettered,
				Reason: rec.UndeliverableReason, Error: rec.Undeliverable, Class: retry.ClassPermanent.String(), ParkKey: park}
			if d != nil {
				o.Destination = d.Name
			}
			outcomes = append(outcomes, o)
			r.log.Warn("row dead-lettered", slog.Int64("id", rec.ID), slog.String("topic", rec.Topic),
				slog.String("reason", rec.UndeliverableReason), slog.String("error", rec.Undeliverable))
			if park {
				stop()
			}
			continue
		}
		if d.VisibilityTimeout > 0 && rec.RetryCount >= r.cfg.Policy.MaxAttempts {
			// Leases count their attempt up front: this row's leases all
			// ended without an outcome, as when it crashes the relay.
			park := d.block && rec.HasKey
			msg := fmt.Sprintf("all %d attempts used; the last leases ended without an outcome (the relay stopped or crashed while delivering)", rec.RetryCount)
			outcomes = append(outcomes, outbox.Outcome{ID: rec.ID, Kind: outbox.DeadLettered, Reason: outbox.ReasonRetriesExhausted,
				Error: msg, Class: retry.ClassTransient.String(), ParkKey: park, Destination: d.Name})
			if park {
				stop()
			}
			continue
		}
		a, ok := admitted[rt.dest]
		if !ok {
			a = d.breaker.admit(now)
			admitted[rt.dest] = a
		}
		if !a.ok {
			outcomes = append(outcomes, outbox.Outcome{ID: rec.ID, Kind: outbox.Deferred, Delay: max(a.until.Sub(now), time.Millisecond),
				Reason: DeferCircuitOpen, Destination: d.Name})
			stop()
			continue
		}
		// A paused topic or partition holds its rows; its probe takes all
		// of them in the batch, so that rows failing there still run out
		// of attempts in time.
		var paused []subject
		if !d.pauses.empty() {
			var held string
			var until time.Time
			paused, held, until = pauses.admit(rt.dest, d, rec, rt.topic, now)
			if held != "" {
				outcomes = append(outcomes, outbox.Outcome{ID: rec.ID, Kind: outbox.Deferred, Delay: max(until.Sub(now), time.Millisecond),
					Reason: held, Destination: d.Name})
				stop()
				continue
			}
		}
		g := groups[rt.dest]
		if g == nil {
			g = &group{d: d, probe: a.probe, gen: a.gen}
			if a.probe {
				g.mix = &probeMix{keys: map[string]bool{}, topics: map[string]int{}}
			} else {
				g.recs = make([]outbox.Record, 0, len(recs))
			}
			groups[rt.dest] = g
			order = append(order, g)
		}
		size := recordSize(rec)
		if (a.probe && !g.mix.fits(rec, rt.topic, len(g.recs))) || full || (bytes > 0 && bytes+size > r.cfg.MaxBatchBytes) {
			full = full || !a.probe
			stop()
			continue
		}
		if d.bulk.take(1) == 0 {
			stop()
			continue
		}
		if rec.RetryCount > 0 && !d.budget.spend(now) {
			d.bulk.give(1)
			outcomes = append(outcomes, outbox.Outcome{ID: rec.ID, Kind: outbox.Deferred, Delay: budgetDeferral,
				Reason: DeferRetryBudget, Destination: d.Name})
			stop()
			continue
		}
		bytes += size
		if a.probe {
			g.mix.add(rec, rt.topic)
		}
		for _, sj := range paused {
			if g.pauses == nil {
				g.pauses = map[subject]admission{}
			}
			g.pauses[sj] = pauses.admitted[pauseKey{rt.dest, sj}]
			if sj.partition != wholeTopic {
				if g.parts == nil {
					g.parts = map[int]int{}
				}
				g.parts[len(g.recs)] = sj.partition
			}
		}
		rec.Topic = rt.topic
		g.recs = append(g.recs, rec)
	}
	out := order[:0]
	for _, g := range order {
		if len(g.recs) > 0 {
			out = append(out, g)
		} else if g.probe {
			g.d.breaker.abandoned(g.gen)
		}
	}
	// Probes of pauses whose rows all stayed behind go another time.
	for k, a := range pauses.admitted {
		carried := false
		if g := groups[k.dest]; g != nil {
			_, carried = g.pauses[k.s]
		}
		if a.probe && !carried {
			r.dests[k.dest].pauses.abandoned(k.s, a.gen)
		}
	}
	return out, outcomes
}

// publish hands each group to its destination, the destinations in
// parallel, each bounded by the publish timeout.
func (r *Relay) publish(inflight context.Context, groups []*group) {
	one := func(g *group) {
		timeout := r.cfg.PublishTimeout
		if vt := g.d.VisibilityTimeout; vt > 0 {
			timeout = vt * 9 / 10 // done before the lease ends
		}
		ctx, cancel := context.WithTimeout(inflight, timeout)
		defer cancel()
		g.errs = g.d.Publisher.Publish(ctx, g.recs)
		g.done = time.Now()
		if len(g.errs) != len(g.recs) {
			err := fmt.Errorf("destination %s returned %d results for %d records", g.d.Name, len(g.errs), len(g.recs))
			g.errs = make([]error, len(g.recs))
			for i := range g.errs {
				g.errs[i] = err
			}
		}
	}
	if len(groups) == 1 {
		one(groups[0])
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { one(g) })
	}
	wg.Wait()
}

// recordSize is what a record counts against MaxBatchBytes.
func recordSize(rec outbox.Record) int {
	size := RecordOverhead + rec.PayloadSize + len(rec.Key)
	for k, v := range rec.Headers {
		size += len(k) + len(v)
	}
	return size
}

// claimLimit sizes the next claim from the size of the rows the last one
// found: no more rows than MaxBatchBytes can carry (with some margin), so a
// worker does not load payloads it cannot publish.
func (r *Relay) claimLimit(avgRowBytes int) int {
	if avgRowBytes <= 0 {
		return r.cfg.BatchSize
	}
	return min(r.cfg.BatchSize, max(1, r.cfg.MaxBatchBytes/avgRowBytes*5/4))
}

// decide turns a group's publish results into outcomes and feeds them, as
// evidence by scope, to its destination's breaker, the pauses of its
// topics and partitions, and its retry budget. After a failure, the later
// rows of the same key get no outcome: they stay as they were, their turn
// comes after the failed row's.
func (r *Relay) decide(g *group, abandoned bool) []outbox.Outcome {
	d := g.d
	elapsed := g.done.Sub(g.start)
	outcomes := make([]outbox.Outcome, 0, len(g.recs))
	failedKeys := map[string]bool{}
	firsts, retriesSent, refunds := 0, 0, 0
	var dev evidence              // about the destination
	var sev map[subject]*evidence // about its topics and partitions
	var pausedBy map[int]subject  // deferred outcomes, by index, waiting on a pause
	about := func(s subject) *evidence {
		if sev == nil {
			sev = map[subject]*evidence{}
		}
		e := sev[s]
		if e == nil {
			e = &evidence{}
			sev[s] = e
		}
		return e
	}
	for i, rec := range g.recs {
		if rec.HasKey && failedKeys[rec.Key] {
			continue
		}
		err := g.errs[i]
		if err == nil {
			outcomes = append(outcomes, outbox.Outcome{ID: rec.ID, Kind: outbox.Sent, Destination: d.Name})
			dev.sent++
			if len(g.pauses) > 0 {
				if _, ok := g.pauses[subject{rec.Topic, wholeTopic}]; ok {
					about(subject{rec.Topic, wholeTopic}).sent++
				}
				if part, ok := g.parts[i]; ok {
					about(subject{rec.Topic, part}).sent++
				}
			}
			if rec.RetryCount > 0 {
				retriesSent++
			} else {
				firsts++
			}
			continue
		}
		if rec.HasKey {
			failedKeys[rec.Key] = true
		}
		if abandoned || errors.Is(err, retry.ErrNotSent) {
			// Shutting down: an interrupted publish counts nothing. Not
			// sent: the row waits for its key's failed row. Either way a
			// retry's budget is given back.
			if rec.RetryCount > 0 {
				refunds++
			}
			continue
		}
		if rec.RetryCount == 0 {
			firsts++
		}
		ce := retry.Classify(err)
		ev, paused, scoped := &dev, subject{}, false
		if ce.Class != retry.ClassPermanent {
			switch ce.Scope {
			case retry.ScopeTopic:
				paused, scoped = subject{rec.Topic, wholeTopic}, true
			case retry.ScopePartition:
				paused, scoped = subject{rec.Topic, ce.Partition}, true
				if ce.Partition < 0 { // the sink did not say which: the topic
					paused.partition = wholeTopic
				}
			}
		}
		if scoped {
			ev = about(paused)
		}
		switch {
		case ce.Class == retry.ClassPermanent || ce.Scope == retry.ScopeRecord:
			ev.rowFailed = append(ev.rowFailed, rec.ID)
		case ce.Class == retry.ClassSystemic:
			ev.systemic++
		default:
			ev.transient++
		}
		ev.lastErr = err.Error()
		dec := r.cfg.Policy.Decide(retry.Failure{
			Err:       err,
			Attempt:   rec.RetryCount,
			Age:       g.claimed.Sub(rec.CreatedAt) + elapsed,
			PrevDelay: rec.LastDelay,
		})
		o := outbox.Outcome{ID: rec.ID, Error: ev.lastErr, Class: ce.Class.String(), Attempted: true, Destination: d.Name}
		switch dec.Action {
		case retry.Retry:
			o.Kind, o.Delay = outbox.Retried, dec.Delay
		case retry.Defer:
			o.Kind, o.Reason = outbox.Deferred, DeferDestinationFailing
			if scoped {
				o.Reason = DeferTopicPaused
				if paused.partition != wholeTopic {
					o.Reason = DeferPartitionPaused
				}
				if pausedBy == nil {
					pausedBy = map[int]subject{}
				}
				pausedBy[len(outcomes)] = paused
			}
		case retry.DeadLetter:
			o.Kind, o.Reason = outbox.DeadLettered, dec.Reason
			o.ParkKey = d.block && rec.HasKey
			if rec.HasKey && !d.block {
				delete(failedKeys, rec.Key) // released: the key's next row may go
			}
			r.log.Warn("row dead-lettered", slog.Int64("id", rec.ID), slog.String("topic", rec.Topic),
				slog.String("destination", d.Name), slog.String("reason", dec.Reason),
				slog.Int("attempts", rec.RetryCount+1), slog.String("error", o.Error))
		}
		outcomes = append(outcomes, o)
	}
	now := time.Now()
	if abandoned {
		d.budget.earn(now, 0, refunds)
		g.abandonProbes()
		return outcomes
	}
	d.budget.earn(now, firsts, retriesSent+refunds)
	cooldown := d.breaker.result(now, g.gen, dev, g.probe)
	// A pause's probe whose rows were all held behind their keys says
	// nothing: another goes.
	for s, a := range g.pauses {
		if _, seen := sev[s]; !seen && a.probe {
			d.pauses.abandoned(s, a.gen)
		}
	}
	var pausedFor map[subject]time.Duration
	for s, ev := range sev {
		a, tracked := g.pauses[s]
		left := d.pauses.result(now, s, tracked, a.gen, a.probe, *ev)
		if pausedFor == nil {
			pausedFor = map[subject]time.Duration{}
		}
		pausedFor[s] = left
	}
	for i := range outcomes {
		if outcomes[i].Kind != outbox.Deferred {
			continue
		}
		wait := cooldown
		if s, ok := pausedBy[i]; ok {
			wait = pausedFor[s]
		}
		if wait == 0 {
			wait = r.cfg.PauseBase // a stale systemic failure: look again soon
		}
		outcomes[i].Delay = wait
	}
	return outcomes
}

// observe tells the observer of written-back outcomes, and of rows the
// claim deferred behind a waiting row of their key.
func (r *Relay) observe(outcomes []outbox.Outcome, groups []*group, deferredByClaim int) {
	if r.obs == nil {
		return
	}
	for range deferredByClaim {
		r.obs.Settled("", outbox.Deferred, DeferKeyWaiting, 0)
	}
	var lag map[int64]time.Duration
	for _, g := range groups {
		acked := g.acked()
		for _, rec := range g.recs {
			if lag == nil {
				lag = make(map[int64]time.Duration, len(outcomes))
			}
			lag[rec.ID] = acked.Sub(rec.CreatedAt)
		}
	}
	for _, o := range outcomes {
		switch o.Kind {
		case outbox.Leased: // told when its delivery is done
		case outbox.Sent:
			r.obs.Settled(o.Destination, o.Kind, "", max(lag[o.ID], 0))
		default:
			r.obs.Settled(o.Destination, o.Kind, o.Reason, 0)
		}
	}
}

func (r *Relay) count(outcomes []outbox.Outcome, deferredByClaim int) {
	r.deferred.Add(int64(deferredByClaim))
	for _, o := range outcomes {
		switch o.Kind {
		case outbox.Sent:
			r.delivered.Add(1)
		case outbox.Retried:
			r.retried.Add(1)
		case outbox.Deferred:
			r.deferred.Add(1)
		case outbox.DeadLettered:
			r.deadLettered.Add(1)
		}
	}
}

// cleanup deletes sent rows and dead letters past their retention, in
// bounded batches, on one replica at a time.
func (r *Relay) cleanup(ctx context.Context) error {
	t := time.NewTicker(r.cfg.CleanupInterval)
	defer t.Stop()
	type task struct {
		what      string
		retention time.Duration
		delete    func(context.Context, time.Duration, int) (int64, bool, error)
	}
	var tasks []task
	if r.cfg.SentRetention > 0 {
		tasks = append(tasks, task{"sent rows", r.cfg.SentRetention, r.cfg.Store.DeleteSent})
	}
	if r.cfg.DeadLetterRetention > 0 {
		tasks = append(tasks, task{"dead letters", r.cfg.DeadLetterRetention, r.cfg.Store.DeleteExpiredDeadLetters})
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, tk := range tasks {
			total := int64(0)
			for ctx.Err() == nil {
				batchCtx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
				n, busy, err := tk.delete(batchCtx, tk.retention, DefaultCleanupBatch)
				cancel()
				if err != nil {
					if ctx.Err() == nil {
						r.log.Error("cleanup failed", slog.String("rows", tk.what), slog.Any("error", err))
					}
					break
				}
				total += n
				if busy || n < DefaultCleanupBatch {
					break
				}
			}
			if total > 0 {
				r.log.Info("deleted rows past retention", slog.String("rows", tk.what), slog.Int64("deleted", total))
			}
		}
	}
}

// avoidKeys are keys a worker recently found in flight elsewhere (a hot key
// another worker is delivering). While another worker of this relay still
// has them in flight, the worker does not claim them: it could only lock
// their rows and skip them, and its locks would make the deliverer's next
// claim skip them too. Avoidance ends with the other worker's batch, so two
// workers never avoid a key at once.
type avoidKeys map[string]time.Time

const (
	avoidFor      = time.Second
	avoidMaxItems = 64
)

func (a avoidKeys) add(keys []string, now time.Time) {
	for _, k := range keys {
		if len(a) >= avoidMaxItems {
			return
		}
		a[k] = now.Add(avoidFor)
	}
}

func (a avoidKeys) keys(now time.Time) []string {
	var out []string
	for k, until := range a {
		if now.After(until) {
			delete(a, k)
			continue
		}
		out = append(out, k)
	}
	return out
}

// inflightKeys records the batches in flight and who delivers each, so a
// worker can tell which of the few keys it avoids another one holds. A
// batch is registered whole rather than key by key: a map entry per key,
// made and removed for every row, cost more than the rare look-ups that
// scan the batches.
type inflightKeys struct {
	mu      sync.Mutex
	next    inflightID
	batches map[inflightID]inflightBatch
}

// inflightID names a batch registered in flight.
type inflightID int64

type inflightBatch struct {
	owner int
	recs  []outbox.Record
}

// add registers recs in flight under owner until remove is called with
// the id it returns.
func (f *inflightKeys) add(owner int, recs []outbox.Record) inflightID {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	if len(recs) > 0 {
		if f.batches == nil {
			f.batches = map[inflightID]inflightBatch{}
		}
		f.batches[f.next] = inflightBatch{owner: owner, recs: recs}
	}
	return f.next
}

func (f *inflightKeys) remove(id inflightID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.batches, id)
}

// elsewhere returns those of keys that another owner than worker has in
// flight, in their order.
func (f *inflightKeys) elsewhere(worker int, keys []string) []string {
	if len(keys) == 0 {
		return nil
	}
	found := make(map[string]bool, len(keys))
	for _, k := range keys {
		found[k] = false
	}
	f.mu.Lock()
	for _, b := range f.batches {
		if b.owner == worker {
			continue
		}
		for i := range b.recs {
			if r := &b.recs[i]; r.HasKey {
				if _, asked := found[r.Key]; asked {
					found[r.Key] = true
				}
			}
		}
	}
	f.mu.Unlock()
	out := keys[:0]
	for _, k := range keys {
		if found[k] {
			out = append(out, k)
		}
	}
	return out
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// dest is a destination with its breaker, paused topics and partitions,
// bulkhead and retry budget.
type dest struct {
	Destination
	block   bool
	breaker *breaker
	pauses  *pauseSet
	parts   Partitioner // nil: partitions are not known
	bulk    bulkhead
	budget  *retryBudget
}

func (r *Relay) newDest(d Destination) *dest {
	if d.OnDeadLetter == "" {
		d.OnDeadLetter = r.cfg.OnDeadLetter
	}
	if d.Breaker.Failures == 0 {
		d.Breaker.Failures = DefaultBreakerFailures
	}
	if d.Breaker.Successes == 0 {
		d.Breaker.Successes = DefaultBreakerSuccesses
	}
	if d.Breaker.FailingRows == 0 {
		d.Breaker.FailingRows = DefaultBreakerFailingRows
	}
	if d.Breaker.FailingFor == 0 {
		d.Breaker.FailingFor = DefaultBreakerFailingFor
	}
	if d.Partitioner == nil {
		d.Partitioner, _ = d.Publisher.(Partitioner)
	}
	if d.VisibilityTimeout > 0 {
		// Leased deliveries outlive their batch: bound them as the
		// workers' batches are, so memory stays bounded.
		if limit := r.cfg.Workers * r.cfg.BatchSize; d.MaxInFlight == 0 || d.MaxInFlight > limit {
			d.MaxInFlight = limit
		}
	}
	x := &dest{
		Destination: d,
		block:       d.OnDeadLetter == OnDeadLetterBlock,
		bulk:        bulkhead{max: d.MaxInFlight},
		budget:      newRetryBudget(d.RetryBudget),
	}
	log := r.log.With(slog.String("destination", d.Name))
	x.parts = d.Partitioner
	x.pauses = newPauseSet(d.Name, r.cfg.PauseBase, r.cfg.PauseMax, log)
	x.breaker = &breaker{failures: d.Breaker.Failures, successes: d.Breaker.Successes,
		failingRows: d.Breaker.FailingRows, failingFor: d.Breaker.FailingFor, base: r.cfg.PauseBase, max: r.cfg.PauseMax,
		onChange: func(from, to BreakerState, cooldown time.Duration, lastErr string) {
			switch to {
			case BreakerOpen:
				log.Warn("destination failing; circuit opened, its rows wait without counting attempts",
					slog.Duration("cooldown", cooldown), slog.String("error", lastErr))
			case BreakerHalfOpen:
				log.Info("circuit half-open; probing the destination")
			case BreakerClosed:
				log.Info("destination recovered; circuit closed")
			}
		}}
	return x
}

// closedTopics returns the known topics whose rows no destination takes
// now (its breaker open or probing, its bulkhead full, or the topic
// paused), and how long the earliest of them stays so.
func (r *Relay) closedTopics(now time.Time) ([]string, time.Duration) {
	var closed map[int]bool
	var paused map[int]map[string]bool
	var soonest time.Duration
	shut := func(left time.Duration) {
		if soonest == 0 || left < soonest {
			soonest = left
		}
	}
	for i, d := range r.dests {
		blocked, until := d.breaker.blocked(now)
		if !blocked && d.bulk.full() {
			blocked, until = true, now.Add(bulkheadRecheck)
		}
		if blocked {
			if closed == nil {
				closed = map[int]bool{}
			}
			closed[i] = true
			shut(until.Sub(now))
			continue
		}
		topics, left := d.pauses.blockedTopics(now)
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
	if closed == nil && paused == nil {
		return nil, 0
	}
	return r.router.topicsOf(func(rt routing) bool { return closed[rt.dest] || paused[rt.dest][rt.topic] }), soonest
}

// bulkheadRecheck is how long rows behind a row of a destination with a
// full bulkhead wait: deliveries finish quickly or time out.
const bulkheadRecheck = 100 * time.Millisecond

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

// DestinationStatus is a destination's state, for readiness and metrics.
type DestinationStatus struct {
	Name    string
	Breaker BreakerState
	// OpenUntil is when an open breaker lets a probe through.
	OpenUntil time.Time
	// Paused are the destination's paused topics and partitions.
	Paused []PauseStatus
}

// Destinations reports the state of every destination.
func (r *Relay) Destinations() []DestinationStatus {
	out := make([]DestinationStatus, 0, len(r.dests))
	for _, d := range r.dests {
		state, until := d.breaker.snapshot()
		st := DestinationStatus{Name: d.Name, Breaker: state, Paused: d.pauses.status()}
		if state == BreakerOpen {
			st.OpenUntil = until
		}
		out = append(out, st)
	}
	return out
}

// leasedOwner owns, in the in-flight registry, the keys of leased
// deliveries: every worker leaves them out of its claims.
const leasedOwner = -1

// deliverLeased delivers a leased group outside any transaction and
// writes the outcomes back where the lease still holds.
func (r *Relay) deliverLeased(inflight context.Context, g *group, expiry map[int64]time.Time) {
	defer r.leased.Done()
	defer g.d.bulk.give(len(g.recs))
	r.publish(inflight, []*group{g})
	abandoned := inflight.Err() != nil
	outcomes := r.decide(g, abandoned)
	decided := make(map[int64]bool, len(outcomes))
	for _, o := range outcomes {
		decided[o.ID] = true
	}
	var unsent []outbox.Outcome
	var keys []outbox.LeasedWork
	seenKey := map[string]bool{}
	for _, rec := range g.recs {
		if !decided[rec.ID] {
			unsent = append(unsent, outbox.Outcome{ID: rec.ID})
		}
		if rec.HasKey && !seenKey[rec.Key] {
			seenKey[rec.Key] = true
			keys = append(keys, outbox.LeasedWork{Key: rec.Key, FirstID: rec.ID, Until: expiry[rec.ID]})
		}
	}
	for i := range outcomes {
		outcomes[i].Token = g.token
	}
	for i := range unsent {
		unsent[i].Token = g.token
	}
	// Other workers may claim these keys again: their rows stay behind the
	// leased ones until the write-back below, which then makes them ready.
	r.inflight.remove(g.inflight)
	ctx, cancel := r.writeBackContext(inflight)
	defer cancel()
	// Only outcomes written back count: a row whose lease ran out and was
	// taken by another delivery is counted by that one.
	done, err := r.cfg.Store.CompleteLeased(ctx, outcomes, unsent, keys)
	if err != nil {
		// The leases run out and the rows are delivered again.
		r.log.Error("leased write-back failed; the rows are delivered again when their lease ends",
			slog.String("destination", g.d.Name), slog.Int("rows", len(g.recs)), slog.Any("error", err))
		return
	}
	if lost := len(outcomes) - len(done); lost > 0 {
		r.log.Warn("leases ran out before their write-back and another delivery took the rows; keep visibility_timeout well above the destination's timeout",
			slog.String("destination", g.d.Name), slog.Int("rows", lost))
	}
	r.count(done, 0)
	r.observe(done, []*group{g}, 0)
	r.wakeAll()
}
