package relay_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/webhook"
)

// statusServer answers each request with the status in its X-Status
// header, and Retry-After from X-Retry-After.
func statusServer(t *testing.T, seen func(r *http.Request)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen != nil {
			seen(r)
		}
		if ra := r.Header.Get("X-Retry-After"); ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		code, _ := strconv.Atoi(r.Header.Get("X-Status"))
		if code == 0 {
			code = 200
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte("status " + strconv.Itoa(code)))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func hookDestination(t *testing.T, name, url string) relay.Destination {
	t.Helper()
	p, err := webhook.New(webhook.Config{Name: name, URL: url, AllowPrivateNetworks: true, ResponseHeaderTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return relay.Destination{Name: name, Publisher: p}
}

func hookRelay(t *testing.T, s *pgtest.Schema, policy retry.PolicyConfig, dests ...relay.Destination) *harness {
	t.Helper()
	routes := make([]relay.Route, 0, len(dests))
	for _, d := range dests {
		routes = append(routes, relay.Route{Topics: []string{d.Name}, Destination: d.Name})
	}
	return startRelay(t, s, policy, relay.Config{Destinations: dests, Routes: routes})
}

func TestHTTPRetryAfterSetsTheNextAttempt(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	srv := statusServer(t, nil)
	insert(t, s, `INSERT INTO outbox (topic, payload, headers) VALUES
        ('hooks', 'a', '{"X-Status": "503", "X-Retry-After": "7"}'),
        ('hooks', 'b', '{"X-Status": "503", "X-Retry-After": "3600"}'),
        ('hooks', 'c', '{"X-Status": "429", "X-Retry-After": "`+time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)+`"}')`)
	h := hookRelay(t, s, retry.PolicyConfig{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, MaxRetryAfter: 10 * time.Second},
		hookDestination(t, "hooks", srv.URL))
	testwait.For(t, "three failed attempts", func() bool { return count(t, s.Pool, "retry_count = 1") == 3 })
	h.stop()
	// By the database clock: the hint, above the tiny backoff, capped.
	if n := count(t, s.Pool, `payload = 'a' AND next_attempt_at >= last_attempt_at + interval '7 s'
        AND next_attempt_at <= last_attempt_at + interval '7.01 s' AND last_error LIKE '%503 Service Unavailable: "status 503"%'`); n != 1 {
		t.Error("Retry-After: 7 did not set next_attempt_at to 7 s after the attempt")
	}
	if n := count(t, s.Pool, `payload IN ('b', 'c') AND next_attempt_at >= last_attempt_at + interval '9.9 s'
        AND next_attempt_at <= last_attempt_at + interval '10 s'`); n != 2 {
		t.Error("a Retry-After above max_retry_after was not capped")
	}
}

func TestHTTPRepeated429BacksOffThenDeadLetters(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	var mu sync.Mutex
	var keys []string
	var delays []time.Duration
	srv := statusServer(t, func(r *http.Request) {
		// The previous attempt's write-back is committed before the next
		// attempt: the delay it chose is in the row.
		var d *time.Duration
		_ = s.Pool.QueryRow(context.Background(), `SELECT (next_attempt_at - last_attempt_at) FROM outbox WHERE retry_count > 0`).Scan(&d)
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if d != nil {
			delays = append(delays, *d)
		}
	})
	insert(t, s, `INSERT INTO outbox (topic, key, payload, headers) VALUES ('hooks', 'k', 'x', '{"X-Status": "429"}')`)
	h := hookRelay(t, s, retry.PolicyConfig{MaxAttempts: 5, Strategy: retry.StrategyEqual, BaseDelay: 20 * time.Millisecond, MaxDelay: time.Second},
		hookDestination(t, "hooks", srv.URL))
	testwait.For(t, "the row dead-lettered", func() bool { return count(t, s.Pool, "status = 'dead_lettered'") == 1 })
	h.stop()
	if n := count(t, s.Pool, `dead_letter_reason = 'retries_exhausted' AND retry_count = 5 AND last_error LIKE '%429 Too Many Requests%'
        AND jsonb_array_length(error_history) = 5`); n != 1 {
		t.Fatal("not dead-lettered retries_exhausted after 5 attempts with the 429 recorded")
	}
	var eventID string
	if err := s.Pool.QueryRow(context.Background(), "SELECT event_id::text FROM outbox").Scan(&eventID); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 5 {
		t.Fatalf("%d requests, want 5", len(keys))
	}
	for _, k := range keys {
		if k != eventID {
			t.Fatalf("Idempotency-Key %q on some attempt, want the event id %s every time", k, eventID)
		}
	}
	// Equal jitter: after failure n (from 0) the delay is in
	// [d/2, d] with d = 20ms·2^n.
	if len(delays) != 4 {
		t.Fatalf("observed %d delays, want 4", len(delays))
	}
	for n, d := range delays {
		hi := 20 * time.Millisecond << n
		if d < hi/2 || d > hi {
			t.Errorf("delay after failure %d is %s, want within [%s, %s]", n+1, d, hi/2, hi)
		}
	}
}

func TestHTTPPermanentStatusesDeadLetterAtOnce(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	srv := statusServer(t, nil)
	insert(t, s, `INSERT INTO outbox (topic, key, payload, headers)
SELECT 'hooks', 'k' || c, 'x', jsonb_build_object('X-Status', c::text) FROM unnest(ARRAY[400, 404, 410, 413, 422]) c`)
	h := hookRelay(t, s, retry.PolicyConfig{}, hookDestination(t, "hooks", srv.URL))
	testwait.For(t, "every row dead-lettered", func() bool { return count(t, s.Pool, "status = 'dead_lettered'") == 5 })
	h.stop()
	for code, reason := range map[string]string{"400": "permanent", "404": "permanent", "410": "permanent", "413": "too_large", "422": "permanent"} {
		if n := count(t, s.Pool, `headers->>'X-Status' = $1 AND dead_letter_reason = $2 AND retry_count = 1
            AND last_error LIKE '%: ' || $1 || ' %'`, code, reason); n != 1 {
			t.Errorf("status %s: not dead-lettered %s on the first attempt with the status recorded", code, reason)
		}
	}
}

func TestHTTPAuthFailurePausesTheDestination(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	srv := statusServer(t, nil)
	insert(t, s, `INSERT INTO outbox (topic, payload, headers)
SELECT (ARRAY['unauthorized', 'forbidden'])[1 + g % 2], 'x', jsonb_build_object('X-Status', (ARRAY['401', '403'])[1 + g % 2])
FROM generate_series(1, 20) g`)
	h := hookRelay(t, s, retry.PolicyConfig{MaxAttempts: 2},
		hookDestination(t, "unauthorized", srv.URL), hookDestination(t, "forbidden", srv.URL))
	opened := map[string]bool{}
	h.signals.BreakerChanged.WaitFor(t, "both breakers open", func(c relay.BreakerChange) bool {
		opened[c.Destination] = opened[c.Destination] || c.To == relay.BreakerOpen
		return opened["unauthorized"] && opened["forbidden"]
	})
	testwait.For(t, "a row of each deferred with its error", func() bool {
		return count(t, s.Pool, `last_error LIKE '%401 Unauthorized%'`) > 0 && count(t, s.Pool, `last_error LIKE '%403 Forbidden%'`) > 0
	})
	h.stop()
	if n := count(t, s.Pool, "status = 'pending' AND retry_count = 0"); n != 20 {
		t.Fatalf("%d of 20 rows pending with no attempt counted", n)
	}
}

func TestHTTPEndpointWithoutHeadersIsRetried(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	insert(t, s, `INSERT INTO outbox (topic, payload) VALUES ('hooks', 'x')`)
	h := hookRelay(t, s, retry.PolicyConfig{BaseDelay: time.Hour}, hookDestination(t, "hooks", srv.URL))
	testwait.For(t, "the attempt timed out", func() bool { return count(t, s.Pool, "retry_count = 1") == 1 })
	h.stop()
	if n := count(t, s.Pool, `status = 'pending' AND last_error LIKE '%timeout awaiting response headers%'`); n != 1 {
		t.Fatal("the timed-out attempt is not recorded as a pending retry")
	}
}
