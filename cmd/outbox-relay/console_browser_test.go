package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// browserPath finds Chromium. Without one the test is skipped, unless
// OUTBOX_TEST_BROWSER is set (make test sets it, after installing one).
func browserPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("OUTBOX_TEST_BROWSER") != "" {
		t.Fatal("no Chromium found: run scripts/ensure-chromium")
	}
	t.Skip("no Chromium found (scripts/ensure-chromium installs it; make test does)")
	return ""
}

// newBrowser starts a headless Chromium of its own.
func newBrowser(t *testing.T, width, height int) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browserPath(t)),
		chromedp.NoSandbox, // tests may run as root
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	ctx, cancelTime := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() { cancelTime(); cancelCtx(); cancelAlloc() })
	return ctx
}

// steps returns the browser's two common steps, failing t: run takes
// actions, text reads an element's text.
func steps(ctx context.Context, t *testing.T) (run func(what string, steps ...chromedp.Action[chromedp.Void]), text func(sel string) string) {
	run = func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text = func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	return run, text
}

// The console in a real browser against a running relay: log in, dry-run
// and replay a failure group, edit a row's payload and replay it, and find
// those rows delivered to the broker; an unauthenticated request and a
// cross-site form change nothing; every page fits a narrow screen.
// Screenshots go to OUTBOX_CONSOLE_SCREENSHOTS when it names a directory.
func TestConsoleInBrowser(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := newBrowser(t, 1280, 800)
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	group1 := deadLetter(t, pool, letter{topic: "orders", key: "c1", dest: "kafka", payload: `{"order":17}`, err: "kafka: topic 'orders' partition 3: NOT_LEADER (attempt 17)"})
	group2 := deadLetter(t, pool, letter{topic: "orders", key: "c2", dest: "kafka", payload: `{"order":18}`, err: "kafka: topic 'orders' partition 5: NOT_LEADER (attempt 18)"})
	edited := deadLetter(t, pool, letter{topic: "orders", key: "c3", dest: "kafka", payload: `{"order":19,"currency":"eur"}`, err: "schema: currency 'eur' unknown"})
	untouched := deadLetter(t, pool, letter{topic: "orders", key: "c4", dest: "kafka", payload: `{"order":20}`, err: "HTTP 400 from the schema registry"})
	var groupID string
	if err := pool.QueryRow(context.Background(), `SELECT error_group FROM outbox WHERE id = $1`, group1).Scan(&groupID); err != nil {
		t.Fatal(err)
	}
	// Event ids to look for: a row in backoff after a failed attempt, a
	// dead letter, and a row that is delivered below (the relay keeps
	// delivered rows here, so it is found as delivered).
	var waitingEvent, deadEvent, deliveredEvent string
	if err := pool.QueryRow(context.Background(), `INSERT INTO outbox (topic, key, payload, retry_count, last_error, next_attempt_at, error_history)
VALUES ('orders', 'c7', '{"order":21}', 1, 'HTTP 503 from the broker', now() + interval '1 hour',
    '[{"at":"2026-11-20T10:00:00Z","attempt":1,"class":"transient","error":"HTTP 503 from the broker"}]') RETURNING event_id::text`).Scan(&waitingEvent); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('orders', 'c7', '{"order":22}')`); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT event_id::text FROM outbox WHERE id = $1), (SELECT event_id::text FROM outbox WHERE id = $2)`,
		untouched, group1).Scan(&deadEvent, &deliveredEvent); err != nil {
		t.Fatal(err)
	}

	const token = "browser-test-token-0123456789"
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_ADMIN_TOKEN="+token, "OUTBOX_ADMIN_ROLES=admin=operator", "OUTBOX_ADMIN_HISTORY_INTERVAL=1s", "OUTBOX_RELAY_SENT_RETENTION=1h"))
	base := "http://" + logged(t, p, "admin listener started")
	shots := os.Getenv("OUTBOX_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, "console-"+name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run, text := steps(ctx, t)

	// Logging in from a page of the console lands on that page.
	run("open the console", chromedp.Navigate(base+"/console/groups"), chromedp.WaitVisible(`input[name=token]`))
	run("log in",
		chromedp.SendKeys(`input[name=token]`, token),
		chromedp.Click(`main button[type=submit]`),
		chromedp.WaitVisible(`#group-`+groupID),
	)
	shot("groups")

	// A dry run first, then the group replayed.
	run("dry-run the group", chromedp.Click(`#group-`+groupID+` a.button:not(.danger)`), chromedp.WaitVisible(`#dry-run-count`))
	dry := text(`#dry-run-count`)
	shot("confirm")
	run("replay the group",
		chromedp.SendKeys(`input[name=why]`, "leader elections are over"),
		chromedp.Click(`main button[type=submit]`),
		chromedp.WaitVisible(`#result`),
	)
	if result := text(`#result`); dry != "2" || !strings.Contains(result, "replayed 2 rows") {
		t.Fatalf("dry run %q, result %q: want 2 rows, replayed", dry, result)
	}

	// A row's payload edited: previewed as a diff, then saved and replayed.
	const newPayload = "{\n  \"order\": 19,\n  \"currency\": \"EUR\"\n}"
	run("open a row", chromedp.Navigate(fmt.Sprintf("%s/console/dead-letters/%d", base, edited)), chromedp.WaitVisible(`textarea[name=payload]`))
	shot("row")
	run("preview an edit",
		chromedp.SetValue(`textarea[name=payload]`, newPayload),
		chromedp.SendKeys(`form.edit input[name=why]`, "currency in capitals"),
		chromedp.Click(`form.edit button[type=submit]`),
		chromedp.WaitVisible(`pre.diff`),
	)
	diff := text(`pre.diff`)
	shot("preview")
	run("save the edit", chromedp.Click(`main button[type=submit]`), chromedp.WaitVisible(`#result`))
	if result := text(`#result`); !strings.Contains(diff, `-  "currency": "eur"`) || !strings.Contains(diff, `+  "currency": "EUR"`) ||
		!strings.Contains(result, "edited and replayed 1 row") {
		t.Fatalf("diff:\n%s\nresult %q", diff, result)
	}

	// The three rows are delivered: gone from the table, and at the broker
	// with the edited payload.
	testwait.Within(t, 60*time.Second, "the replayed rows delivered", func() bool {
		return countRows(t, pool, fmt.Sprintf("id IN (%d, %d, %d) AND status <> 'sent'", group1, group2, edited)) == 0
	})
	recs := kafkatest.Consume(ctx, t, c.ListenAddrs(), "orders", 3)
	payloads := map[string]bool{}
	for _, r := range recs {
		payloads[string(r.Value)] = true
	}
	if len(recs) != 3 || !payloads[`{"order":17}`] || !payloads[`{"order":18}`] || !payloads[newPayload] {
		t.Fatalf("the broker holds %d records: %v", len(recs), payloads)
	}

	// The overview's trends chart those three deliveries, from the
	// history that the relay writes every second here: the steps of the
	// outbox's first chart add up to them.
	charted := func() int {
		t.Helper()
		run("the trends", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(`#trends`))
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`[...document.querySelector("#trends figure.chart").querySelectorAll("rect.step")].reduce((s, r) => s + Number(r.dataset.count), 0)`))
		if err != nil {
			t.Fatalf("the chart's counts: %v", err)
		}
		return n
	}
	testwait.Within(t, 60*time.Second, "the trends to chart the three deliveries", func() bool { return charted() >= 3 })
	if n := charted(); n != 3 {
		t.Errorf("the delivered chart adds up to %d rows, want the 3 delivered", n)
	}

	// Find a message from the header's search, by event id: one waiting
	// for its next attempt, a dead letter, a delivered one.
	find := func(event string) string {
		t.Helper()
		run("find "+event,
			chromedp.Navigate(base+"/console/"),
			chromedp.SendKeys(`header input[name=q]`, event),
			chromedp.Submit(`header form.search`),
			chromedp.WaitVisible(`#where`),
		)
		return text(`main`)
	}
	if page := find(waitingEvent); !strings.Contains(page, "pending since") || !strings.Contains(page, "backoff") ||
		!strings.Contains(page, "attempt 1 failed: HTTP 503 from the broker") {
		t.Errorf("the waiting row's page:\n%s", page)
	}
	shot("message")
	if page := find(deadEvent); !strings.Contains(page, "dead-lettered (permanent)") || !strings.Contains(page, "HTTP 400 from the schema registry") {
		t.Errorf("the dead letter's page:\n%s", page)
	}
	if page := find(deliveredEvent); !strings.Contains(page, "delivered at") || !strings.Contains(page, "replay") {
		t.Errorf("the delivered row's page (with its replay in the audit trail):\n%s", page)
	}
	run("a key's page", chromedp.Navigate(base+"/console/key?key=c7"), chromedp.WaitVisible(`#key-rows`))
	if head := text(`#head`); !strings.Contains(head, "backoff") {
		t.Errorf("the key's head: %q, want its backoff", head)
	}
	shot("key")
	run("a destination's page", chromedp.Navigate(base+"/console/"), chromedp.Click(`#live a[href^="/console/destinations/kafka"]`), chromedp.WaitVisible(`#changes`))
	if state := text(`#breaker`); state != "closed" {
		t.Errorf("the destination's breaker: %q", state)
	}
	shot("destination")

	// The overview, live.
	run("overview", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(`#live`))
	shot("overview")
	// It refreshes itself (its script, allowed by the page's policy). The
	// script replaces the element while the test reads it, so the text is
	// read in one step of the page's own JavaScript.
	stamp := func() string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#live p.muted").textContent`))
		if err != nil {
			t.Fatalf("the overview's time: %v", err)
		}
		return s
	}
	first := stamp()
	testwait.Within(t, 30*time.Second, "the overview to refresh", func() bool { return stamp() != first })

	// Without a session: sent to log in, and a change is refused.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(base + "/console/groups")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/console/login") {
		t.Errorf("unauthenticated GET: %d %q, want a redirect to log in", resp.StatusCode, resp.Header.Get("Location"))
	}
	replayURL := fmt.Sprintf("%s/console/dead-letters/%d/replay", base, untouched)
	resp, err = noRedirect.PostForm(replayURL, map[string][]string{"csrf": {"guess"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unauthenticated POST: %d, want 401", resp.StatusCode)
	}

	// Another site's page that posts to the console from the logged-in
	// browser: refused (its cookie, SameSite=Lax, is not sent with another
	// site's POST, and the origin is another's).
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s"><input name="csrf" value="guess"></form>
<script>document.getElementById("f").submit()</script>`, replayURL)
	}))
	defer evil.Close()
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1) // another site than 127.0.0.1
	run("a cross-site form", chromedp.Navigate(evilURL), chromedp.WaitVisible(`main h1`))
	refused := text(`main h1`)
	if !strings.Contains(refused, "session has ended") && !strings.Contains(refused, "Cross-site") {
		t.Errorf("the cross-site form's answer: %q", refused)
	}
	if n := countRows(t, pool, fmt.Sprintf("id = %d AND status = 'dead_lettered'", untouched)); n != 1 {
		t.Fatalf("row %d changed by a request without a session or from another site", untouched)
	}

	// Every page fits 1280 pixels and a phone's 390, without scrolling
	// sideways (tables scroll within their box).
	pages := []string{"/console/", "/console/groups", "/console/dead-letters?status=all",
		fmt.Sprintf("/console/dead-letters/%d", untouched), "/console/parked-keys", "/console/audit",
		"/console/?range=day", "/console/destinations/kafka", "/console/find?q=" + waitingEvent, "/console/key?key=c7", "/console/find?q=" + uuid.NewString()}
	for _, width := range []int64{1280, 390} {
		for _, path := range pages {
			run(fmt.Sprintf("%s at %d pixels", path, width),
				chromedp.EmulateViewport(width, 844),
				chromedp.Navigate(base+path),
				chromedp.WaitVisible(`main h1`),
			)
			fits, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth <= window.innerWidth`))
			if err != nil {
				t.Fatal(err)
			}
			if !fits {
				t.Errorf("%s at %d pixels is wider than the screen", path, width)
			}
		}
	}
	run("narrow groups", chromedp.Navigate(base+"/console/groups"), chromedp.WaitVisible(`main h1`))
	shot("groups-narrow")
	run("narrow trends", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(`#trends`))
	shot("overview-narrow")
	run("narrow message", chromedp.Navigate(base+"/console/find?q="+waitingEvent), chromedp.WaitVisible(`#where`))
	shot("message-narrow")
	run("narrow key", chromedp.Navigate(base+"/console/key?key=c7"), chromedp.WaitVisible(`#key-rows`))
	shot("key-narrow")
	run("narrow destination", chromedp.Navigate(base+"/console/destinations/kafka"), chromedp.WaitVisible(`#changes`))
	shot("destination-narrow")

	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
}

