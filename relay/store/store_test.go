package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

func newStore(t *testing.T, s *pgtest.Schema, keepSent bool) *store.Store {
	t.Helper()
	st, err := store.New(s.Pool, store.Config{Schema: s.Name, KeepSent: keepSent, ErrorHistory: 3})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func ids(recs []sink.Record) []int64 {
	out := make([]int64, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// claim claims up to limit rows. A claim still open when the test ends,
// failed or not, is released, so that its locks do not hold up dropping
// the test's schema.
func claim(t *testing.T, st *store.Store, limit int) *store.Claim {
	t.Helper()
	c, err := st.Claim(context.Background(), store.ClaimParams{Limit: limit, PayloadCap: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Release(context.Background()) })
	return c
}

// forEachKeyCheck runs fn with the key check in each of its forms, each on
// a schema of its own, as parallel subtests of a parallel test.
func forEachKeyCheck(t *testing.T, fn func(t *testing.T, s *pgtest.Schema, st *store.Store)) {
	t.Parallel()
	for name, form := range map[string]store.KeyCheckForm{"by span": store.KeyCheckBySpan, "by key": store.KeyCheckByKey} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := pgtest.NewSchema(t)
			st := newStore(t, s, false)
			store.SetKeyCheck(st, form)
			fn(t, s, st)
		})
	}
}

func TestClaimReadsRows(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload, headers) VALUES
		('a', 'k1', 'hello', '{"h":"v"}'),
		('b', NULL, 'later', '{}'),
		('c', NULL, repeat('x', 101)::bytea, '{}'),
		('d', NULL, 'x', '{"n": 1, "ok": "yes", "o": {}}')`)
	s.Exec(t, `UPDATE outbox SET next_attempt_at = now() + interval '1 hour' WHERE topic = 'b'`)

	c := claim(t, st, 10)
	defer c.Release(context.Background())
	if got := ids(c.Records); len(got) != 3 {
		t.Fatalf("claimed %v, want the 3 due rows", got)
	}
	a, big, bad := c.Records[0], c.Records[1], c.Records[2]
	if a.Topic != "a" || !a.HasKey || a.Key != "k1" || string(a.Payload) != "hello" || a.Headers["h"] != "v" || a.Undeliverable != "" {
		t.Errorf("row a = %+v", a)
	}
	if big.Payload != nil || big.PayloadSize != 101 || big.UndeliverableReason != sink.ReasonTooLarge ||
		!strings.Contains(big.Undeliverable, "101 bytes") {
		t.Errorf("oversized row = %+v: want no payload loaded and too_large", big)
	}
	if bad.UndeliverableReason != sink.ReasonInvalidMessage ||
		!strings.Contains(bad.Undeliverable, `header "n" is a number, not a string`) ||
		!strings.Contains(bad.Undeliverable, `header "o" is an object`) {
		t.Errorf("bad headers row = %+v", bad)
	}
	if c.Now.IsZero() {
		t.Error("claim did not report the database clock")
	}
}

// A claim's payloads share buffers: each comes back whole, empty ones
// stay empty rather than null, and one cannot grow into the next.
func TestClaimReadsPayloadsOfEverySize(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	// Sizes around the shared buffers' limits, enough to fill several.
	sizes := []int{0, 1, 200, 16 << 10, 16<<10 + 1, 40 << 10, 0, 63 << 10, 64 << 10, 64<<10 + 1, 7, 100 << 10}
	for i, n := range sizes {
		topic := "t"
		if i%4 == 3 {
			topic = fmt.Sprintf("t%d", i)
		}
		s.Exec(t, `INSERT INTO outbox (topic, payload) VALUES ($1, convert_to(rpad($2::int::text, $3, chr(97 + $2::int % 26)), 'UTF8'))`,
			topic, i, n)
	}
	c, err := st.Claim(context.Background(), store.ClaimParams{Limit: 100, PayloadCap: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(context.Background())
	if len(c.Records) != len(sizes) {
		t.Fatalf("claimed %d rows, want %d", len(c.Records), len(sizes))
	}
	want := func(i int) []byte {
		b := []byte(strings.Repeat(string(rune('a'+i%26)), sizes[i]))
		copy(b, strconv.Itoa(i))
		return b[:sizes[i]]
	}
	for i, r := range c.Records {
		if r.Payload == nil || !reflect.DeepEqual(r.Payload, want(i)) || r.PayloadSize != sizes[i] {
			t.Errorf("row %d: payload of %d bytes (nil %v), size %d; want %d bytes as written",
				i, len(r.Payload), r.Payload == nil, r.PayloadSize, sizes[i])
		}
		if wantTopic := map[bool]string{true: fmt.Sprintf("t%d", i), false: "t"}[i%4 == 3]; r.Topic != wantTopic {
			t.Errorf("row %d: topic %q, want %q", i, r.Topic, wantTopic)
		}
	}
	for i := range c.Records {
		c.Records[i].Payload = append(c.Records[i].Payload, "!!!!"...)
	}
	for i, r := range c.Records {
		if !reflect.DeepEqual(r.Payload[:sizes[i]], want(i)) {
			t.Errorf("row %d: payload changed when the rows were appended to", i)
		}
	}
}

// Two open claims never share a row, and a key's later rows wait for the
// earlier ones in flight.
func TestConcurrentClaimsKeepKeyOrder(t *testing.T) {
	forEachKeyCheck(t, func(t *testing.T, s *pgtest.Schema, st *store.Store) {
		// ids 1..6: K K x K y K
		s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES
			('t','K','1'), ('t','K','2'), ('t','x','3'), ('t','K','4'), ('t','y','5'), ('t','K','6')`)

		first := claim(t, st, 2) // ids 1, 2: a run of K
		if got := ids(first.Records); fmt.Sprint(got) != "[1 2]" {
			t.Fatalf("first claim = %v, want [1 2]", got)
		}
		second := claim(t, st, 10) // 3..6 unlocked; K's 4 and 6 must wait for 1 and 2
		if got := ids(second.Records); fmt.Sprint(got) != "[3 5]" {
			t.Fatalf("second claim = %v, want [3 5]", got)
		}
		if second.Skipped != 2 || second.Deferred != 0 || fmt.Sprint(second.SkippedKeys) != "[K]" {
			t.Fatalf("second claim skipped %d (keys %v) deferred %d, want 2 of K skipped (in flight, not deferred)",
				second.Skipped, second.SkippedKeys, second.Deferred)
		}
		// Told to leave K alone, a claim does not even lock its rows.
		avoiding, err := st.Claim(context.Background(), store.ClaimParams{Limit: 10, PayloadCap: 100, ExcludeKeys: []string{"K"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(avoiding.Records); fmt.Sprint(got) != "[]" || avoiding.Claimed != 0 {
			t.Fatalf("claim excluding K = %v (claimed %d), want nothing: 3 and 5 are locked, the rest is K's", got, avoiding.Claimed)
		}
		if err := avoiding.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := first.Complete(context.Background(), []store.Outcome{{ID: 1, Kind: store.Sent}, {ID: 2, Kind: store.Sent}}); err != nil {
			t.Fatal(err)
		}
		if err := second.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		third := claim(t, st, 10)
		if got := ids(third.Records); fmt.Sprint(got) != "[3 4 5 6]" {
			t.Fatalf("after K's head was sent, claim = %v, want [3 4 5 6] (K's run travels together)", got)
		}
	})
}

