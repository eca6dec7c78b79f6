package relay

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

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
}

func newWorker(s *source, id int) *worker {
	return &worker{s: s, r: s.r, id: id, wake: make(chan struct{}, 1), owner: 2 * id, avoid: avoidKeys{}}
}

// run is the worker's loop: claim, plan, publish, decide, complete; sleep
// (until a wake-up or the poll interval) only when a batch delivered
// nothing. While a backlog lasts, it claims its next batch while it
// delivers the current one (see claimAhead), so the database does not wait
// on the destination.
func (w *worker) run(ctx, inflight context.Context) error {
	r, s := w.r, w.s
	poll := time.NewTimer(0)
	defer poll.Stop()
	var ahead chan taken // the next batch, being claimed
	var unsent keySet    // keys of the last batch delivered not all sent
	// followed is the batch that the one claimed ahead follows: it stays
	// in flight until that claim is in, so that its keys never seem free
	// to the other workers between the two batches.
	var followed inflightID
	dropAhead := func() {
		w.drop(ctx, <-ahead)
		ahead = nil
		s.inflight.remove(followed)
	}
	defer func() {
		if ahead != nil {
			dropAhead()
		}
	}()
	errDelay := time.Duration(0)
	defer w.busySince.Store(0)
	for {
		if ctx.Err() != nil {
			return nil
		}
		w.busySince.Store(int64(time.Since(r.epoch)) + 1)
		var t taken
		held := false // rows of the batch claimed ahead held back
		if ahead != nil {
			t, ahead = <-ahead, nil
			s.inflight.remove(followed)
			if t.err == nil {
				if 2*len(t.rows.Records) < t.limit {
					// Not worth it: the backlog is ending, or its rows
					// are held behind another worker's batch (a hot key).
					w.aheadPaused = time.Now().Add(avoidFor)
				}
				held = t.holdBack(unsent, s.scope)
			}
		} else {
			t = w.claim(ctx, w.owner, nil)
		}
		more, err := false, t.err
		if err == nil {
			if w.claimAhead(t) {
				next := make(chan taken, 1)
				follows := keyedRows(t.rows.Records)
				go func() { next <- w.claim(ctx, t.owner^1, follows) }()
				ahead = next
			}
			if len(t.rows.Records) > 0 {
				w.crowded.Store(false)
			}
			more, unsent, err = w.deliver(ctx, inflight, t)
			more = more || held
			if ahead != nil {
				followed = t.inflight
			} else {
				s.inflight.remove(t.inflight)
			}
		}
		if err != nil {
			if ahead != nil {
				dropAhead()
			}
			if ctx.Err() != nil {
				return nil
			}
			errDelay = min(max(errDelay*2, 100*time.Millisecond), 30*time.Second)
			s.batchFailed(w.id, err, errDelay)
			w.busySince.Store(0)
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
		if len(t.rows.Records) == 0 && (t.rows.Skipped > 0 || t.rows.Windowed) {
			// All it found, or all it looked at, is in flight elsewhere,
			// a hot key's rows most likely: claiming again at every call
			// for help would only cost the database, and lock rows the
			// worker delivering them claims next. The keys it left out
			// are still busy, and hold all it could look at: it keeps out
			// of their way longer. Notifications still wake it.
			if t.rows.Windowed {
				w.avoid.add(t.excluded, time.Now())
			}
			w.heldOff.Store(w.avoid.until().UnixNano())
			if t.rows.Windowed || t.rows.Full && t.limit == s.batchSize && len(t.rows.SkippedKeys) <= crowdedKeys &&
				t.rows.Skipped >= crowdedRows*len(t.rows.SkippedKeys) {
				w.crowded.Store(true)
			}
		}
		// Wake up when a breaker may let a probe through, too.
		wait := r.cfg.PollInterval
		if until := r.nextReopen(); !until.IsZero() {
			wait = max(min(wait, time.Until(until)), time.Millisecond)
		}
		if since := t.rows.HeldSince; !since.IsZero() {
			// Rows wait for older transactions to end (strict order),
			// which no notification announces: look again soon, less
			// often the longer they wait.
			wait = min(wait, max(time.Since(since)/4, heldRecheck))
		}
		poll.Reset(wait)
		w.busySince.Store(0)
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		case <-poll.C:
		}
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
	start    time.Time  // when the claim began
	ahead    bool       // claimed while the batch before it was delivered
	excluded []string   // the keys it left out, in flight elsewhere
	waits    *slotWaits // full bulkheads it waits on
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
		w.s.sqlBusy.Load() == 0 && time.Now().After(w.aheadPaused) && w.s.rows.SpareConns() >= 2
}

// claim claims a batch, its keys in flight under owner until the batch is
// delivered or dropped. A batch claimed ahead follows the keyed rows of
// the one being delivered (see store.ClaimParams.Follows).
func (w *worker) claim(ctx context.Context, owner int, follows []store.KeyedRow) taken {
	r, s := w.r, w.s
	start := time.Now()
	limit := w.claimLimit()
	waits := &slotWaits{}
	closed, closedFor, room := r.closedTopics(start, waits)
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
		waits.release()
		return taken{err: err}
	}
	rows := claim.Rows()
	s.tally.claimed(time.Since(start), len(rows.Records))
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
	return taken{claim: claim, rows: rows, owner: owner, inflight: id, limit: limit, start: start, ahead: follows != nil,
		excluded: excluded, waits: waits}
}

