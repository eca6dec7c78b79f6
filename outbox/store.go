package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/outboxdb"
	"github.com/outbox-relay/outbox-relay/internal/schema"
)

// Record is a claimed outbox row, ready to publish.
type Record struct {
	ID      int64
	EventID uuid.UUID
	Topic   string
	// Key is the ordering and Kafka message key; HasKey is false for a
	// null key.
	Key    string
	HasKey bool
	// Payload is nil when PayloadSize is above the claim's payload cap: an
	// oversized payload is never loaded.
	Payload     []byte
	PayloadSize int
	Headers     map[string]string
	CreatedAt   time.Time
	// RetryCount is the number of failed attempts so far.
	RetryCount int
	// LastDelay is the delay chosen after the previous failure, if any.
	LastDelay time.Duration
	// Undeliverable says why the row cannot be delivered as it is (empty
	// when it can); UndeliverableReason is its dead-letter reason.
	Undeliverable       string
	UndeliverableReason string
}

// Dead-letter reasons: the values the table's check constraint allows.
const (
	ReasonPermanent        = "permanent"
	ReasonRetriesExhausted = "retries_exhausted"
	ReasonMaxAgeExceeded   = "max_age_exceeded"
	ReasonTooLarge         = "too_large"
	ReasonNoRoute          = "no_route"
	ReasonInvalidMessage   = "invalid_message"
)

// ParkedRecheck is how long rows behind a parked key are deferred before
// they are looked at again. Releasing the key makes them ready at once.
const ParkedRecheck = 5 * time.Minute

// DefaultErrorHistory is the number of recent failures kept per row.
const DefaultErrorHistory = 10

// MaxErrorLen bounds last_error and each error history entry, in bytes.
const MaxErrorLen = 2048

// StoreConfig configures a Store.
type StoreConfig struct {
	// Schema holds the outbox table. Default "public".
	Schema string
	// KeepSent marks delivered rows sent instead of deleting them, for
	// sent_retention > 0. Deleting is the default: half the WAL and no
	// bloat.
	KeepSent bool
	// ErrorHistory is the number of recent failures kept per row.
	// Default 10.
	ErrorHistory int
	// StrictOrder claims a row only once every transaction that could
	// still commit a smaller id has ended, so that rows of one key are
	// delivered in id order even when producers write a key from
	// concurrent transactions. A long write transaction anywhere in the
	// database cluster delays delivery until it ends. Needs migration 6.
	StrictOrder bool
	// IdleInTransactionTimeout has the server end a claim's transaction,
	// releasing its rows, when the relay has sent nothing in it for this
	// long: a relay cut off by a network black hole cannot keep rows
	// locked until TCP notices. It must exceed the longest publish of a
	// batch (and, with claim-ahead, two). Zero leaves the server's
	// setting.
	IdleInTransactionTimeout time.Duration
	// Claimer names the process among those that claim the outbox's rows,
	// uniquely: it leases a share of the outbox's partitions under this
	// name (see SyncPartitions), and claims only them, reading from a
	// floor of its own. Empty, the store claims every partition, and
	// reads from the table's start as any other process may hold any
	// row. Needs migration 16.
	Claimer string
	// ClaimLease is how long the store's hold on its partitions lasts
	// without a sync. Default 5s.
	ClaimLease time.Duration
	// Logger is told, once, why the store cannot read from a floor.
	// Default: nothing is logged.
	Logger *slog.Logger
}

// Store is the relay's access to the outbox table.
type Store struct {
	pool         *pgxpool.Pool
	q            *outboxdb.Queries
	errorHistory int
	lockID       int64
	keyCheck     keyCheckForm // tests force a form; zero picks per claim
	table        string       // the outbox table, quoted
	tableName    string       // and as people write it
	strictOrder  bool
	strict       watermark
	claimBegin   string // see outboxdb.ClaimBegin
	log          *slog.Logger

	floors   floors
	safe     safeWatch
	parts    partitionSet
	claimer  string
	lease    time.Duration
	lapse    time.Duration // how long a lapsed owner's locks may last
	foreign  atomic.Bool   // a process that leases no partitions may claim
	noFloor  atomic.Bool   // the safe id cannot be known here
	noFloorN sync.Once
}

