package flow_test

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/flow"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// pinged is a publisher whose server answers pings while up is true.
type pinged struct {
	nopPublisher
	up    bool
	pings int
}

func (p *pinged) Ping(context.Context) error {
	p.pings++
	if !p.up {
		return errDown
	}
	return nil
}

func newPingedDest(t *testing.T, p *pinged) *flow.Dest {
	t.Helper()
	policy, err := retry.NewPolicy(retry.PolicyConfig{MaxAttempts: 5, MaxAge: time.Hour,
		Strategy: retry.StrategyNone, BaseDelay: time.Second, MaxDelay: time.Minute, MaxRetryAfter: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return flow.NewDest(flow.Destination{Name: "a", Publisher: p}, flow.Settings{OnDeadLetter: flow.OnDeadLetterRelease,
		PauseBase: time.Second, PauseMax: 30 * time.Second, Policy: policy, Logger: slog.New(slog.DiscardHandler)})
}

// openFor opens d's breaker and fails its probes until its cool-down is
// at least cool.
func openFor(t *testing.T, d *flow.Dest, cool time.Duration) {
	t.Helper()
	publish(d, first(plan(d, batch(1, 10))), failAll)
	for {
		s, until := d.BreakerState()
		if s == flow.BreakerOpen && time.Until(until) >= cool {
			return
		}
		time.Sleep(time.Until(until))
		probe, _ := plan(d, batch(100, 5))
		if !probe.Probe() {
			t.Fatal("no probe after the cool-down")
		}
		publish(d, probe, failAll)
	}
}

func first[A, B any](a A, _ B) A { return a }

// A server that refused a ping and answers the next ends the cool-down
// at once: the next batch probes it, seconds before the cool-down would
// have ended.
func TestAnsweredPingEndsTheCoolDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &pinged{}
		d := newPingedDest(t, p)
		if !d.Pings() {
			t.Fatal("a publisher with Ping: Pings() is false")
		}
		if d.Ping(context.Background(), time.Second) || p.pings != 0 {
			t.Fatalf("closed breaker: pinged %d times", p.pings)
		}
		openFor(t, d, 3*time.Second)
		if d.Ping(context.Background(), time.Second) {
			t.Fatal("a refused ping ended the cool-down")
		}
		p.up = true
		if !d.Ping(context.Background(), time.Second) {
			t.Fatal("an answered ping after a refused one did not end the cool-down")
		}
		if s, _ := d.BreakerState(); s != flow.BreakerHalfOpen {
			t.Fatalf("after the answered ping: breaker %s, want half-open", s)
		}
		probe, _ := plan(d, batch(200, 5))
		if !probe.Probe() {
			t.Fatal("after the answered ping: no probe")
		}
	})
}

// A refused ping counts across the openings of one outage: a probe that
// failed just before the server came back opens the breaker again, and
// the next answered ping ends that cool-down.
func TestRefusedPingCountsAcrossTheOutagesOpenings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &pinged{}
		d := newPingedDest(t, p)
		openFor(t, d, 2*time.Second)
		d.Ping(context.Background(), time.Second) // refused
		_, until := d.BreakerState()
		time.Sleep(time.Until(until))
		probe, _ := plan(d, batch(300, 5))
		publish(d, probe, failAll)
		if s, _ := d.BreakerState(); s != flow.BreakerOpen {
			t.Fatalf("after a failed probe: breaker %s, want open", s)
		}
		p.up = true
		if !d.Ping(context.Background(), time.Second) {
			t.Fatal("the first answered ping after the outage's refused one did not end the cool-down")
		}
	})
}

// A server that answers pings while its publishes fail (a failure the
// connection does not show) is probed on the cool-downs alone; and a
// ping that ended a cool-down must be refused again before another
// answered ping ends the next one, so that probes never come at the
// pings' pace.
func TestPingsOfAnAnsweringServerKeepTheCoolDowns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &pinged{up: true}
		d := newPingedDest(t, p)
		openFor(t, d, 3*time.Second)
		for range 3 {
			if d.Ping(context.Background(), time.Second) {
				t.Fatal("pings that never failed ended the cool-down")
			}
		}
		if s, _ := d.BreakerState(); s != flow.BreakerOpen {
			t.Fatalf("breaker %s, want still open", s)
		}
		p.up = false
		d.Ping(context.Background(), time.Second)
		p.up = true
		if !d.Ping(context.Background(), time.Second) {
			t.Fatal("an answered ping after a refused one did not end the cool-down")
		}
		probe, _ := plan(d, batch(300, 5))
		publish(d, probe, failAll)
		for range 3 {
			if d.Ping(context.Background(), time.Second) {
				t.Fatal("answered pings ended a second cool-down with no refused ping since the first")
			}
		}
		// The probe the ping let through failed: the pings misled, and
		// end no cool-down of this outage again, refused and answered.
		p.up = false
		d.Ping(context.Background(), time.Second)
		p.up = true
		if d.Ping(context.Background(), time.Second) {
			t.Fatal("pings ended a cool-down after the probe they let through failed")
		}
		if s, _ := d.BreakerState(); s != flow.BreakerOpen {
			t.Fatalf("breaker %s, want still open", s)
		}
	})
}

// skipping is a publisher whose pings cannot look (its connection is
// busy), then answer.
type skipping struct {
	nopPublisher
	skip bool
}

func (p *skipping) Ping(context.Context) error {
	if p.skip {
		return sink.ErrPingSkipped
	}
	return nil
}

// A skipped ping tells nothing: it is no refused ping, after which an
// answered one would end the cool-down.
func TestSkippedPingTellsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &skipping{skip: true}
		policy, err := retry.NewPolicy(retry.PolicyConfig{MaxAttempts: 5, MaxAge: time.Hour,
			Strategy: retry.StrategyNone, BaseDelay: time.Second, MaxDelay: time.Minute, MaxRetryAfter: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		d := flow.NewDest(flow.Destination{Name: "a", Publisher: p}, flow.Settings{OnDeadLetter: flow.OnDeadLetterRelease,
			PauseBase: time.Second, PauseMax: 30 * time.Second, Policy: policy, Logger: slog.New(slog.DiscardHandler)})
		openFor(t, d, 2*time.Second)
		d.Ping(context.Background(), time.Second)
		p.skip = false
		if d.Ping(context.Background(), time.Second) {
			t.Fatal("an answered ping after a skipped one ended the cool-down")
		}
	})
}
