package outboxdb

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// PartitionRow is one of the outbox's partitions, as a sync found it.
type PartitionRow struct {
	Part int
	// Owner is the process that leases it; "" for none.
	Owner string
	// Expired says its lease has ended (or it has none).
	Expired bool
	// Floor is where its next owner starts.
	Floor int64
}

// JoinClaimers renews claimer's registration for lease, forgets claimers
// whose registration ended, and returns the live claimers in order and
// every partition, locked until tx ends, with the database's clock.
// Statements: claimer_join, claimers_expire, claimers, partitions_lock.
func (q *Queries) JoinClaimers(ctx context.Context, tx pgx.Tx, claimer string, lease time.Duration) ([]string, []PartitionRow, time.Time, error) {
	var now time.Time
	b := &pgx.Batch{}
	b.Queue(q.claimerJoin, claimer, lease.Microseconds())
	b.Queue(q.claimersExpire)
	b.Queue(q.claimers)
	b.Queue(q.partitionsLock)
	res := tx.SendBatch(ctx, b)
	defer res.Close()
	for range 2 {
		if _, err := res.Exec(); err != nil {
			return nil, nil, now, err
		}
	}
	rows, err := res.Query()
	if err != nil {
		return nil, nil, now, err
	}
	claimers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, now, err
	}
	rows, err = res.Query()
	if err != nil {
		return nil, nil, now, err
	}
	var parts []PartitionRow
	var p PartitionRow
	_, err = pgx.ForEachRow(rows, []any{&p.Part, &p.Owner, &p.Expired, &p.Floor, &now}, func() error {
		parts = append(parts, p)
		return nil
	})
	if err != nil {
		return nil, nil, now, err
	}
	return claimers, parts, now, res.Close()
}

// WritePartitions records the partitions' owners ("" for none), renewed
// for lease, and their floors. Statement: partitions_write.
func (q *Queries) WritePartitions(ctx context.Context, tx pgx.Tx, parts []int, owners []string, floors []int64, lease time.Duration) error {
	_, err := tx.Exec(ctx, q.partitionsWrite, parts, owners, floors, lease.Microseconds())
	return err
}

// LeaveClaimers forgets claimer and frees its partitions, each with floor.
// Statement: claimer_leave.
func (q *Queries) LeaveClaimers(ctx context.Context, db DB, claimer string, floor int64) error {
	_, err := db.Exec(ctx, q.claimerLeave, claimer, floor)
	return err
}
