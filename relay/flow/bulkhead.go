package flow

import (
	"sync"
)

// bulkhead counts a destination's rows in flight. In a fleet, the
// destination's limit is shared among the replicas, and this one may use
// only its share (slots); it tells the fleet, as its floor, the most it
// may be using, so that the shares never add up to more than the limit.
type bulkhead struct {
	max     int  // per process; 0: unlimited
	limited bool // a limit of its own or the fleet's
	mu      sync.Mutex
	n       int
	shared  bool
	slots   int // this replica's share, while shared
	// recorded is the floor last told to the fleet: what it records for
	// this replica until the next sync.
	recorded int
	// othersWant: the other replicas' rows wait for slots, and take what
	// this one lends.
	othersWant bool
	// Since demand was last read: whether rows were refused a slot or
	// waited for one, and the most slots in use at once.
	wanted bool
	peak   int
	// opened is closed when a full bulkhead gets a free slot; nil while
	// no one waits for one.
	opened chan struct{}
}

// opening returns a channel closed once the bulkhead has a free slot, or
// nil when it has one now. Rows that wait on it want more.
func (h *bulkhead) opening() <-chan struct{} {
	if !h.limited {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if lim, ok := h.limit(); !ok || h.n < lim {
		return nil
	}
	h.wanted = true
	if h.opened == nil {
		h.opened = make(chan struct{})
	}
	return h.opened
}

// signalLocked wakes those waiting for a slot, if one is free.
func (h *bulkhead) signalLocked() {
	if h.opened == nil {
		return
	}
	if lim, ok := h.limit(); !ok || h.n < lim {
		close(h.opened)
		h.opened = nil
	}
}

// limit is the most rows in flight now, and whether there is a limit.
func (h *bulkhead) limit() (int, bool) {
	if !h.shared {
		return h.max, h.max > 0
	}
	if h.max > 0 {
		return min(h.max, h.slots), true
	}
	return h.slots, true
}

// take grants up to n slots and returns how many.
func (h *bulkhead) take(n int) int {
	if !h.limited {
		return n
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if lim, ok := h.limit(); ok {
		granted := max(0, min(n, lim-h.n))
		h.wanted = h.wanted || granted < n
		n = granted
	}
	h.n += n
	h.peak = max(h.peak, h.n)
	return n
}

// room is how many more rows the bulkhead takes now, and its limit; ok is
// false when it has none.
func (h *bulkhead) room() (free, limit int, ok bool) {
	if !h.limited {
		return 0, 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	lim, ok := h.limit()
	if !ok {
		return 0, 0, false
	}
	return max(0, lim-h.n), lim, true
}

// give returns n slots, and reports whether that opened a full bulkhead:
// rows held back for a slot may go now.
func (h *bulkhead) give(n int) bool {
	if !h.limited || n == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	lim, ok := h.limit()
	wasFull := ok && h.n >= lim
	h.n -= n
	h.signalLocked()
	return wasFull && h.n < lim
}

// full reports whether every slot is taken. A claim that finds it so
// wants nothing yet: it may have no rows for it. Rows that then wait for
// a slot (opening) or are refused one (take) do.
func (h *bulkhead) full() bool {
	if !h.limited {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	lim, ok := h.limit()
	return ok && h.n >= lim
}

// demand reports, and starts counting anew, whether rows wanted a slot
// since the last call (were refused one, or waited for one, or still
// wait), and the most slots in use at once.
func (h *bulkhead) demand() (wanted bool, peak int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	wanted, peak = h.wanted || h.opened != nil, h.peak
	h.wanted, h.peak = false, h.n
	return wanted, peak
}

// floor is the share the fleet must keep for this replica: its share, or
// more while rows taken under a larger one are still in flight; 0 when it
// has no share. What it returns is what the fleet records, once the sync
// that tells it ends. A replica that used no slot since the last sync,
// while the others want some, gives its share up here.
func (h *bulkhead) floor() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.shared {
		return 0
	}
	if h.othersWant && h.n == 0 && h.peak == 0 && !h.wanted && h.opened == nil {
		// No slot used since the last sync, and none wanted, while the
		// others want: the fleet gives this replica's share to them at
		// this sync, so it goes now rather than at the next one.
		h.slots = 0
	}
	h.recorded = max(h.slots, h.n)
	return h.recorded
}

// share sets this replica's share of the fleet's limit, and whether the
// other replicas want more, and reports whether the limit grew.
func (h *bulkhead) share(slots int, othersWant bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	before, was := h.limit()
	h.shared, h.slots, h.othersWant = true, slots, othersWant
	after, _ := h.limit()
	h.signalLocked()
	return was && after > before
}

// lends reports whether this replica holds slots of the fleet's limit
// that the others want, or the fleet still records more for it than its
// share: what it does not use goes to them at its next syncs, and the
// slots of a share the fleet just shrank at its next one.
func (h *bulkhead) lends() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.shared && h.othersWant && (h.slots > 0 || h.recorded > h.slots)
}

// unshare returns to the per-process limit.
func (h *bulkhead) unshare() {
	h.mu.Lock()
	h.shared = false
	h.signalLocked()
	h.mu.Unlock()
}
