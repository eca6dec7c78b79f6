package bench

import (
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

	"github.com/outbox-relay/outbox-relay/console"
	"github.com/outbox-relay/outbox-relay/deadletter"
)

// consolePages times the console's pages, each loaded five times by a
// logged-in client, over ConsoleLetters dead letters in failure groups
// beside a backlog of Rows pending rows: the median, and the slowest in
// the note.
func (r *runner) consolePages(ctx context.Context) error {
	e, err := r.filled(ctx, r.cfg.Rows, distributions[0].expr, 4)
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
	if _, err := e.pool.Exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		return err
	}
	dead, err := deadletter.NewStore(e.relayPool, deadletter.Config{Schema: e.schema})
	if err != nil {
		return err
	}
	const token = "bench-console-token-0123456789"
	tokens, err := deadletter.NewTokens(map[string]string{"bench": token})
	if err != nil {
		return err
	}
	h, err := console.New(console.Config{Outboxes: []console.Outbox{{Name: "bench", Dead: dead}}, Tokens: tokens})
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
			Detail: fmt.Sprintf("median of 5 loads, slowest %.1f ms; %d dead letters in %d groups, %d pending rows",
				ms(took[len(took)-1]), r.cfg.ConsoleLetters, page.Total, r.cfg.Rows)})
	}
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
