package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The safe id: the highest id below which every transaction that took an
// id has ended, so no row can still appear there. Strict order claims up
// to its watermark, which waits for every transaction in the cluster; the
// floor only needs the transactions that can still insert into the
// outbox. An INSERT locks the table (RowExclusiveLock) before it takes an
// id, and keeps the lock until it ends, so only transactions that hold
// that lock can still commit an id (and prepared transactions, whose
// locks the relay does not read). When the cluster's oldest transaction
// holds the watermark for longer than refineAfter, the store asks which
// of them hold the outbox's lock, at most every refineAfter: an unrelated
// long transaction then holds neither the floor nor what it costs.
const refineAfter = time.Second

// safeWatch is the store's safe id for its floor.
type safeWatch struct {
	mu       sync.Mutex
	mark     watermark
	moved    time.Time // when the safe id last moved
	refined  time.Time // when the outbox's lock holders were last read
	lastSafe int64
	started  time.Time // when the database server started, as last seen
}

// observe reads, in the claim's transaction, what its watermarks need: in
// strict order the highest id it may take (any id otherwise), and, for a
// floor it may trust, the safe id. The reads go in one round trip.
func (c *Claim) observe(ctx context.Context, floor bool) (int64, error) {
	s := c.store
	if !s.strictOrder && !floor {
		return math.MaxInt64, nil
	}
	seq, err := s.sequence(ctx, c.tx)
	if err != nil {
		if s.strictOrder || !errors.Is(err, ErrNoWatermark) {
			return 0, err
		}
		s.cannotTrustFloor(err)
		return math.MaxInt64, nil
	}
	refine := floor && s.safe.due(time.Now())
	b := &pgx.Batch{}
	b.Queue(s.q.Server().ObserveLast, seq)
	b.Queue(s.q.Server().ObserveXids)
	if floor {
		b.Queue(s.q.Server().ServerStart)
	}
	if refine {
		b.Queue(s.q.Server().LockHolders, s.table)
	}
	res := c.tx.SendBatch(ctx, b)
	var o observation
	var xmin, holders int64
	var started time.Time
	err = res.QueryRow().Scan(&o.last)
	if err == nil {
		err = res.QueryRow().Scan(&xmin, &o.xmax)
	}
	if err == nil && floor {
		err = res.QueryRow().Scan(&started)
	}
	if err == nil && refine {
		err = res.QueryRow().Scan(&holders)
	}
	err = errors.Join(err, res.Close())
	if err != nil {
		return 0, fmt.Errorf("read the outbox's watermark: %w", err)
	}
	if floor && s.safe.restarted(started) {
		// The server crashed, failed over or was restored: write-backs
		// it acknowledged without flushing them (claims commit
		// asynchronously) may be lost, and their rows pending again
		// anywhere. Claims start again from the table's start.
		s.floors.reset()
		s.log.Info("the database restarted: claims read the outbox from its start once more")
	}
	o.at = time.Now()
	bound := int64(math.MaxInt64)
	if s.strictOrder {
		var safe int64
		safe, c.HeldSince = s.strict.advance(o, xmin)
		bound = safe
		s.floors.advanceSafe(safe)
	}
	if floor {
		s.floors.advanceSafe(s.safe.advance(o, xmin, holders, refine))
	}
	return bound, nil
}

// restarted records when the server last started and reports whether that
// changed since the last look: the database may have lost what it did not
// flush, or be another one (a promoted standby, a restored backup). The
// watermark's observations are dropped then.
func (w *safeWatch) restarted(at time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	changed := !w.started.IsZero() && !at.Equal(w.started)
	w.started = at
	if changed {
		w.mark = watermark{seq: w.mark.seq}
		w.lastSafe, w.moved = 0, time.Time{}
	}
	return changed
}

// due says whether the safe id has been held long enough, and the lock
// holders not read for long enough, to read them now.
func (w *safeWatch) due(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return now.Sub(w.moved) >= refineAfter && now.Sub(w.refined) >= refineAfter
}

// advance records o, made when the cluster's oldest transaction was xmin
// and, when refined, the oldest that could still insert into the outbox
// was holders; it returns the safe id.
func (w *safeWatch) advance(o observation, xmin, holders int64, refined bool) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	safe, _ := w.mark.advance(o, xmin)
	if refined {
		w.refined = o.at
		safe, _ = w.mark.advance(o, holders)
	}
	if safe != w.lastSafe {
		w.lastSafe, w.moved = safe, o.at
	}
	return safe
}

// cannotTrustFloor makes the store read from the table's start, saying
// why once.
func (s *Store) cannotTrustFloor(err error) {
	s.noFloor.Store(true)
	s.noFloorN.Do(func() {
		s.log.Warn("claims read the outbox from its start: a long-held snapshot will slow them", slog.Any("reason", err))
	})
}