// A key whose head waits for its next attempt is deferred with it, and
// does not hold back other keys.
func TestWaitingHeadDefersItsKey(t *testing.T) {
	forEachKeyCheck(t, func(t *testing.T, s *pgtest.Schema, st *store.Store) {
		ctx := context.Background()
		s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','K','1'), ('t','K','2'), ('t','x','3'), ('t','K','4')`)
		s.Exec(t, `UPDATE outbox SET next_attempt_at = now() + interval '10 minutes', retry_count = 1 WHERE id = 1`)

		c := claim(t, st, 10)
		if got := ids(c.Records); fmt.Sprint(got) != "[3]" || c.Deferred != 2 {
			t.Fatalf("claim = %v deferred %d, want [3] with K's 2 and 4 deferred", got, c.Deferred)
		}
		if err := c.Complete(ctx, nil); err != nil { // keeps the deferrals
			t.Fatal(err)
		}
		var same int
		if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id IN (2, 4)
			AND next_attempt_at = (SELECT next_attempt_at FROM outbox WHERE id = 1) AND retry_count = 0`).Scan(&same); err != nil {
			t.Fatal(err)
		}
		if same != 2 {
			t.Fatalf("%d of K's waiting rows deferred to the head's next attempt without counting one, want 2", same)
		}
		// Now nothing of K is due, and the next claim does not touch it.
		c = claim(t, st, 10)
		if len(c.Records) != 1 || c.Deferred != 0 {
			t.Fatalf("second claim = %v deferred %d, want only row 3", ids(c.Records), c.Deferred)
		}
	})
}

func TestParkedKeyHoldsLaterRows(t *testing.T) {
	forEachKeyCheck(t, func(t *testing.T, s *pgtest.Schema, st *store.Store) {
		s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','K','1'), ('t','K','2'), ('t', NULL, '3')`)
		s.Exec(t, `UPDATE outbox SET status = 'dead_lettered', dead_letter_reason = 'permanent', key_parked = true, dead_lettered_at = now() WHERE id = 1`)
		c := claim(t, st, 10)
		if got := ids(c.Records); fmt.Sprint(got) != "[3]" || c.Deferred != 1 {
			t.Fatalf("claim = %v deferred %d, want [3] with K's row 2 deferred behind the parked row", got, c.Deferred)
		}
	})
}

// A key's row above its claimed ones, waiting, holds back nothing: the
// key check by span reads it, as it lies below the claim's last row.
func TestLaterRowOfAKeyHoldsNothingBack(t *testing.T) {
	forEachKeyCheck(t, func(t *testing.T, s *pgtest.Schema, st *store.Store) {
		s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','K','1'), ('t','K','2'), ('t','L','3')`)
		s.Exec(t, `UPDATE outbox SET next_attempt_at = now() + interval '10 minutes', retry_count = 1 WHERE id = 2`)
		c := claim(t, st, 10)
		if got := ids(c.Records); fmt.Sprint(got) != "[1 3]" || c.Deferred != 0 || c.Skipped != 0 {
			t.Fatalf("claim = %v deferred %d skipped %d, want [1 3] with nothing held back", got, c.Deferred, c.Skipped)
		}
	})
}

// With several rows holding a key, the lowest decides: here the parked
// dead letter, not the waiting row after it, which the key check reports
// first.
func TestLowestBlockerDecides(t *testing.T) {
	forEachKeyCheck(t, func(t *testing.T, s *pgtest.Schema, st *store.Store) {
		ctx := context.Background()
		s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','K','1'), ('t','K','2'), ('t','K','3')`)
		s.Exec(t, `UPDATE outbox SET status = 'dead_lettered', dead_letter_reason = 'permanent', key_parked = true, dead_lettered_at = now() WHERE id = 1`)
		s.Exec(t, `UPDATE outbox SET next_attempt_at = now() + interval '10 minutes' WHERE id = 2`)
		s.Exec(t, `UPDATE outbox SET last_error = 'its own error' WHERE id = 3`)
		c := claim(t, st, 10)
		if len(c.Records) != 0 || c.Deferred != 1 {
			t.Fatalf("claim = %v deferred %d, want nothing with row 3 deferred", ids(c.Records), c.Deferred)
		}
		if err := c.Complete(ctx, nil); err != nil {
			t.Fatal(err)
		}
		var lastErr string
		var behind *int64
		var wait time.Duration
		if err := s.Pool.QueryRow(ctx, `SELECT last_error, parked_behind, next_attempt_at - now() FROM outbox WHERE id = 3`).Scan(&lastErr, &behind, &wait); err != nil {
			t.Fatal(err)
		}
		if behind == nil || *behind != 1 || lastErr != "its own error" || wait < store.ParkedRecheck-time.Minute || wait > store.ParkedRecheck {
			t.Fatalf("row 3 waits %v parked behind %v with last error %q, want about %v behind parked row 1, its error kept",
				wait, behind, lastErr, store.ParkedRecheck)
		}
	})
}

