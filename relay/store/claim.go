package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// ClaimParams bounds a claim.
type ClaimParams struct {
	// Limit is the most rows claimed.
	Limit int
	// PayloadCap is the largest payload loaded, in bytes; larger rows come
	// back undeliverable (too_large) without their payload.
	PayloadCap int
	// ExcludeKeys are keys not to claim: keys in flight elsewhere, whose
	// rows the claim could only lock and skip, getting in the way of the
	// worker that delivers them. Keep it short.
	ExcludeKeys []string
	// ExcludedSpan, when positive, bounds a claim that leaves keys out
	// and no topic to the rows up to that many ids above where it
	// begins: the keys left out may hold the rest of the backlog (a hot
	// key delivered elsewhere), which it would otherwise read to the
	// table's end, row after row, for nothing. Rows above are read by
	// later claims. Its Windowed says it was so bounded.
	ExcludedSpan int64
	// ExcludedFrom is the lowest id of ExcludeKeys in flight, or followed
	// by a claim in flight (see Follows: the rows it follows may fail and
	// stay pending below its own). Their pending rows lie above it, so
	// the rows a claim passes over do too: claims read them again from
	// there once their keys are free, not from where the claim began.
	// Zero: from where it began, as always with an OrderScope (a key's
	// rows of another scope may be pending below those in flight).
	ExcludedFrom int64
	// ExcludeTopics are topics not to claim: their destination is not
	// taking deliveries. A row of such a topic that holds its key counts
	// as waiting for ExcludeFor, so the key's later rows are deferred
	// rather than claimed again and again.
	ExcludeTopics []string
	ExcludeFor    time.Duration
	// Follows are the keyed rows of the caller's claim still in flight
	// before this one: rows of their keys are claimed behind them rather
	// than held back by them. The caller must publish those only once
	// every row of their key in Follows was sent, and otherwise leave them
	// without an outcome, for a later claim to hold back behind the rows
	// that failed. Unset, every row outside the claim holds its key.
	Follows []KeyedRow
	// OrderScope names the order scope of a topic's rows: a row is held
	// back only by earlier rows of its key whose topics are in the same
	// scope (a destination, or a topic), or in EveryScope. Nil keeps
	// order per key across every topic.
	OrderScope func(topic string) string
}

// EveryScope is the order scope of rows that hold back their key's later
// rows in every scope: rows whose destination is unknown (no route).
const EveryScope = "*"

// KeyedRow is a claimed row's key and id.
type KeyedRow struct {
	Key string
	ID  int64
}

// Claim is a batch of rows locked by one open transaction. Finish it with
// Complete or Release.
type Claim struct {
	Batch
	store *Store
	tx    pgx.Tx

	start        claimStart
	partLo       int
	partHi       int
	keyFloor     int64          // the key check reads pending rows from it
	held         []int64        // the ids of Records as claimed, in order
	waited       map[int64]bool // the ids of Records claimed because they waited and are due
	behindLeases []behindLease  // rows deferred behind leased rows
	deferrals    []deferral     // rows deferred behind waiting rows
	firstSkipped int64          // the lowest of the Skipped rows
	probedLow    int64          // the lowest row the key check locked for a moment
}

// Batch is what a claim took: its rows, and what it saw of the rest of
// the table.
type Batch struct {
	// Records are the claimed rows in id order. For each key and order
	// scope they are the oldest rows that still hold it, consecutive: no
	// other row of the key in the scope comes before or between them.
	Records []sink.Record
	// Now is the database clock at the claim.
	Now time.Time
	// Claimed counts the rows locked, before rows were held back for their
	// key.
	Claimed int
	// Full says the claim reached its limit, or its share of rows that
	// waited: more rows are probably ready.
	Full bool
	// Windowed says the claim read only ClaimParams.ExcludedSpan ids
	// above where it began: a claim that kept no row saw only rows of
	// the keys it left out there.
	Windowed bool
	// Deferred counts rows held back because an earlier row of their key
	// is waiting (backoff, a delay, or a parked key); they were rescheduled
	// for when it is due, without counting an attempt.
	Deferred int
	// Skipped counts rows held back because an earlier row of their key is
	// in flight elsewhere; they stay ready. SkippedKeys are their keys.
	Skipped     int
	SkippedKeys []string
	// LeaseExpiry is, after Complete, when each Leased row's lease ends.
	LeaseExpiry map[int64]time.Time
	// HeldSince is, in strict order, since when ids above the watermark
	// have waited for transactions that could still commit a smaller one:
	// their rows become ready, without a wake-up, when those end. Zero
	// when none waits, and outside strict order.
	HeldSince time.Time
}

