package store_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// A sync writes a partition only when its owner changes, when its floor
// must go down, or when its record is due; the process's registration
// only once less than a share of its lease is left. Each write leaves a
// row version that a snapshot held elsewhere keeps, and every sync reads
// them: syncs that wrote every time would cost more by the minute.
func TestSyncsWriteOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := leasedStore(t, s, "a")
	versions := func() (parts map[int]string, claimer string) {
		t.Helper()
		parts = map[int]string{}
		rows, _ := s.Pool.Query(ctx, `SELECT part, xmin::text FROM outbox_claim_partitions`)
		var part int
		var xmin string
		if _, err := pgx.ForEachRow(rows, []any{&part, &xmin}, func() error {
			parts[part] = xmin
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.Pool.QueryRow(ctx, `SELECT xmin::text FROM outbox_claimers WHERE claimer = 'a'`).Scan(&claimer); err != nil {
			t.Fatal(err)
		}
		return parts, claimer
	}
	sync := func() {
		t.Helper()
		if err := st.SyncPartitions(ctx); err != nil {
			t.Fatal(err)
		}
	}
	recordedFloor := func() (floor int64) {
		t.Helper()
		if err := s.Pool.QueryRow(ctx, `SELECT min(floor) FROM outbox_claim_partitions`).Scan(&floor); err != nil {
			t.Fatal(err)
		}
		return floor
	}

	// The floor moves on; syncs with nothing else changed write nothing.
	s.Exec(t, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'x' FROM generate_series(1, 10) g`)
	c := claim(t, st, 10)
	var out []store.Outcome
	for _, r := range c.Records {
		out = append(out, sent(r.ID))
	}
	complete(t, c, out...)
	parts, claimer := versions()
	before := recordedFloor()
	for range 5 {
		sync()
	}
	if p, c := versions(); c != claimer || len(p) != store.Partitions || !maps.Equal(p, parts) {
		t.Fatalf("syncs with nothing changed wrote rows: partitions %v then %v, registration %s then %s", parts, p, claimer, c)
	}

	// Its record due, every partition is written, with the floor, and a
	// lease that relays reading it from the partitions respect.
	store.RecordAtNextSync(st)
	sync()
	if got := recordedFloor(); got <= before || got < 10 {
		t.Fatalf("the recorded floor is %d after the record, %d before: want past the 10 rows delivered", got, before)
	}
	var short int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_claim_partitions
		WHERE expires_at IS NULL OR expires_at < now() + interval '1 minute'`).Scan(&short); err != nil || short != 0 {
		t.Fatalf("%d partitions recorded with less than the lease (%v)", short, err)
	}

	// Another process joins: only the partitions given up are written.
	parts, _ = versions()
	s.Exec(t, `INSERT INTO outbox_claimers (claimer, expires_at) VALUES ('b', now() + interval '1 hour')`)
	sync()
	p, _ := versions()
	for part := range store.Partitions {
		if changed := p[part] != parts[part]; changed != (part >= 8) {
			t.Errorf("partition %d written: %v, want only those given up (8-15)", part, changed)
		}
	}

	// The registration is renewed once less than a share of the lease is
	// left.
	s.Exec(t, `UPDATE outbox_claimers SET expires_at = now() + interval '30 seconds' WHERE claimer = 'a'`)
	_, claimer = versions()
	sync()
	var left time.Duration
	if err := s.Pool.QueryRow(ctx, `SELECT expires_at - now() FROM outbox_claimers WHERE claimer = 'a'`).Scan(&left); err != nil || left < 50*time.Second {
		t.Fatalf("the registration lasts %s (%v) after a sync with 30s of a minute left, want it renewed", left, err)
	}
	if _, c := versions(); c == claimer {
		t.Fatal("the registration was not written again")
	}
	if got := st.Share(); got.Lo != 0 || got.Hi != 7 {
		t.Fatalf("a's claims read partitions %d-%d after the renewal, want 0-7", got.Lo, got.Hi)
	}
}

// A partition is free once its owner's registration ends, whatever lease
// the partition itself records.
func TestPartitionOfAnOwnerGoneIsTaken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	st := leasedStore(t, s, "a")
	s.Exec(t, `UPDATE outbox_claim_partitions SET owner = 'z', expires_at = now() + interval '1 hour' WHERE part = 3`)
	if err := st.SyncPartitions(ctx); err != nil {
		t.Fatal(err)
	}
	var owner string
	if err := s.Pool.QueryRow(ctx, `SELECT owner FROM outbox_claim_partitions WHERE part = 3`).Scan(&owner); err != nil || owner != "a" {
		t.Fatalf("partition 3 of a process without a registration is owned by %q (%v), want a", owner, err)
	}
}

// Processes that sync at once decide one after the other, and each sees
// what the one before it committed: a process that waited for the
// partitions' lock must not find the partitions just taken free, nor
// their new owner unregistered, or both would claim them.
func TestSyncsAtOnceNeverShareAPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	stores := map[string]*store.Store{}
	for _, name := range []string{"a", "b"} {
		st, err := store.New(s.Pool, store.Config{Schema: s.Name, Claimer: name, ClaimLease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		stores[name] = st
	}
	// The partitions are locked while both first syncs begin, as by a
	// third process's sync.
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `SELECT FROM outbox_claim_partitions ORDER BY part FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	waiting := func(n int) func() bool {
		return func() bool {
			var w int
			if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, s.Name).Scan(&w); err != nil {
				t.Fatal(err)
			}
			return w >= n
		}
	}
	errs := make(chan error, 2)
	go func() { errs <- stores["a"].SyncPartitions(ctx) }()
	testwait.Within(t, 10*time.Second, "a's sync to wait for the lock", waiting(1))
	go func() { errs <- stores["b"].SyncPartitions(ctx) }()
	testwait.Within(t, 10*time.Second, "b's sync to wait for the lock", waiting(2))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	a, b := stores["a"].Share(), stores["b"].Share()
	if a.Lo <= a.Hi && b.Lo <= b.Hi && a.Lo <= b.Hi && b.Lo <= a.Hi {
		t.Fatalf("a claims partitions %d-%d and b %d-%d at once", a.Lo, a.Hi, b.Lo, b.Hi)
	}
	// Once the claimers see each other, they split the partitions.
	for range 2 {
		for _, name := range []string{"a", "b", "a"} {
			if err := stores[name].SyncPartitions(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if a, b = stores["a"].Share(), stores["b"].Share(); a.Lo != 0 || a.Hi != 7 || b.Lo != 8 || b.Hi != 15 {
		t.Fatalf("after more syncs a claims partitions %d-%d and b %d-%d, want 0-7 and 8-15", a.Lo, a.Hi, b.Lo, b.Hi)
	}
}
