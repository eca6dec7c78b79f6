package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

func strictStore(t *testing.T, s *pgtest.Schema) *store.Store {
	t.Helper()
	st, err := store.New(s.Pool, store.Config{Schema: s.Name, StrictOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// begin opens a transaction on a connection of its own; the test ends it.
func begin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func insertIn(t *testing.T, tx pgx.Tx, key, payload string) int64 {
	t.Helper()
	var id int64
	if err := tx.QueryRow(context.Background(),
		`INSERT INTO outbox (topic, key, payload) VALUES ('t', $1, $2) RETURNING id`, key, []byte(payload)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func commit(t *testing.T, tx pgx.Tx) {
	t.Helper()
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds, for the watermark: other tests'
// transactions on the server hold it for a moment too, and no event says
// when they end. cond describes what it last saw.
func eventually(t *testing.T, cond func() (bool, string)) {
	t.Helper()
	testwait.State(t, testwait.DefaultTimeout, cond)
}

// claimOnce claims and releases, returning the ids claimed.
func claimOnce(t *testing.T, st *store.Store) []int64 {
	t.Helper()
	c := claim(t, st, 10)
	got := ids(c.Records)
	if err := c.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	return got
}

// claimUntil claims (and releases) until a claim returns want.
func claimUntil(t *testing.T, st *store.Store, want []int64) {
	t.Helper()
	eventually(t, func() (bool, string) {
		got := claimOnce(t, st)
		return slices.Equal(got, want), fmt.Sprintf("claim got %v, want %v", got, want)
	})
}

// Two transactions write one key; the one with the larger id commits
// first. By default a claim between the commits takes the larger id
// alone (per-key order then relies on producers serialising a key's
// writes); in strict mode it waits for the other transaction to end.
func TestStrictOrderWaitsForSmallerIds(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"commit", "rollback"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			s := pgtest.NewSchema(t)
			strict, loose := strictStore(t, s), newStore(t, s, false)
			a, b := begin(t, s.Pool), begin(t, s.Pool)
			first := insertIn(t, a, "k", "first")
			second := insertIn(t, b, "k", "second")
			commit(t, b)

			if got := claimOnce(t, loose); !slices.Equal(got, []int64{second}) {
				t.Fatalf("default mode claimed %v, want the later id %d alone (the documented limit)", got, second)
			}

			c := claim(t, strict, 10)
			if len(c.Records) != 0 || c.HeldSince.IsZero() {
				t.Fatalf("strict mode claimed %v (held since %v) while id %d may still commit", ids(c.Records), c.HeldSince, first)
			}
			if err := c.Release(context.Background()); err != nil {
				t.Fatal(err)
			}

			if end == "commit" {
				commit(t, a)
				claimUntil(t, strict, []int64{first, second})
			} else {
				if err := a.Rollback(context.Background()); err != nil {
					t.Fatal(err)
				}
				claimUntil(t, strict, []int64{second})
			}
		})
	}
}

// A write transaction that never touches the outbox holds strict-order
// delivery too; the store names it, and delivery resumes when it ends.
func TestStrictOrderReportsTheHoldingTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := strictStore(t, s)
	long := begin(t, s.Pool)
	var pid int
	var xid string
	if err := long.QueryRow(ctx, `SELECT pg_backend_pid(), pg_current_xact_id()::text`).Scan(&pid, &xid); err != nil {
		t.Fatal(err)
	}
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', 'x')`)

	eventually(t, func() (bool, string) {
		if got := claimOnce(t, st); len(got) != 0 {
			t.Fatalf("claimed %v while an older transaction runs", got)
		}
		h, err := st.OrderHold(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if h.Held > 0 && h.Holder != nil && h.Holder.PID == pid {
			if h.Holder.Age <= 0 || h.Holder.State != "idle in transaction" {
				t.Fatalf("holder %+v: want its age and state", *h.Holder)
			}
			return true, ""
		}
		return false, fmt.Sprintf("hold %+v, holder %+v: want backend %d", h, h.Holder, pid)
	})

	commit(t, long)
	eventually(t, func() (bool, string) {
		return len(claimOnce(t, st)) == 1, "the row was not claimed after the holder ended"
	})
	if h, err := st.OrderHold(ctx); err != nil || h.Held != 0 {
		t.Fatalf("after delivery resumed: hold %+v, %v; want none", h, err)
	}
}

// Strict mode refuses a table it cannot keep in order, naming the fix.
func TestCheckStrictOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name, change, want string
	}{
		{"migration missing", `DROP TRIGGER outbox_xid_first ON outbox`, "run 'outbox-relay migrate up'"},
		{"trigger disabled", `ALTER TABLE outbox DISABLE TRIGGER outbox_xid_first`, "ENABLE TRIGGER outbox_xid_first"},
		{"sequence cache", `ALTER TABLE outbox ALTER COLUMN id SET CACHE 20`, "SET CACHE 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := pgtest.NewSchema(t)
			st := strictStore(t, s)
			if err := st.CheckStrictOrder(ctx); err != nil {
				t.Fatalf("a migrated table: %v", err)
			}
			s.Exec(t, tc.change)
			st = strictStore(t, s)
			err := st.CheckStrictOrder(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
			c, err := st.Claim(ctx, store.ClaimParams{Limit: 1, PayloadCap: 1})
			if err == nil {
				_ = c.Release(ctx)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("claim: got %v, want the same error", err)
			}
		})
	}
}

// The observation's next transaction id is above every one given so far,
// including a running transaction's that is younger than the latest to
// end (which the snapshot's xmax is not). Not parallel: another test's
// commit could hide the difference.
func TestObservationSeesTheNextTransactionID(t *testing.T) {
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := strictStore(t, s)
	young := begin(t, s.Pool)
	var xid int64
	if err := young.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	xmin, next, err := store.NextXid(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if xmin > xid || next <= xid {
		t.Fatalf("xmin %d, next %d; want xmin <= %d < next", xmin, next, xid)
	}
}

// A role that may not read the id sequence is told which grant it lacks.
func TestCheckStrictOrderNeedsTheSequence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	role := pgtest.UniqueName("relay")
	s.Exec(t, `CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() {
		s.Exec(t, `DROP OWNED BY `+role)
		s.Exec(t, `DROP ROLE `+role)
	})
	s.Exec(t, `GRANT USAGE ON SCHEMA `+s.Name+` TO `+role)
	s.Exec(t, `GRANT SELECT, UPDATE, DELETE ON outbox TO `+role)
	cfg, err := pgxpool.ParseConfig(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st, err := store.New(pool, store.Config{Schema: s.Name, StrictOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CheckStrictOrder(ctx); err == nil || !strings.Contains(err.Error(), "grant it SELECT on it") {
		t.Fatalf("got %v, want the missing grant named", err)
	}
	s.Exec(t, `GRANT SELECT ON SEQUENCE outbox_id_seq TO `+role)
	if err := st.CheckStrictOrder(ctx); err != nil {
		t.Fatalf("with the grant: %v", err)
	}
	c, err := st.Claim(ctx, store.ClaimParams{Limit: 1, PayloadCap: 1})
	if err != nil {
		t.Fatalf("claim with the grant: %v", err)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
