package deadletter_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

func TestNewStoreSchema(t *testing.T) {
	t.Parallel()
	if _, err := deadletter.NewStore(nil, deadletter.Config{Schema: `bad"schema`}); err == nil {
		t.Error(`NewStore with schema bad"schema succeeded`)
	}
	if _, err := deadletter.NewStore(nil, deadletter.Config{}); err != nil {
		t.Errorf("NewStore with the default schema: %v", err)
	}
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	now := dbNow(t, s)
	hoursAgo := func(h float64) time.Time { return now.Add(-time.Duration(h * float64(time.Hour))) }

	id := map[string]int64{}
	for _, r := range []struct {
		name string
		d    dead
	}{
		{"created", dead{Topic: "orders.created", Dest: "kafka", Key: "k1", At: hoursAgo(1), LastError: "HTTP 400 Bad Request"}},
		{"updated", dead{Topic: "orders.updated", Dest: "webhook", Key: "k2", At: hoursAgo(2), Reason: sink.ReasonRetriesExhausted, LastError: "dial tcp: connection refused"}},
		{"underscore", dead{Topic: "orders_x", Dest: "kafka", At: hoursAgo(3), Reason: sink.ReasonTooLarge, LastError: "payload of 2_000_000 bytes"}},
		{"letter", dead{Topic: "ordersAx", At: hoursAgo(4), Reason: sink.ReasonNoRoute, LastError: "no route for topic"}},
		{"percent", dead{Topic: "100%", At: hoursAgo(5), Reason: sink.ReasonInvalidMessage, LastError: "headers are not a JSON object"}},
		{"digits", dead{Topic: "1000", At: hoursAgo(6), Reason: sink.ReasonMaxAgeExceeded, LastError: "older than 24h"}},
		{"backslash", dead{Topic: `a\b`, At: hoursAgo(7), LastError: "HTTP 404"}},
		{"discarded", dead{Topic: "orders.created", Dest: "kafka", Key: "k1", At: hoursAgo(1.5), Status: deadletter.StatusDiscarded, LastError: "HTTP 400"}},
	} {
		id[r.name], _ = addDead(t, s, r.d)
	}
	// Rows that are not dead letters never show.
	addPending(t, s, "k1", 0, "HTTP 400", "")
	s.Exec(t, `INSERT INTO outbox (topic, key, payload, status, sent_at) VALUES ('orders.created', 'k1', '{}', 'sent', now())`)

	ago := func(h float64) deadletter.TimeBound {
		return deadletter.TimeBound{Ago: time.Duration(h * float64(time.Hour))}
	}
	abs := func(h float64) deadletter.TimeBound { return deadletter.TimeBound{At: hoursAgo(h)} }
	for _, c := range []struct {
		name   string
		status string
		f      deadletter.Filter
		want   []string // newest first
	}{
		{"all dead-lettered", "", deadletter.Filter{}, []string{"created", "updated", "underscore", "letter", "percent", "digits", "backslash"}},
		{"status dead_lettered", deadletter.StatusDeadLettered, deadletter.Filter{Topic: "orders.created"}, []string{"created"}},
		{"status discarded", deadletter.StatusDiscarded, deadletter.Filter{}, []string{"discarded"}},
		{"status all", "all", deadletter.Filter{Key: "k1"}, []string{"created", "discarded"}},
		{"topic exact", "", deadletter.Filter{Topic: "orders.updated"}, []string{"updated"}},
		{"topic exact is not a pattern", "", deadletter.Filter{Topic: "orders"}, nil},
		{"topic underscore is literal", "", deadletter.Filter{Topic: "orders_x"}, []string{"underscore"}},
		{"topic percent is literal", "", deadletter.Filter{Topic: "100%"}, []string{"percent"}},
		{"glob star", "", deadletter.Filter{Topic: "orders.*"}, []string{"created", "updated"}},
		{"glob star matches empty", "", deadletter.Filter{Topic: "orders.created*"}, []string{"created"}},
		{"glob prefix", "", deadletter.Filter{Topic: "orders*"}, []string{"created", "updated", "underscore", "letter"}},
		{"glob question mark", "", deadletter.Filter{Topic: "orders?x"}, []string{"underscore", "letter"}},
		{"glob underscore is literal", "", deadletter.Filter{Topic: "orders_*"}, []string{"underscore"}},
		{"glob percent is literal", "", deadletter.Filter{Topic: "100%*"}, []string{"percent"}},
		{"glob question mark is one character", "", deadletter.Filter{Topic: "10?"}, nil},
		{"glob backslash is literal", "", deadletter.Filter{Topic: `a\*`}, []string{"backslash"}},
		{"destination", "", deadletter.Filter{Destination: "kafka"}, []string{"created", "underscore"}},
		{"reason", "", deadletter.Filter{Reason: sink.ReasonTooLarge}, []string{"underscore"}},
		{"reason all statuses", "all", deadletter.Filter{Reason: sink.ReasonPermanent}, []string{"created", "discarded", "backslash"}},
		{"key", "", deadletter.Filter{Key: "k2"}, []string{"updated"}},
		{"since ago", "", deadletter.Filter{Since: ago(2.5)}, []string{"created", "updated"}},
		{"until ago", "", deadletter.Filter{Until: ago(5.5)}, []string{"digits", "backslash"}},
		{"since and until ago", "", deadletter.Filter{Since: ago(4.5), Until: ago(1.5)}, []string{"updated", "underscore", "letter"}},
		{"since is inclusive", "", deadletter.Filter{Since: abs(3)}, []string{"created", "updated", "underscore"}},
		{"until is exclusive", "", deadletter.Filter{Until: abs(3)}, []string{"letter", "percent", "digits", "backslash"}},
		{"since and until absolute", "", deadletter.Filter{Since: abs(6), Until: abs(4)}, []string{"percent", "digits"}},
		{"error contains ignores case", "", deadletter.Filter{ErrorContains: "http 4"}, []string{"created", "backslash"}},
		{"error contains underscore is literal", "", deadletter.Filter{ErrorContains: "2_000"}, []string{"underscore"}},
		{"error contains percent is literal", "", deadletter.Filter{ErrorContains: "%"}, nil},
		{"every field", "", deadletter.Filter{Topic: "orders.*", Destination: "kafka", Reason: sink.ReasonPermanent,
			Key: "k1", Since: ago(2), Until: ago(0.5), ErrorContains: "bad request"}, []string{"created"}},
		{"every field but one", "", deadletter.Filter{Topic: "orders.*", Destination: "kafka", Reason: sink.ReasonPermanent,
			Key: "k1", Since: ago(2), Until: ago(0.5), ErrorContains: "refused"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			page, err := st.List(ctx, deadletter.ListParams{Filter: c.f, Status: c.status})
			if err != nil {
				t.Fatal(err)
			}
			want := []int64{}
			for _, n := range c.want {
				want = append(want, id[n])
			}
			if got := idsOf(page.Letters); !slices.Equal(got, want) {
				t.Errorf("List(%+v) = %v, want %v %v", c.f, got, c.want, want)
			}
			if page.Next != "" {
				t.Errorf("one page holds every row, yet next cursor is %q", page.Next)
			}
		})
	}
}

