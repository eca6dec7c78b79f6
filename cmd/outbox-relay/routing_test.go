package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// endpoint is a webhook receiver that checks what the relay sends.
type endpoint struct {
	t      *testing.T
	token  string
	secret string
	mu     sync.Mutex
	bodies map[string][]int // per key, the payloads (row numbers) in arrival order
	total  int
}

func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if e.token != "" && r.Header.Get("Authorization") != "Bearer "+e.token {
		e.t.Errorf("authorization %q", r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if e.secret != "" {
		wh, err := standardwebhooks.NewWebhook(e.secret)
		if err != nil || wh.Verify(body, r.Header) != nil {
			e.t.Errorf("signature does not verify (%v)", err)
		}
	}
	n, err := strconv.Atoi(string(body))
	if err != nil {
		e.t.Errorf("body %q", body)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.bodies[r.Header.Get("X-Key")] = append(e.bodies[r.Header.Get("X-Key")], n)
	e.total++
}

func (e *endpoint) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.total
}

// inOrder checks that every key's rows arrived in ascending order.
func inOrder(t *testing.T, where string, byKey map[string][]int) {
	t.Helper()
	for k, ns := range byKey {
		for i := 1; i < len(ns); i++ {
			if ns[i] < ns[i-1] {
				t.Errorf("%s, key %s: %d arrived after %d", where, k, ns[i], ns[i-1])
				break
			}
		}
	}
}

func TestRunRoutesTopicsToKafkaAndHTTP(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders", "payments.v1"})

	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	billing := &endpoint{t: t, token: "billing-token", bodies: map[string][]int{}}
	crm := &endpoint{t: t, secret: secret, bodies: map[string][]int{}}
	billingSrv, crmSrv := httptest.NewServer(billing), httptest.NewServer(crm)
	defer billingSrv.Close()
	defer crmSrv.Close()

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("billing-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(cfgFile, []byte(`
destinations:
  billing:
    http:
      url: `+billingSrv.URL+`/hooks
      allow_private_networks: true
      auth:
        bearer_token_file: `+tokenFile+`
  crm:
    http:
      url: `+crmSrv.URL+`/events?tenant=7
      allow_private_networks: true
      signing:
        secrets_env: CRM_SIGNING_SECRETS
routes:
  - topics: ["billing.*"]
    destination: billing
  - topics: ["crm.contact.*"]
    destination: crm
  - topics: ["payments"]
    destination: kafka
    topic: payments.v1
  - topics: ["orders"]
    destination: kafka
`), 0o600); err != nil {
		t.Fatal(err)
	}

	// 2,000 rows over four topics and 20 keys; each key's rows go to all
	// four places. The key travels in a header for the HTTP receivers.
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload, headers)
SELECT (ARRAY['orders', 'payments', 'billing.invoice', 'crm.contact.updated'])[1 + g % 4], 'k' || (g % 20),
       g::text::bytea, jsonb_build_object('X-Key', 'k' || (g % 20))
FROM generate_series(1, 2000) g`); err != nil {
		t.Fatal(err)
	}
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_CONFIG="+cfgFile, "CRM_SIGNING_SECRETS="+secret+" "+secret))
	testwait.Within(t, 90*time.Second, "every row delivered", func() bool { return countRows(t, pool, "true") == 0 })
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
	if billing.count() != 500 || crm.count() != 500 {
		t.Fatalf("billing got %d requests, crm %d; want 500 each", billing.count(), crm.count())
	}
	inOrder(t, "billing", billing.bodies)
	inOrder(t, "crm", crm.bodies)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for topic, want := range map[string]int{"orders": 500, "payments.v1": 500} {
		msgs := kafkatest.ConsumeAll(ctx, t, c, topic)
		if len(msgs) != want {
			t.Fatalf("topic %s: %d messages, want %d", topic, len(msgs), want)
		}
		byKey := map[string][]int{}
		for _, m := range msgs {
			n, _ := strconv.Atoi(string(m.Value))
			if n%4 != map[string]int{"orders": 0, "payments.v1": 1}[topic] {
				t.Fatalf("topic %s got row %d", topic, n)
			}
			byKey[string(m.Key)] = append(byKey[string(m.Key)], n)
		}
		inOrder(t, topic, byKey)
	}
	if strings.Contains(p.output.String(), "billing-token") || strings.Contains(p.output.String(), secret) {
		t.Fatal("a secret appears in the relay's output")
	}
}

func TestRunLeasedDeliveryAfterCrash(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, nil)
	type arrival struct {
		at  time.Time
		key string
	}
	arrivals := make(chan arrival, 10)
	hang := make(chan struct{})
	var first sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		arrivals <- arrival{time.Now(), r.Header.Get("Idempotency-Key")}
		hung := false
		first.Do(func() { hung = true })
		if hung {
			select { // the first delivery never finishes: its relay dies
			case <-hang:
			case <-r.Context().Done():
			}
		}
	}))
	defer srv.Close()
	defer close(hang) // before the server closes
	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(cfgFile, []byte(`
destinations:
  slow:
    visibility_timeout: 2s
    http:
      url: `+srv.URL+`
      allow_private_networks: true
routes:
  - topics: ["*"]
    destination: slow
`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := relayEnv(dsn, c, "OUTBOX_CONFIG="+cfgFile)
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}')`); err != nil {
		t.Fatal(err)
	}
	p1 := startRelay(t, env)
	var a1 arrival
	select {
	case a1 = <-arrivals:
	case <-time.After(30 * time.Second):
		t.Fatalf("no delivery; output:\n%s", p1.output)
	}
	var leaseEnd time.Time
	if err := pool.QueryRow(context.Background(), `SELECT next_attempt_at FROM outbox WHERE lease_token IS NOT NULL AND retry_count = 1`).Scan(&leaseEnd); err != nil {
		t.Fatalf("the row is not leased during its delivery: %v", err)
	}
	p1.signal(t, syscall.SIGKILL) // mid-delivery
	p1.wait(t, 30*time.Second)

	startRelay(t, env)
	var a2 arrival
	select {
	case a2 = <-arrivals:
	case <-time.After(30 * time.Second):
		t.Fatal("the row was not delivered again after the lease ended")
	}
	if a2.key != a1.key {
		t.Errorf("Idempotency-Key changed across deliveries: %s, %s", a1.key, a2.key)
	}
	var dbNow time.Time
	if err := pool.QueryRow(context.Background(), `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	// Compare on the database clock: the second delivery came after the
	// lease ended, not before.
	if skew := time.Since(dbNow); a2.at.Add(-skew).Before(leaseEnd.Add(-50 * time.Millisecond)) {
		t.Errorf("redelivered at %s, before the lease ended at %s", a2.at.Add(-skew), leaseEnd)
	}
	testwait.Within(t, 30*time.Second, "the row gone", func() bool { return countRows(t, pool, "true") == 0 })
}
