package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/api"
	"github.com/outbox-relay/outbox-relay/deadletter"
	dlt "github.com/outbox-relay/outbox-relay/internal/dev/deadlettertest"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.WaitingTests) }

// The dead-letter tests' fixtures.
type dead = dlt.Dead

var (
	base           = dlt.Base
	newStore       = dlt.NewStore
	newStoreWith   = dlt.NewStoreWith
	count          = dlt.Count
	addDead        = dlt.AddDead
	failAgain      = dlt.FailAgain
	addParked      = dlt.AddParked
	checkReleased  = dlt.CheckReleased
	snapshot       = dlt.Snapshot
	checkUnchanged = dlt.CheckUnchanged
	rowState       = dlt.RowState
	statuses       = dlt.Statuses
	sorted         = dlt.Sorted
)

const apiToken = "s3cret-admin-token-0123"

func newAPI(t *testing.T, s *pgtest.Schema) http.Handler {
	t.Helper()
	tokens, err := access.NewTokens(map[string]access.Token{"ops": {Value: apiToken, Role: access.Operator}})
	if err != nil {
		t.Fatal(err)
	}
	return newAPIWith(t, s, tokens)
}

func newAPIWith(t testing.TB, s *pgtest.Schema, tokens *access.Tokens) http.Handler {
	t.Helper()
	h, err := api.NewHandler(api.HandlerConfig{
		Store: newStoreWith(t, s, deadletter.Config{
			MaxPayload: 1024,
			CheckTopic: func(topic string) error {
				if !strings.HasPrefix(topic, "orders") {
					return fmt.Errorf("no route matches it")
				}
				return nil
			},
		}),
		Tokens: tokens,
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// call sends a request to h with the token (unless tok says otherwise) and
// returns the status and body.
func call(h http.Handler, method, path, body string, tok ...string) (int, string) {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	token := apiToken
	if len(tok) > 0 {
		token = tok[0]
	}
	if token != "" {
		req.Header.Set("Authorization", token)
		if !strings.Contains(token, " ") {
			req.Header.Set("Authorization", "Bearer "+token)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func TestAPIRequiresToken(t *testing.T) {
	t.Parallel()
	if _, err := api.NewHandler(api.HandlerConfig{Store: &deadletter.Store{}}); err == nil {
		t.Fatal("an API without a token was built")
	}
	s := pgtest.NewSchema(t)
	id, _ := addDead(t, s, dead{Topic: "orders.secret", Key: "customer-7", Parked: true})
	h := newAPI(t, s)
	before := snapshot(t, s)

	for _, ep := range []struct{ method, path, body string }{
		{"GET", "/api/v1/dead-letters", ""},
		{"GET", fmt.Sprintf("/api/v1/dead-letters/%d", id), ""},
		{"POST", "/api/v1/dead-letters/replay", fmt.Sprintf(`{"ids":[%d]}`, id)},
		{"POST", "/api/v1/dead-letters/discard", fmt.Sprintf(`{"ids":[%d],"reason":"x"}`, id)},
		{"POST", fmt.Sprintf("/api/v1/dead-letters/%d/edit", id), `{"topic":"orders"}`},
		{"GET", "/api/v1/dead-letter-groups", ""},
		{"GET", "/api/v1/parked-keys", ""},
		{"POST", "/api/v1/parked-keys/release", `{"key":"customer-7"}`},
		{"GET", "/api/v1/audit", ""},
		{"GET", "/api/v1/stats", ""},
		{"GET", "/api/v1/nothing-here", ""},
	} {
		for _, tok := range []string{"", "wrong-token", "Basic " + apiToken, apiToken + "x", "Bearer"} {
			code, body := call(h, ep.method, ep.path, ep.body, tok)
			if code != http.StatusUnauthorized {
				t.Errorf("%s %s with %q: %d, want 401", ep.method, ep.path, tok, code)
			}
			if strings.Contains(body, "orders") || strings.Contains(body, "customer-7") {
				t.Errorf("%s %s with %q exposed a row: %s", ep.method, ep.path, tok, body)
			}
		}
	}
	checkUnchanged(t, s, before)
	if code, body := call(h, "GET", "/api/v1/stats", ""); code != http.StatusOK || !strings.Contains(body, `"dead_lettered": 1`) {
		t.Fatalf("with the token: %d %s", code, body)
	}
}

// Several tokens are accepted at once, for rotation; the audit records
// which one each change came with, beside the actor the caller names, and
// the token's name when it names none. Replacing the set takes effect at
// once, and a bad set is refused with the old one kept.
func TestAPITokensAreNamedInTheAudit(t *testing.T) {
	t.Parallel()
	const alice, bob = "alice-token-0123456789", "bob-token-0123456789"
	tokens, err := access.NewTokens(map[string]access.Token{"alice": {Value: alice, Role: access.Operator}, "bob-ci": {Value: bob, Role: access.Operator}})
	if err != nil {
		t.Fatal(err)
	}
	s := pgtest.NewSchema(t)
	one, _ := addDead(t, s, dead{Key: "k1"})
	two, _ := addDead(t, s, dead{Key: "k2"})
	h := newAPIWith(t, s, tokens)
	if code, body := call(h, "POST", "/api/v1/dead-letters/replay", fmt.Sprintf(`{"ids":[%d],"actor":"carol"}`, one), alice); code != 200 {
		t.Fatalf("replay with alice's token: %d %s", code, body)
	}
	if code, body := call(h, "POST", "/api/v1/dead-letters/discard", fmt.Sprintf(`{"ids":[%d],"reason":"duplicate"}`, two), bob); code != 200 {
		t.Fatalf("discard with bob's token: %d %s", code, body)
	}
	var audit deadletter.AuditPage
	code, body := call(h, "GET", "/api/v1/audit", "", alice)
	if err := json.Unmarshal([]byte(body), &audit); err != nil {
		t.Fatalf("audit: %v: %s", err, body)
	}
	var got []string
	for _, r := range audit.Records {
		got = append(got, r.Action+"/"+r.Actor+"/"+r.Credential)
	}
	if want := []string{"discard/bob-ci/bob-ci", "replay/carol/alice"}; code != 200 || !slices.Equal(got, want) {
		t.Fatalf("audit: %v, want %v (%s)", got, want, body)
	}

	if err := tokens.Replace(map[string]access.Token{"bob-ci": {Value: bob, Role: access.Operator}, "bob-2": {Value: bob, Role: access.Viewer}}); err == nil {
		t.Fatal("one token under two names was accepted")
	}
	if code, _ := call(h, "GET", "/api/v1/stats", "", alice); code != 200 {
		t.Fatalf("alice's token stopped working after a refused replacement: %d", code)
	}
	if err := tokens.Replace(map[string]access.Token{"bob-ci": {Value: bob, Role: access.Operator}}); err != nil {
		t.Fatal(err)
	}
	if code, _ := call(h, "GET", "/api/v1/stats", "", alice); code != http.StatusUnauthorized {
		t.Fatalf("alice's removed token: %d, want 401", code)
	}
	if code, _ := call(h, "GET", "/api/v1/stats", "", bob); code != 200 {
		t.Fatalf("bob's token after the replacement: %d", code)
	}
	if names := tokens.Names(); !slices.Equal(names, []string{"bob-ci"}) {
		t.Fatalf("names %v", names)
	}
}

func TestAPIValidatesInput(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	id, _ := addDead(t, s, dead{Key: "k"})
	h := newAPI(t, s)
	before := snapshot(t, s)
	edit := fmt.Sprintf("/api/v1/dead-letters/%d/edit", id)

	for _, tc := range []struct {
		method, path, body string
		code               int
		msg                string
	}{
		{"GET", "/api/v1/dead-letters?colour=red", "", 400, `unknown query parameter \"colour\"`},
		{"GET", "/api/v1/dead-letters?since=yesterday", "", 400, `time \"yesterday\"`},
		{"GET", "/api/v1/dead-letters?reason=broken", "", 400, `reason \"broken\"`},
		{"GET", "/api/v1/dead-letters?limit=-1", "", 400, "limit"},
		{"GET", "/api/v1/dead-letters?limit=5000", "", 400, "limit 5000"},
		{"GET", "/api/v1/dead-letters?topic=a&topic=b", "", 400, "given 2 times"},
		{"GET", "/api/v1/dead-letters?cursor=zz", "", 400, "cursor"},
		{"GET", "/api/v1/dead-letters/abc", "", 400, "neither a row id"},
		{"GET", "/api/v1/dead-letters/999999", "", 404, "no outbox row"},
		{"POST", "/api/v1/dead-letters/replay", "", 400, "request body is empty"},
		{"POST", "/api/v1/dead-letters/replay", `{"ids":[1]`, 400, "request body"},
		{"POST", "/api/v1/dead-letters/replay", `{"ids":[1]} {}`, 400, "more than one JSON value"},
		{"POST", "/api/v1/dead-letters/replay", `{"idz":[1]}`, 400, `unknown field \"idz\"`},
		{"POST", "/api/v1/dead-letters/replay", `{"ids":[true]}`, 400, "neither a row id nor an event id"},
		{"POST", "/api/v1/dead-letters/replay", `{"ids":["x1"]}`, 400, "neither a row id"},
		{"POST", "/api/v1/dead-letters/replay", `{}`, 400, "select rows"},
		{"POST", "/api/v1/dead-letters/replay", fmt.Sprintf(`{"ids":[%d],"all":true}`, id), 400, "not several at once"},
		{"POST", "/api/v1/dead-letters/replay", `{"filter":{"since":"soon"}}`, 400, "request body"},
		{"POST", "/api/v1/dead-letters/replay", `{"filter":{"reason":"x"}}`, 400, `reason \"x\"`},
		{"POST", "/api/v1/dead-letters/replay", fmt.Sprintf(`{"ids":[%d, 999999]}`, id), 404, "999999"},
		{"POST", "/api/v1/dead-letters/replay", `{"all":true,"rate":-1}`, 400, "rate"},
		{"POST", "/api/v1/dead-letters/replay", `{"all":true,"batch_size":100000}`, 400, "batch size"},
		{"POST", "/api/v1/dead-letters/discard", fmt.Sprintf(`{"ids":[%d]}`, id), 400, "needs a reason"},
		{"POST", edit, `{}`, 400, "nothing to change"},
		{"POST", edit, `{"payload":{"a":1},"payload_text":"x"}`, 400, "give the payload once"},
		{"POST", edit, `{"payload_base64":"%%%"}`, 400, "payload_base64"},
		{"POST", edit, `{"payload_text":"not json"}`, 400, "payload is JSON and the new one is not"},
		{"POST", edit, `{"headers":{"a":1}}`, 400, "headers must be a JSON object of string values"},
		{"POST", edit, `{"topic":"billing"}`, 400, "no route matches it"},
		{"POST", edit, fmt.Sprintf(`{"payload_text":%q,"allow_non_json":true}`, strings.Repeat("x", 2000)), 400, "above the payload cap"},
		{"POST", "/api/v1/dead-letters/999999/edit", `{"topic":"orders.v2"}`, 404, "no outbox row"},
		{"POST", "/api/v1/parked-keys/release", `{"key":"k"}`, 404, "not parked"},
		{"POST", "/api/v1/parked-keys/release", `{}`, 400, "name the key"},
		{"GET", "/api/v1/audit?action=delete", "", 400, `action \"delete\"`},
		{"GET", "/api/v1/audit?row=x", "", 400, "row"},
		{"GET", "/api/v1/dead-letters/replay/now", "", 404, "no such endpoint"},
		{"DELETE", "/api/v1/stats", "", 405, "DELETE is not allowed on /api/v1/stats; it takes GET or HEAD"},
		{"GET", "/api/v1/parked-keys/release", "", 405, "it takes POST"},
		{"PUT", "/api/v1/outboxes/outbox/parked-keys", "", 405, "it takes GET or HEAD"},
	} {
		code, body := call(h, tc.method, tc.path, tc.body)
		if code != tc.code || !strings.Contains(body, tc.msg) {
			t.Errorf("%s %s %s: %d %s; want %d and %q", tc.method, tc.path, tc.body, code, body, tc.code, tc.msg)
		}
	}
	checkUnchanged(t, s, before)
}

func TestAPIOperations(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	a, _ := addDead(t, s, dead{Topic: "orders", Key: "a", Dest: "hooks"})
	b, bEvent := addDead(t, s, dead{Topic: "orders", Key: "b", Dest: "hooks"})
	c, _ := addDead(t, s, dead{Topic: "billing", Dest: "kafka"})
	p := addParked(t, s, "p", base)
	h := newAPI(t, s)

	decode := func(body string, v any) {
		t.Helper()
		if err := json.Unmarshal([]byte(body), v); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
	}
	var page deadletter.Page
	code, body := call(h, "GET", "/api/v1/dead-letters?destination=hooks&limit=1", "")
	decode(body, &page)
	if code != 200 || len(page.Letters) != 1 || page.Next == "" {
		t.Fatalf("list: %d %s", code, body)
	}
	code, body = call(h, "GET", "/api/v1/dead-letters?destination=hooks&limit=1&cursor="+page.Next, "")
	var page2 deadletter.Page
	decode(body, &page2)
	if code != 200 || len(page2.Letters) != 1 || page2.Next != "" || page2.Letters[0].ID == page.Letters[0].ID {
		t.Fatalf("second page: %d %s", code, body)
	}

	code, body = call(h, "GET", fmt.Sprintf("/api/v1/dead-letters/%s", bEvent), "")
	var shown struct {
		ID      int64          `json:"id"`
		Payload map[string]int `json:"payload"`
	}
	decode(body, &shown)
	if code != 200 || shown.ID != b || shown.Payload["n"] != 1 {
		t.Fatalf("show by event id: %d %s", code, body)
	}

	// Dry run, then the replay itself, by id and event id.
	var res deadletter.Result
	code, body = call(h, "POST", "/api/v1/dead-letters/replay", fmt.Sprintf(`{"ids":[%d, %q],"dry_run":true}`, a, bEvent))
	decode(body, &res)
	if code != 200 || !res.DryRun || !slices.Equal(sorted(res.Changed), []int64{a, b}) || statuses(t, s, a, b)[0] != "dead_lettered" {
		t.Fatalf("dry run: %d %s", code, body)
	}
	code, body = call(h, "POST", "/api/v1/dead-letters/replay", fmt.Sprintf(`{"ids":[%d, %q],"reason":"hooks fixed","actor":"alice"}`, a, bEvent))
	if code != 200 || !slices.Equal(statuses(t, s, a, b), []string{"pending", "pending"}) {
		t.Fatalf("replay: %d %s", code, body)
	}
	code, body = call(h, "POST", "/api/v1/dead-letters/replay", fmt.Sprintf(`{"ids":[%d]}`, a))
	decode(body, &res)
	if code != 200 || len(res.Changed) != 0 || len(res.Unchanged) != 1 || res.Unchanged[0].Status != "pending" {
		t.Fatalf("second replay: %d %s", code, body)
	}

	// Edit: 409 for a row that is no longer a dead letter; a JSON payload
	// value for one that is.
	if code, body := call(h, "POST", fmt.Sprintf("/api/v1/dead-letters/%d/edit", a), `{"topic":"orders.v2"}`); code != 409 {
		t.Fatalf("edit of a pending row: %d %s", code, body)
	}
	code, body = call(h, "POST", fmt.Sprintf("/api/v1/dead-letters/%d/edit", c), `{"payload":{"n":2},"topic":"orders.billing","actor":"bob"}`)
	if r := rowState(t, s, c); code != 200 || r.Status != "pending" || string(r.Payload) != `{"n":2}` || r.Topic != "orders.billing" {
		t.Fatalf("edit: %d %s; row %+v", code, body, r)
	}

	var keys struct {
		ParkedKeys []deadletter.ParkedKey `json:"parked_keys"`
	}
	code, body = call(h, "GET", "/api/v1/parked-keys", "")
	decode(body, &keys)
	if code != 200 || len(keys.ParkedKeys) != 1 || keys.ParkedKeys[0].Key != "p" || keys.ParkedKeys[0].Waiting != 3 {
		t.Fatalf("parked keys: %d %s", code, body)
	}
	if code, body := call(h, "POST", "/api/v1/parked-keys/release", `{"key":"p","discard":true,"reason":"handled by hand","actor":"carol"}`); code != 200 {
		t.Fatalf("release: %d %s", code, body)
	}
	checkReleased(t, s, p)
	if st := statuses(t, s, p.Park); st[0] != "discarded" {
		t.Fatalf("parking row is %s, want discarded", st[0])
	}

	var audit deadletter.AuditPage
	code, body = call(h, "GET", "/api/v1/audit?limit=10", "")
	decode(body, &audit)
	var got []string
	for _, r := range audit.Records {
		got = append(got, r.Action+"/"+r.Actor+"/"+r.Source+"/"+r.Credential)
	}
	if want := []string{"release/carol/api/ops", "edit/bob/api/ops", "replay/alice/api/ops"}; code != 200 || !slices.Equal(got, want) {
		t.Fatalf("audit: %v, want %v (%s)", got, want, body)
	}

	var st deadletter.Stats
	code, body = call(h, "GET", "/api/v1/stats", "")
	decode(body, &st)
	if code != 200 || st.DeadLettered != 0 || st.Discarded != 1 {
		t.Fatalf("stats: %d %s", code, body)
	}
	if code, _ := call(h, "POST", "/api/v1/dead-letters/discard", `{"all":true,"reason":"nothing left"}`); code != 200 {
		t.Fatalf("discard all: %d", code)
	}
}

// A relay with several outboxes serves each under its name; the paths
// without one say how to name one, and an unknown name is refused.
func TestAPIServesEachOutbox(t *testing.T) {
	t.Parallel()
	a, b := pgtest.NewSchema(t), pgtest.NewSchema(t)
	idA, _ := addDead(t, a, dead{Topic: "orders.a"})
	addDead(t, b, dead{Topic: "orders.b"})
	tokens, err := access.NewTokens(map[string]access.Token{"ops": {Value: apiToken, Role: access.Operator}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.NewHandler(api.HandlerConfig{
		Outboxes: map[string]*deadletter.Store{"tenant-a": newStore(t, a), "tenant-b": newStore(t, b)},
		Tokens:   tokens,
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"tenant-a": "orders.a", "tenant-b": "orders.b"} {
		code, body := call(h, "GET", "/api/v1/outboxes/"+name+"/dead-letters", "")
		if code != 200 || !strings.Contains(body, want) || strings.Contains(body, map[string]string{"orders.a": "orders.b", "orders.b": "orders.a"}[want]) {
			t.Errorf("%s: %d %s; want only %s", name, code, body, want)
		}
	}
	before := snapshot(t, b)
	code, body := call(h, "POST", "/api/v1/outboxes/tenant-a/dead-letters/discard", fmt.Sprintf(`{"ids":[%d],"reason":"wrong tenant"}`, idA))
	if code != 200 {
		t.Fatalf("discard in tenant-a: %d %s", code, body)
	}
	if got := rowState(t, a, idA).Status; got != "discarded" {
		t.Errorf("tenant-a's row is %s after its discard, want discarded", got)
	}
	checkUnchanged(t, b, before)

	for path, want := range map[string]string{
		"/api/v1/dead-letters":                   `several outboxes (tenant-a, tenant-b): name one, as in /api/v1/outboxes/{outbox}/dead-letters`,
		"/api/v1/outboxes/tenant-c/dead-letters": `no outbox \"tenant-c\"; this relay serves tenant-a, tenant-b`,
	} {
		code, body := call(h, "GET", path, "")
		if code != 404 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d %s; want 404 with %s", path, code, body, want)
		}
	}
	if code, _ := call(h, "GET", "/api/v1/outboxes/tenant-a/dead-letters", "", "wrong-token-0123456789"); code != 401 {
		t.Errorf("a wrong token got %d, want 401", code)
	}
}

// Failure groups over the API: listed with the list's filters, and a
// group's id selects its rows for a dry run and a replay.
func TestAPIFailureGroups(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	a, _ := addDead(t, s, dead{Dest: "hook", LastError: "HTTP 400: order 17 has no 'amount'"})
	b, _ := addDead(t, s, dead{Dest: "hook", LastError: "HTTP 400: order 18 has no 'currency'"})
	addDead(t, s, dead{Dest: "hook", LastError: "HTTP 413: too large"})
	h := newAPI(t, s)

	code, body := call(h, "GET", "/api/v1/dead-letter-groups?destination=hook&limit=10", "")
	var page deadletter.GroupPage
	if err := json.Unmarshal([]byte(body), &page); code != 200 || err != nil {
		t.Fatalf("groups: %d %s (%v)", code, body, err)
	}
	if page.Total != 2 || len(page.Groups) != 2 || page.Groups[0].Count != 2 || page.Groups[0].Fingerprint != "HTTP <n>: order <n> has no <q>" {
		t.Fatalf("groups = %+v", page)
	}
	id := page.Groups[0].ID
	for _, bad := range []string{"?group=xyz", "?limit=-1", "?colour=red", "?reason=bogus"} {
		before := snapshot(t, s)
		if code, body := call(h, "GET", "/api/v1/dead-letter-groups"+bad, ""); code != http.StatusBadRequest || !strings.Contains(body, "problems") {
			t.Errorf("groups%s: %d %s, want 400 with the problems", bad, code, body)
		}
		checkUnchanged(t, s, before)
	}
	code, body = call(h, "POST", "/api/v1/dead-letters/replay", `{"filter":{"group":"`+id+`"},"dry_run":true}`)
	if code != 200 || !strings.Contains(body, `"count": 2`) || !strings.Contains(body, `"dry_run": true`) {
		t.Fatalf("dry run of group %s: %d %s", id, code, body)
	}
	if code, body := call(h, "POST", "/api/v1/dead-letters/replay", `{"filter":{"group":"`+id+`"}}`); code != 200 || !strings.Contains(body, `"count": 2`) {
		t.Fatalf("replay of group %s: %d %s", id, code, body)
	}
	if n := count(t, s, "outbox", "status = 'pending' AND id = ANY($1)", []int64{a, b}); n != 2 {
		t.Errorf("%d of the group's rows pending, want 2", n)
	}
	if code, body := call(h, "GET", "/api/v1/dead-letters?group="+id, ""); code != 200 || !strings.Contains(body, `"dead_letters": []`) {
		t.Errorf("dead letters of the replayed group: %d %s, want none", code, body)
	}
}

// A row's GET answers its version as the ETag; an edit with If-Match
// applies only while the row still has it.
func TestAPIEditIfMatch(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	id, _ := addDead(t, s, dead{Topic: "orders", Payload: []byte(`{"v":1}`)})
	h := newAPI(t, s)
	path := fmt.Sprintf("/api/v1/dead-letters/%d", id)
	send := func(method, path, body string, ifMatch ...string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiToken)
		for _, m := range ifMatch {
			req.Header.Add("If-Match", m)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	got := send("GET", path, "")
	var row struct{ Version string }
	if err := json.Unmarshal(got.Body.Bytes(), &row); err != nil || got.Code != 200 {
		t.Fatalf("GET: %d %s", got.Code, got.Body)
	}
	etag := got.Header().Get("ETag")
	if row.Version == "" || etag != `"`+row.Version+`"` {
		t.Fatalf("ETag %q for version %q", etag, row.Version)
	}

	// Another edit comes first; the row fails again.
	if rec := send("POST", path+"/edit", `{"payload":{"v":2}}`); rec.Code != 200 {
		t.Fatalf("edit: %d %s", rec.Code, rec.Body)
	}
	failAgain(t, s, id)
	before := snapshot(t, s)
	current := send("GET", path, "").Header().Get("ETag")
	for _, c := range []struct {
		ifMatch []string
		code    int
		msg     string
	}{
		{[]string{etag}, http.StatusPreconditionFailed, "changed since it was read"},
		{[]string{row.Version}, http.StatusBadRequest, "If-Match"},
		{[]string{`"a", "b"`}, http.StatusBadRequest, "If-Match"},
		{[]string{etag, current}, http.StatusBadRequest, "If-Match"},
		{[]string{`"garbage"`}, http.StatusBadRequest, "not a row's version"},
	} {
		if rec := send("POST", path+"/edit", `{"payload":{"v":3}}`, c.ifMatch...); rec.Code != c.code || !strings.Contains(rec.Body.String(), c.msg) {
			t.Errorf("edit with If-Match %q: %d %s; want %d and %q", c.ifMatch, rec.Code, rec.Body, c.code, c.msg)
		}
	}
	checkUnchanged(t, s, before)

	if rec := send("POST", path+"/edit", `{"payload":{"v":3}}`, current); rec.Code != 200 {
		t.Fatalf("edit with the current ETag: %d %s", rec.Code, rec.Body)
	}
	if r := rowState(t, s, id); r.Status != "pending" || string(r.Payload) != `{"v":3}` {
		t.Errorf("after the edit: %s %s", r.Status, r.Payload)
	}
	// * matches whatever the row holds.
	failAgain(t, s, id)
	if rec := send("POST", path+"/edit", `{"payload":{"v":4}}`, "*"); rec.Code != 200 {
		t.Fatalf("edit with If-Match *: %d %s", rec.Code, rec.Body)
	}
}

func TestAPIReroute(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	h := newAPI(t, s)
	a, _ := addDead(t, s, dead{Topic: "ordres", At: base, Reason: sink.ReasonNoRoute})
	path := strings.TrimSuffix(api.Prefix, "/") + "/dead-letters/reroute"
	for body, want := range map[string]string{
		`{"filter":{"reason":"no_route"}}`:                           "reroute needs to",
		`{"filter":{"reason":"no_route"},"to":7}`:                    "to: give a string",
		`{"filter":{"reason":"no_route"},"to":"o","x":1}`:            `unknown field`,
		`{"filter":{"reason":"no_route"},"to":"orders","at":"soon"}`: `use an RFC 3339 time`,
	} {
		if code, got := call(h, "POST", path, body); code != http.StatusBadRequest || !strings.Contains(got, want) {
			t.Errorf("POST %s = %d %s; want 400 saying %q", body, code, got, want)
		}
	}
	code, got := call(h, "POST", path, `{"filter":{"reason":"no_route"},"to":"orders","at":null,"reason":"typo","actor":"ops"}`)
	var res deadletter.Result
	if err := json.Unmarshal([]byte(got), &res); code != http.StatusOK || err != nil ||
		res.Action != deadletter.ActionReroute || !slices.Equal(res.Changed, []int64{a}) {
		t.Fatalf("reroute = %d %s", code, got)
	}
	if r := rowState(t, s, a); r.Status != "pending" || r.Topic != "orders" {
		t.Errorf("row after the API's reroute = %+v", r)
	}
}

// Every action has its API endpoint, answered by the action's handler.
func TestEveryActionHasItsEndpoint(t *testing.T) {
	t.Parallel()
	h := newAPI(t, pgtest.NewSchema(t))
	for _, a := range deadletter.Actions {
		method, path, _ := strings.Cut(a.Route, " ")
		path = strings.TrimSuffix(api.Prefix, "/") + strings.ReplaceAll(path, "{ref}", "1")
		code, body := call(h, method, path, "not json")
		if code != http.StatusBadRequest {
			t.Errorf("%s %s with a bad body = %d %s, want 400 from the action's handler", method, path, code, body)
		}
	}
}

// The API finds a message, and answers a bad search with a 400 that says
// what is wrong, never a 500.
func TestAPIFind(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	h := newAPI(t, s)
	id, ev := addDead(t, s, dead{Key: "k-1", LastError: "HTTP 422 from hooks"})
	code, body := call(h, "GET", "/api/v1/find?q="+ev.String(), "")
	if code != http.StatusOK || !strings.Contains(body, `"kind": "event"`) || !strings.Contains(body, `"state": "dead_lettered"`) ||
		!strings.Contains(body, `"id": `+strconv.FormatInt(id, 10)) {
		t.Fatalf("find by event id: %d\n%s", code, body)
	}
	if code, body := call(h, "GET", "/api/v1/find?q=k-1&kind=key", ""); code != http.StatusOK || !strings.Contains(body, `"kind": "key"`) {
		t.Errorf("find by key: %d\n%s", code, body)
	}
	for _, q := range []string{"", "?q=", "?q=" + url.QueryEscape(strings.Repeat("é", 2100)), "?q=%00", "?q=%FF", "?q=1&kind=table",
		"?q=1&limit=-1", "?q=1&limit=x", "?q=1&q=2", "?q=1&order=id"} {
		code, body := call(h, "GET", "/api/v1/find"+q, "")
		if code != http.StatusBadRequest || !strings.Contains(body, `"error"`) {
			t.Errorf("find%s: %d, want 400 with the problem\n%s", q, code, body)
		}
	}
}

// A row is held only by the earlier rows of its order scope: with order
// kept per destination, a key's row bound elsewhere does not hold it; a
// row without a route holds the key everywhere.