// The two forms of the key check find the same blockers: on random
// outboxes of waiting, leased, parked, delivered and locked rows, a claim
// by span and a claim by key, each released before the next, hold back
// the same rows the same way. Each waiting or leased row waits until a
// time of its own, so a row deferred behind one says which.
func TestKeyCheckFormsAgree(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	bySpan, byKey := newStore(t, s, false), newStore(t, s, false)
	store.SetKeyCheck(bySpan, store.KeyCheckBySpan)
	store.SetKeyCheck(byKey, store.KeyCheckByKey)
	type result struct {
		Records           []int64
		Deferred, Skipped int
		SkippedKeys       []string
		Rows              map[int64]string
	}
	run := func(st *store.Store, p store.ClaimParams) result {
		t.Helper()
		c, err := st.Claim(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := c.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}()
		rows, err := store.Deferrals(ctx, c, store.ParkedRecheck, p.ExcludeFor)
		if err != nil {
			t.Fatal(err)
		}
		return result{ids(c.Records), c.Deferred, c.Skipped, c.SkippedKeys, rows}
	}
	var deferred, skipped, behindLeases int
	for seed := range uint64(6) {
		rnd := rand.New(rand.NewPCG(seed, 1))
		s.Exec(t, `TRUNCATE outbox`)
		// Keys 0-19, one row in ten without one: each key has rows all
		// along the table, as blockers would.
		s.Exec(t, `INSERT INTO outbox (topic, key, payload)
			SELECT 't' || (g % 3), CASE WHEN g % 10 <> 0 THEN 'k' || (g * 7 % 20) END, 'x' FROM generate_series(1, 800) g`)
		var waiting, leased, parked, delivered, locked []int64
		for id := int64(1); id <= 800; id++ {
			switch r := rnd.IntN(100); {
			case r < 6:
				waiting = append(waiting, id)
			case r < 9:
				leased = append(leased, id)
			case r < 11:
				parked = append(parked, id)
			case r < 31:
				delivered = append(delivered, id)
			case r < 41:
				locked = append(locked, id)
			}
		}
		s.Exec(t, `UPDATE outbox SET next_attempt_at = now() + interval '1 hour' + id * interval '1 second', retry_count = 1
			WHERE id = ANY($1)`, waiting)
		s.Exec(t, `UPDATE outbox SET next_attempt_at = now() + interval '2 hours' + id * interval '1 second', lease_token = gen_random_uuid()
			WHERE id = ANY($1)`, leased)
		s.Exec(t, `UPDATE outbox SET status = 'dead_lettered', dead_letter_reason = 'permanent', dead_lettered_at = now(),
			key_parked = key IS NOT NULL WHERE id = ANY($1)`, parked)
		s.Exec(t, `DELETE FROM outbox WHERE id = ANY($1)`, delivered)
		// Rows in flight in another claim.
		other := beginTx(t, s)
		if _, err := other.Exec(ctx, `SELECT id FROM outbox WHERE id = ANY($1) FOR UPDATE`, locked); err != nil {
			t.Fatal(err)
		}
		for _, p := range []store.ClaimParams{
			{Limit: 20}, {Limit: 100}, {Limit: 1000},
			{Limit: 100, ExcludeTopics: []string{"t1"}, ExcludeFor: time.Minute},
			{Limit: 100, ExcludeKeys: []string{"k3", "k4"}},
			// Order kept per scope: t0 and t1 in one, t2 in another.
			{Limit: 100, OrderScope: func(topic string) string { return strings.TrimPrefix(topic, "t") }},
			{Limit: 1000, OrderScope: func(topic string) string { return fmt.Sprint(topic == "t2") },
				ExcludeTopics: []string{"t1"}, ExcludeFor: time.Minute},
		} {
			p.PayloadCap = 100
			want, got := run(byKey, p), run(bySpan, p)
			if !reflect.DeepEqual(got, want) {
				for id, row := range want.Rows {
					if got.Rows[id] != row {
						t.Errorf("row %d: by span %q, by key %q", id, got.Rows[id], row)
					}
				}
				got.Rows, want.Rows = nil, nil
				t.Fatalf("seed %d, claim %+v: by span %+v, by key %+v", seed, p, got, want)
			}
			for _, row := range got.Rows {
				if strings.Contains(row, "behind lease") {
					behindLeases++
				}
			}
			deferred += got.Deferred
			skipped += got.Skipped
		}
		if err := other.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if deferred == 0 || skipped == 0 || behindLeases == 0 {
		t.Fatalf("claims deferred %d rows (%d behind leases) and skipped %d in all: the outboxes had too few blockers to find",
			deferred, behindLeases, skipped)
	}
}

// leaseAndDeferBehind leases row 1 of key K for an hour, inserts row 2 of
// K, and returns a claim that found row 2 behind the lease and deferred it,
// not yet committed, with the lease's token and end.
func leaseAndDeferBehind(t *testing.T, s *pgtest.Schema, st *store.Store) (*store.Claim, uuid.UUID, time.Time) {
	t.Helper()
	ctx := context.Background()
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','K','1')`)
	c := claim(t, st, 10)
	token := uuid.New()
	if err := c.Complete(ctx, []store.Outcome{{ID: 1, Kind: store.Leased, Token: token, Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','K','2')`)
	behind := claim(t, st, 10)
	if len(behind.Records) != 0 || behind.Deferred != 1 {
		t.Fatalf("claim = %v deferred %d, want row 2 deferred behind the lease", ids(behind.Records), behind.Deferred)
	}
	return behind, token, c.LeaseExpiry[1]
}

func checkReady(t *testing.T, s *pgtest.Schema, id int64) {
	t.Helper()
	var wait time.Duration
	if err := s.Pool.QueryRow(context.Background(), `SELECT next_attempt_at - now() FROM outbox WHERE id = $1`, id).Scan(&wait); err != nil {
		t.Fatal(err)
	}
	if wait > 0 {
		t.Fatalf("row %d waits %v after the lease it was deferred behind ended, want it ready", id, wait)
	}
}

// beginTx begins a transaction on the schema's pool, rolled back at the
// end of the test unless committed.
func beginTx(t *testing.T, s *pgtest.Schema) pgx.Tx {
	t.Helper()
	tx, err := s.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// awaitLockWait waits until a session on the schema's tables waits for a
// row lock, failing with msg after ten seconds.
func awaitLockWait(t *testing.T, s *pgtest.Schema, msg string) {
	t.Helper()
	testwait.State(t, 10*time.Second, func() (bool, string) {
		var waiting int
		if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, s.Name).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting > 0, msg
	})
}

// A lease's write-back that runs while a claim is deferring rows behind
// the lease does not wait for that claim, and cannot see the deferral:
// the claim, once committed, finds the lease over and makes the rows
// ready. They do not wait for the whole lease.
func TestRowsDeferredBehindALeaseWrittenBackMeanwhile(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	behind, token, until := leaseAndDeferBehind(t, s, st)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := st.CompleteLeased(wctx, []store.Outcome{{ID: 1, Kind: store.Sent, Token: token}}, nil,
		[]store.LeasedWork{{Key: "K", FirstID: 1, Until: until}}); err != nil {
		t.Fatalf("lease write-back while a claim defers behind it: %v", err)
	}
	if err := behind.Complete(ctx, nil); err != nil {
		t.Fatal(err)
	}
	checkReady(t, s, 2)
}

// A leased write-back writes, and returns, only the outcomes of rows that
// still hold its lease. A row whose lease ran out and was taken by another
// delivery is left to that one, whatever the outcome.
func TestLeasedWriteBackReturnsWhatItWrote(t *testing.T) {
	t.Parallel()
	for _, keepSent := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep sent %v", keepSent), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := pgtest.NewSchema(t)
			st := newStore(t, s, keepSent)
			s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'x' FROM generate_series(1, 4) g`)
			c := claim(t, st, 10)
			token := uuid.New()
			var leases []store.Outcome
			for _, r := range c.Records {
				leases = append(leases, store.Outcome{ID: r.ID, Kind: store.Leased, Token: token, Delay: time.Hour})
			}
			if err := c.Complete(ctx, leases); err != nil {
				t.Fatal(err)
			}
			// Rows 2 and 4 were leased again by another delivery.
			s.Exec(t, `UPDATE outbox SET lease_token = gen_random_uuid(), retry_count = 2 WHERE id IN (2, 4)`)

			outcomes := []store.Outcome{
				{ID: 1, Kind: store.Sent, Token: token},
				{ID: 2, Kind: store.Sent, Token: token},
				{ID: 3, Kind: store.Retried, Token: token, Error: "503", Delay: time.Minute},
				{ID: 4, Kind: store.DeadLettered, Token: token, Error: "400", Reason: "rejected"},
			}
			done, err := st.CompleteLeased(ctx, outcomes, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := []store.Outcome{outcomes[0], outcomes[2]}; !reflect.DeepEqual(done, want) {
				t.Errorf("CompleteLeased wrote %+v, want the outcomes of rows 1 and 3, those still leased by it", done)
			}
			var got string
			if err := s.Pool.QueryRow(ctx, `SELECT string_agg(format('%s:%s:%s:%s', id, status, lease_token = $1, retry_count), ' ' ORDER BY id) FROM outbox`,
				token).Scan(&got); err != nil {
				t.Fatal(err)
			}
			// Row 1 is sent (or deleted), row 3's lease counted its
			// attempt; the other delivery's rows are untouched.
			want := "2:pending:f:2 3:pending::1 4:pending:f:2"
			if keepSent {
				want = "1:sent::0 " + want
			}
			if got != want {
				t.Errorf("rows (id:status:held by this lease:retries) = %s, want %s", got, want)
			}
		})
	}
}

// A claim that commits while a lease's write-back is under way waits for
// it, then finds the lease over.
func TestRowsDeferredBehindALeaseWhoseWriteBackIsUnderWay(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	behind, _, _ := leaseAndDeferBehind(t, s, st)
	// The write-back, under way: it has deleted the sent row, and not
	// yet committed.
	wb := beginTx(t, s)
	if _, err := wb.Exec(ctx, `DELETE FROM outbox WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- behind.Complete(ctx, nil) }()
	awaitLockWait(t, s, "the claim's commit did not wait for the lease's write-back under way")
	if err := wb.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkReady(t, s, 2)
}

// With several leases behind one claim, the claim's look at them holds no
// lock while it waits for a write-back under way, so another write-back,
// which locks its rows in an order of its own, never deadlocks with it.
func TestLookAtSeveralLeasesHoldsNoLockWhileWaiting(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','A','1'), ('t','B','2'), ('t','C','3')`)
	c := claim(t, st, 10)
	var leases []store.Outcome
	for _, id := range []int64{1, 2, 3} {
		leases = append(leases, store.Outcome{ID: id, Kind: store.Leased, Token: uuid.New(), Delay: time.Hour})
	}
	if err := c.Complete(ctx, leases); err != nil {
		t.Fatal(err)
	}
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','A','4'), ('t','B','5'), ('t','C','6')`)
	behind := claim(t, st, 10)
	if behind.Deferred != 3 {
		t.Fatalf("claim deferred %d rows, want 3 behind the leases", behind.Deferred)
	}
	// A write-back of row 2 under way: the claim's look waits for it.
	second := beginTx(t, s)
	if _, err := second.Exec(ctx, `UPDATE outbox SET last_error = 'x' WHERE id = 2`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- behind.Complete(ctx, nil) }()
	awaitLockWait(t, s, "the claim's look did not wait for the write-back under way")
	// Another write-back, sending row 3 and failing row 1, in that order:
	// it must not wait for the claim's look, which has been at row 1.
	other := beginTx(t, s)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := other.Exec(wctx, `DELETE FROM outbox WHERE id = 3`); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(wctx, `UPDATE outbox SET next_attempt_at = now() + interval '1 minute', lease_token = NULL WHERE id = 1`); err != nil {
		t.Fatalf("a write-back waited for the claim's look at leases: %v", err)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := second.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkReady(t, s, 6) // behind row 3, sent
}

func TestCompleteWritesOutcomes(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep sent %v", keep), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := pgtest.NewSchema(t)
			st := newStore(t, s, keep)
			s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'p' FROM generate_series(1, 5) g`)
			s.Exec(t, `UPDATE outbox SET retry_count = 2, error_history = '[{"error":"e1"},{"error":"e2"},{"error":"e3"}]' WHERE id = 2`)

			c := claim(t, st, 10)
			err := c.Complete(ctx, []store.Outcome{
				{ID: 1, Kind: store.Sent},
				{ID: 2, Kind: store.Retried, Delay: 90 * time.Second, Error: "timeout", Class: "transient", Attempted: true},
				{ID: 3, Kind: store.Deferred, Delay: 30 * time.Second, Error: "connection refused", Class: "systemic", Attempted: true},
				{ID: 4, Kind: store.DeadLettered, Reason: "too_large", Error: strings.Repeat("é", 3000), Class: "permanent", Attempted: true, ParkKey: true},
				// 5: no outcome, left as it was
			})
			if err != nil {
				t.Fatal(err)
			}
			type row struct {
				status         string
				retries        int
				delay          float64 // next_attempt_at - last_attempt_at, seconds
				lastError      *string
				reason         *string
				deadAt, sentAt *time.Time
				parked         bool
				history        []map[string]any
			}
			get := func(id int) (row, bool) {
				var r row
				var hist []byte
				err := s.Pool.QueryRow(ctx, `SELECT status, retry_count,
					coalesce(extract(epoch FROM next_attempt_at - last_attempt_at), -1)::float8,
					last_error, dead_letter_reason, dead_lettered_at, sent_at, key_parked, error_history
					FROM outbox WHERE id = $1`, id).Scan(&r.status, &r.retries, &r.delay, &r.lastError, &r.reason, &r.deadAt, &r.sentAt, &r.parked, &hist)
				if err == pgx.ErrNoRows {
					return r, false
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(hist, &r.history); err != nil {
					t.Fatal(err)
				}
				return r, true
			}
			sent, found := get(1)
			if keep && (!found || sent.status != "sent" || sent.sentAt == nil) {
				t.Errorf("kept sent row = %+v found %v", sent, found)
			}
			if !keep && found {
				t.Errorf("sent row still there: %+v", sent)
			}
			r, _ := get(2)
			if r.status != "pending" || r.retries != 3 || r.delay != 90 || *r.lastError != "timeout" {
				t.Errorf("retried row = %+v", r)
			}
			if len(r.history) != 3 || r.history[0]["error"] != "e2" || r.history[2]["error"] != "timeout" || r.history[2]["attempt"] != float64(3) {
				t.Errorf("history = %v, want the newest 3 ending with the timeout at attempt 3", r.history)
			}
			r, _ = get(3)
			if r.status != "pending" || r.retries != 0 || r.delay != 30 || *r.lastError != "connection refused" {
				t.Errorf("deferred row = %+v: want no attempt counted", r)
			}
			r, _ = get(4)
			if r.status != "dead_lettered" || *r.reason != "too_large" || r.deadAt == nil || !r.parked || r.retries != 1 ||
				len(*r.lastError) > store.MaxErrorLen || !strings.HasSuffix(*r.lastError, "…") {
				t.Errorf("dead-lettered row = %+v (last_error %d bytes)", r, len(*r.lastError))
			}
			r, _ = get(5)
			if r.status != "pending" || r.retries != 0 || r.lastError != nil {
				t.Errorf("untouched row = %+v", r)
			}
		})
	}
}

// A destination's error text can hold anything; it is stored anyway.
func TestCompleteStoresAnyErrorText(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, payload) VALUES ('t', 'x')`)
	c := claim(t, st, 10)
	err := c.Complete(ctx, []store.Outcome{{ID: 1, Kind: store.Retried, Delay: time.Second, Error: "body: \x00\xff\xfe end", Attempted: true}})
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if err := s.Pool.QueryRow(ctx, `SELECT last_error FROM outbox`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, "body: ") || !strings.HasSuffix(got, " end") {
		t.Fatalf("last_error = %q", got)
	}
}

func TestReleaseLeavesRowsAsTheyWere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, payload) VALUES ('t', '1'), ('t', '2')`)
	c := claim(t, st, 10)
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c = claim(t, st, 10)
	defer c.Release(ctx)
	if len(c.Records) != 2 {
		t.Fatalf("after release, claim got %v", ids(c.Records))
	}
}

// Rows held while their destination was down go at once when it answers
// again, with the rows of their keys deferred behind them to exactly
// their moment; a row attempted since, already due, no longer pending or
// locked by a claim, and a row of the key waiting on its own, stay as
// they are.
func TestReleaseHeldMakesHeldRowsReady(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (id, topic, key, payload, next_attempt_at, retry_count, status) OVERRIDING SYSTEM VALUE VALUES
		(1, 't', 'k1', 'x', '2100-01-01', 0, 'pending'),       -- held
		(2, 't', 'k1', 'x', '2100-01-01', 0, 'pending'),       -- behind 1, to its moment
		(3, 't', 'k1', 'x', '2100-01-01', 2, 'pending'),       -- behind 1, to its moment
		(4, 't', 'k1', 'x', '2100-01-02', 1, 'pending'),       -- of k1, waiting on its own
		(5, 't', 'k2', 'x', '2100-01-01', 1, 'pending'),       -- held, attempted since
		(6, 't', NULL, 'x', '2000-01-01', 0, 'pending'),       -- held, due already
		(7, 't', 'k3', 'x', '2100-01-01', 0, 'pending'),       -- held, in a claim now
		(8, 't', 'k4', 'x', '2100-01-01', 0, 'pending'),       -- held, dead-lettered since
		(9, 't', NULL, 'x', '2100-01-01', 0, 'pending')        -- held, without a key`)
	s.Exec(t, `UPDATE outbox SET status = 'dead_lettered', dead_letter_reason = 'permanent', dead_lettered_at = now() WHERE id = 8`)
	locker, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	if _, err := locker.Exec(ctx, `SELECT 1 FROM outbox WHERE id = 7 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var held []store.HeldRow
	for _, id := range []int64{1, 5, 6, 7, 8, 9} {
		held = append(held, store.HeldRow{ID: id})
	}
	n, err := st.ReleaseHeld(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := s.Pool.Query(ctx, `SELECT id FROM outbox WHERE next_attempt_at <= now() AND id <> 6 ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ready, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ready) != "[1 2 3 9]" || n != 4 {
		t.Fatalf("ready now: %v (%d made ready), want [1 2 3 9]", ready, n)
	}
}

