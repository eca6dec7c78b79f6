package relay

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/relay/flow"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// worker is one of the relay's delivery loops, with what it keeps between
// batches. Its claims run one at a time, so they share its state without
// a lock.
type worker struct {
	s           *source // the outbox it works on
	r           *Relay  // what the outboxes share
	id          int
	wake        chan struct{}
	owner       int // in the in-flight registry; a batch claimed ahead of another has its owner^1
	avoid       avoidKeys
	avgRowBytes int
	aheadPaused time.Time // no claiming ahead before then
	// heldOff is when the worker, whose last claim found only rows of
	// keys in flight elsewhere, answers calls for help again, as
	// nanoseconds since the Unix epoch (see source.askHelp).
	heldOff atomic.Int64
	// crowded says its last claim came back with a whole batch of rows of
	// a few keys in flight elsewhere, many of each, and nothing else: a
	// hot key's backlog, which a claim that leaves those keys out would
	// read to its end. Until a claim of the worker keeps a row, its claims
	// read a few batches' worth of ids only (see
	// store.ClaimParams.ExcludedSpan).
	crowded atomic.Bool
	// busySince is when the batch under way began, as time since the
	// relay's epoch plus one; 0 while the worker waits (see Relay.Wedged).
	busySince atomic.Int64
	// publishingSince is when its batch under way began publishing (see
	// pace), as time since the relay's epoch plus one; 0 otherwise.
	publishingSince atomic.Int64
	on              bool        // counted in source.on (see takesBatches)
	standing        atomic.Bool // stood by for another worker on
}

func newWorker(s *source, id int) *worker {
	return &worker{s: s, r: s.r, id: id, wake: make(chan struct{}, 1), owner: 2 * id, avoid: avoidKeys{}}
}

// run is the worker's loop: take a batch (claimed, or claimed ahead),
// deliver it, and sleep (until a wake-up or the poll interval) only when a
// batch delivered nothing. While a backlog lasts, it claims its next batch
// while it delivers the current one (see claimAhead), so the database does
// not wait on the destination.
func (w *worker) run(ctx, inflight context.Context) error {
	var p pipeline
	poll := time.NewTimer(0)
	defer poll.Stop()
	defer func() {
		if p.ahead != nil {
			w.dropAhead(ctx, &p)
		}
	}()
	defer w.busySince.Store(0)
	defer w.turnOff()
	for ctx.Err() == nil {
		if p.ahead == nil && !w.takesBatches() {
			// Stand by: the database bounds the outbox (see pace).
			if !w.idle(ctx, time.Time{}, poll) {
				return nil
			}
			continue
		}
		w.busySince.Store(int64(time.Since(w.r.epoch)) + 1)
		t, held := w.next(ctx, &p)
		more, err := false, t.err
		if err == nil {
			more, err = w.work(ctx, inflight, t, &p)
			more = more || held
		}
		if err != nil {
			if !w.backOff(ctx, &p, err) {
				return nil
			}
			continue
		}
		p.errDelay = 0
		// A batch claimed ahead says nothing about the backlog: the one
		// before it was full.
		if more || p.ahead != nil || t.ahead {
			continue
		}
		w.noteIdle(t)
		w.turnOff()
		if !w.idle(ctx, t.rows.HeldSince, poll) {
			return nil
		}
	}
	return nil
}

// pipeline is what the worker's loop carries from one batch to the next.
type pipeline struct {
	ahead chan taken // the next batch, being claimed
	// followed is the batch that the one claimed ahead follows: it stays
	// in flight until that claim is in, so that its keys never seem free
	// to the other workers between the two batches.
	followed inflightID
	unsent   keySet // keys of the last batch delivered not all sent
	errDelay time.Duration
}

