package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/internal/problems"
	"github.com/outbox-relay/outbox-relay/relay/logsource"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Outbox is one outbox table a relay delivers from: a schema in a
// database. A relay with several serves each with workers, a listener and
// maintenance of its own, and shares its destinations, routes and worker
// budget between them.
type Outbox struct {
	// Name identifies the outbox in logs, metrics and readiness: letters,
	// digits, '_' and '-'. Required.
	Name string `koanf:"name"`
	// Store claims the outbox's rows and writes outcomes back. Required.
	Store *store.Store `koanf:"-"`
	// Listener wakes the outbox's workers when rows are inserted; without
	// one they only poll.
	Listener *store.Listener `koanf:"-"`
	// Log, for an outbox captured from the write-ahead log, streams its
	// messages (on the replica that holds its slot); its workers deliver
	// them beside the rows that wait in the table. Nil: the table only.
	Log *logsource.Source `koanf:"-"`
	// Observer is told of the outbox's claims and outcomes. Default the
	// relay's Observer.
	Observer Observer `koanf:"-"`
	// Workers is the most batches of this outbox delivered at once.
	// Default the relay's Workers, which bounds all outboxes together.
	Workers int `koanf:"workers"`
	// BatchSize is the most rows claimed per batch. Default the relay's.
	BatchSize int `koanf:"batch_size"`
	// OrderScope is where the outbox's keys keep their order:
	// destination, topic or global (see Config.OrderScope). Default the
	// relay's.
	OrderScope string `koanf:"order_scope"`
	// Capture is where the outbox's messages come from: table or log
	// (see Config.Capture); Log streams them for log. Default the
	// relay's.
	Capture string `koanf:"capture"`
	// Prepare, when set, runs before the outbox's workers, listener and
	// cleaner start, while the other outboxes already deliver: it waits
	// for what the outbox needs (its database, its schema) until ctx
	// ends, and returns an error only for what waiting cannot fix, which
	// stops the relay.
	Prepare func(ctx context.Context) error `koanf:"-"`
}

// DefaultOutbox names the outbox of a relay configured with a Store
// rather than Outboxes.
const DefaultOutbox = "default"

var outboxName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)

// ValidateOutboxName checks an outbox's name, which labels its metrics
// and names it in API paths.
func ValidateOutboxName(name string) error {
	if !outboxName.MatchString(name) {
		return fmt.Errorf("name %q: use letters, digits, '_' and '-'", name)
	}
	return nil
}

// ValidateSettings reports every problem of o's settings (name,
// workers, batch_size, order_scope), one per line, each starting with the
// setting's name. 0 takes the relay's.
func (o *Outbox) ValidateSettings() error {
	var errs []error
	if o.Name == "" {
		errs = append(errs, errors.New("name is required"))
	} else if err := ValidateOutboxName(o.Name); err != nil {
		errs = append(errs, err)
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"workers", o.Workers}, {"batch_size", o.BatchSize}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("%s is %d; it must not be negative (0 takes the relay's)", n.name, n.v))
		}
	}
	if err := batchSizeProblem(o.BatchSize); err != nil {
		errs = append(errs, err)
	}
	if err := ValidateOrderScope(o.OrderScope); err != nil {
		errs = append(errs, err)
	}
	if err := ValidateCapture(o.Capture); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validate reports every problem of o.
func (o *Outbox) validate() []error {
	errs := problems.Errors(fmt.Sprintf("relay: outbox %s: ", cmp.Or(o.Name, "(unnamed)")), o.ValidateSettings())
	if o.Store == nil {
		errs = append(errs, fmt.Errorf("relay: outbox %s needs a store", o.Name))
	}
	return errs
}

// source is an outbox at work: its workers, leased deliveries, cleaner,
// and the keys it has in flight. Outboxes are separate tables, so none of
// this is shared between them.
type source struct {
	r         *Relay
	index     int // in Relay.sources and turns
	prepare   func(context.Context) error
	name      string
	store     *store.Store
	rows      RowSource // where its workers take rows: the store's claims
	listener  *store.Listener
	log       *slog.Logger
	batchSize int
	workers   []*worker
	leases    *leaser
	cleaner   *cleaner
	inflight  inflightKeys
	sqlBusy   atomic.Int32 // claims and write-backs under way
	pace      pace
	on        atomic.Int32 // workers taking batches (see worker.takesBatches)
	tally     tally
	// scope names a topic's order scope (see store.ClaimParams), nil
	// for order across every topic.
	scope func(topic string) string
	ready atomic.Bool // prepared, its workers started
	// The outbox's services (see service): the renewal of its share of
	// the partitions, whether its last renewal failed (its loop's alone),
	// its listener and its cleaner.
	partitions, listening, cleaning *service
	partsFailing                    bool
	resync                          chan struct{} // another process changed the partitions' share
	// releasing makes ready the rows a destination held while it was
	// down, once it answers again; release says there are some.
	releasing *service
	release   chan struct{}
	// capture streams the outbox's messages from the write-ahead log, on
	// the replica that holds its slot; nil for the table only.
	capture   *logsource.Source
	capturing *service
}

