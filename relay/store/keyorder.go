package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// keepKeyOrder drops the claimed rows that an earlier row of their key
// and order scope, outside the claim and p.Follows, must precede, and
// defers them when that row is waiting rather than in flight. The rows
// followed are checked as if claimed: they are no blockers, and what
// holds them back holds back the claimed rows of their keys and scopes
// too.
func (c *Claim) keepKeyOrder(ctx context.Context, p ClaimParams) error {
	keys, ids := c.checkedRows(p.Follows)
	if len(keys) == 0 {
		return nil
	}
	bs, err := c.blockers(ctx, p, keys, ids)
	if err != nil || len(bs.lowest) == 0 {
		return err
	}
	free, err := c.probeFirsts(ctx, bs)
	if err != nil {
		return err
	}
	h := c.holdBack(bs, free)
	if c.store.holdingBack != nil {
		c.store.holdingBack()
	}
	return h.write(ctx, c)
}

// checkedRows are the keys and ids the key check looks past: the claimed
// keyed rows, after the followed rows of their keys (the span's end is
// the last id).
func (c *Claim) checkedRows(follows []KeyedRow) (keys []string, ids []int64) {
	for _, r := range c.Records {
		if r.HasKey {
			keys = append(keys, r.Key)
			ids = append(ids, r.ID)
		}
	}
	if len(keys) == 0 || len(follows) == 0 {
		return keys, ids
	}
	claimed := make(map[string]bool, len(keys))
	for _, k := range keys {
		claimed[k] = true
	}
	var fk []string
	var fi []int64
	for _, f := range follows {
		if claimed[f.Key] {
			fk = append(fk, f.Key)
			fi = append(fi, f.ID)
		}
	}
	return append(fk, keys...), append(fi, ids...)
}

// blockerSet is the lowest blocker of each claimed key and order scope.
type blockerSet struct {
	lowest map[scopedKey]blocker
	scope  scopes
}

// of is the lowest blocker of a claimed row: of its scope, or of every
// scope.
func (bs blockerSet) of(r *sink.Record) (blocker, bool) {
	b, ok := bs.lowest[scopedKey{r.Key, bs.scope.of(r.Topic)}]
	if all, held := bs.lowest[scopedKey{r.Key, EveryScope}]; held && (!ok || all.id < b.id) {
		return all, true
	}
	return b, ok
}

// blockers reads the rows outside the claim that hold its keys.
func (c *Claim) blockers(ctx context.Context, p ClaimParams, keys []string, ids []int64) (blockerSet, error) {
	last := ids[len(ids)-1]
	// The span's entries of other processes' partitions are skipped on
	// the index, without a look at their rows: only the claim's own
	// partitions' share of the span weighs.
	span := (last - c.keyFloor + 1) * int64(c.partHi-c.partLo+1) / Partitions
	holders, err := c.store.q.Holders(ctx, c.tx, outboxdb.HoldersArgs{Keys: keys, IDs: ids, Floor: c.keyFloor,
		PartLo: c.partLo, PartHi: c.partHi, BySpan: c.store.keyCheck.bySpan(span, keys), Scoped: p.OrderScope != nil})
	if err != nil {
		return blockerSet{}, fmt.Errorf("check key order: %w", err)
	}
	excluded := make(map[string]bool, len(p.ExcludeTopics))
	for _, t := range p.ExcludeTopics {
		excluded[t] = true
	}
	bs := blockerSet{lowest: map[scopedKey]blocker{}, scope: newScopes(p.OrderScope)}
	for _, h := range holders {
		sk := scopedKey{h.Key, bs.scope.of(h.Topic)}
		if b, seen := bs.lowest[sk]; seen && b.id < h.ID {
			continue // only the lowest blocker of the key's scope counts
		}
		b := blocker{id: h.ID, waiting: h.Parked || h.Waiting, parked: h.Parked, leased: h.Leased && h.Waiting, until: h.NextAttemptAt}
		switch {
		case h.Parked:
			b.until = c.Now.Add(ParkedRecheck)
		case !h.Waiting && excluded[h.Topic]:
			b.waiting, b.until = true, c.Now.Add(max(p.ExcludeFor, time.Millisecond))
		}
		bs.lowest[sk] = b
	}
	return bs, nil
}