// Rows returns what c took.
func (c *Claim) Rows() *Batch { return &c.Batch }

// SpareConns is how many more connections the store's pool could hand out
// now without waiting.
func (s *Store) SpareConns() int {
	st := s.pool.Stat()
	return int(st.MaxConns() - st.AcquiredConns() - st.ConstructingConns())
}

// Claim locks up to p.Limit ready rows and returns them in an open
// transaction. Rows whose key is held by an earlier row outside the claim
// are left out, so rows of one key are always published in id order.
func (s *Store) Claim(ctx context.Context, p ClaimParams) (*Claim, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: s.claimBegin})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && s.SpareConns() <= 0 {
			return nil, fmt.Errorf("claim outbox rows: begin: %w: %w", ErrPoolExhausted, err)
		}
		return nil, fmt.Errorf("claim outbox rows: begin: %w", err)
	}
	c := &Claim{store: s, tx: tx}
	if err := c.claim(ctx, p); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		c.fail()
		return nil, err
	}
	return c, nil
}

func (c *Claim) claim(ctx context.Context, p ClaimParams) error {
	s := c.store
	trusted := s.trusted()
	bound, err := c.observe(ctx, trusted)
	if err != nil {
		return err
	}
	trusted = trusted && !s.noFloor.Load()
	c.start = s.floors.begin(time.Now(), p.ExcludeTopics, trusted, &s.parts)
	if !c.start.partsOK {
		// No partitions to claim (yet): an empty claim.
		s.floors.claimed(c.start, claimResult{none: true})
		if err := c.tx.QueryRow(ctx, outboxdb.Now).Scan(&c.Now); err != nil {
			return fmt.Errorf("claim outbox rows: %w", err)
		}
		return nil
	}
	c.partLo, c.partHi = c.start.partLo, c.start.partHi
	lastFresh, err := c.read(ctx, p, bound)
	if err != nil {
		return err
	}
	c.keyFloor = c.start.floor
	if !trusted && hasKey(c.Records) {
		// Any process may hold any row: pending rows hold keys from the
		// lowest one up.
		if c.keyFloor, err = s.q.MinPending(ctx, c.tx); err != nil {
			return fmt.Errorf("claim outbox rows: lowest pending id: %w", err)
		}
	}
	// Every row it locked above the floor is in flight until it ends:
	// the rows it defers too, which are still ready as other
	// transactions see them until it commits.
	var lowest int64
	for _, rec := range c.Records {
		if rec.ID > c.start.floor && (lowest == 0 || rec.ID < lowest) {
			lowest = rec.ID
		}
	}
	if len(c.Records) > 0 {
		if err := c.keepKeyOrder(ctx, p); err != nil {
			return err
		}
	}
	if c.probedLow > 0 && (lowest == 0 || c.probedLow < lowest) {
		lowest = c.probedLow
	}
	c.held = make([]int64, len(c.Records))
	for i, rec := range c.Records {
		c.held[i] = rec.ID
	}
	s.floors.claimed(c.start, c.result(p, lastFresh, lowest))
	return nil
}

