package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"time"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/console"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/history"
)

// consolePages times the console's pages, each loaded five times by a
// logged-in client, over ConsoleLetters dead letters in failure groups
// beside a backlog of Rows pending rows: the median, and the slowest in
// the note.
func (r *runner) consolePages(ctx context.Context) error {
	pending := cmp.Or(r.cfg.ConsoleRows, r.cfg.Rows)
	e, err := r.filled(ctx, pending, distributions[0].expr, 4)
	if err != nil {
		return err
	}
	defer e.close()
	// Failure groups: 4 destinations × 2 reasons; each row's error names
	// its own order and status, which the fingerprint masks.
	if _, err := e.pool.Exec(ctx, `INSERT INTO outbox (topic, key, payload, headers, status, retry_count, last_error,
    last_attempt_at, dead_letter_reason, dead_lettered_at, destination, error_history, error_group)
SELECT 'orders', 'key-' || (g % 10000), convert_to('{"order":' || g || ',"total_cents":1234}', 'UTF8'),
    '{"content-type":"application/json"}', 'dead_lettered', 3, err, now() - g * interval '1 second',
    reason, now() - g * interval '1 second', dest,
    jsonb_build_array(jsonb_build_object('at', now(), 'attempt', 3, 'class', 'permanent', 'error', err)),
    outbox_error_group(dest, reason, err)
FROM (SELECT g, 'dest-' || (g % 4) AS dest,
        CASE WHEN g % 3 = 0 THEN 'permanent' ELSE 'retries_exhausted' END AS reason,
        'HTTP ' || (400 + (g / 7) % 6) || ' for order ' || g || ': field ''f' || (g % 97) || '''' AS err
      FROM generate_series(1, $1) g) AS d`, r.cfg.ConsoleLetters); err != nil {
		return err
	}
	// A day of history from 3 replicas delivering to the 4 destinations,
	// and the backlog of each minute: what the trends read.
	if _, err := e.pool.Exec(ctx, `INSERT INTO outbox_history (minute, destination, replica, delivered, retried, dead_lettered, lag_counts)
SELECT m, 'dest-' || d, 'replica-' || rp, 6000 + d, 12, 1, ARRAY[10, 400, 3000, 2000, 500, 60, 20, 5, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]::bigint[]
FROM generate_series(date_trunc('minute', now()) - interval '24 hours', date_trunc('minute', now()), interval '1 minute') AS m,
     generate_series(0, 3) AS d, generate_series(0, 2) AS rp`); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO outbox_history (minute, destination, replica, pending, oldest_pending_ms)
SELECT m, '', '', $1, 1500 FROM generate_series(date_trunc('minute', now()) - interval '24 hours', date_trunc('minute', now()), interval '1 minute') AS m`, pending); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, "VACUUM ANALYZE outbox_history"); err != nil {
		return err
	}
	hist, err := history.New(e.relayPool, e.schema)
	if err != nil {
		return err
	}
	dead, err := deadletter.NewStore(e.relayPool, deadletter.Config{Schema: e.schema})
	if err != nil {
		return err
	}
	const token = "bench-console-token-0123456789"
	tokens, err := access.NewTokens(map[string]access.Token{"bench": {Value: token, Role: access.Operator}})
	if err != nil {
		return err
	}
	var dests []console.DestinationStatus
	for d := range 4 {
		dests = append(dests, console.DestinationStatus{Name: fmt.Sprintf("dest-%d", d), Breaker: "closed"})
	}
	h, err := console.New(console.Config{Outboxes: []console.Outbox{{Name: "bench", Dead: dead, History: hist}}, Tokens: tokens,
		Status: func(context.Context) console.Status { return console.Status{Destinations: dests} },
		Route:  func(topic string) (string, string, bool) { return "dest-1", topic, true }})
	if err != nil {
		return err
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	client, err := consoleLogin(srv.URL, token)
	if err != nil {
		return err
	}
	page, err := dead.Groups(ctx, deadletter.GroupParams{Limit: deadletter.MaxListLimit})
	if err != nil {
		return err
	}
	if len(page.Groups) == 0 {
		return fmt.Errorf("console: no failure groups")
	}
	largest, smallest := page.Groups[0], page.Groups[len(page.Groups)-1]
	var latest int64
	if err := e.pool.QueryRow(ctx, `SELECT max(id) FROM outbox WHERE status = 'dead_lettered'`).Scan(&latest); err != nil {
		return err
	}
	var pendingEvent, pendingKey string
	if err := e.pool.QueryRow(ctx, `SELECT event_id::text, coalesce(key, '') FROM outbox WHERE status = 'pending' ORDER BY id DESC LIMIT 1`).Scan(&pendingEvent, &pendingKey); err != nil {
		return err
	}
	for _, p := range []struct{ name, path string }{
		{"overview", "/console/"},
		{"failure groups", "/console/groups"},
		{"dead letters, first page", "/console/dead-letters"},
		{"dead letters of the smallest group", "/console/dead-letters?group=" + smallest.ID},
		{"dead letters with error text", "/console/dead-letters?error=f42"},
		{"a row's page", fmt.Sprintf("/console/dead-letters/%d", latest)},
		{fmt.Sprintf("dry run of the largest group (%d rows)", largest.Count), "/console/groups/" + largest.ID + "/replay"},
		{"parked keys", "/console/parked-keys"},
		{"audit", "/console/audit"},
		{"overview with the last day's trends", "/console/?range=day"},
		{"find a pending row by event id", "/console/find?q=" + pendingEvent},
		{"a key's page", "/console/key?key=" + url.QueryEscape(pendingKey)},
		{"a dead letter's message page", fmt.Sprintf("/console/messages/%d", latest)},
		{"a destination's page", "/console/destinations/dest-1"},
	} {
		var took []time.Duration
		for range 5 {
			start := time.Now()
			res, err := client.Get(srv.URL + p.path)
			if err != nil {
				return fmt.Errorf("console %s: %w", p.name, err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				return fmt.Errorf("console %s: %s", p.name, res.Status)
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		r.add(Result{Group: "console", Name: p.name, Value: ms(took[len(took)/2]), Unit: "ms",
			Detail: fmt.Sprintf("median of 5 loads, slowest %.1f ms; %d dead letters in %d groups, %d pending rows, a day of history",
				ms(took[len(took)-1]), r.cfg.ConsoleLetters, page.Total, pending)})
	}
	return r.historyCost(ctx, e, hist)
}

// historyCost times what a replica writes to the history every minute:
// its counts for 4 destinations, added to a minute a day's history
// already holds, with the trim of what is older than a day; and the size
// of that day's history.
func (r *runner) historyCost(ctx context.Context, e *env, hist *history.Store) error {
	counts := make([]history.Counts, 4)
	for d := range counts {
		counts[d] = history.Counts{Destination: fmt.Sprintf("dest-%d", d), Delivered: 6000, Retried: 3,
			Lag: []int64{10, 400, 3000, 2000, 500, 60, 20, 5, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}}
	}
	var took []time.Duration
	for i := range 200 {
		start := time.Now()
		if err := hist.Add(ctx, time.Now().Add(-time.Duration(i)*time.Minute), "replica-0", counts); err != nil {
			return err
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	var rows, bytes int64
	if err := e.pool.QueryRow(ctx, `SELECT count(*), pg_total_relation_size('outbox_history') FROM outbox_history`).Scan(&rows, &bytes); err != nil {
		return err
	}
	r.add(Result{Group: "console", Name: "history: one replica's write a minute (4 destinations)", Value: ms(took[len(took)/2]), Unit: "ms",
		Detail: fmt.Sprintf("median of 200, p99 %.1f ms; a day of 3 replicas × 4 destinations is %d rows, %.1f MB with its indexes",
			ms(took[len(took)*99/100]), rows, float64(bytes)/1e6)})
	return nil
}

// consoleLogin logs a client with a cookie jar in to the console at base.
func consoleLogin(base, token string) (*http.Client, error) {
	jar, err := cookiejar.New(nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Jar: jar}
	res, err := client.Get(base + "/console/login")
	if err != nil {
		return nil, err
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	m := regexp.MustCompile(`name="nonce" value="([^"]+)"`).FindSubmatch(body)
	if m == nil {
		return nil, fmt.Errorf("console: no login form")
	}
	res, err = client.PostForm(base+"/console/login", url.Values{"nonce": {string(m[1])}, "token": {token}})
	if err != nil {
		return nil, err
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("console login: %s", res.Status)
	}
	return client, nil
}