// NewStore returns a Store on pool for cfg.
func NewStore(pool *pgxpool.Pool, cfg StoreConfig) (*Store, error) {
	if cfg.Schema == "" {
		cfg.Schema = schema.Default
	}
	q, err := outboxdb.New(cfg.Schema, outboxdb.Options{KeepSent: cfg.KeepSent})
	if err != nil {
		return nil, fmt.Errorf("outbox store: %w", err)
	}
	if cfg.ErrorHistory <= 0 {
		cfg.ErrorHistory = DefaultErrorHistory
	}
	if cfg.ClaimLease <= 0 {
		cfg.ClaimLease = DefaultClaimLease
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{pool: pool, q: q, errorHistory: cfg.ErrorHistory, lockID: schema.LockID(cfg.Schema) + 1,
		table: pgx.Identifier{cfg.Schema, "outbox"}.Sanitize(), tableName: cfg.Schema + ".outbox",
		strictOrder: cfg.StrictOrder, claimBegin: outboxdb.ClaimBegin(cfg.IdleInTransactionTimeout),
		log: cfg.Logger, claimer: cfg.Claimer, lease: cfg.ClaimLease,
		lapse: max(cfg.IdleInTransactionTimeout, time.Minute) + cfg.ClaimLease}
	if s.claimer == "" {
		s.parts.lo, s.parts.hi, s.parts.until = 0, Partitions-1, time.Unix(1<<62, 0)
	} else {
		s.parts.lo, s.parts.hi = 0, -1 // nothing before the first sync
	}
	return s, nil
}

// SetForeignClaimers says whether a process that leases no partitions (a
// relay older than migration 16) may be claiming the outbox's rows: then
// the store checks keys from the lowest pending row, as that process may
// hold any row.
func (s *Store) SetForeignClaimers(present bool) { s.foreign.Store(present) }

// trusted says whether the store can read from its floor: it leases its
// partitions, no other process claims without a lease, and it knows the
// safe id.
func (s *Store) trusted() bool {
	return s.claimer != "" && !s.foreign.Load() && !s.noFloor.Load()
}

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
	// ExcludedFrom is the lowest id in flight of ExcludeKeys. Their
	// pending rows lie above their rows in flight, so the rows a claim
	// passes over lie above it: claims read them again from there once
	// their keys are free, not from where the claim began. Zero: from
	// where it began.
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
}

// KeyedRow is a claimed row's key and id.
type KeyedRow struct {
	Key string
	ID  int64
}

