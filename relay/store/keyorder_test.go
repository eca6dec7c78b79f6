package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// claimFollowing claims up to limit rows behind the keyed rows of claims
// still in flight.
func claimFollowing(t *testing.T, st *store.Store, limit int, claims ...*store.Claim) *store.Claim {
	t.Helper()
	var follows []store.KeyedRow
	for _, c := range claims {
		for _, r := range c.Records {
			if r.HasKey {
				follows = append(follows, store.KeyedRow{Key: r.Key, ID: r.ID})
			}
		}
	}
	return claimBehind(t, st, limit, follows)
}

// claimBehind claims up to limit rows behind the rows follows, releasing
// the claim when the test ends, like claim.
func claimBehind(t *testing.T, st *store.Store, limit int, follows []store.KeyedRow) *store.Claim {
	t.Helper()
	c, err := st.Claim(context.Background(), store.ClaimParams{Limit: limit, PayloadCap: 100, Follows: follows})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Release(context.Background()) })
	return c
}

// A claim that follows rows in flight takes their keys' next rows behind
// them; rows in flight that it does not follow still hold their keys.
func TestClaimFollowsRowsInFlight(t *testing.T) {
	forEachKeyCheck(t, func(t *testing.T, s *pgtest.Schema, st *store.Store) {
		// ids 1..6: K K K K J K
		s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES
			('t','K','1'), ('t','K','2'), ('t','K','3'), ('t','K','4'), ('t','J','5'), ('t','K','6')`)

		a := claim(t, st, 2)
		if got := ids(a.Records); fmt.Sprint(got) != "[1 2]" {
			t.Fatalf("first claim = %v, want [1 2]", got)
		}
		b := claimFollowing(t, st, 2, a)
		if got := ids(b.Records); fmt.Sprint(got) != "[3 4]" || b.Skipped != 0 {
			t.Fatalf("claim following [1 2] = %v, %d skipped; want [3 4], K's next rows", got, b.Skipped)
		}
		// Not following: K's 6 is held by the rows in flight.
		c := claim(t, st, 2)
		if got := ids(c.Records); fmt.Sprint(got) != "[5]" || c.Skipped != 1 {
			t.Fatalf("claim following nothing = %v, %d skipped; want [5], with K's 6 skipped", got, c.Skipped)
		}
		complete(t, c, sent(5))

		// Following [3 4] only: 1 and 2, in flight, still hold K.
		store.HeadClaimDue(st)
		d := claimFollowing(t, st, 1, b)
		if got := ids(d.Records); len(got) != 0 || d.Skipped != 1 {
			t.Fatalf("claim following [3 4] only = %v, %d skipped; want 6 skipped behind 1 and 2", got, d.Skipped)
		}
		if err := d.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		e := claimFollowing(t, st, 1, a, b)
		if got := ids(e.Records); fmt.Sprint(got) != "[6]" {
			t.Fatalf("claim following [1 2 3 4] = %v, want [6]", got)
		}
	})
}

// A followed row that failed and was written back before the claim's key
// check holds nothing back: the claim takes its key's next rows, which
// its caller must then leave without an outcome. Once that claim ends,
// the next one holds them back behind the failed row, as usual.
func TestFollowedRowThatFailedIsLeftToTheCaller(t *testing.T) {
	forEachKeyCheck(t, func(t *testing.T, s *pgtest.Schema, st *store.Store) {
		s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','K','1'), ('t','K','2'), ('t','K','3')`)
		a := claim(t, st, 1)
		follows := []store.KeyedRow{{Key: "K", ID: a.Records[0].ID}}
		complete(t, a, store.Outcome{ID: 1, Kind: store.Retried, Error: "503", Class: "transient", Attempted: true, Delay: 3600e9})

		b := claimBehind(t, st, 2, follows)
		if got := ids(b.Records); fmt.Sprint(got) != "[2 3]" {
			t.Fatalf("claim following the failed 1 = %v, want [2 3]", got)
		}
		complete(t, b) // left without an outcome
		store.HeadClaimDue(st)
		c := claim(t, st, 2)
		if len(c.Records) != 0 || c.Deferred != 2 {
			t.Fatalf("next claim = %v, %d deferred; want 2 and 3 deferred behind 1", ids(c.Records), c.Deferred)
		}
	})
}
