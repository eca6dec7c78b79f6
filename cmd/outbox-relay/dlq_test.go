package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
)

// cli runs the command in process against one schema.
type cli struct {
	t   *testing.T
	env []string
}

func newCLI(t *testing.T) (*cli, *pgxpool.Pool) {
	t.Helper()
	s := pgtest.NewSchema(t)
	return &cli{t: t, env: []string{
		"OUTBOX_DATABASE_URL=" + s.URL, "OUTBOX_DATABASE_SCHEMA=" + s.Name, "OUTBOX_ACTOR=alice",
	}}, s.Pool
}

func (c *cli) run(stdin string, args ...string) result {
	c.t.Helper()
	var out, errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := run(ctx, args, c.env, strings.NewReader(stdin), &out, &errb)
	return result{code, out.String(), errb.String()}
}

// ok runs a command that must succeed.
func (c *cli) ok(args ...string) string {
	c.t.Helper()
	r := c.run("", args...)
	if r.code != 0 {
		c.t.Fatalf("%v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// json runs a command with --json and decodes its output into v.
func (c *cli) json(v any, args ...string) {
	c.t.Helper()
	out := c.ok(append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		c.t.Fatalf("%v: output is not JSON: %v\n%s", args, err, out)
	}
}

// letter describes a dead letter to create.
type letter struct {
	topic, key, dest, reason, err string
	ago                           time.Duration // dead-lettered this long ago
	payload                       string
	parked                        bool
}

// deadLetter inserts a row and dead-letters it as the relay would.
func deadLetter(t *testing.T, pool *pgxpool.Pool, l letter) int64 {
	t.Helper()
	var key, dest *string
	if l.key != "" {
		key = &l.key
	}
	if l.dest != "" {
		dest = &l.dest
	}
	if l.reason == "" {
		l.reason = "permanent"
	}
	if l.payload == "" {
		l.payload = `{"order":1}`
	}
	history := fmt.Sprintf(`[{"at":"2026-11-20T10:00:00Z","attempt":1,"class":"permanent","error":%q}]`, l.err)
	var id int64
	err := pool.QueryRow(context.Background(), `INSERT INTO outbox (topic, key, payload, headers, status, retry_count,
    last_error, last_attempt_at, dead_letter_reason, dead_lettered_at, key_parked, destination, error_history, error_group)
VALUES ($1, $2, $3, '{"content-type":"application/json"}', 'dead_lettered', 1, $4, now(), $5,
    now() - $6 * interval '1 microsecond', $7, $8, $9, outbox_error_group($8, $5, $4))
RETURNING id`, l.topic, key, []byte(l.payload), l.err, l.reason, l.ago.Microseconds(), l.parked, dest, history).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

type listOutput struct {
	DeadLetters []struct {
		ID       int64   `json:"id"`
		Topic    string  `json:"topic"`
		Key      *string `json:"key"`
		Status   string  `json:"status"`
		ParksKey bool    `json:"parks_key"`
	} `json:"dead_letters"`
	Next string `json:"next_cursor"`
}

func (l listOutput) ids() []int64 {
	var ids []int64
	for _, d := range l.DeadLetters {
		ids = append(ids, d.ID)
	}
	return ids
}

func TestDLQListFilters(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	a := deadLetter(t, pool, letter{topic: "orders.created", key: "c1", dest: "hooks", reason: "permanent", err: "HTTP 400 Bad Request: currency", ago: 3 * time.Hour})
	b := deadLetter(t, pool, letter{topic: "orders.paid", key: "c2", dest: "kafka", reason: "retries_exhausted", err: "timeout", ago: 2 * time.Hour})
	d := deadLetter(t, pool, letter{topic: "billing", dest: "kafka", reason: "too_large", err: "payload is 2 MB", ago: time.Hour})
	e := deadLetter(t, pool, letter{topic: "orders_created", reason: "no_route", err: "no route matches topic", ago: time.Minute})
	if _, err := pool.Exec(context.Background(), `UPDATE outbox SET status = 'discarded' WHERE id = $1`, d); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		args []string
		want []int64 // newest first
	}{
		{nil, []int64{e, b, a}},
		{[]string{"--topic", "orders.*"}, []int64{b, a}},
		{[]string{"--topic", "orders_created"}, []int64{e}}, // _ is literal, not a wildcard
		{[]string{"--topic", "orders?created"}, []int64{e, a}},
		{[]string{"--destination", "kafka"}, []int64{b}},
		{[]string{"--reason-code", "retries_exhausted"}, []int64{b}},
		{[]string{"--key", "c1"}, []int64{a}},
		{[]string{"--since", "150m"}, []int64{e, b}},
		{[]string{"--until", "90m"}, []int64{b, a}},
		{[]string{"--since", "150m", "--until", "90m"}, []int64{b}},
		{[]string{"--since", time.Now().Add(-150 * time.Minute).UTC().Format(time.RFC3339)}, []int64{e, b}},
		{[]string{"--error", "CURRENCY"}, []int64{a}},
		{[]string{"--status", "discarded"}, []int64{d}},
		{[]string{"--status", "all"}, []int64{e, d, b, a}},
		{[]string{"--topic", "nothing"}, nil},
	} {
		var out listOutput
		c.json(&out, append([]string{"dlq", "list"}, tc.args...)...)
		if !slices.Equal(out.ids(), tc.want) {
			t.Errorf("list %v = %v, want %v", tc.args, out.ids(), tc.want)
		}
	}

	table := c.ok("dlq", "list", "--topic", "orders.*")
	for _, want := range []string{"ID", "TOPIC", "orders.paid", "retries_exhausted", "HTTP 400 Bad Request: currency"} {
		if !strings.Contains(table, want) {
			t.Errorf("table output lacks %q:\n%s", want, table)
		}
	}
}

// A walk through the pages sees every row present when it began once,
// however many dead letters arrive meanwhile.
func TestDLQListPagesWhileDeadLettersArrive(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	var want []int64
	for i := range 7 {
		want = append(want, deadLetter(t, pool, letter{topic: "orders", key: "k" + strconv.Itoa(i), ago: time.Duration(10-i) * time.Minute}))
	}
	// Two rows dead-lettered in the same statement share a timestamp.
	if _, err := pool.Exec(context.Background(), `UPDATE outbox SET dead_lettered_at = (SELECT dead_lettered_at FROM outbox WHERE id = $1) WHERE id = $2`, want[3], want[4]); err != nil {
		t.Fatal(err)
	}
	var got []int64
	cursor := ""
	for page := 0; ; page++ {
		args := []string{"dlq", "list", "--limit", "2"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		var out listOutput
		c.json(&out, args...)
		got = append(got, out.ids()...)
		// New dead letters arrive between pages.
		deadLetter(t, pool, letter{topic: "orders", key: "new" + strconv.Itoa(page)})
		if out.Next == "" {
			break
		}
		cursor = out.Next
		if page > 10 {
			t.Fatal("pagination does not end")
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("pages held %v, want each of %v once", got, want)
	}
}

func TestDLQShow(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	id := deadLetter(t, pool, letter{topic: "orders", key: "c1", dest: "hooks", err: "HTTP 422: amount must be positive",
		payload: `{"order":7,"amount":-3}`})
	bin := deadLetter(t, pool, letter{topic: "blobs", payload: "\x00\x01\xffbinary"})

	out := c.ok("dlq", "show", strconv.FormatInt(id, 10))
	for _, want := range []string{"dead_lettered (permanent)", "hooks", `"amount": -3`, "content-type", "attempt 1  permanent  HTTP 422: amount must be positive"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}

	var eventID string
	if err := pool.QueryRow(context.Background(), `SELECT event_id::text FROM outbox WHERE id = $1`, id).Scan(&eventID); err != nil {
		t.Fatal(err)
	}
	var detail struct {
		ID              int64           `json:"id"`
		PayloadEncoding string          `json:"payload_encoding"`
		Payload         json.RawMessage `json:"payload"`
		ErrorHistory    []struct {
			Error string `json:"error"`
		} `json:"error_history"`
	}
	c.json(&detail, "dlq", "show", eventID)
	if detail.ID != id || detail.PayloadEncoding != "json" || len(detail.ErrorHistory) != 1 {
		t.Fatalf("show by event id: %+v", detail)
	}
	var payload map[string]int
	if err := json.Unmarshal(detail.Payload, &payload); err != nil || payload["amount"] != -3 {
		t.Fatalf("payload %s: %v", detail.Payload, err)
	}

	if raw := c.ok("dlq", "show", strconv.FormatInt(bin, 10), "--raw-payload"); raw != "\x00\x01\xffbinary" {
		t.Errorf("raw payload = %q", raw)
	}
	out = c.ok("dlq", "show", strconv.FormatInt(bin, 10))
	if !strings.Contains(out, "binary, hex dump") || !strings.Contains(out, "00 01 ff 62") {
		t.Errorf("binary payload not shown as hex:\n%s", out)
	}
}

// Bad input is refused with a clear message and changes nothing: exit 1
// for bad values, 2 for bad usage.
func TestDLQBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	id := deadLetter(t, pool, letter{topic: "orders", key: "c1", payload: `{"order":1}`})
	sid := strconv.FormatInt(id, 10)
	dir := t.TempDir()
	badHeaders := filepath.Join(dir, "headers.json")
	if err := os.WriteFile(badHeaders, []byte(`{"x-count": 3}`), 0o600); err != nil {
		t.Fatal(err)
	}
	notJSON := filepath.Join(dir, "payload.txt")
	if err := os.WriteFile(notJSON, []byte(`order=1`), 0o600); err != nil {
		t.Fatal(err)
	}
	tooLarge := filepath.Join(dir, "large.json") // above the default payload cap, max_batch_bytes
	if err := os.WriteFile(tooLarge, []byte(`{"order":"`+strings.Repeat("x", 1<<20)+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"dlq", "replay", sid, "999999"}, 1, "no outbox row has id or event id 999999"},
		{[]string{"dlq", "replay", "abc"}, 1, `"abc" is neither a row id`},
		{[]string{"dlq", "replay", "--since", "yesterday"}, 1, `time "yesterday"`},
		{[]string{"dlq", "list", "--reason-code", "broken"}, 1, `reason "broken" is not a dead-letter reason`},
		{[]string{"dlq", "list", "--cursor", "xyz"}, 1, `cursor "xyz"`},
		{[]string{"dlq", "list", "--status", "sent"}, 1, `status "sent"`},
		{[]string{"dlq", "show", "999999"}, 1, "no outbox row"},
		{[]string{"dlq", "edit", sid, "--headers", badHeaders}, 1, "headers must be a JSON object of string values"},
		{[]string{"dlq", "edit", sid, "--payload", notJSON}, 1, "payload is JSON and the new one is not"},
		{[]string{"dlq", "edit", sid, "--payload", filepath.Join(dir, "missing")}, 1, "--payload: open"},
		{[]string{"dlq", "edit", sid}, 1, "nothing to change"},
		{[]string{"dlq", "edit", sid, "--payload", tooLarge}, 1, "above the payload cap of 921600"},
		{[]string{"dlq", "replay", sid, "--at", "tomorrow"}, 1, `at "tomorrow": use an RFC 3339 time`},
		{[]string{"dlq", "release", "not-parked"}, 1, "key is not parked"},
		{[]string{"dlq", "audit", "--action", "delete"}, 1, `action "delete"`},
		{[]string{"dlq", "discard", sid}, 2, "discard needs --reason"},
		{[]string{"dlq", "replay"}, 2, "exactly one of them"},
		{[]string{"dlq", "replay", sid, "--topic", "orders"}, 2, "exactly one of them"},
		{[]string{"dlq", "replay", "--all", "--batch-size", "0"}, 2, "--batch-size 0"},
		{[]string{"dlq", "release", "k", "--discard"}, 2, "needs --reason"},
		{[]string{"dlq", "show"}, 2, "takes a row id or event id"},
		{[]string{"dlq", "list", "--colour"}, 2, "unknown flag"},
		{[]string{"dlq", "dicsard", sid}, 2, `unknown command "dicsard" for outbox-relay dlq`},
		{[]string{"dlq"}, 2, "needs a subcommand"},
		{[]string{"dlq", "show", sid, "--raw-payload", "--json"}, 2, "do not go together"},
	} {
		r := c.run("", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, r.code, r.stderr, tc.code, tc.msg)
		}
	}
	if n := countRows(t, pool, "status = 'dead_lettered' AND payload = '{\"order\":1}' AND headers = '{\"content-type\":\"application/json\"}'"); n != 1 {
		t.Errorf("the dead letter changed")
	}
	var audits int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_audit`).Scan(&audits); err != nil || audits != 0 {
		t.Errorf("audit records after refused commands: %d (%v)", audits, err)
	}
}

func TestDLQReplayDiscardAuditStats(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	a := deadLetter(t, pool, letter{topic: "orders", key: "c1", dest: "hooks", reason: "retries_exhausted", ago: time.Hour})
	b := deadLetter(t, pool, letter{topic: "orders", key: "c2", dest: "hooks", reason: "retries_exhausted", ago: 30 * time.Minute})
	x := deadLetter(t, pool, letter{topic: "test.events", dest: "kafka", reason: "permanent", ago: 10 * time.Minute})
	y := deadLetter(t, pool, letter{topic: "test.events", dest: "kafka", reason: "permanent", ago: 5 * time.Minute})

	var st struct {
		DeadLettered  int            `json:"dead_lettered"`
		ByTopic       map[string]int `json:"by_topic"`
		ByDestination map[string]int `json:"by_destination"`
		ByReason      map[string]int `json:"by_reason"`
		Oldest        time.Time      `json:"oldest"`
		Newest        time.Time      `json:"newest"`
	}
	c.json(&st, "dlq", "stats")
	if st.DeadLettered != 4 || st.ByTopic["orders"] != 2 || st.ByDestination["kafka"] != 2 || st.ByReason["retries_exhausted"] != 2 ||
		!st.Oldest.Before(st.Newest) {
		t.Fatalf("stats: %+v", st)
	}

	// A dry run reports and changes nothing.
	out := c.ok("dlq", "replay", "--destination", "hooks", "--dry-run")
	if !strings.Contains(out, "would replay 2 rows") || countRows(t, pool, "status = 'dead_lettered'") != 4 {
		t.Fatalf("dry run: %s", out)
	}

	out = c.ok("dlq", "replay", "--destination", "hooks", "--batch-size", "1", "--reason", "endpoint fixed")
	if !strings.Contains(out, "replayed 2 rows") {
		t.Fatalf("replay: %s", out)
	}
	if n := countRows(t, pool, fmt.Sprintf("id IN (%d, %d) AND status = 'pending' AND retry_count = 0 AND next_attempt_at <= now() AND jsonb_array_length(error_history) = 1", a, b)); n != 2 {
		t.Fatalf("%d rows replayed as expected, want 2", n)
	}
	// Again: a no-op, reported as such.
	out = c.ok("dlq", "replay", strconv.FormatInt(a, 10))
	if !strings.Contains(out, fmt.Sprintf("row %d is pending, not dead-lettered: left as it is", a)) || !strings.Contains(out, "replayed 0 rows") {
		t.Fatalf("second replay: %s", out)
	}

	r := c.run("", "dlq", "discard", "--topic", "test.*", "--reason", "test traffic", "--actor", "bob", "--json")
	var res struct {
		Changed []int64 `json:"changed"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || len(res.Changed) != 2 {
		t.Fatalf("discard: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if countRows(t, pool, fmt.Sprintf("id IN (%d, %d) AND status = 'discarded'", x, y)) != 2 {
		t.Fatal("rows not discarded")
	}

	var audit struct {
		Records []struct {
			Actor  string  `json:"actor"`
			Source string  `json:"source"`
			Action string  `json:"action"`
			Reason string  `json:"reason"`
			RowIDs []int64 `json:"row_ids"`
		} `json:"records"`
	}
	c.json(&audit, "dlq", "audit")
	// Newest first: the discard, then the replay's two batches.
	if len(audit.Records) != 3 {
		t.Fatalf("audit: %+v", audit)
	}
	d, r1, r2 := audit.Records[0], audit.Records[1], audit.Records[2]
	if d.Action != "discard" || d.Actor != "bob" || d.Source != "cli" || d.Reason != "test traffic" || len(d.RowIDs) != 2 {
		t.Errorf("discard record: %+v", d)
	}
	if r1.Action != "replay" || r1.Actor != "alice" || r1.Reason != "endpoint fixed" || !slices.Equal(r2.RowIDs, []int64{a}) || !slices.Equal(r1.RowIDs, []int64{b}) {
		t.Errorf("replay records: %+v %+v", r1, r2)
	}
	c.json(&audit, "dlq", "audit", "--row", strconv.FormatInt(x, 10))
	if len(audit.Records) != 1 || audit.Records[0].Action != "discard" {
		t.Errorf("audit --row: %+v", audit)
	}
	if out := c.ok("dlq", "audit", "--action", "replay"); strings.Count(out, "replay") != 2 || !strings.Contains(out, "alice") {
		t.Errorf("audit table:\n%s", out)
	}
}

// Headers edited from standard input.
func TestDLQEditFromStdin(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	id := deadLetter(t, pool, letter{topic: "orders", payload: `{"order":1}`})
	r := c.run(`{"x-tenant": "acme"}`, "dlq", "edit", strconv.FormatInt(id, 10), "--headers", "-", "--reason", "tenant header missing")
	if r.code != 0 || !strings.Contains(r.stdout, "edited and replayed 1 row:") {
		t.Fatalf("edit: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if countRows(t, pool, `status = 'pending' AND headers = '{"x-tenant":"acme"}'`) != 1 {
		t.Fatal("headers not replaced")
	}
	var before string
	if err := pool.QueryRow(context.Background(), `SELECT details->'before'->>'headers' FROM outbox_audit WHERE action = 'edit'`).Scan(&before); err != nil ||
		!strings.Contains(before, "application/json") {
		t.Fatalf("audit keeps the original headers: %q %v", before, err)
	}
}

// dlq show prints the version of a row's content; dlq edit --if-version
// changes nothing once another edit has changed the row.
func TestDLQEditIfVersion(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	id := deadLetter(t, pool, letter{topic: "orders", payload: `{"order":1}`})
	ref := strconv.FormatInt(id, 10)
	var shown struct{ Version string }
	c.json(&shown, "dlq", "show", ref)
	if out := c.ok("dlq", "show", ref); shown.Version == "" || !strings.Contains(out, "\nversion ") || !strings.Contains(out, " "+shown.Version+"\n") {
		t.Fatalf("dlq show does not print the version %q:\n%s", shown.Version, out)
	}
	c.ok("dlq", "edit", ref, "--topic", "orders.v2", "--reason", "first")
	if _, err := pool.Exec(context.Background(), `UPDATE outbox SET status = 'dead_lettered', dead_lettered_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	r := c.run("", "dlq", "edit", ref, "--topic", "orders.v3", "--if-version", shown.Version, "--reason", "second")
	if r.code != exitFailed || !strings.Contains(r.stderr, "changed since it was read") {
		t.Fatalf("edit from an old version: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if countRows(t, pool, fmt.Sprintf("id = %d AND topic = 'orders.v2' AND status = 'dead_lettered'", id)) != 1 {
		t.Fatal("an edit from an old version changed the row")
	}
	c.json(&shown, "dlq", "show", ref)
	c.ok("dlq", "edit", ref, "--topic", "orders.v3", "--if-version", shown.Version, "--reason", "second")
	if countRows(t, pool, fmt.Sprintf("id = %d AND topic = 'orders.v3' AND status = 'pending'", id)) != 1 {
		t.Fatal("the edit from the current version did not apply")
	}
}

// dlq groups lists failure groups, the largest first, and --group selects
// one group's rows for the other commands.
func TestDLQGroups(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	a := deadLetter(t, pool, letter{topic: "orders", dest: "hook", err: "HTTP 400: order 17 has no 'amount'"})
	b := deadLetter(t, pool, letter{topic: "orders", dest: "hook", err: "HTTP 400: order 18 has no 'currency'"})
	deadLetter(t, pool, letter{topic: "orders", dest: "hook", err: "HTTP 413: too large"})

	var page struct {
		Groups []struct {
			ID          string `json:"id"`
			Count       int    `json:"count"`
			Fingerprint string `json:"fingerprint"`
			Example     string `json:"example"`
		} `json:"groups"`
		Total int `json:"total"`
	}
	c.json(&page, "dlq", "groups")
	if page.Total != 2 || len(page.Groups) != 2 || page.Groups[0].Count != 2 || page.Groups[0].Fingerprint != "HTTP <n>: order <n> has no <q>" ||
		page.Groups[0].Example != "HTTP 400: order 18 has no 'currency'" {
		t.Fatalf("groups: %+v", page)
	}
	id := page.Groups[0].ID
	out := c.ok("dlq", "groups", "--limit", "1")
	if !strings.Contains(out, id) || !strings.Contains(out, "HTTP <n>: order <n> has no <q>") || !strings.Contains(out, "1 of 2 groups") {
		t.Errorf("groups --limit 1:\n%s", out)
	}
	if out := c.ok("dlq", "replay", "--group", id, "--dry-run"); !strings.Contains(out, "would replay 2 rows") {
		t.Fatalf("dry run: %s", out)
	}
	if out := c.ok("dlq", "replay", "--group", id, "--reason", "hook fixed"); !strings.Contains(out, "replayed 2 rows") {
		t.Fatalf("replay: %s", out)
	}
	if n := countRows(t, pool, fmt.Sprintf("id IN (%d, %d) AND status = 'pending'", a, b)); n != 2 {
		t.Errorf("%d of the group's rows pending, want 2", n)
	}
	r := c.run("", "dlq", "groups", "--group", "nope")
	if r.code != 1 || !strings.Contains(r.stderr, "not a failure group's id") {
		t.Errorf("a bad group id: exit %d\n%s", r.code, r.stderr)
	}
}

// Every action on a selection is a dlq command, with its inputs as flags;
// reroute is one.
func TestDLQSelectionActionsAreCommands(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	for _, a := range deadletter.SelectionActions() {
		out := c.ok("dlq", a.Name, "--help")
		for _, want := range append([]string{strings.Split(a.Long, "\n")[0], "--dry-run", "--reason"}, inputFlags(a)...) {
			if !strings.Contains(out, want) {
				t.Errorf("dlq %s --help does not show %q:\n%s", a.Name, want, out)
			}
		}
	}
	a := deadLetter(t, pool, letter{topic: "ordres", key: "c1", reason: "no_route", ago: time.Hour})
	b := deadLetter(t, pool, letter{topic: "orders", key: "c2", reason: "permanent", ago: time.Hour})
	if r := c.run("", "dlq", "reroute", "--reason-code", "no_route"); r.code != 2 || !strings.Contains(r.stderr, "reroute needs --to") {
		t.Errorf("reroute without --to: exit %d, %q", r.code, r.stderr)
	}
	out := c.ok("dlq", "reroute", "--reason-code", "no_route", "--to", "orders", "--reason", "typo in the producer")
	if !strings.Contains(out, "rerouted 1 row: "+strconv.FormatInt(a, 10)) {
		t.Errorf("reroute printed %q", out)
	}
	var topic, status string
	if err := pool.QueryRow(context.Background(), `SELECT topic, status FROM outbox WHERE id = $1`, a).Scan(&topic, &status); err != nil {
		t.Fatal(err)
	}
	if topic != "orders" || status != "pending" {
		t.Errorf("row %d after the reroute: %s, %s", a, topic, status)
	}
	if n := countRows(t, pool, fmt.Sprintf("id = %d AND status = 'dead_lettered'", b)); n != 1 {
		t.Errorf("row %d outside the filter was rerouted", b)
	}
	var audit struct {
		Records []struct {
			Details map[string]any `json:"details"`
		} `json:"records"`
	}
	c.json(&audit, "dlq", "audit", "--action", "reroute")
	if len(audit.Records) != 1 || fmt.Sprint(audit.Records[0].Details["from_topics"]) != "[ordres]" {
		t.Errorf("audit of the reroute: %+v", audit)
	}
}

func inputFlags(a deadletter.ActionInfo) []string {
	var out []string
	for _, i := range a.Inputs {
		out = append(out, "--"+i.Name)
	}
	return out
}
