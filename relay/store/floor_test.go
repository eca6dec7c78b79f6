package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// leasedStore is a store that leases partitions as claimer, synced once.
func leasedStore(t *testing.T, s *pgtest.Schema, claimer string) *store.Store {
	t.Helper()
	st, err := store.New(s.Pool, store.Config{Schema: s.Name, Claimer: claimer, ClaimLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SyncPartitions(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}

// Claims by stores that read from their floors, with rows failing,
// deferred behind their keys, left without an outcome, given back,
// committed late below the frontier, and of a topic left out of claims
// now and then, deliver every row, each key's in id order; a second and a
// third store joining take their shares of the partitions. The stores are driven as the relay drives them: a claim
// leaves out the keys that another open claim of its store holds, and a
// key's rows after one that failed get no outcome.
func TestFloorsDeliverEveryRowInKeyOrder(t *testing.T) {
	t.Parallel()
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			floorsModel(t, seed, nil)
		})
	}
}

// With order kept per topic, each topic's rows of a key keep their order,
// and a key's rows of one topic never wait for those of the other.
func TestFloorsDeliverEveryRowInScopedKeyOrder(t *testing.T) {
	t.Parallel()
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			floorsModel(t, seed, func(topic string) string { return topic })
		})
	}
}

// floorsModel runs claims, producers and stores joining at random, then
// checks that every row was delivered, each key's rows in id order within
// their order scope (scope, nil for the key's every row).
func floorsModel(t *testing.T, seed uint64, scope func(topic string) string) {
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(seed, 7))
	// Three claims and a producer's transaction open at once, and the
	// statements beside them.
	s := pgtest.NewSchema(t).WithConns(t, 10)
	pool := s.Pool
	stores := []*store.Store{leasedStore(t, s, "a")}
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	type open struct {
		st    *store.Store
		claim *store.Claim
	}
	var claims []open
	inserted := map[int64]string{} // id → key ("" for none)
	scopeOf := map[int64]string{}  // id → its order scope
	inScope := func(key, topic string) string {
		if scope == nil {
			return key
		}
		return key + "/" + scope(topic)
	}
	delivered := map[int64]bool{}
	var order []int64 // first deliveries, in order
	var late pgx.Tx   // a producer transaction left open
	lateKey := ""
	insert := func(db interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	}, key string, n int) []int64 {
		topic := "t"
		if rnd.IntN(4) == 0 {
			topic = "u" // a destination that is paused now and then
		}
		rows, err := db.Query(ctx, `INSERT INTO outbox (topic, key, payload) SELECT $3, $1, 'x' FROM generate_series(1, $2) RETURNING id`,
			pgtype.Text{String: key, Valid: key != ""}, n, topic)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			scopeOf[id] = inScope(key, topic)
		}
		return ids
	}
	// inFlight is what the relay excludes: the keys st's open claims
	// hold, and the lowest id they hold of them.
	inFlight := func(st *store.Store) ([]string, int64) {
		var out []string
		var lowest int64
		for _, o := range claims {
			if o.st != st {
				continue
			}
			for _, r := range o.claim.Records {
				if r.HasKey && !slices.Contains(out, r.Key) {
					out = append(out, r.Key)
				}
				if r.HasKey && (lowest == 0 || r.ID < lowest) {
					lowest = r.ID
				}
			}
		}
		return out, lowest
	}
	finish := func(i int) {
		o := claims[i]
		claims = slices.Delete(claims, i, i+1)
		if rnd.IntN(10) == 0 {
			if err := o.claim.Release(ctx); err != nil {
				t.Fatal(err)
			}
			return
		}
		var outcomes []store.Outcome
		failed := map[string]bool{}
		for _, r := range o.claim.Records {
			k := inScope(r.Key, r.Topic)
			if r.HasKey && failed[k] {
				continue // no outcome after its key's failure in its scope
			}
			switch n := rnd.IntN(20); {
			case n < 2:
				outcomes = append(outcomes, store.Outcome{ID: r.ID, Kind: store.Retried, Error: "503", Attempted: true,
					Delay: time.Duration(rnd.IntN(3)) * 10 * time.Millisecond})
				failed[k] = r.HasKey
			case n < 3:
				outcomes = append(outcomes, store.Outcome{ID: r.ID, Kind: store.Deferred, Delay: 5 * time.Millisecond})
				failed[k] = r.HasKey
			case n < 4:
				failed[k] = r.HasKey // left without an outcome, as a key's rows behind a failure are
			default:
				outcomes = append(outcomes, store.Outcome{ID: r.ID, Kind: store.Sent})
			}
		}
		if err := o.claim.Complete(ctx, outcomes); err != nil {
			t.Fatal(err)
		}
		for _, oc := range outcomes {
			if oc.Kind == store.Sent && !delivered[oc.ID] {
				delivered[oc.ID] = true
				order = append(order, oc.ID)
			}
		}
	}
	step := func(i int) {
		switch n := rnd.IntN(12); {
		case n < 3:
			key := keys[rnd.IntN(len(keys))]
			if rnd.IntN(4) == 0 {
				key = "" // no key: any order
			}
			for _, id := range insert(s.Pool, key, 1+rnd.IntN(4)) {
				inserted[id] = key
			}
		case n < 4 && late == nil:
			// A producer that holds its key while its transaction is
			// open, as the default order asks: nobody else writes the
			// key meanwhile.
			tx, err := s.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			late, lateKey = tx, "late"
			for _, id := range insert(tx, lateKey, 1+rnd.IntN(3)) {
				inserted[id] = "late"
			}
		case n < 5 && late != nil:
			if err := late.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			late = nil
			for _, id := range insert(s.Pool, lateKey, 2) {
				inserted[id] = "late"
			}
		case n < 9 && len(claims) < 3:
			st := stores[rnd.IntN(len(stores))]
			var topics []string
			if (i/40)%2 == 1 {
				topics = []string{"u"}
			}
			exclude, excludedFrom := inFlight(st)
			c, err := st.Claim(ctx, store.ClaimParams{Limit: 1 + rnd.IntN(8), PayloadCap: 100, ExcludeKeys: exclude,
				ExcludedFrom: excludedFrom, ExcludeTopics: topics, ExcludeFor: 20 * time.Millisecond, OrderScope: scope})
			if err != nil {
				t.Fatal(err)
			}
			claims = append(claims, open{st, c})
		case len(claims) > 0:
			finish(rnd.IntN(len(claims)))
		}
		// A second store joins, then a third that ranks between them:
		// each syncs on its own, so that partitions change hands one
		// sync at a time and a store holds runs of partitions with gaps
		// between them, which its claims do not read until they close.
		if i == 150 || i == 300 {
			name := map[int]string{150: "c", 300: "b"}[i]
			st, err := store.New(s.Pool, store.Config{Schema: s.Name, Claimer: name, ClaimLease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			stores = append(stores, st)
		}
		if i >= 150 && rnd.IntN(3) == 0 {
			if err := stores[rnd.IntN(len(stores))].SyncPartitions(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 500 {
		step(i)
	}
	if late != nil {
		if err := late.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for len(claims) > 0 {
		finish(0)
	}
	// Drain: every row is delivered, whatever is left where.
	deadline := time.Now().Add(30 * time.Second)
	for len(delivered) < len(inserted) {
		if time.Now().After(deadline) {
			var missing []int64
			for id := range inserted {
				if !delivered[id] {
					missing = append(missing, id)
				}
			}
			slices.Sort(missing)
			rows, _ := pool.Query(ctx, `SELECT id, coalesce(key, '-'), status, next_attempt_at <> created_at, next_attempt_at > now(),
				outbox_partition(key, id), (SELECT owner FROM outbox_claim_partitions WHERE part = outbox_partition(key, id))
				FROM outbox WHERE id = ANY($1) ORDER BY id`, missing)
			for rows.Next() {
				v, _ := rows.Values()
				t.Log(v...)
			}
			rows.Close()
			for _, st := range stores {
				t.Log(store.FloorState(st))
			}
			t.Fatalf("seed %d: %d of %d rows never delivered: %v", seed, len(missing), len(inserted), missing)
		}
		for _, st := range stores {
			if err := st.SyncPartitions(ctx); err != nil {
				t.Fatal(err)
			}
			c, err := st.Claim(ctx, store.ClaimParams{Limit: 10, PayloadCap: 100, OrderScope: scope})
			if err != nil {
				t.Fatal(err)
			}
			var outcomes []store.Outcome
			for _, r := range c.Records {
				outcomes = append(outcomes, store.Outcome{ID: r.ID, Kind: store.Sent})
			}
			if err := c.Complete(ctx, outcomes); err != nil {
				t.Fatal(err)
			}
			for _, oc := range outcomes {
				if !delivered[oc.ID] {
					delivered[oc.ID] = true
					order = append(order, oc.ID)
				}
			}
		}
	}
	// Each key's rows were first delivered in id order in their scope.
	last := map[string]int64{}
	for _, id := range order {
		if inserted[id] == "" {
			continue
		}
		key := scopeOf[id]
		if id < last[key] {
			t.Errorf("seed %d: key %s: row %d first delivered after row %d", seed, key, id, last[key])
		}
		last[key] = max(last[key], id)
	}
}

// complete writes outcomes back for c, failing the test on error.
func complete(t *testing.T, c *store.Claim, outcomes ...store.Outcome) {
	t.Helper()
	if err := c.Complete(context.Background(), outcomes); err != nil {
		t.Fatal(err)
	}
}

// retryNow is a failed attempt whose retry is due at once.
func retryNow(id int64) store.Outcome {
	return store.Outcome{ID: id, Kind: store.Retried, Error: "503", Class: "transient", Attempted: true}
}

func sent(id int64) store.Outcome { return store.Outcome{ID: id, Kind: store.Sent} }

// A row that failed waits for its retry on the waiting rows' index, and is
// claimed again once due wherever the claims have got to, before its
// key's later rows.
func TestRetriedRowIsClaimedAgainWhereverClaimsAre(t *testing.T) {
	forEachKeyCheck(t, func(t *testing.T, s *pgtest.Schema, st *store.Store) {
		// ids 1..10: K x K y, then six without a key
		s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t','K','1'), ('t','x','2'), ('t','K','3'), ('t','y','4')`)
		s.Exec(t, `INSERT INTO outbox (topic, payload) SELECT 't', 'p' FROM generate_series(5, 10)`)

		first := claim(t, st, 2)
		if got := ids(first.Records); fmt.Sprint(got) != "[1 2]" {
			t.Fatalf("first claim = %v, want [1 2]", got)
		}
		complete(t, first, retryNow(1), sent(2))

		// 1 is due again, below where the claims have got to: it comes
		// first, and K's 3 travels with it.
		second := claim(t, st, 2)
		if got := ids(second.Records); fmt.Sprint(got) != "[1 3]" || second.Skipped != 0 || second.Deferred != 0 {
			t.Fatalf("second claim = %v, skipped %d, deferred %d; want [1 3]", got, second.Skipped, second.Deferred)
		}
		if got := ids(claim(t, st, 10).Records); fmt.Sprint(got) != "[4 5 6 7 8 9 10]" {
			t.Fatalf("third claim = %v, want [4 5 6 7 8 9 10]", got)
		}
	})
}

// A row that appears below where claims have got to (committed late, or
// given its id by the producer) is claimed by the next claim from the
// head, one a HeadEvery.
func TestClaimFromTheHeadEverySoOften(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	st := newStore(t, s, false)
	s.Exec(t, `INSERT INTO outbox (id, topic, payload) OVERRIDING SYSTEM VALUE SELECT g, 't', 'p' FROM generate_series(1, 8) g WHERE g <> 2`)

	complete(t, claim(t, st, 2), sent(1), sent(3))
	claim(t, st, 2) // 4 and 5, held
	s.Exec(t, `INSERT INTO outbox (id, topic, payload) OVERRIDING SYSTEM VALUE VALUES (2, 't', 'p')`)
	if got := ids(claim(t, st, 2).Records); fmt.Sprint(got) != "[6 7]" {
		t.Fatalf("claim above the last = %v, want [6 7]", got)
	}
	store.HeadClaimDue(st)
	if got := ids(claim(t, st, 2).Records); fmt.Sprint(got) != "[2 8]" {
		t.Fatalf("claim from the head = %v, want [2 8]: 2 appeared below, 4 to 7 are locked", got)
	}
}

// A key check that finds a due row holding back a row that waited locks
// it for a moment, to tell whether a claim holds it. A claim that runs
// meanwhile passes over it, locked, and comes back short, as if it had
// read it: the floor must not rise past it then, or it would be stranded
// below the floor, and its key's later rows delivered before it. Whether
// the probing claim completes or is given back, the next claim takes it.
func TestRowLockedByAKeyCheckProbeIsNotPassedOver(t *testing.T) {
	t.Parallel()
	for _, give := range []bool{false, true} {
		t.Run(fmt.Sprintf("given back %v", give), func(t *testing.T) {
			t.Parallel()
			s := pgtest.NewSchema(t)
			st := leasedStore(t, s, "a")
			// 1 delivered, so that claims read above it and take the rows
			// that waited first; then 2 and 3 of key K, 4 without a key,
			// and 3 waited and is due.
			s.Exec(t, `INSERT INTO outbox (topic, payload) VALUES ('t', '1')`)
			complete(t, claim(t, st, 10), sent(1))
			s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'K', '2'), ('t', 'K', '3'), ('t', NULL, '4')`)
			s.Exec(t, `UPDATE outbox SET next_attempt_at = created_at - interval '1 second' WHERE id = 3`)

			var during []int64
			store.WhileProbing(st, func() {
				store.HeadClaimDue(st)
				c := claim(t, st, 10)
				during = ids(c.Records)
				complete(t, c, sent(4))
			})
			probing := claim(t, st, 1)
			store.WhileProbing(st, nil)
			if got := ids(probing.Records); fmt.Sprint(got) != "[]" || probing.Deferred != 1 {
				t.Fatalf("probing claim = %v, deferred %d; want 3 taken and deferred behind 2", got, probing.Deferred)
			}
			if fmt.Sprint(during) != "[4]" {
				t.Fatalf("claim during the probe = %v, want [4]: 2 locked by the probe, 3 by the probing claim", during)
			}
			if give {
				if err := probing.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
			} else {
				complete(t, probing)
			}
			next := claim(t, st, 10)
			if got := ids(next.Records); len(got) == 0 || got[0] != 2 {
				t.Fatalf("next claim = %v, want 2 first", got)
			}
		})
	}
}

// Rows a claim gives back are ready again: the next claim reads from below
// them, whatever the frontier.
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

// A snapshot held elsewhere in the database keeps every row deleted since
// it began, with its index entries: 50,000 here, behind the claims. A claim
// that leases its partitions reads from its floor, above them, and so does
// its key check, in either form: what they read stays bounded. The same
// statements read from the table's start, as claims did before floors,
// pass over all of them.
func TestHeldSnapshotDoesNotChangeWhatAClaimReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := leasedStore(t, s, "a")
	holder, err := s.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	defer holder.Exec(ctx, "ROLLBACK") //nolint:errcheck // released either way

	const dead = 50_000
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || (g % 100), 'x' FROM generate_series(1, $1) g`, dead)
	for delivered := 0; delivered < dead; {
		c, err := st.Claim(ctx, store.ClaimParams{Limit: 5000, PayloadCap: 100})
		if err != nil {
			t.Fatal(err)
		}
		var out []store.Outcome
		for _, r := range c.Records {
			out = append(out, sent(r.ID))
		}
		complete(t, c, out...)
		if len(out) == 0 {
			t.Fatalf("a claim found nothing after %d of %d rows", delivered, dead)
		}
		delivered += len(out)
	}
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'x' FROM generate_series(1, 5) g`)
	// A claim of the relay's: the new rows.
	store.HeadClaimDue(st)
	c := claim(t, st, 100)
	if len(c.Records) != 5 || c.Records[0].ID != dead+1 {
		t.Fatalf("claimed %v, want the 5 new rows", ids(c.Records))
	}
	keys, claimed := "'{k1,k2,k3,k4,k5}'", fmt.Sprintf("'{%d,%d,%d,%d,%d}'", dead+1, dead+2, dead+3, dead+4, dead+5)
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}

	floor, lo, hi := store.NextClaimBounds(st)
	if floor < dead-5000 {
		t.Fatalf("the floor is %d, below the last claims' rows", floor)
	}
	explain := preparedPlans(t, s, "force_generic_plan")
	buffers := func(sql, args string) int {
		t.Helper()
		plan := explain("ANALYZE, BUFFERS", sql, args)
		m := regexp.MustCompile(`Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?`).FindStringSubmatch(plan)
		if m == nil {
			t.Fatalf("no buffer counts in:\n%s", plan)
		}
		hit, _ := strconv.Atoi(m[1])
		read, _ := strconv.Atoi(m[2])
		return hit + read
	}
	read := func(from, keyFloor int64) [3]int {
		return [3]int{
			buffers(store.ClaimSQL(st), fmt.Sprintf("100, 100, '{}', '{}', 9223372036854775807, %d, %d, %d, true, 75", from, lo, hi)),
			buffers(store.HoldingByKeySQL(st), fmt.Sprintf("%s, %s, %d", keys, claimed, keyFloor)),
			buffers(store.HoldingBySpanSQL(st), fmt.Sprintf("%s, %s, %d, %d, %d, %d", keys, claimed, keyFloor, dead+5, lo, hi)),
		}
	}
	fromFloor, fromStart := read(floor, floor), read(0, 0)
	for i, what := range []string{"claim", "key check by key", "key check by span"} {
		if fromFloor[i] > 100 {
			t.Errorf("the %s reads %d buffers from the floor with %d dead rows behind it, want a bounded few", what, fromFloor[i], dead)
		}
		// Their heap pages, a few hundred rows each, at least.
		if fromStart[i] < dead/100 || fromStart[i] < 10*fromFloor[i] {
			t.Errorf("the %s reads %d buffers from the table's start over %d dead rows: the test does not show what a held snapshot costs", what, fromStart[i], dead)
		}
	}
	t.Logf("buffers read (claim, key check by key, by span): from the floor %v, from the start %v", fromFloor, fromStart)
}

// A producer's transaction that commits a row below where claims have got
// to, its key held meanwhile as producers are asked to, has it delivered,
// before the key's later rows: the floor waits for it. In strict order, a
// producer that does not hold its key gets the same.
func TestLateCommitBelowTheFloorIsDelivered(t *testing.T) {
	t.Parallel()
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict %v", strict), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dbURL := pgtest.URL(t)
			if strict {
				// Strict order waits for every transaction of the cluster:
				// one of its own, so that the package's tests holding
				// snapshots for long cannot hold it past its deadline.
				dbURL = pgtest.NewServer(t).DSN("postgres")
			}
			s := pgtest.NewSchemaIn(t, dbURL)
			st, err := store.New(s.Pool, store.Config{Schema: s.Name, Claimer: "a", StrictOrder: strict})
			if err != nil {
				t.Fatal(err)
			}
			if err := st.SyncPartitions(ctx); err != nil {
				t.Fatal(err)
			}
			drain := func() []int64 {
				t.Helper()
				var order []int64
				for {
					c, err := st.Claim(ctx, store.ClaimParams{Limit: 3, PayloadCap: 100})
					if err != nil {
						t.Fatal(err)
					}
					var out []store.Outcome
					for _, r := range c.Records {
						out = append(out, sent(r.ID))
						order = append(order, r.ID)
					}
					complete(t, c, out...)
					if c.Claimed == 0 {
						return order
					}
				}
			}
			late, err := s.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer late.Rollback(ctx) //nolint:errcheck // a no-op after Commit
			var lateID int64
			if err := late.QueryRow(ctx, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'K', 'late') RETURNING id`).Scan(&lateID); err != nil {
				t.Fatal(err)
			}
			// Rows of other keys, committed after it, are delivered; in
			// strict order they wait for it.
			s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'x' FROM generate_series(1, 20) g`)
			first := drain()
			if strict != (len(first) == 0) {
				t.Fatalf("delivered %v while a transaction holding a smaller id was open", first)
			}
			if err := late.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'K', 'after')`)
			// Strict order also waits for the cluster's other
			// transactions: until the table is empty.
			var rest []int64
			testwait.State(t, testwait.DefaultTimeout, func() (bool, string) {
				rest = append(rest, drain()...)
				store.HeadClaimDue(st)
				var left int
				if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil {
					t.Fatal(err)
				}
				return left == 0, fmt.Sprintf("%d rows left after delivering %v", left, rest)
			})
			var k []int64
			for _, id := range rest {
				if id == lateID || id > lateID+20 {
					k = append(k, id)
				}
			}
			if fmt.Sprint(k) != fmt.Sprint([]int64{lateID, lateID + 21}) {
				t.Fatalf("key K delivered %v, want [%d %d]: the late row, then the one after it", k, lateID, lateID+21)
			}
		})
	}
}

// A row given its id by its producer, below ids already delivered, is
// below the floor, where claims do not read: the sweep finds it, and the
// next claim delivers it.
func TestSweepFindsARowGivenAnIdBelowTheFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := leasedStore(t, s, "a")
	s.Exec(t, `INSERT INTO outbox (topic, payload) SELECT 't', 'p' FROM generate_series(1, 10)`)
	c := claim(t, st, 10)
	var out []store.Outcome
	for _, r := range c.Records {
		out = append(out, sent(r.ID))
	}
	complete(t, c, out...)
	if found, err := st.SweepBelowFloor(ctx); err != nil || found {
		t.Fatalf("sweep with nothing below the floor: found %v, %v", found, err)
	}
	s.Exec(t, `INSERT INTO outbox (id, topic, payload) OVERRIDING SYSTEM VALUE VALUES (3, 't', 'p')`)
	store.HeadClaimDue(st)
	if got := ids(claim(t, st, 10).Records); len(got) != 0 {
		t.Fatalf("a claim from the floor found %v: row 3 is below it", got)
	}
	if found, err := st.SweepBelowFloor(ctx); err != nil || !found {
		t.Fatalf("sweep: found %v, %v; want row 3", found, err)
	}
	if got := ids(claim(t, st, 10).Records); fmt.Sprint(got) != "[3]" {
		t.Fatalf("claim after the sweep = %v, want [3]", got)
	}
}

