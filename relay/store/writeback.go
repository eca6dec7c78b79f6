package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// Outcome kinds.
type OutcomeKind int

const (
	// Sent rows are deleted, or marked sent when kept.
	Sent OutcomeKind = iota
	// Retried rows count an attempt and wait Delay.
	Retried
	// Deferred rows wait Delay without counting an attempt.
	Deferred
	// DeadLettered rows move to the dead-letter status with Reason.
	DeadLettered
	// Leased rows are handed to a delivery outside the claim's
	// transaction: hidden for Delay (the visibility timeout) under a lease
	// token, with the attempt counted now. Finish them with CompleteLeased.
	Leased
)

// Outcome is what happened to one claimed row. Rows of a claim without an
// outcome are left as they were.
type Outcome struct {
	ID    int64
	Kind  OutcomeKind
	Delay time.Duration
	// Error describes the failure (all kinds but Sent).
	Error string
	// Class is the failure's class, kept in the error history.
	Class string
	// Reason is the dead-letter reason (DeadLettered). A Deferred row may
	// say why it waits, for metrics; that is not stored.
	Reason string
	// Attempted is true when the row was handed to the destination; an
	// attempted failure counts towards retry_count unless Deferred. A
	// Deferred row that was not attempted keeps its error and history.
	Attempted bool
	// ParkKey makes a dead-lettered row hold its key until released.
	ParkKey bool
	// Destination names where the row went; empty when it never got one.
	// It is stored for attempted failures and dead letters.
	Destination string
	// Token is the lease of a Leased row and, in CompleteLeased, the lease
	// the outcome applies to: it is written only while the row still
	// holds it.
	Token uuid.UUID
}

// Complete writes the outcomes back, with the claim's deferrals, and
// commits. On error the transaction is rolled back and every row stays as
// it was before the claim.
//
// Held rows released while it was under way are not deferred again, and
// the rows it deferred behind them are made ready (see releases).
func (c *Claim) Complete(ctx context.Context, outcomes []Outcome) error {
	q := c.store.q
	released, behind, settled := c.store.releases.look(c.start.gen, c.deferrals)
	defer settled()
	if c.store.looked != nil {
		c.store.looked()
	}
	var w writes
	for _, id := range behind {
		w.deferIDs = append(w.deferIDs, id)
		w.deferAt = append(w.deferAt, c.Now)
	}
	for _, o := range outcomes {
		if o.Kind == Deferred && released(o.ID) {
			o.Delay = 0
		}
		w.add(o, c.Now)
	}
	b := &pgx.Batch{}
	c.LeaseExpiry = w.queue(q, b, c.store.errorHistory)
	if b.Len() > 0 {
		if err := c.tx.SendBatch(ctx, b).Close(); err != nil {
			_ = c.tx.Rollback(context.WithoutCancel(ctx))
			c.fail()
			return fmt.Errorf("write back %d outcomes: %w", len(outcomes), err)
		}
	}
	if err := c.tx.Commit(ctx); err != nil {
		c.fail()
		return fmt.Errorf("commit %d outcomes: %w", len(outcomes), err)
	}
	c.end(c.leftOut(outcomes))
	settled()
	if len(c.behindLeases) > 0 {
		c.releaseEndedLeases(ctx)
	}
	return nil
}

// writes are the statements that write a claim's outcomes back.
type writes struct {
	sent, deferIDs []int64
	deferAt        []time.Time
	leased         []int64
	leaseFor       []time.Duration
	leaseTokens    []uuid.UUID
	fails          outboxdb.Failures
}

// add sorts o among the writes; now is the claim's clock.
func (w *writes) add(o Outcome, now time.Time) {
	switch {
	case o.Kind == Sent:
		w.sent = append(w.sent, o.ID)
	case o.Kind == Leased:
		w.leased = append(w.leased, o.ID)
		w.leaseTokens = append(w.leaseTokens, o.Token)
		w.leaseFor = append(w.leaseFor, o.Delay)
	case o.Kind == Deferred && !o.Attempted:
		// Never handed to the destination: nothing to record but when
		// to look again.
		w.deferIDs = append(w.deferIDs, o.ID)
		w.deferAt = append(w.deferAt, now.Add(o.Delay))
	default:
		inc := int32(0)
		if o.Attempted && o.Kind != Deferred {
			inc = 1
		}
		w.fails.Add(o.failure(inc, o.Attempted, pgtype.UUID{}))
	}
}

// queue adds the writes to b, and returns when each leased row's lease
// ends, filled as b runs (nil without leases).
func (w *writes) queue(q *outboxdb.Queries, b *pgx.Batch, history int) map[int64]time.Time {
	if len(w.sent) > 0 {
		q.QueueSent(b, w.sent)
	}
	if len(w.deferIDs) > 0 {
		q.QueueDefer(b, w.deferIDs, w.deferAt)
	}
	q.QueueFail(b, &w.fails, history)
	if len(w.leased) == 0 {
		return nil
	}
	expiry := make(map[int64]time.Time, len(w.leased))
	q.QueueLease(b, w.leased, w.leaseTokens, w.leaseFor, func(id int64, until time.Time) { expiry[id] = until })
	return expiry
}

