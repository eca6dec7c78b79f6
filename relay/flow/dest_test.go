package flow_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/flow"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// The destination's flow control without a database or a broker: batches
// are planned through Begin, Admit and Take, their publishes' results are
// set on the group, and Settle says what becomes of each row. Time is the
// bubble's (testing/synctest): cool-downs pass at once and exactly.

type nopPublisher struct{}

func (nopPublisher) Publish(_ context.Context, recs []sink.Record) []error {
	return make([]error, len(recs))
}
func (nopPublisher) Close() error { return nil }

var errDown = errors.New("connection refused")

func newDest(t *testing.T, d flow.Destination) *flow.Dest {
	t.Helper()
	policy, err := retry.NewPolicy(retry.PolicyConfig{MaxAttempts: 5, MaxAge: time.Hour,
		Strategy: retry.StrategyNone, BaseDelay: time.Second, MaxDelay: time.Minute, MaxRetryAfter: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d.Publisher = nopPublisher{}
	return flow.NewDest(d, flow.Settings{OnDeadLetter: flow.OnDeadLetterRelease, PauseBase: time.Second,
		PauseMax: 4 * time.Second, Policy: policy, Logger: slog.New(slog.DiscardHandler)})
}

// batch is n rows of topics "a.x" and "a.y" by turns, each of a key of
// its own, numbered from first.
func batch(first, n int) []sink.Record {
	recs := make([]sink.Record, n)
	for i := range recs {
		id := int64(first + i)
		recs[i] = sink.Record{ID: id, Topic: []string{"a.x", "a.y"}[i%2], Key: fmt.Sprintf("k%d", id), HasKey: true,
			PayloadSize: 10, CreatedAt: time.Now()}
	}
	return recs
}

// plan asks d to admit recs now, rows of the source "src": the group of
// those it takes, and the outcomes of those it defers.
func plan(d *flow.Dest, recs []sink.Record) (*flow.Group, []store.Outcome) {
	return planFor(d, "src", recs)
}

// planFor is plan for rows of the source owner.
func planFor(d *flow.Dest, owner string, recs []sink.Record) (*flow.Group, []store.Outcome) {
	now := time.Now()
	g := d.Begin(now, len(recs))
	g.Owner = owner
	var deferred []store.Outcome
	for _, rec := range recs {
		v, o, paused := d.Admit(g, rec, rec.Topic, now)
		if v == flow.Admitted {
			v, o = d.Take(rec, now)
			if v == flow.Admitted {
				g.Add(rec, rec.Topic, paused)
				continue
			}
		}
		if v == flow.Deferred {
			deferred = append(deferred, o)
		}
	}
	d.Planned(g)
	return g, deferred
}

// publish settles g as though its publish returned errOf for each row,
// and gives its slots back.
func publish(d *flow.Dest, g *flow.Group, errOf func(sink.Record) error) []store.Outcome {
	g.Start, g.Claimed = time.Now(), time.Now()
	g.Errs = make([]error, len(g.Recs))
	for i, rec := range g.Recs {
		g.Errs[i] = errOf(rec)
	}
	g.Done = time.Now()
	defer d.Release(g)
	return d.Settle(g, false)
}

func failAll(sink.Record) error { return sink.Systemic(errDown) }
func sendAll(sink.Record) error { return nil }

func state(d *flow.Dest) (flow.BreakerState, time.Duration) {
	s, until := d.BreakerState()
	if until.IsZero() {
		return s, 0
	}
	return s, time.Until(until)
}

// A systemic failure opens the breaker at once; the rows wait for its
// cool-down without counting an attempt, and so do the rows of the next
// batches. After the cool-down a probe of a few rows of distinct keys
// goes; while it fails, the cool-down doubles up to pause_max, but is
// never longer than a quarter of the outage so far, and the probe's rows
// wait past the next cool-down. Two good probes close it.
func TestBreakerOpensProbesAndCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDest(t, flow.Destination{Name: "a"})
		g, deferred := plan(d, batch(1, 20))
		if len(g.Recs) != 20 || len(deferred) != 0 {
			t.Fatalf("closed breaker: %d rows taken, %d deferred; want all 20 taken", len(g.Recs), len(deferred))
		}
		for _, o := range publish(d, g, failAll) {
			if o.Kind != store.Deferred || o.Reason != flow.DeferDestinationFailing || o.Delay != time.Second {
				t.Fatalf("row of a systemic failure: %+v, want deferred (no attempt counted) for the 1s cool-down", o)
			}
		}
		if s, left := state(d); s != flow.BreakerOpen || left != time.Second {
			t.Fatalf("breaker %s for %s, want open for 1s", s, left)
		}
		if g, deferred := plan(d, batch(21, 5)); len(g.Recs) != 0 || len(deferred) != 5 || deferred[0].Reason != flow.DeferCircuitOpen {
			t.Fatalf("open breaker: %d taken, deferred %+v", len(g.Recs), deferred)
		}

		// Failed probes: the cool-down is 1s while the outage is young,
		// then a quarter of the outage, up to pause_max (4s).
		start := time.Now()
		var cooldowns []time.Duration
		for streak := 1; len(cooldowns) == 0 || cooldowns[len(cooldowns)-1] < 4*time.Second; streak++ {
			time.Sleep(time.Until(func() time.Time { _, u := d.BreakerState(); return u }()))
			cooldown := min(retry.Exponential(streak, time.Second, 4*time.Second), max(time.Second, time.Since(start)/4))
			cooldowns = append(cooldowns, cooldown)
			if streak > 20 {
				t.Fatalf("cool-downs %v never reached pause_max", cooldowns)
			}
			probe, _ := plan(d, batch(100, 20))
			if !probe.Probe() || len(probe.Recs) == 0 || len(probe.Recs) > flow.ProbeRows {
				t.Fatalf("after the cool-down: probe %v of %d rows, want a probe of at most %d", probe.Probe(), len(probe.Recs), flow.ProbeRows)
			}
			if other, _ := plan(d, batch(200, 3)); len(other.Recs) != 0 {
				t.Fatalf("a second batch went beside the probe: one probe at a time")
			}
			for _, o := range publish(d, probe, failAll) {
				if o.Kind != store.Deferred || o.Delay != cooldown+4*time.Second {
					t.Fatalf("row of a failed probe: %+v, want deferred past the next cool-down (%s + pause_max)", o, cooldown)
				}
			}
			if s, left := state(d); s != flow.BreakerOpen || left != cooldown {
				t.Fatalf("after a failed probe: breaker %s for %s, want open for %s", s, left, cooldown)
			}
		}

		if cooldowns[0] != time.Second || cooldowns[3] != time.Second || cooldowns[4] <= time.Second {
			t.Errorf("cool-downs %v: want 1s for the outage's first 4s, then longer", cooldowns)
		}

		// Good probes: half-open after the first, closed after the second.
		for i, want := range []flow.BreakerState{flow.BreakerHalfOpen, flow.BreakerClosed} {
			if s, _ := d.BreakerState(); s == flow.BreakerOpen {
				time.Sleep(time.Until(func() time.Time { _, u := d.BreakerState(); return u }()))
			}
			probe, _ := plan(d, batch(300+10*i, 5))
			if !probe.Probe() {
				t.Fatalf("probe %d: no probe", i+1)
			}
			for _, o := range publish(d, probe, sendAll) {
				if o.Kind != store.Sent {
					t.Fatalf("row of a good probe: %+v", o)
				}
			}
			if s, _ := d.BreakerState(); s != want {
				t.Fatalf("after %d good probes: breaker %s, want %s", i+1, s, want)
			}
		}
		if g, _ := plan(d, batch(400, 20)); g.Probe() || len(g.Recs) != 20 {
			t.Fatalf("closed again: %d rows taken, probe %v", len(g.Recs), g.Probe())
		}
		changes := d.Status().Changes
		if len(changes) < 3 || changes[0].To != flow.BreakerOpen || changes[len(changes)-1].To != flow.BreakerClosed {
			t.Errorf("changes %+v, want opened first and closed last", changes)
		}
	})
}