func newSource(r *Relay, index int, o Outbox) *source {
	cfg := &r.cfg
	s := &source{r: r, index: index, prepare: o.Prepare, name: o.Name, store: o.Store, rows: tableRows{o.Store}, listener: o.Listener, log: r.log,
		capture:   o.Log,
		batchSize: o.BatchSize, tally: tally{obs: o.Observer}, resync: make(chan struct{}, 1), release: make(chan struct{}, 1)}
	if len(cfg.Outboxes) > 1 {
		s.log = r.log.With(slog.String("outbox", o.Name))
	}
	s.tally.log = s.log
	if s.batchSize == 0 {
		s.batchSize = cfg.BatchSize
	}
	s.scope = r.planner.router.scope(cmp.Or(o.OrderScope, cfg.OrderScope))
	if s.tally.obs == nil {
		s.tally.obs = cfg.Observer
	}
	workers := o.Workers
	if workers == 0 {
		workers = cfg.Workers
	}
	for i := range workers {
		s.workers = append(s.workers, newWorker(s, i))
	}
	s.leases = &leaser{store: o.Store, inflight: &s.inflight, tally: &s.tally, log: s.log, written: &r.leaseWritten,
		publishTimeout: cfg.PublishTimeout, queryTimeout: cfg.QueryTimeout, wake: s.wakeAll}
	s.cleaner = &cleaner{store: o.Store, log: s.log, signals: &r.cleaned, config: cleanerConfig{
		SentRetention: cfg.SentRetention, DeadLetterRetention: cfg.DeadLetterRetention,
		DiscardedRetention: cfg.DiscardedRetention, AuditRetention: cfg.AuditRetention,
		Interval: cfg.CleanupInterval, Timeout: cfg.QueryTimeout, BatchSize: DefaultCleanupBatch,
	}}
	s.partitions = newService("partitions", s.renewPartitions)
	s.listening = newService("listener", func(ctx context.Context) error {
		return s.listener.Run(ctx, s.wakeAll, s.resyncSoon)
	})
	s.cleaning = newService("cleaner", s.cleaner.run)
	s.releasing = newService("releaser", s.releaseHeld)
	if o.Log != nil {
		rows := &logRows{tableRows: tableRows{o.Store}, log: o.Log, poll: cfg.PollInterval}
		s.rows = rows
		s.capturing = newService("capture", func(ctx context.Context) error { return o.Log.Run(ctx, s.wakeAll) })
		// A notification says the table has new rows: the log's, written
		// into it, or a producer's.
		s.listening = newService("listener", func(ctx context.Context) error {
			return s.listener.Run(ctx, func() { rows.notified.Store(true); s.wakeAll() }, s.resyncSoon)
		})
	}
	return s
}

// run runs the outbox's workers in g until ctx ends, once it is
// prepared, and starts its services; publishes use inflight.
func (s *source) run(g *errgroup.Group, ctx, inflight context.Context, fails *failures) {
	if s.prepare != nil {
		g.Go(func() error {
			if err := s.prepare(ctx); err != nil {
				if ctx.Err() != nil {
					return nil // stopped while preparing
				}
				return fmt.Errorf("outbox %s: %w", s.name, err)
			}
			if ctx.Err() == nil {
				s.start(g, ctx, inflight, fails)
			}
			return nil
		})
		return
	}
	s.start(g, ctx, inflight, fails)
}

func (s *source) start(g *errgroup.Group, ctx, inflight context.Context, fails *failures) {
	// The first sync comes before the first claim, which takes no rows
	// without partitions. The share is renewed until the last delivery is
	// written back, after ctx ends (see stop).
	s.partsFailing = s.syncPartitions(ctx, false)
	s.partitions.start(context.WithoutCancel(ctx), fails)
	s.ready.Store(true)
	for _, w := range s.workers {
		g.Go(func() error { return w.run(ctx, inflight) })
	}
	if s.listener != nil {
		s.listening.start(ctx, fails)
	}
	if s.cleaner.enabled() {
		s.cleaning.start(ctx, fails)
	}
	s.releasing.start(ctx, fails)
	if s.capture != nil {
		// Stopped after the workers (see stop), so that the position of
		// their last settled messages is confirmed.
		s.capturing.start(context.WithoutCancel(ctx), fails)
	}
}

