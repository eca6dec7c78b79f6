package relay

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/flow"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// The planner needs no database: these tests give it claimed rows and
// destinations in a given state and read its plan.

type nopPublisher struct{}

func (nopPublisher) Publish(_ context.Context, recs []sink.Record) []error {
	return make([]error, len(recs))
}

// testPlanner is a planner over the destinations ds, routed by routes.
func testPlanner(t *testing.T, cfg Config, ds []Destination, routes []Route) *planner {
	t.Helper()
	for i := range ds {
		ds[i].Publisher = nopPublisher{}
	}
	cfg.Destinations, cfg.Routes = ds, routes
	cfg = cfg.WithDefaults()
	if err := cfg.assemble(); err != nil {
		t.Fatal(err)
	}
	var dests []*flow.Dest
	for _, d := range cfg.Destinations {
		dests = append(dests, flow.NewDest(d, cfg.destSettings(nil)))
	}
	return newPlanner(&cfg, dests)
}

func rec(id int64, topic, key string) sink.Record {
	return sink.Record{ID: id, Topic: topic, Key: key, HasKey: key != "", PayloadSize: 10}
}

// planned returns the ids of each group's rows, by destination, and the
// outcomes by id.
func planned(groups []*flow.Group, outcomes []store.Outcome) (map[string][]int64, map[int64]store.Outcome) {
	ids := map[string][]int64{}
	for _, g := range groups {
		for _, r := range g.Recs {
			ids[g.Dest.Name] = append(ids[g.Dest.Name], r.ID)
		}
	}
	byID := map[int64]store.Outcome{}
	for _, o := range outcomes {
		byID[o.ID] = o
	}
	return ids, byID
}

var twoDestinations = []Route{{Topics: []string{"a.*"}, Destination: "a"}, {Topics: []string{"b.*"}, Destination: "b", Topic: "renamed"}}

func TestPlanKeepsAKeysRowsOnOneDestination(t *testing.T) {
	p := testPlanner(t, Config{}, []Destination{{Name: "a"}, {Name: "b"}}, twoDestinations)
	groups, outcomes := p.plan(nil, []sink.Record{
		rec(1, "a.x", "k"), rec(2, "b.x", "k"), rec(3, "a.x", "k"), // k moves to b: its run ends at 1
		rec(4, "b.x", "j"), rec(5, "b.x", "j"), rec(6, "b.x", ""),
		rec(7, "none", "n"), rec(8, "a.x", "n"), // no route: dead-lettered; n's next row goes in a later batch
	}, time.Now(), nil)
	ids, out := planned(groups, outcomes)
	if got := ids["a"]; len(got) != 1 || got[0] != 1 {
		t.Errorf("destination a got %v, want [1]", got)
	}
	if got := ids["b"]; len(got) != 3 || got[0] != 4 || got[2] != 6 {
		t.Errorf("destination b got %v, want [4 5 6]", got)
	}
	for _, g := range groups {
		if g.Dest.Name == "b" && g.Recs[0].Topic != "renamed" {
			t.Errorf("b's rows go to topic %q, want the route's renamed", g.Recs[0].Topic)
		}
	}
	if o := out[7]; o.Kind != store.DeadLettered || o.Reason != sink.ReasonNoRoute || o.ParkKey {
		t.Errorf("unroutable row: %+v, want dead-lettered no_route, not parked", o)
	}
	if len(outcomes) != 1 {
		t.Errorf("outcomes %+v; rows 2, 3 and 8 must stay untouched", outcomes)
	}
}

// With order kept per destination, a key's rows of each destination
// travel together, whatever the key's rows of another destination do.
func TestPlanKeepsAKeysRowsTogetherPerDestination(t *testing.T) {
	p := testPlanner(t, Config{}, []Destination{{Name: "a"}, {Name: "b"}}, twoDestinations)
	groups, outcomes := p.plan(nil, []sink.Record{
		rec(1, "a.x", "k"), rec(2, "b.x", "k"), rec(3, "a.x", "k"),
		rec(4, "b.x", "j"), rec(5, "b.x", "j"), rec(6, "b.x", ""),
		rec(7, "none", "n"), rec(8, "a.x", "n"), // no route: dead-lettered; n's row of a goes
	}, time.Now(), p.router.scope(OrderScopeDestination))
	ids, _ := planned(groups, outcomes)
	if got := fmt.Sprint(ids["a"]); got != "[1 3 8]" {
		t.Errorf("destination a got %v, want [1 3 8]", got)
	}
	if got := fmt.Sprint(ids["b"]); got != "[2 4 5 6]" {
		t.Errorf("destination b got %v, want [2 4 5 6]", got)
	}
	if len(outcomes) != 1 {
		t.Errorf("outcomes %+v, want only the unroutable row's", outcomes)
	}
}

