package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// Partitions is how many partitions the outbox's rows fall into, by a hash
// of their key (by id without one): outbox_partition in migration 16. A
// key's rows are all in one.
const Partitions = 16

// DefaultClaimLease is how long a process's hold on its partitions lasts
// without a sync; ClaimSyncEvery how often the relay syncs; SweepEvery how
// often it looks below its floor for rows given ids out of order.
const (
	DefaultClaimLease = 5 * time.Second
	ClaimSyncEvery    = time.Second
	SweepEvery        = 10 * time.Minute
)

// A process renews its registration once less than renewShare of its
// lease is left, and records its partitions, with its floor, every
// recordEvery while they stay its own: each write leaves a row version
// that a snapshot held elsewhere keeps, and every sync reads them, so a
// sync that wrote every time would cost more by the minute such a
// snapshot is held. A floor recorded a few seconds late only has the next
// owner start a little lower. The lease recorded in a partition (for
// relays that read it there, not from its owner's registration) outlasts
// the next record.
const (
	renewShare  = 3 / 5.0
	recordEvery = 10 * time.Second
)

// partitionSet is the store's share of the outbox's partitions.
//
// Each process that claims (a Store with a Claimer) registers in
// outbox_claimers and, at every sync, leases the contiguous range of
// partitions its rank among the live claimers gives it: the i-th of n
// takes [16i/n, 16(i+1)/n). It renews what it holds, gives up what it
// holds outside its range once no claim of it is in flight, and takes
// what is free in its range: partitions given up, or whose owner's lease
// ran out. Its claims read only the partitions it holds in its range
// (their longest contiguous run, while others hand theirs over), and
// only until its lease would end without a sync.
//
// A key's rows are all in one partition, so no other process has rows of
// the keys a process claims in flight, and its floor bounds its key
// checks. A partition given up keeps the giver's floor, where its next
// owner starts; one whose owner vanished keeps the floor it last
// recorded, and its next owner also reads from there until that owner's
// locks must have ended. One that comes back into the range before it was
// given up is read again from where claims stopped reading it.
type partitionSet struct {
	mu       sync.Mutex
	owned    [Partitions]bool
	lo, hi   int       // the range claims read, inclusive; lo > hi for none
	until    time.Time // claims stop then without a sync
	recorded time.Time // when the partitions held were last all written
	open     map[uint64][2]int
	synced   bool
	claimers int // live claimers at the last sync
	// leaving are the partitions held but no longer claimed, with the
	// floor when claims stopped reading them: their next owner starts
	// there.
	leaving map[int]int64
	// unread are the partitions held that claims do not read (yet): taken
	// but outside the run claims read, or left out of it since. Claims
	// read each from its floor once it joins the run.
	unread map[int]unreadPart
}

// unreadPart is where claims must read a partition from once they read
// it, and until when its last owner's locks may last.
type unreadPart struct {
	floor int64
	until time.Time
}

// floorOf is where the next owner of part, held by the store, must start
// when the store's floor is floor.
func (p *partitionSet) floorOf(part int, floor int64) int64 {
	if u, ok := p.unread[part]; ok {
		return min(floor, u.floor)
	}
	return floor
}

// claimRange is the range of partitions a claim at now reads, registered
// as the claim gen's until release; ok is false when the store holds
// none.
func (p *partitionSet) claimRange(gen uint64, now time.Time) (lo, hi int, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lo > p.hi || now.After(p.until) {
		return 0, 0, false
	}
	if p.open == nil {
		p.open = map[uint64][2]int{}
	}
	p.open[gen] = [2]int{p.lo, p.hi}
	return p.lo, p.hi, true
}

// release ends claim gen's hold on its range.
func (p *partitionSet) release(gen uint64) {
	p.mu.Lock()
	delete(p.open, gen)
	p.mu.Unlock()
}

// inFlight reports whether a claim in flight reads partition part.
func (p *partitionSet) inFlight(part int) bool {
	for _, r := range p.open {
		if part >= r[0] && part <= r[1] {
			return true
		}
	}
	return false
}

// Share is a store's share of the outbox's partitions after its last
// sync.
type Share struct {
	Leased   bool // the store leases partitions at all
	Claimers int  // processes that claimed the outbox's partitions
	Lo, Hi   int  // the partitions its claims read, inclusive; Lo > Hi for none
	// Giving is how many partitions it still holds outside its range,
	// to give up once no claim of it is in flight: sync again soon.
	Giving int
}

// Share reports the store's share of the outbox's partitions.
func (s *Store) Share() Share {
	if s.claimer == "" {
		return Share{Lo: 0, Hi: Partitions - 1}
	}
	s.parts.mu.Lock()
	defer s.parts.mu.Unlock()
	return Share{Leased: true, Claimers: s.parts.claimers, Lo: s.parts.lo, Hi: s.parts.hi, Giving: len(s.parts.leaving)}
}