// A partition taken outside the run of partitions a store's claims read
// (another process still held one between) is not read while its store's
// floor moves on, past its rows. When the run grows to take it in, the
// next claim reads it from the floor it was taken with.
func TestPartitionJoiningTheRunIsReadFromItsFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	// Another process, z, holds partition 3: b's range is 0 to 7, and its
	// claims read the longest run it holds, 4 to 7.
	s.Exec(t, `INSERT INTO outbox_claimers (claimer, expires_at) VALUES ('z', now() + interval '1 hour')`)
	s.Exec(t, `UPDATE outbox_claim_partitions SET owner = 'z', expires_at = now() + interval '1 hour' WHERE part = 3`)
	st := leasedStore(t, s, "b")
	if got := st.Share(); got.Lo != 4 || got.Hi != 7 {
		t.Fatalf("b's claims read partitions %d-%d, want 4-7", got.Lo, got.Hi)
	}

	stranded := claimPast(t, s, st, 1, 5)
	if floor, _, _ := store.NextClaimBounds(st); floor <= stranded {
		t.Fatalf("b's floor %d, want above row %d: its claims moved on", floor, stranded)
	}

	// z goes: b's range is every partition, and it holds them all.
	s.Exec(t, `DELETE FROM outbox_claimers WHERE claimer = 'z'`)
	s.Exec(t, `UPDATE outbox_claim_partitions SET owner = NULL, expires_at = NULL WHERE part = 3`)
	if err := st.SyncPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	if got := st.Share(); got.Lo != 0 || got.Hi != store.Partitions-1 {
		t.Fatalf("b's claims read partitions %d-%d, want all", got.Lo, got.Hi)
	}
	if got := ids(claim(t, st, 10).Records); fmt.Sprint(got) != fmt.Sprint([]int64{stranded}) {
		t.Fatalf("claim once partition 1 joined the run = %v, want [%d]; %s", got, stranded, store.FloorState(st))
	}
}

