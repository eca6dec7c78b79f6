package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// Hooks for the package's external tests.

var ClaimBegin = outboxdb.ClaimBegin(0)

func ClaimSQL(s *Store) string         { return statement(s, "claim") }
func HoldingBySpanSQL(s *Store) string { return statement(s, "holding_by_span") }
func HoldingByKeySQL(s *Store) string  { return statement(s, "holding_by_key") }

func statement(s *Store, name string) string {
	sql, err := s.q.Statement(name)
	if err != nil {
		panic(err)
	}
	return sql
}

// Key check forms, to force one in tests.
type KeyCheckForm = keyCheckForm

const (
	KeyCheckBySpan = keyCheckBySpan
	KeyCheckByKey  = keyCheckByKey
)

func SetKeyCheck(s *Store, f keyCheckForm) { s.keyCheck = f }
func CleanupLockID(s *Store) int64         { return s.lockID }

// HeadClaimDue makes the next claim of s start from the head, as it does
// once every HeadEvery during a backlog.
func HeadClaimDue(s *Store) {
	s.floors.mu.Lock()
	s.floors.lastHead = time.Time{}
	s.floors.mu.Unlock()
}

// Deferrals describes what an open claim did to the rows it held back:
// each pending row's next attempt, as the claim's own transaction sees
// it, with the dead letter it is parked behind, and the lease each row deferred behind one waits
// for. Times the claim computed from its clock, its Now plus one of
// offsets, are given as such ("now+5m0s"), others as they are, so that
// two claims of the same rows can be compared.
func Deferrals(ctx context.Context, c *Claim, offsets ...time.Duration) (map[int64]string, error) {
	rows, err := c.tx.Query(ctx, `SELECT id, next_attempt_at, coalesce('parked behind ' || parked_behind, '') FROM outbox WHERE status = 'pending'`)
	if err != nil {
		return nil, err
	}
	out := map[int64]string{}
	for rows.Next() {
		var id int64
		var next time.Time
		var note string
		if err := rows.Scan(&id, &next, &note); err != nil {
			rows.Close()
			return nil, err
		}
		at := next.UTC().Format(time.RFC3339Nano)
		if d := next.Sub(c.Now); slices.Contains(offsets, d) {
			at = "now+" + d.String()
		}
		out[id] = at + " " + note
	}
	for _, b := range c.behindLeases {
		out[b.id] += fmt.Sprintf(" behind lease %d", b.lease)
	}
	return out, rows.Err()
}

// NextXid reads an observation's transaction ids in a transaction of its
// own: the snapshot's xmin and the next transaction id.
func NextXid(ctx context.Context, s *Store) (xmin, next int64, err error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: s.claimBegin})
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	err = tx.QueryRow(ctx, s.q.Server().ObserveXids).Scan(&xmin, &next)
	return xmin, next, err
}

// ClaimSetting reads a setting inside a claim's transaction.
func ClaimSetting(ctx context.Context, c *Claim, name string) (string, error) {
	var v string
	err := c.tx.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	return v, err
}

// FloorState describes a store's floors and partitions.
func FloorState(s *Store) string {
	s.floors.mu.Lock()
	defer s.floors.mu.Unlock()
	s.parts.mu.Lock()
	defer s.parts.mu.Unlock()
	return fmt.Sprintf("frontier %d seen %d safe %d marks %v paused %v open %v floor %d; partitions %d-%d owned %v", s.floors.frontier, s.floors.seen,
		s.floors.safe, s.floors.marks, s.floors.paused, s.floors.open, s.floors.floorLocked(), s.parts.lo, s.parts.hi, s.parts.owned)
}

// NextClaimBounds is where the next head claim of s would read, were it
// trusted to read from its floor: above its floor, as would its key
// check, in partitions lo to hi.
func NextClaimBounds(s *Store) (floor int64, lo, hi int) {
	s.floors.mu.Lock()
	floor = s.floors.floorLocked()
	s.floors.mu.Unlock()
	s.parts.mu.Lock()
	defer s.parts.mu.Unlock()
	return floor, s.parts.lo, s.parts.hi
}

// WhileProbing has f run while a key check of s holds the locks of its
// probe for free rows.
func WhileProbing(s *Store, f func()) { s.probing = f }

// OnPartitionsWritten has f run once a sync of s has written the
// partitions it holds, before its claims read the new ones.
func OnPartitionsWritten(s *Store, f func()) { s.partitionsWritten = f }

// WhenReleasing runs f as a release of held rows makes them ready.
func WhenReleasing(s *Store, f func()) { s.releasing = f }

// BeforePulling runs f before a release of held rows pulls forward the
// rows behind them.
func BeforePulling(s *Store, f func()) { s.pulling = f }

// AfterLookingAtReleases runs f in each write-back once it has looked at
// the releases of held rows, before it writes.
func AfterLookingAtReleases(s *Store, f func()) { s.looked = f }

// WhenReleaseWaits runs f as a release of held rows waits for the
// write-backs that looked before it recorded them (under the releases'
// lock: f must not touch the store).
func WhenReleaseWaits(s *Store, f func()) { s.releases.waiting = f }

// AfterReleasing runs f once a release of held rows has made them
// ready, before it records them for the claims under way.
func AfterReleasing(s *Store, f func()) { s.released = f }

// BeforeHoldingBack runs f before a claim defers the rows its keys'
// blockers hold back.
func BeforeHoldingBack(s *Store, f func()) { s.holdingBack = f }

// RecordAtNextSync has s's next sync write every partition it holds, with
// its floor, as it does every recordEvery.
func RecordAtNextSync(s *Store) {
	s.parts.mu.Lock()
	s.parts.recorded = time.Time{}
	s.parts.mu.Unlock()
}