// SyncPartitions renews the store's registration and its lease on its
// partitions, gives up those outside its share and takes those free in
// it. Run it every ClaimSyncEvery, soon again while it has partitions to
// give up (Share.Giving), and when a PartitionsNotice arrives; a Store
// claims nothing before its first sync. A sync that joins, sees the
// claimers change, or gives partitions up sends that notice on the
// outbox's channel, so that the others give up or take theirs at once
// rather than at their next sync. Without a Claimer it does nothing: the
// store claims every partition and trusts no floor.
func (s *Store) SyncPartitions(ctx context.Context) error {
	if s.claimer == "" {
		return nil
	}
	start := time.Now()
	floor := s.floors.floor()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("sync the outbox's partitions: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	joined, err := s.q.JoinClaimers(ctx, tx, s.claimer, s.lease, time.Duration(float64(s.lease)*renewShare))
	if err != nil {
		return fmt.Errorf("sync the outbox's partitions: %w", err)
	}
	claimers, rows := joined.Live, joined.Partitions
	rank := slices.Index(claimers, s.claimer)
	if rank < 0 || len(rows) != Partitions {
		return fmt.Errorf("sync the outbox's partitions: found %d partitions and this process among %d claimers at %d: run 'outbox-relay migrate up'",
			len(rows), len(claimers), rank)
	}
	lo, hi := rank*Partitions/len(claimers), (rank+1)*Partitions/len(claimers)-1

	var parts []int
	var owners []string
	var floors []int64
	var owned [Partitions]bool
	var taken = map[int]unreadPart{} // partitions taken: where to read from
	var givenUp []int
	var takenFloors []int64
	s.parts.mu.Lock()
	// A partition is written when its owner changes, when its floor must
	// go down, and with the others when their record is due.
	due := start.Sub(s.parts.recorded) >= recordEvery
	record := func(r outboxdb.PartitionRow, owner string, floor int64) {
		if due || owner != r.Owner || floor < r.Floor {
			parts, owners, floors = append(parts, r.Part), append(owners, owner), append(floors, floor)
		}
	}
	heldNone := s.parts.owned == [Partitions]bool{}
	announce := !s.parts.synced || len(claimers) != s.parts.claimers
	if s.parts.leaving == nil {
		s.parts.leaving = map[int]int64{}
	}
	for _, r := range rows {
		mine := r.Owner == s.claimer
		inRange := r.Part >= lo && r.Part <= hi
		left, wasLeaving := s.parts.leaving[r.Part]
		if mine && !inRange {
			// Claims stop reading it now; its floor stays where it is.
			if _, ok := s.parts.leaving[r.Part]; !ok {
				s.parts.leaving[r.Part] = s.parts.floorOf(r.Part, floor)
				delete(s.parts.unread, r.Part)
			}
		} else {
			delete(s.parts.leaving, r.Part)
		}
		switch {
		case mine && inRange && wasLeaving:
			// Back in range before it was given up: claims stopped
			// reading it when it left, and read it again from there.
			// Recorded now: the sync may fail after it forgot that it
			// was leaving.
			from := min(left, s.parts.floorOf(r.Part, floor))
			record(r, s.claimer, from)
			owned[r.Part] = true
			taken[r.Part] = unreadPart{floor: from}
			if s.parts.unread == nil {
				s.parts.unread = map[int]unreadPart{}
			}
			s.parts.unread[r.Part] = unreadPart{floor: from}
		case mine && inRange:
			record(r, s.claimer, s.parts.floorOf(r.Part, floor))
			owned[r.Part] = true
		case mine && s.parts.inFlight(r.Part):
			// Given up once no claim reads it.
			record(r, s.claimer, s.parts.leaving[r.Part])
		case mine:
			// Its floor is forgotten once it is written free: a sync
			// that fails before then gives it up with the same floor.
			record(r, "", s.parts.leaving[r.Part])
			givenUp = append(givenUp, r.Part)
			announce = true
		case inRange && (r.Owner == "" || r.Expired):
			record(r, s.claimer, r.Floor) // a new owner: always written
			owned[r.Part] = true
			// Rows of a partition taken can be ready anywhere above its
			// floor. A lapsed owner's locks may last until its
			// transactions time out.
			u := unreadPart{floor: r.Floor}
			if r.Owner != "" {
				u.until = start.Add(s.lapse)
			}
			taken[r.Part] = u
			takenFloors = append(takenFloors, r.Floor)
		}
	}
	// Claims read the longest run of partitions held in the range.
	bestLo, bestHi := 0, -1
	for i := lo; i <= hi; {
		if !owned[i] {
			i++
			continue
		}
		j := i
		for j+1 <= hi && owned[j+1] {
			j++
		}
		if j-i > bestHi-bestLo {
			bestLo, bestHi = i, j
		}
		i = j + 1
	}
	// What leaves the run leaves it now, before the partitions given up
	// are written: a claim that begins after this cannot read one that
	// another process takes meanwhile. A claim that began before is in
	// flight, and holds its partitions until it ends. What joins the run
	// joins it once written, with its marks (below).
	keepLo, keepHi := max(s.parts.lo, bestLo), min(s.parts.hi, bestHi)
	if s.parts.unread == nil {
		s.parts.unread = map[int]unreadPart{}
	}
	for part := s.parts.lo; part <= s.parts.hi; part++ {
		if (part < keepLo || part > keepHi) && owned[part] {
			if _, ok := s.parts.unread[part]; !ok {
				// Claims stop reading it: from here when they read it again.
				s.parts.unread[part] = unreadPart{floor: floor}
			}
		}
	}
	if keepLo > keepHi {
		keepLo, keepHi = 0, -1
	}
	s.parts.lo, s.parts.hi = keepLo, keepHi
	s.parts.mu.Unlock()
	if len(parts) > 0 {
		if err := s.q.WritePartitions(ctx, tx, parts, owners, floors, s.lease+2*recordEvery); err != nil {
			return fmt.Errorf("sync the outbox's partitions: %w", err)
		}
	}
	if announce {
		// Sent at commit, to every process listening on the channel.
		if _, err := tx.Exec(ctx, outboxdb.Notify, s.tableName, PartitionsNotice); err != nil {
			return fmt.Errorf("sync the outbox's partitions: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("sync the outbox's partitions: commit: %w", err)
	}
	if s.partitionsWritten != nil {
		s.partitionsWritten()
	}

	// The run changes under the floors' lock, with the marks of the
	// partitions it gains: a claim that reads a partition has them in its
	// floor (its key check reads from there), and one that does not
	// cannot clear them.
	s.floors.mu.Lock()
	defer s.floors.mu.Unlock()
	s.parts.mu.Lock()
	if s.parts.unread == nil {
		s.parts.unread = map[int]unreadPart{}
	}
	maps.Copy(s.parts.unread, taken)
	for _, part := range givenUp {
		delete(s.parts.leaving, part)
	}
	now := s.floors.floorLocked()
	var read []unreadPart
	for part := range Partitions {
		was := s.parts.owned[part] && part >= s.parts.lo && part <= s.parts.hi
		is := part >= bestLo && part <= bestHi
		u, unread := s.parts.unread[part]
		switch {
		case !owned[part]:
			delete(s.parts.unread, part)
		case is && unread:
			read = append(read, u)
			delete(s.parts.unread, part)
		case was && !is:
			// Claims stop reading it: from here when they read it again.
			s.parts.unread[part] = unreadPart{floor: now}
		}
	}
	s.parts.owned, s.parts.lo, s.parts.hi = owned, bestLo, bestHi
	// Claims stop a fifth of the lease before the registration would end
	// without a sync.
	s.parts.until = start.Add(joined.Left - s.lease/5)
	if due {
		s.parts.recorded = start
	}
	s.parts.synced, s.parts.claimers = true, len(claimers)
	s.parts.mu.Unlock()
	for _, u := range read {
		s.floors.takeOverLocked(u.floor, u.until)
	}
	if heldNone {
		s.floors.startAtLocked(takenFloors)
	}
	return nil
}

// LeavePartitions gives up the store's partitions at once, with its floor,
// and tells the others to take them: run it after the last claim.
func (s *Store) LeavePartitions(ctx context.Context) error {
	if s.claimer == "" {
		return nil
	}
	s.parts.mu.Lock()
	s.parts.lo, s.parts.hi = 0, -1
	s.parts.mu.Unlock()
	if err := s.q.LeaveClaimers(ctx, s.pool, s.claimer, s.floors.floor()); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("give up the outbox's partitions: %w", err)
	}
	if _, err := s.pool.Exec(ctx, outboxdb.Notify, s.tableName, PartitionsNotice); err != nil {
		return fmt.Errorf("tell the others the outbox's partitions are free: %w", err)
	}
	return nil
}

// SweepBelowFloor looks below the store's floor, from the table's start,
// for a pending row that never waited, and has the next claim read from
// below it. Ids are taken at insert, so none should be there: only a row
// given its id by its producer (OVERRIDING SYSTEM VALUE, or copied in by
// logical replication) below ids already delivered. It reads every index
// entry below the floor, those of delivered rows too, which a held
// snapshot keeps: run it seldom (SweepEvery). It reports whether it found
// one.
func (s *Store) SweepBelowFloor(ctx context.Context) (bool, error) {
	if !s.trusted() {
		return false, nil // claims read from the table's start already
	}
	floor := s.floors.floor()
	s.parts.mu.Lock()
	lo, hi := s.parts.lo, s.parts.hi
	s.parts.mu.Unlock()
	if lo > hi || floor == 0 {
		return false, nil
	}
	id, err := s.q.Stranded(ctx, s.pool, floor, lo, hi)
	if err != nil {
		return false, fmt.Errorf("look below the floor: %w", err)
	}
	if id == 0 {
		return false, nil
	}
	s.floors.takeOver(id-1, time.Time{})
	return true, nil
}
