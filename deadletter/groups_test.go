package deadletter_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// The fingerprint masks what varies from row to row, and nothing else.
func TestErrorFingerprint(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	for _, c := range []struct{ err, want string }{
		{"HTTP 503 Service Unavailable", "HTTP <n> Service Unavailable"},
		{"dial tcp 10.0.3.7:9092: connect: connection refused", "dial tcp <n>:<n>: connect: connection refused"},
		{"order 7f3c2a91-0b6e-4c1d-9a8f-2e5d6c7b8a90 not found", "order <id> not found"},
		{"trace 4bf92f3577b34da6a3ce929d0e0e4736 failed", "trace <id> failed"},
		{"pointer 0x7ffd3a2b9c10", "pointer <id>"},
		{`field "amount" must be positive, got '-3' in ` + "`orders`", "field <q> must be positive, got <q> in <q>"},
		{"timeout after 1.5s (attempt 3 of 10, waited 250ms)", "timeout after <n> (attempt <n> of <n>, waited <n>)"},
		{"message size 1048577", "message size <n>"},
		{"message size 10485770", "message size <n>"},
		{"POST /orders/12345/items: 422", "POST /orders/<n>/items: <n>"},
		{"utf8 over http2 in v1.2 to deadbeef", "utf8 over http2 in v1.2 to deadbeef"},
		{"  spread\n\tover   lines  ", "spread over lines"},
		// Receivers' JSON answers, quoted into the error Go-style: the
		// values are masked, the keys and the shape kept.
		{`POST http://billing:8080/orders: 500 Internal Server Error: "{\"error\":\"poison pill 42\"}\n"`,
			`POST http://billing:<n>/orders: <n> Internal Server Error: "{\"error\":<q>}\n"`},
		{`HTTP 422: "{\"errors\":[{\"field\":\"amount\",\"message\":\"must be \\\"positive\\\"\"}],\"order\":\"7f3c2a91-0b6e-4c1d-9a8f-2e5d6c7b8a90\",\"retry\":false,\"count\":3}"`,
			`HTTP <n>: "{\"errors\":[{\"field\":<q>,\"message\":<q>}],\"order\":<q>,\"retry\":false,\"count\":<n>}"`},
		{`HTTP 409: "{\"detail\":{\"id\":12345,\"state\":\"shipped\"}}"`,
			`HTTP <n>: "{\"detail\":{\"id\":<n>,\"state\":<q>}}"`},
	} {
		var got string
		query(t, s, `SELECT outbox_error_fingerprint($1)`, []any{c.err}, &got)
		if got != c.want {
			t.Errorf("fingerprint of %q = %q, want %q", c.err, got, c.want)
		}
	}
	var long string
	query(t, s, `SELECT outbox_error_fingerprint(repeat('x', 3000))`, nil, &long)
	if len(long) != 500 {
		t.Errorf("fingerprint of 3000 bytes is %d long, want 500", len(long))
	}
}

