package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outbox-relay/outbox-relay/internal/dev/oidctest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// Single sign-on in a real browser, through an OpenID Connect provider
// running in the test, to a relay behind a proxy (as behind an ingress):
// a viewer sees no action and no payload, and a replay forged from their
// session (with its CSRF token) is refused; an operator replays a failure
// group, and the audit names them and their subject at the provider.
// Tokens do not sign in to this console; they still open the API.
func TestConsoleSingleSignOnInBrowser(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := newBrowser(t, 1280, 800)
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	const payload = `{"order":31,"card":"4111 1111 1111 1111"}`
	row1 := deadLetter(t, pool, letter{topic: "orders", key: "s1", dest: "kafka", payload: payload, err: "kafka: topic 'orders' partition 1: NOT_LEADER (attempt 9)"})
	row2 := deadLetter(t, pool, letter{topic: "orders", key: "s2", dest: "kafka", payload: `{"order":32}`, err: "kafka: topic 'orders' partition 2: NOT_LEADER (attempt 9)"})
	var groupID string
	if err := pool.QueryRow(context.Background(), `SELECT error_group FROM outbox WHERE id = $1`, row1).Scan(&groupID); err != nil {
		t.Fatal(err)
	}

	// The proxy's address is the console's, for the provider's redirect;
	// it forwards to the relay once the relay is up.
	var target atomic.Pointer[url.URL]
	proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target.Load())
		r.Out.Host = r.In.Host
	}})
	t.Cleanup(proxy.Close)
	const clientID, secret = "outbox-relay-console", "browser-test-client-secret-0123"
	secretFile := filepath.Join(t.TempDir(), "client-secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vera := oidctest.User{ID: "248289761001", Username: "vera", Password: "vera-password", Groups: []string{"relay-viewers"}}
	otto := oidctest.User{ID: "248289761002", Username: "otto", Password: "otto-password", Groups: []string{"relay-viewers", "relay-operators"}}
	idp := oidctest.Listen(t)
	idp.Start(t, clientID, secret, proxy.URL+"/console/oidc/callback", oidctest.Options{}, vera, otto)

	const token = "browser-sso-api-token-0123456789"
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_ADMIN_TOKEN="+token, "OUTBOX_ADMIN_ROLES=admin=operator",
		"OUTBOX_ADMIN_OIDC_ISSUER="+idp.Issuer, "OUTBOX_ADMIN_OIDC_CLIENT_ID="+clientID,
		"OUTBOX_ADMIN_OIDC_CLIENT_SECRET_FILE="+secretFile, "OUTBOX_ADMIN_OIDC_REDIRECT_URL="+proxy.URL+"/console/oidc/callback",
		"OUTBOX_ADMIN_OIDC_GROUP_ROLES=relay-viewers=viewer,relay-operators=operator", "OUTBOX_ADMIN_OIDC_NAME=Example ID",
		"OUTBOX_ADMIN_CONSOLE_TOKEN_LOGIN=false"))
	relayURL, err := url.Parse("http://" + logged(t, p, "admin listener started"))
	if err != nil {
		t.Fatal(err)
	}
	target.Store(relayURL)
	base := proxy.URL

	run, text := steps(ctx, t)
	signIn := func(u oidctest.User) {
		t.Helper()
		run("sign in as "+u.Username,
			chromedp.Navigate(base+"/console/groups"),
			chromedp.WaitVisible(`a[href^="/console/oidc/start"]`),
			chromedp.Click(`a[href^="/console/oidc/start"]`),
			chromedp.WaitVisible(`#username`),
			chromedp.SendKeys(`#username`, u.Username),
			chromedp.SendKeys(`#password`, u.Password),
			chromedp.Click(`button[type=submit]`),
			chromedp.WaitVisible(`#group-`+groupID),
		)
		if who := text(`header .who span`); !strings.Contains(who, u.Username) {
			t.Fatalf("signed in as %q, want %s", who, u.Username)
		}
	}

	// No token form: tokens do not sign in here.
	run("the login page", chromedp.Navigate(base+"/console/login"), chromedp.WaitVisible(`a[href^="/console/oidc/start"]`))
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("input[name=token]").length`)); err != nil || n != 0 {
		t.Fatalf("the login page has %d token fields (%v), want none", n, err)
	}

	// A viewer: the failure groups without actions, a row without its
	// payload.
	signIn(vera)
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("main a.button, main form[method=post]").length`)); err != nil || n != 0 {
		t.Fatalf("the viewer's failure groups offer %d actions (%v), want none", n, err)
	}
	run("a row, as a viewer", chromedp.Navigate(fmt.Sprintf("%s/console/dead-letters/%d", base, row1)), chromedp.WaitVisible(`main`))
	if page := text(`main`); strings.Contains(page, "4111") || !strings.Contains(page, "does not show payloads") {
		t.Fatalf("the viewer's row page:\n%s", page)
	}
	// A replay forged from the viewer's own session, with its CSRF token
	// (from the sign-out form): refused, and the row stays as it was.
	forged, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(async () => {
  const csrf = document.querySelector('form[action="/console/logout"] input[name=csrf]').value;
  const r = await fetch("/console/dead-letters/%d/replay", {method: "POST", body: new URLSearchParams({csrf, why: "forged"})});
  return r.status + " " + await r.text();
})()`, row1), chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(forged, "403 ") || !strings.Contains(forged, "this needs the operator role; vera has viewer") {
		t.Fatalf("the forged replay: %.300s", forged)
	}
	if n := countRows(t, pool, fmt.Sprintf("id = %d AND status = 'dead_lettered'", row1)); n != 1 {
		t.Fatal("the forged replay changed the row")
	}
	run("sign out", chromedp.Navigate(base+"/console/"), chromedp.Click(`form[action="/console/logout"] button`),
		chromedp.WaitVisible(`a[href^="/console/oidc/start"]`))

	// An operator replays the failure group, after its dry run.
	signIn(otto)
	run("dry-run the group", chromedp.Click(`#group-`+groupID+` a.button:not(.danger)`), chromedp.WaitVisible(`#dry-run-count`))
	run("replay the group",
		chromedp.SendKeys(`input[name=why]`, "the leader elections are over"),
		chromedp.Click(`main button[type=submit]`),
		chromedp.WaitVisible(`#result`),
	)
	if result := text(`#result`); !strings.Contains(result, "replayed 2 rows") {
		t.Fatalf("the operator's replay: %q", result)
	}
	testwait.Within(t, 60*time.Second, "the replayed rows delivered", func() bool {
		return countRows(t, pool, fmt.Sprintf("id IN (%d, %d) AND status <> 'sent'", row1, row2)) == 0
	})
	run("the audit trail", chromedp.Navigate(base+"/console/audit"), chromedp.WaitVisible(`main table`))
	if audit := text(`main table`); !strings.Contains(audit, "otto (sso, "+idp.Issuer+"|"+otto.ID+", operator)") {
		t.Fatalf("the audit trail does not name the operator and their subject:\n%s", audit)
	}

	// Tokens still open the API.
	req, _ := http.NewRequest("GET", base+"/api/v1/dead-letters", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("the API with a token: %d", res.StatusCode)
	}
}