// read locks the claim's rows, up to bound (and to its window when it
// leaves keys out), and returns the last of them that never waited.
func (c *Claim) read(ctx context.Context, p ClaimParams, bound int64) (lastFresh int64, err error) {
	recs := make([]sink.Record, 0, p.Limit)
	seen := make(map[int64]bool, p.Limit)
	// Rows that waited take at most three quarters of the claim: the rows
	// above its start get the rest (see the claim statement).
	waitedLimit, waited := p.Limit-p.Limit/4, 0
	if w := c.start.from + p.ExcludedSpan; p.ExcludedSpan > 0 && len(p.ExcludeKeys) > 0 && len(p.ExcludeTopics) == 0 && w < bound {
		bound, c.Windowed = w, true
	}
	res, err := c.store.q.Claim(ctx, c.tx, outboxdb.ClaimArgs{Limit: p.Limit, PayloadCap: p.PayloadCap,
		ExcludeKeys: p.ExcludeKeys, ExcludeTopics: p.ExcludeTopics, MinID: c.start.from, MaxID: bound,
		PartLo: c.partLo, PartHi: c.partHi, Waited: c.start.from > 0, WaitedLimit: waitedLimit}, func(row *outboxdb.ClaimedRow) {
		c.Claimed++
		if !row.Waited {
			lastFresh = max(lastFresh, row.ID)
		} else {
			waited++
		}
		if seen[row.ID] {
			return // a row that waited, read again above the start
		}
		seen[row.ID] = true
		if row.Waited {
			if c.waited == nil {
				c.waited = map[int64]bool{}
			}
			c.waited[row.ID] = true
		}
		recs = append(recs, record(row, p.PayloadCap))
	})
	if err != nil {
		return 0, fmt.Errorf("claim outbox rows: %w", err)
	}
	c.Full = c.Claimed >= p.Limit || waited >= waitedLimit
	// Rows that waited came first: the records go in id order.
	slices.SortFunc(recs, func(a, b sink.Record) int { return cmp.Compare(a.ID, b.ID) })
	c.Now, c.Records = res.Now, recs
	return lastFresh, nil
}

// result is what the claim found, for its floors: lowest is its lowest
// row above the floor, the rows its key check locked for a moment
// included.
func (c *Claim) result(p ClaimParams, lastFresh, lowest int64) claimResult {
	// A claim cut at its window read only up to its last row, as a full one.
	r := claimResult{short: c.Claimed < p.Limit && !c.Windowed, lastFresh: lastFresh, excludedTopics: p.ExcludeTopics,
		lowestHeld: lowest}
	if len(p.ExcludeKeys) > 0 {
		r.passedKeys, r.passedFrom = true, max(p.ExcludedFrom-1, 0)
		if p.OrderScope != nil {
			// A key in flight in one scope may have rows of another
			// pending below it: the rows passed over lie anywhere
			// the claim read.
			r.passedFrom = 0
		}
	}
	return r
}

// record makes a claimed row a sink.Record, saying why it cannot be delivered
// as it is, if it cannot.
func record(row *outboxdb.ClaimedRow, payloadCap int) sink.Record {
	r := sink.Record{ID: row.ID, EventID: row.EventID, Topic: row.Topic, Key: row.Key, HasKey: row.HasKey,
		Payload: row.Payload, PayloadSize: row.PayloadSize, Headers: row.Headers, CreatedAt: row.CreatedAt,
		RetryCount: row.RetryCount, LastDelay: row.LastDelay}
	switch {
	case row.HeadersProblem != "":
		r.Undeliverable, r.UndeliverableReason = row.HeadersProblem, sink.ReasonInvalidMessage
	case r.Payload == nil:
		r.Undeliverable = fmt.Sprintf("payload is %d bytes, above the %d-byte cap", r.PayloadSize, payloadCap)
		r.UndeliverableReason = sink.ReasonTooLarge
	}
	return r
}

func hasKey(recs []sink.Record) bool {
	for i := range recs {
		if recs[i].HasKey {
			return true
		}
	}
	return false
}

// end ends the claim's flight: rows of it without an outcome (the lowest
// is left, 0 for none) are ready again.
func (c *Claim) end(left int64) {
	if c.start.gen == 0 {
		return
	}
	c.store.floors.done(c.start.gen, left)
	c.store.parts.release(c.start.gen)
	c.start.gen = 0
}