// stop stops the outbox's services once its workers have ended: its
// listener and cleaner, then, after its leased deliveries, the renewal of
// its partitions, which it gives up for the other processes to take at
// once.
func (s *source) stop(ctx context.Context) {
	s.listening.stop()
	s.cleaning.stop()
	s.releasing.stop()
	if s.capture != nil {
		s.capturing.stop()
	}
	s.leases.stop()
	if s.partitions.stop(); s.ready.Load() {
		s.leavePartitions(ctx)
	}
}

// renewPartitions renews the outbox's share of its partitions, and looks
// below its floor now and then, until ctx ends.
func (s *source) renewPartitions(ctx context.Context) error {
	t := time.NewTicker(store.ClaimSyncEvery)
	defer t.Stop()
	sweep := time.NewTimer(store.SweepEvery)
	defer sweep.Stop()
	// While it has partitions to give up, it syncs again as soon as the
	// claims reading them may have ended.
	soon := time.NewTimer(givingEvery)
	if s.store.Share().Giving == 0 {
		soon.Stop()
	}
	defer soon.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.resync:
		case <-soon.C:
		case <-sweep.C:
			sweep.Reset(s.sweepBelowFloor(ctx))
			continue
		}
		s.partsFailing = s.syncPartitions(ctx, s.partsFailing)
		if s.store.Share().Giving > 0 {
			soon.Reset(givingEvery)
		}
	}
}

// givingEvery is how soon a process syncs again while it holds partitions
// to give up: about a batch's publish.
const givingEvery = 20 * time.Millisecond

// resyncSoon has the partitions synced now: another process joined, left
// or gave partitions up.
func (s *source) resyncSoon() {
	select {
	case s.resync <- struct{}{}:
	default:
	}
}

// syncPartitions renews the outbox's share of its partitions, and reports
// whether it failed; a failure is logged when the last sync did not fail.
// Workers are woken when the share grows.
func (s *source) syncPartitions(ctx context.Context, failing bool) bool {
	before := s.store.Share()
	sctx, cancel := context.WithTimeout(ctx, s.r.cfg.QueryTimeout)
	err := s.store.SyncPartitions(sctx)
	cancel()
	switch {
	case err != nil && ctx.Err() != nil:
		return failing
	case err != nil:
		if !failing {
			s.log.Warn("cannot renew this process's share of the outbox's partitions; its claims stop when the lease ends", slog.Any("error", err))
		}
		return true
	case failing:
		s.log.Info("this process's share of the outbox's partitions is renewed again")
	}
	after := s.store.Share()
	if after.Leased && after.Claimers != before.Claimers {
		s.log.Info("the outbox's partitions are shared anew", slog.Int("claimers", after.Claimers))
	}
	if after.Lo <= after.Hi && (before.Lo > before.Hi || after.Lo < before.Lo || after.Hi > before.Hi) {
		s.wakeAll() // its claims read partitions they did not
	}
	return false
}

// sweepBelowFloor looks for rows given ids below those delivered, which
// claims that read from their floor do not see.
// It returns when to look again: SweepEvery, or later when the look was
// long, so that it never costs the database more than 1/sweepShare of
// a backend. A look reads every index entry below the floor, and a
// snapshot held elsewhere keeps those of delivered rows: held for hours,
// they are millions.
func (s *source) sweepBelowFloor(ctx context.Context) time.Duration {
	sctx, cancel := context.WithTimeout(ctx, s.r.cfg.QueryTimeout)
	began := time.Now()
	found, err := s.store.SweepBelowFloor(sctx)
	took := time.Since(began)
	cancel()
	switch {
	case err != nil && ctx.Err() == nil:
		s.log.Debug("looking below the floor failed; trying again later", slog.Any("error", err))
	case found:
		s.log.Warn("found a pending row with an id below those already delivered (given by its producer?): delivering it now; its key's later rows may have gone first")
		s.wakeAll()
	}
	return max(store.SweepEvery, took*sweepShare)
}

// sweepShare bounds what looking below the floor costs: a look that took
// a second is not repeated within sweepShare seconds.
const sweepShare = 500

// leavePartitions gives up the outbox's partitions, after its last
// delivery, for the other processes to take at once.
func (s *source) leavePartitions(ctx context.Context) {
	lctx, cancel := writeBackContext(ctx, s.r.cfg.QueryTimeout)
	defer cancel()
	if err := s.store.LeavePartitions(lctx); err != nil {
		s.log.Warn("could not give up the outbox's partitions; the others take them when the lease ends", slog.Any("error", err))
	}
}

// releaseSoon asks the releaser to look for released rows.
func (s *source) releaseSoon() {
	select {
	case s.release <- struct{}{}:
	default:
	}
}