// Rows held while the destination is down go as soon as it answers again,
// not at the end of their deferral: once the breaker closes, the rows
// that still wait are handed back to the source that claimed them, the
// failed probes' rows among them.
func TestHeldRowsGoWhenTheDestinationAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDest(t, flow.Destination{Name: "a"})
		g, _ := plan(d, batch(1, 10))
		publish(d, g, failAll) // held for the first 1s cool-down
		waitOut := func() { time.Sleep(time.Until(func() time.Time { _, u := d.BreakerState(); return u }())) }
		time.Sleep(500 * time.Millisecond)
		if _, deferred := plan(d, batch(11, 5)); len(deferred) != 5 {
			t.Fatalf("open breaker: %d rows deferred, want 5", len(deferred))
		}
		ids := func(recs []sink.Record) map[int64]bool {
			m := map[int64]bool{}
			for _, r := range recs {
				m[r.ID] = true
			}
			return m
		}
		// Two failed probes, of two sources: their rows wait past the
		// next cool-down, well after the destination is back.
		failed := map[string]map[int64]bool{}
		for _, owner := range []string{"src", "other"} {
			waitOut()
			probe, _ := planFor(d, owner, batch(100*len(failed)+100, 20))
			if !probe.Probe() {
				t.Fatal("no probe after the cool-down")
			}
			publish(d, probe, failAll)
			failed[owner] = ids(probe.Recs)
		}
		if got := d.Released("src"); len(got) != 0 {
			t.Fatalf("released %v while the destination is still down", got)
		}
		for i := range 2 {
			waitOut()
			probe, _ := plan(d, batch(300+10*i, 5))
			publish(d, probe, sendAll)
		}
		if s, _ := d.BreakerState(); s != flow.BreakerClosed {
			t.Fatalf("breaker %s after two good probes", s)
		}
		for owner, want := range failed {
			got := d.Released(owner)
			for _, r := range got {
				if !want[r.ID] || r.RetryCount != 0 {
					t.Errorf("%s: released %+v, want only the rows of its failed probe, as they were held", owner, r)
				}
			}
			if len(got) != len(want) {
				t.Errorf("%s: released %d rows, want the %d of its failed probe (the rest were due already)", owner, len(got), len(want))
			}
		}
		if again := d.Released("src"); len(again) != 0 {
			t.Errorf("released twice: %v", again)
		}
	})
}

