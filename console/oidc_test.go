package console_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/console"
	"github.com/outbox-relay/outbox-relay/internal/dev/oidctest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

const (
	clientID     = "outbox-console"
	clientSecret = "console-client-secret-0123456789"
)

// The provider's people: a viewer, an operator (in the viewers' group
// too), and one whose group has no role.
var (
	vera = oidctest.User{ID: "u-vera-1001", Username: "vera", Password: "vera-password", Groups: []string{"relay-viewers"}}
	otto = oidctest.User{ID: "u-otto-1002", Username: "otto", Password: "otto-password", Groups: []string{"relay-viewers", "relay-operators"}}
	nils = oidctest.User{ID: "u-nils-1003", Username: "nils", Password: "nils-password", Groups: []string{"finance"}}
)

// sso is a console with single sign-on at a provider of its own.
type sso struct {
	*env
	idp    *oidctest.Provider
	secret *atomic.Value // the client secret the console gives
}

// oidcOf configures single sign-on at idp for the console of e.
func oidcOf(t testing.TB, e *env, idp *oidctest.Provider, secret *atomic.Value) *console.OIDC {
	t.Helper()
	sessions, err := console.NewSessions(e.s.Pool, e.s.Name)
	if err != nil {
		t.Fatal(err)
	}
	return &console.OIDC{Issuer: idp.Issuer, ClientID: clientID, RedirectURL: e.srv.URL + "/console/oidc/callback",
		ClientSecret: func() (string, error) { return secret.Load().(string), nil },
		GroupRoles:   map[string]access.Role{"relay-viewers": access.Viewer, "relay-operators": access.Operator},
		Name:         "Example ID", Sessions: sessions}
}

func newSSO(t *testing.T, opts oidctest.Options, more ...func(*console.Config)) *sso {
	t.Helper()
	idp := oidctest.Listen(t)
	secret := &atomic.Value{}
	secret.Store(clientSecret)
	e := newEnv(t, func(e *env, cfg *console.Config) {
		cfg.OIDC = oidcOf(t, e, idp, secret)
		for _, m := range more {
			m(cfg)
		}
		idp.Start(t, clientID, clientSecret, cfg.OIDC.RedirectURL, opts, vera, otto, nils)
	})
	return &sso{env: e, idp: idp, secret: secret}
}

var idpRequest = regexp.MustCompile(`name="id" value="([^"]+)"`)

// signIn signs b in at the provider as u, from the console's login page's
// link, following every redirect, and returns the last answer's status
// and body.
func (s *sso) signIn(b *browser, u oidctest.User) (int, string) {
	s.t.Helper()
	return s.signInAnd(b, u, func() {})
}

// signInAnd signs in as signIn does, calling atProvider while the browser
// is at the provider's login page.
func (s *sso) signInAnd(b *browser, u oidctest.User, atProvider func()) (int, string) {
	s.t.Helper()
	// (A browser signed in already is sent on from the login page.)
	code, _, login := b.do("GET", "/console/login?next=/console/groups", nil)
	if code != http.StatusSeeOther && (!strings.Contains(login, `href="/console/oidc/start?next=%2fconsole%2fgroups"`) || !strings.Contains(login, "Sign in with Example ID")) {
		s.t.Fatalf("the login page has no sign-in link:\n%s", login)
	}
	follow := &http.Client{Jar: b.c.Jar}
	res, err := follow.Get(s.srv.URL + "/console/oidc/start?next=/console/groups")
	if err != nil {
		s.t.Fatal(err)
	}
	page := readAll(s.t, res)
	m := idpRequest.FindStringSubmatch(page)
	if m == nil || !strings.HasPrefix(res.Request.URL.String(), s.idp.Issuer+"/login/") {
		s.t.Fatalf("not at the provider's login (%s):\n%s", res.Request.URL, page)
	}
	atProvider()
	res, err = follow.PostForm(s.idp.Issuer+"/login/username", url.Values{"id": {m[1]}, "username": {u.Username}, "password": {u.Password}})
	if err != nil {
		s.t.Fatal(err)
	}
	body := readAll(s.t, res)
	if m := csrfField.FindStringSubmatch(body); m != nil {
		b.csrf = m[1]
	}
	return res.StatusCode, body
}

