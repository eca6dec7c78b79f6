package store

import (
	"slices"
	"sync"
	"time"
)

// HeadEvery is how often a claim reads from the floor rather than from the
// frontier: the longest a row committed late, below the frontier, waits
// for a claim.
const HeadEvery = time.Second

// lateWindow is how far claims may lag, in ids, where they have seen every
// row behind the frontier for every claim to read again from there; beyond
// it (a transaction that inserted rows stays open), only head claims do.
const lateWindow = 10_000

// floors is where a store's claims read from.
//
// A delivered row is deleted, but its entries stay in the indexes until
// vacuum can remove them, which it cannot while any snapshot older than
// the delete is open: a long report, pg_dump, a slot, a standby's feedback.
// A claim that read the pending rows from their start passed over all of
// them, more by the minute.
//
// So claims read from two points the store keeps. The frontier is the
// last row a claim took from the rows that never waited: the next claim
// reads above it. The floor is below every pending row that no claim
// tracks; key checks read from it, and so does a claim every HeadEvery,
// or at once when the store knows of rows below the frontier that may be
// ready (a head claim). The floor is the lowest of:
//
//   - the safe id as the last head claim found it: below the safe id,
//     every transaction that took an id has ended (see the strict-order
//     watermark), so no row can still appear there; and a head claim
//     that began once the safe id had passed a row committed late, below
//     the frontier, has seen it;
//   - the frontier;
//   - where each claim under way or in flight began, then its lowest row,
//     counting the rows its key check locked for a moment (see hold);
//   - marks: rows that may be ready below the frontier with no claim
//     tracking them: rows a claim passed over because their key was in
//     flight elsewhere, and, once a claim ends, those it held back for
//     such a key or left without an outcome, or all of a claim that was
//     given back; and where a partition taken over from another process
//     begins. A head claim clears the marks older than it, as far as it
//     read;
//   - where each topic left out of claims (its destination is not taking
//     rows) was first left out, or below that where a head claim that
//     left it out began, until a head claim reads its rows again.
//
// Pending rows below the floor can only be rows that wait (for a retry, a
// delay, a lease, a key ahead of them): their next_attempt_at differs
// from their created_at, and the waiting rows' indexes find them, which
// hold no entry for a row that never waited. What a claim reads then
// grows with the rows it delivers and those in flight, never with the
// rows delivered before: a held snapshot costs it nothing.
//
// A store that cannot trust its floor (another process may claim its
// partitions: an older relay, or no lease; or the safe id is unknown)
// reads from the table's start instead, as head claims from 0 and key
// checks from the lowest pending id.
type floors struct {
	mu       sync.Mutex
	frontier int64
	gen      uint64
	marks    []mark
	paused   map[string]mark  // topics left out of claims, from where
	open     map[uint64]int64 // claims under way or in flight: the lowest id each may hold above the floor
	live     map[uint64]bool  // claims begun and not yet ended
	safe     int64            // the safe id
	seen     int64            // up to where claims saw every row
	epoch    uint64           // counts resets: a claim begun before one tells nothing
	lastHead time.Time
	short    bool // the last claim came back short of its limit
}

// mark says that rows above id, below the frontier, may be ready with no
// claim tracking them. Like the frontier and the floor, it is a bound
// that claims read above.
type mark struct {
	id  int64
	gen uint64 // when it was made: a head claim clears older marks
	// until holds the mark, whatever a head claim finds, until then: the
	// locks of a process whose lease ran out may last until then.
	until time.Time
}

// claimStart is what a claim reads.
type claimStart struct {
	gen   uint64
	from  int64 // rows that never waited are read above it
	floor int64 // the key check reads pending rows above it
	head  bool  // from is the floor
	// marked: from is the lowest due mark; like a head claim, it clears
	// the marks it reads past.
	marked bool
	safe   int64 // the safe id at its start
	seen   int64 // where claims had seen every row, at its start
	epoch  uint64
	// The partitions it reads; none when !partsOK.
	partLo, partHi int
	partsOK        bool
}