// Dead letters are grouped by destination, reason and fingerprint, the
// largest group first; rows of a relay that wrote no fingerprint join
// their group; discarded rows are left out.
func TestFailureGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	busy := func(n, id int, q string, legacy bool) int64 {
		row, _ := addDead(t, s, dead{Dest: "billing", Reason: sink.ReasonRetriesExhausted, At: base.Add(time.Duration(n) * time.Minute),
			LastError: "HTTP 503 from http://billing:8080/orders/" + strconv.Itoa(id) + ": \"" + q + "\"", Legacy: legacy})
		return row
	}
	busy(1, 1001, "upstream busy", false)
	busy(2, 1002, "queue full", false)
	busy(3, 1003, "try later", true)
	latest := busy(4, 1004, "upstream busy", false)
	addDead(t, s, dead{Dest: "billing", Reason: sink.ReasonRetriesExhausted, Status: deadletter.StatusDiscarded,
		LastError: "HTTP 503 from http://billing:8080/orders/9: \"gone\""})
	bad1, _ := addDead(t, s, dead{Dest: "billing", LastError: "HTTP 400: field 'amount' of 7f3c2a91-0b6e-4c1d-9a8f-2e5d6c7b8a90"})
	bad2, _ := addDead(t, s, dead{Dest: "billing", LastError: "HTTP 400: field 'currency' of 0c1d2e3f-0b6e-4c1d-9a8f-2e5d6c7b8a90", At: base.Add(time.Hour)})
	addDead(t, s, dead{Dest: "events", LastError: "HTTP 400: field 'amount' of 7f3c2a91-0b6e-4c1d-9a8f-2e5d6c7b8a90"})

	page, err := st.Groups(ctx, deadletter.GroupParams{})
	if err != nil {
		t.Fatal(err)
	}
	type g struct {
		dest, reason, fp string
		n                int
	}
	var got []g
	for _, x := range page.Groups {
		got = append(got, g{x.Destination, x.Reason, x.Fingerprint, x.Count})
	}
	want := []g{
		{"billing", "retries_exhausted", "HTTP <n> from http://billing:<n>/orders/<n>: <q>", 4},
		{"billing", "permanent", "HTTP <n>: field <q> of <id>", 2},
		{"events", "permanent", "HTTP <n>: field <q> of <id>", 1},
	}
	if !slices.Equal(got, want) || page.Total != 3 {
		t.Fatalf("groups = %+v (total %d), want %+v", got, page.Total, want)
	}
	first := page.Groups[0]
	if !first.FirstSeen.Equal(base.Add(time.Minute)) || !first.LastSeen.Equal(base.Add(4*time.Minute)) ||
		first.Example != `HTTP 503 from http://billing:8080/orders/1004: "upstream busy"` || len(first.ID) != 12 {
		t.Errorf("first group = %+v, want seen from +1m to +4m, the example of row %d", first, latest)
	}
	if page.Groups[1].ID == page.Groups[2].ID {
		t.Errorf("groups of two destinations share id %s", page.Groups[1].ID)
	}

	// A limit lists fewer, and says how many there are; a filter groups
	// only the rows it matches.
	if p, err := st.Groups(ctx, deadletter.GroupParams{Limit: 1}); err != nil || len(p.Groups) != 1 || p.Total != 3 {
		t.Errorf("limit 1: %+v, %v; want one group of 3", p, err)
	}
	if p, err := st.Groups(ctx, deadletter.GroupParams{Filter: deadletter.Filter{Destination: "events"}}); err != nil ||
		len(p.Groups) != 1 || p.Groups[0].ID != page.Groups[2].ID {
		t.Errorf("destination events: %+v, %v; want its one group, with the same id", p, err)
	}

	// A group's id selects its rows: to list, and to replay.
	list, err := st.List(ctx, deadletter.ListParams{Filter: deadletter.Filter{Group: page.Groups[1].ID}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, l := range list.Letters {
		ids = append(ids, l.ID)
	}
	if !slices.Equal(sorted(ids), []int64{bad1, bad2}) {
		t.Errorf("rows of group %s = %v, want %v", page.Groups[1].ID, ids, []int64{bad1, bad2})
	}
	sel := deadletter.Selection{Filter: deadletter.Filter{Group: first.ID}}
	dry, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: deadletter.BulkParams{Selection: sel, DryRun: true, Actor: actor}})
	if err != nil || dry.Count != 4 {
		t.Fatalf("dry run = %+v, %v; want 4 rows, the legacy one among them", dry, err)
	}
	if n := count(t, s, "outbox", "status = 'pending'"); n != 0 {
		t.Fatalf("a dry run made %d rows pending", n)
	}
	res, err := st.Replay(ctx, deadletter.ReplayParams{BulkParams: deadletter.BulkParams{Selection: sel, Actor: actor}})
	if err != nil || res.Count != 4 {
		t.Fatalf("replay = %+v, %v; want 4 rows", res, err)
	}
	if n := count(t, s, "outbox", "status = 'pending' AND destination = 'billing' AND error_group IS NULL"); n != 4 {
		t.Errorf("%d rows pending after the replay, out of their group, want 4", n)
	}
	if p, err := st.Groups(ctx, deadletter.GroupParams{}); err != nil || p.Total != 2 {
		t.Errorf("after the replay: %+v, %v; want 2 groups left", p, err)
	}
}

func TestFailureGroupsRejectBadInput(t *testing.T) {
	t.Parallel()
	st := newStore(t, pgtest.NewSchema(t))
	for _, p := range []deadletter.GroupParams{
		{Filter: deadletter.Filter{Group: "not-a-group"}},
		{Filter: deadletter.Filter{Group: "3F9C2A1B7D4E"}},
		{Filter: deadletter.Filter{Reason: "bogus"}},
		{Limit: deadletter.MaxListLimit + 1},
	} {
		_, err := st.Groups(context.Background(), p)
		var ie *deadletter.InputError
		if !errors.As(err, &ie) {
			t.Errorf("%+v: %v, want an input error", p, err)
		}
	}
}

// The relay's write-back fingerprints what it dead-letters, and only that.
func TestWriteBackFingerprintsDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	ob, err := store.New(s.Pool, store.Config{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'p' FROM generate_series(1, 3) g`)
	c, err := ob.Claim(ctx, store.ClaimParams{Limit: 3, PayloadCap: 100})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, []store.Outcome{
		{ID: 1, Kind: store.DeadLettered, Reason: sink.ReasonPermanent, Error: "HTTP 400 for order 17", Destination: "hook", Attempted: true},
		{ID: 2, Kind: store.DeadLettered, Reason: sink.ReasonPermanent, Error: "HTTP 400 for order 18", Destination: "hook", Attempted: true},
		{ID: 3, Kind: store.Retried, Delay: time.Minute, Error: "HTTP 503 for order 19", Destination: "hook", Attempted: true},
	}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, s, "outbox", "error_group = outbox_error_group('hook', 'permanent', 'HTTP 400 for order 1')"); n != 2 {
		t.Errorf("%d rows fingerprinted, want the 2 dead letters", n)
	}
	page, err := newStore(t, s).Groups(ctx, deadletter.GroupParams{})
	if err != nil || len(page.Groups) != 1 || page.Groups[0].Count != 2 || page.Groups[0].Destination != "hook" {
		t.Errorf("groups = %+v, %v; want one of 2 rows at hook", page, err)
	}
}
