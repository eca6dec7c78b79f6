package main

import (
	"context"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgserver"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// The relay works through PgBouncer. In session mode its wake-up
// notifications arrive; in transaction mode they cannot, and the relay
// says so within its probe's timeout and delivers by polling, given a URL
// that asks pgx not to cache prepared statements, which a
// transaction-mode PgBouncer older than 1.21 cannot keep. Without it, the
// relay names the cause of its failures.
func TestRunThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, mode, query, log string
		delivers               bool
	}{
		{"session", "session", "", `msg="wake-up notifications are arriving"`, true},
		{"transaction", "transaction", "&default_query_exec_mode=exec", `msg="wake-up notifications are not arriving; polling every relay.poll_interval instead. Behind a transaction-mode pooler (PgBouncer pool_mode=transaction) LISTEN cannot work`, true},
		{"transaction, statements cached", "transaction", "", `msg="database: the connection's prepared statements went missing or collide`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn, pool := migrated(t)
			u, err := url.Parse(dsn)
			if err != nil {
				t.Fatal(err)
			}
			b, err := pgserver.StartBouncer(context.Background(), pgtest.URL(t), tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Stop() })
			c := kafkatest.NewCluster(t, []string{"orders"})
			if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
				SELECT 'orders', 'k' || (g % 7), g::text::bytea FROM generate_series(1, 100) g`); err != nil {
				t.Fatal(err)
			}
			p := startRelay(t, relayEnv(b.DSN(strings.TrimPrefix(u.Path, "/"))+tc.query, c))
			p.waitForLog(t, tc.log)
			if !strings.Contains(b.Log(), "login attempt: db="+strings.TrimPrefix(u.Path, "/")) {
				t.Fatalf("the relay did not log in through PgBouncer:\n%s", b.Log())
			}
			if !tc.delivers {
				p.signal(t, syscall.SIGKILL)
				p.wait(t, 60*time.Second)
				return
			}
			if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
				SELECT 'orders', 'k' || (g % 7), g::text::bytea FROM generate_series(101, 200) g`); err != nil {
				t.Fatal(err)
			}
			testwait.Within(t, 60*time.Second, "rows delivered", func() bool { return countRows(t, pool, "true") == 0 })
			p.signal(t, syscall.SIGTERM)
			if code := p.wait(t, 60*time.Second); code != 0 {
				t.Fatalf("exit code %d; output:\n%s", code, p.output)
			}
			if out := p.output.String(); strings.Contains(out, "level=ERROR") {
				t.Errorf("errors through PgBouncer in %s mode:\n%s", tc.mode, out)
			}
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if got := kafkatest.ConsumeAll(cctx, t, c, "orders"); len(got) != 200 {
				t.Fatalf("%d messages, want 200", len(got))
			}
		})
	}
}
