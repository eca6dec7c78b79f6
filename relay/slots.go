package relay

import (
	"context"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// slotWaits are the destinations whose full bulkhead a claimed batch waits
// on: the slot a delivery frees goes at once to rows already claimed,
// rather than to a claim that begins only then. One batch at a time waits
// on a destination (dest.waiter); the others leave its rows out of their
// claims, as while a breaker is open, and are woken when a slot frees.
type slotWaits struct {
	mu    sync.Mutex
	dests []*dest
}

// take takes d's place for a waiting batch, if it is free.
func (w *slotWaits) take(d *dest) bool {
	if !d.waiter.CompareAndSwap(false, true) {
		return false
	}
	w.mu.Lock()
	w.dests = append(w.dests, d)
	w.mu.Unlock()
	return true
}

// holds reports whether w holds d's place.
func (w *slotWaits) holds(d *dest) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.dests {
		if x == d {
			return true
		}
	}
	return false
}

// release gives the places back; the next batch may wait then. It
// reports whether it held any.
func (w *slotWaits) release() bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range w.dests {
		d.waiter.Store(false)
	}
	held := len(w.dests) > 0
	w.dests = nil
	return held
}

// await waits, at most for timeout, until a destination the batch waits on
// has a free slot, but only when every row of recs is bound for one of
// them and finds it full: a batch with rows that can go now does not wait.
func (w *slotWaits) await(ctx context.Context, p *planner, recs []sink.Record, timeout time.Duration) {
	if w == nil {
		return
	}
	w.mu.Lock()
	dests := append([]*dest(nil), w.dests...)
	w.mu.Unlock()
	if len(dests) == 0 {
		return
	}
	var opening <-chan struct{}
	for i := range recs {
		rec := &recs[i]
		rt := p.router.route(rec.Topic)
		if rec.Undeliverable != "" || rt.dest < 0 {
			return // goes now, to the dead letters
		}
		d := p.dests[rt.dest]
		waited := false
		for _, x := range dests {
			waited = waited || x == d
		}
		if !waited {
			return
		}
		ch := d.bulk.opening()
		if ch == nil {
			return // a slot is free
		}
		if opening == nil {
			opening = ch
		}
	}
	if opening == nil {
		return
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-opening:
	case <-timer.C:
	case <-ctx.Done():
	}
}
