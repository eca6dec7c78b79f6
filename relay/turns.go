package relay

import (
	"context"
	"sync"
)

// turns is the relay's worker budget, shared by its outboxes: a worker
// takes a turn to plan and publish a claimed batch, and gives it back
// before the batch's write-back. Its outbox's own database is not
// involved while a turn is held (claims and write-backs run outside
// turns), so an outbox whose database is down or slow holds no turns from
// the others. When outboxes wait for turns, the next free one goes to the
// waiting outbox that holds the fewest, the tie broken round-robin: an
// outbox with a huge backlog takes every turn while the others are idle,
// and only its share while they are not.
type turns struct {
	mu      sync.Mutex
	free    int
	held    []int             // by outbox
	waiting [][]chan struct{} // by outbox, first come first served
	last    int               // the outbox granted last, for round-robin
}

func newTurns(n, outboxes int) *turns {
	return &turns{free: n, held: make([]int, outboxes), waiting: make([][]chan struct{}, outboxes), last: outboxes - 1}
}

// acquire takes a turn for outbox o, waiting while there is none; it
// fails only when ctx ends first.
func (t *turns) acquire(ctx context.Context, o int) error {
	t.mu.Lock()
	if t.free > 0 {
		t.free--
		t.held[o]++
		t.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	t.waiting[o] = append(t.waiting[o], ch)
	t.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	for i, c := range t.waiting[o] {
		if c == ch {
			t.waiting[o] = append(t.waiting[o][:i], t.waiting[o][i+1:]...)
			t.mu.Unlock()
			return ctx.Err()
		}
	}
	t.mu.Unlock()
	// Granted meanwhile: pass it on.
	t.release(o)
	return ctx.Err()
}

// release gives back a turn of outbox o.
func (t *turns) release(o int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.held[o]--
	n := len(t.held)
	next := -1
	for i := range n {
		j := (t.last + 1 + i) % n
		if len(t.waiting[j]) > 0 && (next < 0 || t.held[j] < t.held[next]) {
			next = j
		}
	}
	if next < 0 {
		t.free++
		return
	}
	ch := t.waiting[next][0]
	t.waiting[next] = t.waiting[next][1:]
	t.held[next]++
	t.last = next
	close(ch)
}