// Claim is a batch of rows locked by one open transaction. Finish it with
// Complete or Release.
type Claim struct {
	store *Store
	tx    pgx.Tx
	// Records are the claimed rows in id order. For each key they are the
	// oldest rows that still hold it, consecutive: no other row of the key
	// comes before or between them.
	Records []Record
	// Now is the database clock at the claim.
	Now time.Time
	// Claimed counts the rows locked, before rows were held back for their
	// key; a claim that reached its limit suggests more rows are ready.
	Claimed int

	start    claimStart
	partLo   int
	partHi   int
	keyFloor int64          // the key check reads pending rows from it
	held     []int64        // the ids of Records as claimed, in order
	waited   map[int64]bool // the ids of Records claimed because they waited and are due
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

	behindLeases []behindLease // rows deferred behind leased rows
	firstSkipped int64         // the lowest of the Skipped rows
}

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
	now := time.Now()
	c.start = s.floors.begin(now, p.ExcludeTopics, trusted, &s.parts)
	lo, hi := c.start.partLo, c.start.partHi
	if !c.start.partsOK {
		// No partitions to claim (yet): an empty claim.
		s.floors.claimed(c.start, claimResult{none: true})
		if err := c.tx.QueryRow(ctx, "SELECT now()").Scan(&c.Now); err != nil {
			return fmt.Errorf("claim outbox rows: %w", err)
		}
		return nil
	}
	c.partLo, c.partHi = lo, hi
	recs := make([]Record, 0, p.Limit)
	seen := make(map[int64]bool, p.Limit)
	var lastFresh int64
	res, err := s.q.Claim(ctx, c.tx, outboxdb.ClaimArgs{Limit: p.Limit, PayloadCap: p.PayloadCap,
		ExcludeKeys: p.ExcludeKeys, ExcludeTopics: p.ExcludeTopics, MinID: c.start.from, MaxID: bound,
		PartLo: lo, PartHi: hi, Waited: c.start.from > 0}, func(row *outboxdb.ClaimedRow) {
		c.Claimed++
		if !row.Waited {
			lastFresh = max(lastFresh, row.ID)
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
		return fmt.Errorf("claim outbox rows: %w", err)
	}
	// Rows that waited came first: the records go in id order.
	slices.SortFunc(recs, func(a, b Record) int { return cmp.Compare(a.ID, b.ID) })
	c.Now, c.Records = res.Now, recs
	c.keyFloor = c.start.floor
	if !trusted && hasKey(recs) {
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
	for _, rec := range recs {
		if rec.ID > c.start.floor && (lowest == 0 || rec.ID < lowest) {
			lowest = rec.ID
		}
	}
	if len(recs) > 0 {
		if err := c.keepKeyOrder(ctx, p); err != nil {
			return err
		}
	}
	r := claimResult{short: c.Claimed < p.Limit, lastFresh: lastFresh, excludedTopics: p.ExcludeTopics}
	if len(p.ExcludeKeys) > 0 {
		r.passedKeys, r.passedFrom = true, max(p.ExcludedFrom-1, 0)
	}
	r.lowestHeld = lowest
	c.held = make([]int64, len(c.Records))
	for i, rec := range c.Records {
		c.held[i] = rec.ID
	}
	s.floors.claimed(c.start, r)
	return nil
}

// record makes a claimed row a Record, saying why it cannot be delivered
// as it is, if it cannot.
func record(row *outboxdb.ClaimedRow, payloadCap int) Record {
	r := Record{ID: row.ID, EventID: row.EventID, Topic: row.Topic, Key: row.Key, HasKey: row.HasKey,
		Payload: row.Payload, PayloadSize: row.PayloadSize, Headers: row.Headers, CreatedAt: row.CreatedAt,
		RetryCount: row.RetryCount, LastDelay: row.LastDelay}
	switch {
	case row.HeadersProblem != "":
		r.Undeliverable, r.UndeliverableReason = row.HeadersProblem, ReasonInvalidMessage
	case r.Payload == nil:
		r.Undeliverable = fmt.Sprintf("payload is %d bytes, above the %d-byte cap", r.PayloadSize, payloadCap)
		r.UndeliverableReason = ReasonTooLarge
	}
	return r
}

func hasKey(recs []Record) bool {
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
func (c *Claim) Complete(ctx context.Context, outcomes []Outcome) error {
	q := c.store.q
	var sent, deferIDs []int64
	var deferAt []time.Time
	var leased []int64
	var leaseFor []time.Duration
	var leaseTokens []uuid.UUID
	var fails outboxdb.Failures
	for _, o := range outcomes {
		if o.Kind == Sent {
			sent = append(sent, o.ID)
			continue
		}
		if o.Kind == Leased {
			leased = append(leased, o.ID)
			leaseTokens = append(leaseTokens, o.Token)
			leaseFor = append(leaseFor, o.Delay)
			continue
		}
		if o.Kind == Deferred && !o.Attempted {
			// Never handed to the destination: nothing to record but when
			// to look again.
			deferIDs = append(deferIDs, o.ID)
			deferAt = append(deferAt, c.Now.Add(o.Delay))
			continue
		}
		inc := int32(0)
		if o.Attempted && o.Kind != Deferred {
			inc = 1
		}
		fails.Add(o.failure(inc, o.Attempted, pgtype.UUID{}))
	}
	b := &pgx.Batch{}
	if len(sent) > 0 {
		q.QueueSent(b, sent)
	}
	if len(deferIDs) > 0 {
		q.QueueDefer(b, deferIDs, deferAt)
	}
	q.QueueFail(b, &fails, c.store.errorHistory)
	if len(leased) > 0 {
		c.LeaseExpiry = make(map[int64]time.Time, len(leased))
		q.QueueLease(b, leased, leaseTokens, leaseFor, func(id int64, until time.Time) { c.LeaseExpiry[id] = until })
	}
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
	if len(c.behindLeases) > 0 {
		c.releaseEndedLeases(ctx)
	}
	return nil
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
type LeasedWork = outboxdb.LeasedKey

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
		s.q.QueuePullForward(b, keys)
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
	c.store.floors.failed(c.start)
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

// DeleteSent deletes up to limit rows marked sent longer than retention
// ago, on one replica at a time: when another replica is cleaning up, it
// returns 0 and busy. Only rows kept with KeepSent are ever sent.
func (s *Store) DeleteSent(ctx context.Context, retention time.Duration, limit int) (deleted int64, busy bool, err error) {
	return s.maintain(ctx, "delete sent rows", s.q.DeleteSent, retention, limit)
}

// DeleteExpiredDeadLetters deletes up to limit dead-lettered rows
// dead-lettered longer than retention ago, on one replica at a time like
// DeleteSent. A row that parks its key is kept: deleting it would release
// the key without anyone deciding to.
func (s *Store) DeleteExpiredDeadLetters(ctx context.Context, retention time.Duration, limit int) (deleted int64, busy bool, err error) {
	return s.maintain(ctx, "delete expired dead letters", s.q.DeleteExpiredDeadLetters, retention, limit)
}

// DeleteDiscarded deletes up to limit rows discarded longer than retention
// ago, like DeleteSent.
func (s *Store) DeleteDiscarded(ctx context.Context, retention time.Duration, limit int) (deleted int64, busy bool, err error) {
	return s.maintain(ctx, "delete discarded rows", s.q.DeleteDiscarded, retention, limit)
}

// DeleteAudit deletes up to limit audit records older than retention, like
// DeleteSent.
func (s *Store) DeleteAudit(ctx context.Context, retention time.Duration, limit int) (deleted int64, busy bool, err error) {
	return s.maintain(ctx, "delete audit records", s.q.DeleteAudit, retention, limit)
}

// TopicBacklog is what waits for delivery on one topic.
type TopicBacklog = outboxdb.TopicBacklog

// Backlog reports the pending rows of every topic that has some. It reads
// every pending row: call it every few seconds at most.
func (s *Store) Backlog(ctx context.Context) ([]TopicBacklog, error) {
	out, err := s.q.Backlog(ctx, s.pool)
	if err != nil {
		return nil, fmt.Errorf("measure the backlog: %w", err)
	}
	return out, nil
}

// maintain runs a bounded maintenance statement under the maintenance
// lock, which one replica holds at a time.
func (s *Store) maintain(ctx context.Context, what string,
	run func(context.Context, outboxdb.DB, time.Duration, int) (int64, error), retention time.Duration, limit int) (int64, bool, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("%s: begin: %w", what, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	locked, err := s.q.TryMaintenanceLock(ctx, tx, s.lockID)
	if err != nil {
		return 0, false, fmt.Errorf("%s: lock: %w", what, err)
	}
	if !locked {
		return 0, true, nil
	}
	n, err := run(ctx, tx, retention, limit)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("%s: commit: %w", what, err)
	}
	return n, false, nil
}

func joinProblems(p []string) string { return strings.Join(p, "; ") }

// storable makes an error text fit a text column: valid UTF-8 without NUL
// (a destination's response can contain anything).
func storable(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// truncate shortens s to at most n bytes without splitting a character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