// probeFirsts returns which blockers are free: rows that waited come back
// by when they are due, not in id order, so a key's later row can be due
// before its first, which then holds it back while free, not in flight
// elsewhere, and would be passed over again by every claim that takes the
// later row first. Such a row is deferred for a moment, after its first:
// the next claim takes that.
func (c *Claim) probeFirsts(ctx context.Context, bs blockerSet) (map[int64]bool, error) {
	var probe []int64
	probed := map[int64]bool{}
	for _, r := range c.Records {
		if !r.HasKey {
			continue
		}
		if b, ok := bs.of(&r); ok && r.ID > b.id && !b.waiting && c.waited[r.ID] && !probed[b.id] {
			probe = append(probe, b.id)
			probed[b.id] = true
		}
	}
	if len(probe) == 0 {
		return nil, nil
	}
	// The probe locks rows the claim does not hold: the floor must cover
	// them first (see floors.hold).
	c.probedLow = slices.Min(probe)
	c.store.floors.hold(c.start.gen, c.probedLow-1)
	free, err := c.freeRows(ctx, probe)
	if err != nil {
		return nil, fmt.Errorf("check key order: %w", err)
	}
	return free, nil
}

// heldBack are the rows a claim defers behind their keys' blockers.
type heldBack struct {
	deferIDs, parkedIDs []int64
	deferAt, parkedAt   []time.Time
	parkers             []int64
}

// holdBack drops from the claim the rows their blockers hold back: behind
// a parked or waiting row, or a free one, they are deferred; behind a row
// in flight elsewhere, skipped and left ready.
func (c *Claim) holdBack(bs blockerSet, free map[int64]bool) heldBack {
	var h heldBack
	kept := c.Records[:0]
	for _, r := range c.Records {
		var b blocker
		ok := false
		if r.HasKey {
			b, ok = bs.of(&r)
		}
		// A blocker above the row (the key check by span may find one)
		// does not hold it back.
		if !ok || r.ID < b.id {
			kept = append(kept, r)
			continue
		}
		switch {
		case b.parked:
			h.parkedIDs = append(h.parkedIDs, r.ID)
			h.parkedAt = append(h.parkedAt, b.until)
			h.parkers = append(h.parkers, b.id)
			c.Deferred++
		case b.waiting:
			h.deferIDs = append(h.deferIDs, r.ID)
			h.deferAt = append(h.deferAt, b.until)
			c.Deferred++
			c.deferrals = append(c.deferrals, deferral{id: r.ID, key: r.Key, until: b.until})
			if b.leased {
				c.behindLeases = append(c.behindLeases, behindLease{id: r.ID, lease: b.id, until: b.until})
			}
		case free[b.id]:
			h.deferIDs = append(h.deferIDs, r.ID)
			h.deferAt = append(h.deferAt, later(b.until.Add(time.Microsecond), c.Now.Add(behindFreeFor)))
			c.Deferred++
		default:
			// A row below the floor waited, and is still on the waiting
			// rows' index: only one above it needs finding again.
			if c.firstSkipped == 0 && r.ID > c.start.floor {
				c.firstSkipped = r.ID
			}
			if c.Skipped == 0 || c.SkippedKeys[len(c.SkippedKeys)-1] != r.Key {
				c.SkippedKeys = append(c.SkippedKeys, r.Key)
			}
			c.Skipped++
		}
	}
	c.Records = kept
	return h
}

// write defers the rows held back, in the claim's transaction.
func (h heldBack) write(ctx context.Context, c *Claim) error {
	if len(h.deferIDs) > 0 {
		if err := c.store.q.Defer(ctx, c.tx, h.deferIDs, h.deferAt); err != nil {
			return fmt.Errorf("defer rows behind a waiting key: %w", err)
		}
	}
	if len(h.parkedIDs) > 0 {
		if err := c.store.q.DeferParked(ctx, c.tx, h.parkedIDs, h.parkedAt, h.parkers); err != nil {
			return fmt.Errorf("defer rows behind a parked key: %w", err)
		}
	}
	return nil
}

// scopedKey is a key within an order scope: the rows that keep their
// order among themselves.
type scopedKey struct{ key, scope string }

// scopes names the order scopes of topics, remembering the answers.
type scopes struct {
	of func(topic string) string
}

func newScopes(f func(topic string) string) scopes {
	if f == nil {
		return scopes{of: func(string) string { return "" }}
	}
	seen := map[string]string{}
	return scopes{of: func(topic string) string {
		s, ok := seen[topic]
		if !ok {
			s = f(topic)
			seen[topic] = s
		}
		return s
	}}
}

