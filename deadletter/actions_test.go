package deadletter_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func byRefs(refs ...deadletter.Ref) deadletter.BulkParams {
	return deadletter.BulkParams{Selection: deadletter.Selection{Refs: refs}, Actor: actor}
}

func byFilter(f deadletter.Filter, batch int) deadletter.BulkParams {
	return deadletter.BulkParams{Selection: deadletter.Selection{Filter: f}, BatchSize: batch, Actor: actor}
}

func checkAudit(t *testing.T, got auditRecord, action, reason string, ids ...int64) {
	t.Helper()
	if got.Actor != actor.Name || got.Source != actor.Source || got.Action != action || str(got.Reason) != str(nullable(reason)) ||
		!slices.Equal(sorted(got.RowIDs), sorted(ids)) {
		t.Errorf("audit record = %+v, want %s by %s/%s for %q on rows %v", got, action, actor.Name, actor.Source, reason, ids)
	}
}

func TestReplayByRefs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	a, _ := addDead(t, s, dead{At: base, Retries: 5, Key: "ka"})
	b, bEvent := addDead(t, s, dead{At: base.Add(time.Minute), Retries: 3, Reason: sink.ReasonRetriesExhausted,
		History: `[{"at":"2026-11-20T09:00:00Z","attempt":1,"class":"transient","error":"HTTP 500"},
		           {"at":"2026-11-20T09:01:00Z","attempt":2,"class":"transient","error":"HTTP 503"}]`})
	c, _ := addDead(t, s, dead{At: base.Add(2 * time.Minute)})
	histA, histB := rowState(t, s, a).History, rowState(t, s, b).History

	p := deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: a}, deadletter.Ref{EventID: bEvent})}
	p.Reason = "fixed the consumer"
	res, err := st.Replay(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != deadletter.ActionReplay || res.DryRun || !slices.Equal(sorted(res.Changed), []int64{a, b}) ||
		len(res.Unchanged) != 0 || len(res.ReleasedKeys) != 0 {
		t.Errorf("Replay = %+v, want rows %d and %d changed", res, a, b)
	}
	checkReplayed(t, s, a, histA)
	checkReplayed(t, s, b, histB)
	if got := statuses(t, s, c); got[0] != deadletter.StatusDeadLettered {
		t.Errorf("row %d not named was replayed: %s", c, got[0])
	}
	recs := auditRecords(t, s)
	if len(recs) != 1 {
		t.Fatalf("%d audit records, want 1", len(recs))
	}
	checkAudit(t, recs[0], deadletter.ActionReplay, "fixed the consumer", a, b)
	if _, ok := recs[0].Details["refs"]; !ok {
		t.Errorf("audit details %v do not say which rows were named", recs[0].Details)
	}

	// Replaying them again changes nothing and records nothing.
	res, err = st.Replay(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	wantUnchanged := []deadletter.Unchanged{{ID: a, Status: "pending"}, {ID: b, Status: "pending"}}
	if len(res.Changed) != 0 || !slices.Equal(res.Unchanged, wantUnchanged) {
		t.Errorf("second Replay = %+v, want nothing changed and %+v unchanged", res, wantUnchanged)
	}
	if out, _ := json.Marshal(res); !strings.Contains(string(out), `"changed":[]`) {
		t.Errorf("result JSON %s does not list an empty change", out)
	}
	if n := len(auditRecords(t, s)); n != 1 {
		t.Errorf("%d audit records after a replay that changed nothing, want 1", n)
	}
}

func TestReplayUnknownRefChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	a, _ := addDead(t, s, dead{})
	b, bEvent := addDead(t, s, dead{})
	before := snapshot(t, s)

	missingEvent := uuid.New()
	refs := []deadletter.Ref{{ID: a}, {ID: 99999}, {EventID: bEvent}, {EventID: missingEvent}}
	res, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: byRefs(refs...)})
	var nf *deadletter.NotFoundError
	if !errors.Is(err, deadletter.ErrNotFound) || !errors.As(err, &nf) || res != nil {
		t.Fatalf("Replay with unknown refs = %+v, %v; want not found", res, err)
	}
	if !slices.Equal(nf.Refs, []deadletter.Ref{{ID: 99999}, {EventID: missingEvent}}) {
		t.Errorf("not found refs = %v, want the two unknown ones", nf.Refs)
	}
	if !strings.Contains(err.Error(), "99999") || !strings.Contains(err.Error(), missingEvent.String()) {
		t.Errorf("error %q does not name the unknown refs", err)
	}
	checkUnchanged(t, s, before)
	if got := statuses(t, s, a, b); !slices.Equal(got, []string{"dead_lettered", "dead_lettered"}) {
		t.Errorf("statuses = %v", got)
	}
}

func TestReplayDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	a, _ := addDead(t, s, dead{At: base.Add(time.Minute)})
	b, _ := addDead(t, s, dead{At: base})
	pending := addPending(t, s, "", 0, "", "")
	for i := range 4 {
		addDead(t, s, dead{Topic: "batch", At: base.Add(time.Duration(i) * time.Second)})
	}
	before := snapshot(t, s)

	p := deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: a}, deadletter.Ref{ID: b}, deadletter.Ref{ID: pending})}
	p.DryRun = true
	res, err := st.Replay(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !res.DryRun || !slices.Equal(sorted(res.Changed), sorted([]int64{a, b})) ||
		!slices.Equal(res.Unchanged, []deadletter.Unchanged{{ID: pending, Status: "pending"}}) {
		t.Errorf("dry run = %+v", res)
	}

	// A dry run by filter walks every batch.
	lim := &fakeLimiter{}
	fp := deadletter.ReplayParams{BulkParams: byFilter(deadletter.Filter{Topic: "batch"}, 3)}
	fp.DryRun, fp.Limiter = true, lim
	res, err = st.Replay(ctx, fp)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changed) != 4 {
		t.Errorf("dry run by filter = %+v, want the 4 rows of topic batch", res)
	}
	if len(lim.calls) != 0 {
		t.Errorf("a dry run waited for the limiter: %v", lim.calls)
	}
	checkUnchanged(t, s, before)
}

func TestReplayAt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	id, _ := addDead(t, s, dead{})
	at := dbNow(t, s).Add(time.Hour).Truncate(time.Microsecond)

	p := deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: id}), At: at}
	if _, err := st.Replay(ctx, p); err != nil {
		t.Fatal(err)
	}
	r := rowState(t, s, id)
	if r.Status != "pending" || !r.NextAttemptAt.Equal(at) || r.Ready {
		t.Errorf("row replayed for %v: %+v", at, r)
	}
	recs := auditRecords(t, s)
	if len(recs) != 1 || recs[0].Details["ready_at"] == nil {
		t.Fatalf("audit = %+v, want the ready time recorded", recs)
	}
	if got, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(recs[0].Details["ready_at"])); !got.Equal(at) {
		t.Errorf("audit ready_at = %v, want %v", recs[0].Details["ready_at"], at)
	}
}

func TestReplayByFilterInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	now := dbNow(t, s)

	// Five matching rows, dead-lettered out of id order; the replay goes
	// oldest first.
	at := map[int64]int{}
	for _, m := range []int{4, 0, 3, 1, 2} {
		id, _ := addDead(t, s, dead{Topic: "orders", Dest: "kafka", At: base.Add(time.Duration(m) * time.Minute)})
		at[id] = m
	}
	var want []int64
	for id := range at {
		want = append(want, id)
	}
	slices.SortFunc(want, func(x, y int64) int { return at[x] - at[y] })
	other, _ := addDead(t, s, dead{Topic: "payments", Dest: "kafka", At: base})
	otherDest, _ := addDead(t, s, dead{Topic: "orders", Dest: "webhook", At: base})
	discarded, _ := addDead(t, s, dead{Topic: "orders", Dest: "kafka", At: base, Status: deadletter.StatusDiscarded})
	// Dead-lettered after the replay starts: not part of it.
	later, _ := addDead(t, s, dead{Topic: "orders", Dest: "kafka", At: now.Add(time.Hour)})

	lim := &fakeLimiter{}
	p := deadletter.ReplayParams{BulkParams: byFilter(deadletter.Filter{Topic: "orders", Destination: "kafka"}, 2)}
	p.Limiter, p.Reason = lim, "kafka is back"
	res, err := st.Replay(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Changed, want) {
		t.Errorf("Replay by filter changed %v, want %v, oldest first", res.Changed, want)
	}
	for _, id := range want {
		checkReplayed(t, s, id, "")
	}
	if got := statuses(t, s, other, otherDest, discarded, later); !slices.Equal(got, []string{"dead_lettered", "dead_lettered", "discarded", "dead_lettered"}) {
		t.Errorf("rows outside the filter or the replay's start: %v", got)
	}
	// A wait for a whole batch before each batch's transaction.
	if !slices.Equal(lim.calls, []int{2, 2, 2}) {
		t.Errorf("limiter waited for %v rows, want a wait per batch: [2 2 2]", lim.calls)
	}
	recs := auditRecords(t, s)
	if len(recs) != 3 {
		t.Fatalf("%d audit records, want one per batch: 3", len(recs))
	}
	for i, batch := range [][]int64{want[:2], want[2:4], want[4:]} {
		checkAudit(t, recs[i], deadletter.ActionReplay, "kafka is back", batch...)
		if f, _ := json.Marshal(recs[i].Details["filter"]); string(f) != `{"destination":"kafka","topic":"orders"}` {
			t.Errorf("audit record %d filter = %s", i, f)
		}
	}
}

func TestReplayBatchBoundary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	for i := range 4 {
		addDead(t, s, dead{At: base.Add(time.Duration(i) * time.Second)})
	}
	lim := &fakeLimiter{}
	p := deadletter.ReplayParams{BulkParams: byFilter(deadletter.Filter{Topic: "orders"}, 2)}
	p.Limiter = lim
	res, err := st.Replay(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	// The third wait is for the batch that finds nothing left.
	if len(res.Changed) != 4 || !slices.Equal(lim.calls, []int{2, 2, 2}) || len(auditRecords(t, s)) != 2 {
		t.Errorf("Replay of 4 rows in batches of 2 = %+v, limiter %v", res, lim.calls)
	}
}

func TestReplayAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	a, _ := addDead(t, s, dead{Topic: "a"})
	b, _ := addDead(t, s, dead{Topic: "b", Reason: sink.ReasonNoRoute})
	d, _ := addDead(t, s, dead{Topic: "c", Status: deadletter.StatusDiscarded})

	res, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: deadletter.BulkParams{
		Selection: deadletter.Selection{All: true}, Actor: actor}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sorted(res.Changed), []int64{a, b}) {
		t.Errorf("Replay all changed %v, want %v", res.Changed, []int64{a, b})
	}
	if got := statuses(t, s, a, b, d); !slices.Equal(got, []string{"pending", "pending", "discarded"}) {
		t.Errorf("statuses = %v", got)
	}
	recs := auditRecords(t, s)
	if len(recs) != 1 || recs[0].Details["all"] != true {
		t.Errorf("audit = %+v, want one record saying all", recs)
	}
}

func TestReplayLimiterError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	errSlow := errors.New("rate limit wait would exceed context deadline")

	t.Run("after a batch", func(t *testing.T) {
		t.Parallel()
		s := pgtest.NewSchema(t)
		st := newStore(t, s)
		var ids []int64
		for i := range 5 {
			id, _ := addDead(t, s, dead{At: base.Add(time.Duration(i) * time.Second)})
			ids = append(ids, id)
		}
		lim := &fakeLimiter{failAt: 2, err: errSlow}
		p := deadletter.ReplayParams{BulkParams: byFilter(deadletter.Filter{Topic: "orders"}, 2)}
		p.Limiter = lim
		res, err := st.Replay(ctx, p)
		if !errors.Is(err, errSlow) || !strings.Contains(err.Error(), "after 2 rows") {
			t.Fatalf("Replay with a failing limiter: %v; want the limiter's error saying 2 rows were done", err)
		}
		if res == nil || !slices.Equal(res.Changed, ids[:2]) {
			t.Errorf("result = %+v, want the first batch %v", res, ids[:2])
		}
		if got := statuses(t, s, ids...); !slices.Equal(got, []string{"pending", "pending", "dead_lettered", "dead_lettered", "dead_lettered"}) {
			t.Errorf("statuses = %v, want the first batch replayed and the rest left", got)
		}
		if n := len(auditRecords(t, s)); n != 1 {
			t.Errorf("%d audit records, want the first batch's", n)
		}
	})

	t.Run("before any", func(t *testing.T) {
		t.Parallel()
		s := pgtest.NewSchema(t)
		st := newStore(t, s)
		addDead(t, s, dead{})
		before := snapshot(t, s)
		p := deadletter.ReplayParams{BulkParams: byFilter(deadletter.Filter{Topic: "orders"}, 2)}
		p.Limiter = &fakeLimiter{failAt: 1, err: errSlow}
		res, err := st.Replay(ctx, p)
		if !errors.Is(err, errSlow) || res != nil {
			t.Fatalf("Replay = %+v, %v; want the limiter's error", res, err)
		}
		checkUnchanged(t, s, before)
	})
}

func TestReplayReleasesParkedKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	k := addParked(t, s, "K", base)
	l := addParked(t, s, "L", base.Add(time.Minute))
	m := addParked(t, s, "M", base.Add(2*time.Minute))

	res, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: k.Park})})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.ReleasedKeys, []string{"K"}) {
		t.Errorf("released keys = %v, want [K]", res.ReleasedKeys)
	}
	checkReplayed(t, s, k.Park, "")
	checkReleased(t, s, k)
	checkParked(t, s, l)
	checkParked(t, s, m)
	if recs := auditRecords(t, s); len(recs) != 1 || fmt.Sprint(recs[0].Details["released_keys"]) != "[K]" {
		t.Errorf("audit = %+v, want the released key recorded", recs)
	}

	// By filter too.
	res, err = st.Replay(ctx, deadletter.ReplayParams{BulkParams: byFilter(deadletter.Filter{Key: "L"}, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Changed, []int64{l.Park}) || !slices.Equal(res.ReleasedKeys, []string{"L"}) {
		t.Errorf("Replay by key = %+v", res)
	}
	checkReleased(t, s, l)
	checkParked(t, s, m)
}

// bulkInputErrors are selections and parameters Replay and Discard refuse.
func bulkInputErrors(a int64) map[string]deadletter.BulkParams {
	with := func(f func(*deadletter.BulkParams)) deadletter.BulkParams {
		p := byRefs(deadletter.Ref{ID: a})
		p.Reason = "why"
		f(&p)
		return p
	}
	tooMany := make([]deadletter.Ref, deadletter.MaxBatchSize+1)
	for i := range tooMany {
		tooMany[i] = deadletter.Ref{ID: int64(i + 1)}
	}
	return map[string]deadletter.BulkParams{
		"no selection":    with(func(p *deadletter.BulkParams) { p.Selection = deadletter.Selection{} }),
		"refs and filter": with(func(p *deadletter.BulkParams) { p.Filter = deadletter.Filter{Topic: "orders"} }),
		"refs and all":    with(func(p *deadletter.BulkParams) { p.All = true }),
		"filter and all": with(func(p *deadletter.BulkParams) {
			p.Selection = deadletter.Selection{Filter: deadletter.Filter{Topic: "x"}, All: true}
		}),
		"too many refs": with(func(p *deadletter.BulkParams) { p.Refs = tooMany }),
		"bad filter reason": with(func(p *deadletter.BulkParams) {
			p.Selection = deadletter.Selection{Filter: deadletter.Filter{Reason: "nope"}}
		}),
		"since after until": with(func(p *deadletter.BulkParams) {
			p.Selection = deadletter.Selection{Filter: deadletter.Filter{Since: deadletter.TimeBound{Ago: time.Hour}, Until: deadletter.TimeBound{Ago: 2 * time.Hour}}}
		}),
		"no actor":         with(func(p *deadletter.BulkParams) { p.Actor = deadletter.Actor{} }),
		"blank actor name": with(func(p *deadletter.BulkParams) { p.Actor.Name = "  " }),
		"no actor source":  with(func(p *deadletter.BulkParams) { p.Actor.Source = "" }),
		"negative batch":   with(func(p *deadletter.BulkParams) { p.BatchSize = -1 }),
		"batch above most": with(func(p *deadletter.BulkParams) { p.BatchSize = deadletter.MaxBatchSize + 1 }),
		"filter batch -1":  with(func(p *deadletter.BulkParams) { p.Selection, p.BatchSize = deadletter.Selection{All: true}, -1 }),
		"all without actor": with(func(p *deadletter.BulkParams) {
			p.Selection, p.Actor = deadletter.Selection{All: true}, deadletter.Actor{}
		}),
	}
}

func TestBulkInputErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	a, _ := addDead(t, s, dead{})
	addParked(t, s, "K", base)
	before := snapshot(t, s)

	t.Run("cases", func(t *testing.T) {
		for name, p := range bulkInputErrors(a) {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				res, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: p})
				if !deadletter.IsInput(err) || res != nil {
					t.Errorf("Replay = %+v, %v; want an input error", res, err)
				}
				res, err = st.Discard(ctx, p)
				if !deadletter.IsInput(err) || res != nil {
					t.Errorf("Discard = %+v, %v; want an input error", res, err)
				}
			})
		}
	})
	checkUnchanged(t, s, before)
}

func TestDiscard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	a, _ := addDead(t, s, dead{At: base, Reason: sink.ReasonTooLarge})
	b, _ := addDead(t, s, dead{At: base.Add(time.Second)})
	k := addParked(t, s, "K", base)
	l := addParked(t, s, "L", base)
	before := snapshot(t, s)

	for _, reason := range []string{"", " \t"} {
		p := byRefs(deadletter.Ref{ID: a})
		p.Reason = reason
		res, err := st.Discard(ctx, p)
		if !deadletter.IsInput(err) || res != nil {
			t.Errorf("Discard with reason %q = %+v, %v; want an input error", reason, res, err)
		}
	}
	checkUnchanged(t, s, before)

	p := byRefs(deadletter.Ref{ID: a})
	p.Reason = " duplicate of order 7 "
	res, err := st.Discard(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != deadletter.ActionDiscard || !slices.Equal(res.Changed, []int64{a}) {
		t.Errorf("Discard = %+v", res)
	}
	r := rowState(t, s, a)
	if r.Status != deadletter.StatusDiscarded || str(r.Reason) != `"too_large"` || r.DeadLetteredAt == nil || !r.DeadLetteredAt.Equal(base) {
		t.Errorf("discarded row = %+v, want status discarded keeping its reason and time", r)
	}
	checkDiscardedNow(t, s, a)
	if got := statuses(t, s, b); got[0] != deadletter.StatusDeadLettered {
		t.Errorf("row %d not named: %s", b, got[0])
	}
	recs := auditRecords(t, s)
	if len(recs) != 1 {
		t.Fatalf("%d audit records, want 1", len(recs))
	}
	checkAudit(t, recs[0], deadletter.ActionDiscard, "duplicate of order 7", a)

	// Discarded rows are not dead letters any more.
	res, err = st.Discard(ctx, p)
	if err != nil || len(res.Changed) != 0 || !slices.Equal(res.Unchanged, []deadletter.Unchanged{{ID: a, Status: "discarded"}}) {
		t.Errorf("second Discard = %+v, %v", res, err)
	}
	replayed, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: a})})
	if err != nil || len(replayed.Changed) != 0 || !slices.Equal(replayed.Unchanged, []deadletter.Unchanged{{ID: a, Status: "discarded"}}) {
		t.Errorf("Replay of a discarded row = %+v, %v", replayed, err)
	}
	if n := len(auditRecords(t, s)); n != 1 {
		t.Errorf("%d audit records, want 1", n)
	}

	// Discarding the row that parks a key lets the key go.
	p = byRefs(deadletter.Ref{ID: k.Park})
	p.Reason = "obsolete"
	res, err = st.Discard(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.ReleasedKeys, []string{"K"}) {
		t.Errorf("released keys = %v, want [K]", res.ReleasedKeys)
	}
	if r := rowState(t, s, k.Park); r.Status != deadletter.StatusDiscarded || r.KeyParked {
		t.Errorf("discarded parking row = %+v", r)
	}
	checkReleased(t, s, k)
	checkParked(t, s, l)

	// By filter, in batches.
	fp := byFilter(deadletter.Filter{Key: "L"}, 1)
	fp.Reason = "obsolete"
	res, err = st.Discard(ctx, fp)
	if err != nil || !slices.Equal(res.Changed, []int64{l.Park}) || !slices.Equal(res.ReleasedKeys, []string{"L"}) {
		t.Errorf("Discard by filter = %+v, %v", res, err)
	}
	checkReleased(t, s, l)
	if got := statuses(t, s, b); got[0] != deadletter.StatusDeadLettered {
		t.Errorf("row %d outside the filter: %s", b, got[0])
	}
}