// next is the batch to deliver: the one claimed ahead, less the rows of
// keys the last batch did not all send (held says it left some out), or
// else a fresh claim.
func (w *worker) next(ctx context.Context, p *pipeline) (t taken, held bool) {
	if p.ahead == nil {
		return w.claim(ctx, w.owner, nil), false
	}
	t, p.ahead = <-p.ahead, nil
	w.s.inflight.remove(p.followed)
	if t.err != nil {
		return t, false
	}
	if 2*len(t.rows.Records) < t.limit {
		// Not worth it: the backlog is ending, or its rows are held
		// behind another worker's batch (a hot key).
		w.aheadPaused = time.Now().Add(avoidFor)
	}
	return t, t.holdBack(p.unsent, w.s.scope)
}

// work delivers t, claiming the next batch meanwhile while a backlog
// lasts, and ends t's flight unless a batch claimed ahead follows it.
func (w *worker) work(ctx, inflight context.Context, t taken, p *pipeline) (more bool, err error) {
	if w.claimAhead(t) {
		next := make(chan taken, 1)
		follows := keyedRows(t.rows.Records)
		go func() { next <- w.claim(ctx, t.owner^1, follows) }()
		p.ahead = next
	}
	if len(t.rows.Records) > 0 {
		w.crowded.Store(false)
	}
	more, p.unsent, err = w.deliver(ctx, inflight, t)
	if p.ahead != nil {
		p.followed = t.inflight
	} else {
		w.s.inflight.remove(t.inflight)
	}
	return more, err
}

// dropAhead gives back the batch claimed ahead, undelivered.
func (w *worker) dropAhead(ctx context.Context, p *pipeline) {
	w.drop(ctx, <-p.ahead)
	p.ahead = nil
	w.s.inflight.remove(p.followed)
}

// backOff follows a failed claim or batch: it drops the batch claimed
// ahead, reports the failure, and waits, twice as long after each failure
// in a row up to 30s. It reports whether the worker goes on.
func (w *worker) backOff(ctx context.Context, p *pipeline, err error) bool {
	if p.ahead != nil {
		w.dropAhead(ctx, p)
	}
	if ctx.Err() != nil {
		return false
	}
	p.errDelay = min(max(p.errDelay*2, 100*time.Millisecond), 30*time.Second)
	w.s.batchFailed(w.id, err, p.errDelay)
	w.busySince.Store(0)
	return sleep(ctx, p.errDelay)
}

// noteIdle learns from a claim that delivered nothing. When all it found,
// or all it looked at, is in flight elsewhere (a hot key's rows most
// likely), claiming again at every call for help would only cost the
// database, and lock rows the worker delivering them claims next. The keys
// it left out are still busy, and hold all it could look at: it keeps out
// of their way longer. Notifications still wake it.
func (w *worker) noteIdle(t taken) {
	rows := t.rows
	if len(rows.Records) > 0 || rows.Skipped == 0 && !rows.Windowed {
		return
	}
	if rows.Windowed {
		w.avoid.add(t.excluded, time.Now())
	}
	w.heldOff.Store(w.avoid.until().UnixNano())
	if rows.Windowed || rows.Full && t.limit == w.s.batchSize && len(rows.SkippedKeys) <= crowdedKeys &&
		rows.Skipped >= crowdedRows*len(rows.SkippedKeys) {
		w.crowded.Store(true)
	}
}

// idle waits for a wake-up or the poll interval, or less: until a
// breaker may let a probe through, or, while rows wait for older
// transactions to end (strict order; since heldSince), which no
// notification announces, soon, less often the longer they wait. It
// reports whether ctx is live.
func (w *worker) idle(ctx context.Context, heldSince time.Time, poll *time.Timer) bool {
	wait := w.r.cfg.PollInterval
	if until := w.r.nextReopen(); !until.IsZero() {
		wait = max(min(wait, time.Until(until)), time.Millisecond)
	}
	if !heldSince.IsZero() {
		wait = min(wait, max(time.Since(heldSince)/4, heldRecheck))
	}
	poll.Reset(wait)
	w.busySince.Store(0)
	select {
	case <-ctx.Done():
		return false
	case <-w.wake:
		return true
	case <-poll.C:
		return true
	}
}

