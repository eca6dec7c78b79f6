package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/internal/dev/tlstest"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// mountedSecret is a directory laid out as Kubernetes mounts a Secret:
// each key a symbolic link into ..data, itself a link to a timestamped
// directory; an update writes a new directory and swaps ..data in one
// rename.
type mountedSecret struct {
	t   *testing.T
	dir string
	n   int
}

func newMountedSecret(t *testing.T, files map[string]string) *mountedSecret {
	t.Helper()
	m := &mountedSecret{t: t, dir: t.TempDir()}
	m.update(files)
	return m
}

func (m *mountedSecret) path(name string) string { return filepath.Join(m.dir, name) }

// update replaces every file's contents at once.
func (m *mountedSecret) update(files map[string]string) {
	m.t.Helper()
	m.n++
	version := fmt.Sprintf("..2026_11_25_%02d", m.n)
	if err := os.Mkdir(filepath.Join(m.dir, version), 0o700); err != nil {
		m.t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(m.dir, version, name), []byte(body), 0o600); err != nil {
			m.t.Fatal(err)
		}
	}
	tmp := filepath.Join(m.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, "..data")); err != nil {
		m.t.Fatal(err)
	}
	if m.n > 1 {
		_ = os.RemoveAll(filepath.Join(m.dir, fmt.Sprintf("..2026_11_25_%02d", m.n-1)))
	}
	for name := range files { // a link for each new key
		link := filepath.Join(m.dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			m.t.Fatal(err)
		}
	}
}

// seen is what a webhook receiver was sent: each request's authorization
// and which signing secret verifies it.
type seen struct {
	mu       sync.Mutex
	secrets  map[string]string // name → whsec_ secret
	requests []string          // "<authorization> signed:<names>"
}

func (s *seen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var signed []string
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, secret := range s.secrets {
		if wh, err := standardwebhooks.NewWebhook(secret); err == nil && wh.Verify(body, r.Header) == nil {
			signed = append(signed, name)
		}
	}
	sort.Strings(signed)
	s.requests = append(s.requests, r.Header.Get("Authorization")+" signed:"+strings.Join(signed, "+"))
}

func (s *seen) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.requests) == 0 {
		return ""
	}
	return s.requests[len(s.requests)-1]
}

func whsec(t *testing.T) string {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(key)
}

