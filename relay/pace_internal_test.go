package relay

import (
	"testing"
	"time"
)

func TestSmoothMovesAQuarterOfTheWay(t *testing.T) {
	var p pace
	p.note(8*time.Millisecond, 40*time.Millisecond)
	if p.db.Load() != int64(8*time.Millisecond) || p.publish.Load() != int64(40*time.Millisecond) {
		t.Fatalf("first note: db %v publish %v, want 8ms and 40ms", time.Duration(p.db.Load()), time.Duration(p.publish.Load()))
	}
	p.note(16*time.Millisecond, 0)
	if p.db.Load() != int64(10*time.Millisecond) || p.publish.Load() != int64(30*time.Millisecond) {
		t.Fatalf("second note: db %v publish %v, want 10ms and 30ms", time.Duration(p.db.Load()), time.Duration(p.publish.Load()))
	}
}

// While the database bounds the outbox, one worker at a time takes
// batches; while publishing does, all of them.
func TestWorkersStandByWhileTheDatabaseBounds(t *testing.T) {
	s := &source{r: &Relay{epoch: time.Now().Add(-time.Hour)}}
	s.workers = []*worker{newWorker(s, 0), newWorker(s, 1)}
	a, b := s.workers[0], s.workers[1]
	dbBound := func() {
		s.pace.db.Store(int64(20 * time.Millisecond))
		s.pace.publish.Store(int64(5 * time.Millisecond))
		s.pace.backlog.Store(true)
	}

	// Nothing delivered yet: both take batches.
	if !a.takesBatches() || !b.takesBatches() {
		t.Fatal("before any batch, a worker stands by")
	}
	dbBound()
	if a.mayClaimAhead() || b.mayClaimAhead() {
		t.Fatal("two workers on, bound by the database, may both claim ahead: neither would step back")
	}
	// Both on: the first to look steps back, the other stays.
	if a.takesBatches() {
		t.Fatal("with two workers on and the database bound, the first to look stays on")
	}
	if !b.takesBatches() || !b.mayClaimAhead() {
		t.Fatal("the last worker on steps back, or may not claim ahead")
	}
	if a.takesBatches() {
		t.Fatal("a worker off comes on while another is on")
	}
	// The one on goes idle: it wakes the one standing by, which comes on.
	select {
	case <-a.wake:
	default:
	}
	b.turnOff()
	select {
	case <-a.wake:
	default:
		t.Fatal("the last worker on went idle, and did not wake the one standing by")
	}
	if !a.takesBatches() || b.takesBatches() {
		t.Fatal("with no worker on, the first to look does not come on, or the second does too")
	}

	// Publishing bounds the outbox: both take batches.
	s.pace.publish.Store(int64(25 * time.Millisecond))
	if !b.takesBatches() || !b.mayClaimAhead() {
		t.Fatal("publishing bounds the outbox, and a worker stands by or may not claim ahead")
	}

	// No backlog: the workers take turns at the rows as they come.
	dbBound()
	s.pace.backlog.Store(false)
	b.turnOff()
	if !b.takesBatches() {
		t.Fatal("claims less than full, and a worker stands by")
	}

	// Claims bounded by their destinations' slots: both take batches.
	dbBound()
	s.pace.slotBound.Store(true)
	b.turnOff()
	if !b.takesBatches() {
		t.Fatal("claims bounded by max_in_flight, and a worker stands by")
	}
	s.pace.slotBound.Store(false)

	// Bound by the database again, but the worker on has been publishing
	// for longer than a batch spends in the database: the other helps.
	dbBound()
	b.turnOff()
	a.publishingSince.Store(int64(time.Since(s.r.epoch)-time.Second) + 1)
	if !b.takesBatches() {
		t.Fatal("a publish a second long, 20ms in the database a batch, and the worker standing by does not help")
	}
	a.publishingSince.Store(int64(time.Since(s.r.epoch)-10*time.Millisecond) + 1)
	b.turnOff()
	if b.takesBatches() {
		t.Fatal("a publish of usual length calls the worker standing by")
	}
}
