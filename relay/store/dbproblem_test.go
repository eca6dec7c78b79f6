package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// A claim that finds every connection of its pool in use fails as
// pool_exhausted; one that waits on a lock past its deadline as
// query_timeout; both against the real server.
func TestClaimFailuresAreExplained(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', 'x')`)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st, err := store.New(pool, store.Config{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	claimWithin := func(d time.Duration) error {
		cctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		c, err := st.Claim(cctx, store.ClaimParams{Limit: 10, PayloadCap: 1 << 20})
		if err == nil {
			_ = c.Release(ctx)
		}
		return err
	}

	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = claimWithin(200 * time.Millisecond)
	held.Release()
	if p, ok := store.ExplainDBError(err); !ok || p.Kind != "pool_exhausted" || !errors.Is(err, store.ErrPoolExhausted) {
		t.Fatalf("claim with the only connection held: %v explained as %+v, want pool_exhausted", err, p)
	}

	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	err = claimWithin(300 * time.Millisecond)
	if p, ok := store.ExplainDBError(err); !ok || p.Kind != "query_timeout" {
		t.Fatalf("claim behind a lock: %v explained as %+v, want query_timeout", err, p)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := claimWithin(10 * time.Second); err != nil {
		t.Fatalf("claim once the lock is gone: %v", err)
	}
}

// Server errors of the edges are explained by their SQLSTATE, and others
// are not.
func TestExplainDBErrorBySQLState(t *testing.T) {
	t.Parallel()
	for code, kind := range map[string]string{
		"53300": "too_many_connections", "57014": "statement_timeout", "25006": "read_only",
		"57P01": "server_unavailable", "57P03": "server_unavailable", "26000": "prepared_statements",
		"42P05": "prepared_statements", "23505": "",
	} {
		p, ok := store.ExplainDBError(&pgconn.PgError{Code: code})
		if ok != (kind != "") || p.Kind != kind {
			t.Errorf("SQLSTATE %s explained as %+v (%v), want %q", code, p, ok, kind)
		}
		if p.Reconnect != (kind == "read_only" || kind == "server_unavailable") {
			t.Errorf("SQLSTATE %s: reconnect %v", code, p.Reconnect)
		}
	}
}