// A running relay takes rotated secrets from files Kubernetes updates in
// place, and on SIGHUP: a webhook's bearer token and signing secrets, and
// the dead-letter API's tokens. A bad new value is refused with a log
// line, and the old one stays in use.
func TestRunReloadsSecrets(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	oldKey, newKey := whsec(t), whsec(t)
	rc := &seen{secrets: map[string]string{"old": oldKey, "new": newKey}}
	srv := httptest.NewServer(rc)
	defer srv.Close()

	hook := newMountedSecret(t, map[string]string{"token": "token-one\n", "signing": oldKey})
	admin := newMountedSecret(t, map[string]string{"alice": "alice-token-0123456789"})
	cfgFile := writeFile(t, "relay.yaml", []byte(`
admin:
  tokens_dir: `+admin.dir+`
  roles: [alice=operator, bob=viewer]
destinations:
  hook:
    http:
      url: `+srv.URL+`
      allow_private_networks: true
      auth:
        bearer_token_file: `+hook.path("token")+`
      signing:
        secrets_file: `+hook.path("signing")+`
routes:
  - topics: ["events"]
    destination: hook
  - topics: ["orders"]
    destination: kafka
`))
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_CONFIG="+cfgFile))
	apiAddr := adminAddr(t, p)
	deliver := func(n int, want string) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('events', 'k', $1)`, []byte(fmt.Sprint(n))); err != nil {
			t.Fatal(err)
		}
		testwait.Within(t, 30*time.Second, fmt.Sprintf("row %d delivered", n), func() bool { return countRows(t, pool, "true") == 0 })
		if got := rc.last(); got != want {
			t.Fatalf("row %d sent with %q, want %q", n, got, want)
		}
	}
	stats := func(token string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+apiAddr+"/api/v1/stats", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	reloads := func() int { return strings.Count(p.output.String(), `msg=reloaded`) }

	deliver(1, "Bearer token-one signed:old")

	// Rotation: a new token, and both signing secrets while receivers
	// move to the new one (the first signs).
	hook.update(map[string]string{"token": "token-two", "signing": newKey + " " + oldKey})
	testwait.Within(t, 30*time.Second, "the webhook's secrets reloaded", func() bool {
		return strings.Contains(p.output.String(), `msg=reloaded parts="[destination hook]" trigger="files changed"`)
	})
	deliver(2, "Bearer token-two signed:new+old")

	admin.update(map[string]string{"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"})
	testwait.Within(t, 30*time.Second, "the API's tokens reloaded", func() bool {
		return strings.Contains(p.output.String(), `msg=reloaded parts="[admin tokens]"`)
	})
	if code := stats("bob-token-0123456789ab"); code != http.StatusOK {
		t.Fatalf("bob's new token: %d", code)
	}

	// A bad secret is refused; the running ones stay.
	before := reloads()
	hook.update(map[string]string{"token": "token-three", "signing": "not-a-secret"})
	p.waitForLog(t, `msg="configuration not reloaded: the running one is kept"`)
	if !strings.Contains(p.output.String(), "signing secret 1") {
		t.Errorf("the refusal does not say which setting is wrong:\n%s", p.output)
	}
	deliver(3, "Bearer token-two signed:new+old")
	if code := stats("alice-token-0123456789"); code != http.StatusOK {
		t.Fatalf("alice's token after a refused reload: %d", code)
	}

	// Fixed, and asked for by SIGHUP, which does not stop the relay.
	hook.update(map[string]string{"token": "token-three", "signing": newKey})
	testwait.Within(t, 30*time.Second, "the fixed secrets reloaded", func() bool { return reloads() > before })
	deliver(4, "Bearer token-three signed:new")
	p.signal(t, syscall.SIGHUP)
	p.waitForLog(t, `msg="reloaded: nothing changed" trigger=SIGHUP`)
	deliver(5, "Bearer token-three signed:new")

	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
}

// A Kafka SASL password rotated in its file reaches the running relay:
// with the wrong one the brokers refuse it and the rows wait; once the file
// holds the right one, they are delivered without a restart.
func TestRunReloadsTheKafkaPassword(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders"}, kfake.EnableSASL(), kfake.Superuser("PLAIN", "relay", "right-password"))
	secret := newMountedSecret(t, map[string]string{"password": "wrong-password"})
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload) SELECT 'orders', 'k' || g, 'x' FROM generate_series(1, 20) g`); err != nil {
		t.Fatal(err)
	}
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_KAFKA_SASL_MECHANISM=plain", "OUTBOX_KAFKA_SASL_USERNAME=relay",
		"OUTBOX_KAFKA_SASL_PASSWORD_FILE="+secret.path("password")))
	p.waitForLog(t, "circuit opened")
	if n := countRows(t, pool, "status = 'pending' AND retry_count = 0"); n != 20 {
		t.Fatalf("%d of 20 rows pending without an attempt counted while the password is wrong", n)
	}
	secret.update(map[string]string{"password": "right-password"})
	p.waitForLog(t, `msg=reloaded parts="[destination kafka]"`)
	testwait.Within(t, 60*time.Second, "rows delivered with the new password", func() bool { return countRows(t, pool, "true") == 0 })
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
}

// A CA bundle replaced in its file reaches the running relay: brokers whose
// certificate it could not verify are reached once the file holds their
// CA.
func TestRunReloadsTheKafkaCABundle(t *testing.T) {
	t.Parallel()
	ca, c := tlsCluster(t)
	dsn, pool := migrated(t)
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload) SELECT 'orders', 'k' || g, 'x' FROM generate_series(1, 20) g`); err != nil {
		t.Fatal(err)
	}
	secret := newMountedSecret(t, map[string]string{"ca.pem": string(tlstest.NewCA(t, "someone else's CA").PEM())})
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_KAFKA_TLS_ENABLED=true", "OUTBOX_KAFKA_TLS_SERVER_NAME="+tlsHost,
		"OUTBOX_KAFKA_TLS_CA_FILE="+secret.path("ca.pem")))
	p.waitForLog(t, "certificate signed by unknown authority")
	secret.update(map[string]string{"ca.pem": string(ca.PEM())})
	p.waitForLog(t, `msg=reloaded parts="[destination kafka]"`)
	testwait.Within(t, 60*time.Second, "rows delivered once the CA bundle is right", func() bool { return countRows(t, pool, "true") == 0 })
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
}