// begin registers a claim about to run at now, leaving topics excluded
// out, and says where it reads from. trusted says the floor can be
// trusted; otherwise a head claim reads from the table's start.
//
// It takes the claim's range of parts under the same lock as the floor, so
// that a claim reads a partition only with the marks of its being taken
// in its floor.
func (f *floors) begin(now time.Time, excluded []string, trusted bool, parts *partitionSet) claimStart {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	c := claimStart{gen: f.gen, floor: f.floorLocked(), safe: f.safe, seen: f.seen, epoch: f.epoch}
	c.partLo, c.partHi, c.partsOK = parts.claimRange(c.gen, now)
	c.head = now.Sub(f.lastHead) >= HeadEvery
	// The lowest due mark, and where each topic that takes rows again
	// was left out: a claim reads from there.
	due := int64(-1)
	for _, m := range f.marks {
		if !m.until.After(now) && (due < 0 || m.id < due) {
			due = m.id
		}
	}
	for topic, m := range f.paused {
		if !contains(excluded, topic) && (due < 0 || m.id < due) {
			due = m.id
		}
	}
	if !trusted {
		c.floor = 0
		// As claims did before floors: from the start again after a
		// claim that came back short.
		c.head = c.head || f.short || due >= 0
	}
	c.from = f.frontier
	switch {
	case c.head:
		c.from = c.floor
		f.lastHead = now
	case due >= 0:
		// From the lowest due mark, not from the floor: claims in
		// flight, which hold the floor where they began, would have
		// every claim begin there too, and hold it there in turn.
		c.from, c.marked = max(due, c.floor), true
	case trusted && f.seen < f.frontier && f.frontier-f.seen <= lateWindow:
		// Rows committed late, since the last claim, lie above where
		// claims have seen every row: read again from there, a few rows
		// as a rule, rather than wait for the next head claim.
		c.from = f.seen
	}
	if f.open == nil {
		f.open, f.live = map[uint64]int64{}, map[uint64]bool{}
	}
	f.open[c.gen] = c.from
	f.live[c.gen] = true
	return c
}

// claimResult is what a claim found, for its floors. Rows are ids.
type claimResult struct {
	none           bool // it read nothing: the store held no partition
	short          bool
	lastFresh      int64    // the last row read above from, 0 when none
	lowestHeld     int64    // its lowest row above the floor, 0 when none
	passedKeys     bool     // it left keys in flight elsewhere out
	passedFrom     int64    // and their rows lie above this id
	excludedTopics []string // topics it left out
}

// claimed records what the claim c found.
func (f *floors) claimed(c claimStart, r claimResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.none || c.epoch != f.epoch {
		// It began before a reset: it holds its rows until it ends,
		// and says nothing of where claims have got to.
		if r.lowestHeld > 0 {
			f.open[c.gen] = r.lowestHeld - 1
		} else {
			delete(f.open, c.gen)
		}
		return
	}
	f.short = r.short
	f.frontier = max(f.frontier, r.lastFresh)
	// It read every row above its start that was committed when it
	// began, which every row up to the safe id then was; a full claim
	// only up to its last row.
	read := c.safe
	if !r.short {
		read = max(r.lastFresh, c.from)
	}
	if c.from <= c.seen {
		f.seen = max(f.seen, min(c.safe, read))
	}
	if c.head || c.marked {
		f.clearMarks(c, r, read)
	}
	if r.passedKeys {
		f.marks = append(f.marks, mark{id: max(c.from, r.passedFrom), gen: c.gen})
	}
	// It passed the rows of the topics it left out, from its start: they
	// are where the marks it cleared may have pointed too.
	for _, topic := range r.excludedTopics {
		if m, ok := f.paused[topic]; !ok || c.from < m.id || m.gen < c.gen {
			if f.paused == nil {
				f.paused = map[string]mark{}
			}
			low := c.from
			if ok {
				low = min(low, m.id)
			}
			f.paused[topic] = mark{id: low, gen: c.gen}
		}
	}
	if r.lowestHeld > 0 {
		f.open[c.gen] = r.lowestHeld - 1
	} else {
		delete(f.open, c.gen)
	}
}

