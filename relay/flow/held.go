package flow

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Rows held while their destination, topic or partition is down wait,
// without counting an attempt, for the cool-down it had when they were
// held (a failed probe's rows a pause_max longer, so that the next probe
// takes other rows). When what held them answers again they should not
// wait out the rest: the destination remembers the rows it held, by what
// held them, and hands them back to their source when that closes (see
// Released), which makes them ready at once. A failed probe's keyed rows
// are handed back sooner when the half-open breaker finds nothing else to
// probe with (every key waits behind them): see breaker.starved. Its
// keyless rows hold nothing back, and wait: they may be rows failing on
// their own.

// maxHeld bounds the rows a destination remembers as held. Past it, a row
// waits for the end of its deferral, as it would without being
// remembered.
const maxHeld = 10_000

// destWide is the subject of the destination's own breaker.
var destWide = subject{partition: -2}

// heldRow is a row held by a subject, until due (the local clock).
type heldRow struct {
	owner any
	row   store.HeldRow
	due   time.Time
	probe bool // a keyed row that rode a failed probe
}

// holds are the rows a destination holds, by subject, and those released
// since its subjects closed, for their owners to take.
type holds struct {
	mu       sync.Mutex
	n        int
	by       map[subject][]heldRow
	answered map[subject]time.Time // when each subject last answered again
	released []heldRow
	waiting  atomic.Bool // released is not empty
	// onRelease is told that rows were released.
	onRelease func()
}

// hold remembers that s held rec's row, of owner, for wait from now,
// when that was decided; probe says it is a keyed row that rode a failed
// probe of s. A row whose subject answered again since it was decided
// (another batch's probe closed it meanwhile) is handed back at once:
// that answer's release came too early to see it.
func (h *holds) hold(s subject, owner any, id int64, retries int, now time.Time, wait time.Duration, probe bool) {
	if owner == nil {
		return
	}
	h.mu.Lock()
	r := heldRow{owner: owner, row: store.HeldRow{ID: id, RetryCount: retries}, due: now.Add(wait), probe: probe}
	if at, ok := h.answered[s]; ok && at.After(now) && len(h.released) < maxHeld {
		h.released = append(h.released, r)
		h.waiting.Store(true)
		tell := h.onRelease
		h.mu.Unlock()
		if tell != nil {
			tell()
		}
		return
	}
	defer h.mu.Unlock()
	if h.n >= maxHeld {
		h.pruneLocked(now)
		if h.n >= maxHeld {
			return
		}
	}
	if h.by == nil {
		h.by = map[subject][]heldRow{}
	}
	h.by[s] = append(h.by[s], r)
	h.n++
}

// pruneLocked forgets the rows whose deferral is over: they are ready
// anyway.
func (h *holds) pruneLocked(now time.Time) {
	for s, rows := range h.by {
		kept := rows[:0]
		for _, r := range rows {
			if r.due.After(now) {
				kept = append(kept, r)
			}
		}
		h.n -= len(rows) - len(kept)
		if len(kept) == 0 {
			delete(h.by, s)
		} else {
			h.by[s] = kept
		}
	}
}

// release hands back the rows s held that still wait: s answers again.
// What a topic or partition still paused holds stays held.
func (h *holds) release(s subject, now time.Time) { h.hand(s, now, false) }

// releaseProbes hands back the keyed rows of s's failed probes that still
// wait: s is half-open with nothing else to probe with, every key waiting
// behind them.
func (h *holds) releaseProbes(s subject, now time.Time) { h.hand(s, now, true) }

// hand hands back the rows s held, or only its failed probes' rows.
func (h *holds) hand(s subject, now time.Time, probes bool) {
	h.mu.Lock()
	if !probes {
		if h.answered == nil {
			h.answered = map[subject]time.Time{}
		}
		h.answered[s] = now
	}
	var freed bool
	rows := h.by[s]
	kept := rows[:0]
	for _, r := range rows {
		switch {
		case probes && !r.probe:
			kept = append(kept, r)
		case r.due.After(now) && len(h.released) < maxHeld:
			h.released = append(h.released, r)
			freed = true
		}
	}
	h.n -= len(rows) - len(kept)
	if len(kept) == 0 {
		delete(h.by, s)
	} else {
		h.by[s] = kept
	}
	if freed {
		h.waiting.Store(true)
	}
	tell := h.onRelease
	h.mu.Unlock()
	if freed && tell != nil {
		tell()
	}
}

// take returns the released rows of owner.
func (h *holds) take(owner any) []store.HeldRow {
	if !h.waiting.Load() {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []store.HeldRow
	kept := h.released[:0]
	for _, r := range h.released {
		if r.owner == owner {
			out = append(out, r.row)
		} else {
			kept = append(kept, r)
		}
	}
	h.released = kept
	h.waiting.Store(len(kept) > 0)
	return out
}

// Released returns the rows of owner (see Group.Owner) that the
// destination held while it, or one of its topics or partitions, was
// down, and that still wait though it answers again: their source makes
// them ready at once. OnRelease says when there are some.
func (d *Dest) Released(owner any) []store.HeldRow { return d.holds.take(owner) }

// OnRelease sets what is told that held rows were released.
func (d *Dest) OnRelease(f func()) {
	d.holds.mu.Lock()
	d.holds.onRelease = f
	d.holds.mu.Unlock()
}
