package relay

import (
	"sync/atomic"
	"time"
)

// pace is where an outbox's batches spend their time: in the database
// (the claim and the write-back) or publishing (from the claim to the
// write-back: waiting for a turn or a slot, planning, publishing and
// judging). It decides how many of the outbox's workers take batches.
//
// A second worker pays off while publishing bounds the outbox: it claims
// and writes back while the first publishes, so the destinations are
// never left waiting on the database. While the database bounds it, a
// second worker only costs the database: its claims pass over the rows
// the first has locked, and it holds back what the first's claim ahead
// would take. One worker then takes the batches, claiming its next batch
// while it publishes (see worker.claimAhead), and the others stand by. A
// publish under way longer than a batch's usual time in the database (a
// slow or stuck destination) calls them at once, so the rows of the
// other destinations never wait on it.
type pace struct {
	db, publish atomic.Int64 // smoothed nanoseconds a batch spends in each
	// slotBound says the last claim took fewer rows than a batch because
	// its destinations' max_in_flight had no more room: their slots stay
	// busy only while another worker claims and writes back as one
	// publishes, which a claim ahead, finding no room, cannot do.
	slotBound atomic.Bool
	// backlog says the last claim came back full: more rows wait than a
	// batch. Without one, the workers take turns at the rows as they
	// come, and a row committed while one publishes need not wait for it.
	backlog atomic.Bool
}

// note learns from a delivered batch's time in the database and in
// publishing.
func (p *pace) note(db, publish time.Duration) {
	smooth(&p.db, int64(db))
	smooth(&p.publish, int64(publish))
}

// smooth moves v a quarter of the way to x (all the way from 0). Workers
// racing on it lose an update, which the next batch makes up.
func smooth(v *atomic.Int64, x int64) {
	old := v.Load()
	if old == 0 {
		v.Store(max(x, 1))
		return
	}
	v.Store(max(old+(x-old)/4, 1))
}

// helpWanted reports whether all the outbox's workers take batches:
// unless a backlog is being drained with the database as its bound. That
// is, until a batch has been delivered, while claims come back less than
// full, while batches publish longer than they spend in the database or
// are bounded by their destinations' slots, and while a worker has been
// publishing longer than a batch spends in the database.
func (s *source) helpWanted() bool {
	db := s.pace.db.Load()
	if db == 0 || !s.pace.backlog.Load() || s.pace.publish.Load() > db || s.pace.slotBound.Load() {
		return true
	}
	now := int64(time.Since(s.r.epoch)) + 1
	for _, w := range s.workers {
		if since := w.publishingSince.Load(); since != 0 && now-since > db {
			return true
		}
	}
	return false
}

// takesBatches reports whether w claims now, rather than standing by.
// While help is wanted (see pace), every worker does. Otherwise one
// worker of the outbox at a time: one that is on stays on unless another
// is; one that is off comes on only when none is. A worker that goes idle
// turns off, and calls those standing by when it was the last one on (see
// turnOff).
func (w *worker) takesBatches() bool {
	s := w.s
	if len(s.workers) == 1 || s.helpWanted() {
		w.turnOn()
		return true
	}
	// Standing by from before the count changes, so that the last worker
	// to turn off sees it.
	w.standing.Store(true)
	if !w.on {
		if s.on.CompareAndSwap(0, 1) {
			w.on = true
			w.standing.Store(false)
			return true
		}
		return false
	}
	for {
		n := s.on.Load()
		if n <= 1 {
			w.standing.Store(false)
			return true // the last one on stays
		}
		if s.on.CompareAndSwap(n, n-1) {
			w.on = false
			return false
		}
	}
}

// turnOn counts w among the workers taking batches.
func (w *worker) turnOn() {
	w.standing.Store(false)
	if !w.on {
		w.on = true
		w.s.on.Add(1)
	}
}

// turnOff stops counting w among the workers taking batches; the last
// one off wakes those standing by, one of which comes on.
func (w *worker) turnOff() {
	if !w.on {
		return
	}
	w.on = false
	if w.s.on.Add(-1) == 0 {
		for _, o := range w.s.workers {
			if o.standing.Load() {
				o.nudge()
			}
		}
	}
}

// mayClaimAhead reports whether w may claim its next batch while it
// publishes: while help is wanted, or as the only worker on. Two workers
// on that both claimed ahead, batch after batch, would never come back to
// takesBatches, so neither would step back.
func (w *worker) mayClaimAhead() bool {
	return w.s.on.Load() <= 1 || w.s.helpWanted()
}

// startPublishing marks w's batch as publishing, and, while other workers
// stand by or idle, wakes them all once it has taken longer than a
// batch's time in the database: they take batches while it lasts (see
// helpWanted), and what they decided before it began no longer holds.
// The returned function ends the mark.
func (w *worker) startPublishing() (end func()) {
	s := w.s
	w.publishingSince.Store(int64(time.Since(w.r.epoch)) + 1)
	var call *time.Timer
	if db := s.pace.db.Load(); db > 0 && int(s.on.Load()) < len(s.workers) {
		call = time.AfterFunc(time.Duration(db)+time.Millisecond, s.wakeAll)
	}
	return func() {
		if call != nil {
			call.Stop()
		}
		w.publishingSince.Store(0)
	}
}
