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

	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay/retry"
)

// Publisher delivers records to a destination. Publish returns one error
// per record, nil for each record the destination acknowledged. Errors are
// classified with the retry package; unclassified errors are transient.
// Records sharing a key are given in id order and must be delivered in that
// order: after a record fails, a Publisher must not send the later records
// of its key, and reports them with retry.ErrNotSent.
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
	DefaultWriteTimeout    = 30 * time.Second
	DefaultCleanupInterval = time.Minute
	DefaultCleanupBatch    = 5000
	DefaultPauseBase       = time.Second
	DefaultPauseMax        = 30 * time.Second

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
	// Publisher delivers the rows. Required.
	Publisher Publisher
	// Listener wakes the workers when rows are inserted; without one they
	// only poll.
	Listener *outbox.Listener
	// Policy decides what happens to failed rows. Default retry defaults.
	Policy *retry.Policy
	// Logger receives the relay's logs. Default discards.
	Logger *slog.Logger

	// Workers is the number of batches in flight at once. Default 2.
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
	// OnDeadLetter is release (default) or block.
	OnDeadLetter string
	// SentRetention keeps sent rows this long before cleanup; 0 deletes
	// rows as they are sent. It must agree with the Store's KeepSent.
	SentRetention time.Duration
	// CleanupInterval is how often sent rows past their retention are
	// deleted. Default 1m.
	CleanupInterval time.Duration
	// PauseBase and PauseMax bound how long the destination is paused
	// after systemic failures: the pause doubles with each consecutive
	// one. Defaults 1s and 30s.
	PauseBase, PauseMax time.Duration
}

