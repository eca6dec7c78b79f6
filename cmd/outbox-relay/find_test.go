package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/deadletter"
)

// outbox-relay find: a message by event id, row id or key, as text or
// JSON; an id that matches nothing says what that means and exits 1; bad
// input exits 1 with the problem, and bad usage 2.
func TestFindCommand(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	parker := deadLetter(t, pool, letter{topic: "orders", key: "c-9", dest: "hooks", err: "HTTP 422 from hooks", parked: true})
	var pending int64
	var ev uuid.UUID
	if err := pool.QueryRow(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('orders', 'c-9', '{}') RETURNING id, event_id`).Scan(&pending, &ev); err != nil {
		t.Fatal(err)
	}
	out := c.ok("find", ev.String())
	for _, want := range []string{"row       " + strconv.FormatInt(pending, 10), "where     pending since", "held by:", "parked_key: row " + strconv.FormatInt(parker, 10), "what to do:"} {
		if !strings.Contains(out, want) {
			t.Errorf("find by event id does not say %q:\n%s", want, out)
		}
	}
	var f deadletter.Found
	c.json(&f, "find", "c-9")
	if f.Kind != "key" || len(f.Rows) != 2 || f.Rows[0].ID != parker || f.Rows[1].ID != pending || f.Rows[1].Holds[0].Kind != deadletter.HoldParkedKey {
		t.Errorf("find by key: %+v", f)
	}
	if out := c.ok("find", strconv.FormatInt(parker, 10)); !strings.Contains(out, "dead-lettered (permanent)") || !strings.Contains(out, "HTTP 422 from hooks") {
		t.Errorf("find by row id:\n%s", out)
	}
	r := c.run("", "find", uuid.NewString())
	if r.code != 1 || !strings.Contains(r.stdout, "delivered, or never written") || r.stderr != "" {
		t.Errorf("an absent event: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if r := c.run("", "find", "x", "--kind", "event"); r.code != 1 || !strings.Contains(r.stderr, `"x" is not an event id`) {
		t.Errorf("a bad event id: exit %d, %s", r.code, r.stderr)
	}
	if r := c.run("", "find"); r.code != 2 {
		t.Errorf("find without an argument: exit %d, want 2", r.code)
	}
}