// A crowded worker (see worker.crowded) found only rows of at most
// crowdedKeys keys in flight elsewhere, crowdedRows of each or more; its
// claims read crowdedBatches batches' worth of ids at most.
const (
	crowdedKeys    = 4
	crowdedRows    = 32
	crowdedBatches = 4
)

// nudge wakes the worker if it is idle; a wake-up already pending will do.
func (w *worker) nudge() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// heldRecheck is the shortest wait before a worker claims again while
// rows wait for older transactions (strict order).
const heldRecheck = 2 * time.Millisecond

// keySet is a set of keys, each in its order scope (see scopedKey).
type keySet map[string]bool

// keyedRows returns the keys and ids of recs' keyed rows.
func keyedRows(recs []sink.Record) []store.KeyedRow {
	out := make([]store.KeyedRow, 0, len(recs))
	for i := range recs {
		if r := &recs[i]; r.HasKey {
			out = append(out, store.KeyedRow{Key: r.Key, ID: r.ID})
		}
	}
	return out
}

// unsentKeys returns the keys of recs' keyed rows without a Sent outcome,
// each in its order scope; nil when every row was sent.
func unsentKeys(recs []sink.Record, outcomes []store.Outcome, scope func(topic string) string) keySet {
	n := 0
	for i := range outcomes {
		if outcomes[i].Kind == store.Sent {
			n++
		}
	}
	if n == len(recs) {
		return nil
	}
	sent := make(map[int64]bool, n)
	for i := range outcomes {
		if outcomes[i].Kind == store.Sent {
			sent[outcomes[i].ID] = true
		}
	}
	out := keySet{}
	for i := range recs {
		if r := &recs[i]; r.HasKey && !sent[r.ID] {
			out[scopedKey(scope, r)] = true
		}
	}
	return out
}

// taken is a claimed batch not yet delivered.
type taken struct {
	claim    Claimed
	rows     *store.Batch // claim's rows
	owner    int          // its keys' owner in the in-flight registry
	inflight inflightID   // its entry there
	limit    int
	start    time.Time       // when the claim began
	took     time.Duration   // how long the claim took
	ahead    bool            // claimed while the batch before it was delivered
	excluded []string        // the keys it left out, in flight elsewhere
	waits    *flow.SlotWaits // full bulkheads it waits on
	err      error
}

