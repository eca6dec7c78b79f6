package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/internal/dev/tlstest"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// adminHost is the name in the admin listeners' test certificate.
const adminHost = "admin.outbox.test"

// adminTLSFiles writes a certificate for adminHost signed by a new CA and
// its key into dir, replacing those there, and returns their paths and a
// client that trusts the CA.
func adminTLSFiles(t *testing.T, dir string) (certFile, keyFile string, client *http.Client) {
	t.Helper()
	ca := tlstest.NewCA(t, "admin test CA")
	cert, key := tlstest.PEM(t, ca.Server(t, adminHost))
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for path, b := range map[string][]byte{certFile: cert, keyFile: key} {
		if err := os.WriteFile(path+".new", b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, path := range []string{keyFile, certFile} {
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: adminHost}}}
	return certFile, keyFile, client
}

// logged waits for the relay to log msg with an address and returns it.
func logged(t *testing.T, p *relayProcess, msg string) string {
	t.Helper()
	re := regexp.MustCompile(`msg="` + regexp.QuoteMeta(msg) + `" address=(\S+)`)
	var addr string
	testwait.Within(t, 30*time.Second, msg, func() bool {
		if m := re.FindStringSubmatch(p.output.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return addr
}

// The admin surface as an operator locks it down: probes and metrics on
// one listener, the dead-letter API on another, both over HTTPS; several
// named tokens accepted at once, and the audit naming the one each change
// came with. A renewed certificate is served without a restart.
func TestAdminListenersTLSAndNamedTokens(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	id := deadLetter(t, pool, letter{topic: "orders", key: "k", err: "HTTP 400"})

	dir := t.TempDir()
	certFile, keyFile, client := adminTLSFiles(t, dir)
	tokens := filepath.Join(dir, "tokens")
	const alice, ci = "alice-token-0123456789", "ci-token-0123456789abc"
	// Kubernetes keeps a mounted Secret's files behind dot-named entries.
	for path, b := range map[string]string{"..data/alice": alice, "..data/ci": ci, "..data/.hidden": "not a token at all"} {
		if err := os.MkdirAll(filepath.Join(tokens, filepath.Dir(path)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tokens, path), []byte(b+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"alice", "ci"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(tokens, name)); err != nil {
			t.Fatal(err)
		}
	}
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_ADMIN_API_LISTEN=127.0.0.1:0", "OUTBOX_ADMIN_TOKENS_DIR="+tokens, "OUTBOX_ADMIN_ROLES=alice=operator,ci=operator",
		"OUTBOX_ADMIN_TLS_CERT_FILE="+certFile, "OUTBOX_ADMIN_TLS_KEY_FILE="+keyFile))
	ops := "https://" + logged(t, p, "admin listener started")
	api := "https://" + logged(t, p, "dead-letter API listener started")

	do := func(method, url, token, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		method, url, token string
		want               int
	}{
		{"GET", ops + "/livez", "", 200},
		{"GET", ops + "/metrics", "", 200},
		{"GET", ops + "/api/v1/stats", alice, 404}, // not on the probes' listener
		{"GET", api + "/api/v1/stats", alice, 200},
		{"GET", api + "/api/v1/stats", ci, 200},
		{"GET", api + "/api/v1/stats", "", 401},
		{"GET", api + "/api/v1/stats", "not a token at all", 401},
		{"GET", api + "/metrics", "", 404},
		{"GET", api + "/livez", "", 404},
		{"GET", api + "/console/login", "", 200}, // the console beside the API
		{"GET", ops + "/console/login", "", 404},
	} {
		if code, body := do(tc.method, tc.url, tc.token, ""); code != tc.want {
			t.Errorf("%s %s: %d, want %d: %s", tc.method, tc.url, code, tc.want, body)
		}
	}
	// Over HTTPS the console's cookies are for HTTPS only.
	resp, err := client.Get(api + "/console/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if c := resp.Header.Get("Set-Cookie"); !strings.Contains(c, "Secure") || !strings.Contains(c, "HttpOnly") {
		t.Errorf("the console's cookie over HTTPS: %q, want Secure and HttpOnly", c)
	}
	// Plain HTTP reaches neither listener.
	if resp, err := http.Get("http://" + strings.TrimPrefix(api, "https://") + "/api/v1/stats"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the API listener: %d, want 400", resp.StatusCode)
		}
	}

	if code, body := do("POST", api+"/api/v1/dead-letters/discard", ci, fmt.Sprintf(`{"ids":[%d],"reason":"duplicate","actor":"nightly-job"}`, id)); code != 200 {
		t.Fatalf("discard: %d %s", code, body)
	}
	cl := &cli{t: t, env: []string{"OUTBOX_DATABASE_URL=" + dsn, "OUTBOX_ACTOR=alice"}}
	if out := cl.ok("dlq", "audit"); !regexp.MustCompile(`nightly-job\s+api \(token ci\)\s+discard`).MatchString(out) {
		t.Fatalf("the audit does not name the token:\n%s", out)
	}

	// A renewed certificate, from another CA.
	_, _, client = adminTLSFiles(t, dir)
	p.waitForLog(t, `msg=reloaded parts="[admin certificate]"`)
	if code, body := do("GET", ops+"/livez", "", ""); code != 200 {
		t.Fatalf("with the renewed certificate: %d %s", code, body)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
}