func readAll(t testing.TB, res *http.Response) string {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// People sign in through the provider with the greatest role of their
// groups; the audit names them and their subject at the provider. Whoever
// has no mapped group is not let in, and is told which groups they have.
func TestSignInThroughTheProvider(t *testing.T) {
	t.Parallel()
	s := newSSO(t, oidctest.Options{})
	id := s.deadLetter("hooks", "customer-9", `{"order":9}`, "HTTP 400: order 9 has no 'amount'")

	viewer := s.browser()
	code, page := s.signIn(viewer, vera)
	if code != http.StatusOK || !strings.Contains(page, "Failure groups") || !strings.Contains(page, "vera") {
		t.Fatalf("vera after signing in: %d\n%s", code, page)
	}
	before := s.snapshot()
	if code, body := viewer.post("/console/dead-letters/"+strconv.FormatInt(id, 10)+"/replay", nil); code != http.StatusForbidden ||
		!strings.Contains(body, "this needs the operator role; vera has viewer") {
		t.Fatalf("a viewer's replay: %d\n%s", code, body)
	}
	if s.snapshot() != before {
		t.Fatal("a refused replay changed the table")
	}

	operator := s.browser()
	if code, page := s.signIn(operator, otto); code != http.StatusOK || !strings.Contains(page, "otto") {
		t.Fatalf("otto after signing in: %d\n%s", code, page)
	}
	if code, body := operator.post("/console/dead-letters/"+strconv.FormatInt(id, 10)+"/replay", url.Values{"reason": {"amount added upstream"}}); code != http.StatusOK ||
		!strings.Contains(body, "replayed 1 row") {
		t.Fatalf("an operator's replay: %d\n%s", code, body)
	}
	if st := s.status(id); st != "pending" {
		t.Fatalf("row %d is %s after the replay, want pending", id, st)
	}
	var actor, source, credential, role string
	if err := s.s.Pool.QueryRow(context.Background(), `SELECT actor, source, credential, role FROM outbox_audit ORDER BY id DESC LIMIT 1`).
		Scan(&actor, &source, &credential, &role); err != nil {
		t.Fatal(err)
	}
	if actor != "otto" || source != "sso" || credential != s.idp.Issuer+"|"+otto.ID || role != "operator" {
		t.Fatalf("audit: %s %s %s %s", actor, source, credential, role)
	}

	outsider := s.browser()
	code, page = s.signIn(outsider, nils)
	if code != http.StatusForbidden || !strings.Contains(page, "nils signed in, but none of their groups is given a role") ||
		!strings.Contains(page, "finance") {
		t.Fatalf("nils: %d\n%s", code, page)
	}
	if code, loc, _ := outsider.do("GET", "/console/groups", nil); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/console/login") {
		t.Fatalf("nils has a session: %d %s", code, loc)
	}
}

// Providers that keep groups and names to the userinfo endpoint work the
// same.
func TestSignInWithGroupsAtUserinfo(t *testing.T) {
	t.Parallel()
	s := newSSO(t, oidctest.Options{GroupsAtUserinfo: true})
	b := s.browser()
	if code, page := s.signIn(b, otto); code != http.StatusOK || !strings.Contains(page, "otto") || !strings.Contains(page, "operator") {
		t.Fatalf("otto: %d\n%s", code, page)
	}
}

// A provider whose userinfo endpoint fails: the ID token's groups and name
// are enough; without groups in the ID token, the sign-in fails, saying
// why.
func TestSignInWithUserinfoDown(t *testing.T) {
	t.Parallel()
	s := newSSO(t, oidctest.Options{UserinfoDown: true})
	if code, page := s.signIn(s.browser(), otto); code != http.StatusOK || !strings.Contains(page, "otto") {
		t.Fatalf("otto, with the groups in the ID token: %d\n%s", code, page)
	}
	s = newSSO(t, oidctest.Options{UserinfoDown: true, GroupsAtUserinfo: true})
	if code, page := s.signIn(s.browser(), otto); code != http.StatusBadGateway ||
		!strings.Contains(page, `the ID token has no &#34;groups&#34; claim, and the userinfo endpoint failed`) {
		t.Fatalf("otto, with the groups at the userinfo endpoint only: %d\n%s", code, page)
	}
}

