package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// The relay, its store leasing the outbox's partitions and reading from
// its floor, delivers every row that eight producers commit, in
// transactions that begin and commit in every order, while a snapshot is
// held: rows committed below where claims have got to, and rows whose
// transaction began after a claim's, included. Each producer writes keys
// of its own, so each key's rows are first published in id order.
func TestFloorsDeliverEveryRowOfConcurrentProducers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t).WithConns(t, 16)
	pool := s.Pool
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	for _, q := range []string{"BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT 1"} {
		if _, err := held.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	defer held.Exec(ctx, "ROLLBACK") //nolint:errcheck // released either way

	st, err := store.New(pool, store.Config{Schema: s.Name, Claimer: "relay"})
	if err != nil {
		t.Fatal(err)
	}
	listener, err := store.NewListener(pool, store.ListenerConfig{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	pub := &fakePublisher{}
	rel, err := relay.New(relay.Config{Store: st, Publisher: pub, Listener: listener, Workers: 2, BatchSize: 200})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rel.Run(runCtx) }()
	defer func() { stop(); <-done }()

	const producers, perProducer = 8, 2500
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(p), 11))
			for n := 0; n < perProducer; {
				rows := 1 + rnd.IntN(7)
				if _, err := pool.Exec(ctx, `INSERT INTO outbox (topic, key, payload)
					SELECT 't', $2 || (random() * 50)::int, 'x' FROM generate_series(1, $1)`, rows, fmt.Sprintf("p%d-", p)); err != nil {
					t.Error(err)
					return
				}
				n += rows
			}
		})
	}
	wg.Wait()
	testwait.State(t, testwait.DefaultTimeout, func() (bool, string) {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0, fmt.Sprintf("%d rows never delivered", left)
	})
	pub.mu.Lock()
	defer pub.mu.Unlock()
	last := map[string]int64{}
	n := 0
	for _, call := range pub.calls {
		for _, r := range call {
			n++
			if r.ID < last[r.Key] {
				t.Errorf("key %s: row %d first published after row %d", r.Key, r.ID, last[r.Key])
			}
			last[r.Key] = max(last[r.Key], r.ID)
		}
	}
	if n < producers*perProducer {
		t.Errorf("%d rows published, want %d at least", n, producers*perProducer)
	}
	t.Logf("%d rows published", n)
}
