package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// countingReceiver is an HTTP endpoint that counts the requests it serves at
// once, and can answer 503 to every request.
type countingReceiver struct {
	mu        sync.Mutex
	now, most int
	requests  int
	failing   bool
	delivered map[string]bool
}

func (rc *countingReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.now++
	rc.most = max(rc.most, rc.now)
	rc.requests++
	failing := rc.failing
	rc.mu.Unlock()
	time.Sleep(20 * time.Millisecond) // the endpoint's work
	rc.mu.Lock()
	rc.now--
	if !failing {
		rc.delivered[r.Header.Get("Idempotency-Key")] = true
	}
	rc.mu.Unlock()
	if failing {
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
	}
}

// reset starts counting afresh and returns the counts so far.
func (rc *countingReceiver) reset(failing bool) (most, requests int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	most, requests = rc.most, rc.requests
	rc.most, rc.requests, rc.failing = rc.now, 0, failing
	return most, requests
}

func (rc *countingReceiver) counts() (now, most, requests, delivered int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.now, rc.most, rc.requests, len(rc.delivered)
}

// Three relay processes share one HTTP destination's max_in_flight and
// breaker through the coordination tables: the receiver never serves more
// requests at once than the fleet's limit, and while the destination is
// down one probe at a time goes, whichever replica sends it.
func TestRunFleetSharesFlowControl(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, nil)
	rc := &countingReceiver{delivered: map[string]bool{}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(cfgFile, []byte(`
relay: {workers: 3, batch_size: 20}
retry: {pause_base: 1s, pause_max: 1s}
coordination: {interval: 50ms, lease: 2s}
destinations:
  hook:
    max_in_flight: 3
    breaker: {failing_rows: 5, failing_for: 100ms}
    http:
      url: `+srv.URL+`
      allow_private_networks: true
      concurrency: 1
routes:
  - topics: ["*"]
    destination: hook
`), 0o600); err != nil {
		t.Fatal(err)
	}
	produce := func(n int) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
			SELECT 'events', 'k' || (g % 40), g::text::bytea FROM generate_series(1, $1::int) g`, n); err != nil {
			t.Fatal(err)
		}
	}
	env := relayEnv(dsn, c, "OUTBOX_CONFIG="+cfgFile)
	var relays []*relayProcess
	for range 3 {
		relays = append(relays, startRelay(t, env))
	}
	addr := adminAddr(t, relays[0])

	// Healthy: never more than max_in_flight requests at once.
	produce(600)
	if ok, _ := testwait.Poll(90*time.Second, func() (bool, string) { return countRows(t, pool, "true") == 0, "" }); !ok {
		logPartitions(t, pool)
		t.Fatal("timed out waiting for every row delivered")
	}
	most, requests := rc.reset(true)
	if most > 3 {
		t.Errorf("the receiver served %d requests at once; the fleet's max_in_flight is 3", most)
	}
	t.Logf("healthy: %d requests, at most %d at once", requests, most)
	testwait.For(t, "three replicas in the fleet", func() bool {
		_, body := get(t, addr, "/metrics")
		return strings.Contains(body, "outbox_fleet_replicas 3") && strings.Contains(body, "outbox_fleet_coordination_up 1")
	})
	if _, body := get(t, addr, "/readyz"); !strings.Contains(body, `"coordination": {
    "state": "up",
    "replicas": 3
  }`) {
		t.Errorf("/readyz does not report the fleet's coordination up with three replicas:\n%s", body)
	}

	// Down: the first replica to see it opens the fleet's breaker.
	produce(200)
	testwait.Within(t, time.Minute, "the fleet's breaker to open", func() bool {
		var open bool
		err := pool.QueryRow(context.Background(), "SELECT state = 'open' FROM outbox_fleet_breakers WHERE destination = 'hook'").Scan(&open)
		return err == nil && open
	})
	// Once every replica has it open, no request starts but a probe; each
	// replica's share of max_in_flight is one row, so a publish begun
	// before is one request.
	addrs := []string{addr, adminAddr(t, relays[1]), adminAddr(t, relays[2])}
	testwait.For(t, "every replica to hold the destination", func() bool {
		for _, a := range addrs {
			if _, body := get(t, a, "/metrics"); !strings.Contains(body, `outbox_circuit_state{destination="hook",state="closed"} 0`) {
				return false
			}
		}
		return true
	})
	testwait.For(t, "a replica's /readyz to name the half-open circuit as the metrics do", func() bool {
		for _, a := range addrs {
			if _, body := get(t, a, "/readyz"); strings.Contains(body, `"circuit": "half_open"`) {
				return true
			}
		}
		return false
	})
	testwait.For(t, "the requests sent before it opened to end", func() bool { now, _, _, _ := rc.counts(); return now == 0 })
	rc.reset(true)
	// Three cool-downs' worth of probes, each of up to eight rows, one
	// request after the other: one probe at a time across the fleet.
	testwait.Within(t, time.Minute, "a few probes", func() bool { _, _, requests, _ := rc.counts(); return requests >= 12 })
	most, requests = rc.reset(false)
	if most > 1 {
		t.Errorf("the receiver served %d probe requests at once while the breaker was open; want one probe at a time", most)
	}
	t.Logf("down: %d probe requests, at most %d at once", requests, most)

	testwait.Within(t, 90*time.Second, "every row delivered after recovery", func() bool { return countRows(t, pool, "true") == 0 })
	if _, _, _, delivered := rc.counts(); delivered != 800 {
		t.Errorf("the receiver acknowledged %d distinct rows, want 800", delivered)
	}
	for _, p := range relays {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range relays {
		if code := p.wait(t, time.Minute); code != 0 {
			t.Fatalf("exit code %d; output:\n%s", code, p.output)
		}
	}
	// Replicas that stop cleanly leave the fleet at once.
	var left int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_fleet_replicas").Scan(&left); err != nil || left != 0 {
		t.Errorf("%d replicas still in the fleet after every relay stopped (%v)", left, err)
	}
}

// logPartitions logs the rows left in each partition of the outbox beside
// the partition's owner, lease and floor, and the claimers: where rows
// stand when they do not drain.
func logPartitions(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT p.part, coalesce(p.owner, '-'), p.expires_at > now(), p.floor,
		count(o.id), coalesce(min(o.id), 0), count(o.id) FILTER (WHERE o.next_attempt_at <> o.created_at)
		FROM outbox_claim_partitions p LEFT JOIN outbox o ON outbox_partition(o.key, o.id) = p.part AND o.status = 'pending'
		GROUP BY p.part, p.owner, p.expires_at, p.floor ORDER BY p.part`)
	if err != nil {
		t.Logf("partitions: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		v, _ := rows.Values()
		t.Logf("partition %v: owner %v, leased %v, floor %v: %v pending from id %v, %v of them waiting", v...)
	}
	var claimers []string
	_ = pool.QueryRow(context.Background(), "SELECT coalesce(array_agg(claimer ORDER BY claimer), '{}') FROM outbox_claimers").Scan(&claimers)
	t.Logf("claimers: %v", claimers)
}