func TestEdit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	id, _ := addDead(t, s, dead{Topic: "orders", Headers: `{"a": "1"}`, Payload: []byte(`{"v":1}`), Retries: 4})
	other, otherEvent := addDead(t, s, dead{Topic: "orders", Headers: `{"a": "1"}`, Payload: []byte(`{"v":1}`)})
	hist := rowState(t, s, id).History

	res, err := st.Edit(ctx, deadletter.EditParams{
		Ref:     deadletter.Ref{ID: id},
		Topic:   "orders.v2",
		Headers: json.RawMessage(`{"b": "2", "c": "<3"}`),
		Payload: []byte(`{"v": 2}`),
		Actor:   actor,
		Reason:  "schema fix",
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != deadletter.ActionEdit || !slices.Equal(res.Changed, []int64{id}) || len(res.ReleasedKeys) != 0 {
		t.Errorf("Edit = %+v", res)
	}
	checkReplayed(t, s, id, hist)
	r := rowState(t, s, id)
	if r.Topic != "orders.v2" || r.Headers != `{"b": "2", "c": "<3"}` || string(r.Payload) != `{"v": 2}` {
		t.Errorf("edited row: topic %q headers %s payload %s", r.Topic, r.Headers, r.Payload)
	}
	recs := auditRecords(t, s)
	if len(recs) != 1 {
		t.Fatalf("%d audit records, want 1", len(recs))
	}
	checkAudit(t, recs[0], deadletter.ActionEdit, "schema fix", id)
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	wantDetails := map[string]any{
		"before": map[string]any{"topic": "orders", "headers": map[string]any{"a": "1"}, "payload": b64(`{"v":1}`)},
		"after":  map[string]any{"topic": "orders.v2", "headers": map[string]any{"b": "2", "c": "<3"}, "payload": b64(`{"v": 2}`)},
	}
	if fmt.Sprint(recs[0].Details) != fmt.Sprint(wantDetails) {
		t.Errorf("audit details = %v\nwant %v", recs[0].Details, wantDetails)
	}

	// "after" holds only what changed; by event id, ready later.
	at := dbNow(t, s).Add(time.Hour).Truncate(time.Microsecond)
	if _, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{EventID: otherEvent}, Payload: []byte(`[]`), At: at, Actor: actor}); err != nil {
		t.Fatal(err)
	}
	r = rowState(t, s, other)
	if r.Status != "pending" || r.Topic != "orders" || r.Headers != `{"a": "1"}` || string(r.Payload) != `[]` || !r.NextAttemptAt.Equal(at) {
		t.Errorf("row with a new payload = %+v", r)
	}
	recs = auditRecords(t, s)
	after := recs[len(recs)-1].Details["after"]
	if fmt.Sprint(after) != fmt.Sprint(map[string]any{"payload": b64(`[]`)}) {
		t.Errorf("audit after = %v, want only the payload", after)
	}
	if before, _ := recs[len(recs)-1].Details["before"].(map[string]any); before["topic"] != "orders" || before["payload"] != b64(`{"v":1}`) {
		t.Errorf("audit before = %v, want the whole row as it was", before)
	}
}

// With digest audit payloads, an edit's record keeps the payloads' SHA-256
// and length, never their bytes, while the row itself is edited as usual.
func TestEditAuditKeepsDigests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st, err := deadletter.NewStore(s.Pool, deadletter.Config{Schema: s.Name, AuditPayloads: deadletter.AuditPayloadsDigest})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := addDead(t, s, dead{Topic: "orders", Headers: `{"a": "1"}`, Payload: []byte(`{"email":"ann@example.com"}`)})
	if _, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: id}, Payload: []byte(`{"email":"ann@example.org"}`), Actor: actor}); err != nil {
		t.Fatal(err)
	}
	if r := rowState(t, s, id); r.Status != "pending" || string(r.Payload) != `{"email":"ann@example.org"}` {
		t.Fatalf("edited row = %+v", r)
	}
	digest := func(p string) string { sum := sha256.Sum256([]byte(p)); return hex.EncodeToString(sum[:]) }
	want := map[string]any{
		"before": map[string]any{"topic": "orders", "headers": map[string]any{"a": "1"},
			"payload_sha256": digest(`{"email":"ann@example.com"}`), "payload_bytes": float64(27)},
		"after": map[string]any{"payload_sha256": digest(`{"email":"ann@example.org"}`), "payload_bytes": float64(27)},
	}
	recs := auditRecords(t, s)
	if len(recs) != 1 || fmt.Sprint(recs[0].Details) != fmt.Sprint(want) {
		t.Fatalf("audit details = %v\nwant %v", recs, want)
	}
	var raw string
	if err := s.Pool.QueryRow(ctx, `SELECT details::text FROM outbox_audit`).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(raw, "example") || strings.Contains(raw, base64.StdEncoding.EncodeToString([]byte(`{"email":"ann@example.com"}`))) {
		t.Fatalf("the audit record holds the payload: %s", raw)
	}
	if _, err := deadletter.NewStore(s.Pool, deadletter.Config{Schema: s.Name, AuditPayloads: "hashed"}); err == nil ||
		!strings.Contains(err.Error(), `audit_payloads is "hashed"; use full or digest`) {
		t.Fatalf("unknown audit_payloads: %v", err)
	}
}

func TestEditPayloadKinds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	jsonRow, _ := addDead(t, s, dead{Payload: []byte(`{"v":1}`)})
	textRow, _ := addDead(t, s, dead{Payload: []byte(`v=1`)})
	before := snapshot(t, s)

	_, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: jsonRow}, Payload: []byte(`v=2`), Actor: actor})
	if !deadletter.IsInput(err) {
		t.Errorf("text in place of JSON: %v, want an input error", err)
	}
	_, err = st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: jsonRow}, Payload: []byte{}, Actor: actor})
	if !deadletter.IsInput(err) {
		t.Errorf("empty payload in place of JSON: %v, want an input error", err)
	}
	checkUnchanged(t, s, before)

	if _, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: jsonRow}, Payload: []byte(`v=2`), AllowNonJSON: true, Actor: actor}); err != nil {
		t.Errorf("text in place of JSON, allowed: %v", err)
	}
	if _, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: textRow}, Payload: []byte(`v=2`), Actor: actor}); err != nil {
		t.Errorf("text in place of text: %v", err)
	}
	for _, id := range []int64{jsonRow, textRow} {
		if r := rowState(t, s, id); r.Status != "pending" || string(r.Payload) != "v=2" {
			t.Errorf("row %d = %+v", id, r)
		}
	}
}

func TestEditInputErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	id, _ := addDead(t, s, dead{Payload: []byte(`{"v":1}`)})
	before := snapshot(t, s)
	errNoRoute := errors.New("no route matches")
	// strict is the store with the checks of a relay whose payload cap
	// is 7 bytes and whose routes take no topic.
	strict := newStoreWith(t, s, deadletter.Config{MaxPayload: 7, CheckTopic: func(string) error { return errNoRoute }})

	ref := deadletter.Ref{ID: id}
	t.Run("cases", func(t *testing.T) {
		for _, c := range []struct {
			name     string
			p        deadletter.EditParams
			problems int
			mention  string
			checked  bool // edited through the store with checks
		}{
			{"nothing to change", deadletter.EditParams{}, 1, "nothing to change", false},
			{"headers an array", deadletter.EditParams{Headers: json.RawMessage(`["a"]`)}, 1, "headers", false},
			{"headers a string", deadletter.EditParams{Headers: json.RawMessage(`"a"`)}, 1, "headers", false},
			{"headers null", deadletter.EditParams{Headers: json.RawMessage(`null`)}, 1, "headers", false},
			{"headers a number value", deadletter.EditParams{Headers: json.RawMessage(`{"a": 1}`)}, 1, "headers", false},
			{"headers an object value", deadletter.EditParams{Headers: json.RawMessage(`{"a": {"b": "c"}}`)}, 1, "headers", false},
			{"headers two objects", deadletter.EditParams{Headers: json.RawMessage(`{"a": "b"} {"c": "d"}`)}, 1, "headers", false},
			{"headers malformed", deadletter.EditParams{Headers: json.RawMessage(`{"a": `)}, 1, "headers", false},
			{"headers empty", deadletter.EditParams{Headers: json.RawMessage(``)}, 1, "headers", false},
			{"topic padded", deadletter.EditParams{Topic: " orders"}, 1, "white space", false},
			{"topic control character", deadletter.EditParams{Topic: "ord\ners"}, 1, "control", false},
			{"topic refused", deadletter.EditParams{Topic: "nowhere"}, 1, "no route matches", true},
			{"payload above the cap", deadletter.EditParams{Payload: []byte(`{"v":12}`)}, 1, "above the payload cap of 7", true},
			{"text in place of JSON", deadletter.EditParams{Payload: []byte(`not json`)}, 1, "not JSON", false},
			{"every problem", deadletter.EditParams{Topic: "nowhere", Headers: json.RawMessage(`[]`), Payload: []byte(`{"v":12}`)},
				3, "headers", true},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				p := c.p
				p.Ref, p.Actor = ref, actor
				st := st
				if c.checked {
					st = strict
				}
				res, err := st.Edit(ctx, p)
				var ie *deadletter.InputError
				if !errors.As(err, &ie) || res != nil {
					t.Fatalf("Edit = %+v, %v; want an input error", res, err)
				}
				if len(ie.Problems) != c.problems || !strings.Contains(err.Error(), c.mention) {
					t.Errorf("problems %q, want %d mentioning %q", ie.Problems, c.problems, c.mention)
				}
			})
		}
	})
	for _, a := range []deadletter.Actor{{}, {Name: "alice"}, {Source: "cli"}} {
		if _, err := st.Edit(ctx, deadletter.EditParams{Ref: ref, Topic: "x", Actor: a}); !deadletter.IsInput(err) {
			t.Errorf("Edit by actor %+v: %v, want an input error", a, err)
		}
	}
	checkUnchanged(t, s, before)

	// A topic the check accepts passes.
	var checked string
	accepting := newStoreWith(t, s, deadletter.Config{CheckTopic: func(topic string) error { checked = topic; return nil }})
	res, err := accepting.Edit(ctx, deadletter.EditParams{Ref: ref, Topic: "orders.v2", Actor: actor})
	if err != nil || checked != "orders.v2" || rowState(t, s, id).Topic != "orders.v2" {
		t.Errorf("Edit with an accepted topic = %+v, %v; checked %q", res, err, checked)
	}
}

func TestEditRowsThatAreNotDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	pending := addPending(t, s, "", 0, "", "")
	discarded, _ := addDead(t, s, dead{Status: deadletter.StatusDiscarded})
	before := snapshot(t, s)

	for _, id := range []int64{pending, discarded} {
		res, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: id}, Topic: "x", Actor: actor})
		if !errors.Is(err, deadletter.ErrNotDeadLettered) || res != nil {
			t.Errorf("Edit of row %d = %+v, %v; want ErrNotDeadLettered", id, res, err)
		}
	}
	for _, ref := range []deadletter.Ref{{ID: 999}, {EventID: uuid.New()}} {
		res, err := st.Edit(ctx, deadletter.EditParams{Ref: ref, Topic: "x", Actor: actor})
		if !errors.Is(err, deadletter.ErrNotFound) || res != nil {
			t.Errorf("Edit of unknown %s = %+v, %v; want ErrNotFound", ref, res, err)
		}
	}
	checkUnchanged(t, s, before)
}

