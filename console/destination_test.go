package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/history"
)

// A destination's page: its breaker and the fleet's history of it, its
// paused topics with their cool-downs, its limits, its failure groups and
// its trends.
func TestDestinationPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.deadLetter("hooks", "c-1", `{"n":1}`, "HTTP 422 for order 17")
	e.deadLetter("hooks", "c-2", `{"n":2}`, "HTTP 422 for order 18")
	e.deadLetter("other", "c-3", `{"n":3}`, "HTTP 500 elsewhere")
	at := time.Now().Add(-10 * time.Minute)
	if err := e.hist.Add(ctx, at, "replica-a", []history.Counts{{Destination: "hooks", Delivered: 12, Retried: 3}},
		history.Change{At: at, Destination: "hooks", From: "closed", To: "open", Cooldown: 4 * time.Second, LastError: "HTTP 503 from hooks"},
		history.Change{At: at.Add(5 * time.Second), Destination: "hooks", From: "open", To: "half_open"}); err != nil {
		t.Fatal(err)
	}
	b := e.browser()
	b.login(token)
	code, _, page := b.do("GET", "/console/destinations/hooks", nil)
	if code != http.StatusOK {
		t.Fatalf("the destination's page: %d\n%s", code, page)
	}
	for _, want := range []string{`id="breaker">open<`, "a probe at 2026-11-27 12:00:00Z", "4 here", "topic authorization failed",
		"closed → open", "open → half_open", "replica-a", "4s", "HTTP 503 from hooks",
		`>2</a>`, "HTTP 422 for order 18", "12 delivered, 3 failed"} {
		if !strings.Contains(page, want) {
			t.Errorf("the destination's page does not say %q", want)
		}
	}
	if strings.Contains(page, "HTTP 500 elsewhere") {
		t.Error("the page shows another destination's failure group")
	}
	if !strings.Contains(func() string { _, _, p := b.do("GET", "/console/", nil); return p }(), `href="/console/destinations/hooks?outbox=main"`) {
		t.Error("the overview does not link to the destination's page")
	}
	for _, name := range []string{"nope", url.PathEscape("<script>x</script>"), url.PathEscape(strings.Repeat("d", 3000))} {
		code, _, page := b.do("GET", "/console/destinations/"+name, nil)
		if code != http.StatusNotFound || !strings.Contains(page, "No destination") || strings.Contains(page, "<script>x") {
			t.Errorf("destination %.30q: %d, want a 404 that says so", name, code)
		}
	}
}
