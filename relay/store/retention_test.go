package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

func remainingIDs(t *testing.T, s *pgtest.Schema) []int64 {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `SELECT id FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestDeleteExpiredDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, true)

	// 25 expired dead letters, the higher the id the older.
	s.Exec(t, `INSERT INTO outbox (topic, payload, status, dead_letter_reason, dead_lettered_at)
		SELECT 't', 'x', 'dead_lettered', 'permanent',
		       now() - interval '2 hours' - i * interval '1 minute'
		FROM generate_series(1, 25) AS i`)
	var kept []int64
	for _, sql := range []string{
		// Dead-lettered within the retention.
		`INSERT INTO outbox (topic, payload, status, dead_letter_reason, dead_lettered_at)
		 VALUES ('t', 'recent', 'dead_lettered', 'permanent', now() - interval '30 minutes') RETURNING id`,
		// Expired, but it parks its key.
		`INSERT INTO outbox (topic, key, payload, status, dead_letter_reason, dead_lettered_at, key_parked)
		 VALUES ('t', 'k', 'parked', 'dead_lettered', 'permanent', now() - interval '1 day', true) RETURNING id`,
		// Not dead letters, whatever their dead-letter time says.
		`INSERT INTO outbox (topic, payload, dead_lettered_at) VALUES ('t', 'pending', now() - interval '1 day') RETURNING id`,
		`INSERT INTO outbox (topic, payload, status, sent_at, dead_lettered_at)
		 VALUES ('t', 'sent', 'sent', now(), now() - interval '1 day') RETURNING id`,
		// Discarded rows have a retention of their own.
		`INSERT INTO outbox (topic, payload, status, dead_letter_reason, dead_lettered_at, discarded_at)
		 VALUES ('t', 'discarded', 'discarded', 'permanent', now() - interval '1 day', now() - interval '1 day') RETURNING id`,
	} {
		var id int64
		if err := s.Pool.QueryRow(ctx, sql).Scan(&id); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		kept = append(kept, id)
	}

	// The first call deletes the 10 oldest.
	n, busy, err := st.DeleteExpiredDeadLetters(ctx, time.Hour, 10)
	if err != nil || busy || n != 10 {
		t.Fatalf("DeleteExpiredDeadLetters = %d, busy %v, %v; want 10 deleted", n, busy, err)
	}
	var oldest int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id BETWEEN 16 AND 25`).Scan(&oldest); err != nil {
		t.Fatal(err)
	}
	if oldest != 0 {
		t.Errorf("%d of the 10 oldest expired rows are left after the first call", oldest)
	}

	total := n
	for calls := 0; n == 10; calls++ {
		if calls > 5 {
			t.Fatal("DeleteExpiredDeadLetters does not run out of rows")
		}
		n, busy, err = st.DeleteExpiredDeadLetters(ctx, time.Hour, 10)
		if err != nil || busy || n > 10 {
			t.Fatalf("DeleteExpiredDeadLetters = %d, busy %v, %v", n, busy, err)
		}
		total += n
	}
	if total != 25 {
		t.Errorf("deleted %d rows, want the 25 expired ones", total)
	}
	if got := remainingIDs(t, s); !slices.Equal(got, kept) {
		t.Errorf("rows left %v, want %v: the recent dead letter, the parking one, the pending, the sent and the discarded row", got, kept)
	}
	if n, _, err := st.DeleteExpiredDeadLetters(ctx, time.Hour, 10); n != 0 || err != nil {
		t.Errorf("DeleteExpiredDeadLetters with nothing expired = %d, %v", n, err)
	}

	// Another replica holding the maintenance lock makes this one step
	// aside.
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, store.CleanupLockID(st)); err != nil {
		t.Fatal(err)
	}
	n, busy, err = st.DeleteExpiredDeadLetters(ctx, 0, 10)
	if err != nil || !busy || n != 0 {
		t.Fatalf("DeleteExpiredDeadLetters while another replica cleans = %d, busy %v, %v; want busy", n, busy, err)
	}
	if got := remainingIDs(t, s); !slices.Equal(got, kept) {
		t.Errorf("rows left %v after a busy call, want %v", got, kept)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Once the lock is free, a zero retention expires the recent row too.
	n, busy, err = st.DeleteExpiredDeadLetters(ctx, 0, 10)
	if err != nil || busy || n != 1 {
		t.Errorf("DeleteExpiredDeadLetters(0) = %d, busy %v, %v; want the recent row deleted", n, busy, err)
	}
	if got := remainingIDs(t, s); !slices.Equal(got, kept[1:]) {
		t.Errorf("rows left %v, want %v", got, kept[1:])
	}
}

// A dead letter replayed while the retention delete waits for its row is
// not deleted: the delete checks the row again once it has it.
func TestDeleteExpiredDeadLettersSparesRowReplayedMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, payload, status, dead_letter_reason, dead_lettered_at)
		VALUES ('t', 'x', 'dead_lettered', 'permanent', now() - interval '2 hours')`)

	// An operator's replay, not yet committed, holds the row.
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE outbox SET status = 'pending', dead_letter_reason = NULL, dead_lettered_at = NULL`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, _, err := st.DeleteExpiredDeadLetters(ctx, time.Hour, 10)
		done <- result{n, err}
	}()
	// Wait until the delete waits for the replay's lock, then commit it.
	testwait.Within(t, 10*time.Second, "the delete to wait for the replay", func() bool {
		var waiting int
		if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.n != 0 {
		t.Fatalf("delete = %d, %v; want nothing deleted", r.n, r.err)
	}
	if ids := remainingIDs(t, s); len(ids) != 1 {
		t.Fatalf("the replayed row was deleted")
	}
}
