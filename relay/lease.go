package relay

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testsignal"
	"github.com/outbox-relay/outbox-relay/relay/flow"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// leasedOwner owns, in the in-flight registry, the keys of leased
// deliveries: every worker leaves them out of its claims.
const leasedOwner = -1

// leaser delivers the groups of destinations with a visibility timeout:
// outside any transaction, after the claim that leased them committed,
// writing back only where the lease still holds.
type leaser struct {
	store          *store.Store
	inflight       *inflightKeys
	tally          *tally
	log            *slog.Logger
	publishTimeout time.Duration
	queryTimeout   time.Duration
	wake           func() // the workers, once keys are free again
	wg             sync.WaitGroup
	// written tells tests the rows a leased write-back settled.
	written *testsignal.Signal[int]
}

// start delivers g in the background; its keys stay in flight until its
// write-back. The group's bulkhead slots are its until then too.
func (l *leaser) start(inflight context.Context, g *flow.Group, expiry map[int64]time.Time) {
	id := l.inflight.add(leasedOwner, g.Recs, nil) // taken over from the worker
	l.wg.Add(1)
	go l.deliver(inflight, g, id, expiry)
}

// stop waits for every leased delivery to end: each is written back or,
// abandoned at the drain timeout, left to its lease.
func (l *leaser) stop() { l.wg.Wait() }

// deliver publishes g and writes its outcomes back; id is its keys' entry
// in the in-flight registry.
func (l *leaser) deliver(inflight context.Context, g *flow.Group, id inflightID, expiry map[int64]time.Time) {
	defer l.wg.Done()
	defer g.Dest.Release(g)
	publish(inflight, []*flow.Group{g}, l.publishTimeout)
	abandoned := inflight.Err() != nil
	outcomes := g.Dest.Settle(g, abandoned)
	decided := make(map[int64]bool, len(outcomes))
	for _, o := range outcomes {
		decided[o.ID] = true
	}
	var unsent []store.Outcome
	var keys []store.LeasedWork
	seenKey := map[string]bool{}
	for _, rec := range g.Recs {
		if !decided[rec.ID] {
			unsent = append(unsent, store.Outcome{ID: rec.ID})
		}
		if rec.HasKey && !seenKey[rec.Key] {
			seenKey[rec.Key] = true
			keys = append(keys, store.LeasedWork{Key: rec.Key, FirstID: rec.ID, Until: expiry[rec.ID]})
		}
	}
	for i := range outcomes {
		outcomes[i].Token = g.Token
	}
	for i := range unsent {
		unsent[i].Token = g.Token
	}
	// Other workers may claim these keys again: their rows stay behind the
	// leased ones until the write-back below, which then makes them ready.
	l.inflight.remove(id)
	ctx, cancel := writeBackContext(inflight, l.queryTimeout)
	defer cancel()
	// Only outcomes written back count: a row whose lease ran out and was
	// taken by another delivery is counted by that one.
	done, err := l.store.CompleteLeased(ctx, outcomes, unsent, keys)
	if err != nil {
		// The leases run out and the rows are delivered again.
		l.log.Error("leased write-back failed; the rows are delivered again when their lease ends",
			slog.String("destination", g.Dest.Name), slog.Int("rows", len(g.Recs)), slog.Any("error", err))
		return
	}
	if lost := len(outcomes) - len(done); lost > 0 {
		l.log.Warn("leases ran out before their write-back and another delivery took the rows; keep visibility_timeout well above the destination's timeout",
			slog.String("destination", g.Dest.Name), slog.Int("rows", lost))
	}
	l.tally.settled(done, []*flow.Group{g}, g.Recs, 0)
	l.written.Send(len(done))
	l.wake()
}
