package store

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// HeldRow is a row that a destination, topic or partition held while it
// was down, without counting an attempt: its id and retry count then.
type HeldRow struct {
	ID         int64
	RetryCount int
}

// Releasing held rows while claims are under way.
//
// A row is held as its claim plans it, before that claim is written back,
// and a claim under way may have read a held row as waiting and deferred
// its key's later rows to the row's moment. A release that made the rows
// ready behind those claims' backs would see them deferred again by the
// write-backs. It does not wait for the claims, though: a claim lasts as
// long as its slowest publish, and one with a probe to a server still
// starting would hold back every destination's release. The release
// records what it made ready instead, and each claim written back after
// sees to its own rows: a held row it would defer, or a row it deferred
// behind a released one, to exactly that row's moment, is written ready.
// A claim written back before the release recorded them was committed
// before the release's statements ran, which then find its rows.

// releases is what releases of held rows made ready, for the claims
// under way to see at their write-back.
//
// A write-back looks at the log, writes and commits; a release that
// records what it releases waits for the write-backs that looked before
// it did to commit: every write-back has then either committed before the
// release's statement runs, or sees what it released. Write-backs never
// wait for a release.
type releases struct {
	waiting func() // tests: runs as a record waits for write-backs under way
	mu      sync.Mutex
	changed sync.Cond // a write-back committed
	log     []*released
	seq     uint64         // counts the records
	looking map[uint64]int // write-backs under way, by the seq they looked at
}

// released is what one release made ready, or was about to.
type released struct {
	// gen is the latest claim begun when it was recorded: only claims
	// begun up to then may have read the rows as held.
	gen   uint64
	ids   map[int64]bool       // the held rows
	keyed []outboxdb.LeasedKey // the keys they hold, to their moment
}

// record adds r to the log, and returns once every write-back that looked
// at the log before has committed; it forgets what no claim under way can
// still need. An open record counts for every claim, whenever it began,
// until it is sealed: for a release whose statement is still to run.
func (rs *releases) record(f *floors, r *released, open bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	oldest, live := f.oldestLive()
	r.gen = f.lastGen()
	if open {
		r.gen = math.MaxUint64
	}
	var kept []*released
	for _, e := range rs.log {
		if live && e.gen >= oldest {
			kept = append(kept, e)
		}
	}
	rs.log = append(kept, r)
	rs.seq++
	if rs.changed.L == nil {
		rs.changed.L = &rs.mu
	}
	for rs.lookedBefore(rs.seq) {
		if rs.waiting != nil {
			rs.waiting()
		}
		rs.changed.Wait()
	}
}

// lookedBefore reports whether a write-back that looked at the log before
// record seq is still under way.
func (rs *releases) lookedBefore(seq uint64) bool {
	for s, n := range rs.looking {
		if s < seq && n > 0 {
			return true
		}
	}
	return false
}

// seal has an open record count for the claims begun up to now only: its
// release's statement has ended, and claims begun since see what it did.
func (rs *releases) seal(f *floors, r *released) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r.gen = f.lastGen()
}

// look is a write-back's look at the log, for a claim begun at generation
// gen that deferred rows: see readyAtWriteBack. The write-back calls done
// once committed, or failed.
func (rs *releases) look(gen uint64, deferred []deferral) (released func(id int64) bool, behind []int64, done func()) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.looking == nil {
		rs.looking = map[uint64]int{}
	}
	seq := rs.seq
	rs.looking[seq]++
	released, behind = rs.readyAtWriteBack(gen, deferred)
	return released, behind, sync.OnceFunc(func() {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		if rs.looking[seq]--; rs.looking[seq] == 0 {
			delete(rs.looking, seq)
		}
		if rs.changed.L != nil {
			rs.changed.Broadcast()
		}
	})
}

// readyAtWriteBack returns, for a claim begun at generation gen, the held
// readyAtWriteBack returns, for a claim begun at generation gen, the held
// rows released since that it must not defer again, and which of the
// rows it deferred behind a released row, to exactly its moment, are
// ready. The caller holds mu.
func (rs *releases) readyAtWriteBack(gen uint64, deferred []deferral) (released func(id int64) bool, behind []int64) {
	var sets []map[int64]bool
	type moment struct {
		key   string
		until int64
	}
	var first map[moment]int64 // the lowest released row of each key and moment
	for _, e := range rs.log {
		if e.gen < gen {
			continue
		}
		if len(e.ids) > 0 {
			sets = append(sets, e.ids)
		}
		for _, k := range e.keyed {
			if first == nil {
				first = map[moment]int64{}
			}
			m := moment{k.Key, k.Until.UnixMicro()}
			if id, ok := first[m]; !ok || k.FirstID < id {
				first[m] = k.FirstID
			}
		}
	}
	for _, d := range deferred {
		if id, ok := first[moment{d.key, d.until.UnixMicro()}]; ok && d.id > id {
			behind = append(behind, d.id)
		}
	}
	return func(id int64) bool {
		for _, ids := range sets {
			if ids[id] {
				return true
			}
		}
		return false
	}, behind
}

// deferral is a row a claim deferred behind a waiting row of its key, to
// that row's moment.
type deferral struct {
	id    int64
	key   string
	until time.Time
}

// ReleaseHeld makes rows held by a destination, topic or partition that
// answers again ready now, with the rows deferred behind them for their
// keys, rather than at the end of their deferral. A row attempted since,
// already due or no longer pending is left as it is; one in a claim now
// is made ready by that claim's write-back, as are the rows the claims
// under way deferred behind the released rows (see releases). It returns
// how many rows it made ready itself.
func (s *Store) ReleaseHeld(ctx context.Context, rows []HeldRow) (int64, error) {
	ids := make([]int64, len(rows))
	retries := make([]int32, len(rows))
	held := make(map[int64]bool, len(rows))
	for i, r := range rows {
		ids[i], retries[i] = r.ID, int32(r.RetryCount)
		held[r.ID] = true
	}
	s.releases.record(&s.floors, &released{ids: held}, false)
	if s.releasing != nil {
		s.releasing()
	}
	n, keyed, err := s.q.ReleaseHeld(ctx, s.pool, ids, retries)
	if err != nil {
		return 0, fmt.Errorf("release %d held rows: %w", len(rows), err)
	}
	if len(keyed) == 0 {
		return n, nil
	}
	// Claims begun before the release committed may have read a held row
	// as still waiting: those written back from now on make the rows
	// they deferred behind it ready; those written back meanwhile have
	// committed them, for the pull forward to find. Claims begun before
	// the pull forward commits may read those as still waiting, and
	// defer their keys' later rows there too: the record counts for them
	// until it has.
	if s.released != nil {
		s.released()
	}
	r := &released{keyed: keyed}
	s.releases.record(&s.floors, r, true)
	defer s.releases.seal(&s.floors, r)
	if s.pulling != nil {
		s.pulling()
	}
	behind, err := s.q.PullForward(ctx, s.pool, keyed)
	if err != nil {
		return n, fmt.Errorf("release the rows behind %d held rows: %w", len(keyed), err)
	}
	return n + behind, nil
}