// clearMarks records what head or marked claim c found, having read up to
// read: what the older marks said is done with as far as it read, and
// holds on from there.
func (f *floors) clearMarks(c claimStart, r claimResult, read int64) {
	now := time.Now()
	kept := f.marks[:0]
	rest := false
	for _, m := range f.marks {
		switch {
		case m.gen > c.gen || m.id < c.from || m.until.After(now):
			kept = append(kept, m)
		case !r.short:
			rest = true
		}
	}
	if rest {
		kept = append(kept, mark{id: read, gen: c.gen})
	}
	f.marks = kept
	for topic, m := range f.paused {
		if m.gen < c.gen && m.id >= c.from && !contains(r.excludedTopics, topic) {
			if r.short {
				delete(f.paused, topic)
			} else {
				f.paused[topic] = mark{id: read, gen: c.gen}
			}
		}
	}
}

// done ends claim gen's flight; left is the lowest of its rows that got
// no outcome, ready again below the frontier (0 for none).
func (f *floors) done(gen uint64, left int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.open, gen)
	delete(f.live, gen)
	if left > 0 {
		f.gen++
		f.marks = append(f.marks, mark{id: left - 1, gen: f.gen})
	}
}

// failed ends claim c, which was given back or failed: any row above its
// start may be ready again, and from probed up if lower (0 for none): the
// lowest row its key check locked for a moment.
func (f *floors) failed(c claimStart, probed int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.open, c.gen)
	delete(f.live, c.gen)
	f.gen++
	id := c.from
	if probed > 0 {
		id = min(id, probed-1)
	}
	f.marks = append(f.marks, mark{id: id, gen: f.gen})
	f.short = true
}

// hold keeps the floor at or below id while claim gen is under way: it is
// about to lock rows above id that it did not claim. A claim that meets
// them locked passes over them, and if it came back short would take
// them for read. The claim's lowest held row then covers them until it
// ends, and its end marks them.
func (f *floors) hold(gen uint64, id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if from, ok := f.open[gen]; ok && id < from {
		f.open[gen] = id
	}
}

// takeOver records a partition taken over whose rows its owner tracked
// above floor; until is how long the owner's locks may last.
func (f *floors) takeOver(floor int64, until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.takeOverLocked(floor, until)
}

func (f *floors) takeOverLocked(floor int64, until time.Time) {
	f.gen++
	f.marks = append(f.marks, mark{id: floor, gen: f.gen, until: until})
	// Its rows above floor have not been seen by this store's claims.
	f.seen = min(f.seen, floor)
}

// startAt has a store that holds no partition yet, and takes some whose
// owners tracked their rows from floors up, start claiming from the lowest
// of those rather than from the table's start.
func (f *floors) startAtLocked(floors []int64) {
	if len(floors) == 0 {
		return
	}
	f.frontier = max(f.frontier, slices.Min(floors))
}

// reset forgets where claims have got to: the next claims read from the
// table's start, and the safe id is found anew. Claims in flight still
// hold the floor where they began.
func (f *floors) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frontier, f.seen, f.safe = 0, 0, 0
	f.marks, f.paused = nil, nil
	f.lastHead = time.Time{}
	f.epoch++
}

// lastGen is the generation of the latest claim begun.
func (f *floors) lastGen() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen
}

// oldestLive is the generation of the oldest claim not yet ended; ok is
// false when none is under way.
func (f *floors) oldestLive() (gen uint64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for g := range f.live {
		if !ok || g < gen {
			gen, ok = g, true
		}
	}
	return gen, ok
}

// advanceSafe records that no row can still appear at or below id.
func (f *floors) advanceSafe(id int64) {
	f.mu.Lock()
	f.safe = max(f.safe, id)
	f.mu.Unlock()
}

// floor is the current floor.
func (f *floors) floor() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.floorLocked()
}

func (f *floors) floorLocked() int64 {
	low := min(f.seen, f.frontier)
	for _, m := range f.marks {
		low = min(low, m.id)
	}
	for _, m := range f.paused {
		low = min(low, m.id)
	}
	for _, id := range f.open {
		low = min(low, id)
	}
	return max(low, 0)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
