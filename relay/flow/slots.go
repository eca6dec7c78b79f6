package flow

import (
	"context"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// SlotWaits are the destinations whose full bulkhead a claimed batch waits
// on: the slot a delivery frees goes at once to rows already claimed,
// rather than to a claim that begins only then. One batch at a time waits
// on a destination (dest.waiter); the others leave its rows out of their
// claims, as while a breaker is open, and are woken when a slot frees.
type SlotWaits struct {
	mu    sync.Mutex
	dests []*Dest
}

// Take takes d's place for a waiting batch, if it is free.
func (w *SlotWaits) Take(d *Dest) bool {
	if !d.waiter.CompareAndSwap(false, true) {
		return false
	}
	w.mu.Lock()
	w.dests = append(w.dests, d)
	w.mu.Unlock()
	return true
}

// Holds reports whether w holds d's place.
func (w *SlotWaits) Holds(d *Dest) bool {
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

// Release gives the places back; the next batch may wait then. It
// reports whether it held any.
func (w *SlotWaits) Release() bool {
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

// Await waits, at most for timeout, until a destination the batch waits on
// has a free slot, but only when every row of recs is bound for one of
// them and finds it full: a batch with rows that can go now does not wait.
//
// destOf tells where a row goes: its destination, or false for a row
// that goes to the dead letters.
func (w *SlotWaits) Await(ctx context.Context, destOf func(rec *sink.Record) (*Dest, bool), recs []sink.Record, timeout time.Duration) {
	if w == nil {
		return
	}
	w.mu.Lock()
	dests := append([]*Dest(nil), w.dests...)
	w.mu.Unlock()
	if len(dests) == 0 {
		return
	}
	var opening <-chan struct{}
	for i := range recs {
		rec := &recs[i]
		d, ok := destOf(rec)
		if !ok {
			return // goes now, to the dead letters
		}
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