// The rows held for an outage go at the first answered probe, while the
// breaker still waits for a second one to close: the next probe takes
// them rather than starving behind them (every key of the traffic waits
// behind its held rows).
func TestHeldRowsGoAtTheFirstAnsweredProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDest(t, flow.Destination{Name: "a"})
		g, _ := plan(d, batch(1, 10))
		publish(d, g, failAll)
		waitOut := func() { time.Sleep(time.Until(func() time.Time { _, u := d.BreakerState(); return u }())) }
		waitOut()
		failed, _ := plan(d, batch(100, 20))
		publish(d, failed, failAll) // its rows wait past the next cool-down
		waitOut()
		probe, _ := plan(d, batch(200, 5))
		if !probe.Probe() {
			t.Fatal("no probe after the cool-down")
		}
		if got := d.Released("src"); len(got) != 0 {
			t.Fatalf("released %v before the destination answered", got)
		}
		publish(d, probe, sendAll)
		if s, _ := d.BreakerState(); s != flow.BreakerHalfOpen {
			t.Fatalf("breaker %s after one good probe of two, want half-open", s)
		}
		got := d.Released("src")
		want := map[int64]bool{}
		for _, r := range failed.Recs {
			want[r.ID] = true
		}
		for _, r := range got {
			if !want[r.ID] {
				t.Errorf("released row %d, not of the failed probe", r.ID)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("released %d rows at the first answered probe, want the failed probe's %d", len(got), len(want))
		}
	})
}

// A batch admitted while the breaker was open may defer its rows after
// another batch's probe closed it: those rows are handed back at once,
// though the close's release came before they were held.
func TestRowsHeldAfterTheDestinationAnsweredGoAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDest(t, flow.Destination{Name: "a"})
		g, _ := plan(d, batch(1, 10))
		publish(d, g, failAll)
		time.Sleep(500 * time.Millisecond)
		decided := time.Now()
		late := d.Begin(decided, 5) // the breaker is open
		late.Owner = "src"
		for i := range 2 {
			time.Sleep(time.Until(func() time.Time { _, u := d.BreakerState(); return u }()))
			probe, _ := plan(d, batch(100+10*i, 5))
			publish(d, probe, sendAll)
		}
		if s, _ := d.BreakerState(); s != flow.BreakerClosed {
			t.Fatalf("breaker %s after two good probes", s)
		}
		for _, rec := range batch(200, 5) {
			if v, _, _ := d.Admit(late, rec, rec.Topic, decided); v != flow.Deferred {
				t.Fatalf("row %d admitted under the open breaker's admission", rec.ID)
			}
		}
		d.Planned(late)
		if got := d.Released("src"); len(got) != 5 {
			t.Fatalf("released %v, want the 5 rows held under the admission the close overtook", got)
		}
	})
}