// An unroutable row parks its key in every order scope: where it was
// meant to go is unknown.
func TestPlanParksKeysOfUnroutableRowsUnderBlock(t *testing.T) {
	p := testPlanner(t, Config{OnDeadLetter: OnDeadLetterBlock}, []Destination{{Name: "a"}, {Name: "b"}}, twoDestinations)
	for _, scope := range []string{OrderScopeGlobal, OrderScopeDestination, OrderScopeTopic} {
		groups, outcomes := p.plan(nil, []sink.Record{rec(1, "none", "k"), rec(2, "a.x", "k"), rec(3, "b.x", "k"), rec(4, "a.x", "j")},
			time.Now(), p.router.scope(scope))
		ids, out := planned(groups, outcomes)
		if o := out[1]; o.Kind != store.DeadLettered || !o.ParkKey {
			t.Errorf("%s: unroutable row: %+v, want dead-lettered and parking its key", scope, o)
		}
		if got := fmt.Sprint(ids["a"], ids["b"]); got != "[4] []" {
			t.Errorf("%s: destinations a and b got %s, want [4] and nothing: k is parked", scope, got)
		}
	}
}

func TestPlanStopsAtTheByteBudget(t *testing.T) {
	p := testPlanner(t, Config{MaxBatchBytes: 3*(RecordOverhead+10) + 1}, []Destination{{Name: "a"}}, twoDestinations)
	groups, outcomes := p.plan(nil, []sink.Record{rec(1, "a.x", ""), rec(2, "a.x", "k"), rec(3, "a.x", ""), rec(4, "a.x", "k"), rec(5, "a.x", "")}, time.Now(), nil)
	ids, _ := planned(groups, outcomes)
	if got := ids["a"]; len(got) != 3 || got[2] != 3 {
		t.Errorf("planned %v, want the first three rows", got)
	}
	if len(outcomes) != 0 {
		t.Errorf("outcomes %+v; rows past the budget wait untouched", outcomes)
	}
}

// openBreaker opens the breaker of p's first destination as a publish
// failing systemically at now does: a row of topic a.x planned, published
// and settled.
func openBreaker(t *testing.T, p *planner, now time.Time, msg string) {
	t.Helper()
	groups, _ := p.plan(nil, []sink.Record{rec(1000, "a.x", "")}, now, nil)
	if len(groups) != 1 {
		t.Fatalf("%d groups planned for one row", len(groups))
	}
	g := groups[0]
	g.Errs = []error{sink.Systemic(errors.New(msg))}
	g.Start, g.Done = now, now
	g.Dest.Settle(g, false)
	g.Dest.Release(g)
	if state, _ := g.Dest.BreakerState(); state != BreakerOpen {
		t.Fatalf("breaker %s after a systemic failure, want open", state)
	}
}

func TestPlanDefersRowsOfAnOpenBreaker(t *testing.T) {
	p := testPlanner(t, Config{Pause: PauseConfig{Base: time.Minute, Max: time.Minute}}, []Destination{{Name: "a"}, {Name: "b"}}, twoDestinations)
	now := time.Now()
	openBreaker(t, p, now, "refused")
	groups, outcomes := p.plan(nil, []sink.Record{rec(1, "a.x", "k"), rec(2, "a.x", "k"), rec(3, "b.x", "")}, now, nil)
	ids, out := planned(groups, outcomes)
	if o := out[1]; o.Kind != store.Deferred || o.Reason != DeferCircuitOpen || o.Delay < 59*time.Second || o.Attempted {
		t.Errorf("row of the open destination: %+v, want deferred circuit_open for its cool-down, no attempt", o)
	}
	if _, ok := out[2]; ok {
		t.Error("the key's next row got an outcome; it stays behind the deferred one")
	}
	if got := ids["b"]; len(got) != 1 {
		t.Errorf("destination b got %v; the other destination flows", got)
	}
}

