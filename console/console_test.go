package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/console"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.WaitingTests) }

// The console's tokens: an operator's, a viewer's and a reader's.
const (
	token       = "console-test-token-0123456789"
	viewerToken = "console-viewer-token-0123456789"
	readerToken = "console-reader-token-0123456789"
)

// env is a console on one outbox, served over HTTP.
type env struct {
	t      testing.TB
	s      *pgtest.Schema
	srv    *httptest.Server
	tokens *access.Tokens
	hist   *history.Store
}

func newEnv(t testing.TB, opts ...func(e *env, cfg *console.Config)) *env {
	t.Helper()
	s := pgtest.NewSchema(t)
	dead, err := deadletter.NewStore(s.Pool, deadletter.Config{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := access.NewTokens(map[string]access.Token{"ops": {Value: token, Role: access.Operator},
		"watcher": {Value: viewerToken, Role: access.Viewer}, "auditor": {Value: readerToken, Role: access.Reader}})
	if err != nil {
		t.Fatal(err)
	}
	hist, err := history.New(s.Pool, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := console.Config{
		Outboxes: []console.Outbox{{Name: "main", Dead: dead, History: hist}},
		Tokens:   tokens,
		Status: func(context.Context) console.Status {
			return console.Status{
				Outboxes: []console.OutboxStatus{{Name: "main", Pending: 12, OldestPending: 3 * time.Second, Delivered: 100,
					Capture: &console.CaptureStatus{Slot: "outbox_public_0a1b2c3d", WALStatus: "unreserved", Confirmed: "0/16B3748", LagBytes: 5 << 20,
						Problem: "replication slot outbox_public_0a1b2c3d is lost: see docs/capture.md"}}},
				Destinations: []console.DestinationStatus{{Name: "hooks", Breaker: "open", LastError: "HTTP 503 from hooks",
					OpenUntil: time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC),
					Paused:    []string{"orders (open)"}, InFlight: 4,
					Pauses: []console.Pause{{Topic: "orders", Partition: -1, State: "open", LastError: "topic authorization failed"}}}},
			}
		},
		Route: func(topic string) (string, string, bool) {
			if topic == "unrouted" {
				return "", "", false
			}
			return "hooks", topic, true
		},
		HistoryInterval: time.Second,
	}
	// The server's address is known before the console is made: a
	// provider's redirect names it.
	e := &env{t: t, s: s, srv: httptest.NewUnstartedServer(nil), tokens: tokens, hist: hist}
	e.srv.URL = "http://" + e.srv.Listener.Addr().String()
	for _, o := range opts {
		o(e, &cfg)
	}
	h, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Config.Handler = h
	e.srv.URL = "" // Start sets it again, to the same
	e.srv.Start()
	t.Cleanup(e.srv.Close)
	return e
}

// browser is a client with its own cookies, not following redirects.
type browser struct {
	e    *env
	c    *http.Client
	csrf string
}

func (e *env) browser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{e: e, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// do sends a request with header pairs and returns the status, the
// Location and the body.
func (b *browser) do(method, path string, form url.Values, header ...string) (int, string, string) {
	b.e.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.e.srv.URL+path, body)
	if err != nil {
		b.e.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := b.c.Do(req)
	if err != nil {
		b.e.t.Fatal(err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	if m := csrfField.FindSubmatch(out); m != nil {
		b.csrf = string(m[1])
	}
	return res.StatusCode, res.Header.Get("Location"), string(out)
}

var (
	csrfField  = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	nonceField = regexp.MustCompile(`name="nonce" value="([^"]+)"`)
)

// login logs b in with tok and reports the status of the login POST.
func (b *browser) login(tok string) int {
	b.e.t.Helper()
	_, _, page := b.do("GET", "/console/login", nil)
	m := nonceField.FindStringSubmatch(page)
	if m == nil {
		b.e.t.Fatalf("no nonce in the login page:\n%s", page)
	}
	code, _, _ := b.do("POST", "/console/login", url.Values{"nonce": {m[1]}, "token": {tok}, "next": {"/console/groups"}},
		"Origin", b.e.srv.URL)
	return code
}

// post sends a form with the session's CSRF token, from the console's
// origin.
func (b *browser) post(path string, form url.Values) (int, string) {
	b.e.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	form.Set("csrf", b.csrf)
	code, _, body := b.do("POST", path, form, "Origin", b.e.srv.URL)
	return code, body
}

func (e *env) loggedIn() *browser { return e.loggedInWith(token) }

// loggedInWith is a browser logged in with tok.
func (e *env) loggedInWith(tok string) *browser {
	e.t.Helper()
	b := e.browser()
	if code := b.login(tok); code != http.StatusSeeOther {
		e.t.Fatalf("login: %d", code)
	}
	if code, _, body := b.do("GET", "/console/", nil); code != http.StatusOK || b.csrf == "" {
		e.t.Fatalf("overview after login: %d\n%s", code, body)
	}
	return b
}

// deadLetter inserts a row dead-lettered as the relay leaves one.
func (e *env) deadLetter(dest, key, payload, lastError string) int64 {
	e.t.Helper()
	var id int64
	err := e.s.Pool.QueryRow(context.Background(), `INSERT INTO outbox (topic, key, payload, headers, status, retry_count,
    last_error, last_attempt_at, dead_letter_reason, dead_lettered_at, destination, error_history, error_group)
VALUES ('orders', nullif($2, ''), $3, '{"content-type":"application/json"}', 'dead_lettered', 1, $4, now(), 'permanent', now(), $1,
    jsonb_build_array(jsonb_build_object('at', now(), 'attempt', 1, 'class', 'permanent', 'error', $4::text)),
    outbox_error_group($1, 'permanent', $4))
RETURNING id`, dest, key, []byte(payload), lastError).Scan(&id)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

func (e *env) snapshot() string {
	e.t.Helper()
	var rows, audit string
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT
    coalesce((SELECT string_agg(row_to_json(o)::text, E'\n' ORDER BY id) FROM outbox AS o), ''),
    coalesce((SELECT string_agg(row_to_json(a)::text, E'\n' ORDER BY id) FROM outbox_audit AS a), '')`).Scan(&rows, &audit); err != nil {
		e.t.Fatal(err)
	}
	return rows + "\n--\n" + audit
}

func (e *env) status(id int64) string {
	e.t.Helper()
	var st string
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT status FROM outbox WHERE id = $1`, id).Scan(&st); err != nil {
		e.t.Fatal(err)
	}
	return st
}

// Without a session every page sends to the login form, and every change
// is refused before anything is looked at.
func TestConsoleNeedsLogin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.deadLetter("hooks", "customer-7", `{"order":1}`, "HTTP 400: order 1 has no 'amount'")
	before := e.snapshot()
	b := e.browser()
	for _, p := range []string{"/console/", "/console/live", "/console/groups", "/console/dead-letters",
		"/console/dead-letters/" + strconv.FormatInt(id, 10), "/console/parked-keys", "/console/audit",
		"/console/groups/0123456789ab/replay"} {
		code, loc, body := b.do("GET", p, nil)
		if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/console/login?next=") {
			t.Errorf("GET %s without a session: %d to %q", p, code, loc)
		}
		if strings.Contains(body, "customer-7") || strings.Contains(body, "amount") {
			t.Errorf("GET %s without a session shows a row", p)
		}
	}
	for _, p := range []string{"/console/dead-letters/" + strconv.FormatInt(id, 10) + "/replay", "/console/groups/0123456789ab/replay",
		"/console/parked-keys/release", "/console/dead-letters/" + strconv.FormatInt(id, 10) + "/edit"} {
		if code, _ := b.post(p, url.Values{"why": {"x"}, "key": {"customer-7"}, "payload": {"{}"}}); code != http.StatusUnauthorized {
			t.Errorf("POST %s without a session: %d, want 401", p, code)
		}
	}
	if e.snapshot() != before {
		t.Fatal("a request without a session changed the tables")
	}
	// Static assets need no session.
	if code, _, body := b.do("GET", "/console/static/console.css", nil); code != 200 || !strings.Contains(body, "table") {
		t.Errorf("stylesheet: %d", code)
	}
}

// A page asked for with a method it does not take is a 405 that names the
// methods it does take; a path the console does not have is a 404.
func TestConsoleWrongMethod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.deadLetter("hooks", "customer-7", `{"order":1}`, "HTTP 400: order 1 has no 'amount'")
	before := e.snapshot()
	b := e.loggedIn()
	row := "/console/dead-letters/" + strconv.FormatInt(id, 10)
	for _, c := range []struct {
		method, path string
		code         int
		allow        string
	}{
		{"POST", "/console/groups", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"DELETE", row, http.StatusMethodNotAllowed, "GET, HEAD"},
		{"PUT", row + "/replay", http.StatusMethodNotAllowed, "POST"},
		{"GET", "/console/parked-keys/release", http.StatusMethodNotAllowed, "POST"},
		{"PATCH", "/console/login", http.StatusMethodNotAllowed, "GET, HEAD, POST"},
		{"GET", "/console/nothing-here", http.StatusNotFound, ""},
		{"POST", "/console/nothing-here", http.StatusNotFound, ""},
	} {
		// A form the console would take by POST: were the request routed
		// to the action, the tables would change.
		form := url.Values{"csrf": {b.csrf}, "why": {"x"}, "key": {"customer-7"}}
		req, err := http.NewRequest(c.method, e.srv.URL+c.path, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", e.srv.URL)
		res, err := b.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != c.code || res.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d, Allow %q; want %d, Allow %q", c.method, c.path, res.StatusCode, res.Header.Get("Allow"), c.code, c.allow)
		}
		if c.code == http.StatusMethodNotAllowed && !strings.Contains(string(body), "is not allowed on") {
			t.Errorf("%s %s: the page does not say why:\n%s", c.method, c.path, body)
		}
	}
	if e.snapshot() != before {
		t.Fatal("a request with the wrong method changed the tables")
	}
}

// A login needs an accepted token, the nonce of the form it came from, and
// the console's origin; the session cookie is HttpOnly and SameSite=Lax,
// and ends with its token or its time.
func TestConsoleLogin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b := e.browser()
	if code := b.login("wrong-token-0123456789"); code != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d, want 401", code)
	}
	if code, loc, _ := b.do("GET", "/console/", nil); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/console/login") {
		t.Errorf("after a wrong token: %d %q, want no session", code, loc)
	}
	// Without the form's nonce, or from another site: refused.
	if code, _, _ := b.do("POST", "/console/login", url.Values{"token": {token}}, "Origin", e.srv.URL); code != http.StatusForbidden {
		t.Errorf("a login without the form's nonce: %d, want 403", code)
	}
	_, _, page := b.do("GET", "/console/login", nil)
	nonce := nonceField.FindStringSubmatch(page)[1]
	if code, _, _ := b.do("POST", "/console/login", url.Values{"token": {token}, "nonce": {nonce}}, "Origin", "https://evil.example"); code != http.StatusForbidden {
		t.Errorf("a cross-site login: %d, want 403", code)
	}

	req, _ := http.NewRequest("GET", e.srv.URL+"/console/login", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	var nonceCookie *http.Cookie
	for _, c := range res.Cookies() {
		nonceCookie = c
	}
	if code := b.login(token); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	u, _ := url.Parse(e.srv.URL + "/console/")
	var session *http.Cookie
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "outbox_console" {
			session = c
		}
	}
	if session == nil || nonceCookie == nil {
		t.Fatal("no session cookie after the login")
	}
	// The jar hides the attributes: log in once more by hand to see them.
	form := url.Values{"token": {token}, "nonce": {nonceCookie.Value}}
	req, _ = http.NewRequest("POST", e.srv.URL+"/console/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(nonceCookie)
	res, err = (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	attrs := res.Header.Values("Set-Cookie")
	if len(attrs) == 0 || !strings.Contains(attrs[0], "HttpOnly") || !strings.Contains(attrs[0], "SameSite=Lax") ||
		!strings.Contains(attrs[0], "Path=/console/") || strings.Contains(attrs[0], token) {
		t.Errorf("session cookie %q: want HttpOnly, SameSite=Lax, Path=/console/, without the token", attrs)
	}
	if code, _, _ := b.do("GET", "/console/groups", nil); code != http.StatusOK {
		t.Errorf("with the session: %d", code)
	}

	// A tampered cookie is no session.
	tampered := e.browser()
	tampered.c.Jar.SetCookies(u, []*http.Cookie{{Name: "outbox_console", Value: session.Value + "0", Path: "/console/"}})
	if code, _, _ := tampered.do("GET", "/console/groups", nil); code != http.StatusSeeOther {
		t.Errorf("a tampered session: %d, want a redirect to log in", code)
	}
	// Removing the token ends its sessions.
	if err := e.tokens.Replace(map[string]access.Token{"other": {Value: "another-token-0123456789", Role: access.Viewer}}); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := b.do("GET", "/console/groups", nil); code != http.StatusSeeOther {
		t.Errorf("after the token was removed: %d, want a redirect to log in", code)
	}
}

// A change needs the session's CSRF token and the console's origin; a
// cross-site POST, or one without the token, changes nothing.
func TestConsoleRefusesCrossSiteChanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.deadLetter("hooks", "k1", `{"order":1}`, "HTTP 400")
	b := e.loggedIn()
	path := "/console/dead-letters/" + strconv.FormatInt(id, 10) + "/replay"
	before := e.snapshot()
	for _, c := range []struct {
		name   string
		form   url.Values
		header []string
	}{
		{"no CSRF token", url.Values{}, []string{"Origin", e.srv.URL}},
		{"a wrong CSRF token", url.Values{"csrf": {strings.Repeat("0", 64)}}, []string{"Origin", e.srv.URL}},
		{"another site's origin", url.Values{"csrf": {b.csrf}}, []string{"Origin", "https://evil.example"}},
		{"a cross-site fetch", url.Values{"csrf": {b.csrf}}, []string{"Sec-Fetch-Site", "cross-site"}},
		{"a sibling subdomain", url.Values{"csrf": {b.csrf}}, []string{"Sec-Fetch-Site", "same-site", "Origin", "https://docs.relay.example"}},
		{"an opaque origin", url.Values{"csrf": {b.csrf}}, []string{"Origin", "null"}},
	} {
		if code, _, _ := b.do("POST", path, c.form, c.header...); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", c.name, code)
		}
	}
	if e.snapshot() != before {
		t.Fatal("a refused change changed the tables")
	}
	// Behind a proxy that rewrites Host, the browser's origin is not the
	// Host the console sees, but the browser says the form is its own.
	code, _, body := b.do("POST", path, url.Values{"csrf": {b.csrf}, "why": {"fixed"}},
		"Origin", "https://relay.example", "Sec-Fetch-Site", "same-origin")
	if code != http.StatusOK || !strings.Contains(body, "replayed 1 row") {
		t.Fatalf("replay through a proxy: %d\n%s", code, body)
	}
	if st := e.status(id); st != "pending" {
		t.Fatalf("row %d is %s after the replay, want pending", id, st)
	}
}