// A probe that goes unanswered (sent into an outage that answers
// nothing, it waits for its timeout) holds the breaker half-open for a
// cool-down, not until it times out: then the next probe goes, and finds
// the destination back. The first probe's rows, failing after the
// breaker closed, wait the base cool-down, not past a pause_max.
func TestUnansweredProbeDoesNotHoldTheBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDest(t, flow.Destination{Name: "a"})
		g, _ := plan(d, batch(1, 2))
		publish(d, g, failAll) // open for the first 1s cool-down
		_, cool := state(d)
		time.Sleep(cool)
		stuck, _ := plan(d, batch(10, 3))
		if !stuck.Probe() {
			t.Fatal("no probe after the cool-down")
		}
		time.Sleep(cool / 2)
		if g, deferred := plan(d, batch(20, 3)); len(g.Recs) != 0 || len(deferred) != 3 {
			t.Fatalf("probe in flight for half a cool-down: %d rows taken, %d deferred; want all 3 deferred", len(g.Recs), len(deferred))
		}
		time.Sleep(cool / 2)
		for i := range 2 {
			probe, _ := plan(d, batch(30+10*i, 3))
			if !probe.Probe() {
				t.Fatalf("probe %d: none while the first has gone unanswered for a cool-down", i+2)
			}
			publish(d, probe, sendAll)
		}
		if s, _ := d.BreakerState(); s != flow.BreakerClosed {
			t.Fatalf("breaker %s after two good probes", s)
		}
		time.Sleep(10 * time.Millisecond) // its timeout, later
		for _, o := range publish(d, stuck, failAll) {
			if o.Kind != store.Deferred || o.Delay != time.Second {
				t.Errorf("row of the unanswered probe, failing once the breaker closed: %+v, want deferred for the 1s base", o)
			}
		}
	})
}

// A failed probe's rows wait past the next cool-down, so that the next
// probe takes other rows. When there are none (every key waits behind
// them), the half-open breaker is asked for nothing: a base cool-down
// later the destination hands the keyed ones back to their source, for
// the next probe to take, rather than leaving it shut for a pause_max.
func TestStarvedProbeTakesTheFailedProbesRows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDest(t, flow.Destination{Name: "a"})
		g, _ := plan(d, batch(1, 2))
		publish(d, g, failAll) // open for the first 1s cool-down
		_, cool := state(d)
		time.Sleep(cool)
		rows := batch(10, 3)
		rows[2].Key, rows[2].HasKey = "", false // holds no key back
		probe, _ := plan(d, rows)
		if !probe.Probe() {
			t.Fatal("no probe after the cool-down")
		}
		publish(d, probe, failAll)
		_, cool = state(d)
		time.Sleep(cool)
		if blocked, _, _, _ := d.Closed(time.Now(), nil); blocked {
			t.Fatal("the breaker takes no probe once its cool-down is over")
		}
		if held := d.Released("src"); len(held) != 0 {
			t.Fatalf("%d rows handed back as soon as the breaker is half-open; the next probe should take other rows first", len(held))
		}
		time.Sleep(time.Second) // the base: no row came to probe with
		d.Closed(time.Now(), nil)
		var ids []int64
		for _, r := range d.Released("src") {
			ids = append(ids, r.ID)
		}
		if want := []int64{10, 11}; !slices.Equal(ids, want) {
			t.Fatalf("rows handed back to probe with: %v, want the failed probe's keyed rows %v (not its keyless one, which holds nothing back and may fail on its own, nor the rows the open breaker held)", ids, want)
		}
	})
}

// A publish under way when another opens the breaker, failing too, was
// no probe: its rows count no attempt and wait the cool-down, like the
// rows the open breaker defers, and are there for the next probe to take;
// only a failed probe's rows wait past the next cool-down.
func TestOvertakenPublishWaitsTheCoolDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDest(t, flow.Destination{Name: "a"})
		first, _ := plan(d, batch(1, 5))
		overtaken, _ := plan(d, batch(10, 5))
		publish(d, first, failAll) // opens the breaker for 1s
		_, cool := state(d)
		for _, o := range publish(d, overtaken, failAll) {
			if o.Kind != store.Deferred || o.Delay != cool {
				t.Errorf("row of a publish the opening overtook: %+v, want deferred for the cool-down %s", o, cool)
			}
		}
	})
}