// releaseWaits gives back t's places among the batches waiting for a
// slot, and wakes the idle workers so that one may take them.
func (w *worker) releaseWaits(t taken) {
	if t.waits.release() {
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

// deliver plans a claimed batch, publishes it, decides each row's outcome
// and completes the claim with them; its caller ends the batch's flight.
// Groups of destinations with a visibility timeout are leased instead, and
// delivered after the claim commits. more reports that it delivered
// something, so the worker should look again before sleeping. unsent are the keys of its rows not all
// sent, which a batch claimed ahead of it must hold back.
func (w *worker) deliver(ctx, inflight context.Context, t taken) (more bool, unsent keySet, err error) {
	r, s := w.r, w.s
	claim, rows, start := t.claim, t.rows, t.start
	defer w.releaseWaits(t)
	if len(rows.Records) == 0 {
		writeCtx, cancel := writeBackContext(ctx, r.cfg.QueryTimeout)
		defer cancel()
		if rows.Deferred > 0 {
			// The claim's rows were rescheduled: look again at once.
			if err := claim.Complete(writeCtx, nil); err != nil {
				return false, nil, err
			}
			s.tally.settled(nil, nil, nil, rows.Deferred)
			return true, nil, nil
		}
		return false, nil, claim.Release(writeCtx)
	}

	// A batch whose rows all wait for a full bulkhead's slot waits here,
	// its claim open, as it would in a publish: the slot goes to it the
	// moment a delivery frees one.
	t.waits.await(ctx, r.planner, rows.Records, r.cfg.PublishTimeout)

	// Planning and publishing take one of the turns the outboxes share;
	// the write-back, on this outbox's own database, does not. The claim's
	// transaction waits meanwhile, so the wait is bounded like a publish:
	// a batch that gets no turn within it is given back untouched, and
	// claimed again.
	turnCtx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	err = r.turns.acquire(turnCtx, s.index)
	cancel()
	if err != nil {
		w.drop(ctx, t)
		if ctx.Err() != nil {
			return false, nil, ctx.Err()
		}
		s.log.Debug("no turn to publish within publish_timeout: the batch is given back", slog.Int("rows", len(rows.Records)))
		return true, unsentKeys(rows.Records, nil, s.scope), nil
	}
	turn := true
	giveBack := func() {
		if turn {
			r.turns.release(s.index)
			turn = false
		}
	}
	defer giveBack()
	all, outcomes := r.planner.plan(rows.Records, time.Now(), s.scope)
	w.releaseWaits(t) // its slots are taken: the next batch may wait
	var groups, leased []*group
	for _, g := range all {
		g.claimed, g.start = rows.Now, start
		if g.d.VisibilityTimeout > 0 {
			leased = append(leased, g)
			g.token = uuid.New()
			for _, rec := range g.recs {
				outcomes = append(outcomes, store.Outcome{ID: rec.ID, Kind: store.Leased, Token: g.token, Delay: g.d.VisibilityTimeout})
			}
		} else {
			groups = append(groups, g)
		}
	}
	handedOff, released := false, false
	release := func() {
		if !released {
			released = true
			for _, g := range groups {
				g.d.release(g)
			}
		}
	}
	defer func() {
		release()
		if !handedOff {
			for _, g := range leased {
				g.d.release(g)
				g.d.abandon(g)
			}
		}
	}()
	publish(inflight, groups, r.cfg.PublishTimeout)
	abandoned := inflight.Err() != nil
	published := 0
	for _, g := range all {
		published += len(g.recs)
	}
	for _, g := range groups {
		outcomes = append(outcomes, g.d.settle(g, abandoned)...)
	}
	// The rows are no longer in flight at their destinations: their
	// slots go to the next rows while this batch writes back.
	release()
	giveBack()
	writeCtx, cancel := writeBackContext(ctx, r.cfg.QueryTimeout)
	defer cancel()
	s.sqlBusy.Add(1)
	err = claim.Complete(writeCtx, outcomes)
	s.sqlBusy.Add(-1)
	if err != nil {
		return false, nil, err
	}
	for _, g := range leased {
		s.leases.start(inflight, g, rows.LeaseExpiry)
	}
	handedOff = true
	s.tally.batches.Add(1)
	s.tally.settled(outcomes, groups, rows.Records, rows.Deferred)
	if rows.Full && published > 0 {
		// A full batch: more rows are probably ready than this worker
		// takes; idle workers may help.
		s.askHelp()
	}
	// Claim again at once after any outcome or rescheduling: rows
	// committed meanwhile may not have notified (one notifier at a time),
	// and a claim that finds nothing is cheap.
	more = len(outcomes) > 0 || rows.Deferred > 0
	s.log.Debug("batch done", slog.Int("claimed", rows.Claimed), slog.Int("published", published),
		slog.Int("outcomes", len(outcomes)), slog.Duration("duration", time.Since(start)))
	return more, unsentKeys(rows.Records, outcomes, s.scope), nil
}

// publish hands each group to its destination, the destinations in
// parallel, each bounded by timeout, or by nine tenths of a leased
// destination's visibility timeout, so it is done before the lease ends.
func publish(inflight context.Context, groups []*group, timeout time.Duration) {
	one := func(g *group) {
		timeout := timeout
		if vt := g.d.VisibilityTimeout; vt > 0 {
			timeout = vt * 9 / 10
		}
		ctx, cancel := context.WithTimeout(inflight, timeout)
		defer cancel()
		g.d.publishing.Add(int64(len(g.recs)))
		g.errs = g.d.Publisher.Publish(ctx, g.recs)
		g.d.publishing.Add(-int64(len(g.recs)))
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