// Failure groups: listed, a dry run shown before acting, then replayed or
// discarded whole, each recorded with the console's token.
func TestConsoleFailureGroups(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.deadLetter("hooks", "k1", `{"order":17}`, "HTTP 400: order 17 has no 'amount'")
	b2 := e.deadLetter("hooks", "k2", `{"order":18}`, "HTTP 400: order 18 has no 'currency'")
	odd := e.deadLetter("hooks", "k3", `{"order":19}`, "HTTP 413: too large")
	b := e.loggedIn()
	code, _, page := b.do("GET", "/console/groups", nil)
	if code != 200 || !strings.Contains(page, "HTTP &lt;n&gt;: order &lt;n&gt; has no &lt;q&gt;") || !strings.Contains(page, "2 groups") {
		t.Fatalf("groups page: %d\n%s", code, page)
	}
	id := regexp.MustCompile(`id="group-([0-9a-f]{12})"`).FindStringSubmatch(page)[1]

	// The groups page's filter goes on to the confirm page and the action.
	before := e.snapshot()
	code, _, confirm := b.do("GET", "/console/groups/"+id+"/replay?key=k1", nil)
	if code != 200 || !strings.Contains(confirm, `<strong id="dry-run-count">1</strong>`) || !strings.Contains(confirm, `name="key" value="k1"`) {
		t.Fatalf("confirm page with a filter: %d\n%s", code, confirm)
	}
	code, _, confirm = b.do("GET", "/console/groups/"+id+"/replay", nil)
	if code != 200 || !strings.Contains(confirm, `<strong id="dry-run-count">2</strong>`) {
		t.Fatalf("confirm page: %d\n%s", code, confirm)
	}
	if e.snapshot() != before {
		t.Fatal("the dry run changed the tables")
	}
	if code, body := b.post("/console/groups/"+id+"/replay", url.Values{"why": {"hook fixed"}}); code != 200 || !strings.Contains(body, "replayed 2 rows") {
		t.Fatalf("replay: %d\n%s", code, body)
	}
	if e.status(a) != "pending" || e.status(b2) != "pending" || e.status(odd) != "dead_lettered" {
		t.Fatalf("after the replay: %s %s %s, want the group's two rows pending", e.status(a), e.status(b2), e.status(odd))
	}
	var actor, source, credential string
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT actor, source, credential FROM outbox_audit`).Scan(&actor, &source, &credential); err != nil {
		t.Fatal(err)
	}
	if actor != "ops" || source != "console" || credential != "ops" {
		t.Errorf("audit: %s %s %s, want ops through the console", actor, source, credential)
	}

	// Discarding needs a reason; a group that is gone is a 404.
	_, _, page = b.do("GET", "/console/groups", nil)
	other := regexp.MustCompile(`id="group-([0-9a-f]{12})"`).FindStringSubmatch(page)[1]
	before = e.snapshot()
	if code, body := b.post("/console/groups/"+other+"/discard", nil); code != http.StatusBadRequest || !strings.Contains(body, "say why") {
		t.Errorf("discard without a reason: %d\n%s", code, body)
	}
	if code, _, _ := b.do("GET", "/console/groups/"+id+"/replay", nil); code != http.StatusNotFound {
		t.Errorf("the replayed group: %d, want 404", code)
	}
	if code, _, _ := b.do("GET", "/console/groups/nothex/replay", nil); code != http.StatusBadRequest {
		t.Errorf("a bad group id: %d, want 400", code)
	}
	if e.snapshot() != before {
		t.Fatal("a refused action changed the tables")
	}
	if code, body := b.post("/console/groups/"+other+"/discard", url.Values{"why": {"test traffic"}}); code != 200 || !strings.Contains(body, "discarded 1 row") {
		t.Fatalf("discard: %d\n%s", code, body)
	}
	if st := e.status(odd); st != "discarded" {
		t.Fatalf("row %d is %s, want discarded", odd, st)
	}
}

// A row's page shows it; an edit is previewed as a diff, changing nothing,
// then saved and replayed; a bad edit changes nothing and says why.
func TestConsoleEditRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.deadLetter("hooks", "k1", `{"order":17,"currency":"eur"}`, "HTTP 422: currency 'eur' unknown")
	b := e.loggedIn()
	row := "/console/dead-letters/" + strconv.FormatInt(id, 10)
	code, _, page := b.do("GET", row, nil)
	for _, want := range []string{"&#34;currency&#34;: &#34;eur&#34;", "content-type", "HTTP 422: currency &#39;eur&#39; unknown", "No operator action yet"} {
		if code != 200 || !strings.Contains(page, want) {
			t.Fatalf("row page: %d, want %q in\n%s", code, want, page)
		}
	}
	before := e.snapshot()
	edited := "{\n  \"order\": 17,\n  \"currency\": \"EUR\"\n}"
	form := url.Values{"topic": {"orders"}, "headers": {"{\n  \"content-type\": \"application/json\"\n}"}, "payload": {edited}, "why": {"currency fixed"}}
	code, preview := b.post(row+"/preview", form)
	if code != 200 || !strings.Contains(preview, `-  &#34;currency&#34;: &#34;eur&#34;`) || !strings.Contains(preview, `&#43;  &#34;currency&#34;: &#34;EUR&#34;`) ||
		strings.Contains(preview, "headers (now)") {
		t.Fatalf("preview: %d, want the payload's diff alone\n%s", code, preview)
	}
	if e.snapshot() != before {
		t.Fatal("the preview changed the tables")
	}
	bad := url.Values{"topic": {"orders"}, "headers": {`{"n": 1}`}, "payload": {edited}}
	if code, body := b.post(row+"/edit", bad); code != http.StatusBadRequest || !strings.Contains(body, "headers") {
		t.Errorf("headers that are not strings: %d\n%s", code, body)
	}
	if code, body := b.post(row+"/edit", url.Values{"topic": {"orders"}, "headers": {"{\n  \"content-type\": \"application/json\"\n}"}, "payload": {"{\n  \"order\": 17,\n  \"currency\": \"eur\"\n}"}}); code != http.StatusBadRequest || !strings.Contains(body, "changes nothing") {
		t.Errorf("an edit that changes nothing: %d\n%s", code, body)
	}
	if e.snapshot() != before {
		t.Fatal("a refused edit changed the tables")
	}
	// As a browser sends a text area: CRLF line breaks, stored as LF.
	form.Set("payload", strings.ReplaceAll(edited, "\n", "\r\n"))
	form.Set("headers", strings.ReplaceAll(form.Get("headers"), "\n", "\r\n"))
	if code, body := b.post(row+"/edit", form); code != 200 || !strings.Contains(body, "edited and replayed 1 row") {
		t.Fatalf("edit: %d\n%s", code, body)
	}
	var payload, status string
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT convert_from(payload, 'UTF8'), status FROM outbox WHERE id = $1`, id).Scan(&payload, &status); err != nil {
		t.Fatal(err)
	}
	if payload != edited || status != "pending" {
		t.Fatalf("after the edit: %s %q", status, payload)
	}
	if code, _, page := b.do("GET", "/console/audit?row="+strconv.FormatInt(id, 10), nil); code != 200 || !strings.Contains(page, "currency fixed") {
		t.Errorf("audit of the row: %d\n%s", code, page)
	}

	// A binary payload is not edited through a form; a field the form does
	// not carry stays as it was.
	bin := e.deadLetter("hooks", "k2", "\x00\x01\x02", "HTTP 415")
	before = e.snapshot()
	if code, body := b.post("/console/dead-letters/"+strconv.FormatInt(bin, 10)+"/edit", url.Values{"payload": {"x"}}); code != http.StatusBadRequest || !strings.Contains(body, "binary") {
		t.Errorf("editing a binary payload: %d\n%s", code, body)
	}
	if e.snapshot() != before {
		t.Fatal("a refused edit changed the tables")
	}
	text := e.deadLetter("hooks", "k3", "plain text", "HTTP 400")
	if code, body := b.post("/console/dead-letters/"+strconv.FormatInt(text, 10)+"/edit", url.Values{"topic": {"orders.v2"}}); code != 200 {
		t.Fatalf("a topic alone: %d\n%s", code, body)
	}
	var topic string
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT topic, convert_from(payload, 'UTF8') FROM outbox WHERE id = $1`, text).Scan(&topic, &payload); err != nil {
		t.Fatal(err)
	}
	if topic != "orders.v2" || payload != "plain text" {
		t.Fatalf("after a topic alone: %s %q, want the payload as it was", topic, payload)
	}
}