// An edit made from a version of the row applies only while the row still
// holds that version: after another edit (replayed, and dead-lettered
// again), it is refused and changes nothing.
func TestEditFromAVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	id, _ := addDead(t, s, dead{Topic: "orders", Headers: `{"a": "1"}`, Payload: []byte(`{"v":1}`)})
	version := func() string {
		t.Helper()
		d, err := st.Get(ctx, deadletter.Ref{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		return d.Version
	}
	set := func(assignments string) {
		t.Helper()
		if _, err := s.Pool.Exec(ctx, `UPDATE outbox SET `+assignments+` WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
	}
	read := version()
	if read == "" || version() != read {
		t.Fatalf("versions of the same content: %q and %q", read, version())
	}
	set(`dead_lettered_at = now() + interval '1 minute', retry_count = retry_count + 1, last_error = 'again'`)
	if version() != read {
		t.Error("the version changed with the row's state; it names only topic, headers and payload")
	}
	seen := map[string]bool{read: true}
	for _, change := range []string{`topic = 'orders.v2'`, `headers = '{"a": "2"}'`, `payload = '{"v":2}'`, `payload = '{"v":2} '`} {
		set(change)
		if v := version(); seen[v] {
			t.Errorf("after %s the version is one seen before", change)
		} else {
			seen[v] = true
		}
	}

	// Another operator's edit, replayed and dead-lettered again.
	read = version()
	if _, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: id}, Payload: []byte(`{"v":3}`), Actor: actor}); err != nil {
		t.Fatal(err)
	}
	failAgain(t, s, id)
	before := snapshot(t, s)
	res, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: id}, Payload: []byte(`{"v":4}`), Version: read, Actor: actor})
	if !errors.Is(err, deadletter.ErrChanged) || res != nil {
		t.Fatalf("Edit from a version the row no longer holds = %+v, %v; want ErrChanged", res, err)
	}
	// Something that is no version at all is bad input, not a change.
	var ie *deadletter.InputError
	for _, bad := range []string{"garbage", strings.ToUpper(read), read + "00"} {
		if _, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: id}, Payload: []byte(`{"v":4}`), Version: bad, Actor: actor}); !errors.As(err, &ie) {
			t.Errorf("Edit with version %q: %v, want an input error", bad, err)
		}
	}
	checkUnchanged(t, s, before)

	// Made from the version it holds now, the edit applies.
	if _, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: id}, Payload: []byte(`{"v":4}`), Version: version(), Actor: actor}); err != nil {
		t.Fatal(err)
	}
	if r := rowState(t, s, id); r.Status != "pending" || string(r.Payload) != `{"v":4}` {
		t.Errorf("after the edit from the current version: %s %s", r.Status, r.Payload)
	}
}

func TestEditReleasesParkedKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	k := addParked(t, s, "K", base)
	l := addParked(t, s, "L", base)

	res, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: k.Park}, Payload: []byte(`{"fixed":true}`), Actor: actor})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.ReleasedKeys, []string{"K"}) {
		t.Errorf("released keys = %v, want [K]", res.ReleasedKeys)
	}
	checkReplayed(t, s, k.Park, "")
	checkReleased(t, s, k)
	checkParked(t, s, l)
}

// checkDiscardedNow checks that row id records when it was discarded:
// discarded rows are kept for their retention from then.
func checkDiscardedNow(t *testing.T, s *pgtest.Schema, id int64) {
	t.Helper()
	var age *time.Duration
	if err := s.Pool.QueryRow(context.Background(), `SELECT now() - discarded_at FROM outbox WHERE id = $1`, id).Scan(&age); err != nil {
		t.Fatal(err)
	}
	if age == nil || *age < 0 || *age > time.Minute {
		t.Errorf("row %d discarded %v ago, want just now", id, age)
	}
}

func TestRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	k := addParked(t, s, "K", base)
	l := addParked(t, s, "L", base.Add(time.Minute))

	res, err := st.Release(ctx, deadletter.ReleaseParams{Key: "K", Actor: actor, Reason: "consumer fixed"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != deadletter.ActionRelease || !slices.Equal(res.Changed, []int64{k.Park}) || !slices.Equal(res.ReleasedKeys, []string{"K"}) {
		t.Errorf("Release = %+v", res)
	}
	if r := rowState(t, s, k.Park); r.Status != deadletter.StatusDeadLettered || r.KeyParked || r.Reason == nil {
		t.Errorf("released parking row = %+v, want still dead-lettered, no longer parking", r)
	}
	checkReleased(t, s, k)
	checkParked(t, s, l)
	recs := auditRecords(t, s)
	if len(recs) != 1 {
		t.Fatalf("%d audit records, want 1", len(recs))
	}
	checkAudit(t, recs[0], deadletter.ActionRelease, "consumer fixed", k.Park)
	if recs[0].Details["key"] != "K" || recs[0].Details["discarded"] != false {
		t.Errorf("audit details = %v", recs[0].Details)
	}
	keys, err := st.Keys(ctx, 0)
	if err != nil || len(keys) != 1 || keys[0].Key != "L" {
		t.Errorf("Keys after releasing K = %+v, %v; want only L", keys, err)
	}

	for _, key := range []string{"K", "never-parked"} {
		res, err := st.Release(ctx, deadletter.ReleaseParams{Key: key, Actor: actor})
		if !errors.Is(err, deadletter.ErrNotParked) || res != nil {
			t.Errorf("Release(%s) = %+v, %v; want ErrNotParked", key, res, err)
		}
	}

	before := snapshot(t, s)
	for name, p := range map[string]deadletter.ReleaseParams{
		"discard without reason": {Key: "L", Discard: true, Actor: actor},
		"discard blank reason":   {Key: "L", Discard: true, Reason: " ", Actor: actor},
		"no key":                 {Actor: actor},
		"no actor":               {Key: "L"},
	} {
		if res, err := st.Release(ctx, p); !deadletter.IsInput(err) || res != nil {
			t.Errorf("Release with %s = %+v, %v; want an input error", name, res, err)
		}
	}
	checkUnchanged(t, s, before)
	checkParked(t, s, l)

	res, err = st.Release(ctx, deadletter.ReleaseParams{Key: "L", Discard: true, Actor: actor, Reason: "obsolete"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Changed, []int64{l.Park}) {
		t.Errorf("Release with discard = %+v", res)
	}
	if r := rowState(t, s, l.Park); r.Status != deadletter.StatusDiscarded || r.KeyParked {
		t.Errorf("parking row released with discard = %+v, want discarded", r)
	}
	checkDiscardedNow(t, s, l.Park)
	var stamped int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1 AND discarded_at IS NOT NULL`, k.Park).Scan(&stamped); err != nil || stamped != 0 {
		t.Errorf("a row released without discard has a discard time (%v)", err)
	}
	checkReleased(t, s, l)
	recs = auditRecords(t, s)
	if len(recs) != 2 {
		t.Fatalf("%d audit records, want 2", len(recs))
	}
	checkAudit(t, recs[1], deadletter.ActionRelease, "obsolete", l.Park)
	if recs[1].Details["discarded"] != true {
		t.Errorf("audit details = %v, want discarded", recs[1].Details)
	}
}

func TestAudit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	rowA, _ := addDead(t, s, dead{})
	rowB, _ := addDead(t, s, dead{})
	rowC, _ := addDead(t, s, dead{})
	rowD, _ := addDead(t, s, dead{})
	addParked(t, s, "K", base)
	bob := deadletter.Actor{Name: "bob", Source: "api"}

	act := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: rowA})})
	act(err)
	p := byRefs(deadletter.Ref{ID: rowB})
	p.Actor, p.Reason = bob, "duplicate"
	_, err = st.Discard(ctx, p)
	act(err)
	p = byRefs(deadletter.Ref{ID: rowC})
	p.Actor = bob
	_, err = st.Replay(ctx, deadletter.ReplayParams{BulkParams: p})
	act(err)
	_, err = st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: rowD}, Topic: "x", Actor: actor})
	act(err)
	_, err = st.Release(ctx, deadletter.ReleaseParams{Key: "K", Actor: deadletter.Actor{Name: "carol", Source: "cli"}})
	act(err)

	// Record i (from 1) was written 6-i hours ago.
	s.Exec(t, `UPDATE outbox_audit AS o SET at = now() - (6 - n.n) * interval '1 hour'
FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM outbox_audit) AS n WHERE o.id = n.id`)
	all, err := st.Audit(ctx, deadletter.AuditParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Records) != 5 || all.Next != "" {
		t.Fatalf("Audit = %+v, want 5 records on one page", all)
	}
	// rec[i] is the (i+1)th action.
	rec := make([]deadletter.AuditRecord, 5)
	for i, r := range all.Records {
		rec[4-i] = r
	}
	if r := rec[1]; r.Actor != "bob" || r.Source != "api" || r.Action != deadletter.ActionDiscard || r.Reason != "duplicate" ||
		!slices.Equal(r.RowIDs, []int64{rowB}) || !strings.Contains(string(r.Details), `"refs"`) {
		t.Errorf("discard record = %+v, details %s", r, r.Details)
	}
	if rec[0].At.After(rec[1].At) || rec[0].Reason != "" {
		t.Errorf("first record = %+v", rec[0])
	}

	hours := func(h float64) deadletter.TimeBound {
		return deadletter.TimeBound{Ago: time.Duration(h * float64(time.Hour))}
	}
	for _, c := range []struct {
		name string
		p    deadletter.AuditParams
		want []int // action numbers, newest first
	}{
		{"action", deadletter.AuditParams{Action: deadletter.ActionReplay}, []int{3, 1}},
		{"actor", deadletter.AuditParams{Actor: "bob"}, []int{3, 2}},
		{"action and actor", deadletter.AuditParams{Action: deadletter.ActionReplay, Actor: "bob"}, []int{3}},
		{"row", deadletter.AuditParams{Row: rowC}, []int{3}},
		{"row of a release", deadletter.AuditParams{Row: rec[4].RowIDs[0]}, []int{5}},
		{"unknown actor", deadletter.AuditParams{Actor: "mallory"}, nil},
		{"since ago", deadletter.AuditParams{Since: hours(2.5)}, []int{5, 4}},
		{"until ago", deadletter.AuditParams{Until: hours(3.5)}, []int{2, 1}},
		{"since inclusive", deadletter.AuditParams{Since: deadletter.TimeBound{At: rec[2].At}}, []int{5, 4, 3}},
		{"until exclusive", deadletter.AuditParams{Until: deadletter.TimeBound{At: rec[2].At}}, []int{2, 1}},
	} {
		page, err := st.Audit(ctx, c.p)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var want []int64
		for _, n := range c.want {
			want = append(want, rec[n-1].ID)
		}
		var got []int64
		for _, r := range page.Records {
			got = append(got, r.ID)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: records %v, want %v (actions %v)", c.name, got, want, c.want)
		}
	}

	// Pages of two, newest first.
	var walked []int64
	cursor := ""
	for range 4 {
		page, err := st.Audit(ctx, deadletter.AuditParams{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Records) > 2 {
			t.Fatalf("page of %d records, above the limit", len(page.Records))
		}
		for _, r := range page.Records {
			walked = append(walked, r.ID)
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	if want := []int64{rec[4].ID, rec[3].ID, rec[2].ID, rec[1].ID, rec[0].ID}; !slices.Equal(walked, want) {
		t.Errorf("walk = %v, want %v", walked, want)
	}

	for name, p := range map[string]deadletter.AuditParams{
		"bad action":       {Action: "delete"},
		"bad cursor":       {Cursor: "x"},
		"zero cursor":      {Cursor: "0"},
		"list cursor":      {Cursor: "1763632800000000-5"},
		"negative limit":   {Limit: -1},
		"limit above most": {Limit: deadletter.MaxListLimit + 1},
		"several problems": {Action: "delete", Limit: -1},
	} {
		page, err := st.Audit(ctx, p)
		var ie *deadletter.InputError
		if !errors.As(err, &ie) || page != nil {
			t.Errorf("Audit with %s = %+v, %v; want an input error", name, page, err)
		} else if name == "several problems" && len(ie.Problems) != 2 {
			t.Errorf("problems %q, want both", ie.Problems)
		}
	}
}

// waitBlocked waits until a session is blocked by the session pid.
func waitBlocked(t *testing.T, s *pgtest.Schema, pid uint32) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if count(t, s, "pg_stat_activity", "$1 = ANY(pg_blocking_pids(pid))", int(pid)) > 0 {
			return
		}
		select {
		case <-deadline:
			t.Fatalf("no session waits for session %d", pid)
		case <-tick.C:
		}
	}
}

func TestReplayWaitsForConcurrentChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	var ids []int64
	for i := range 5 {
		id, _ := addDead(t, s, dead{At: base.Add(time.Duration(i) * time.Second)})
		ids = append(ids, id)
	}

	// Another operator discards the oldest row while the replay runs.
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var pid uint32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE outbox SET status = 'discarded' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res *deadletter.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: byFilter(deadletter.Filter{Topic: "orders"}, 2)})
		done <- result{res, err}
	}()
	waitBlocked(t, s, pid)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !slices.Equal(r.res.Changed, ids[1:]) {
		t.Errorf("Replay changed %v, want every row still dead-lettered: %v", r.res.Changed, ids[1:])
	}
	if got := statuses(t, s, ids...); !slices.Equal(got, []string{"discarded", "pending", "pending", "pending", "pending"}) {
		t.Errorf("statuses = %v, want the discarded row left discarded and the others replayed", got)
	}

	// By reference, the row the other session changed is reported as it
	// now is.
	last, _ := addDead(t, s, dead{})
	tx, err = s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE outbox SET status = 'discarded' WHERE id = $1`, last); err != nil {
		t.Fatal(err)
	}
	go func() {
		res, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: last})})
		done <- result{res, err}
	}()
	waitBlocked(t, s, pid)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r = <-done
	if r.err != nil || len(r.res.Changed) != 0 || !slices.Equal(r.res.Unchanged, []deadletter.Unchanged{{ID: last, Status: "discarded"}}) {
		t.Errorf("Replay of a row discarded meanwhile = %+v, %v", r.res, r.err)
	}
	if got := statuses(t, s, last); got[0] != "discarded" {
		t.Errorf("row discarded meanwhile is %s", got[0])
	}
}

// A rate shrinks batches to a second's worth of rows; a bad rate is
// refused before anything changes.
func TestReplayRate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	for i := range 5 {
		addDead(t, s, dead{At: base.Add(time.Duration(i) * time.Second)})
	}
	before := snapshot(t, s)
	for _, r := range []float64{-1, math.Inf(1), math.NaN()} {
		p := deadletter.ReplayParams{BulkParams: byFilter(deadletter.Filter{Topic: "orders"}, 100)}
		p.Rate = r
		if _, err := st.Replay(ctx, p); !deadletter.IsInput(err) {
			t.Errorf("rate %v: err = %v, want an input error", r, err)
		}
	}
	checkUnchanged(t, s, before)

	p := deadletter.ReplayParams{BulkParams: byFilter(deadletter.Filter{Topic: "orders"}, 100)}
	p.Rate = 3 // batches of 3: the first at once, the second a second later
	res, err := st.Replay(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changed) != 5 || len(auditRecords(t, s)) != 2 {
		t.Fatalf("replay at 3 rows/s: %+v, %d audit records; want 5 rows in 2 batches", res, len(auditRecords(t, s)))
	}
}

// A row named by id is only ever the row with that id, even when another
// row carries the zero event id.
func TestRefsMatchOnlyTheirColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	zero, _ := addDead(t, s, dead{Topic: "orders"})
	s.Exec(t, `UPDATE outbox SET event_id = '00000000-0000-0000-0000-000000000000' WHERE id = $1`, zero)
	target, _ := addDead(t, s, dead{Topic: "orders"})

	d, err := st.Get(ctx, deadletter.Ref{ID: target})
	if err != nil || d.ID != target {
		t.Fatalf("Get(%d) = %+v, %v", target, d, err)
	}
	if _, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: target}, Topic: "orders.fixed", Actor: actor}); err != nil {
		t.Fatal(err)
	}
	if r := rowState(t, s, zero); r.Topic != "orders" || r.Status != "dead_lettered" {
		t.Fatalf("the row with the zero event id was edited: %+v", r)
	}
	if r := rowState(t, s, target); r.Topic != "orders.fixed" {
		t.Fatalf("the named row was not edited: %+v", r)
	}
}

// Replaying a row that was replayed, delivered and deleted since reports
// it gone rather than failing; an id that never existed still fails.
func TestReplayRowGoneSince(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	a, _ := addDead(t, s, dead{Topic: "orders"})
	b, _ := addDead(t, s, dead{Topic: "orders"})
	if _, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: a})}); err != nil {
		t.Fatal(err)
	}
	s.Exec(t, `DELETE FROM outbox WHERE id = $1`, a) // delivered

	res, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: a}, deadletter.Ref{ID: b})})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Changed, []int64{b}) || len(res.Unchanged) != 1 || res.Unchanged[0] != (deadletter.Unchanged{ID: a, Status: deadletter.StatusGone}) {
		t.Fatalf("replay of a gone row and a dead letter = %+v", res)
	}
	before := snapshot(t, s)
	_, err = st.Replay(ctx, deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: a}, deadletter.Ref{ID: b + 100})})
	if !errors.Is(err, deadletter.ErrNotFound) || !strings.Contains(err.Error(), fmt.Sprint(b+100)) || strings.Contains(err.Error(), fmt.Sprint(a)+",") {
		t.Fatalf("replay of an id that never existed: %v", err)
	}
	checkUnchanged(t, s, before)
}

// A result lists a bounded number of ids but counts every row.
func TestResultListsBoundedIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	n := deadletter.MaxReportedIDs + 5
	s.Exec(t, `INSERT INTO outbox (topic, payload, status, dead_letter_reason, dead_lettered_at)
		SELECT 'orders', 'x', 'dead_lettered', 'permanent', now() - interval '1 hour' FROM generate_series(1, $1)`, n)
	p := deadletter.ReplayParams{BulkParams: deadletter.BulkParams{Selection: deadletter.Selection{All: true}, DryRun: true, BatchSize: 5000, Actor: actor}}
	res, err := st.Replay(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Count != n || len(res.Changed) != deadletter.MaxReportedIDs || !res.Truncated {
		t.Fatalf("dry run over %d rows: count %d, %d ids, truncated %v", n, res.Count, len(res.Changed), res.Truncated)
	}
}

// A claim passes over the rows other transactions have locked and, if it
// comes back short, the relay takes them for read: its floor rises past
// them, and below it only rows that waited are found again. So an
// operator's action never locks a pending row that never waited: it
// neither waits for the claim holding one nor hides one from the claims.
// Releasing a key, which must wait for the claims that hold its rows,
// puts the key's rows that never waited on the waiting rows' index
// instead, where claims find them wherever the floor is.
func TestActionsLeaveRowsThatNeverWaitedToTheClaims(t *testing.T) {
	t.Parallel()
	// Bounded: an action that waits for the claim's lock fails at its end.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	fresh := addPending(t, s, "F", 0, "", "")

	claim, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Rollback(context.Background()) //nolint:errcheck // a no-op after Rollback
	if _, err := claim.Exec(ctx, `SELECT id FROM outbox WHERE id = $1 FOR UPDATE`, fresh); err != nil {
		t.Fatal(err)
	}
	p := deadletter.ReplayParams{BulkParams: byRefs(deadletter.Ref{ID: fresh})}
	p.Reason = "not a dead letter"
	res, err := st.Replay(ctx, p)
	if err != nil || len(res.Changed) != 0 || len(res.Unchanged) != 1 || res.Unchanged[0].Status != "pending" {
		t.Errorf("Replay of a pending row a claim holds = %+v, %v; want it unchanged, pending", res, err)
	}
	dp := byRefs(deadletter.Ref{ID: fresh})
	dp.Reason = "not a dead letter"
	if res, err := st.Discard(ctx, dp); err != nil || len(res.Changed) != 0 || len(res.Unchanged) != 1 {
		t.Errorf("Discard of a pending row a claim holds = %+v, %v; want it unchanged", res, err)
	}
	if res, err := st.Edit(ctx, deadletter.EditParams{Ref: deadletter.Ref{ID: fresh}, Topic: "x", Actor: actor}); !errors.Is(err, deadletter.ErrNotDeadLettered) {
		t.Errorf("Edit of a pending row a claim holds = %+v, %v; want ErrNotDeadLettered", res, err)
	}
	if err := claim.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	k := addParked(t, s, "K", base)
	behind := addPending(t, s, "K", 0, "", "") // written since the key was parked, not claimed yet
	if _, err := st.Release(ctx, deadletter.ReleaseParams{Key: "K", Actor: actor, Reason: "consumer fixed"}); err != nil {
		t.Fatal(err)
	}
	checkReleased(t, s, k)
	var ready, waited bool
	query(t, s, `SELECT next_attempt_at <= now(), next_attempt_at <> created_at FROM outbox WHERE id = $1`, []any{behind}, &ready, &waited)
	if !ready || !waited {
		t.Errorf("row %d of the released key: ready %v, on the waiting rows' index %v; want both", behind, ready, waited)
	}
}
