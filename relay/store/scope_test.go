package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// scopeOfTopic puts topics a and b in scopes of their own and every other
// topic in a third.
func scopeOfTopic(topic string) string {
	switch topic {
	case "a", "b":
		return topic
	case "lost":
		return store.EveryScope
	}
	return "rest"
}

// With an order scope, a key's row is held back only by the rows of its
// key in its scope: a waiting or parked row of topic a holds back the
// key's later rows of a, one of b those of b, and the rows of the third
// scope go. Both blockers lie below the floor, where claims find rows that
// wait on the waiting rows' index: the key's lowest (a's) does not hide the
// next scope's. Without a scope, the key's lowest holds back all three.
func TestOrderScopeHoldsBackOnlyItsOwnRows(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"waiting", "parked"} {
		for name, form := range map[string]store.KeyCheckForm{"by span": store.KeyCheckBySpan, "by key": store.KeyCheckByKey} {
			for _, scoped := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s, %s, scoped %v", kind, name, scoped), func(t *testing.T) {
					t.Parallel()
					orderScopeHoldsBack(t, kind, form, scoped)
				})
			}
		}
	}
}

func orderScopeHoldsBack(t *testing.T, kind string, form store.KeyCheckForm, scoped bool) {
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := leasedStore(t, s, "a")
	store.SetKeyCheck(st, form)
	var scope func(string) string
	if scoped {
		scope = scopeOfTopic
	}
	claim := func(limit int) *store.Claim {
		t.Helper()
		store.HeadClaimDue(st)
		c, err := st.Claim(ctx, store.ClaimParams{Limit: limit, PayloadCap: 100, OrderScope: scope})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Release(ctx) })
		return c
	}
	// 1 and 2 hold K in a and b; 3 to 8 are other keys', delivered, so the
	// floor moves past 1 and 2.
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('a','K','1'), ('b','K','2')`)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 'a', 'k' || g, 'x' FROM generate_series(3, 8) g`)
	first := claim(2)
	if got := ids(first.Records); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("first claim = %v, want [1 2]", got)
	}
	var outcomes []store.Outcome
	for i, id := range []int64{1, 2} {
		if kind == "waiting" {
			outcomes = append(outcomes, store.Outcome{ID: id, Kind: store.Retried, Error: "503", Attempted: true,
				Delay: time.Hour + time.Duration(i)*time.Minute})
		} else {
			outcomes = append(outcomes, store.Outcome{ID: id, Kind: store.DeadLettered, Reason: "permanent", Error: "400",
				Attempted: true, ParkKey: true})
		}
	}
	complete(t, first, outcomes...)
	rest := claim(10)
	if got := ids(rest.Records); fmt.Sprint(got) != "[3 4 5 6 7 8]" {
		t.Fatalf("second claim = %v, want [3 4 5 6 7 8]", got)
	}
	complete(t, rest, sent(3), sent(4), sent(5), sent(6), sent(7), sent(8))

	// K's later rows: 9 of b, 10 of a, 11 of c.
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('b','K','9'), ('a','K','10'), ('c','K','11')`)
	c := claim(10)
	want, deferred := "[11]", 2
	if !scoped {
		want, deferred = "[]", 3
	}
	if got := ids(c.Records); fmt.Sprint(got) != want || c.Deferred != deferred || c.Skipped != 0 {
		t.Fatalf("claim = %v deferred %d skipped %d, want %s with %d deferred; %s",
			got, c.Deferred, c.Skipped, want, deferred, store.FloorState(st))
	}
	complete(t, c)
	// Each deferred row waits behind the blocker of its scope.
	behind := map[int64]int64{9: 2, 10: 1}
	if !scoped {
		behind = map[int64]int64{9: 1, 10: 1, 11: 1}
	}
	for row, blocker := range behind {
		var same bool
		var parkedBehind *int64
		if err := s.Pool.QueryRow(ctx, `SELECT o.next_attempt_at = b.next_attempt_at, o.parked_behind
			FROM outbox o, outbox b WHERE o.id = $1 AND b.id = $2`, row, blocker).Scan(&same, &parkedBehind); err != nil {
			t.Fatal(err)
		}
		switch kind {
		case "waiting":
			if !same {
				t.Errorf("row %d was not deferred to row %d's next attempt", row, blocker)
			}
		case "parked":
			if parkedBehind == nil || *parkedBehind != blocker {
				t.Errorf("row %d is parked behind %v, want %d", row, parkedBehind, blocker)
			}
		}
	}
}

// A row of every scope (one without a route) that parks its key holds
// back the key's rows of every scope.
func TestRowOfEveryScopeHoldsBackEveryScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('lost','K','1'), ('a','K','2'), ('c','K','3'), ('a','L','4')`)
	s.Exec(t, `UPDATE outbox SET status = 'dead_lettered', dead_letter_reason = 'no_route', key_parked = true, dead_lettered_at = now() WHERE id = 1`)
	c, err := st.Claim(ctx, store.ClaimParams{Limit: 10, PayloadCap: 100, OrderScope: scopeOfTopic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Release(ctx) })
	if got := ids(c.Records); fmt.Sprint(got) != "[4]" || c.Deferred != 2 {
		t.Fatalf("claim = %v deferred %d, want [4] with K's rows of a and of the rest parked behind row 1", got, c.Deferred)
	}
}