// released calls ReleaseHeld with ids, which must return without waiting
// for the claims under way.
func released(t *testing.T, st *store.Store, ids ...int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.DefaultTimeout)
	defer cancel()
	var held []store.HeldRow
	for _, id := range ids {
		held = append(held, store.HeldRow{ID: id})
	}
	if _, err := st.ReleaseHeld(ctx, held); err != nil {
		t.Fatalf("release of held rows %v: %v", ids, err)
	}
}

// A claim under way when held rows are released may have deferred their
// keys' later rows behind them, to their old moment, where the release
// cannot see them. The release does not wait for it: the claim's
// write-back makes those rows ready.
func TestClaimUnderWayReadiesTheRowsItDeferredBehindReleasedRows(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload, next_attempt_at) VALUES ('t', 'k', 'x', '2100-01-01'), ('t', 'k', 'x', now())`)
	c := claim(t, st, 10) // defers row 2 behind row 1, held until 2100
	if len(c.Records) != 0 || c.Deferred != 1 {
		t.Fatalf("claim took %v and deferred %d, want row 2 deferred behind row 1", ids(c.Records), c.Deferred)
	}
	released(t, st, 1)
	if rowsWhere(t, s, "id = 1 AND next_attempt_at <= now()") != 1 {
		t.Fatal("row 1 is not ready after its release")
	}
	complete(t, c)
	if rowsWhere(t, s, "id = 2 AND next_attempt_at <= now()") != 1 {
		t.Fatal("row 2, deferred behind row 1 by the claim under way, still waits for row 1's old moment")
	}
}

// A claim begun as a release of held rows begins reads a released row as
// still waiting, and defers its key's rows to the row's old moment after
// the release made them ready: its write-back makes them ready.
func TestClaimBegunDuringAReleaseReadiesTheRowsItDeferred(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload, next_attempt_at) VALUES ('t', 'k', 'x', '2100-01-01'), ('t', 'k', 'x', now())`)
	read, write := make(chan struct{}), make(chan struct{})
	var once sync.Once
	store.BeforeHoldingBack(st, func() {
		once.Do(func() { close(read) })
		<-write
	})
	type claimed struct {
		c   *store.Claim
		err error
	}
	began := make(chan claimed, 1)
	store.WhenReleasing(st, func() {
		go func() {
			c, err := st.Claim(ctx, store.ClaimParams{Limit: 10, PayloadCap: 100})
			began <- claimed{c, err}
		}()
		<-read // it read row 1 as waiting
	})
	released(t, st, 1)
	close(write)
	r := <-began
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { _ = r.c.Release(context.Background()) })
	if len(r.c.Records) != 0 || r.c.Deferred != 1 {
		t.Fatalf("claim took %v and deferred %d, want row 2 deferred behind row 1", ids(r.c.Records), r.c.Deferred)
	}
	complete(t, r.c)
	if rowsWhere(t, s, "id = 2 AND next_attempt_at <= now()") != 1 {
		t.Fatal("row 2, deferred behind row 1 by a claim begun during the release, still waits for row 1's old moment")
	}
}