// holdBack leaves out of t, a batch claimed ahead, the rows of keys, in
// their order scope, that the batch before it did not all send: they
// followed rows that failed (or were given back), so they must not go out
// now. Left without an outcome, they stay ready as they were, and the next
// claim holds them back behind the failed rows, as it would have without
// following. It reports whether it held back any row.
func (t *taken) holdBack(unsent keySet, scope func(topic string) string) bool {
	if len(unsent) == 0 {
		return false
	}
	// A new slice: the in-flight registry holds the claimed one.
	kept := make([]sink.Record, 0, len(t.rows.Records))
	for _, r := range t.rows.Records {
		if !r.HasKey || !unsent[scopedKey(scope, &r)] {
			kept = append(kept, r)
		}
	}
	held := len(kept) < len(t.rows.Records)
	t.rows.Records = kept
	return held
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
func (w *worker) claimAhead(t taken) bool {
	return t.rows.Full && len(t.rows.Records) > 0 &&
		w.s.sqlBusy.Load() == 0 && time.Now().After(w.aheadPaused) && w.s.rows.SpareConns() >= 2 && w.mayClaimAhead()
}

// claim claims a batch, its keys in flight under owner until the batch is
// delivered or dropped. A batch claimed ahead follows the keyed rows of
// the one being delivered (see store.ClaimParams.Follows).
func (w *worker) claim(ctx context.Context, owner int, follows []store.KeyedRow) taken {
	r, s := w.r, w.s
	start := time.Now()
	limit := w.claimLimit()
	waits := &flow.SlotWaits{}
	closed, closedFor, room := r.closedTopics(start, waits)
	s.pace.slotBound.Store(room >= 0 && room < limit)
	if room >= 0 {
		// No more rows than the destinations open to it take now.
		limit = min(limit, max(room, 1))
	}
	s.sqlBusy.Add(1)
	claimCtx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	excluded, excludedFrom := s.inflight.elsewhere(owner, w.avoid.keys(start))
	var span int64
	if w.crowded.Load() {
		span = crowdedBatches * int64(s.batchSize)
	}
	claim, err := s.rows.Claim(claimCtx, store.ClaimParams{
		Limit: limit, PayloadCap: r.cfg.PayloadCap, ExcludeKeys: excluded, ExcludedFrom: excludedFrom, ExcludedSpan: span,
		ExcludeTopics: closed, ExcludeFor: closedFor, Follows: follows, OrderScope: s.scope,
	})
	cancel()
	s.sqlBusy.Add(-1)
	if err != nil {
		waits.Release()
		return taken{err: err}
	}
	rows := claim.Rows()
	took := time.Since(start)
	s.pace.backlog.Store(rows.Full)
	s.tally.claimed(took, len(rows.Records))
	// Size the next claim by the rows that will be published: oversized
	// rows are never loaded and must not shrink it.
	total, n := 0, 0
	for _, rec := range rows.Records {
		if rec.Undeliverable == "" {
			total += recordSize(rec)
			n++
		}
	}
	if n > 0 {
		w.avgRowBytes = total / n
	}
	w.avoid.add(rows.SkippedKeys, start)
	id := s.inflight.add(owner, rows.Records, follows)
	if len(rows.Records) > 0 {
		s.r.stirFleet()
	}
	return taken{claim: claim, rows: rows, owner: owner, inflight: id, limit: limit, start: start, took: took, ahead: follows != nil,
		excluded: excluded, waits: waits}
}

// releaseWaits gives back t's places among the batches waiting for a
// slot, and wakes the idle workers so that one may take them.
func (w *worker) releaseWaits(t taken) {
	if t.waits.Release() {
		w.s.wakeAll()
	}
}

// claimLimit sizes the next claim from the size of the rows the last one
// found: no more rows than MaxBatchBytes can carry (with some margin), so a
// worker does not load payloads it cannot publish.
func (w *worker) claimLimit() int {
	batch := w.s.batchSize
	if w.avgRowBytes <= 0 {
		return batch
	}
	return min(batch, max(1, w.r.cfg.MaxBatchBytes/w.avgRowBytes*5/4))
}

// drop gives a batch back undelivered: its rows stay as they were.
func (w *worker) drop(ctx context.Context, t taken) {
	w.releaseWaits(t)
	if t.err != nil {
		return
	}
	w.s.inflight.remove(t.inflight)
	writeCtx, cancel := writeBackContext(ctx, w.r.cfg.QueryTimeout)
	defer cancel()
	if err := t.claim.Release(writeCtx); err != nil {
		w.s.log.Warn("releasing a claim failed; its rows are unlocked when the connection closes", slog.Any("error", err))
	}
}

// deliver takes a claimed batch through its steps: plan (route the rows
// and admit them at their destinations), publish, settle (judge each
// result into an outcome, and learn from them), write back, and hand the
// leased groups to their leases. Its caller ends the batch's flight. more
// reports that it delivered something, so the worker should look again
// before sleeping. unsent are the keys of its rows not all sent, which a
// batch claimed ahead of it must hold back.
func (w *worker) deliver(ctx, inflight context.Context, t taken) (more bool, unsent keySet, err error) {
	defer w.releaseWaits(t)
	if len(t.rows.Records) == 0 {
		return w.deliverNothing(ctx, t)
	}
	if tc, ok := t.claim.(tellingClaim); ok {
		tc.WaitTold(ctx)
	}
	publishing := time.Now()
	endPublishing := w.startPublishing()
	defer endPublishing()
	if !w.takeTurn(ctx, t) {
		if ctx.Err() != nil {
			return false, nil, ctx.Err()
		}
		return true, unsentKeys(t.rows.Records, nil, w.s.scope), nil
	}
	b := w.plan(t)
	defer b.end()
	publish(inflight, b.groups, w.r.cfg.PublishTimeout)
	b.settle(inflight.Err() != nil)
	// The rows are no longer in flight at their destinations: their
	// slots, and the turn, go to the next rows while this batch writes
	// back.
	b.endPublish()
	endPublishing()
	published := time.Since(publishing)
	if err := w.writeBack(ctx, t.claim, b.outcomes); err != nil {
		return false, nil, err
	}
	w.s.pace.note(t.took+time.Since(publishing)-published, published)
	b.handOff(inflight, t.rows.LeaseExpiry)
	return w.done(t, b), unsentKeys(t.rows.Records, b.outcomes, w.s.scope), nil
}

// deliverNothing ends a claim that holds no row to publish: it completes
// one whose rows were all rescheduled (look again at once), and releases
// one that found nothing.
func (w *worker) deliverNothing(ctx context.Context, t taken) (more bool, unsent keySet, err error) {
	writeCtx, cancel := writeBackContext(ctx, w.r.cfg.QueryTimeout)
	defer cancel()
	if t.rows.Deferred == 0 {
		return false, nil, t.claim.Release(writeCtx)
	}
	if err := t.claim.Complete(writeCtx, nil); err != nil {
		return false, nil, err
	}
	w.s.tally.settled(nil, nil, nil, t.rows.Deferred)
	return true, nil, nil
}

// takeTurn waits, for a batch whose rows all wait for a full bulkhead's
// slot, until a delivery frees one, as it would in a publish; then takes
// one of the turns the outboxes share to plan and publish (the
// write-back, on this outbox's own database, takes none). The claim's
// transaction waits meanwhile, so the wait is bounded like a publish: a
// batch that gets no turn within it is given back untouched, and claimed
// again; takeTurn then reports false.
func (w *worker) takeTurn(ctx context.Context, t taken) bool {
	r := w.r
	t.waits.Await(ctx, r.planner.destOf, t.rows.Records, r.cfg.PublishTimeout)
	turnCtx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	err := r.turns.acquire(turnCtx, w.s.index)
	cancel()
	if err != nil {
		w.drop(ctx, t)
		if ctx.Err() == nil {
			w.s.log.Debug("no turn to publish within publish_timeout: the batch is given back", slog.Int("rows", len(t.rows.Records)))
		}
		return false
	}
	return true
}

// batch is a claimed batch on its way, from its plan to its write-back:
// the groups published now and those leased, the outcomes so far, and
// what it holds (a turn, bulkhead slots, probes) until it gives them back.
type batch struct {
	w         *worker
	groups    []*flow.Group // published inside the claim
	leased    []*flow.Group // delivered on a lease after the write-back
	outcomes  []store.Outcome
	published int
	turn      bool // holds one of the shared turns
	released  bool // the groups' bulkhead slots are given back
	handedOff bool // the leased groups are their leases'
}

// plan routes t's rows and admits them at their destinations (see
// planner.plan); groups of destinations with a visibility timeout are
// leased: their rows' outcomes hide them under a fresh token, and they
// are delivered after the claim commits. The batch holds the turn
// takeTurn took.
func (w *worker) plan(t taken) *batch {
	all, outcomes := w.r.planner.plan(w.s, t.rows.Records, time.Now(), w.s.scope)
	w.releaseWaits(t) // its slots are taken: the next batch may wait
	b := &batch{w: w, outcomes: outcomes, turn: true}
	for _, g := range all {
		g.Claimed, g.Start = t.rows.Now, t.start
		b.published += len(g.Recs)
		if g.Dest.VisibilityTimeout == 0 {
			b.groups = append(b.groups, g)
			continue
		}
		b.leased = append(b.leased, g)
		g.Token = uuid.New()
		for _, rec := range g.Recs {
			b.outcomes = append(b.outcomes, store.Outcome{ID: rec.ID, Kind: store.Leased, Token: g.Token, Delay: g.Dest.VisibilityTimeout})
		}
	}
	return b
}

// settle adds the outcomes each published group's results call for (see
// flow.Dest.Settle); abandoned says the publishes were cut short by shutdown.
func (b *batch) settle(abandoned bool) {
	for _, g := range b.groups {
		b.outcomes = append(b.outcomes, g.Dest.Settle(g, abandoned)...)
	}
}

// endPublish gives back the published groups' bulkhead slots and the
// turn, once.
func (b *batch) endPublish() {
	if !b.released {
		b.released = true
		for _, g := range b.groups {
			g.Dest.Release(g)
		}
	}
	if b.turn {
		b.turn = false
		b.w.r.turns.release(b.w.s.index)
	}
}

// handOff starts the leased groups' deliveries, now that their leases
// are written (expiry, by row, as the write-back set them).
func (b *batch) handOff(inflight context.Context, expiry map[int64]time.Time) {
	for _, g := range b.leased {
		b.w.s.leases.start(inflight, g, expiry)
	}
	b.handedOff = true
}

// end gives back what the batch still holds: the turn and slots if it
// never got to its write-back, and the leased groups' slots and probes if
// they were never handed off.
func (b *batch) end() {
	b.endPublish()
	if !b.handedOff {
		for _, g := range b.leased {
			g.Dest.Release(g)
			g.Dest.Abandon(g)
		}
	}
}

// writeBack completes the claim with the batch's outcomes.
func (w *worker) writeBack(ctx context.Context, claim Claimed, outcomes []store.Outcome) error {
	writeCtx, cancel := writeBackContext(ctx, w.r.cfg.QueryTimeout)
	defer cancel()
	w.s.sqlBusy.Add(1)
	defer w.s.sqlBusy.Add(-1)
	return claim.Complete(writeCtx, outcomes)
}

// done counts a written-back batch and asks idle workers for help after a
// full one. It reports whether the worker should claim again at once:
// after any outcome or rescheduling, as rows committed meanwhile may not
// have notified (one notifier at a time), and a claim that finds nothing
// is cheap.
func (w *worker) done(t taken, b *batch) bool {
	s, rows := w.s, t.rows
	s.tally.batches.Add(1)
	s.tally.settled(b.outcomes, b.groups, rows.Records, rows.Deferred)
	if rows.Full && b.published > 0 {
		// More rows are probably ready than this worker takes.
		s.askHelp()
	}
	s.log.Debug("batch done", slog.Int("claimed", rows.Claimed), slog.Int("published", b.published),
		slog.Int("outcomes", len(b.outcomes)), slog.Duration("duration", time.Since(t.start)))
	return len(b.outcomes) > 0 || rows.Deferred > 0
}

// publish hands each group to its destination, the destinations in
// parallel, each bounded by timeout, or by nine tenths of a leased
// destination's visibility timeout, so it is done before the lease ends.
func publish(inflight context.Context, groups []*flow.Group, timeout time.Duration) {
	one := func(g *flow.Group) {
		timeout := timeout
		if vt := g.Dest.VisibilityTimeout; vt > 0 {
			timeout = vt * 9 / 10
		}
		ctx, cancel := context.WithTimeout(inflight, timeout)
		defer cancel()
		g.Dest.Publishing.Add(int64(len(g.Recs)))
		g.Errs = g.Dest.Publisher.Publish(ctx, g.Recs)
		g.Dest.Publishing.Add(-int64(len(g.Recs)))
		g.Done = time.Now()
		if len(g.Errs) != len(g.Recs) {
			err := fmt.Errorf("destination %s returned %d results for %d records", g.Dest.Name, len(g.Errs), len(g.Recs))
			g.Errs = make([]error, len(g.Recs))
			for i := range g.Errs {
				g.Errs[i] = err
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