// An outbox captured from the log, in a real browser: the overview shows
// its slot, the replica that streams from it, and, once the slot is gone,
// that no replica can.
func TestConsoleShowsTheSlotInBrowser(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := newBrowser(t, 1280, 800)
	dsn, pool := migrated(t)
	captureLog(t, dsn, pool)
	var slot string
	if err := pool.QueryRow(context.Background(), "SELECT outbox_capture_slot()").Scan(&slot); err != nil {
		t.Fatal(err)
	}
	c := kafkatest.NewCluster(t, []string{"orders"})
	const token = "browser-test-token-0123456789"
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_ADMIN_TOKEN="+token, "OUTBOX_ADMIN_ROLES=admin=viewer", "OUTBOX_RELAY_CAPTURE=log"))
	base := "http://" + logged(t, p, "admin listener started")
	capture := func() string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector("#capture") || {textContent: ""}).textContent`))
		if err != nil {
			t.Fatalf("the capture table: %v", err)
		}
		return s
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(`input[name=token]`),
		chromedp.SendKeys(`input[name=token]`, token), chromedp.Click(`main button[type=submit]`), chromedp.WaitVisible(`#live`)); err != nil {
		t.Fatalf("log in: %v", err)
	}
	testwait.Within(t, 30*time.Second, "the overview to show the slot streamed from", func() bool {
		s := capture()
		return strings.Contains(s, slot) && strings.Contains(s, "reserved") && strings.Contains(s, "streams")
	})
	// The slot dropped under the relay (its stream is ended first): the
	// overview says it is missing, and why no replica can stream.
	if _, err := pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, 30*time.Second, "the slot to be dropped", func() bool {
		_, err := pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot)
		return err == nil
	})
	testwait.Within(t, 30*time.Second, "the overview to show the slot missing", func() bool {
		s := capture()
		return strings.Contains(s, "missing") && strings.Contains(s, "does not exist") && strings.Contains(s, "stands by")
	})
}
