package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// gatedPublisher is a fakePublisher that calls before ahead of each
// publish, with the call's number from 1.
type gatedPublisher struct {
	fakePublisher
	calls  atomic.Int32
	before func(call int)
}

func (p *gatedPublisher) Publish(ctx context.Context, recs []sink.Record) []error {
	p.before(int(p.calls.Add(1)))
	return p.fakePublisher.Publish(ctx, recs)
}

// claimSizes records how many rows each claim returned, in order.
type claimSizes struct {
	settled
	mu    sync.Mutex
	sizes []int
}

func (o *claimSizes) Claimed(_ time.Duration, rows int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sizes = append(o.sizes, rows)
}

func (o *claimSizes) first(n int) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprint(o.sizes[:min(n, len(o.sizes))])
}

// hotKeyAhead drains 30 rows of one key in batches of 10 with one worker,
// whose first publish waits for the next batch to be claimed ahead; fail
// decides each publish attempt. It returns the ids sent, in order, and
// the sizes of the first two claims.
func hotKeyAhead(t *testing.T, fail func(r sink.Record, attempt int) error) ([]int64, string) {
	s := pgtest.NewSchema(t)
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'hot', g::text::bytea FROM generate_series(1, 30) g`)
	var rel atomic.Pointer[relay.Relay]
	pub := &gatedPublisher{fakePublisher: fakePublisher{fail: fail}, before: func(call int) {
		if call == 1 {
			awaitClaims(t, &rel, 2)
		}
	}}
	obs := &claimSizes{}
	// A claim ahead needs two connections to spare: nothing else here
	// takes one (no cleanup, no polling) until the first publish is over.
	h := start(t, s, pub, options{cfg: relay.Config{Workers: 1, BatchSize: 10, Observer: obs, DeadLetterRetention: retry.Forever}})
	rel.Store(h.relay)
	testwait.For(t, "every row delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	h.stop()
	return pub.published(), obs.first(2)
}

// A hot key's next batch is claimed while the one before it publishes,
// behind it, rather than held back by it: one worker pipelines a key.
func TestHotKeyBatchClaimedAheadBehindItsBatch(t *testing.T) {
	t.Parallel()
	sent, claims := hotKeyAhead(t, func(sink.Record, int) error { return nil })
	if claims != "[10 10]" {
		t.Fatalf("the first two claims returned %s rows, want [10 10]: the second, claimed ahead, behind the first", claims)
	}
	for i, id := range sent {
		if id != int64(i+1) {
			t.Fatalf("sent %v, want ids 1 to 30 in order, once each", sent)
		}
	}
	if len(sent) != 30 {
		t.Fatalf("sent %d rows, want 30", len(sent))
	}
}

// Where a row of a batch fails, the rows of its key claimed ahead behind
// it are held back until it is sent: per-key order holds.
func TestClaimedAheadHeldBackBehindAFailedRow(t *testing.T) {
	t.Parallel()
	sent, claims := hotKeyAhead(t, func(r sink.Record, attempt int) error {
		if string(r.Payload) == "5" && attempt == 1 {
			return sink.Transient(errors.New("leader moved"), 0)
		}
		return nil
	})
	if claims != "[10 10]" {
		t.Fatalf("the first two claims returned %s rows, want [10 10]", claims)
	}
	if len(sent) != 30 {
		t.Fatalf("sent %d rows, want 30: %v", len(sent), sent)
	}
	for i := 1; i < len(sent); i++ {
		if sent[i] < sent[i-1] {
			t.Fatalf("sent %v: %d after %d", sent, sent[i], sent[i-1])
		}
	}
}
