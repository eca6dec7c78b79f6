package relay

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

func keyed(keys ...string) []sink.Record {
	recs := make([]sink.Record, len(keys))
	for i, k := range keys {
		recs[i] = sink.Record{ID: int64(i + 1), Key: k, HasKey: k != ""}
	}
	return recs
}

// A worker learns which of the keys it asks about another worker holds,
// until that worker's batch is removed; its own batches (owners 2i and
// 2i+1: the one it delivers, the one it claims ahead) and keyless rows
// never count, and batches of one owner are told apart.
func TestInflightKeysElsewhere(t *testing.T) {
	t.Parallel()
	var f inflightKeys
	mine := f.add(0, keyed("a", "b"), nil)
	mineAhead := f.add(1, keyed("g"), nil)
	other := f.add(2, keyed("c", "", "d"), nil)
	leasedOne := f.add(leasedOwner, keyed("e"), nil)
	leasedTwo := f.add(leasedOwner, keyed("f", "e"), nil)
	empty := f.add(2, nil, nil)

	elsewhere := func(worker int, keys ...string) string {
		got, _ := f.elsewhere(worker, slices.Clone(keys))
		return fmt.Sprint(got)
	}
	if got := elsewhere(0, "a", "c", "", "d", "e", "f", "x"); got != "[c d e f]" {
		t.Errorf("worker 0 sees %s in flight elsewhere, want [c d e f]", got)
	}
	if got := elsewhere(2, "d", "b", "a"); got != "[b a]" {
		t.Errorf("worker 2 sees %s, want [b a], in the order asked", got)
	}
	if got := elsewhere(1, "g", "a", "c"); got != "[c]" {
		t.Errorf("worker 0 claiming ahead sees %s, want [c]: g and a are its own", got)
	}
	if got := elsewhere(3, "g"); got != "[g]" {
		t.Errorf("worker 2 claiming ahead sees %s, want [g]", got)
	}
	if got, lowest := f.elsewhere(0, nil); got != nil || lowest != 0 {
		t.Errorf("no keys asked: %v, lowest %d", got, lowest)
	}
	f.remove(other)
	f.remove(empty)
	f.remove(leasedOne)
	if got := elsewhere(0, "c", "d", "e", "f"); got != "[e f]" {
		t.Errorf("after removing worker 2's batch and one leased batch: %s, want [e f]", got)
	}
	f.remove(leasedTwo)
	f.remove(mine)
	f.remove(mineAhead)
	if got := elsewhere(2, "a", "e"); got != "[]" || len(f.batches) != 0 {
		t.Errorf("after removing every batch: %s, %d batches left", got, len(f.batches))
	}
	// The lowest id in flight is of the keys found, not of the batch.
	claimed := f.add(2, []sink.Record{{ID: 30, Key: "p", HasKey: true}, {ID: 10, Key: "q", HasKey: true}, {ID: 20, Key: "r", HasKey: true}}, nil)
	if got, lowest := f.elsewhere(0, []string{"p", "r", "x"}); fmt.Sprint(got) != "[p r]" || lowest != 20 {
		t.Errorf("worker 0 sees %v from %d, want [p r] from 20", got, lowest)
	}
	f.remove(claimed)
	// A batch claimed ahead holds rows of its keys above those of the
	// batch before it, which may have failed to send them and left them
	// pending: the lowest counts the rows it follows of the keys asked.
	f.add(3, []sink.Record{{ID: 40, Key: "p", HasKey: true}, {ID: 50, Key: "r", HasKey: true}},
		[]store.KeyedRow{{Key: "q", ID: 5}, {Key: "p", ID: 12}, {Key: "r", ID: 15}})
	if got, lowest := f.elsewhere(0, []string{"p", "r"}); fmt.Sprint(got) != "[p r]" || lowest != 12 {
		t.Errorf("worker 0 sees %v from %d, want [p r] from 12, the lowest followed row of theirs", got, lowest)
	}
}

// Calls for help wake idle workers, but not one held off: its last claim
// found only rows of keys in flight elsewhere. Notifications wake it.
func TestHeldOffWorkerSitsOutCallsForHelp(t *testing.T) {
	t.Parallel()
	idle, heldOff := &worker{wake: make(chan struct{}, 1)}, &worker{wake: make(chan struct{}, 1)}
	heldOff.heldOff.Store(time.Now().Add(time.Hour).UnixNano())
	s := &source{workers: []*worker{idle, heldOff}}
	s.askHelp()
	if len(idle.wake) != 1 || len(heldOff.wake) != 0 {
		t.Fatalf("after a call for help: idle worker woken %d, held-off worker woken %d; want 1 and 0", len(idle.wake), len(heldOff.wake))
	}
	<-idle.wake
	s.wakeAll()
	if len(idle.wake) != 1 || len(heldOff.wake) != 1 {
		t.Fatalf("after a notification: woken %d and %d, want both", len(idle.wake), len(heldOff.wake))
	}
	<-heldOff.wake
	heldOff.heldOff.Store(time.Now().Add(-time.Millisecond).UnixNano())
	s.askHelp()
	if len(heldOff.wake) != 1 {
		t.Fatal("a worker whose holding off has ended was not woken by a call for help")
	}
}
