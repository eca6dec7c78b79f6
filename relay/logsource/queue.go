package logsource

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/relay/store"
)

// state is where a message read from the log is.
type state uint8

const (
	ready   state = iota // waiting for a batch
	taken                // in a batch, or being written into the table
	settled              // delivered, or written into the table
)

// message is one message read from the log.
type message struct {
	store.Message
	txn   *txn
	seq   uint64 // its place in commit order
	state state
}

// txn is a transaction read from the log: its position is confirmed once
// its messages and every earlier one are settled.
type txn struct {
	end  pglogrepl.LSN // the end of its commit record
	left int           // messages not yet settled
}

// queue holds the messages read from the log until they are settled, in
// commit order, and the position up to which everything is: what the
// slot may be told. A stream fills it; batches take from it.
type queue struct {
	mu        sync.Mutex
	msgs      []*message // from the oldest unsettled, in commit order
	txns      []*txn     // from the oldest with a message unsettled
	confirmed pglogrepl.LSN
	// idle is the server's position from a keepalive when every
	// transaction read before it was settled: it may be confirmed too.
	idle    pglogrepl.LSN
	unset   int           // messages not settled
	out     int           // messages taken and not yet given back or settled
	drained sync.Cond     // out fell to 0
	room    chan struct{} // messages settled: the stream may read more
	moved   chan struct{} // the confirmed position moved
	gen     uint64        // the stream the messages came from
	seq     uint64        // the last message's place
	open    bool          // a stream fills it: batches may take
	// told is the position last sent to the server, and tellings is
	// closed (and replaced) when it moves.
	told     pglogrepl.LSN
	tellings chan struct{}
}

func newQueue() *queue {
	q := &queue{room: make(chan struct{}, 1), moved: make(chan struct{}, 1), tellings: make(chan struct{})}
	q.drained.L = &q.mu
	return q
}

// start begins a stream from start, once no batch holds a message of an
// earlier one: a key's message read again is never delivered beside its
// first read.
func (q *queue) start(start pglogrepl.LSN) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.out > 0 {
		q.drained.Wait()
	}
	q.confirmed, q.open, q.told = start, true, start
}

// tell notes that the server was sent the position at.
func (q *queue) tell(at pglogrepl.LSN) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if at > q.told {
		q.told = at
		close(q.tellings)
		q.tellings = make(chan struct{})
	}
}

// waitTold waits, at most for d, until the server has been sent the
// position confirmed now, while a stream runs.
func (q *queue) waitTold(ctx context.Context, d time.Duration) {
	var timeout <-chan time.Time
	q.mu.Lock()
	target := q.confirmed
	for q.open && q.told < target {
		ch := q.tellings
		q.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch:
		case <-timeout:
			return
		case <-ctx.Done():
			return
		}
		q.mu.Lock()
	}
	q.mu.Unlock()
}

// stop ends a stream: its messages are dropped (they will be read again),
// and batches take none until the next starts; those in flight settle
// without moving the position.
func (q *queue) stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.gen++
	q.msgs, q.txns, q.unset, q.idle, q.open = nil, nil, 0, 0, false
}

// push adds a committed transaction's messages (none for one that carried
// none of this outbox's).
func (q *queue) push(end pglogrepl.LSN, msgs []*message) {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := &txn{end: end, left: len(msgs)}
	for _, m := range msgs {
		q.seq++
		m.txn, m.seq = t, q.seq
	}
	q.msgs = append(q.msgs, msgs...)
	q.txns = append(q.txns, t)
	q.unset += len(msgs)
	q.idle = 0
	q.advance()
}

// keepalive notes the server's position when it says it has sent
// everything before it.
func (q *queue) keepalive(at pglogrepl.LSN) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.txns) == 0 && at > q.confirmed {
		q.confirmed = at
		signal(q.moved)
		return
	}
	q.idle = at
}

// backlog is the number of messages read and not yet settled.
func (q *queue) backlog() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.unset
}

// unsettled reports whether messages read are not yet settled: in
// batches, or ready for one.
func (q *queue) unsettled() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.unset > 0
}

// position is what may be confirmed.
func (q *queue) position() pglogrepl.LSN {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.confirmed
}

// settle marks msgs of stream gen settled (or given back, ready again),
// and moves the confirmed position.
func (q *queue) settle(gen uint64, msgs []*message, done bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.out -= len(msgs)
	if q.out == 0 {
		q.drained.Broadcast()
	}
	if gen != q.gen {
		return // the stream started again: they will be read again
	}
	for _, m := range msgs {
		if !done {
			m.state = ready
			continue
		}
		m.state = settled
		m.txn.left--
		q.unset--
	}
	if done {
		q.advance()
		signal(q.room)
	}
}

// advance drops the settled transactions at the front, and their
// messages, moving the confirmed position past them.
func (q *queue) advance() {
	n := 0
	for n < len(q.txns) && q.txns[n].left == 0 {
		q.confirmed = max(q.confirmed, q.txns[n].end)
		n++
	}
	if n == 0 {
		return
	}
	q.txns = slices.Delete(q.txns, 0, n)
	m := 0
	for m < len(q.msgs) && q.msgs[m].state == settled {
		m++
	}
	q.msgs = slices.Delete(q.msgs, 0, m)
	if len(q.txns) == 0 && q.idle > q.confirmed {
		q.confirmed = q.idle
	}
	q.idle = 0
	signal(q.moved)
}

// pick is what take chose.
type pick struct {
	gen     uint64
	batch   []*message // to deliver
	table   []*message // to write into the table, behind their keys' rows
	waiting []*message // of a topic whose destination takes none: into the table, waiting
	skipped []string   // keys held by messages in another batch
	more    bool       // ready messages are left
}

// take picks, in commit order, at most limit messages to deliver whose
// keys no earlier unsettled message holds and are not excluded, and the
// messages that go into the table instead: those of excluded topics, and
// after one of them, its key's later messages.
func (q *queue) take(limit int, excludeKeys, excludeTopics []string) pick {
	q.mu.Lock()
	defer q.mu.Unlock()
	p := pick{gen: q.gen}
	if !q.open {
		return p
	}
	held := map[string]bool{}
	for _, k := range excludeKeys {
		held[k] = true
	}
	toTable := map[string]bool{}
	skipped := map[string]bool{}
	for _, m := range q.msgs {
		r := &m.Record
		if m.state == settled {
			continue
		}
		if m.state == taken {
			if r.HasKey {
				held[r.Key] = true
				skipped[r.Key] = true
			}
			continue
		}
		if len(p.batch) >= limit || len(p.table)+len(p.waiting) >= limit {
			p.more = true
			break
		}
		switch {
		case r.HasKey && held[r.Key]:
			if !toTable[r.Key] {
				continue // behind the key's message in flight
			}
			p.table = append(p.table, m)
		case slices.Contains(excludeTopics, r.Topic):
			p.waiting = append(p.waiting, m)
			if r.HasKey {
				held[r.Key], toTable[r.Key] = true, true
			}
		default:
			p.batch = append(p.batch, m)
			if r.HasKey {
				held[r.Key] = true
			}
			continue
		}
	}
	for _, l := range [][]*message{p.batch, p.table, p.waiting} {
		for _, m := range l {
			m.state = taken
		}
		q.out += len(l)
	}
	for k := range skipped {
		p.skipped = append(p.skipped, k)
	}
	return p
}

// signal wakes whoever waits on c, if no one has yet.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