// claimPast writes a row into partition unread, which st's claims do not
// read, then rows into partition read, which they do, and has two claims
// from the head deliver those: st's floor moves past the first row. It
// returns that row's id.
func claimPast(t *testing.T, s *pgtest.Schema, st *store.Store, unread, read int) int64 {
	t.Helper()
	var stranded int64
	if err := s.Pool.QueryRow(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('t', $1, 'p') RETURNING id`,
		keyInPartition(t, s, unread)).Scan(&stranded); err != nil {
		t.Fatal(err)
	}
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', $1, 'p' FROM generate_series(1, 5)`, keyInPartition(t, s, read))
	for range 2 {
		store.HeadClaimDue(st)
		c := claim(t, st, 10)
		var out []store.Outcome
		for _, r := range c.Records {
			if r.ID == stranded {
				t.Fatalf("claims that do not read partition %d took its row %d", unread, r.ID)
			}
			out = append(out, sent(r.ID))
		}
		complete(t, c, out...)
	}
	return stranded
}

// keyInPartition is a key whose rows fall into partition part.
func keyInPartition(t *testing.T, s *pgtest.Schema, part int) string {
	t.Helper()
	var key string
	if err := s.Pool.QueryRow(context.Background(), `SELECT 'k' || g FROM generate_series(1, 1000) g
		WHERE outbox_partition('k' || g, 0) = $1 LIMIT 1`, part).Scan(&key); err != nil {
		t.Fatal(err)
	}
	return key
}

