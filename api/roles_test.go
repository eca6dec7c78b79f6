package api_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/api"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/syncbuf"
)

// The tokens of the role tests, one a role.
var roleTokens = map[access.Role]string{
	access.Viewer:   "viewer-token-0123456789",
	access.Reader:   "reader-token-0123456789",
	access.Operator: "operator-token-0123456789",
}

func newAPIWithRoles(t testing.TB, s *pgtest.Schema) http.Handler {
	t.Helper()
	set := map[string]access.Token{}
	for role, tok := range roleTokens {
		set[role.String()] = access.Token{Value: tok, Role: role}
	}
	tokens, err := access.NewTokens(set)
	if err != nil {
		t.Fatal(err)
	}
	return newAPIWith(t, s, tokens)
}

// Every route of the API, for every role and for no token: a request
// the role does not allow is answered 401 (no token) or 403 naming the
// role it needs, and changes nothing in the database; one it allows gets
// past the check. A route added without a role fails here.
func TestEveryRouteChecksItsRole(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	h := newAPIWithRoles(t, s)
	routes := api.Routes()
	if len(routes) < 12 {
		t.Fatalf("%d routes, want every endpoint", len(routes))
	}
	// The role each route needs, written out here: a route added to the
	// API fails until it is added here too.
	want := map[string]access.Role{
		"GET /dead-letters": access.Viewer, "GET /dead-letters/{ref}": access.Viewer, "GET /dead-letter-groups": access.Viewer,
		"GET /parked-keys": access.Viewer, "GET /audit": access.Viewer, "GET /stats": access.Viewer, "GET /find": access.Viewer,
		"POST /dead-letters/replay": access.Operator, "POST /dead-letters/{ref}/edit": access.Operator,
		"POST /dead-letters/discard": access.Operator, "POST /dead-letters/reroute": access.Operator,
		"POST /parked-keys/release": access.Operator,
	}
	for _, rt := range routes {
		if w, ok := want[rt.Method+" "+rt.Path]; !ok || rt.Role != w {
			t.Errorf("%s %s needs %s, want %s", rt.Method, rt.Path, rt.Role, w)
		}
		delete(want, rt.Method+" "+rt.Path)
	}
	for r := range want {
		t.Errorf("%s is not an endpoint", r)
	}
	// What each route is sent: a dead letter to name, and a body that
	// would change it.
	request := func(rt api.Route) (path, body string) {
		id, _ := addDead(t, s, dead{Key: "k-" + strings.ReplaceAll(rt.Path, "/", "-")})
		path = "/api/v1" + strings.ReplaceAll(rt.Path, "{ref}", strconv.FormatInt(id, 10))
		switch {
		case rt.Method == http.MethodGet:
		case strings.HasSuffix(rt.Path, "/edit"):
			body = `{"payload":{"n":2}}`
		case strings.HasSuffix(rt.Path, "/release"):
			park := addParked(t, s, "parked-"+strconv.FormatInt(id, 10), base)
			body = fmt.Sprintf(`{"key":%q}`, park.Key)
		case strings.HasSuffix(rt.Path, "/reroute"):
			body = fmt.Sprintf(`{"ids":[%d],"topic":"orders.other","reason":"moved"}`, id)
		default:
			body = fmt.Sprintf(`{"ids":[%d],"reason":"checked"}`, id)
		}
		return path, body
	}
	for _, rt := range routes {
		for _, role := range append([]access.Role{0}, access.Roles...) {
			name := rt.Method + " " + rt.Path + " as " + role.String()
			path, body := request(rt)
			before := snapshot(t, s)
			code, got := call(h, rt.Method, path, body, roleTokens[role])
			switch {
			case role == 0:
				if code != http.StatusUnauthorized {
					t.Errorf("%s: %d %s, want 401", name, code, got)
				}
				checkUnchanged(t, s, before)
			case !role.Allows(rt.Role):
				want := fmt.Sprintf("this needs the %s role; %s has %s", rt.Role, role, role)
				if code != http.StatusForbidden || !strings.Contains(got, want) {
					t.Errorf("%s: %d %s, want 403 saying %q", name, code, got, want)
				}
				checkUnchanged(t, s, before)
			default:
				if code == http.StatusUnauthorized || code == http.StatusForbidden || code >= 500 {
					t.Errorf("%s: %d %s, want it allowed", name, code, got)
				}
			}
		}
	}
}