// A row is held as its claim plans it, before that claim is written
// back: a release that comes meanwhile passes over it, and the claim's
// write-back, which would defer it again, makes it ready.
func TestClaimThatHeldAReleasedRowWritesItReady(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', 'x'), ('t', 'k', 'x')`)
	c := claim(t, st, 10)
	if len(c.Records) != 2 {
		t.Fatalf("claimed %v, want rows 1 and 2", ids(c.Records))
	}
	released(t, st, 1)
	complete(t, c, store.Outcome{ID: 1, Kind: store.Deferred, Delay: time.Hour, Error: "circuit open"},
		store.Outcome{ID: 2, Kind: store.Deferred, Delay: time.Hour, Error: "circuit open"})
	if rowsWhere(t, s, "id = 1 AND next_attempt_at <= now()") != 1 {
		t.Fatal("row 1, held and then released, waits for the end of its deferral: its claim's write-back deferred it after the release")
	}
	if rowsWhere(t, s, "id = 2 AND next_attempt_at > now()") != 1 {
		t.Fatal("row 2, held and not released, was made ready")
	}
	// A claim begun after the release holds row 1 again: that one is not
	// undone.
	c = claim(t, st, 10)
	complete(t, c, store.Outcome{ID: 1, Kind: store.Deferred, Delay: time.Hour, Error: "circuit open"})
	if rowsWhere(t, s, "id = 1 AND next_attempt_at > now()") != 1 {
		t.Fatal("row 1, held again by a claim begun after its release, was made ready")
	}
}

