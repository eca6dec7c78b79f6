package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func TestRerouteGivesRowsAnotherTopicAndReplaysThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	a, _ := addDead(t, s, dead{Topic: "ordres", At: base, Reason: sink.ReasonNoRoute, Retries: 0})
	b, _ := addDead(t, s, dead{Topic: "ordres.eu", At: base.Add(time.Second), Reason: sink.ReasonNoRoute})
	c, _ := addDead(t, s, dead{Topic: "orders", At: base.Add(2 * time.Second), Reason: sink.ReasonPermanent})
	k := addParked(t, s, "K", base)
	before := snapshot(t, s)

	noRoute := byFilter(deadletter.Filter{Reason: sink.ReasonNoRoute}, 1)
	refused := errors.New("no route matches it")
	checkTopic := func(topic string) error {
		if topic != "orders" {
			return refused
		}
		return nil
	}
	routed := newStoreWith(t, s, deadletter.Config{CheckTopic: checkTopic})
	for name, p := range map[string]deadletter.RerouteParams{
		"no topic":          {BulkParams: noRoute},
		"spaces":            {BulkParams: noRoute, Topic: " orders"},
		"control":           {BulkParams: noRoute, Topic: "ord\ners"},
		"no route takes it": {BulkParams: noRoute, Topic: "orders.v2"},
		"no actor":          {BulkParams: deadletter.BulkParams{Selection: noRoute.Selection}, Topic: "orders"},
	} {
		if res, err := routed.Reroute(ctx, p); !deadletter.IsInput(err) || res != nil {
			t.Errorf("%s: Reroute = %+v, %v; want an input error", name, res, err)
		}
	}
	dry := deadletter.RerouteParams{BulkParams: noRoute, Topic: "orders"}
	dry.DryRun = true
	if res, err := st.Reroute(ctx, dry); err != nil || res.Count != 2 || !res.DryRun {
		t.Fatalf("dry run = %+v, %v; want two rows that would change", res, err)
	}
	checkUnchanged(t, s, before)

	// In batches of one: each batch's audit record keeps the topic its
	// rows had.
	p := deadletter.RerouteParams{BulkParams: noRoute, Topic: "orders"}
	p.Reason = "typo in the producer"
	res, err := routed.Reroute(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != deadletter.ActionReroute || !slices.Equal(sorted(res.Changed), []int64{a, b}) {
		t.Errorf("Reroute = %+v, want rows %d and %d", res, a, b)
	}
	for _, id := range []int64{a, b} {
		checkReplayed(t, s, id, "")
		if got := rowState(t, s, id).Topic; got != "orders" {
			t.Errorf("row %d has topic %q after the reroute, want orders", id, got)
		}
	}
	if got := statuses(t, s, c); got[0] != deadletter.StatusDeadLettered {
		t.Errorf("row %d outside the filter is %s", c, got[0])
	}
	recs := auditRecords(t, s)
	if len(recs) != 2 {
		t.Fatalf("%d audit records, want one a batch", len(recs))
	}
	var from []string
	for _, r := range recs {
		checkAudit(t, r, deadletter.ActionReroute, "typo in the producer", r.RowIDs...)
		if r.Details["topic"] != "orders" {
			t.Errorf("audit details %v do not name the new topic", r.Details)
		}
		from = append(from, fmt.Sprint(r.Details["from_topics"]))
	}
	slices.Sort(from)
	if !slices.Equal(from, []string{"[ordres.eu]", "[ordres]"}) {
		t.Errorf("audit keeps the topics %v, want [ordres] and [ordres.eu]", from)
	}

	// Rerouting the row that parks a key releases the key, as a replay
	// does; it can be made ready later, too.
	at := time.Now().Add(time.Hour).Truncate(time.Second)
	res, err = st.Reroute(ctx, deadletter.RerouteParams{BulkParams: byRefs(deadletter.Ref{ID: k.Park}), Topic: "orders", At: at})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.ReleasedKeys, []string{"K"}) {
		t.Errorf("released keys = %v, want [K]", res.ReleasedKeys)
	}
	checkReleased(t, s, k)
	if r := rowState(t, s, k.Park); r.Status != "pending" || r.Ready || !r.NextAttemptAt.Equal(at) {
		t.Errorf("the parking row after a reroute at %s = %+v", at, r)
	}
}

// The table's Run checks an action's inputs, every problem at once.
func TestActionRunChecksInputs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	a, _ := addDead(t, s, dead{At: base})
	reroute, _ := deadletter.LookupAction(deadletter.ActionReroute)
	discard, _ := deadletter.LookupAction(deadletter.ActionDiscard)
	replay, _ := deadletter.LookupAction(deadletter.ActionReplay)
	p := byRefs(deadletter.Ref{ID: a})
	for _, tc := range []struct {
		a    deadletter.ActionInfo
		in   deadletter.Inputs
		want []string
	}{
		{reroute, deadletter.Inputs{"color": "red"}, []string{"reroute needs to", "reroute takes no color"}},
		{discard, nil, []string{"discard needs a reason"}},
		{replay, deadletter.Inputs{"at": "tomorrow"}, []string{`at "tomorrow": use an RFC 3339 time`}},
	} {
		res, err := tc.a.Run(ctx, st, p, tc.in)
		var ie *deadletter.InputError
		if !errors.As(err, &ie) || res != nil {
			t.Errorf("%s %v = %+v, %v; want an input error", tc.a.Name, tc.in, res, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s %v: %q does not say %q", tc.a.Name, tc.in, err, w)
			}
		}
	}
	if got := statuses(t, s, a); got[0] != deadletter.StatusDeadLettered {
		t.Errorf("a refused action changed row %d: %s", a, got[0])
	}
	if _, err := func() (*deadletter.Result, error) {
		edit, _ := deadletter.LookupAction(deadletter.ActionEdit)
		return edit.Run(ctx, st, p, nil)
	}(); err == nil {
		t.Error("edit ran as an action on a selection")
	}
}