// A viewer sees rows, their errors and the audit trail, but no payload:
// not a row's, nor an edit's record of one. A reader and an operator see
// them, and the audit names the operator's role.
func TestViewersSeeNoPayloads(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	h := newAPIWithRoles(t, s)
	id, eventID := addDead(t, s, dead{Key: "k", Payload: []byte(`{"card":"4111 1111 1111 1111"}`)})
	if code, body := call(h, "POST", fmt.Sprintf("/api/v1/dead-letters/%d/edit", id),
		`{"payload":{"card":"4000 0000 0000 0002"},"reason":"fixed the card"}`, roleTokens[access.Operator]); code != 200 {
		t.Fatalf("edit: %d %s", code, body)
	}
	for _, path := range []string{
		fmt.Sprintf("/api/v1/dead-letters/%d", id), "/api/v1/audit", "/api/v1/find?q=" + eventID.String(),
		fmt.Sprintf("/api/v1/find?q=%d&kind=row", id),
	} {
		for _, role := range access.Roles {
			code, body := call(h, "GET", path, "", roleTokens[role])
			if code != 200 {
				t.Fatalf("%s as %s: %d %s", path, role, code, body)
			}
			shows := strings.Contains(body, "4000 0000") || strings.Contains(body, "NDAwMCAwMDAw") // the payload, or its base64
			if path == "/api/v1/audit" || strings.Contains(path, "find") {
				shows = strings.Contains(body, `"payload"`)
			}
			if shows != role.Allows(access.Reader) {
				t.Errorf("%s as %s shows the payload: %v\n%s", path, role, shows, body)
			}
			if !role.Allows(access.Reader) && !strings.Contains(body, "hidden") {
				t.Errorf("%s as %s does not say the payload is hidden:\n%s", path, role, body)
			}
		}
	}
	var audit deadletter.AuditPage
	_, body := call(h, "GET", "/api/v1/audit", "", roleTokens[access.Viewer])
	if err := json.Unmarshal([]byte(body), &audit); err != nil || len(audit.Records) != 1 {
		t.Fatalf("audit: %v %s", err, body)
	}
	if r := audit.Records[0]; r.Actor != "operator" || r.Source != "api" || r.Credential != "operator" || r.Role != "operator" {
		t.Errorf("audit record %+v, want the operator's token and role", r)
	}
}

// Fifty wrong tokens from one address in a second: all refused, the
// attempts past the throttle's burst refused unchecked (429, with when to
// try again), even with the right token; one log line for them all. The
// right token from another address gets in at once.
func TestWrongTokensAreThrottled(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	var logged syncbuf.Buffer
	throttle := access.DefaultThrottle(slog.New(slog.NewTextHandler(&logged, nil)))
	tokens, err := access.NewTokens(map[string]access.Token{"ops": {Value: apiToken, Role: access.Operator}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.NewHandler(api.HandlerConfig{Store: newStore(t, s), Tokens: tokens, Throttle: throttle})
	if err != nil {
		t.Fatal(err)
	}
	from := func(addr, tok string) (int, http.Header) {
		req := httptest.NewRequest("GET", "/api/v1/stats", nil)
		req.RemoteAddr = addr
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Header()
	}
	codes := map[int]int{}
	for i := range 50 {
		code, _ := from("203.0.113.7:40000", fmt.Sprintf("guess-%02d-0123456789", i))
		codes[code]++
	}
	if codes[http.StatusUnauthorized] != throttle.Burst || codes[http.StatusTooManyRequests] != 50-throttle.Burst {
		t.Errorf("answers to 50 wrong tokens: %v, want %d 401s and the rest 429", codes, throttle.Burst)
	}
	code, header := from("203.0.113.7:40001", apiToken)
	if retry, _ := strconv.Atoi(header.Get("Retry-After")); code != http.StatusTooManyRequests || retry < 1 {
		t.Errorf("the right token from the throttled address: %d, Retry-After %q; want 429 and a wait", code, header.Get("Retry-After"))
	}
	if code, _ := from("198.51.100.2:50000", apiToken); code != http.StatusOK {
		t.Errorf("the right token from another address: %d, want 200", code)
	}
	// Behind a trusted proxy, the clients it forwards are told apart by
	// the address it appends.
	throttle.Proxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	through := func(client, tok string) int {
		req := httptest.NewRequest("GET", "/api/v1/stats", nil)
		req.RemoteAddr = "10.0.0.1:443"
		req.Header.Set("X-Forwarded-For", client)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for i := range throttle.Burst {
		through("198.51.100.9", fmt.Sprintf("guess-%02d-0123456789", i))
	}
	if code := through("198.51.100.9", apiToken); code != http.StatusTooManyRequests {
		t.Errorf("the guesser behind the proxy: %d, want 429", code)
	}
	if code := through("198.51.100.10", apiToken); code != http.StatusOK {
		t.Errorf("another client behind the same proxy: %d, want 200", code)
	}
	if lines := strings.Count(logged.String(), "failed sign-ins"); lines != 1 {
		t.Errorf("%d log lines for the failures, want 1:\n%s", lines, logged.String())
	}
	if !strings.Contains(logged.String(), "203.0.113.7") {
		t.Errorf("the log line does not name the address:\n%s", logged.String())
	}
}
