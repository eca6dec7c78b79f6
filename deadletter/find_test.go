package deadletter_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
)

func find(t *testing.T, st *deadletter.Store, p deadletter.FindParams) *deadletter.Found {
	t.Helper()
	f, err := st.Find(context.Background(), p)
	if err != nil {
		t.Fatalf("find %+v: %v", p, err)
	}
	return f
}

func holds(r deadletter.FoundRow) []string {
	var out []string
	for _, h := range r.Holds {
		out = append(out, h.Kind)
	}
	return out
}

// A message is found by event id, row id or key wherever it is, with what
// holds it: the row of its key ahead, a parked key, its backoff, a lease.
func TestFindSaysWhereAMessageIsAndWhatHoldsIt(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	// Key k: a dead letter that parks it, then two pending rows; key b:
	// a row in backoff after two attempts, and one behind it.
	parker, _ := addDead(t, s, dead{Key: "k", Parked: true, LastError: "HTTP 422 from hooks"})
	behind := addPending(t, s, "k", 0, "", "")
	behind2 := addPending(t, s, "k", 0, "", "")
	backoff := addPending(t, s, "b", time.Hour, "HTTP 503 from hooks", `[{"at":"2026-11-20T10:00:00Z","attempt":1,"class":"transient","error":"HTTP 503 from hooks"},{"at":"2026-11-20T10:00:05Z","attempt":2,"class":"transient","error":"HTTP 503 from hooks"}]`)
	s.Exec(t, `UPDATE outbox SET retry_count = 2 WHERE id = $1`, backoff)
	afterBackoff := addPending(t, s, "b", 0, "", "")
	leased := addPending(t, s, "c", 0, "", "")
	s.Exec(t, `UPDATE outbox SET lease_token = gen_random_uuid() WHERE id = $1`, leased)
	var sent int64
	var sentEvent uuid.UUID
	query(t, s, `INSERT INTO outbox (topic, key, payload, status, sent_at) VALUES ('orders', 'k', '{}', 'sent', now()) RETURNING id, event_id`, nil, &sent, &sentEvent)
	discarded, _ := addDead(t, s, dead{Key: "k", Status: deadletter.StatusDiscarded})

	var behindEvent uuid.UUID
	query(t, s, `SELECT event_id FROM outbox WHERE id = $1`, []any{behind}, &behindEvent)
	f := find(t, st, deadletter.FindParams{Query: behindEvent.String()})
	if f.Kind != deadletter.FindEvent || len(f.Rows) != 1 || f.Rows[0].ID != behind || f.Rows[0].State != "pending" {
		t.Fatalf("by event id: %+v", f)
	}
	if h := f.Rows[0].Holds; len(h) != 1 || h[0].Kind != deadletter.HoldParkedKey || h[0].Row != parker {
		t.Errorf("row %d's holds: %+v, want the parked row %d", behind, h, parker)
	}
	if do := strings.Join(f.Rows[0].Do, "; "); !strings.Contains(do, "row "+strconv.FormatInt(parker, 10)) {
		t.Errorf("what to do: %q, want the parking row named", do)
	}

	f = find(t, st, deadletter.FindParams{Query: strconv.FormatInt(backoff, 10)})
	r := f.Rows[0]
	if f.Kind != deadletter.FindRow || len(r.Holds) != 1 || r.Holds[0].Kind != deadletter.HoldBackoff || r.Holds[0].Until == nil ||
		!strings.Contains(r.Holds[0].Detail, "attempt 2 failed: HTTP 503 from hooks") || len(r.ErrorHistory) != 2 {
		t.Errorf("a row in backoff: %+v", r)
	}
	if r := find(t, st, deadletter.FindParams{Query: strconv.FormatInt(afterBackoff, 10)}).Rows[0]; len(r.Holds) != 1 || r.Holds[0].Kind != deadletter.HoldKeyAhead || r.Holds[0].Row != backoff {
		t.Errorf("the row behind it: %+v", r.Holds)
	}
	if r := find(t, st, deadletter.FindParams{Query: strconv.FormatInt(leased, 10)}).Rows[0]; r.State != "leased" || len(r.Holds) != 1 || r.Holds[0].Kind != deadletter.HoldLeased {
		t.Errorf("a leased row: %s %+v", r.State, r.Holds)
	}
	if r := find(t, st, deadletter.FindParams{Query: sentEvent.String()}).Rows[0]; r.State != "sent" || r.SentAt == nil || len(r.Holds) != 0 {
		t.Errorf("a row kept as sent: %+v", r)
	}
	if r := find(t, st, deadletter.FindParams{Query: strconv.FormatInt(parker, 10)}).Rows[0]; r.State != "dead_lettered" || !r.ParksKey ||
		!strings.Contains(r.Where, "parks its key") || len(r.Audit) != 0 {
		t.Errorf("the parking row: %+v", r)
	}

	// A key's rows in order: the parking row heads them and holds the
	// pending ones; the discarded row is shown; the sent one is not.
	f = find(t, st, deadletter.FindParams{Query: "k"})
	var ids []int64
	for _, r := range f.Rows {
		ids = append(ids, r.ID)
	}
	if f.Kind != deadletter.FindKey || len(ids) != 4 || ids[0] != parker || ids[1] != behind || ids[2] != behind2 || ids[3] != discarded {
		t.Fatalf("key k's rows: %v, want %d, %d, %d, %d", ids, parker, behind, behind2, discarded)
	}
	if h := holds(f.Rows[2]); len(h) != 1 || h[0] != deadletter.HoldParkedKey {
		t.Errorf("the key's third row: holds %v", h)
	}
	if f := find(t, st, deadletter.FindParams{Query: "k", Limit: 2}); len(f.Rows) != 2 || !f.More {
		t.Errorf("a key's rows beyond the limit: %d rows, more %v", len(f.Rows), f.More)
	}
	// A key that looks like a row id is found as a key when no row has
	// that id.
	addPending(t, s, "4242424242", 0, "", "")
	if f := find(t, st, deadletter.FindParams{Query: "4242424242"}); f.Kind != deadletter.FindKey || len(f.Rows) != 1 {
		t.Errorf("a numeric key: %+v", f)
	}
}