// A partition that leaves a store's range is held until no claim of it is
// in flight, and claims stop reading it at once. If the range takes it back
// before it is given up (the claimers changed again), claims read it from
// where they stopped, not from the store's floor, which moved on past rows
// committed to it meanwhile; also when the sync that takes it back fails.
func TestPartitionBackInRangeBeforeGivenUpIsReadFromWhereItLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := leasedStore(t, s, "a")
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) VALUES ('t', $1, 'p')`, keyInPartition(t, s, 0))
	inFlight := claim(t, st, 1)

	// b joins: a's range is 0 to 7; it holds 8 to 15 while the claim
	// that read them is in flight.
	s.Exec(t, `INSERT INTO outbox_claimers (claimer, expires_at) VALUES ('b', now() + interval '1 hour')`)
	if err := st.SyncPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	if got := st.Share(); got.Lo != 0 || got.Hi != 7 || got.Giving != 8 {
		t.Fatalf("a's share = %+v, want partitions 0-7 read and 8 still to give up", got)
	}
	complete(t, inFlight, sent(inFlight.Records[0].ID))

	stranded := claimPast(t, s, st, 9, 1)

	// b goes before a synced again: a's range is every partition once
	// more, and it still holds 8 to 15. The first sync after fails as it
	// writes them (a timeout, a failover): the next must still know
	// where claims stopped reading them.
	s.Exec(t, `DELETE FROM outbox_claimers WHERE claimer = 'b'`)
	s.Exec(t, `CREATE SEQUENCE sync_faults`)
	s.Exec(t, `CREATE FUNCTION fail_first_sync() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('sync_faults') = 1 THEN RAISE EXCEPTION 'the connection dropped'; END IF;
			RETURN NULL;
		END $$`)
	s.Exec(t, `CREATE TRIGGER fail_first_sync BEFORE INSERT OR UPDATE ON outbox_claim_partitions
		FOR EACH STATEMENT EXECUTE FUNCTION fail_first_sync()`)
	store.RecordAtNextSync(st)
	if err := st.SyncPartitions(ctx); err == nil {
		t.Fatal("the sync did not fail")
	}
	if err := st.SyncPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	if got := st.Share(); got.Lo != 0 || got.Hi != store.Partitions-1 {
		t.Fatalf("a's share = %+v, want every partition", got)
	}
	if got := ids(claim(t, st, 10).Records); fmt.Sprint(got) != fmt.Sprint([]int64{stranded}) {
		t.Fatalf("claim once partition 9 came back = %v, want [%d]; %s", got, stranded, store.FloorState(st))
	}
}

// A sync that gives partitions up (a claimer joined) has claims stop
// reading them before it writes them free: another process may take them
// the moment it commits, and a claim that began then and read them would
// hold rows of that process's keys.
func TestPartitionsGivenUpAreNotReadOnceFree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := leasedStore(t, s, "a")
	var theirs int64
	if err := s.Pool.QueryRow(ctx, `INSERT INTO outbox (topic, key, payload) VALUES ('t', $1, 'p') RETURNING id`, keyInPartition(t, s, 9)).Scan(&theirs); err != nil {
		t.Fatal(err)
	}
	s.Exec(t, `INSERT INTO outbox_claimers (claimer, expires_at) VALUES ('b', now() + interval '1 hour')`)
	var during []int64
	store.OnPartitionsWritten(st, func() {
		c := claim(t, st, 10)
		during = ids(c.Records)
		if err := c.Release(ctx); err != nil {
			t.Error(err)
		}
	})
	if err := st.SyncPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	store.OnPartitionsWritten(st, nil)
	if slices.Contains(during, theirs) {
		t.Fatalf("a claim that began once partition 9 was written free took its row %d", theirs)
	}
	var owner string
	if err := s.Pool.QueryRow(ctx, `SELECT coalesce(owner, '') FROM outbox_claim_partitions WHERE part = 9`).Scan(&owner); err != nil || owner != "" {
		t.Fatalf("partition 9 is held by %q (%v), want free", owner, err)
	}
}

// The same, concurrently, as the relay claims: three claimers of one store,
// each leaving out the keys the others hold, three producers committing
// and rolling back transactions of several rows all along, out of id
// order, and every outcome
// (sent, retried, left without an outcome, the whole claim given back).
// Every committed row is delivered, each key's first published in id
// order.
func TestFloorsUnderConcurrentClaims(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t).WithConns(t, 10)
	pool := s.Pool
	st := leasedStore(t, s, "a")

	var mu sync.Mutex
	keyOf := map[int64]string{}
	delivered, published := map[int64]bool{}, map[int64]bool{}
	var order []int64                     // first publications
	holding := map[int]map[string]int64{} // claimer → keys in flight → their lowest id
	// The load runs until this many rows were delivered. Producers wait
	// while the backlog is above backlogCap, so that what is left at the
	// end takes as long to drain on a loaded machine as on a quiet one.
	const enough, backlogCap = 8000, 3000
	stop := make(chan struct{})
	var stopping sync.Once
	var wg sync.WaitGroup
	progress := sync.NewCond(&mu) // a claim delivered rows, or the load stopped
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}

	// Producers, each with keys of its own, as producers that hold their
	// keys are: their transactions commit out of id order.
	producer := func(p int) {
		rnd := rand.New(rand.NewPCG(uint64(p), 1))
		for i := 0; ; i++ {
			mu.Lock()
			for len(keyOf)-len(delivered) > backlogCap && !stopped() {
				progress.Wait()
			}
			mu.Unlock()
			if stopped() {
				return
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			rows, err := tx.Query(ctx, `INSERT INTO outbox (topic, key, payload)
				SELECT 't', $2 || (random() * 7)::int, 'x' FROM generate_series(1, $1) RETURNING id, key`, 1+rnd.IntN(10), fmt.Sprintf("p%d-", p))
			if err != nil {
				t.Error(err)
				return
			}
			ids := map[int64]string{}
			for rows.Next() {
				var id int64
				var key string
				if err := rows.Scan(&id, &key); err != nil {
					t.Error(err)
				}
				ids[id] = key
			}
			rows.Close()
			if i%7 == 3 {
				_ = tx.Rollback(ctx)
				continue
			}
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for id, k := range ids {
				keyOf[id] = k
			}
			mu.Unlock()
		}
	}
	for p := range 3 {
		wg.Go(func() { producer(p) })
	}
	claimer := func(n int) {
		rnd := rand.New(rand.NewPCG(uint64(n), 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			var exclude []string
			var excludedFrom int64
			for other, keys := range holding {
				if other != n {
					for k, id := range keys {
						exclude = append(exclude, k)
						if excludedFrom == 0 || id < excludedFrom {
							excludedFrom = id
						}
					}
				}
			}
			mu.Unlock()
			c, err := st.Claim(ctx, store.ClaimParams{Limit: 1 + rnd.IntN(30), PayloadCap: 100,
				ExcludeKeys: exclude, ExcludedFrom: excludedFrom})
			if err != nil {
				t.Error(err)
				return
			}
			// Published, the first time, as soon as claimed: another
			// claim can take a key's next row only once this one's
			// outcome is written.
			mu.Lock()
			holding[n] = map[string]int64{}
			for _, r := range c.Records {
				if id, ok := holding[n][r.Key]; !ok || r.ID < id {
					holding[n][r.Key] = r.ID
				}
				if !published[r.ID] {
					published[r.ID] = true
					order = append(order, r.ID)
				}
			}
			mu.Unlock()
			if rnd.IntN(15) == 0 {
				if err := c.Release(ctx); err != nil {
					t.Error(err)
				}
			} else {
				var out []store.Outcome
				failed := map[string]bool{}
				for _, r := range c.Records {
					switch n := rnd.IntN(20); {
					case failed[r.Key]:
					case n == 0:
						out = append(out, store.Outcome{ID: r.ID, Kind: store.Retried, Error: "503", Attempted: true, Delay: time.Millisecond})
						failed[r.Key] = true
					case n == 1:
						failed[r.Key] = true // left without an outcome
					default:
						out = append(out, sent(r.ID))
					}
				}
				if err := c.Complete(ctx, out); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, o := range out {
					if o.Kind == store.Sent {
						delivered[o.ID] = true
					}
				}
				if len(delivered) >= enough {
					stopping.Do(func() { close(stop) })
				}
				progress.Broadcast()
				mu.Unlock()
			}
			mu.Lock()
			delete(holding, n)
			mu.Unlock()
		}
	}
	for n := range 3 {
		wg.Go(func() { claimer(n) })
	}
	wg.Go(func() { // the relay's sync
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if err := st.SyncPartitions(ctx); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()

	var missing []int64
	atStop := len(delivered)
	drained, saw := testwait.Poll(testwait.DefaultTimeout, func() (bool, string) {
		c, err := st.Claim(ctx, store.ClaimParams{Limit: 100, PayloadCap: 100})
		if err != nil {
			t.Fatal(err)
		}
		var out []store.Outcome
		for _, r := range c.Records {
			out = append(out, sent(r.ID))
			delivered[r.ID] = true
			if !published[r.ID] {
				published[r.ID] = true
				order = append(order, r.ID)
			}
		}
		complete(t, c, out...)
		missing = missing[:0]
		for id := range keyOf {
			if !delivered[id] {
				missing = append(missing, id)
			}
		}
		slices.Sort(missing)
		return len(missing) == 0, fmt.Sprintf("%d of %d committed rows never delivered (%d delivered once the load stopped): %v",
			len(missing), len(keyOf), len(delivered)-atStop, missing)
	})
	if !drained {
		// What holds them: their state in the table, the store's share,
		// and whether a sweep from the table's start finds them.
		var states string
		if err := pool.QueryRow(ctx, `SELECT string_agg(format('%s %s, waited %s, parked %s: %s', status,
    CASE WHEN next_attempt_at > now() THEN 'later' ELSE 'ready' END, next_attempt_at <> created_at, parked_behind IS NOT NULL, n), '; ')