// behindFreeFor is how long a row that waited is deferred behind a row of
// its key that is due and free: long enough for the next claim to take
// that one first.
const behindFreeFor = 50 * time.Millisecond

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// freeRows returns which of ids no other transaction has locked, without
// keeping their locks: a savepoint takes them and gives them back.
func (c *Claim) freeRows(ctx context.Context, ids []int64) (map[int64]bool, error) {
	b := &pgx.Batch{}
	b.Queue(outboxdb.FreeRowsSavepoint)
	b.Queue(c.store.q.Server().FreeRows, ids)
	res := c.tx.SendBatch(ctx, b)
	free := map[int64]bool{}
	_, err := res.Exec()
	if err == nil {
		var rows pgx.Rows
		if rows, err = res.Query(); err == nil {
			var id int64
			_, err = pgx.ForEachRow(rows, []any{&id}, func() error {
				free[id] = true
				return nil
			})
		}
	}
	if err = errors.Join(err, res.Close()); err != nil {
		return nil, err
	}
	if c.store.probing != nil {
		c.store.probing()
	}
	_, err = c.tx.Exec(ctx, outboxdb.FreeRowsRollback)
	return free, err
}

// keyCheckForm is how a claim's key check looks for blockers.
type keyCheckForm int

const (
	keyCheckAuto keyCheckForm = iota
	keyCheckBySpan
	keyCheckByKey
)

// spanEntriesPerKey is how many entries of the span the key check reads
// for the price of one key's probe. A probe, a descent of the key index,
// costs about 6 µs, and an entry along the pending index about 0.7 µs
// (claims of 1000 rows and 1000 keys): some 8 entries. Half that makes
// the span the choice only where it is clearly the cheaper.
const spanEntriesPerKey = 4

// bySpan says whether to read the claim's id span, span ids wide, rather
// than probe each of the claimed keys (one per claimed keyed row). Both
// read the claimed rows' entries; the span reads the rows passed over
// too, and the probes descend the key index once a key. Keys are counted
// only as far as the answer needs: a hash of 1000 keys costs more than
// the rest of the choice.
func (f keyCheckForm) bySpan(span int64, keys []string) bool {
	switch f {
	case keyCheckBySpan:
		return true
	case keyCheckByKey:
		return false
	}
	passed := span - int64(len(keys)) // at most, the rows passed over
	if passed <= 0 {
		return true
	}
	// The distinct keys whose probes would cost more than the rows passed.
	need := (passed + spanEntriesPerKey - 1) / spanEntriesPerKey
	if need > int64(len(keys)) {
		return false
	}
	seen := make(map[string]struct{}, need)
	for _, k := range keys {
		seen[k] = struct{}{}
		if int64(len(seen)) >= need {
			return true
		}
	}
	return false
}

// blocker is the lowest row outside a claim that holds a claimed key.
type blocker struct {
	id      int64
	waiting bool      // parked or not yet due, rather than in flight
	parked  bool      // a dead letter that parks the key
	leased  bool      // being delivered under a lease
	until   time.Time // when its rows may be looked at again
}

// behindLease is a row a claim deferred to the end of a leased row's lease.
type behindLease struct {
	id, lease int64
	until     time.Time
}

// releaseEndedLeases, once a claim has committed, makes ready the rows it
// deferred behind leases that have ended meanwhile. A lease's write-back
// pulls forward the rows deferred behind it, but one that ran between the
// claim's key check and its commit could not see them, and they would
// wait for the whole lease. Now either the write-back comes after the
// commit and finds them, or it is over (waited for, if under way) and this
// finds it over. Best effort: if it fails, the rows wait for the lease's
// end, as they would have.
func (c *Claim) releaseEndedLeases(ctx context.Context) {
	over := map[int64]bool{}
	var ids []int64
	var at []time.Time
	for _, b := range c.behindLeases {
		ended, seen := over[b.lease]
		if !seen {
			still, err := c.store.q.StillLeased(ctx, c.store.pool, b.lease, b.until)
			if err != nil {
				return
			}
			ended = !still
			over[b.lease] = ended
		}
		if ended {
			ids = append(ids, b.id)
			at = append(at, b.until)
		}
	}
	if len(ids) > 0 {
		_ = c.store.q.LeaseOver(ctx, c.store.pool, ids, at)
	}
}