// A claim written back after the release's statement, before the release
// recorded what it made ready, commits rows deferred to a released row's
// old moment unseen by either: the release pulls them forward after.
func TestReleasePullsForwardWhatClaimsCommittedMeanwhile(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload, next_attempt_at) VALUES ('t', 'k', 'x', '2100-01-01'), ('t', 'k', 'x', now())`)
	c := claim(t, st, 10) // defers row 2 behind row 1, which the release's statement passes over
	if c.Deferred != 1 {
		t.Fatalf("claim took %v and deferred %d, want row 2 deferred behind row 1", ids(c.Records), c.Deferred)
	}
	store.AfterReleasing(st, func() { complete(t, c) })
	released(t, st, 1)
	if rowsWhere(t, s, "id = 2 AND next_attempt_at <= now()") != 1 {
		t.Fatal("row 2, deferred behind row 1 by a claim written back during the release, still waits for row 1's old moment")
	}
}

// A claim begun after the release recorded the keys it made ready, but
// before its pull forward committed, may read a row that the pull forward
// is about to move as still waiting, and defer its key's later rows to the
// same moment: its write-back makes them ready.
func TestClaimBegunBeforeThePullForwardReadiesTheRowsItDeferred(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload, next_attempt_at) VALUES ('t', 'k', 'x', '2100-01-01'), ('t', 'k', 'x', now())`)
	c := claim(t, st, 10) // defers row 2 behind row 1, which the release's statement passes over
	if c.Deferred != 1 {
		t.Fatalf("claim took %v and deferred %d, want row 2 deferred behind row 1", ids(c.Records), c.Deferred)
	}
	store.AfterReleasing(st, func() { complete(t, c) }) // row 2 committed to row 1's old moment
	var d *store.Claim
	store.BeforePulling(st, func() {
		s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', 'x')`)
		d = claim(t, st, 10) // reads row 2 as waiting: defers row 3 behind it
	})
	released(t, st, 1)
	if d == nil || d.Deferred != 1 {
		t.Fatalf("the claim begun before the pull forward did not defer row 3 behind row 2")
	}
	complete(t, d)
	if rowsWhere(t, s, "id = 3 AND next_attempt_at <= now()") != 1 {
		t.Fatal("row 3, deferred behind row 2 by a claim begun before the pull forward, still waits for row 1's old moment")
	}
}

// A release waits for the write-backs that looked at the releases before
// it recorded its rows: one that holds a held row, and would defer it
// again, has committed before the release's statement runs, which then
// makes the row ready.
func TestReleaseWaitsForTheWriteBacksThatLookedBefore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', 'x')`)
	c := claim(t, st, 10)
	if len(c.Records) != 1 {
		t.Fatalf("claimed %v, want row 1", ids(c.Records))
	}
	waits := make(chan struct{})
	var once sync.Once
	store.WhenReleaseWaits(st, func() { once.Do(func() { close(waits) }) })
	var releaseErr error
	released := make(chan struct{})
	store.AfterLookingAtReleases(st, func() {
		go func() {
			defer close(released)
			_, releaseErr = st.ReleaseHeld(ctx, []store.HeldRow{{ID: 1}})
		}()
		select {
		case <-waits: // the release recorded row 1, and waits for this write-back
		case <-released:
		}
	})
	complete(t, c, store.Outcome{ID: 1, Kind: store.Deferred, Delay: time.Hour, Error: "circuit open"})
	<-released
	if releaseErr != nil {
		t.Fatal(releaseErr)
	}
	if rowsWhere(t, s, "id = 1 AND next_attempt_at <= now()") != 1 {
		t.Fatal("row 1, held by a write-back that looked before the release, waits for the end of its deferral")
	}
}