// Two operators edit one row: the second one's preview was made from the
// row before the first one's edit, so saving it changes nothing and says
// so, as does a preview from the row's page as it was.
func TestConsoleEditFromAChangedRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.deadLetter("hooks", "k1", `{"order":17,"currency":"eur"}`, "HTTP 422: currency 'eur' unknown")
	row := "/console/dead-letters/" + strconv.FormatInt(id, 10)
	version := regexp.MustCompile(`name="version" value="([0-9a-f]+)"`)
	ann, bob := e.loggedIn(), e.loggedIn()
	_, _, annPage := ann.do("GET", row, nil)
	_, _, bobPage := bob.do("GET", row, nil)
	opened := version.FindStringSubmatch(bobPage)
	if opened == nil || version.FindStringSubmatch(annPage)[1] != opened[1] {
		t.Fatalf("the row's page carries no version:\n%s", bobPage)
	}
	form := func(payload string) url.Values {
		return url.Values{"version": {opened[1]}, "topic": {"orders"}, "payload": {payload}, "why": {"currency fixed"}}
	}
	code, preview := bob.post(row+"/preview", form(`{"order":17,"currency":"EUR"}`))
	if m := version.FindStringSubmatch(preview); code != 200 || m == nil || m[1] != opened[1] {
		t.Fatalf("Bob's preview: %d, want the version it was made from\n%s", code, preview)
	}
	// Ann edits first; the row fails again at the destination.
	if code, body := ann.post(row+"/edit", form(`{"order":17,"currency":"GBP"}`)); code != 200 {
		t.Fatalf("Ann's edit: %d\n%s", code, body)
	}
	if _, err := e.s.Pool.Exec(context.Background(), `UPDATE outbox SET status = 'dead_lettered', dead_lettered_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	before := e.snapshot()
	if code, body := bob.post(row+"/edit", form(`{"order":17,"currency":"EUR"}`)); code != http.StatusConflict || !strings.Contains(body, "changed since it was read") {
		t.Errorf("Bob saves his preview: %d, want 409\n%s", code, body)
	}
	// Had Bob made Ann's change too, his save would change nothing: it
	// still says why, not that the edit is empty.
	if code, body := bob.post(row+"/edit", form("{\n  \"order\": 17,\n  \"currency\": \"GBP\"\n}")); code != http.StatusConflict || !strings.Contains(body, "open it again") {
		t.Errorf("Bob saves Ann's change: %d, want 409\n%s", code, body)
	}
	if code, body := bob.post(row+"/preview", form(`{"order":17,"currency":"USD"}`)); code != http.StatusConflict || !strings.Contains(body, "open it again") {
		t.Errorf("Bob previews from the page as it was: %d, want 409\n%s", code, body)
	}
	if e.snapshot() != before {
		t.Fatal("an edit from a changed row changed the tables")
	}
	// Opened again, the row's page shows Ann's edit, and an edit from it applies.
	_, _, bobPage = bob.do("GET", row, nil)
	if !strings.Contains(bobPage, "GBP") {
		t.Fatalf("the row's page after Ann's edit:\n%s", bobPage)
	}
	opened = version.FindStringSubmatch(bobPage)
	if code, body := bob.post(row+"/edit", form(`{"order":17,"currency":"EUR"}`)); code != 200 || !strings.Contains(body, "edited and replayed 1 row") {
		t.Fatalf("Bob's edit from the row as it is: %d\n%s", code, body)
	}
}

// The other pages: the overview (live state), lists with filters, parked
// keys and their release, and clear messages for bad input.
func TestConsolePages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.deadLetter("hooks", "customer-7", `{"order":1}`, "HTTP 400")
	if _, err := e.s.Pool.Exec(context.Background(), `UPDATE outbox SET key_parked = true WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	b := e.loggedIn()
	for path, want := range map[string][]string{
		"/console/": {"hooks", "open", "HTTP 503 from hooks", "orders (open)", ">12<", ">4<"},
		"/console/live": {`id="live"`, "hooks", "Capture from the log", "outbox_public_0a1b2c3d", ">unreserved<", "5.0 MiB", "0/16B3748", "stands by",
			"is lost: see docs/capture.md"},
		"/console/dead-letters?key=customer-7":  {"customer-7", "parks key"},
		"/console/dead-letters?key=nobody":      {"No dead letters match"},
		"/console/parked-keys":                  {"customer-7", "Release"},
		"/console/audit":                        {"Nothing recorded"},
		"/console/dead-letters?since=yesterday": {"since: time"},
		"/console/dead-letters?reason=bogus":    {"not a dead-letter reason"},
		"/console/dead-letters/999999":          {"Not found"},
		"/console/groups?outbox=elsewhere":      {"no outbox"},
		"/console/nothing-here":                 {"No such page"},
	} {
		_, _, body := b.do("GET", path, nil)
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: no %q in\n%s", path, w, body)
			}
		}
	}
	// A row discarded needs a reason.
	before := e.snapshot()
	if code, body := b.post("/console/dead-letters/"+strconv.FormatInt(id, 10)+"/discard", nil); code != http.StatusBadRequest || !strings.Contains(body, "say why") {
		t.Errorf("discard without a reason: %d\n%s", code, body)
	}
	if code, _ := b.post("/console/dead-letters/"+strconv.FormatInt(id, 10)+"/delete", url.Values{"why": {"x"}}); code != http.StatusNotFound {
		t.Errorf("an unknown action: %d, want 404", code)
	}
	if e.snapshot() != before {
		t.Fatal("a refused action changed the tables")
	}
	if code, body := b.post("/console/parked-keys/release", url.Values{"key": {"customer-7"}, "why": {"let go"}}); code != 200 || !strings.Contains(body, "released") {
		t.Fatalf("release: %d\n%s", code, body)
	}
	var parked bool
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT key_parked FROM outbox WHERE id = $1`, id).Scan(&parked); err != nil || parked {
		t.Fatalf("after the release the key is parked: %v %v", parked, err)
	}
	// After logging in, only a page of the console.
	for next, want := range map[string]string{
		"/console/audit?row=1": "/console/audit?row=1", "//evil.example/console/": "/console/",
		"/console/../metrics": "/console/", "https://evil.example/console/": "/console/", "/console\\evil": "/console/",
	} {
		if _, loc, _ := b.do("GET", "/console/login?next="+url.QueryEscape(next), nil); loc != want {
			t.Errorf("login with next %q goes to %q, want %q", next, loc, want)
		}
	}
	if code, _, _ := b.do("POST", "/console/logout", url.Values{"csrf": {b.csrf}}, "Origin", e.srv.URL); code != http.StatusSeeOther {
		t.Errorf("logout: %d", code)
	}
	if code, _, _ := b.do("GET", "/console/", nil); code != http.StatusSeeOther {
		t.Errorf("after logging out: %d, want a redirect to log in", code)
	}
}

// The pages offer every action on a selection, from the action table:
// reroute with its own field.
func TestConsoleOffersEveryActionOnASelection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.deadLetter("hooks", "k1", `{"order":1}`, "HTTP 404: no such topic")
	b := e.loggedIn()
	_, _, groups := b.do("GET", "/console/groups", nil)
	group := regexp.MustCompile(`id="group-([0-9a-f]{12})"`).FindStringSubmatch(groups)[1]
	row := "/console/dead-letters/" + strconv.FormatInt(id, 10)
	_, _, letter := b.do("GET", row, nil)
	for _, a := range deadletter.SelectionActions() {
		if !strings.Contains(groups, "/console/groups/"+group+"/"+a.Name+"?") {
			t.Errorf("the groups page has no %s", a.Name)
		}
		if !strings.Contains(letter, `action="`+row+"/"+a.Name+`"`) {
			t.Errorf("the row's page has no %s form", a.Name)
		}
		code, _, confirm := b.do("GET", "/console/groups/"+group+"/"+a.Name, nil)
		if code != 200 || !strings.Contains(confirm, `<strong id="dry-run-count">1</strong>`) {
			t.Errorf("%s's confirm page: %d\n%s", a.Name, code, confirm)
		}
		for _, in := range a.Inputs {
			if !strings.Contains(confirm, `name="`+in.Name+`"`) || !strings.Contains(letter, `name="`+in.Name+`"`) {
				t.Errorf("%s's forms have no field %s", a.Name, in.Name)
			}
		}
	}
	before := e.snapshot()
	if code, body := b.post(row+"/reroute", url.Values{"why": {"renamed"}}); code != http.StatusBadRequest || !strings.Contains(body, "needs to") {
		t.Errorf("reroute without a topic: %d\n%s", code, body)
	}
	if e.snapshot() != before {
		t.Fatal("a refused reroute changed the tables")
	}
	if code, body := b.post(row+"/reroute", url.Values{"to": {"orders.v2"}, "why": {"renamed"}}); code != 200 || !strings.Contains(body, "rerouted 1 row") {
		t.Fatalf("reroute: %d\n%s", code, body)
	}
	var topic string
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT topic FROM outbox WHERE id = $1`, id).Scan(&topic); err != nil {
		t.Fatal(err)
	}
	if e.status(id) != "pending" || topic != "orders.v2" {
		t.Errorf("row %d after the reroute: %s, topic %s", id, e.status(id), topic)
	}
}
