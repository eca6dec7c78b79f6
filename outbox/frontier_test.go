package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// complete writes outcomes back for c, failing the test on error.
func complete(t *testing.T, c *outbox.Claim, outcomes ...outbox.Outcome) {
	t.Helper()
	if err := c.Complete(context.Background(), outcomes); err != nil {
		t.Fatal(err)
	}
}

// retryNow is a failed attempt whose retry is due at once.
func retryNow(id int64) outbox.Outcome {
	return outbox.Outcome{ID: id, Kind: outbox.Retried, Error: "503", Class: "transient", Attempted: true}
}

func sent(id int64) outbox.Outcome { return outbox.Outcome{ID: id, Kind: outbox.Sent} }

// During a backlog a claim starts above the last full claim, and a ready
// row below it is claimed by the next claim that runs short, in order with
// its key.
func TestClaimStartsAtTheFrontier(t *testing.T) {
	forEachKeyCheck(t, func(t *testing.T, s *pgtest.Schema, st *outbox.Store) {
		// ids 1..10: K x K y, then six without a key
		s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','K','1'), ('t','x','2'), ('t','K','3'), ('t','y','4')`)
		s.Exec(t, `INSERT INTO outbox (topic, payload) SELECT 't', 'p' FROM generate_series(5, 10)`)

		first := claim(t, st, 2)
		if got := ids(first.Records); fmt.Sprint(got) != "[1 2]" {
			t.Fatalf("first claim = %v, want [1 2]", got)
		}
		complete(t, first, retryNow(1), sent(2))

		// 1 is ready again, but below the full claim's last row: the next
		// claim starts above it. K's 3 waits for 1, and is not taken
		// ahead of it.
		second := claim(t, st, 2)
		if got := ids(second.Records); fmt.Sprint(got) != "[4]" || second.Skipped != 1 || fmt.Sprint(second.SkippedKeys) != "[K]" {
			t.Fatalf("second claim = %v, skipped %d %v; want [4], with K's 3 skipped behind 1", got, second.Skipped, second.SkippedKeys)
		}
		complete(t, second, sent(4))

		// Above the frontier there are fewer rows than the limit: the rest
		// comes from the head, K's 1 before its 3.
		third := claim(t, st, 10)
		if got := ids(third.Records); fmt.Sprint(got) != "[1 3 5 6 7 8 9 10]" {
			t.Fatalf("third claim = %v, want [1 3 5 6 7 8 9 10]", got)
		}
	})
}

// While a backlog lasts, one claim a HeadEvery starts from the head.
func TestClaimFromTheHeadEverySoOften(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, payload) SELECT 't', 'p' FROM generate_series(1, 8)`)

	first := claim(t, st, 2)
	complete(t, first, retryNow(1), sent(2))
	if got := ids(claim(t, st, 2).Records); fmt.Sprint(got) != "[3 4]" {
		t.Fatalf("claim at the frontier = %v, want [3 4]", got)
	}
	outbox.HeadClaimDue(st)
	if got := ids(claim(t, st, 2).Records); fmt.Sprint(got) != "[1 5]" {
		t.Fatalf("claim from the head = %v, want [1 5]: 1 is ready again, 3 and 4 are locked", got)
	}
}

// Rows a claim gives back are ready again: the next claim starts from the
// head, whatever the frontier.
func TestReleasedRowsAreClaimedFirst(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, payload) SELECT 't', 'p' FROM generate_series(1, 6)`)

	first := claim(t, st, 2)
	if err := first.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := ids(claim(t, st, 2).Records); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("claim after a release = %v, want [1 2]", got)
	}
}
