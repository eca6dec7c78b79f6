package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// relayRole creates a login role that may use the outbox of the database
// pool is on, as a relay in production does: a role that is not a
// superuser, so that connection limits apply to it. It returns the role's
// name and a DSN that logs in as it.
func relayRole(t *testing.T, dsn string, pool *pgxpool.Pool) (string, string) {
	t.Helper()
	role := pgtest.UniqueName("relay")
	ctx := context.Background()
	id := pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		"CREATE ROLE " + id + " LOGIN",
		"GRANT USAGE ON SCHEMA public TO " + id,
		"GRANT ALL ON ALL TABLES IN SCHEMA public TO " + id,
		"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO " + id,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		_, _ = pool.Exec(ctx, "DROP OWNED BY "+id)
		_, _ = pool.Exec(ctx, "DROP ROLE "+id)
	})
	return role, strings.Replace(dsn, "postgres://postgres@", "postgres://"+role+"@", 1)
}

// waitForLog waits until the relay has logged a line containing text,
// and fails at once, with what it logged, if it exits first.
func (p *relayProcess) waitForLog(t *testing.T, text string) {
	t.Helper()
	testwait.State(t, 60*time.Second, func() (bool, string) {
		out := p.output.String()
		select {
		case <-p.done:
			return true, ""
		default:
		}
		return strings.Contains(out, text), "timed out waiting for the relay to log " + text + "\nit logged:\n" + out
	})
	if out := p.output.String(); !strings.Contains(out, text) {
		t.Fatalf("the relay exited without logging %s; it logged:\n%s", text, out)
	}
}

// The relay rides out what a database does at the edges of its operation,
// each with one clear log line and without exiting, losing or
// dead-lettering a row: no connection slot left when it starts, a server
// that turns read-only (a failover, simulated by the role's default
// transaction mode), and a claim that runs past the statement timeout
// while a lock holds the table.
func TestRunRidesOutDatabaseEdges(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	role, roleDSN := relayRole(t, dsn, pool)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	id := pgx.Identifier{role}.Sanitize()
	// setRole changes a setting of the role's sessions: it holds for the
	// sessions that start after it, so every older one is ended, and
	// waited for (a session that was starting as the setting changed may
	// have read the old one, and ending sessions takes a moment).
	setRole := func(setting string) {
		t.Helper()
		exec("ALTER ROLE " + id + " " + setting)
		var changed time.Time
		if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&changed); err != nil {
			t.Fatal(err)
		}
		older := fmt.Sprintf("usename = '%s' AND backend_start <= '%s'", role, changed.Format(time.RFC3339Nano))
		testwait.Within(t, 30*time.Second, "the role's older sessions ended", func() bool {
			exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE " + older)
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE "+older).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0
		})
	}
	insert := func(n int) {
		exec("INSERT INTO outbox (topic, key, payload) SELECT 'orders', 'k' || g % 3, 'x' FROM generate_series(1, " + fmt.Sprint(n) + ") g")
	}
	delivered := func(what string) {
		t.Helper()
		testwait.Within(t, 60*time.Second, what, func() bool { return countRows(t, pool, "true") == 0 })
	}

	// No slot for the relay's role: it waits rather than exits.
	exec("ALTER ROLE " + id + " CONNECTION LIMIT 0")
	insert(10)
	p := startRelay(t, relayEnv(roleDSN, c, "OUTBOX_DATABASE_QUERY_TIMEOUT=2s"))
	p.waitForLog(t, `msg="waiting for the database: the database server has no connection slot left`)
	exec("ALTER ROLE " + id + " CONNECTION LIMIT -1")
	delivered("rows delivered once the role may connect")

	// A failover: the connections now reach a read-only server. The relay
	// drops them, and connects again until the server takes writes.
	setRole("SET default_transaction_read_only = on")
	insert(10)
	p.waitForLog(t, `msg="database: the database server is read-only`)
	if n := countRows(t, pool, "status = 'pending'"); n != 10 {
		t.Fatalf("%d rows pending while the server is read-only, want 10", n)
	}
	exec("ALTER ROLE " + id + " RESET default_transaction_read_only")
	delivered("rows delivered once the server takes writes")

	// A lock holds the table past the statement timeout of the claims.
	setRole("SET statement_timeout = '300ms'")
	insert(10)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	p.waitForLog(t, `msg="database: a statement ran past the server's statement_timeout`)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	delivered("rows delivered once the lock is gone")

	if n := countRows(t, pool, "status <> 'pending'"); n != 0 {
		t.Fatalf("%d rows left the pending state without delivery", n)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if got := kafkatest.ConsumeAll(cctx, t, c, "orders"); len(got) < 30 {
		t.Fatalf("%d messages, want every one of the 30 rows", len(got))
	}
}
