package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/console"
)

// Every page and form of the console, for every role and for no session:
// a request the role does not allow is answered 403 naming the role it
// needs (a page without a session goes to the login, a form is refused
// 401), and changes nothing; one it allows gets past the check. A route
// added without a role fails here.
func TestEveryPageChecksItsRole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	routes := console.Routes()
	if len(routes) < 20 {
		t.Fatalf("%d routes, want every page and form", len(routes))
	}
	browsers := map[access.Role]*browser{0: e.browser(), access.Viewer: e.loggedInWith(viewerToken),
		access.Reader: e.loggedInWith(readerToken), access.Operator: e.loggedIn()}
	// The role each page and form needs, written out here: a route added
	// to the console fails until it is added here too.
	want := map[string]access.Role{
		"GET /login": 0, "POST /login": 0, "GET /oidc/start": 0, "GET /oidc/callback": 0, "POST /logout": access.Viewer,
		"GET /{$}": access.Viewer, "GET /live": access.Viewer, "GET /groups": access.Viewer,
		"GET /groups/{group}/{action}": access.Operator, "POST /groups/{group}/{action}": access.Operator,
		"GET /dead-letters": access.Viewer, "GET /dead-letters/{ref}": access.Viewer,
		"POST /dead-letters/{ref}/preview": access.Operator, "POST /dead-letters/{ref}/edit": access.Operator,
		"POST /dead-letters/{ref}/{action}": access.Operator, "GET /parked-keys": access.Viewer,
		"POST /parked-keys/release": access.Operator, "GET /audit": access.Viewer, "GET /find": access.Viewer,
		"GET /messages/{ref}": access.Viewer, "GET /key": access.Viewer, "GET /destinations/{name}": access.Viewer,
	}
	for _, rt := range routes {
		if w, ok := want[rt.Method+" "+rt.Path]; !ok || rt.Role != w || rt.Public != (w == 0) {
			t.Errorf("%s %s needs %s (public %v), want %s", rt.Method, rt.Path, rt.Role, rt.Public, w)
		}
		delete(want, rt.Method+" "+rt.Path)
	}
	for r := range want {
		t.Errorf("%s is not a page or form", r)
	}
	for _, rt := range routes {
		if rt.Public {
			continue
		}
		for _, role := range append([]access.Role{0}, access.Roles...) {
			name := rt.Method + " " + rt.Path + " as " + role.String()
			id := e.deadLetter("hooks", "k-"+name, `{"n":1}`, "HTTP 422: no amount")
			var group string
			if err := e.s.Pool.QueryRow(context.Background(), `SELECT error_group FROM outbox WHERE id = $1`, id).Scan(&group); err != nil {
				t.Fatal(err)
			}
			path := strings.NewReplacer("{ref}", strconv.FormatInt(id, 10), "{group}", group, "{action}", "replay",
				"{name}", "hooks", "{$}", "").Replace(rt.Path)
			form := url.Values{"why": {"checked"}, "outbox": {"main"}}
			switch {
			case strings.HasSuffix(path, "/edit"), strings.HasSuffix(path, "/preview"):
				form.Set("payload", `{"n":2}`)
				form.Set("headers", `{}`)
				form.Set("topic", "orders")
			case strings.HasSuffix(path, "/release"):
				form.Set("key", "k-"+name)
			case path == "/key":
				path += "?key=k"
			case path == "/find":
				path += "?q=" + strconv.FormatInt(id, 10)
			}
			b := browsers[role]
			if path == "/logout" && role != 0 {
				// Signing out ends the session: a session of its own.
				b = e.loggedInWith(map[access.Role]string{access.Viewer: viewerToken, access.Reader: readerToken, access.Operator: token}[role])
			}
			before := e.snapshot()
			var code int
			var body string
			if rt.Method == http.MethodGet {
				code, _, body = b.do("GET", "/console"+path, nil)
			} else {
				// A session's CSRF token from its overview: the form is
				// the console's own.
				if role != 0 {
					b.do("GET", "/console/", nil)
				}
				code, body = b.post("/console"+path, form)
			}
			switch {
			case role == 0:
				if want := map[string]int{"GET": http.StatusSeeOther, "POST": http.StatusUnauthorized}[rt.Method]; code != want {
					t.Errorf("%s: %d, want %d", name, code, want)
				}
				if after := e.snapshot(); after != before {
					t.Errorf("%s changed the database", name)
				}
			case !role.Allows(rt.Role):
				want := fmt.Sprintf("this needs the %s role; %s has %s", rt.Role, map[access.Role]string{access.Viewer: "watcher", access.Reader: "auditor"}[role], role)
				if code != http.StatusForbidden || !strings.Contains(body, want) {
					t.Errorf("%s: %d, want 403 saying %q:\n%s", name, code, want, body)
				}
				if after := e.snapshot(); after != before {
					t.Errorf("%s changed the database", name)
				}
			default:
				if code == http.StatusUnauthorized || code == http.StatusForbidden || code >= 500 {
					t.Errorf("%s: %d, want it allowed:\n%s", name, code, body)
				}
			}
		}
	}
}

// A viewer's pages offer no action and show no payload; a reader's show
// payloads and no action; an operator's both. The audit trail names the
// role an action was taken with.
func TestViewerPagesOfferNoAction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.deadLetter("hooks", "k1", `{"card":"4111 1111 1111 1111"}`, "HTTP 422: no amount")
	e.deadLetter("hooks", "k2", `{"n":2}`, "HTTP 422: no amount")
	replayForm := fmt.Sprintf(`action="/console/dead-letters/%d/replay"`, id)
	for _, c := range []struct {
		tok               string
		payload, controls bool
	}{{viewerToken, false, false}, {readerToken, true, false}, {token, true, true}} {
		b := e.loggedInWith(c.tok)
		_, _, page := b.do("GET", fmt.Sprintf("/console/dead-letters/%d", id), nil)
		if got := strings.Contains(page, "4111 1111"); got != c.payload {
			t.Errorf("%s: the row's page shows the payload: %v", c.tok, got)
		}
		if !c.payload && !strings.Contains(page, "does not show payloads") {
			t.Errorf("%s: the row's page does not say the payload is hidden", c.tok)
		}
		if got := strings.Contains(page, replayForm) || strings.Contains(page, "Edit and replay"); got != c.controls {
			t.Errorf("%s: the row's page offers actions: %v", c.tok, got)
		}
		_, _, groups := b.do("GET", "/console/groups", nil)
		if got := strings.Contains(groups, "Replay…"); got != c.controls {
			t.Errorf("%s: the failure groups offer actions: %v", c.tok, got)
		}
	}
	b := e.loggedIn()
	b.do("GET", fmt.Sprintf("/console/dead-letters/%d", id), nil)
	if code, body := b.post(fmt.Sprintf("/console/dead-letters/%d/replay", id), url.Values{"outbox": {"main"}, "why": {"fixed"}}); code != http.StatusOK {
		t.Fatalf("the operator's replay: %d\n%s", code, body)
	}
	_, _, audit := e.loggedInWith(viewerToken).do("GET", "/console/audit", nil)
	if !strings.Contains(audit, "(console, ops, operator)") {
		t.Errorf("the audit page does not name the operator's token and role:\n%s", audit)
	}
}
