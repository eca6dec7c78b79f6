package main

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/internal/dev/tlstest"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// writeFile writes b to a file of the test's and returns its path.
func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tlsHost is the name in the certificate of tlsCluster's brokers.
const tlsHost = "kafka.outbox.test"

// tlsCluster starts brokers with the topic orders that serve TLS with a
// certificate for tlsHost, signed by the CA it returns.
func tlsCluster(t *testing.T) (*tlstest.CA, *kfake.Cluster) {
	t.Helper()
	ca := tlstest.NewCA(t, "outbox test CA")
	return ca, kafkatest.NewCluster(t, []string{"orders"}, kfake.TLS(&tls.Config{MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{ca.Server(t, tlsHost)}}))
}

// The relay reaches brokers over TLS as users configure it: a CA file and
// the name in the brokers' certificate. A broker whose certificate the
// relay cannot verify is an outage of the whole cluster: the breaker
// opens, the rows wait without counting attempts, and the log says why.
func TestRunOverTLS(t *testing.T) {
	t.Parallel()
	ca, c := tlsCluster(t)
	dsn, pool := migrated(t)
	if _, err := pool.Exec(t.Context(), `INSERT INTO outbox (topic, key, payload)
SELECT 'orders', 'k' || (g % 10), 'x' FROM generate_series(1, 50) g`); err != nil {
		t.Fatal(err)
	}

	stranger := tlstest.NewCA(t, "someone else's CA")
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_KAFKA_TLS_ENABLED=true", "OUTBOX_KAFKA_TLS_SERVER_NAME="+tlsHost,
		"OUTBOX_KAFKA_TLS_CA_FILE="+writeFile(t, "stranger.pem", stranger.PEM())))
	testwait.Within(t, 30*time.Second, "the breaker opened on the unverifiable certificate", func() bool {
		out := p.output.String()
		return strings.Contains(out, "circuit opened") && strings.Contains(out, "certificate signed by unknown authority")
	})
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
	if n := countRows(t, pool, "retry_count > 0 OR status <> 'pending'"); n != 0 {
		t.Fatalf("%d rows counted attempts or left pending while the brokers' certificate could not be verified", n)
	}

	p = startRelay(t, relayEnv(dsn, c, "OUTBOX_KAFKA_TLS_ENABLED=true", "OUTBOX_KAFKA_TLS_SERVER_NAME="+tlsHost,
		"OUTBOX_KAFKA_TLS_CA_FILE="+writeFile(t, "ca.pem", ca.PEM())))
	testwait.Within(t, 30*time.Second, "every row delivered over TLS", func() bool { return countRows(t, pool, "true") == 0 })
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
}
