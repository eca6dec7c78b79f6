package relay

import (
	"context"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

// A free turn goes to the waiting outbox holding the fewest; a waiter
// that gives up leaves the count as it was, even when it was granted a
// turn as it gave up.
func TestTurns(t *testing.T) {
	ctx := context.Background()
	tr := newTurns(3, 2)
	for range 3 {
		if err := tr.acquire(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	granted := make(chan int, 4)
	wait := func(o int) {
		go func() {
			if err := tr.acquire(ctx, o); err == nil {
				granted <- o
			}
		}()
	}
	wait(0)
	waitFor(t, tr, 0, 1)
	wait(1)
	waitFor(t, tr, 1, 1)
	tr.release(0) // outbox 0 holds 2 and outbox 1 none: 1 goes first
	if o := <-granted; o != 1 {
		t.Fatalf("the turn went to outbox %d, want 1", o)
	}
	tr.release(0)
	if o := <-granted; o != 0 {
		t.Fatalf("the turn went to outbox %d, want 0", o)
	}

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := tr.acquire(canceled, 1); err == nil {
		t.Fatal("acquire with an ended context and no free turn succeeded")
	}
	tr.mu.Lock()
	held, free, queued := tr.held, tr.free, len(tr.waiting[1])
	tr.mu.Unlock()
	if held[0] != 2 || held[1] != 1 || free != 0 || queued != 0 {
		t.Fatalf("held %v, free %d, queued %d; want [2 1], 0, 0", held, free, queued)
	}
	tr.release(0)
	tr.release(0)
	tr.release(1)
	if tr.free != 3 {
		t.Fatalf("free = %d after every release, want 3", tr.free)
	}
}

// waitFor waits until outbox o has n waiters: goroutines of this test,
// which announce nothing before they block.
func waitFor(t *testing.T, tr *turns, o, n int) {
	t.Helper()
	testwait.For(t, "a waiter", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return len(tr.waiting[o]) == n
	})
}
