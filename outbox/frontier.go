package outbox

import (
	"sync"
	"time"
)

// HeadEvery is how often, while a backlog lasts, a claim scans from the
// lowest pending id rather than from the frontier (see frontier): the
// longest a ready row below the frontier waits for a claim.
const HeadEvery = time.Second

// frontier is where a store's next claim starts while a backlog lasts.
//
// A claim reads the pending index in id order from its lowest entry. The
// head of that index is the rows this process has in flight (locked, to
// be passed over one heap visit each) and the rows just delivered, whose
// entries the index cannot drop while any claim's transaction older than
// their delete is open, which claims always are while a backlog drains.
// Passing over them, some two batches' worth, more than doubled a claim's
// time per row.
//
// So a claim that came back full moves the frontier to its last row, or
// to just below the first row it held back for its key (still ready once
// the claim ends), and the next claim starts above it. Everything below
// was claimed, or was locked or not ready when a claim passed it. Such
// rows can become ready again (a failed row's retry falls due, a crashed
// replica's locks go): once every HeadEvery, one claim starts from the
// head again, and a claim that finds the frontier's side short of its
// limit claims the rest from the head at once. A claim that comes back
// short, or rolls back, ends the backlog mode: the next starts from the
// head.
//
// The frontier only chooses which rows a claim looks at. The key check
// still sees every pending row, so per-key order holds as before: a ready
// row below the frontier holds back its key's later rows until a claim
// from the head takes it.
type frontier struct {
	mu   sync.Mutex
	at   int64     // 0: claim from the head
	head time.Time // when a claim last started from the head
}

// start returns the id above which the next claim looks first: 0 (from
// the head) outside a backlog, or when the last claim from the head was
// HeadEvery ago.
func (f *frontier) start(now time.Time) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at == 0 || now.Sub(f.head) >= HeadEvery {
		f.head = now
		return 0
	}
	return f.at
}

// advance records a full claim: the next may start above next.
func (f *frontier) advance(next int64) {
	f.mu.Lock()
	f.at = max(f.at, next)
	f.mu.Unlock()
}

// reset has the next claim start from the head.
func (f *frontier) reset() {
	f.mu.Lock()
	f.at = 0
	f.mu.Unlock()
}
