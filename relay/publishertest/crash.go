package publishertest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// Crashes is how many times the crash test kills the destination's server.
const Crashes = 5

// crashKeys and crashRecords shape the crash test's burst: records spread
// over keys and both topics, some without a key, published as fast as the
// destination takes them.
const (
	crashKeys    = 30
	crashRecords = 3000
	crashBatch   = 50
)

// serverKilled publishes a burst as the relay does (in id order, batch
// after batch, each record again until it is sent, a key's later records
// behind its failed one) while the destination's server is killed and
// started again, Crashes times, each once some records went through since
// the last. A record that fails for good would be dead-lettered by the
// relay for what is the server's crash, not the record's: the test fails.
func serverKilled(t *testing.T, s Sink) {
	d, crash := s.Crashable(t)
	recs := make([]sink.Record, crashRecords)
	for i := range recs {
		// A key keeps to one topic: the destination's order is each
		// topic's.
		id, k := int64(i+1), i%crashKeys
		key, topic := "k"+strconv.Itoa(k), []string{TopicA, TopicB}[k%2]
		if i%10 == 9 {
			key, topic = "", []string{TopicA, TopicB}[i/10%2]
		}
		recs[i] = record(id, topic, key)
	}
	b := &burst{recs: recs, left: len(recs)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.run(ctx, d) }()
	for i := range Crashes {
		from := b.sent.Load()
		// Some records go through first, so that the kill comes in the
		// middle of the burst, with publishes under way.
		testwait.State(t, 2*time.Minute, func() (bool, string) {
			select {
			case err := <-done:
				t.Fatalf("before crash %d: %v", i+1, err)
			default:
			}
			return b.sent.Load() >= from+crashBatch, fmt.Sprintf("%d records sent since crash %d", b.sent.Load()-from, i)
		})
		if b.sent.Load() == int64(len(recs)) {
			t.Fatalf("the burst ended before crash %d: make it longer", i+1)
		}
		crash(t)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("%d of %d records still not sent 3 minutes after the last crash", b.pending(), len(recs))
	}
	count := accepted(t, d, recs)
	dups := 0
	for _, r := range recs {
		switch c := count[r.ID]; {
		case c == 0:
			t.Errorf("record %d acknowledged but not at the destination after %d crashes: lost", r.ID, Crashes)
		case c > 1:
			dups += c - 1
		}
	}
	t.Logf("%d records through %d crashes of the server: %d publishes failed (none for good), %d duplicates at the destination",
		len(recs), Crashes, b.failed.Load(), dups)
}

// burst publishes its records as the relay would, until each is sent.
type burst struct {
	mu     sync.Mutex
	recs   []sink.Record
	done   []bool
	left   int
	sent   atomic.Int64
	failed atomic.Int64
}

func (b *burst) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.left
}

// run publishes until every record is sent, ctx ends, or a record fails
// for good.
func (b *burst) run(ctx context.Context, d Destination) error {
	b.done = make([]bool, len(b.recs))
	wait := time.Duration(0)
	for b.pending() > 0 {
		if wait > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		}
		batch, idx := b.next()
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		errs := d.Publisher.Publish(pctx, batch)
		cancel()
		if len(errs) != len(batch) {
			return fmt.Errorf("Publish returned %d errors for %d records", len(errs), len(batch))
		}
		progress := false
		for i, err := range errs {
			switch {
			case err == nil:
				b.mu.Lock()
				b.done[idx[i]] = true
				b.left--
				b.mu.Unlock()
				b.sent.Add(1)
				progress = true
			case errors.Is(err, sink.ErrNotSent):
			case sink.Classify(err).Class == sink.ClassPermanent:
				ce := sink.Classify(err)
				return fmt.Errorf("record %d failed for good through a crash of the server (%s, reason %q): %v", batch[i].ID, ce.Class, ce.Reason, err)
			default:
				b.failed.Add(1)
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// A batch that sent nothing met the server down: look again
		// soon, as the relay's breaker would.
		if progress {
			wait = 0
		} else {
			wait = min(max(2*wait, 10*time.Millisecond), 200*time.Millisecond)
		}
	}
	return nil
}

// next returns the first pending records in id order, and their indexes:
// a key's records come in order, each behind the ones before it.
func (b *burst) next() ([]sink.Record, []int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var batch []sink.Record
	var idx []int
	for i := range b.recs {
		if !b.done[i] {
			batch = append(batch, b.recs[i])
			idx = append(idx, i)
			if len(batch) == crashBatch {
				break
			}
		}
	}
	return batch, idx
}
