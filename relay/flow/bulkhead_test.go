package flow

import "testing"

// A full bulkhead tells those waiting for a slot the moment one frees,
// whether a delivery gives its slots back or the fleet grows the share;
// and it reports the demand it saw since it was last asked.
func TestBulkheadSignalsAFreeSlot(t *testing.T) {
	h := bulkhead{max: 2, limited: true}
	if h.opening() != nil {
		t.Fatal("an empty bulkhead has a waiter wait")
	}
	if got := h.take(3); got != 2 {
		t.Fatalf("take(3) = %d, want 2", got)
	}
	opened := h.opening()
	if opened == nil {
		t.Fatal("a full bulkhead has no one wait")
	}
	if h.give(0) {
		t.Error("giving nothing opened it")
	}
	if !h.give(1) {
		t.Error("giving a slot of a full bulkhead did not say it opened")
	}
	select {
	case <-opened:
	default:
		t.Fatal("the waiter was not told of the free slot")
	}
	if h.give(1) {
		t.Error("giving a slot of a bulkhead that was not full said it opened")
	}
	if wanted, peak := h.demand(); !wanted || peak != 2 {
		t.Errorf("demand = %v, %d; want wanted (take(3) got 2), peak 2", wanted, peak)
	}
	if wanted, peak := h.demand(); wanted || peak != 0 {
		t.Errorf("demand asked again = %v, %d; want nothing since", wanted, peak)
	}

	// Shared by a fleet: a larger share opens it too.
	h.share(1, false)
	h.take(1)
	opened = h.opening()
	if opened == nil || !h.full() {
		t.Fatal("a bulkhead at its share is not full")
	}
	h.share(2, false)
	select {
	case <-opened:
	default:
		t.Fatal("a larger share did not tell the waiter")
	}
}

// In a fleet, a claim that finds the bulkhead full wants no slots: the
// replica may have no rows for them, and would take slots back from the
// replicas that have. Rows that then wait for a slot do want more, at
// every sync until they get one. A replica lends while it holds slots
// that the others want, and while the fleet records for it more than the
// share a sync just gave it: the next sync, at once rather than at a
// quiet replica's pace, tells the fleet so.
func TestBulkheadWantsOnlyForRowsThatWait(t *testing.T) {
	h := bulkhead{limited: true}
	h.share(0, true)
	if !h.full() {
		t.Fatal("a bulkhead with no share is not full")
	}
	if wanted, _ := h.demand(); wanted {
		t.Error("finding the bulkhead full counted as rows wanting slots")
	}
	if h.opening() == nil {
		t.Fatal("rows found a bulkhead with no share open")
	}
	for range 2 {
		if wanted, _ := h.demand(); !wanted {
			t.Error("rows that wait for a slot did not count as wanting slots at every sync while they wait")
		}
	}
	h.share(1, true) // a slot for them: they wait no more
	if wanted, _ := h.demand(); wanted {
		t.Error("rows that got their slot still count as wanting")
	}
	h.share(0, true)
	if h.lends() {
		t.Error("a replica with no share lends")
	}
	for _, c := range []struct {
		slots      int
		othersWant bool
		lends      bool
	}{{1, true, true}, {1, false, false}, {0, true, false}} {
		h.share(c.slots, c.othersWant)
		if got := h.lends(); got != c.lends {
			t.Errorf("share %d, others want %v: lends = %v, want %v", c.slots, c.othersWant, got, c.lends)
		}
	}

	// A slot used since the last sync: the fleet records it, and the
	// sync may shrink the share below it.
	h.share(1, true)
	h.take(1)
	h.give(1)
	if f := h.floor(); f != 1 {
		t.Fatalf("floor with a share of 1 used since the last sync = %d, want 1", f)
	}
	h.demand()
	h.share(0, true)
	if !h.lends() {
		t.Error("a replica the fleet records a slot for, above its new share, does not lend it")
	}
	if f := h.floor(); f != 0 {
		t.Fatalf("floor after the share shrank = %d, want 0", f)
	}
	h.share(0, true)
	if h.lends() {
		t.Error("a replica lends once the fleet records no slot for it")
	}

	// No slot used since the last sync, none wanted, and the others
	// want: the share goes as the sync begins, and comes back if the
	// fleet gives it.
	h.share(1, true)
	h.demand()
	if f := h.floor(); f != 0 {
		t.Fatalf("floor of an idle replica while the others want = %d, want 0", f)
	}
	if !h.full() {
		t.Error("an idle replica kept its share after telling the fleet it holds none")
	}
	h.share(1, false)
	if h.full() {
		t.Error("the share the fleet gave back is not open")
	}
	h.demand()
	if f := h.floor(); f != 1 {
		t.Fatalf("floor of an idle replica while no other wants = %d, want its share, 1", f)
	}
}
