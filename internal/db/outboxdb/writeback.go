package outboxdb

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Row statuses.
const (
	StatusPending      = "pending"
	StatusDeadLettered = "dead_lettered"
	StatusDiscarded    = "discarded"
)

// Failure is one row's failed, deferred or dead-lettered outcome.
type Failure struct {
	ID int64
	// DeadLetter moves the row to dead_lettered with Reason; otherwise it
	// stays pending and is due after Delay.
	DeadLetter bool
	Reason     string
	Delay      time.Duration
	// Inc is added to retry_count.
	Inc int32
	// Error and Class go to last_error and the error history.
	Error, Class string
	// Attempted sets last_attempt_at.
	Attempted bool
	// ParkKey makes a dead letter hold its key until released.
	ParkKey bool
	// Token, if valid, writes the outcome only while the row holds that
	// lease.
	Token pgtype.UUID
	// Destination, if not empty, replaces the row's destination.
	Destination string
}

// Failures gather the parameters of the fail statement, one array per
// column.
type Failures struct {
	ids                     []int64
	statuses, errs, classes []string
	incs                    []int32
	delays                  []int64
	reasons                 []pgtype.Text
	parks, attempted        []bool
	tokens                  []pgtype.UUID
	dests                   []pgtype.Text
}

// Add appends f.
func (fs *Failures) Add(f Failure) {
	status, reason := StatusPending, pgtype.Text{}
	if f.DeadLetter {
		status = StatusDeadLettered
		reason = pgtype.Text{String: f.Reason, Valid: true}
	}
	fs.ids = append(fs.ids, f.ID)
	fs.statuses = append(fs.statuses, status)
	fs.incs = append(fs.incs, f.Inc)
	fs.delays = append(fs.delays, f.Delay.Microseconds())
	fs.errs = append(fs.errs, f.Error)
	fs.classes = append(fs.classes, f.Class)
	fs.reasons = append(fs.reasons, reason)
	fs.parks = append(fs.parks, f.ParkKey && f.DeadLetter)
	fs.attempted = append(fs.attempted, f.Attempted)
	fs.tokens = append(fs.tokens, f.Token)
	fs.dests = append(fs.dests, pgtype.Text{String: f.Destination, Valid: f.Destination != ""})
}

// Len is the number of failures.
func (fs *Failures) Len() int { return len(fs.ids) }

// QueueFail adds the failures to b, keeping the latest history entries of
// each row's error history. Statement: fail.
func (q *Queries) QueueFail(b *pgx.Batch, fs *Failures, history int) {
	if fs.Len() > 0 {
		fs.queue(b, q.fail, history)
	}
}

// QueueLeasedFail adds leased failures to b; the rows that still held
// their lease are passed to applied. Statement: leased_fail.
func (q *Queries) QueueLeasedFail(b *pgx.Batch, fs *Failures, history int, applied func(id int64)) {
	if fs.Len() > 0 {
		fs.queue(b, q.leasedFail, history).Query(collectIDs(applied))
	}
}

func (fs *Failures) queue(b *pgx.Batch, sql string, history int) *pgx.QueuedQuery {
	return b.Queue(sql, fs.ids, fs.statuses, fs.incs, fs.delays, fs.errs, fs.classes, fs.reasons,
		fs.parks, fs.attempted, history, fs.tokens, fs.dests)
}

// QueueSent adds delivered rows to b: deleted, or marked sent.
// Statement: sent_delete or sent_mark.
func (q *Queries) QueueSent(b *pgx.Batch, ids []int64) {
	b.Queue(q.sent, ids)
}

// QueueLease adds leases to b: each row hidden for its visibility timeout
// under its token, with the attempt counted; until receives when each
// lease ends. Statement: lease.
func (q *Queries) QueueLease(b *pgx.Batch, ids []int64, tokens []uuid.UUID, timeouts []time.Duration, until func(id int64, at time.Time)) {
	us := make([]int64, len(timeouts))
	for i, d := range timeouts {
		us[i] = d.Microseconds()
	}
	b.Queue(q.lease, ids, tokens, us).Query(func(rows pgx.Rows) error {
		var id int64
		var at time.Time
		_, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error {
			until(id, at)
			return nil
		})
		return err
	})
}

// QueueLeasedSent adds delivered leased rows to b, each only while it
// holds its token; applied receives those that did. Statement:
// leased_sent_delete or leased_sent_mark.
func (q *Queries) QueueLeasedSent(b *pgx.Batch, ids []int64, tokens []uuid.UUID, applied func(id int64)) {
	b.Queue(q.leasedSent, ids, tokens).Query(collectIDs(applied))
}

// QueueUnlease adds leased rows that were never sent to b: ready now,
// their attempt given back. Statement: unlease.
func (q *Queries) QueueUnlease(b *pgx.Batch, ids []int64, tokens []uuid.UUID) {
	b.Queue(q.unlease, ids, tokens)
}

// LeasedKey is where a leased key's rows sat when they were leased.
type LeasedKey struct {
	Key     string
	FirstID int64
	Until   time.Time
}

// QueuePullForward adds to b: rows of the keys deferred to the end of
// their lease are ready now. Statement: pull_forward.
func (q *Queries) QueuePullForward(b *pgx.Batch, keys []LeasedKey) {
	k, first, until := leasedKeyArrays(keys)
	b.Queue(q.pullForward, k, first, until)
}

func leasedKeyArrays(keys []LeasedKey) ([]string, []int64, []time.Time) {
	k := make([]string, len(keys))
	first := make([]int64, len(keys))
	until := make([]time.Time, len(keys))
	for i, w := range keys {
		k[i], first[i], until[i] = w.Key, w.FirstID, w.Until
	}
	return k, first, until
}

// ReleaseHeld makes the rows ids, held with the retry counts retries,
// ready now, with the rows deferred behind them for their keys. It
// returns how many rows it made ready, and where the keyed ones sat, for
// PullForward once the claims under way have ended. Statement:
// release_held.
func (q *Queries) ReleaseHeld(ctx context.Context, db DB, ids []int64, retries []int32) (int64, []LeasedKey, error) {
	rows, err := db.Query(ctx, q.releaseHeld, ids, retries)
	if err != nil {
		return 0, nil, err
	}
	var n int64
	var keyed []LeasedKey
	var key pgtype.Text
	var id int64
	var until pgtype.Timestamptz
	_, err = pgx.ForEachRow(rows, []any{&key, &id, &until, &n}, func() error {
		if key.Valid {
			keyed = append(keyed, LeasedKey{Key: key.String, FirstID: id, Until: until.Time})
		}
		return nil
	})
	return n, keyed, err
}

// PullForward makes ready now the rows of keys deferred to exactly the
// moment given, above the id given: the rows behind a row that is ready
// again. It returns how many. Statement: pull_forward.
func (q *Queries) PullForward(ctx context.Context, db DB, keys []LeasedKey) (int64, error) {
	k, first, until := leasedKeyArrays(keys)
	tag, err := db.Exec(ctx, q.pullForward, k, first, until)
	return tag.RowsAffected(), err
}

func collectIDs(applied func(id int64)) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		var id int64
		_, err := pgx.ForEachRow(rows, []any{&id}, func() error {
			applied(id)
			return nil
		})
		return err
	}
}

// QueueAsyncCommit makes the transaction a batch runs in commit without
// waiting for the WAL flush, as a claim's does (see ClaimBegin); for the
// transaction only. Queue it first.
func QueueAsyncCommit(b *pgx.Batch) {
	b.Queue(asyncCommit)
}