func rowsWhere(t *testing.T, s *pgtest.Schema, where string) int {
	t.Helper()
	var n int
	if err := s.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The claim keeps its index plan after ANALYZE of a large table, even as
// a generic prepared plan (what pgx's statement cache ends up using).
func TestClaimPlanSurvivesAnalyze(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload, status, sent_at)
		SELECT 't', 'k' || (g % 1000), 'x', CASE WHEN g % 10 = 0 THEN 'pending' ELSE 'sent' END, now()
		FROM generate_series(1, 200000) g`)
	s.Exec(t, `ANALYZE outbox`)
	st := newStore(t, s, false)

	explain := preparedPlans(t, s, "force_generic_plan")
	plan := func(sql, args string) string { return explain("", sql, args) }
	for _, parts := range []string{"0, 15", "4, 7"} {
		claimPlan := plan(store.ClaimSQL(st), "1000, 1048576, '{k1}', '{t1}', 9223372036854775807, 100, "+parts+", true, 750")
		if !claimScans.MatchString(claimPlan) || !strings.Contains(claimPlan, "Index Scan using outbox_waiting_idx") ||
			strings.Contains(claimPlan, "Seq Scan") {
			t.Fatalf("claim plan of partitions %s does not read the claim index from its start, and the waiting rows' index:\n%s", parts, claimPlan)
		}
	}
	holdingPlan := plan(store.HoldingByKeySQL(st), "'{k1,k2}', '{100,200}', 1")
	if !strings.Contains(holdingPlan, "outbox_key_pending_idx") || !strings.Contains(holdingPlan, "outbox_key_parked_idx") ||
		!strings.Contains(holdingPlan, "outbox_key_waiting_idx") || strings.Contains(holdingPlan, "Seq Scan on outbox") {
		t.Fatalf("key order check does not use the holding indexes:\n%s", holdingPlan)
	}
	// The claimed rows are dropped against a hash of their ids: a list
	// searched row by row would cost claimed² for a hot key.
	if !strings.Contains(holdingPlan, "hashed SubPlan") {
		t.Fatalf("key order check does not hash the claimed ids:\n%s", holdingPlan)
	}
	checkSpanPlan(t, "after ANALYZE", plan(store.HoldingBySpanSQL(st), "'{k1,k2}', '{100,200}', 1, 200, 0, 15"))

	// A dominant key must not flip the key check to scanning every
	// pending row: its probe stays bounded by the claimed count.
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'hot', 'x' FROM generate_series(1, 100000)`)
	s.Exec(t, `ANALYZE outbox`)
	skewedPlan := plan(store.HoldingByKeySQL(st), "'{hot,hot,hot}', '{200001,200002,200003}', 1")
	bounded := regexp.MustCompile(`Limit .*\n\s*->  Index Scan using outbox_key_pending_idx on outbox p `)
	if !bounded.MatchString(skewedPlan) || strings.Contains(skewedPlan, "outbox_pending_idx on outbox p ") ||
		strings.Contains(skewedPlan, "Seq Scan on outbox") {
		t.Fatalf("key check with a dominant key is not a bounded probe per key:\n%s", skewedPlan)
	}
	checkSpanPlan(t, "with a dominant key", plan(store.HoldingBySpanSQL(st), "'{hot,hot,hot}', '{200001,200002,200003}', 1, 200003, 0, 15"))

	// The key's last claimed row ends its probe, which does not read on
	// through the dominant key's other rows.
	run := explain("ANALYZE, BUFFERS", store.HoldingByKeySQL(st), "'{hot,hot,hot}', '{200001,200002,200003}', 1")
	probe := regexp.MustCompile(`Index Scan using outbox_key_pending_idx on outbox p .*\n(?:\s+\w.*\n)*?\s+Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?`).FindStringSubmatch(run)
	if probe == nil {
		t.Fatalf("no buffer counts for the probe in:\n%s", run)
	}
	hit, _ := strconv.Atoi(probe[1])
	read, _ := strconv.Atoi(probe[2])
	if hit+read > 30 {
		t.Fatalf("the probe of 3 claimed rows read %d buffers:\n%s", hit+read, run)
	}

	// And it is fast: a claim of 1000 rows out of 20,000 pending.
	start := time.Now()
	c := claim(t, st, 1000)
	elapsed := time.Since(start)
	defer c.Release(ctx)
	if len(c.Records) != 1000 {
		t.Fatalf("claimed %d rows, want 1000", len(c.Records))
	}
	t.Logf("claim of 1000 rows with key order check: %v", elapsed)
}

// An outbox that keeps up is mostly dead rows, so an ANALYZE may leave
// the planner believing that a claim's id range, or the whole pending
// index, holds a row or two when it holds thousands. The key check by key
// must still probe each key on the key index, and the one by span read
// the span once on an id index: scanning the pending rows once per key
// costs claimed × pending index entries, seconds per claim.
func TestKeyCheckPlanWithStaleStatistics(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	var super bool
	if err := s.Pool.QueryRow(context.Background(), `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
		t.Fatal(err)
	}
	if !super {
		t.Skip("writing planner statistics needs a superuser; " + pgtest.EnvURL + " names a database user that is not one")
	}
	// Autovacuum would overwrite the statistics written below.
	s.Exec(t, `ALTER TABLE outbox SET (autovacuum_enabled = off)`)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload)
		SELECT 't', 'key-' || (g * 7919 % 65536), 'x' FROM generate_series(1, 20000) g`)
	s.Exec(t, `ANALYZE outbox`)
	st := newStore(t, s, false)
	// Claims run on generic plans (their transaction forces them); the
	// custom plans, made for the arguments, must hold too.
	explainers := map[string]func(options, sql, args string) string{
		"generic": preparedPlans(t, s, "force_generic_plan"),
		"custom":  preparedPlans(t, s, "force_custom_plan"),
	}
	probe := regexp.MustCompile(`Limit .*\n.*Index Scan using outbox_key_pending_idx on outbox p .*\n\s*Index Cond: \(\(ROW\(key, id\) >= ROW\(c.key, (\$3|'1000'::bigint)\)\)`)
	s.Exec(t, `CREATE TABLE pages AS SELECT oid, relname, relpages FROM pg_class
		WHERE relnamespace = $1::regnamespace AND relname LIKE 'outbox%'`, s.Name)
	cases := []struct {
		table, pending, keys float64 // reltuples of the table, the pending index and the key index
		pages                float64 // relpages as a multiple of the real ones
	}{
		{-1, -1, -1, 0}, // never analyzed
		{0, 0, 0, 0}, {1, 1, 1, 1}, {50, 50, 50, 1}, {300, 300, 300, 20}, {20000, 20000, 20000, 1},
		{2000, 1, 2000, 1}, {2000, 0, 0, 1}, {20000, 1, 20000, 20},
	}
	for _, columns := range []bool{true, false} {
		if !columns {
			// Analyzed while empty: no column statistics either.
			s.Exec(t, `DELETE FROM pg_statistic WHERE starelid = 'outbox'::regclass`)
		}
		for _, stats := range cases {
			// What an ANALYZE or VACUUM of a nearly empty, bloated table
			// leaves behind.
			s.Exec(t, `UPDATE pg_class c SET relpages = p.relpages * $4::real,
				reltuples = CASE p.relname WHEN 'outbox' THEN $1::real WHEN 'outbox_pending_idx' THEN $2::real ELSE $3::real END
				FROM pages p WHERE c.oid = p.oid`, stats.table, stats.pending, stats.keys, stats.pages)
			for mode, explain := range explainers {
				plan := explain("", store.HoldingByKeySQL(st), "'{key-1,key-2}', '{19000,19001}', 1000")
				if !probe.MatchString(plan) || strings.Contains(plan, "outbox_pending_idx") || strings.Contains(plan, "Seq Scan on outbox") ||
					!strings.Contains(plan, "hashed SubPlan") {
					t.Errorf("%s plan with statistics %+v (column statistics: %v): the key order check does not probe each key on its index and hash the claimed ids:\n%s",
						mode, stats, columns, plan)
				}
				checkSpanPlan(t, fmt.Sprintf("%s plan with statistics %+v (column statistics: %v)", mode, stats, columns),
					explain("", store.HoldingBySpanSQL(st), "'{key-1,key-2}', '{19000,19001}', 1000, 19001, 3, 9"))
			}
		}
	}
}