// releaseHeld makes ready at once, until ctx ends, the outbox's rows that
// a destination held while it, a topic or a partition of it was down,
// once that answers again. The rows every destination released are made
// ready together, in one statement; rows in batches under way are made
// ready by those batches' write-backs (see store.ReleaseHeld). Best
// effort: rows it cannot release wait for the end of their deferral, as
// they would without it.
func (s *source) releaseHeld(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.release:
		}
		var rows []store.HeldRow
		var names []string
		for _, d := range s.r.dests {
			if held := d.Released(s); len(held) > 0 {
				rows = append(rows, held...)
				names = append(names, d.Name)
			}
		}
		if len(rows) == 0 {
			continue
		}
		// Two statements: the release, and the pull forward after it.
		qctx, cancel := context.WithTimeout(ctx, 2*s.r.cfg.QueryTimeout)
		n, err := s.rows.ReleaseHeld(qctx, rows)
		cancel()
		dests := slog.String("destination", strings.Join(names, ","))
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Warn("rows held while their destination was down wait for the end of their deferral: releasing them failed",
				dests, slog.Int("rows", len(rows)), slog.Any("error", err))
		case n > 0:
			s.log.Info("rows held while their destination was down go now", dests, slog.Int64("rows", n))
			s.wakeAll()
		}
	}
}

// wakeAll nudges every idle worker of the outbox.
func (s *source) wakeAll() {
	for _, w := range s.workers {
		w.nudge()
	}
}

// askHelp nudges the idle workers of the outbox to claim beside a
// worker that found a full batch, but not those held off: their last
// claim found only rows of keys in flight elsewhere.
func (s *source) askHelp() {
	now := time.Now().UnixNano()
	for _, w := range s.workers {
		if w.heldOff.Load() <= now {
			w.nudge()
		}
	}
}

// batchFailed reports a batch that failed as a whole, which only the
// database does: a failure the relay waits out (out of connections, a
// timeout, a read-only server after a failover) with what it means, and
// with fresh connections when the old ones lead to a server that cannot
// take the relay's writes.
func (s *source) batchFailed(worker int, err error, retryIn time.Duration) {
	p, ok := store.ExplainDBError(err)
	if !ok {
		s.log.Error("batch failed", slog.Int("worker", worker), slog.Any("error", err), slog.Duration("retry_in", retryIn))
		return
	}
	s.log.Warn("database: "+p.Hint, slog.String("problem", p.Kind), slog.Int("worker", worker), slog.Any("error", err),
		slog.Duration("query_timeout", s.r.cfg.QueryTimeout), slog.Duration("retry_in", retryIn))
	if p.Reconnect {
		s.store.Reconnect()
	}
}

// outboxes returns the outboxes of c: Outboxes, or one named DefaultOutbox
// made of Store, Listener and Observer.
func (c *Config) outboxes() []Outbox {
	if len(c.Outboxes) > 0 || c.Store == nil {
		return c.Outboxes
	}
	return []Outbox{{Name: DefaultOutbox, Store: c.Store, Listener: c.Listener, Observer: c.Observer}}
}

// largestBatch is the most rows one batch of any of c's outboxes holds:
// the relay's Workers bound the batches of all outboxes together.
func (c *Config) largestBatch() int {
	n := 0
	for _, o := range c.outboxes() {
		n = max(n, cmp.Or(o.BatchSize, c.BatchSize))
	}
	return n
}

// outboxProblems reports every problem of c's outboxes.
func (c *Config) outboxProblems() []error {
	if c.Store != nil && len(c.Outboxes) > 0 {
		return []error{errors.New("relay: give a store or outboxes, not both")}
	}
	all := c.outboxes()
	if len(all) == 0 {
		return []error{errors.New("relay: a store or outboxes are required")}
	}
	var errs []error
	seen := map[string]bool{}
	for i := range all {
		errs = append(errs, all[i].validate()...)
		if seen[all[i].Name] {
			errs = append(errs, fmt.Errorf("relay: outbox %s is defined twice", all[i].Name))
		}
		seen[all[i].Name] = true
	}
	return errs
}

// OutboxStatus is what an outbox's workers are doing.
type OutboxStatus struct {
	Name string
	// Started reports that the outbox is prepared and its workers run.
	Started bool
	Stats   Stats
}

// Outboxes reports what the relay has done per outbox, in the order of
// Config.Outboxes.
func (r *Relay) Outboxes() []OutboxStatus {
	out := make([]OutboxStatus, 0, len(r.sources))
	for _, s := range r.sources {
		out = append(out, OutboxStatus{Name: s.name, Started: s.ready.Load(), Stats: s.tally.stats()})
	}
	return out
}