FROM (SELECT status, next_attempt_at > now() AS later, next_attempt_at, created_at, parked_behind, count(*) OVER (PARTITION BY status,
    next_attempt_at > now(), next_attempt_at <> created_at, parked_behind IS NOT NULL) AS n,
    row_number() OVER (PARTITION BY status, next_attempt_at > now(), next_attempt_at <> created_at, parked_behind IS NOT NULL) AS r
    FROM outbox WHERE id = ANY($1)) AS x WHERE r = 1`, missing).Scan(&states); err != nil {
			states = err.Error()
		}
		found, err := st.SweepBelowFloor(ctx)
		t.Fatalf("%s\nthose rows: %s; the store's share %+v; a sweep below the floor found rows: %v (%v)", saw, states, st.Share(), found, err)
	}
	last := map[string]int64{}
	for _, id := range order {
		k, committed := keyOf[id]
		if !committed {
			t.Errorf("row %d published, but never committed", id)
		}
		if id < last[k] {
			t.Errorf("key %s: row %d first published after row %d", k, id, last[k])
		}
		last[k] = max(last[k], id)
	}
	t.Logf("%d rows delivered", len(delivered))
}

// The backlog is measured from the lowest floor the claiming processes
// recorded, and the rows that wait below it: every pending row counts, the
// deleted rows' entries below the floor are not read.
func TestBacklogCountsEveryPendingRowFromTheFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := leasedStore(t, s, "a")
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT CASE WHEN g <= 5 THEN 'a' ELSE 'b' END, 'k' || g, 'x' FROM generate_series(1, 10) g`)
	c := claim(t, st, 10)
	// 1 and 6 wait for a retry below the floor; the rest are delivered.
	out := []store.Outcome{
		{ID: 1, Kind: store.Retried, Error: "503", Attempted: true, Delay: time.Hour},
		{ID: 6, Kind: store.Retried, Error: "503", Attempted: true, Delay: time.Hour},
	}
	for _, id := range []int64{2, 3, 4, 5, 7, 8, 9, 10} {
		out = append(out, sent(id))
	}
	complete(t, c, out...)
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 'b', 'k' || g, 'x' FROM generate_series(1, 3) g`)
	// The floor the process records when its record is due.
	store.RecordAtNextSync(st)
	if err := st.SyncPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	var floor int64
	if err := s.Pool.QueryRow(ctx, `SELECT min(floor) FROM outbox_claim_partitions`).Scan(&floor); err != nil || floor < 6 {
		t.Fatalf("the recorded floor is %d (%v): the retried rows are not below it", floor, err)
	}
	backlog, err := st.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, b := range backlog {
		got[b.Topic] = b.Pending
	}
	if got["a"] != 1 || got["b"] != 4 || len(got) != 2 {
		t.Fatalf("backlog %+v, want a: 1 (waiting below the floor), b: 4 (1 waiting, 3 above the floor)", backlog)
	}
}

// A claim reads what its floor needs in its own transaction, its first
// included: it never waits for a second connection while it holds one,
// or claims that filled the pool would wait on each other until their
// timeout.
func TestClaimNeedsOneConnection(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t).WithConns(t, 1)
	for _, strict := range []bool{false, true} {
		st, err := store.New(s.Pool, store.Config{Schema: s.Name, Claimer: fmt.Sprint("c", strict), StrictOrder: strict})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SyncPartitions(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := st.Claim(ctx, store.ClaimParams{Limit: 10, PayloadCap: 100})
		cancel()
		if err != nil {
			t.Fatalf("strict order %v: claim on a pool of one connection: %v", strict, err)
		}
		complete(t, c)
	}
}