// A reference that matches nothing says what that means: under
// delete-on-send, delivered or never written.
func TestFindAbsentMessage(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	ev := uuid.New()
	f := find(t, st, deadletter.FindParams{Query: ev.String()})
	if len(f.Rows) != 0 || !strings.Contains(f.Absent, "delivered, or never written") {
		t.Errorf("an absent event under delete-on-send: %+v", f)
	}
	kept, err := deadletter.NewStore(s.Pool, deadletter.Config{Schema: s.Name, SentRetention: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f = find(t, kept, deadletter.FindParams{Query: ev.String(), Kind: deadletter.FindEvent})
	if !strings.Contains(f.Absent, "keeps delivered rows for 24h0m0s") {
		t.Errorf("an absent event with delivered rows kept: %q", f.Absent)
	}
	if f := find(t, st, deadletter.FindParams{Query: "no-such-key"}); f.Kind != deadletter.FindKey || !strings.Contains(f.Absent, `key "no-such-key"`) {
		t.Errorf("an absent key: %+v", f)
	}
	// A row replayed, then delivered and deleted: its id is in the audit
	// trail.
	id, _ := addDead(t, s, dead{Key: "gone"})
	if _, err := st.Replay(context.Background(), deadletter.ReplayParams{BulkParams: deadletter.BulkParams{Selection: deadletter.Selection{Refs: []deadletter.Ref{{ID: id}}}, Actor: actor, Reason: "fixed"}}); err != nil {
		t.Fatal(err)
	}
	s.Exec(t, `DELETE FROM outbox WHERE id = $1`, id)
	f = find(t, st, deadletter.FindParams{Query: strconv.FormatInt(id, 10), Kind: deadletter.FindRow})
	if len(f.Rows) != 0 || len(f.Audit) != 1 || f.Audit[0].Action != "replay" || !strings.Contains(f.Absent, "audit trail names it") {
		t.Errorf("a deleted row that was replayed: %+v", f)
	}
}

// Bad searches are input errors that say what is wrong; hostile text is
// only ever a key, never SQL.
func TestFindRefusesBadInput(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	for _, c := range []struct {
		p    deadletter.FindParams
		want string
	}{
		{deadletter.FindParams{Query: "  "}, "the search is empty"},
		{deadletter.FindParams{Query: strings.Repeat("x", deadletter.MaxQueryBytes+1)}, "at most 4096"},
		{deadletter.FindParams{Query: "a\x00b"}, "not valid text"},
		{deadletter.FindParams{Query: "\xff\xfe"}, "not valid text"},
		{deadletter.FindParams{Query: "12", Kind: deadletter.FindEvent}, `"12" is not an event id`},
		{deadletter.FindParams{Query: "-3", Kind: deadletter.FindRow}, `"-3" is not a row id`},
		{deadletter.FindParams{Query: "99999999999999999999", Kind: deadletter.FindRow}, "is not a row id"},
		{deadletter.FindParams{Query: "k", Kind: "sql"}, `kind "sql" is not one of`},
		{deadletter.FindParams{Query: "k", Limit: 5000}, "limit is 5000"},
	} {
		_, err := st.Find(context.Background(), c.p)
		var ie *deadletter.InputError
		if !errors.As(err, &ie) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.40q (kind %q): %v, want an input error saying %q", c.p.Query, c.p.Kind, err, c.want)
		}
	}
	addPending(t, s, "k", 0, "", "")
	for _, q := range []string{`k' OR '1'='1`, `'; DROP TABLE outbox; --`, `%`, `_`, `*`} {
		if f := find(t, st, deadletter.FindParams{Query: q}); len(f.Rows) != 0 || f.Kind != deadletter.FindKey {
			t.Errorf("%q found %d rows", q, len(f.Rows))
		}
	}
	if n := count(t, s, "outbox", "true"); n != 1 {
		t.Errorf("the outbox holds %d rows, want 1", n)
	}
}

func TestFindHoldsFollowTheOrderScope(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	perDestination := func(topic string) string {
		switch topic {
		case "orders":
			return "hooks"
		case "audit":
			return "kafka"
		}
		return "*"
	}
	st, err := deadletter.NewStore(s.Pool, deadletter.Config{Schema: s.Name, OrderScope: perDestination})
	if err != nil {
		t.Fatal(err)
	}
	global := newStore(t, s)
	ahead := addPending(t, s, "k", time.Hour, "HTTP 503", "")
	var auditRow int64
	query(t, s, `INSERT INTO outbox (topic, key, payload) VALUES ('audit', 'k', '{}') RETURNING id`, nil, &auditRow)
	ordersRow := addPending(t, s, "k", 0, "", "")
	ref := strconv.FormatInt(auditRow, 10)
	if r := find(t, st, deadletter.FindParams{Query: ref}).Rows[0]; len(r.Holds) != 0 {
		t.Errorf("a row bound for another destination than the row ahead: holds %v", holds(r))
	}
	if r := find(t, global, deadletter.FindParams{Query: ref}).Rows[0]; len(r.Holds) != 1 || r.Holds[0].Row != ahead {
		t.Errorf("with global order: holds %+v, want row %d", r.Holds, ahead)
	}
	if r := find(t, st, deadletter.FindParams{Query: strconv.FormatInt(ordersRow, 10)}).Rows[0]; len(r.Holds) != 1 || r.Holds[0].Row != ahead {
		t.Errorf("a row of the same destination: holds %+v, want row %d", r.Holds, ahead)
	}
	key := find(t, st, deadletter.FindParams{Query: "k", Kind: deadletter.FindKey})
	if len(key.Rows) != 3 || len(key.Rows[1].Holds) != 0 || len(key.Rows[2].Holds) != 1 || key.Rows[2].Holds[0].Row != ahead {
		t.Errorf("the key's rows: %+v", key.Rows)
	}
	// A parked row without a route holds the key in every scope.
	parked, _ := addDead(t, s, dead{Key: "p", Topic: "unrouted", Parked: true})
	waiting := addPending(t, s, "p", 0, "", "")
	if r := find(t, st, deadletter.FindParams{Query: strconv.FormatInt(waiting, 10)}).Rows[0]; len(r.Holds) != 1 || r.Holds[0].Row != parked {
		t.Errorf("behind an unrouted parked row: holds %+v", r.Holds)
	}
}

// A key's page keeps its pending rows when its dead letters are many.
func TestFindKeyKeepsPendingRows(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	for range 5 {
		addDead(t, s, dead{Key: "many", Status: deadletter.StatusDiscarded})
	}
	p1 := addPending(t, s, "many", 0, "", "")
	p2 := addPending(t, s, "many", 0, "", "")
	f := find(t, st, deadletter.FindParams{Query: "many", Limit: 3})
	if len(f.Rows) != 3 || !f.More || f.Rows[1].ID != p1 || f.Rows[2].ID != p2 || f.Rows[0].State != "discarded" {
		t.Errorf("a key with 5 discarded and 2 pending rows, limit 3: %+v (more %v)", f.Rows, f.More)
	}
}