func TestListLetterFields(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	at := base.Add(time.Minute)
	keyed, ev := addDead(t, s, dead{Topic: "orders", Key: "k", Dest: "webhook", At: at, Reason: sink.ReasonRetriesExhausted,
		LastError: "HTTP 503", Retries: 7, Parked: true, Payload: []byte("12345"), Headers: `{"trace": "abc"}`})
	plain, _ := addDead(t, s, dead{Topic: "t", Reason: sink.ReasonNoRoute, At: base})

	page, err := st.List(ctx, deadletter.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	if got := idsOf(page.Letters); !slices.Equal(got, []int64{keyed, plain}) {
		t.Fatalf("List = %v, want %v", got, []int64{keyed, plain})
	}
	l := page.Letters[0]
	if l.EventID != ev || l.Topic != "orders" || l.Key == nil || *l.Key != "k" || l.Destination != "webhook" ||
		l.Status != deadletter.StatusDeadLettered || l.Reason != sink.ReasonRetriesExhausted || !l.ParksKey ||
		l.Attempts != 7 || l.LastError != "HTTP 503" || l.PayloadBytes != 5 ||
		l.DeadLetteredAt == nil || !l.DeadLetteredAt.Equal(at) || l.LastAttemptAt == nil || l.CreatedAt.IsZero() {
		t.Errorf("letter = %+v", l)
	}
	var headers map[string]string
	if err := json.Unmarshal(l.Headers, &headers); err != nil || headers["trace"] != "abc" {
		t.Errorf("headers = %s, %v", l.Headers, err)
	}
	if p := page.Letters[1]; p.Key != nil || p.Destination != "" || p.ParksKey {
		t.Errorf("row without key or destination = %+v", p)
	}
}

func TestListInputErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	addDead(t, s, dead{})
	for _, c := range []struct {
		name string
		p    deadletter.ListParams
	}{
		{"bad status", deadletter.ListParams{Status: "pending"}},
		{"bad reason", deadletter.ListParams{Filter: deadletter.Filter{Reason: "timeout"}}},
		{"since not before until", deadletter.ListParams{Filter: deadletter.Filter{Since: deadletter.TimeBound{At: base}, Until: deadletter.TimeBound{At: base}}}},
		{"negative limit", deadletter.ListParams{Limit: -1}},
		{"limit above the most", deadletter.ListParams{Limit: deadletter.MaxListLimit + 1}},
		{"cursor without separator", deadletter.ListParams{Cursor: "12345"}},
		{"cursor not numbers", deadletter.ListParams{Cursor: "abc-def"}},
		{"cursor bad id", deadletter.ListParams{Cursor: "1763632800000000-0"}},
		{"cursor trailing junk", deadletter.ListParams{Cursor: "1763632800000000-5-6-7"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			page, err := st.List(ctx, c.p)
			var ie *deadletter.InputError
			if !errors.As(err, &ie) || page != nil {
				t.Fatalf("List(%+v) = %v, %v; want an input error", c.p, page, err)
			}
		})
	}

	page, err := st.List(ctx, deadletter.ListParams{Limit: deadletter.MaxListLimit})
	if err != nil || len(page.Letters) != 1 {
		t.Errorf("List with the largest limit = %v, %v", page, err)
	}
}

func TestListDefaultLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	n := deadletter.DefaultListLimit + 1
	s.Exec(t, `INSERT INTO outbox (topic, payload, status, dead_letter_reason, dead_lettered_at)
SELECT 't', 'x', 'dead_lettered', 'permanent', $1::timestamptz + i * interval '1 second' FROM generate_series(1, $2) AS i`, base, n)

	page, err := st.List(ctx, deadletter.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Letters) != deadletter.DefaultListLimit || page.Next == "" {
		t.Fatalf("List without a limit = %d rows, next %q; want %d and a cursor", len(page.Letters), page.Next, deadletter.DefaultListLimit)
	}
	last, err := st.List(ctx, deadletter.ListParams{Cursor: page.Next})
	if err != nil {
		t.Fatal(err)
	}
	if len(last.Letters) != 1 || last.Next != "" || last.Letters[0].ID != 1 {
		t.Errorf("second page = %v next %q, want the oldest row alone", idsOf(last.Letters), last.Next)
	}
}

func TestListPagination(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)

	// Ten rows, some dead-lettered at the same moment, not in id order.
	offsets := []int{5, 1, 1, 3, 0, 1, 3, 6, 2, 4}
	type row struct {
		id int64
		at time.Time
	}
	var rows []row
	for _, m := range offsets {
		at := base.Add(time.Duration(m) * time.Minute)
		id, _ := addDead(t, s, dead{At: at})
		rows = append(rows, row{id, at})
	}
	addDead(t, s, dead{At: base.Add(time.Minute), Status: deadletter.StatusDiscarded})
	slices.SortFunc(rows, func(a, b row) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return int(b.id - a.id)
	})
	want := make([]int64, len(rows))
	for i, r := range rows {
		want[i] = r.id
	}
	newest := rows[0].at

	var got []int64
	var cursors []string
	cursor := ""
	for page := 0; ; page++ {
		if page > len(want) {
			t.Fatalf("the walk does not end: %v", got)
		}
		p, err := st.List(ctx, deadletter.ListParams{Limit: 3, Cursor: cursor})
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		if len(p.Letters) > 3 {
			t.Fatalf("page %d has %d rows, above the limit", page, len(p.Letters))
		}
		got = append(got, idsOf(p.Letters)...)
		if p.Next == "" {
			break
		}
		cursors = append(cursors, p.Next)
		cursor = p.Next
		// Rows dead-lettered during the walk, one of them at the same
		// moment as the newest, belong to a later walk.
		addDead(t, s, dead{At: newest})
		addDead(t, s, dead{At: newest.Add(time.Duration(page+1) * time.Second)})
	}
	if !slices.Equal(got, want) {
		t.Errorf("walk = %v, want every row once, newest first: %v", got, want)
	}
	if len(cursors) != 3 {
		t.Errorf("cursors %q, want 3 for 10 rows in pages of 3", cursors)
	}

	// A fresh walk sees the new rows first.
	p, err := st.List(ctx, deadletter.ListParams{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if p.Letters[0].DeadLetteredAt == nil || !p.Letters[0].DeadLetteredAt.Equal(newest.Add(3*time.Second)) {
		t.Errorf("a new walk starts at %v, want the newest row", p.Letters[0])
	}
}

func TestPageJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	addDead(t, s, dead{At: base})
	id, _ := addDead(t, s, dead{At: base.Add(time.Second), Key: "k"})

	page, err := st.List(ctx, deadletter.ListParams{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(page)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Letters []map[string]any `json:"dead_letters"`
		Next    *string          `json:"next_cursor"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Letters) != 1 || v.Letters[0]["id"] != float64(id) || v.Letters[0]["key"] != "k" || v.Next == nil || *v.Next != page.Next {
		t.Errorf("page JSON = %s", out)
	}
	if _, ok := v.Letters[0]["headers"].(map[string]any); !ok {
		t.Errorf("headers are not embedded as an object: %s", out)
	}

	empty, err := st.List(ctx, deadletter.ListParams{Status: deadletter.StatusDiscarded})
	if err != nil {
		t.Fatal(err)
	}
	out, err = json.Marshal(empty)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"dead_letters":[]}` {
		t.Errorf("empty page JSON = %s", out)
	}
}

func TestGet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	id, ev := addDead(t, s, dead{Topic: "orders", Key: "k", Payload: []byte(`{"order": 7}`), Headers: `{"h": "v"}`,
		LastError: "HTTP 503", Retries: 2, Dest: "webhook",
		History: `[{"at":"2026-11-20T09:00:00Z","attempt":1,"class":"transient","error":"HTTP 500"},
		           {"at":"2026-11-20T09:01:00Z","attempt":2,"class":"permanent","error":"HTTP 503"}]`})
	pending := addPending(t, s, "", 0, "", "")

	wantHistory := []deadletter.HistoryEntry{
		{At: time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC), Attempt: 1, Class: "transient", Error: "HTTP 500"},
		{At: time.Date(2026, 11, 20, 9, 1, 0, 0, time.UTC), Attempt: 2, Class: "permanent", Error: "HTTP 503"},
	}
	for _, ref := range []deadletter.Ref{{ID: id}, {EventID: ev}} {
		d, err := st.Get(ctx, ref)
		if err != nil {
			t.Fatalf("Get(%s): %v", ref, err)
		}
		if d.ID != id || d.EventID != ev || string(d.Payload) != `{"order": 7}` || d.Attempts != 2 ||
			d.Status != deadletter.StatusDeadLettered || d.LastError != "HTTP 503" || d.Destination != "webhook" {
			t.Errorf("Get(%s) = %+v", ref, d)
		}
		var h map[string]string
		if err := json.Unmarshal(d.Headers, &h); err != nil || len(h) != 1 || h["h"] != "v" {
			t.Errorf("Get(%s) headers = %s", ref, d.Headers)
		}
		if len(d.ErrorHistory) != len(wantHistory) {
			t.Fatalf("Get(%s) history = %+v", ref, d.ErrorHistory)
		}
		for i, e := range d.ErrorHistory {
			if !e.At.Equal(wantHistory[i].At) || e.Attempt != wantHistory[i].Attempt || e.Class != wantHistory[i].Class || e.Error != wantHistory[i].Error {
				t.Errorf("Get(%s) history[%d] = %+v, want %+v", ref, i, e, wantHistory[i])
			}
		}
	}

	// Get finds rows whatever their status.
	d, err := st.Get(ctx, deadletter.Ref{ID: pending})
	if err != nil || d.Status != "pending" || len(d.ErrorHistory) != 0 {
		t.Errorf("Get(pending row) = %+v, %v", d, err)
	}

	for _, ref := range []deadletter.Ref{{ID: 999}, {EventID: [16]byte{1}}} {
		d, err := st.Get(ctx, ref)
		var nf *deadletter.NotFoundError
		if !errors.Is(err, deadletter.ErrNotFound) || !errors.As(err, &nf) || d != nil {
			t.Errorf("Get(%s) = %v, %v; want not found", ref, d, err)
		} else if !strings.Contains(err.Error(), ref.String()) {
			t.Errorf("not found error %q does not name %s", err, ref)
		}
	}
}

func TestDetailJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	binary := []byte{0xff, 0x00, 0x01, 0x80}
	for _, c := range []struct {
		payload  []byte
		encoding string
		want     string // the payload field, as JSON
	}{
		{[]byte(`{"order": 7, "items": [1, 2]}`), deadletter.EncodingJSON, `{"order":7,"items":[1,2]}`},
		{[]byte("plain\ntext"), deadletter.EncodingText, `"plain\ntext"`},
		{binary, deadletter.EncodingBase64, `"` + base64.StdEncoding.EncodeToString(binary) + `"`},
		// JSON in form, but not UTF-8: embedded, its bytes would be lost.
		{[]byte("\"\xff\""), deadletter.EncodingBase64, `"` + base64.StdEncoding.EncodeToString([]byte("\"\xff\"")) + `"`},
	} {
		id, _ := addDead(t, s, dead{Payload: c.payload, Headers: `{"h": "v"}`})
		d, err := st.Get(ctx, deadletter.Ref{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatalf("marshal %s payload: %v", c.encoding, err)
		}
		var v map[string]json.RawMessage
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatal(err)
		}
		if string(v["payload_encoding"]) != `"`+c.encoding+`"` || string(v["payload"]) != c.want {
			t.Errorf("%s payload JSON: encoding %s payload %s, want %s", c.encoding, v["payload_encoding"], v["payload"], c.want)
		}
		if string(v["id"]) != fmt.Sprint(id) || string(v["headers"]) != `{"h":"v"}` || !strings.HasPrefix(string(v["error_history"]), `[{"at":`) {
			t.Errorf("detail JSON lacks the row's fields: %s", out)
		}
		if _, ok := v["Payload"]; ok {
			t.Errorf("detail JSON holds the raw payload too: %s", out)
		}
		var back []byte
		switch c.encoding {
		case deadletter.EncodingJSON:
			back = c.payload
		case deadletter.EncodingText:
			var str string
			_ = json.Unmarshal(v["payload"], &str)
			back = []byte(str)
		case deadletter.EncodingBase64:
			var str string
			_ = json.Unmarshal(v["payload"], &str)
			back, _ = base64.StdEncoding.DecodeString(str)
		}
		if string(back) != string(c.payload) {
			t.Errorf("%s payload does not read back: %q", c.encoding, back)
		}
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)

	keys, err := st.Keys(ctx, 0)
	if err != nil || len(keys) != 0 || keys == nil {
		t.Fatalf("Keys with none parked = %#v, %v; want an empty list", keys, err)
	}

	later := addParked(t, s, "later", base.Add(time.Hour))
	earlier, _ := addDead(t, s, dead{Key: "earlier", At: base, Parked: true})
	parkBehind(t, s, earlier, addPending(t, s, "earlier", store.ParkedRecheck, "", ""))
	// Rows of the key that are not pending do not wait.
	s.Exec(t, `INSERT INTO outbox (topic, key, payload, status, sent_at) VALUES ('orders', 'later', '{}', 'sent', now())`)
	addDead(t, s, dead{Key: "later", At: base.Add(2 * time.Hour), Status: deadletter.StatusDiscarded})
	// Not parking: a dead letter of another key without on_dead_letter: block.
	addDead(t, s, dead{Key: "free", At: base})
	addPending(t, s, "free", 0, "", "")

	keys, err = st.Keys(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	type kw struct {
		key     string
		row     int64
		waiting int
	}
	var got []kw
	for _, k := range keys {
		got = append(got, kw{k.Key, k.Row.ID, k.Waiting})
		if !k.Row.ParksKey || k.Row.Key == nil || *k.Row.Key != k.Key {
			t.Errorf("key %s: row %+v", k.Key, k.Row)
		}
	}
	want := []kw{{"earlier", earlier, 1}, {"later", later.Park, 3}}
	if !slices.Equal(got, want) {
		t.Errorf("Keys = %+v, want the longest parked first: %+v", got, want)
	}

	keys, err = st.Keys(ctx, 1)
	if err != nil || len(keys) != 1 || keys[0].Key != "earlier" {
		t.Errorf("Keys(1) = %+v, %v", keys, err)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)

	empty, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if empty.DeadLettered != 0 || empty.Discarded != 0 || empty.ParkedKeys != 0 || empty.Oldest != nil || empty.Newest != nil || len(empty.ByTopic) != 0 {
		t.Errorf("Stats of no dead letters = %+v", empty)
	}

	addDead(t, s, dead{Topic: "a", Dest: "kafka", Reason: sink.ReasonPermanent, At: base.Add(time.Hour)})
	addDead(t, s, dead{Topic: "a", Dest: "kafka", Reason: sink.ReasonRetriesExhausted, At: base.Add(2 * time.Hour), Key: "k1", Parked: true})
	addDead(t, s, dead{Topic: "a", Dest: "webhook", Reason: sink.ReasonRetriesExhausted, At: base.Add(3 * time.Hour), Key: "k2", Parked: true})
	addDead(t, s, dead{Topic: "b", Reason: sink.ReasonNoRoute, At: base.Add(4 * time.Hour)})
	// Discarded rows count apart, whenever they died.
	addDead(t, s, dead{Topic: "c", Dest: "kafka", Status: deadletter.StatusDiscarded, At: base})
	addDead(t, s, dead{Topic: "a", Dest: "kafka", Status: deadletter.StatusDiscarded, At: base.Add(5 * time.Hour)})
	addPending(t, s, "k1", 0, "", "")

	got, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.DeadLettered != 4 || got.Discarded != 2 || got.ParkedKeys != 2 {
		t.Errorf("Stats counts = %d dead-lettered, %d discarded, %d parked keys; want 4, 2, 2", got.DeadLettered, got.Discarded, got.ParkedKeys)
	}
	if got.Oldest == nil || !got.Oldest.Equal(base.Add(time.Hour)) || got.Newest == nil || !got.Newest.Equal(base.Add(4*time.Hour)) {
		t.Errorf("Stats oldest %v newest %v, want %v and %v", got.Oldest, got.Newest, base.Add(time.Hour), base.Add(4*time.Hour))
	}
	// The age of the oldest, by the database clock (the discarded row
	// dead-lettered earlier does not count).
	if want := dbNow(t, s).Sub(base.Add(time.Hour)); got.OldestAge > want || got.OldestAge < want-time.Minute {
		t.Errorf("Stats oldest age %s, want about %s", got.OldestAge, want)
	}
	for _, c := range []struct {
		name      string
		got, want map[string]int
	}{
		{"topic", got.ByTopic, map[string]int{"a": 3, "b": 1}},
		{"destination", got.ByDestination, map[string]int{"kafka": 2, "webhook": 1, "": 1}},
		{"reason", got.ByReason, map[string]int{sink.ReasonPermanent: 1, sink.ReasonRetriesExhausted: 2, sink.ReasonNoRoute: 1}},
	} {
		if !maps.Equal(c.got, c.want) {
			t.Errorf("by %s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// A relative window counts from the first page's moment, carried in the
// cursor: a walk that began 40 minutes ago still sees the rows that were
// inside "the last hour" then.
func TestListRelativeWindowHoldsAcrossPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s)
	now := dbNow(t, s)
	older, _ := addDead(t, s, dead{At: now.Add(-90 * time.Minute)})
	newer, _ := addDead(t, s, dead{At: now.Add(-30 * time.Minute)})
	f := deadletter.Filter{Since: deadletter.TimeBound{Ago: time.Hour}}

	page, err := st.List(ctx, deadletter.ListParams{Filter: f, Limit: 1})
	if err != nil || len(page.Letters) != 1 || page.Letters[0].ID != newer || page.Next != "" {
		t.Fatalf("first page = %+v, %v; want only row %d", page, err, newer)
	}
	// The same walk, begun 40 minutes ago: its window reaches 100 minutes
	// back.
	began := now.Add(-40 * time.Minute)
	c := fmt.Sprintf("%d-%d-%d", now.Add(-30*time.Minute).UnixMicro(), newer, began.UnixMicro())
	page, err = st.List(ctx, deadletter.ListParams{Filter: f, Limit: 1, Cursor: c})
	if err != nil || len(page.Letters) != 1 || page.Letters[0].ID != older {
		t.Fatalf("page after a cursor begun 40 minutes ago = %+v, %v; want row %d", page, err, older)
	}
	if page.Next != "" {
		t.Fatalf("next cursor %q after the last row", page.Next)
	}
	// A first page's cursor carries its moment.
	page, err = st.List(ctx, deadletter.ListParams{Filter: deadletter.Filter{Since: deadletter.TimeBound{Ago: 2 * time.Hour}}, Limit: 1})
	if err != nil || strings.Count(page.Next, "-") != 2 {
		t.Fatalf("first page's cursor %q (%v) does not carry its moment", page.Next, err)
	}
}