// A claim's statements are planned once a connection, not for each of
// their first calls: a custom plan of the claim or its key check costs
// the server 1-3 ms, a fifth of its CPU while a freshly started relay
// drains a backlog.
func TestClaimsUseGenericPlans(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	explain := preparedPlans(t, s, "")
	// A statement's first call: left to choose, the server plans it for
	// its arguments.
	plan := explain("", store.HoldingByKeySQL(st), "'{key-1,key-2}', '{19000,19001}', 1000")
	if !strings.Contains(plan, "$3") || strings.Contains(plan, "'1000'::bigint") {
		t.Fatalf("the key check is not planned generically in a claim's transaction:\n%s", plan)
	}
}

// claimScans is the claim's read of the rows that never waited: the
// claim index from the start given, with the range of partitions on its
// second column.
var claimScans = regexp.MustCompile(`Index Scan using outbox_claim_idx on outbox outbox_1 .*\n\s*Index Cond: \(\(id <= \$5\) AND \(id > \$6\) AND \(CASE .* >= \$7\) AND \(CASE .* <= \$8\)\)`)

// spanScan is the key check by span's read of the span on an id index.
var spanScan = regexp.MustCompile(`(?m)^\s*(?:->  )?Index Scan using (outbox_claim_idx|outbox_pending_idx|outbox_pkey) on outbox p .*\n\s*Index Cond: \(\(id >= (\$3|'\d+'::bigint)\) AND \(id < (\$4|'\d+'::bigint)\)`)

// checkSpanPlan checks that the key check by span reads the span once on
// an id index, keeping rows against hashes of the claimed keys and ids:
// no pass over the table or the key index, and, with the keys a filter
// rather than a join, no pass over the span once per key. Below the
// span, each key's rows that waited are probed on their own index.
func checkSpanPlan(t *testing.T, when, plan string) {
	t.Helper()
	if !spanScan.MatchString(plan) || strings.Count(plan, "hashed SubPlan") != 3 || strings.Contains(plan, "outbox_key_pending_idx") ||
		strings.Contains(plan, "Seq Scan on outbox") || !strings.Contains(plan, "outbox_key_parked_idx") ||
		!strings.Contains(plan, "outbox_key_waiting_idx") {
		t.Errorf("%s: the key check by span does not read the span once on an id index with hashed keys and ids:\n%s", when, plan)
	}
}

// preparedPlans returns a function that explains a prepared statement in
// a transaction begun as a claim's is, with the given EXPLAIN options and
// arguments. planCacheMode is force_generic_plan or force_custom_plan,
// or empty for what the claim's transaction sets.
func preparedPlans(t *testing.T, s *pgtest.Schema, planCacheMode string) func(options, sql, args string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := s.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	prepared := 0
	return func(options, sql, args string) string {
		t.Helper()
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: store.ClaimBegin})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		// After the claim's own settings, which force generic plans.
		if planCacheMode != "" {
			if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+planCacheMode); err != nil {
				t.Fatal(err)
			}
		}
		prepared++ // prepared statements outlive the transaction
		name := fmt.Sprintf("plan_%d", prepared)
		if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+sql); err != nil {
			t.Fatal(err)
		}
		if options != "" {
			options = "(" + options + ") "
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+options+"EXECUTE "+name+"("+args+")")
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
}

func TestDeleteSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, true)
	s.Exec(t, `INSERT INTO outbox (topic, payload, status, sent_at)
		SELECT 't', 'x', 'sent', now() - interval '2 hours' FROM generate_series(1, 25)`)
	s.Exec(t, `INSERT INTO outbox (topic, payload, status, sent_at) VALUES ('t', 'recent', 'sent', now()), ('t', 'pending', 'pending', NULL)`)

	total := int64(0)
	for {
		n, busy, err := st.DeleteSent(ctx, time.Hour, 10)
		if err != nil || busy {
			t.Fatalf("DeleteSent: %d busy %v err %v", n, busy, err)
		}
		total += n
		if n < 10 {
			break
		}
	}
	if total != 25 {
		t.Fatalf("deleted %d rows, want the 25 sent over an hour ago", total)
	}
	var left int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 2 {
		t.Fatalf("%d rows left, want the recent sent row and the pending one", left)
	}

	// Another replica holding the cleanup lock makes this one step aside.
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, store.CleanupLockID(st)); err != nil {
		t.Fatal(err)
	}
	if _, busy, err := st.DeleteSent(ctx, 0, 10); err != nil || !busy {
		t.Fatalf("DeleteSent while another replica cleans: busy %v err %v", busy, err)
	}
}

// A claim's transaction carries its own settings, not the session's (a
// transaction-mode pooler would hand session settings to other clients),
// and the server ends a claim the relay has left idle, releasing its rows
// to other claimers.
func TestIdleClaimIsEndedByTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st, err := store.New(s.Pool, store.Config{Schema: s.Name, IdleInTransactionTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'x' FROM generate_series(1, 3) g`)
	c := claim(t, st, 10)
	if len(c.Records) != 3 {
		t.Fatalf("claimed %d rows, want 3", len(c.Records))
	}
	for name, want := range map[string]string{"synchronous_commit": "off", "idle_in_transaction_session_timeout": "300ms"} {
		got, err := store.ClaimSetting(ctx, c, name)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s in a claim, want %s", name, got, want)
		}
	}
	var session string
	if err := s.Pool.QueryRow(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&session); err != nil {
		t.Fatal(err)
	}
	if session != "0" {
		t.Errorf("idle_in_transaction_session_timeout = %s outside a claim, want the server's 0", session)
	}

	other := newStore(t, s, false)
	testwait.Within(t, 30*time.Second, "the idle claim's rows to be claimable again", func() bool {
		c2, err := other.Claim(ctx, store.ClaimParams{Limit: 10, PayloadCap: 100})
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Release(ctx)
		return len(c2.Records) == 3
	})
	if err := c.Complete(ctx, nil); err == nil {
		t.Error("the claim ended by the server completed")
	}
}
