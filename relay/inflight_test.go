package relay

import (
	"fmt"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/outbox"
)

func keyed(keys ...string) []outbox.Record {
	recs := make([]outbox.Record, len(keys))
	for i, k := range keys {
		recs[i] = outbox.Record{ID: int64(i + 1), Key: k, HasKey: k != ""}
	}
	return recs
}

// A worker learns which of the keys it asks about another owner holds,
// until that owner's batch is removed; its own batches and keyless rows
// never count, and batches of one owner are told apart.
func TestInflightKeysElsewhere(t *testing.T) {
	t.Parallel()
	var f inflightKeys
	mine := f.add(0, keyed("a", "b"))
	other := f.add(2, keyed("c", "", "d"))
	leasedOne := f.add(leasedOwner, keyed("e"))
	leasedTwo := f.add(leasedOwner, keyed("f", "e"))
	empty := f.add(2, nil)

	elsewhere := func(worker int, keys ...string) string {
		return fmt.Sprint(f.elsewhere(worker, slices.Clone(keys)))
	}
	if got := elsewhere(0, "a", "c", "", "d", "e", "f", "x"); got != "[c d e f]" {
		t.Errorf("worker 0 sees %s in flight elsewhere, want [c d e f]", got)
	}
	if got := elsewhere(2, "d", "b", "a"); got != "[b a]" {
		t.Errorf("worker 2 sees %s, want [b a], in the order asked", got)
	}
	if got := f.elsewhere(0, nil); got != nil {
		t.Errorf("no keys asked: %v", got)
	}
	f.remove(other)
	f.remove(empty)
	f.remove(leasedOne)
	if got := elsewhere(0, "c", "d", "e", "f"); got != "[e f]" {
		t.Errorf("after removing worker 2's batch and one leased batch: %s, want [e f]", got)
	}
	f.remove(leasedTwo)
	f.remove(mine)
	if got := elsewhere(2, "a", "e"); got != "[]" || len(f.batches) != 0 {
		t.Errorf("after removing every batch: %s, %d batches left", got, len(f.batches))
	}
}