// Validate reports every problem of c at once, or nil.
func (c *Config) Validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("relay: a store is required"))
	}
	if c.Publisher == nil {
		errs = append(errs, errors.New("relay: a publisher is required"))
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
		"pause_base": c.PauseBase, "pause_max": c.PauseMax} {
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

// Stats counts what the relay did. Read it with Relay.Stats.
type Stats struct {
	Batches, Delivered, Retried, Deferred, DeadLettered int64
}

// Relay delivers outbox rows until its context ends.
type Relay struct {
	cfg      Config
	log      *slog.Logger
	pause    pause
	wakes    []chan struct{}
	inflight inflightKeys

	batches, delivered, retried, deferred, deadLettered atomic.Int64
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
	defDur(&cfg.CleanupInterval, DefaultCleanupInterval)
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
	r := &Relay{cfg: cfg, log: cfg.Logger, pause: pause{base: cfg.PauseBase, max: cfg.PauseMax},
		inflight: inflightKeys{owner: map[string]int{}}}
	r.wakes = make([]chan struct{}, cfg.Workers)
	for i := range r.wakes {
		r.wakes[i] = make(chan struct{}, 1)
	}
	return r, nil
}

// Stats returns what the relay has done so far.
func (r *Relay) Stats() Stats {
	return Stats{
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
	if r.cfg.SentRetention > 0 {
		g.Go(func() error { return r.cleanup(listenCtx) })
	}
	r.log.Info("relay started", slog.Int("workers", r.cfg.Workers), slog.Int("batch_size", r.cfg.BatchSize))
	err := g.Wait()
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
// wake-up or the poll interval) only when a batch delivered nothing.
func (r *Relay) work(ctx, inflight context.Context, id int) error {
	poll := time.NewTimer(0)
	defer poll.Stop()
	errDelay := time.Duration(0)
	avoid := avoidKeys{}
	avgRowBytes := 0
	for {
		if ctx.Err() != nil {
			return nil
		}
		if paused, until := r.pause.paused(time.Now()); paused {
			if !sleep(ctx, time.Until(until)) {
				return nil
			}
			continue
		}
		more, err := r.batch(ctx, inflight, id, avoid, &avgRowBytes)
		if err != nil {
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
		if more {
			continue
		}
		poll.Reset(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
			return nil
		case <-r.wakes[id]:
		case <-poll.C:
		}
	}
}

// batch claims and delivers one batch. more reports that it delivered
// something, so the worker should look again before sleeping.
func (r *Relay) batch(ctx, inflight context.Context, worker int, avoid avoidKeys, avgRowBytes *int) (more bool, err error) {
	start := time.Now()
	limit := r.claimLimit(*avgRowBytes)
	claim, err := r.cfg.Store.Claim(ctx, outbox.ClaimParams{
		Limit: limit, PayloadCap: r.cfg.PayloadCap, ExcludeKeys: r.inflight.elsewhere(worker, avoid.keys(start)),
	})
	if err != nil {
		return false, err
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
		*avgRowBytes = total / n
	}
	avoid.add(claim.SkippedKeys, start)
	r.inflight.add(worker, claim.Records)
	defer r.inflight.remove(worker, claim.Records)
	if len(claim.Records) == 0 {
		writeCtx, cancel := writeBackContext(ctx)
		defer cancel()
		if claim.Deferred > 0 {
			r.deferred.Add(int64(claim.Deferred))
			// The claim's rows were rescheduled: look again at once.
			return true, claim.Complete(writeCtx, nil)
		}
		return false, claim.Release(writeCtx)
	}

	block := r.cfg.OnDeadLetter == OnDeadLetterBlock
	pub, outcomes := r.selectPublishable(claim.Records, block)
	var errs []error
	if len(pub) > 0 {
		pctx, cancelPublish := context.WithTimeout(inflight, r.cfg.PublishTimeout)
		errs = r.cfg.Publisher.Publish(pctx, pub)
		cancelPublish()
		if len(errs) != len(pub) {
			err := fmt.Errorf("publisher returned %d results for %d records", len(errs), len(pub))
			errs = make([]error, len(pub))
			for i := range errs {
				errs[i] = err
			}
		}
	}
	abandoned := inflight.Err() != nil
	outcomes = append(outcomes, r.decide(claim, pub, errs, abandoned, block, time.Since(start))...)
	writeCtx, cancel := writeBackContext(ctx)
	defer cancel()
	if err := claim.Complete(writeCtx, outcomes); err != nil {
		return false, err
	}
	r.count(outcomes, claim.Deferred)
	if claim.Claimed == limit && len(pub) > 0 {
		// A full batch: more rows are probably ready than this worker
		// takes; idle workers may help.
		r.wakeAll()
	}
	// Claim again at once after any outcome or rescheduling: rows
	// committed meanwhile may not have notified (one notifier at a time),
	// and a claim that finds nothing is cheap.
	more = len(outcomes) > 0 || claim.Deferred > 0
	r.log.Debug("batch done", slog.Int("claimed", claim.Claimed), slog.Int("published", len(pub)),
		slog.Int("outcomes", len(outcomes)), slog.Duration("duration", time.Since(start)))
	return more, nil
}

// writeBackContext bounds a write-back, detached from ctx: a publish that
// happened is acknowledged even while the relay stops. It starts after the
// publish, so a long publish timeout cannot eat into it.
func writeBackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), DefaultWriteTimeout)
}

// selectPublishable picks the claimed rows to publish now, in id order.
// Undeliverable rows get their dead-letter outcome here. A key's rows travel
// together only while they share a topic, so that a failure on one topic can
// never let a later row of the key through on another; and once the batch's
// byte budget is spent, the remaining rows wait for the next batch.
func (r *Relay) selectPublishable(recs []outbox.Record, block bool) ([]outbox.Record, []outbox.Outcome) {
	type keyRun struct {
		topic   string
		stopped bool
	}
	runs := map[string]*keyRun{}
	pub := make([]outbox.Record, 0, len(recs))
	var outcomes []outbox.Outcome
	bytes := 0
	full := false
	for _, rec := range recs {
		var run *keyRun
		if rec.HasKey {
			run = runs[rec.Key]
			if run == nil {
				run = &keyRun{topic: rec.Topic}
				runs[rec.Key] = run
			}
			if run.stopped || run.topic != rec.Topic {
				run.stopped = true
				continue
			}
		}
		if rec.Undeliverable != "" {
			park := block && rec.HasKey
			outcomes = append(outcomes, outbox.Outcome{ID: rec.ID, Kind: outbox.DeadLettered,
				Reason: rec.UndeliverableReason, Error: rec.Undeliverable, Class: retry.ClassPermanent.String(), ParkKey: park})
			r.log.Warn("row dead-lettered", slog.Int64("id", rec.ID), slog.String("topic", rec.Topic),
				slog.String("reason", rec.UndeliverableReason), slog.String("error", rec.Undeliverable))
			if park {
				run.stopped = true
			}
			continue
		}
		size := recordSize(rec)
		if full || (len(pub) > 0 && bytes+size > r.cfg.MaxBatchBytes) {
			full = true
			if run != nil {
				run.stopped = true
			}
			continue
		}
		bytes += size
		pub = append(pub, rec)
	}
	return pub, outcomes
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

// decide turns publish results into outcomes. After a failure, the later
// rows of the same key get no outcome: they stay as they were, their turn
// comes after the failed row's.
func (r *Relay) decide(claim *outbox.Claim, pub []outbox.Record, errs []error, abandoned, block bool, elapsed time.Duration) []outbox.Outcome {
	outcomes := make([]outbox.Outcome, 0, len(pub))
	failedKeys := map[string]bool{}
	systemic := false
	for i, rec := range pub {
		if rec.HasKey && failedKeys[rec.Key] {
			continue
		}
		err := errs[i]
		if err == nil {
			outcomes = append(outcomes, outbox.Outcome{ID: rec.ID, Kind: outbox.Sent})
			continue
		}
		if rec.HasKey {
			failedKeys[rec.Key] = true
		}
		if abandoned || errors.Is(err, retry.ErrNotSent) {
			// Shutting down: an interrupted publish counts nothing. Not
			// sent: the row waits for its key's failed row.
			continue
		}
		class := retry.Classify(err).Class
		d := r.cfg.Policy.Decide(retry.Failure{
			Err:       err,
			Attempt:   rec.RetryCount,
			Age:       claim.Now.Sub(rec.CreatedAt) + elapsed,
			PrevDelay: rec.LastDelay,
		})
		o := outbox.Outcome{ID: rec.ID, Error: err.Error(), Class: class.String(), Attempted: true}
		switch d.Action {
		case retry.Retry:
			o.Kind, o.Delay = outbox.Retried, d.Delay
		case retry.Defer:
			o.Kind = outbox.Deferred
			systemic = true
		case retry.DeadLetter:
			o.Kind, o.Reason = outbox.DeadLettered, d.Reason
			o.ParkKey = block && rec.HasKey
			if rec.HasKey && !block {
				delete(failedKeys, rec.Key) // released: the key's next row may go
			}
			r.log.Warn("row dead-lettered", slog.Int64("id", rec.ID), slog.String("topic", rec.Topic),
				slog.String("reason", d.Reason), slog.Int("attempts", rec.RetryCount+1), slog.String("error", o.Error))
		}
		outcomes = append(outcomes, o)
	}
	if systemic {
		delay := r.pause.trip(time.Now())
		for i := range outcomes {
			if outcomes[i].Kind == outbox.Deferred {
				outcomes[i].Delay = delay
			}
		}
		r.log.Warn("destination unusable; pausing delivery", slog.Duration("pause", delay), slog.String("error", firstError(outcomes)))
	} else if len(pub) > 0 && len(outcomes) > 0 && !abandoned {
		r.pause.reset()
	}
	return outcomes
}

func firstError(outcomes []outbox.Outcome) string {
	for _, o := range outcomes {
		if o.Kind == outbox.Deferred {
			return o.Error
		}
	}
	return ""
}

func (r *Relay) count(outcomes []outbox.Outcome, deferredByClaim int) {
	r.batches.Add(1)
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

// cleanup deletes sent rows past their retention, in bounded batches, on
// one replica at a time.
func (r *Relay) cleanup(ctx context.Context) error {
	t := time.NewTicker(r.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		total := int64(0)
		for ctx.Err() == nil {
			n, busy, err := r.cfg.Store.DeleteSent(ctx, r.cfg.SentRetention, DefaultCleanupBatch)
			if err != nil {
				if ctx.Err() == nil {
					r.log.Error("cleanup of sent rows failed", slog.Any("error", err))
				}
				break
			}
			total += n
			if busy || n < DefaultCleanupBatch {
				break
			}
		}
		if total > 0 {
			r.log.Info("deleted sent rows past retention", slog.Int64("rows", total))
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

// inflightKeys records which worker has each key in flight.
type inflightKeys struct {
	mu    sync.Mutex
	owner map[string]int
}

func (f *inflightKeys) add(worker int, recs []outbox.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range recs {
		if r.HasKey {
			f.owner[r.Key] = worker
		}
	}
}

func (f *inflightKeys) remove(worker int, recs []outbox.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range recs {
		if r.HasKey && f.owner[r.Key] == worker {
			delete(f.owner, r.Key)
		}
	}
}

// elsewhere returns those of keys that another worker has in flight.
func (f *inflightKeys) elsewhere(worker int, keys []string) []string {
	if len(keys) == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := keys[:0]
	for _, k := range keys {
		if w, ok := f.owner[k]; ok && w != worker {
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

// pause holds delivery after systemic failures, doubling with each
// consecutive one.
type pause struct {
	base, max time.Duration
	mu        sync.Mutex
	until     time.Time
	streak    int
}

func (p *pause) trip(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := retry.Exponential(p.streak, p.base, p.max)
	p.streak++
	if u := now.Add(d); u.After(p.until) {
		p.until = u
	}
	return d
}

func (p *pause) reset() {
	p.mu.Lock()
	p.streak = 0
	p.mu.Unlock()
}

func (p *pause) paused(now time.Time) (bool, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return now.Before(p.until), p.until
}
