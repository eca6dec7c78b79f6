package relay

import (
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// avoidKeys are keys a worker recently found in flight elsewhere (a hot key
// another worker is delivering). While another worker of this relay still
// has them in flight, the worker does not claim them: it could only lock
// their rows and skip them, and its locks would make the deliverer's next
// claim skip them too. Avoidance ends with the other worker's batch, so two
// workers never avoid a key at once.
type avoidKeys map[string]time.Time

const (
	avoidFor      = time.Second
	avoidMaxItems = 64
)

func (a avoidKeys) add(keys []string, now time.Time) {
	for _, k := range keys {
		if len(a) >= avoidMaxItems {
			return
		}
		a[k] = now.Add(avoidFor)
	}
}

// until returns when the avoidance of every key ends.
func (a avoidKeys) until() time.Time {
	var last time.Time
	for _, t := range a {
		if t.After(last) {
			last = t
		}
	}
	return last
}

func (a avoidKeys) keys(now time.Time) []string {
	var out []string
	for k, until := range a {
		if now.After(until) {
			delete(a, k)
			continue
		}
		out = append(out, k)
	}
	return out
}

// inflightKeys records the batches in flight and who delivers each, so a
// worker can tell which of the few keys it avoids another one holds. A
// batch is registered whole rather than key by key: a map entry per key,
// made and removed for every row, cost more than the rare look-ups that
// scan the batches.
type inflightKeys struct {
	mu      sync.Mutex
	next    inflightID
	batches map[inflightID]inflightBatch
}

// inflightID names a batch registered in flight.
type inflightID int64

type inflightBatch struct {
	owner   int
	recs    []sink.Record
	follows []store.KeyedRow
}

// add registers recs in flight under owner until remove is called with
// the id it returns. follows are the rows a batch claimed ahead follows
// (see store.ClaimParams.Follows): those the batch before failed to send
// stay pending below its rows of their keys while it is in flight.
func (f *inflightKeys) add(owner int, recs []sink.Record, follows []store.KeyedRow) inflightID {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	if len(recs) > 0 {
		if f.batches == nil {
			f.batches = map[inflightID]inflightBatch{}
		}
		f.batches[f.next] = inflightBatch{owner: owner, recs: recs, follows: follows}
	}
	return f.next
}

// empty reports whether no batch is in flight.
func (f *inflightKeys) empty() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.batches) == 0
}

func (f *inflightKeys) remove(id inflightID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.batches, id)
}

// elsewhere returns those of keys that another worker than the owner's
// has in flight, in their order: a worker's batch and the one it claims
// ahead of it (owners 2i and 2i+1) are both its own. It also returns the
// lowest id of those keys in flight or followed by a batch in flight (0
// for none): the rows of theirs a claim passes over lie above it.
func (f *inflightKeys) elsewhere(owner int, keys []string) ([]string, int64) {
	if len(keys) == 0 {
		return nil, 0
	}
	found := make(map[string]bool, len(keys))
	for _, k := range keys {
		found[k] = false
	}
	var lowest int64
	f.mu.Lock()
	for _, b := range f.batches {
		if b.owner>>1 == owner>>1 {
			continue
		}
		for i := range b.recs {
			if r := &b.recs[i]; r.HasKey {
				if _, asked := found[r.Key]; asked {
					found[r.Key] = true
					if lowest == 0 || r.ID < lowest {
						lowest = r.ID
					}
				}
			}
		}
		for _, r := range b.follows {
			if _, asked := found[r.Key]; asked && (lowest == 0 || r.ID < lowest) {
				lowest = r.ID
			}
		}
	}
	f.mu.Unlock()
	out := keys[:0]
	for _, k := range keys {
		if found[k] {
			out = append(out, k)
		}
	}
	return out, lowest
}
