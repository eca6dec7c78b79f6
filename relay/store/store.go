package store

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/internal/db/schema"
)

// ParkedRecheck is how long rows behind a parked key are deferred before
// they are looked at again. Releasing the key makes them ready at once.
const ParkedRecheck = 5 * time.Minute

// DefaultErrorHistory is the number of recent failures kept per row.
const DefaultErrorHistory = 10

// MaxErrorLen bounds last_error and each error history entry, in bytes.
const MaxErrorLen = 2048

// Config configures a Store.
type Config struct {
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
	releases releases
	safe     safeWatch
	parts    partitionSet
	claimer  string
	lease    time.Duration
	lapse    time.Duration // how long a lapsed owner's locks may last
	foreign  atomic.Bool   // a process that leases no partitions may claim
	noFloor  atomic.Bool   // the safe id cannot be known here
	noFloorN sync.Once

	probing           func() // tests: runs while a key check's probe holds its locks
	partitionsWritten func() // tests: runs once a sync has written the partitions it holds
	releasing         func() // tests: runs as a release of held rows makes them ready
	released          func() // tests: runs once a release has made held rows ready, before it records them
	pulling           func() // tests: runs before a release pulls forward the rows behind held rows
	looked            func() // tests: runs in a write-back once it looked at the releases, before it writes
	holdingBack       func() // tests: runs before a claim defers the rows its keys' blockers hold back
}

// New returns a Store on pool for cfg.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
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
type TopicBacklog struct {
	Topic string
	// Pending counts the topic's pending rows, ready or waiting.
	Pending int64
	// OldestAge is the age of its oldest pending row, by the database
	// clock.
	OldestAge time.Duration
}

// Backlog reports the pending rows of every topic that has some. It reads
// every pending row: call it every few seconds at most.
func (s *Store) Backlog(ctx context.Context) ([]TopicBacklog, error) {
	rows, err := s.q.Backlog(ctx, s.pool)
	if err != nil {
		return nil, fmt.Errorf("measure the backlog: %w", err)
	}
	out := make([]TopicBacklog, len(rows))
	for i, r := range rows {
		out[i] = TopicBacklog(r)
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
