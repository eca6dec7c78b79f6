package store_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// horizonSchema is an outbox schema in a database of its own: sessions and
// prepared transactions hold the horizon of their own database only, so
// other tests' transactions stay out of it.
func horizonSchema(t *testing.T) (*pgtest.Schema, *store.Store) {
	t.Helper()
	s := pgtest.NewSchemaIn(t, pgtest.NewDatabase(t))
	return s, newStore(t, s, false)
}

// findHolder waits until the store names a holder that matches, and
// returns it.
func findHolder(t *testing.T, st *store.Store, what string, match func(store.HorizonHolder) bool) store.HorizonHolder {
	t.Helper()
	var found store.HorizonHolder
	testwait.State(t, testwait.DefaultTimeout, func() (bool, string) {
		h, err := st.Horizon(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range h.Holders {
			if match(o) {
				found = o
				return true, ""
			}
		}
		return false, fmt.Sprintf("%s: not among the holders %+v", what, h.Holders)
	})
	return found
}

func TestHorizonNamesASessionsSnapshot(t *testing.T) {
	t.Parallel()
	s, st := horizonSchema(t)
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "nightly-report"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	pid := int(conn.PgConn().PID())
	h := findHolder(t, st, "the report's snapshot named", func(o store.HorizonHolder) bool { return o.Kind == "session" && o.PID == pid })
	if h.Application != "nightly-report" || h.User == "" || h.State != "idle in transaction" || h.Xmin == "" || h.Age <= 0 {
		t.Errorf("holder %+v, want the report's application, user, state, xmin and age", h)
	}

	// A role without pg_read_all_stats sees the holder's pid, user and
	// application, not how long its transaction has been open, and is
	// told so.
	role := pgtest.UniqueName("horizon_reader")
	s.Exec(t, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() {
		_, _ = s.Pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = s.Pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	s.Exec(t, "GRANT USAGE ON SCHEMA "+s.Name+" TO "+role)
	ru, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	ru.User = url.User(role)
	rcfg, err := pgxpool.ParseConfig(ru.String())
	if err != nil {
		t.Fatal(err)
	}
	readerPool, err := pgxpool.NewWithConfig(ctx, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer readerPool.Close()
	reader, err := store.New(readerPool, store.Config{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	seen := findHolder(t, reader, "the report's snapshot named to a role without privileges", func(o store.HorizonHolder) bool { return o.PID == pid })
	if seen.Application != "nightly-report" || seen.User == "" || seen.Age != 0 || seen.Xmin != h.Xmin {
		t.Errorf("an unprivileged role sees %+v, want the report's pid, user, application and xmin, and no age", seen)
	}
	if hz, err := reader.Horizon(ctx); err != nil || hz.Privileged {
		t.Errorf("an unprivileged role's view: privileged %v, %v", hz.Privileged, err)
	}
	if hz, err := st.Horizon(ctx); err != nil || !hz.Privileged {
		t.Errorf("a superuser's view: privileged %v, %v", hz.Privileged, err)
	}

	// Deleted rows it can still see stay in the pending rows' indexes:
	// scans pass over their entries, and the statistics show it.
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || (g % 10), 'x' FROM generate_series(1, 2000) g`)
	before, err := st.Horizon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Exec(t, `DELETE FROM outbox`)
	testwait.State(t, testwait.DefaultTimeout, func() (bool, string) {
		// A scan from the head of the pending rows' index, as claims did.
		s.Exec(t, `SELECT min(id) FROM outbox WHERE status = 'pending'`)
		after, err := st.Horizon(ctx)
		if err != nil {
			t.Fatal(err)
		}
		passed := (after.IndexEntries - before.IndexEntries) - (after.IndexRows - before.IndexRows)
		return passed >= 2000, fmt.Sprintf("index statistics show %d entries passed over, want the 2000 deleted rows' (before %+v, after %+v)", passed, before, after)
	})

	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the snapshot to be gone", func() bool {
		h, err := st.Horizon(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range h.Holders {
			if o.PID == pid {
				return false
			}
		}
		return true
	})
}

func TestHorizonNamesAPreparedTransaction(t *testing.T) {
	t.Parallel()
	s, st := horizonSchema(t)
	ctx := context.Background()
	var maxPrepared int
	if err := s.Pool.QueryRow(ctx, "SELECT current_setting('max_prepared_transactions')::int").Scan(&maxPrepared); err != nil {
		t.Fatal(err)
	}
	if maxPrepared == 0 {
		t.Skip("the server allows no prepared transactions (max_prepared_transactions = 0)")
	}
	gid := pgtest.UniqueName("horizon")
	conn, err := s.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// A prepared transaction without NOTIFY: the wake-up trigger's is not
	// allowed, so it writes to another table.
	for _, q := range []string{"CREATE TABLE other (n int)", "BEGIN", "INSERT INTO other VALUES (1)", "PREPARE TRANSACTION '" + gid + "'"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = s.Pool.Exec(context.Background(), "ROLLBACK PREPARED '"+gid+"'") })
	h := findHolder(t, st, "the prepared transaction named", func(o store.HorizonHolder) bool { return o.Kind == "prepared" && o.Name == gid })
	if h.PID != 0 || h.User == "" || h.Age <= 0 {
		t.Errorf("holder %+v, want no pid, the owner and an age", h)
	}
}

// A standby with hot_standby_feedback holds the primary's horizon at the
// xmin it reports: through its slot when it streams from one, through its
// walsender otherwise. Both are spoken here as a standby speaks them.
func TestHorizonNamesSlotsAndStandbys(t *testing.T) {
	t.Parallel()
	_, st := horizonSchema(t)
	slot := strings.ReplaceAll(pgtest.UniqueName("horizon"), "-", "_")

	standby(t, "standby-a", slot)
	h := findHolder(t, st, "the slot named", func(o store.HorizonHolder) bool { return o.Kind == "slot" && o.Name == slot })
	if h.Client != "physical" || h.State != "active" || h.PID == 0 {
		t.Errorf("holder %+v, want the active physical slot and its walsender", h)
	}
	standby(t, "standby-b", "")
	h = findHolder(t, st, "the standby named", func(o store.HorizonHolder) bool { return o.Kind == "standby" && o.Name == "standby-b" })
	if h.PID == 0 || h.Client == "" {
		t.Errorf("holder %+v, want the walsender's pid and the standby's address", h)
	}
}

// standby connects as a streaming standby named name, from slot (none when
// empty, a temporary slot otherwise), and reports the primary's current
// xmin as its hot_standby_feedback. It skips the test where the server
// refuses replication connections.
func standby(t *testing.T, name, slot string) {
	t.Helper()
	ctx := context.Background()
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("replication", "true")
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	conn, err := pgconn.Connect(ctx, u.String())
	if err != nil {
		t.Skipf("the server refuses a replication connection: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if slot != "" {
		if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "", pglogrepl.CreateReplicationSlotOptions{
			Temporary: true, Mode: pglogrepl.PhysicalReplication}); err != nil {
			t.Fatal(err)
		}
	}
	start := "START_REPLICATION PHYSICAL " + sys.XLogPos.String()
	if slot != "" {
		start = "START_REPLICATION SLOT " + slot + " PHYSICAL " + sys.XLogPos.String()
	}
	conn.Frontend().SendQuery(&pgproto3.Query{String: start})
	if err := conn.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
	for streaming := false; !streaming; {
		msg, err := conn.Frontend().Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyBothResponse:
			streaming = true
		case *pgproto3.ErrorResponse:
			t.Fatalf("%s: %s", start, m.Message)
		}
	}
	// The feedback: the message's tag, the standby's clock, then the xmin
	// and its epoch, and the catalog xmin (none) and its epoch.
	pool, err := pgxpool.New(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var xmin uint64
	if err := pool.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").Scan(&xmin); err != nil {
		t.Fatal(err)
	}
	msg := []byte{'h'}
	msg = binary.BigEndian.AppendUint64(msg, uint64(time.Since(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()))
	msg = binary.BigEndian.AppendUint32(msg, uint32(xmin))
	msg = binary.BigEndian.AppendUint32(msg, uint32(xmin>>32))
	msg = binary.BigEndian.AppendUint32(msg, 0)
	msg = binary.BigEndian.AppendUint32(msg, 0)
	buf, err := (&pgproto3.CopyData{Data: msg}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Frontend().SendUnbufferedEncodedCopyData(buf); err != nil {
		t.Fatal(err)
	}
}
