package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Strict per-key order. Ids are taken when a row is inserted, not when its
// transaction commits, so two transactions writing one key at once can
// commit its rows out of id order, and a claim between the two commits
// delivers the later id first. In strict mode a claim takes only ids up to
// a watermark below which every transaction that took an id has ended:
//
//  1. The table's trigger (migration 6) gives an inserting transaction its
//     transaction id before the statement takes any id from the sequence.
//  2. An observation reads the sequence's last value L, then, in a later
//     statement, X: the next transaction id to be given. Every transaction
//     that took an id up to L got its transaction id before, so below X.
//     (Not the snapshot's xmax, which is one past the latest transaction
//     to end: younger ones may be running.)
//  3. Once a snapshot's xmin (the oldest running transaction id) reaches X,
//     every such transaction has committed or rolled back: ids up to L are
//     either visible or gone for good, and L becomes the watermark.
//
// Each claim makes one observation, in one round trip before the claim, and
// keeps those not yet safe; their L and X only grow, so the safe ones are a
// prefix. A long write transaction anywhere in the cluster (transaction ids
// are cluster-wide) holds the watermark until it ends.

// xidTrigger is the trigger that gives an inserting transaction its
// transaction id first.
const xidTrigger = "outbox_xid_first"

// maxObservations bounds the observations kept while a transaction holds
// the watermark. Beyond it the newest is replaced: the watermark then
// moves in larger steps once the holder ends, never past a safe id.
const maxObservations = 64

// ErrNoWatermark reports a table on which the watermark cannot be read
// (see CheckStrictOrder): strict order cannot work there, and claims read
// from the table's start.
var ErrNoWatermark = errors.New("strict order cannot work")

// observation is one look at the sequence and the transaction ids.
type observation struct {
	last int64 // the sequence's last value
	xmax int64 // the next transaction id, read after last
	at   time.Time
}

// watermark is the highest id below which no transaction can still commit
// a row, with the observations that will raise it.
type watermark struct {
	mu      sync.Mutex
	seq     string // the id sequence, as a regclass literal; "" until prepared
	safe    int64
	pending []observation
}

// advance records o, made when the oldest running transaction id was
// xmin, and returns the watermark and since when ids above it have waited
// (zero when none has).
func (w *watermark) advance(o observation, xmin int64) (safe int64, heldSince time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for n < len(w.pending) && w.pending[n].xmax <= xmin {
		w.safe = max(w.safe, w.pending[n].last)
		n++
	}
	w.pending = append(w.pending[:0], w.pending[n:]...)
	switch {
	case o.xmax <= xmin:
		// No transaction was running that could hold an id up to last.
		w.safe = max(w.safe, o.last)
		w.pending = w.pending[:0]
	case o.last <= w.safe:
	case len(w.pending) > 0 && w.pending[len(w.pending)-1].last == o.last:
		// No id taken since: the older observation is safe sooner.
	case len(w.pending) == maxObservations:
		w.pending[len(w.pending)-1] = o
	default:
		w.pending = append(w.pending, o)
	}
	if len(w.pending) > 0 {
		heldSince = w.pending[0].at
	}
	return w.safe, heldSince
}

// held is how long ids above the watermark have waited, as of now.
func (w *watermark) held(now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pending) == 0 {
		return 0
	}
	return now.Sub(w.pending[0].at)
}

// sequence returns the id sequence, checking the first time that strict
// order can work on this table.
func (s *Store) sequence(ctx context.Context, q querier) (string, error) {
	s.strict.mu.Lock()
	seq := s.strict.seq
	s.strict.mu.Unlock()
	if seq != "" {
		return seq, nil
	}
	if err := s.checkStrictOrder(ctx, q); err != nil {
		return "", err
	}
	s.strict.mu.Lock()
	defer s.strict.mu.Unlock()
	return s.strict.seq, nil
}

// CheckStrictOrder checks that the table supports strict order: the
// trigger that migration 6 adds is enabled, ids come from a sequence that
// hands them out one at a time, and the relay may read it. A Store with
// StrictOrder checks at its first claim; call it at start to fail early.
func (s *Store) CheckStrictOrder(ctx context.Context) error {
	return s.checkStrictOrder(ctx, s.pool)
}

// querier runs a query on a pool or in a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// checkStrictOrder is CheckStrictOrder through q: a claim checks in its own
// transaction, so that it never waits for a second connection while it
// holds one (claims that all did would wait on each other).
func (s *Store) checkStrictOrder(ctx context.Context, q querier) error {
	var (
		enabled  string
		seq      *string
		cache    *int64
		readable *bool
		problems []string
	)
	err := q.QueryRow(ctx, s.q.Server().StrictCheck, s.table, xidTrigger).Scan(&enabled, &seq, &cache, &readable)
	if err != nil {
		return fmt.Errorf("check strict order: %w", err)
	}
	switch enabled {
	case "O", "A":
	case "":
		problems = append(problems, fmt.Sprintf("trigger %s is missing: run 'outbox-relay migrate up'", xidTrigger))
	default:
		problems = append(problems, fmt.Sprintf("trigger %s is disabled: enable it (ALTER TABLE %s ENABLE TRIGGER %s)", xidTrigger, s.table, xidTrigger))
	}
	switch {
	case seq == nil:
		problems = append(problems, "its id column takes its values from no sequence")
	case readable == nil || !*readable:
		problems = append(problems, fmt.Sprintf("the relay's role may not read sequence %s: grant it SELECT on it", *seq))
	case cache != nil && *cache != 1:
		problems = append(problems, fmt.Sprintf("sequence %s caches %d values per session, so ids do not follow the order in which they are taken: set it to 1 (ALTER TABLE %s ALTER COLUMN id SET CACHE 1)", *seq, *cache, s.table))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w on %s: %s", ErrNoWatermark, s.tableName, joinProblems(problems))
	}
	s.strict.mu.Lock()
	s.strict.seq = *seq
	s.strict.mu.Unlock()
	return nil
}

// OrderHolder is the transaction that holds strict-order delivery: the
// oldest one running.
type OrderHolder struct {
	// PID is its backend's process id; 0 for a prepared transaction.
	PID int
	// Prepared is the global id of a prepared transaction, "" otherwise.
	Prepared string
	// Age is how long the transaction has run (prepared: since it was
	// prepared); 0 when PostgreSQL does not show it to the relay's role
	// (grant it pg_read_all_stats).
	Age time.Duration
	// Database, User, Application and State describe it, where shown.
	Database, User, Application, State string
}

// OrderHold is how strict-order delivery is held, if it is.
type OrderHold struct {
	// Held is how long ids above the watermark have waited; 0 when none
	// has, or outside strict mode.
	Held time.Duration
	// Holder is the oldest running transaction while ids wait.
	Holder *OrderHolder
}

// OrderHold reports how long strict-order delivery has been held and by
// which transaction. It asks the database only while ids wait.
func (s *Store) OrderHold(ctx context.Context) (OrderHold, error) {
	if !s.strictOrder {
		return OrderHold{}, nil
	}
	h := OrderHold{Held: s.strict.held(time.Now())}
	if h.Held == 0 {
		return h, nil
	}
	var o OrderHolder
	var age float64
	err := s.pool.QueryRow(ctx, s.q.Server().OrderHolder).Scan(&o.PID, &o.Prepared, &age, &o.Database, &o.User, &o.Application, &o.State)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// It ended since the last claim.
		return h, nil
	case err != nil:
		return h, fmt.Errorf("find the transaction holding strict order: %w", err)
	}
	o.Age = time.Duration(age * float64(time.Second))
	h.Holder = &o
	return h, nil
}
