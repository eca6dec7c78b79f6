package outboxdb

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// TryMaintenanceLock takes the transaction-scoped advisory lock id if no
// one holds it. Statement: try_maintenance_lock.
func (q *Queries) TryMaintenanceLock(ctx context.Context, tx pgx.Tx, id int64) (bool, error) {
	var locked bool
	err := tx.QueryRow(ctx, q.tryLock, id).Scan(&locked)
	return locked, err
}

// DeleteSent deletes up to limit rows sent longer than retention ago.
// Statement: delete_sent.
func (q *Queries) DeleteSent(ctx context.Context, db DB, retention time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, q.deleteSent, retention.Microseconds(), limit)
	return tag.RowsAffected(), err
}

// DeleteExpiredDeadLetters deletes up to limit dead-lettered rows
// dead-lettered longer than retention ago, except those that park their
// key. Statement: delete_expired_dead.
func (q *Queries) DeleteExpiredDeadLetters(ctx context.Context, db DB, retention time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, q.deleteExpired, retention.Microseconds(), limit)
	return tag.RowsAffected(), err
}

// DeleteDiscarded deletes up to limit rows discarded longer than
// retention ago. Statement: delete_discarded.
func (q *Queries) DeleteDiscarded(ctx context.Context, db DB, retention time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, q.deleteDiscarded, retention.Microseconds(), limit)
	return tag.RowsAffected(), err
}

// DeleteAudit deletes up to limit audit records older than retention.
// Statement: delete_audit.
func (q *Queries) DeleteAudit(ctx context.Context, db DB, retention time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, q.deleteAudit, retention.Microseconds(), limit)
	return tag.RowsAffected(), err
}

// TopicBacklog is what waits for delivery on one topic.
type TopicBacklog struct {
	Topic string
	// Pending counts the topic's pending rows, ready or waiting.
	Pending int64
	// OldestAge is the age of its oldest pending row, by the database
	// clock.
	OldestAge time.Duration
}

// Backlog counts the pending rows of every topic that has some.
// Statement: backlog.
func (q *Queries) Backlog(ctx context.Context, db DB) ([]TopicBacklog, error) {
	rows, err := db.Query(ctx, q.backlog)
	if err != nil {
		return nil, err
	}
	var out []TopicBacklog
	var b TopicBacklog
	var ageUS int64
	_, err = pgx.ForEachRow(rows, []any{&b.Topic, &b.Pending, &ageUS}, func() error {
		b.OldestAge = time.Duration(max(ageUS, 0)) * time.Microsecond
		out = append(out, b)
		return nil
	})
	return out, err
}