// A topic that fails as a topic (its authorization, say) is paused alone:
// its rows wait, the destination's breaker stays closed, and the other
// topic's rows go.
func TestTopicPauseHoldsOnlyItsTopic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDest(t, flow.Destination{Name: "a"})
		g, _ := plan(d, batch(1, 10))
		out := publish(d, g, func(rec sink.Record) error {
			if rec.Topic == "a.x" {
				return sink.TopicFailure(sink.ClassSystemic, errors.New("topic authorization failed"))
			}
			return nil
		})
		for _, o := range out {
			if o.Kind == store.Deferred && o.Reason != flow.DeferTopicPaused {
				t.Errorf("row of the failing topic: %+v, want deferred topic_paused", o)
			}
		}
		if s, _ := d.BreakerState(); s != flow.BreakerClosed {
			t.Fatalf("breaker %s: a topic's failure must not open the destination's", s)
		}
		g, deferred := plan(d, batch(11, 10))
		for _, rec := range g.Recs {
			if rec.Topic != "a.y" {
				t.Errorf("row %d of the paused topic went", rec.ID)
			}
		}
		if len(g.Recs) != 5 || len(deferred) != 5 || deferred[0].Reason != flow.DeferTopicPaused {
			t.Errorf("%d rows taken and deferred %+v; want a.y's 5 taken and a.x's 5 deferred", len(g.Recs), deferred)
		}
		if status := d.Status(); len(status.Paused) != 1 || status.Paused[0].Topic != "a.x" {
			t.Errorf("paused %+v, want a.x alone", status.Paused)
		}
	})
}

// The bulkhead holds rows past max_in_flight untouched until a group is
// released; the rate limit holds what is over its rate; the retry budget
// defers retries past it, and earns more with time.
func TestGatesBoundWhatGoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDest(t, flow.Destination{Name: "a", MaxInFlight: 4})
		g, deferred := plan(d, batch(1, 10))
		if len(g.Recs) != 4 || len(deferred) != 0 {
			t.Fatalf("bulkhead of 4: %d taken, %d deferred; want 4 taken and the rest held", len(g.Recs), len(deferred))
		}
		if free, limit, ok := d.Room(); !ok || free != 0 || limit != 4 {
			t.Fatalf("room %d of %d (%v) while 4 are in flight", free, limit, ok)
		}
		publish(d, g, sendAll)
		if free, _, _ := d.Room(); free != 4 {
			t.Fatalf("%d slots free after the release, want 4", free)
		}

		r := newDest(t, flow.Destination{Name: "r", RateLimit: flow.RateLimitConfig{PerSecond: 10}})
		g, deferred = plan(r, batch(1, 15))
		if len(g.Recs) != 10 || len(deferred) != 0 {
			t.Fatalf("10 rows a second: %d taken, %d deferred; want 10 taken, the rest held untouched", len(g.Recs), len(deferred))
		}
		publish(r, g, sendAll)
		time.Sleep(500 * time.Millisecond)
		if g, _ := plan(r, batch(20, 15)); len(g.Recs) != 5 {
			t.Fatalf("half a second later: %d rows taken, want 5", len(g.Recs))
		}

		b := newDest(t, flow.Destination{Name: "b", RetryBudget: flow.RetryBudgetConfig{MinPerSecond: 1}})
		retries := batch(1, 30)
		for i := range retries {
			retries[i].RetryCount = 1
		}
		g, deferred = plan(b, retries)
		if len(g.Recs) == 0 || len(deferred) == 0 || deferred[0].Reason != flow.DeferRetryBudget {
			t.Fatalf("30 retries on a budget of 1 a second: %d taken, deferred %+v", len(g.Recs), deferred)
		}
		taken := len(g.Recs)
		publish(b, g, sendAll)
		time.Sleep(5 * time.Second)
		if g, _ := plan(b, retries); len(g.Recs) < 5 || len(g.Recs) > taken+5 {
			t.Errorf("5s later: %d retries taken, want about 5 more earned", len(g.Recs))
		}
	})
}