// The session keeps the person's groups, and every request maps them with
// the mapping in force: a replica started with another mapping gives the
// same session another role, or none.
func TestChangedMappingAppliesAtOnce(t *testing.T) {
	t.Parallel()
	s := newSSO(t, oidctest.Options{})
	b := s.browser()
	if code, page := s.signIn(b, otto); code != http.StatusOK || !strings.Contains(page, "operator") {
		t.Fatalf("otto: %d\n%s", code, page)
	}
	replica := func(roles map[string]access.Role) *browser {
		other := newEnv(t, func(e *env, cfg *console.Config) {
			e.s = s.s
			cfg.OIDC = oidcOf(t, e, s.idp, s.secret)
			cfg.OIDC.GroupRoles = roles
		})
		return copyTo(t, b, s.env, other)
	}
	demoted := replica(map[string]access.Role{"relay-viewers": access.Viewer, "relay-operators": access.Viewer})
	if code, _, page := demoted.do("GET", "/console/groups", nil); code != http.StatusOK || !strings.Contains(page, `otto <small class="tag">viewer</small>`) {
		t.Fatalf("with the operators mapped to viewer: %d\n%s", code, page)
	}
	gone := replica(map[string]access.Role{"finance": access.Operator})
	if code, loc, _ := gone.do("GET", "/console/groups", nil); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/console/login") {
		t.Fatalf("with no group of otto's mapped: %d %s", code, loc)
	}
}

// copyTo is a browser on the console of to with b's cookies for from.
func copyTo(t *testing.T, b *browser, from, to *env) *browser {
	t.Helper()
	u, _ := url.Parse(from.srv.URL + "/console/")
	jar, _ := cookiejar.New(nil)
	tu, _ := url.Parse(to.srv.URL + "/console/")
	jar.SetCookies(tu, b.c.Jar.Cookies(u))
	return &browser{e: to, c: &http.Client{Jar: jar, CheckRedirect: b.c.CheckRedirect}}
}

// Signing out ends the session on every replica: the sessions are in the
// database, and a copy of the cookie is refused once it is signed out.
func TestSignOutEndsTheSessionEverywhere(t *testing.T) {
	t.Parallel()
	s := newSSO(t, oidctest.Options{})
	b := s.browser()
	if code, page := s.signIn(b, vera); code != http.StatusOK {
		t.Fatalf("vera: %d\n%s", code, page)
	}
	// A second replica: another console on the same database.
	other := newEnv(t, func(e *env, cfg *console.Config) {
		e.s = s.s
		cfg.OIDC = oidcOf(t, e, s.idp, s.secret)
		cfg.OIDC.RedirectURL = s.srv.URL + "/console/oidc/callback"
	})
	copied := copyTo(t, b, s.env, other)
	if code, _, page := copied.do("GET", "/console/groups", nil); code != http.StatusOK || !strings.Contains(page, "vera") {
		t.Fatalf("the other replica refuses the session: %d\n%s", code, page)
	}
	// Signing in again gives a new session and ends the one before.
	before := copyTo(t, b, s.env, s.env)
	if code, page := s.signIn(b, vera); code != http.StatusOK {
		t.Fatalf("vera again: %d\n%s", code, page)
	}
	if code, loc, _ := before.do("GET", "/console/groups", nil); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/console/login") {
		t.Fatalf("the session before signing in again still works: %d %s", code, loc)
	}
	copied = copyTo(t, b, s.env, other)
	if code, _ := b.post("/console/logout", nil); code != http.StatusSeeOther {
		t.Fatalf("sign out: %d", code)
	}
	if code, loc, _ := copied.do("GET", "/console/groups", nil); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/console/login") {
		t.Fatalf("a copy of the signed-out cookie still works: %d %s", code, loc)
	}
}

// The client secret is read at each sign-in: a wrong one fails the
// exchange with the provider's reason, and the next, right, one signs in.
// A callback that this browser did not start is refused.
func TestSignInFailures(t *testing.T) {
	t.Parallel()
	s := newSSO(t, oidctest.Options{})
	s.secret.Store("a-rotated-away-secret-0123456789")
	b := s.browser()
	if code, page := s.signIn(b, otto); code != http.StatusBadGateway || !strings.Contains(page, "the code was not exchanged") {
		t.Fatalf("with a wrong secret: %d\n%s", code, page)
	}
	s.secret.Store("") // a secret file emptied in a rotation
	if code, page := s.signIn(b, otto); code != http.StatusBadGateway || !strings.Contains(page, "the client secret cannot be read") {
		t.Fatalf("with an empty secret: %d\n%s", code, page)
	}
	s.secret.Store(clientSecret)
	if code, page := s.signIn(b, otto); code != http.StatusOK {
		t.Fatalf("with the right secret: %d\n%s", code, page)
	}
	// The sign-in's nonce changed in the browser, as if the code came
	// from another sign-in: the ID token is not taken.
	tampered := s.browser()
	code, page := s.signInAnd(tampered, otto, func() {
		u, _ := url.Parse(s.srv.URL + "/console/oidc/")
		for _, c := range tampered.c.Jar.Cookies(u) {
			if c.Name == "outbox_console_oidc" {
				parts := strings.Split(c.Value, ".")
				parts[1] = "another-sign-ins-nonce"
				tampered.c.Jar.SetCookies(u, []*http.Cookie{{Name: c.Name, Value: strings.Join(parts, "."), Path: "/console/oidc/"}})
				return
			}
		}
		t.Fatal("no sign-in cookie")
	})
	if code != http.StatusBadGateway || !strings.Contains(page, "nonce mismatch") {
		t.Fatalf("with another nonce: %d\n%s", code, page)
	}
	// A callback with another state than the browser's sign-in.
	started := s.browser()
	if code, _, _ := started.do("GET", "/console/oidc/start", nil); code != http.StatusSeeOther {
		t.Fatalf("start: %d", code)
	}
	if code, _, page := started.do("GET", "/console/oidc/callback?code=abc&state=not-this-sign-ins", nil); code != http.StatusBadRequest ||
		!strings.Contains(page, "not started here") {
		t.Fatalf("a callback with another state: %d\n%s", code, page)
	}
	stranger := s.browser()
	if code, _, page := stranger.do("GET", "/console/oidc/callback?code=abc&state=def", nil); code != http.StatusBadRequest ||
		!strings.Contains(page, "not started here") {
		t.Fatalf("a callback not started here: %d\n%s", code, page)
	}
}