// failure is the write-back of o, a failed, deferred or dead-lettered
// outcome.
func (o Outcome) failure(inc int32, attempted bool, token pgtype.UUID) outboxdb.Failure {
	return outboxdb.Failure{ID: o.ID, DeadLetter: o.Kind == DeadLettered, Reason: o.Reason, Delay: o.Delay,
		Inc: inc, Error: truncate(storable(o.Error), MaxErrorLen), Class: o.Class, Attempted: attempted,
		ParkKey: o.ParkKey, Token: token, Destination: o.Destination}
}

// LeasedWork is where a leased key's rows sat when they were leased: rows
// of the key deferred to the lease's end are pulled forward once the
// delivery is over.
type LeasedWork struct {
	Key     string
	FirstID int64
	// Until is the end of the lease the rows were deferred to.
	Until time.Time
}

// CompleteLeased writes back the outcomes of a leased delivery, each only
// where the row still holds the outcome's Token: a lease that expired and
// was taken by another delivery is left to that one. Attempts were counted
// when the rows were leased, so Retried and DeadLettered outcomes count
// none; Deferred outcomes (a systemic failure) and rows in unsent (never
// handed to the destination) give theirs back. Rows deferred behind the
// leased keys are then made ready. It returns the outcomes written back,
// in their order: those of rows that still held the lease.
func (s *Store) CompleteLeased(ctx context.Context, outcomes []Outcome, unsent []Outcome, keys []LeasedWork) ([]Outcome, error) {
	var sentIDs, unsentIDs []int64
	var sentTokens, unsentTokens []uuid.UUID
	var fails outboxdb.Failures
	for _, o := range outcomes {
		switch o.Kind {
		case Sent:
			sentIDs = append(sentIDs, o.ID)
			sentTokens = append(sentTokens, o.Token)
			continue
		case Leased:
			continue
		}
		inc := int32(0)
		if o.Kind == Deferred {
			inc = -1 // a systemic failure gives the lease's attempt back
		}
		// last_attempt_at was set by the lease.
		fails.Add(o.failure(inc, false, pgtype.UUID{Bytes: o.Token, Valid: true}))
	}
	for _, o := range unsent {
		unsentIDs = append(unsentIDs, o.ID)
		unsentTokens = append(unsentTokens, o.Token)
	}
	if len(sentIDs) == 0 && fails.Len() == 0 && len(unsentIDs) == 0 && len(keys) == 0 {
		return nil, nil
	}
	b := &pgx.Batch{}
	outboxdb.QueueAsyncCommit(b)
	applied := map[int64]bool{}
	collect := func(id int64) { applied[id] = true }
	if len(sentIDs) > 0 {
		s.q.QueueLeasedSent(b, sentIDs, sentTokens, collect)
	}
	s.q.QueueLeasedFail(b, &fails, s.errorHistory, collect)
	if len(unsentIDs) > 0 {
		s.q.QueueUnlease(b, unsentIDs, unsentTokens)
	}
	if len(keys) > 0 {
		leased := make([]outboxdb.LeasedKey, len(keys))
		for i, k := range keys {
			leased[i] = outboxdb.LeasedKey(k)
		}
		s.q.QueuePullForward(b, leased)
	}
	// One implicit transaction: all or nothing.
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("write back %d leased outcomes: %w", len(outcomes)+len(unsent), err)
	}
	var done []Outcome
	for _, o := range outcomes {
		if applied[o.ID] {
			done = append(done, o)
		}
	}
	return done, nil
}

// Release ends the claim without writing anything: every row stays as it
// was before the claim, including rows the claim deferred. Use Complete
// with no outcomes to keep those deferrals.
func (c *Claim) Release(ctx context.Context) error {
	err := c.tx.Rollback(ctx)
	// Its rows are ready again once their locks are gone, not before: a
	// claim that passes over them meanwhile must not take them for done.
	if len(c.held) == 0 && c.Deferred == 0 && c.Skipped == 0 {
		c.end(0) // it held nothing
	} else {
		c.fail()
	}
	if err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("release claim: %w", err)
	}
	return nil
}

// fail ends a claim whose rows, and what it deferred, are all as they were
// before it: any row above its start may be ready again. It comes after
// the transaction's end, which unlocks them.
func (c *Claim) fail() {
	if c.start.gen == 0 {
		return
	}
	c.store.floors.failed(c.start, c.probedLow)
	c.store.parts.release(c.start.gen)
	c.start.gen = 0
}

// leftOut returns the lowest row the claim leaves ready: of its records,
// as claimed, without an outcome, and of the rows it held back for a key
// in flight elsewhere; 0 when there is none. Only rows above its floor
// count: below it, a row is one that waited, which stays on the waiting
// rows' index.
func (c *Claim) leftOut(outcomes []Outcome) int64 {
	has := make(map[int64]bool, len(outcomes))
	for _, o := range outcomes {
		has[o.ID] = true
	}
	// Records as claimed: the caller may have left some out since.
	left := c.firstSkipped // held back, still locked until now
	if c.probedLow > 0 && (left == 0 || c.probedLow < left) {
		left = c.probedLow // locked for a moment by the key check
	}
	for _, id := range c.held {
		if !has[id] && id > c.start.floor {
			if left == 0 || id < left {
				left = id
			}
			break // in id order
		}
	}
	return left
}
