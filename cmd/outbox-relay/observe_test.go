package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// adminAddr waits for the relay to log its admin listener's address.
func adminAddr(t *testing.T, p *relayProcess) string {
	t.Helper()
	return logged(t, p, "admin listener started")
}

// get fetches http://addr/path and returns the status and body.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// scrape is one parsed /metrics response.
type scrape map[string]*dto.MetricFamily

func scrapeMetrics(t *testing.T, addr string) scrape {
	t.Helper()
	code, body := get(t, addr, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the sample of family name whose labels include labels.
// For histograms, name may end in _count or _sum.
func (s scrape) value(name string, labels ...string) (float64, bool) {
	field := ""
	fam := s[name]
	if fam == nil {
		for _, suffix := range []string{"_count", "_sum"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && s[base] != nil {
				fam, field = s[base], suffix
			}
		}
	}
	if fam == nil {
		return 0, false
	}
next:
	for _, m := range fam.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case field == "_count":
			return float64(m.GetHistogram().GetSampleCount()), true
		case field == "_sum":
			return m.GetHistogram().GetSampleSum(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// flakyHook answers 503 to the first request and 200 after.
type flakyHook struct{ calls atomic.Int32 }

func (f *flakyHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if f.calls.Add(1) == 1 {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// After a scripted run, /metrics shows what happened: deliveries by
// destination, a retry, dead letters by reason and destination, the
// waiting backlog by topic with its age by the database clock, and every
// circuit closed.
func TestMetricsAfterScriptedRun(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	hook := &flakyHook{}
	srv := newHTTPServer(t, hook)
	cfg := writeConfig(t, `
relay:
  payload_cap: 1000
retry:
  base_delay: 10ms
  strategy: none
destinations:
  hooks:
    http:
      url: `+srv+`/hook
      allow_private_networks: true
routes:
  - topics: ["orders"]
    destination: kafka
  - topics: ["hooks.*"]
    destination: hooks
`)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO outbox (topic, key, payload) SELECT 'orders', 'k' || (g % 10), g::text::bytea FROM generate_series(1, 100) g`)
	exec(`INSERT INTO outbox (topic, key, payload) VALUES ('orders', 'big', convert_to(repeat('x', 2000), 'UTF8'))`)
	exec(`INSERT INTO outbox (topic, payload) VALUES ('nowhere', '\x00')`)
	exec(`INSERT INTO outbox (topic, payload) VALUES ('hooks.ping', '{}')`)
	// A row that waits an hour and was written ten minutes ago.
	exec(`INSERT INTO outbox (topic, payload, created_at, next_attempt_at)
VALUES ('later', '{}', now() - interval '10 minutes', now() + interval '1 hour')`)

	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_CONFIG="+cfg))
	addr := adminAddr(t, p)
	// Without an admin token, neither the API nor the console is served.
	for _, path := range []string{"/api/v1/stats", "/console/login", "/console/"} {
		if code, _ := get(t, addr, path); code != http.StatusNotFound {
			t.Errorf("%s without an admin token: %d, want 404", path, code)
		}
	}
	testwait.Within(t, 60*time.Second, "all but the waiting row settled", func() bool {
		return countRows(t, pool, "status = 'pending'") == 1 && countRows(t, pool, "status = 'dead_lettered'") == 2
	})
	if n := hook.calls.Load(); n != 2 {
		t.Fatalf("the hook got %d requests, want 2 (a 503, then a 200)", n)
	}

	m := scrapeMetrics(t, addr)
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"outbox_delivered_total", []string{"destination", "kafka"}, 100},
		{"outbox_delivered_total", []string{"destination", "hooks"}, 1},
		{"outbox_retried_total", []string{"destination", "hooks"}, 1},
		{"outbox_retried_total", []string{"destination", "kafka"}, 0},
		{"outbox_dead_lettered_total", []string{"destination", "kafka", "reason", "too_large"}, 1},
		{"outbox_dead_lettered_total", []string{"destination", "none", "reason", "no_route"}, 1},
		{"outbox_delivery_lag_seconds_count", []string{"destination", "kafka"}, 100},
		{"outbox_delivery_lag_seconds_count", []string{"destination", "hooks"}, 1},
		{"outbox_publish_duration_seconds_count", []string{"destination", "hooks"}, 2},
		{"outbox_pending_rows", []string{"topic", "later"}, 1},
		{"outbox_dead_letters", []string{"reason", "too_large"}, 1},
		{"outbox_dead_letters", []string{"reason", "no_route"}, 1},
		{"outbox_dead_letters", []string{"reason", "permanent"}, 0},
		{"outbox_parked_keys", nil, 0},
		{"outbox_circuit_state", []string{"destination", "kafka", "state", "closed"}, 1},
		{"outbox_circuit_state", []string{"destination", "hooks", "state", "closed"}, 1},
		{"outbox_circuit_state", []string{"destination", "hooks", "state", "open"}, 0},
		{"outbox_destination_paused", []string{"destination", "kafka"}, 0},
		{"outbox_destination_paused", []string{"destination", "hooks"}, 0},
		{"outbox_build_info", nil, 1},
		{"outbox_backlog_query_failures_total", nil, 0},
	} {
		got, ok := m.value(want.name, want.labels...)
		if !ok || got != want.value {
			t.Errorf("%s%v = %v (found %v), want %v", want.name, want.labels, got, ok, want.value)
		}
	}
	if v, ok := m.value("outbox_pending_rows", "topic", "orders"); ok && v != 0 {
		t.Errorf("outbox_pending_rows{topic=orders} = %v after delivery", v)
	}
	// Ages by the database clock: the waiting row is ten minutes old.
	if age, _ := m.value("outbox_oldest_pending_age_seconds", "topic", "later"); age < 600 || age > 900 {
		t.Errorf("oldest pending age of topic later = %vs, want about 600", age)
	}
	for _, name := range []string{"outbox_publish_duration_seconds_count", "outbox_claim_duration_seconds_count"} {
		if v, _ := m.value(name); v < 1 {
			t.Errorf("%s = %v, want at least 1", name, v)
		}
	}
	// 104 rows were claimed at least once: 100 orders, the oversized
	// one, the unroutable one and the hook row (twice).
	if v, _ := m.value("outbox_batch_rows_sum"); v < 104 {
		t.Errorf("outbox_batch_rows_sum = %v, want at least 104", v)
	}
	if v, _ := m.value("outbox_delivery_lag_seconds_sum", "destination", "kafka"); v <= 0 {
		t.Errorf("outbox_delivery_lag_seconds_sum{kafka} = %v, want positive", v)
	}
	if _, ok := m.value("go_goroutines"); !ok {
		t.Error("no go_goroutines: the Go collector is missing")
	}
	for _, fam := range m {
		for _, mt := range fam.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "id" || strings.Contains(lp.GetValue(), "127.0.0.1") {
					t.Errorf("%s has a high-cardinality label %s=%q", fam.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
}

func newHTTPServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// gateHook answers 401 while refusing is set (a systemic failure: the
// destination as a whole is unusable), holds requests while a gate is
// set, and answers 200 otherwise.
type gateHook struct {
	refusing atomic.Bool
	mu       sync.Mutex
	gate     chan struct{}
	held     chan struct{} // receives when a request is being held
	ok       atomic.Int32
}

func (g *gateHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if g.refusing.Load() {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		select {
		case g.held <- struct{}{}:
		default:
		}
		<-gate
	}
	g.ok.Add(1)
	w.WriteHeader(http.StatusOK)
}

// /readyz answers 503 while the database is down, while a destination's
// circuit is open and while the relay drains, and 200 otherwise; /livez
// answers 200 throughout. No log line shows the database password or a
// token, at debug level, through the outage.
func TestHealthEndpointsAndSecretFreeLogs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := crashableServer(t)
	// The server trusts local connections: any password is accepted, and
	// none may be logged.
	const password = "Pa55-w0rd-never-logged"
	const adminToken = "admin-token-never-logged-0123"
	const hookToken = "hook-token-never-logged-4567"
	dsn := strings.Replace(pg.DSN("postgres"), "postgres@", "postgres:"+password+"@", 1)
	if r := runBinary(t, []string{"OUTBOX_DATABASE_URL=" + dsn}, "migrate", "up"); r.code != 0 {
		t.Fatalf("migrate up: %s", r.stderr)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	c := kafkatest.NewCluster(t, []string{"orders"})
	hook := &gateHook{held: make(chan struct{}, 1)}
	srv := newHTTPServer(t, hook)
	tokenFile := filepath.Join(t.TempDir(), "hook-token")
	if err := os.WriteFile(tokenFile, []byte(hookToken), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, `
retry:
  pause_base: 50ms
  pause_max: 200ms
destinations:
  hooks:
    http:
      url: `+srv+`/hook
      allow_private_networks: true
      auth:
        bearer_token_file: `+tokenFile+`
routes:
  - topics: ["orders"]
    destination: kafka
  - topics: ["hooks.*"]
    destination: hooks
`)
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_CONFIG="+cfg, "OUTBOX_LOG_LEVEL=debug", "OUTBOX_ADMIN_TOKEN="+adminToken, "OUTBOX_ADMIN_ROLES=admin=viewer"))
	addr := adminAddr(t, p)
	status := func(path string) func() (int, string) {
		return func() (int, string) { return get(t, addr, path) }
	}
	readyz, livez := status("/readyz"), status("/livez")
	waitStatus := func(what string, f func() (int, string), code int, contains string) {
		t.Helper()
		testwait.State(t, 60*time.Second, func() (bool, string) {
			c, body := f()
			return c == code && strings.Contains(body, contains),
				fmt.Sprintf("timed out waiting for %s: last answer %d %q; relay output:\n%s", what, c, body, p.output)
		})
	}
	// Ready, with the wake-up notifications' probe seen.
	waitStatus("ready", readyz, http.StatusOK, `"state": "arriving"`)
	if code, body := livez(); code != http.StatusOK || !strings.Contains(body, `"status":"ok"`) || !strings.Contains(body, `"go_version":"go`) {
		t.Fatalf("/livez: %d %s", code, body)
	}
	insert := func(topic string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO outbox (topic, payload) VALUES ($1, '{}')`, topic); err != nil {
			t.Fatal(err)
		}
	}

	// The database goes down and comes back.
	if err := pg.Halt(ctx); err != nil {
		t.Fatal(err)
	}
	waitStatus("not ready while the database is down", readyz, http.StatusServiceUnavailable, `"database: not reachable"`)
	if code, _ := livez(); code != http.StatusOK {
		t.Fatalf("/livez while the database is down: %d", code)
	}
	if err := pg.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	waitStatus("ready once the database is back", readyz, http.StatusOK, `"ready": true`)

	// A destination fails as a whole (401): its circuit opens.
	hook.refusing.Store(true)
	insert("hooks.a")
	waitStatus("not ready while the hook destination fails", readyz, http.StatusServiceUnavailable,
		"destination hooks: failing; circuit open, its rows wait: POST "+srv+"/hook: 401 Unauthorized")
	// The circuit opens before the batch is written back, and the
	// deferral is counted after.
	testwait.Within(t, 30*time.Second, "the systemic failure's deferral counted", func() bool {
		v, _ := scrapeMetrics(t, addr).value("outbox_deferred_total", "destination", "hooks", "reason", "destination_failing")
		return v >= 1
	})
	if code, _ := livez(); code != http.StatusOK {
		t.Fatalf("/livez while a destination fails: %d", code)
	}
	hook.refusing.Store(false)
	waitStatus("ready once the destination recovers", readyz, http.StatusOK, `"ready": true`)
	testwait.Within(t, 30*time.Second, "the deferred row delivered", func() bool { return hook.ok.Load() == 1 })

	// Draining: a delivery is held while the relay stops.
	gate := make(chan struct{})
	hook.mu.Lock()
	hook.gate = gate
	hook.mu.Unlock()
	insert("hooks.b")
	select {
	case <-hook.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the hook never got the row")
	}
	p.signal(t, syscall.SIGTERM)
	waitStatus("not ready while draining", readyz, http.StatusServiceUnavailable, "draining")
	if code, _ := livez(); code != http.StatusOK {
		t.Fatalf("/livez while draining: %d", code)
	}
	close(gate)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
	if hook.ok.Load() != 2 {
		t.Errorf("the hook acknowledged %d rows, want 2", hook.ok.Load())
	}

	logs := p.output.String()
	if !strings.Contains(logs, "level=DEBUG") || !strings.Contains(logs, "batch failed") {
		t.Fatalf("expected debug logs and the outage's errors; got:\n%s", logs)
	}
	for _, secret := range []string{password, adminToken, hookToken} {
		if strings.Contains(logs, secret) {
			t.Errorf("a log line shows the secret %q:\n%s", secret, logs)
		}
	}
}

// A topic the cluster lacks pauses alone, as users see it: a log line, the
// topic's gauge, a line in /readyz while the relay stays ready, and the
// rest of the cluster delivered.
func TestPausedTopicIsReported(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (topic, key, payload)
SELECT CASE WHEN g % 10 = 0 THEN 'orders-typo' ELSE 'orders' END, 'k' || (g % 7), 'x' FROM generate_series(1, 200) g`); err != nil {
		t.Fatal(err)
	}
	// A long cool-down keeps the topic paused while the test looks.
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_RETRY_PAUSE_BASE=1m", "OUTBOX_RETRY_PAUSE_MAX=1m"))
	addr := adminAddr(t, p)
	testwait.Within(t, 60*time.Second, "the other keys' rows delivered and the topic paused", func() bool {
		v, ok := scrapeMetrics(t, addr).value("outbox_topic_paused", "destination", "kafka", "topic", "orders-typo")
		return ok && v == 1 && countRows(t, pool, "topic = 'orders' AND status = 'pending'") < 180
	})
	m := scrapeMetrics(t, addr)
	if v, _ := m.value("outbox_destination_paused", "destination", "kafka"); v != 0 {
		t.Errorf("outbox_destination_paused{kafka} = %v; a missing topic must not pause its cluster", v)
	}
	code, body := get(t, addr, "/readyz")
	var rd struct {
		Ready        bool
		Destinations []struct {
			Name    string
			Circuit string
			Paused  []struct {
				Topic     string
				Partition *int
				State     string `json:"state"`
				LastError string `json:"last_error"`
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &rd); err != nil {
		t.Fatalf("/readyz: %v\n%s", err, body)
	}
	if code != http.StatusOK || !rd.Ready || len(rd.Destinations) != 1 || rd.Destinations[0].Circuit != "closed" ||
		len(rd.Destinations[0].Paused) != 1 || rd.Destinations[0].Paused[0].Topic != "orders-typo" ||
		rd.Destinations[0].Paused[0].Partition != nil || rd.Destinations[0].Paused[0].State != "waiting" ||
		!strings.Contains(rd.Destinations[0].Paused[0].LastError, "Unknown Topic Or Partition") {
		t.Errorf("/readyz = %d:\n%s\nwant 200, ready, and the paused topic waiting with its error", code, body)
	}
	if !strings.Contains(p.output.String(), `msg="topic failing; paused, its rows wait while the rest of the destination flows" destination=kafka topic=orders-typo`) {
		t.Errorf("no log line for the paused topic:\n%s", p.output)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
}
