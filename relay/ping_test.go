package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/flow"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// pingedPublisher is a server that refuses connections, to publishes and
// pings alike, while down is set.
type pingedPublisher struct {
	fakePublisher
	down  atomic.Bool
	pings atomic.Int64
}

var errRefused = errors.New("connect: connection refused")

func (p *pingedPublisher) Publish(ctx context.Context, recs []sink.Record) []error {
	if p.down.Load() {
		errs := make([]error, len(recs))
		for i := range errs {
			errs[i] = sink.DestinationFailure(sink.ClassTransient, errRefused)
		}
		return errs
	}
	return p.fakePublisher.Publish(ctx, recs)
}

func (p *pingedPublisher) Ping(context.Context) error {
	p.pings.Add(1)
	if p.down.Load() {
		return errRefused
	}
	return nil
}

// A destination whose server refused connections and is back is probed
// at its next ping, not at the end of its cool-down (here the base, 30 s):
// the rows held for the outage are delivered while the cool-down would
// still run. The backlog is there before the relay starts, so that the
// first batch, which fails, holds every row: the probe can only take
// rows the ping's answer hands back.
func TestServerBackIsProbedAtItsNextPing(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	pub := &pingedPublisher{}
	pub.down.Store(true)
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 'orders', 'k' || (g % 5), 'x' FROM generate_series(1, 50) g`)
	h := start(t, s, pub, options{cfg: relay.Config{Pause: relay.PauseConfig{Base: 30 * time.Second, Max: 10 * time.Minute}}})
	var until time.Time
	testwait.For(t, "the breaker open, and a ping refused", func() bool {
		st := h.relay.Destinations()[0]
		until = st.OpenUntil
		return st.Breaker == flow.BreakerOpen && pub.pings.Load() > 0
	})
	pub.down.Store(false)
	testwait.For(t, "every row delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	if left := time.Until(until); left <= 0 {
		t.Fatalf("the rows went %s after the cool-down's end, not before it", -left)
	}
	if st := h.relay.Stats(); st.DeadLettered != 0 {
		t.Errorf("%d rows dead-lettered by the outage", st.DeadLettered)
	}
}

// A destination that cannot be pinged keeps to its cool-down.
func TestServerThatCannotBePingedWaitsItsCoolDown(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	var down atomic.Bool
	down.Store(true)
	pub := &fakePublisher{fail: func(sink.Record, int) error {
		if down.Load() {
			return sink.DestinationFailure(sink.ClassTransient, errRefused)
		}
		return nil
	}}
	h := start(t, s, pub, options{cfg: relay.Config{Pause: relay.PauseConfig{Base: 2 * time.Second, Max: time.Minute}}})
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 'orders', 'k' || (g % 5), 'x' FROM generate_series(1, 50) g`)
	var until time.Time
	testwait.For(t, "the breaker open", func() bool {
		st := h.relay.Destinations()[0]
		until = st.OpenUntil
		return st.Breaker == flow.BreakerOpen
	})
	down.Store(false)
	testwait.For(t, "every row delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	if early := time.Until(until); early > 0 {
		t.Fatalf("the rows went %s before the cool-down's end, with no ping to say the destination was back", early)
	}
}