// With token login off, tokens open the API only: the login form is gone
// and a token given anyway is refused.
func TestTokenLoginOff(t *testing.T) {
	t.Parallel()
	s := newSSO(t, oidctest.Options{}, func(cfg *console.Config) { cfg.NoTokenLogin = true })
	b := s.browser()
	_, _, page := b.do("GET", "/console/login", nil)
	if strings.Contains(page, `name="token"`) || !strings.Contains(page, "Sign in with Example ID") {
		t.Fatalf("login page with token login off:\n%s", page)
	}
	u, _ := url.Parse(s.srv.URL + "/console/")
	var nonce string
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "outbox_console_login" {
			nonce = c.Value
		}
	}
	if code, _, page := b.do("POST", "/console/login", url.Values{"nonce": {nonce}, "token": {token}}, "Origin", s.srv.URL); code != http.StatusForbidden ||
		!strings.Contains(page, "Tokens do not sign in to this console") {
		t.Fatalf("a token login: %d\n%s", code, page)
	}
	if code, page := s.signIn(b, vera); code != http.StatusOK {
		t.Fatalf("vera: %d\n%s", code, page)
	}
}

// A provider that is away when the first sign-in starts: the page says so,
// the failure stands a few seconds rather than being asked anew at each
// attempt, and sign-ins work once it is back.
func TestProviderBack(t *testing.T) {
	t.Parallel()
	s := newSSO(t, oidctest.Options{})
	s.idp.Down()
	b := s.browser()
	if code, _, page := b.do("GET", "/console/oidc/start", nil); code != http.StatusBadGateway || !strings.Contains(page, "cannot be reached") {
		t.Fatalf("with the provider down: %d\n%s", code, page)
	}
	s.idp.Up()
	if code, _, _ := b.do("GET", "/console/oidc/start", nil); code != http.StatusBadGateway {
		t.Fatalf("at once after the provider came back: %d, want the failure standing", code)
	}
	testwait.For(t, "a sign-in to start again", func() bool {
		code, _, _ := b.do("GET", "/console/oidc/start", nil)
		return code == http.StatusSeeOther
	})
	if code, page := s.signIn(b, vera); code != http.StatusOK {
		t.Fatalf("vera: %d\n%s", code, page)
	}
}

// The provider out of reach: the login page says so, and nothing else
// breaks.
func TestProviderAway(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(e *env, cfg *console.Config) {
		sessions, err := console.NewSessions(e.s.Pool, e.s.Name)
		if err != nil {
			t.Fatal(err)
		}
		cfg.OIDC = &console.OIDC{Issuer: "http://127.0.0.1:1", ClientID: clientID, RedirectURL: e.srv.URL + "/console/oidc/callback",
			ClientSecret: func() (string, error) { return "", errors.New("unused") },
			GroupRoles:   map[string]access.Role{"ops": access.Operator}, Sessions: sessions}
	})
	b := e.browser()
	if code, _, page := b.do("GET", "/console/oidc/start", nil); code != http.StatusBadGateway ||
		!strings.Contains(page, "The identity provider at http://127.0.0.1:1 cannot be reached") {
		t.Fatalf("provider away: %d\n%s", code, page)
	}
	if code := b.login(token); code != http.StatusSeeOther {
		t.Fatalf("token login while the provider is away: %d", code)
	}
}
