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
	// Expired says its owner's registration has ended (or it has none).
	Expired bool
	// Floor is where its next owner starts.
	Floor int64
}

// JoinClaimers renews claimer's registration for lease once less than
// renewBelow of it is left, forgets claimers whose registration ended,
// and returns the live claimers in order, how long claimer's registration
// lasts, and every partition, locked until tx ends, with the database's
// clock. The claimers and partitions are read once the lock is held.
// Statements: claimer_join, claimers_expire, partitions_lock, claimers,
// partitions.
func (q *Queries) JoinClaimers(ctx context.Context, tx pgx.Tx, claimer string, lease, renewBelow time.Duration) (Claimers, error) {
	var c Claimers
	b := &pgx.Batch{}
	b.Queue(q.claimerJoin, claimer, lease.Microseconds(), renewBelow.Microseconds())
	b.Queue(q.claimersExpire)
	b.Queue(q.partitionsLock)
	b.Queue(q.claimers, claimer)
	b.Queue(q.partitions)
	res := tx.SendBatch(ctx, b)
	defer res.Close()
	for range 3 {
		if _, err := res.Exec(); err != nil {
			return c, err
		}
	}
	rows, err := res.Query()
	if err != nil {
		return c, err
	}
	var name string
	var left int64
	_, err = pgx.ForEachRow(rows, []any{&name, &left}, func() error {
		c.Live = append(c.Live, name)
		if name == claimer {
			c.Left = time.Duration(left) * time.Microsecond
		}
		return nil
	})
	if err != nil {
		return c, err
	}
	rows, err = res.Query()
	if err != nil {
		return c, err
	}
	var p PartitionRow
	_, err = pgx.ForEachRow(rows, []any{&p.Part, &p.Owner, &p.Expired, &p.Floor, &c.Now}, func() error {
		c.Partitions = append(c.Partitions, p)
		return nil
	})
	if err != nil {
		return c, err
	}
	return c, res.Close()
}

// Claimers is what JoinClaimers found.
type Claimers struct {
	Live []string // the live claimers, in order
	// Left is how long the registration of the claimer that joined
	// lasts from Now.
	Left       time.Duration
	Partitions []PartitionRow
	Now        time.Time
}

// WritePartitions records the partitions' owners ("" for none), their
// floors, and a lease for relays that read it from the partitions. Statement: partitions_write.
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