func TestPlanProbesWithAFewRowsOfDistinctKeys(t *testing.T) {
	p := testPlanner(t, Config{Pause: PauseConfig{Base: time.Millisecond, Max: time.Millisecond}}, []Destination{{Name: "a"}}, twoDestinations)
	now := time.Now()
	openBreaker(t, p, now, "refused")
	var recs []sink.Record
	for i := range 20 {
		recs = append(recs, rec(int64(i+1), []string{"a.x", "a.y"}[i%2], []string{"k", "j", "", ""}[i%4]))
	}
	groups, _ := p.plan(nil, recs, now.Add(time.Second), nil)
	if len(groups) != 1 || !groups[0].Probe() {
		t.Fatalf("groups %+v, want one probe", groups)
	}
	g := groups[0]
	byTopic, byKey := map[string]int{}, map[string]int{}
	for _, r := range g.Recs {
		byTopic[r.Topic]++
		if r.HasKey {
			byKey[r.Key]++
		}
	}
	if len(g.Recs) > flow.ProbeRows || byTopic["a.x"] > flow.ProbeRowsByTopic || byKey["k"] > 1 || byKey["j"] > 1 {
		t.Errorf("probe of %d rows, by topic %v, by key %v", len(g.Recs), byTopic, byKey)
	}
	// A second batch meanwhile is held: one probe at a time.
	if groups, outcomes := p.plan(nil, recs[:1], now.Add(time.Second), nil); len(groups) != 0 || outcomes[0].Reason != DeferCircuitOpen {
		t.Errorf("a second batch during the probe: %d groups, outcomes %+v", len(groups), outcomes)
	}
}

func TestPlanHoldsRowsPastTheBulkheadAndDefersRetriesOverBudget(t *testing.T) {
	p := testPlanner(t, Config{}, []Destination{{Name: "a", MaxInFlight: 3, RetryBudget: RetryBudgetConfig{MinPerSecond: 0.1}}}, twoDestinations)
	retryRec := func(id int64) sink.Record { r := rec(id, "a.x", ""); r.RetryCount = 1; return r }
	// The budget holds one retry (a tenth per second, ten seconds' worth).
	groups, outcomes := p.plan(nil, []sink.Record{retryRec(1), retryRec(2), rec(3, "a.x", ""), rec(4, "a.x", ""), rec(5, "a.x", "")}, time.Now(), nil)
	ids, out := planned(groups, outcomes)
	if got := ids["a"]; len(got) != 3 || got[0] != 1 || got[1] != 3 || got[2] != 4 {
		t.Errorf("planned %v, want [1 3 4]", got)
	}
	if o := out[2]; o.Kind != store.Deferred || o.Reason != DeferRetryBudget {
		t.Errorf("second retry: %+v, want deferred retry_budget", o)
	}
	if _, ok := out[5]; ok {
		t.Error("the row past the bulkhead got an outcome; it waits untouched")
	}
	if free, _, _ := p.dests[0].Room(); free != 0 {
		t.Error("the bulkhead is not full while the plan's rows are in flight")
	}
	p.dests[0].Release(groups[0])
	if free, _, _ := p.dests[0].Room(); free == 0 {
		t.Error("the bulkhead stays full after the group is released")
	}
}

var errBad = errors.New("bad")

func TestSettleReleasesOrHoldsAKeyAfterAFailure(t *testing.T) {
	for _, block := range []bool{false, true} {
		policy := OnDeadLetterRelease
		if block {
			policy = OnDeadLetterBlock
		}
		p := testPlanner(t, Config{OnDeadLetter: policy}, []Destination{{Name: "a"}}, twoDestinations)
		groups, _ := p.plan(nil, []sink.Record{rec(1, "a.x", "k"), rec(2, "a.x", "k"), rec(3, "a.x", "j"), rec(4, "a.x", "j")}, time.Now(), nil)
		g := groups[0]
		g.Errs = []error{sink.Permanent(errBad, "rejected"), nil, sink.Transient(errBad, 0), sink.ErrNotSent}
		out := map[int64]store.Outcome{}
		for _, o := range g.Dest.Settle(g, false) {
			out[o.ID] = o
		}
		if o := out[1]; o.Kind != store.DeadLettered || o.ParkKey != block {
			t.Errorf("%s: permanent failure: %+v", policy, o)
		}
		if _, ok := out[2]; ok == block {
			t.Errorf("%s: the key's next row has an outcome: %v", policy, ok)
		}
		if o := out[3]; o.Kind != store.Retried || !o.Attempted {
			t.Errorf("%s: transient failure: %+v", policy, o)
		}
		if _, ok := out[4]; ok {
			t.Errorf("%s: a row not sent behind its key's failure has an outcome", policy)
		}
	}
}
