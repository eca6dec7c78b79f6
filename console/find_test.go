package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// The search in the header finds a message by event id, row id or key:
// its page says where it is and what holds it, the relay's live state
// included; a key's page names its head and why it waits.
func TestFindMessagePages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b := e.browser()
	b.login(token)
	parker := e.deadLetter("hooks", "c-1", `{"n":1}`, "HTTP 422 from hooks")
	e.s.Exec(t, `UPDATE outbox SET key_parked = true WHERE id = $1`, parker)
	var pending int64
	var ev uuid.UUID
	if err := e.s.Pool.QueryRow(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('orders', 'c-1', '{}') RETURNING id, event_id`).Scan(&pending, &ev); err != nil {
		t.Fatal(err)
	}
	var loose int64
	if err := e.s.Pool.QueryRow(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('orders', 'c-2', '{}') RETURNING id`).Scan(&loose); err != nil {
		t.Fatal(err)
	}

	code, _, page := b.do("GET", "/console/find?q="+ev.String(), nil)
	if code != http.StatusOK {
		t.Fatalf("find by event id: %d\n%s", code, page)
	}
	for _, want := range []string{"Row " + strconv.FormatInt(pending, 10), ">pending<", "parked_key", "row " + strconv.FormatInt(parker, 10),
		"breaker is open", "topic authorization failed", "hooks (as orders)", `href="/console/key?outbox=main&amp;key=c-1"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the message page does not say %q", want)
		}
	}
	// A row that nothing in the database holds: only the relay's state.
	_, _, page = b.do("GET", "/console/messages/"+strconv.FormatInt(loose, 10), nil)
	if strings.Contains(page, "parked_key") || !strings.Contains(page, "breaker is open") {
		t.Errorf("a row held only by the open breaker:\n%s", page)
	}
	_, _, page = b.do("GET", "/console/find?q="+strconv.FormatInt(parker, 10), nil)
	if !strings.Contains(page, "dead-lettered (permanent)") || !strings.Contains(page, "/console/dead-letters/"+strconv.FormatInt(parker, 10)) ||
		strings.Contains(page, "breaker is open") {
		t.Errorf("a dead letter's page: its state and where to act, and no live hold:\n%s", page)
	}

	code, _, page = b.do("GET", "/console/find?q=c-1", nil)
	if code != http.StatusOK || !strings.Contains(page, `id="head"`) || !strings.Contains(page, "The key is parked") ||
		!strings.Contains(page, `id="key-rows"`) {
		t.Errorf("a key's page: %d\n%s", code, page)
	}
	_, _, page = b.do("GET", "/console/find?q="+uuid.NewString(), nil)
	if !strings.Contains(page, "delivered, or never written") {
		t.Errorf("an absent event:\n%s", page)
	}
}

// Bad input to the search is a clear answer, never a 500: malformed ids,
// huge or hostile text.
func TestFindRefusesBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b := e.browser()
	b.login(token)
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/console/find?q=", http.StatusBadRequest, "the search is empty"},
		{"/console/find?q=" + strings.Repeat("a", 5000), http.StatusBadRequest, "at most 4096"},
		{"/console/find?q=%00", http.StatusBadRequest, "not valid text"},
		{"/console/find?q=%C3%28", http.StatusBadRequest, "not valid text"},
		{"/console/find?q=1&kind=drop", http.StatusBadRequest, `kind &#34;drop&#34; is not one of`},
		{"/console/find?q=x&kind=event", http.StatusBadRequest, "is not an event id"},
		{"/console/messages/-1", http.StatusBadRequest, "neither a row id"},
		{"/console/messages/abc", http.StatusBadRequest, "neither a row id"},
		{"/console/messages/99999999999999999999", http.StatusBadRequest, "neither a row id"},
		{"/console/find?q=" + url.QueryEscape(`<script>alert(1)</script>`), http.StatusOK, "&lt;script&gt;"},
		{"/console/find?q=" + url.QueryEscape(`'; DROP TABLE outbox; --`), http.StatusOK, "No pending, dead-lettered or discarded row has key"},
		{"/console/key?key=" + url.QueryEscape(`k' OR '1'='1`), http.StatusOK, "No pending, dead-lettered or discarded row has key"},
		{"/console/find?q=1&outbox=nope", http.StatusNotFound, "no outbox"},
	} {
		code, _, page := b.do("GET", c.path, nil)
		if code != c.code || !strings.Contains(page, c.want) || strings.Contains(page, "<script>alert") {
			t.Errorf("%.60s: %d, want %d saying %q", c.path, code, c.code, c.want)
		}
	}
	var n int
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the outbox holds %d rows after the searches (%v)", n, err)
	}
}
