// Package fleet keeps the state that a relay's replicas share, in three
// small tables of one outbox schema (migration 12): the live replicas,
// each destination's breaker, and each replica's share of a destination's
// in-flight limit. It implements relay.Fleet: a replica syncs every
// interval in one short transaction that renews its lease, forgets
// replicas whose lease ended, writes what its breakers learnt and reads
// the fleet's state back.
//
// The rules live here, applied under the destination rows' locks:
//   - The first replica whose breaker opens opens the fleet's; the others
//     adopt it. Only the replica holding the probe may reopen or close it.
//   - After the cool-down, one replica at a time holds the probe, on a
//     lease it renews at every sync; a replica that dies loses it when its
//     lease ends.
//   - A destination's in-flight limit is split evenly among the live
//     replicas, each keeping what it used above its part while no one
//     wants more. While some want more slots (rows waited for one), those
//     that want none keep what they used and lend the rest, which those
//     that want split. A replica grows only into
//     slots no one holds, and the fleet records for it at least what it
//     may be using (its floor), so the shares never add up to more than
//     the limit while the replicas are in touch.
package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/relay"
)

// Store is the fleet's state in one schema.
type Store struct {
	pool *pgxpool.Pool
	q    outboxdb.Fleet
}

// New returns the Store of the coordination tables in schemaName on pool.
// The caller keeps the pool.
func New(pool *pgxpool.Pool, schemaName string) (*Store, error) {
	q, err := outboxdb.NewFleet(schemaName)
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, q: q}, nil
}

// Leave implements relay.Fleet: the replica's row goes, its shares with
// it, and the probes it held are free.
func (s *Store) Leave(ctx context.Context, replica string) error {
	var b pgx.Batch
	b.Queue(s.q.Leave, replica)
	b.Queue(s.q.Release, replica)
	if err := s.pool.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("leave the fleet: %w", err)
	}
	return nil
}

// breakerRow is a destination's row of outbox_fleet_breakers.
type breakerRow struct {
	open       bool
	openUntil  time.Time
	streak     int
	generation int64
	probeBy    string
	probeUntil time.Time
	lastError  string
}

// Sync implements relay.Fleet.
func (s *Store) Sync(ctx context.Context, req relay.FleetSync) (relay.FleetView, error) {
	var view relay.FleetView
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		view, err = s.sync(ctx, tx, req)
		return err
	})
	if err != nil {
		return relay.FleetView{}, fmt.Errorf("fleet sync: %w", err)
	}
	return view, nil
}

func (s *Store) sync(ctx context.Context, tx pgx.Tx, req relay.FleetSync) (relay.FleetView, error) {
	names := make([]string, len(req.Destinations))
	for i, d := range req.Destinations {
		names[i] = d.Name
	}
	var b pgx.Batch
	var view relay.FleetView
	var rank int
	var left int64
	renew := req.RenewBelow
	if renew <= 0 {
		renew = req.Lease // every sync
	}
	b.Queue(s.q.Heartbeat, req.Replica, req.Lease.Microseconds(), renew.Microseconds())
	b.Queue(s.q.Forget)
	b.Queue(s.q.Members, req.Replica).QueryRow(func(row pgx.Row) error {
		return row.Scan(&view.Replicas, &rank, &view.Unleased, &view.Now, &left)
	})
	b.Queue(s.q.Ensure, names)
	rows := map[string]breakerRow{}
	b.Queue(s.q.Breakers, names).Query(func(rs pgx.Rows) error {
		for rs.Next() {
			var name string
			var r breakerRow
			if err := rs.Scan(&name, &r.open, &r.openUntil, &r.streak, &r.generation, &r.probeBy, &r.probeUntil, &r.lastError); err != nil {
				return err
			}
			rows[name] = r
		}
		return rs.Err()
	})
	held := map[string]int{}
	others := map[string]Demand{}
	b.Queue(s.q.Shares, names, req.Replica).Query(func(rs pgx.Rows) error {
		for rs.Next() {
			var name string
			var n int
			var d Demand
			if err := rs.Scan(&name, &n, &d.IdleHeld, &d.Wanting, &d.WantingBefore); err != nil {
				return err
			}
			held[name], others[name] = n, d
		}
		return rs.Err()
	})
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return view, err
	}
	view.Left = time.Duration(left) * time.Microsecond

	var writes pgx.Batch
	var shareNames []string
	var shareSlots []int32
	var shareWants []bool
	view.Destinations = make([]relay.FleetBreaker, len(req.Destinations))
	for i, d := range req.Destinations {
		r, ok := rows[d.Name]
		if !ok {
			return view, fmt.Errorf("destination %s has no breaker row", d.Name)
		}
		if apply(&r, d, req, view.Now) {
			writes.Queue(s.q.Update, d.Name, r.open, r.openUntil, r.streak, r.generation, r.probeBy, r.probeUntil, r.lastError, req.Replica)
		}
		v := relay.FleetBreaker{Generation: r.generation, Open: r.open, Streak: r.streak, LastError: r.lastError,
			Probe: r.probeBy == req.Replica}
		if r.open {
			v.OpenUntil = r.openUntil
		}
		if d.MaxInFlight > 0 {
			demand := others[d.Name]
			demand.Wants, demand.Used = d.Wants, d.Used
			v.Slots = Share(d.MaxInFlight, view.Replicas, rank, held[d.Name], demand)
			v.OthersWant = demand.Wanting > 0
			shareNames, shareSlots = append(shareNames, d.Name), append(shareSlots, int32(max(v.Slots, d.Floor)))
			shareWants = append(shareWants, d.Wants)
		}
		view.Destinations[i] = v
	}
	if len(shareNames) > 0 {
		writes.Queue(s.q.Share, shareNames, req.Replica, shareSlots, shareWants)
	}
	if writes.Len() > 0 {
		if err := tx.SendBatch(ctx, &writes).Close(); err != nil {
			return view, err
		}
	}
	return view, nil
}

// apply applies one replica's report on a destination to its row at now,
// and reports whether the row changed.
func apply(r *breakerRow, d relay.FleetDestination, req relay.FleetSync, now time.Time) bool {
	changed := false
	mine := r.probeBy == req.Replica
	if r.probeBy != "" && !now.Before(r.probeUntil) {
		// The holder's lease ended: the probe is free.
		r.probeBy, mine, changed = "", false, true
	}
	switch d.Event {
	case relay.FleetOpened:
		// The first to open opens the fleet's breaker; once open, only
		// the probe's holder reopens it (its probe failed).
		if !r.open || mine {
			r.open, r.openUntil, r.streak, r.lastError = true, now.Add(d.Cooldown), d.Streak, d.LastError
			r.generation++
			r.probeBy, mine, changed = "", false, true
		}
	case relay.FleetClosed:
		if r.open && mine {
			r.open, r.streak = false, 0
			r.generation++
			r.probeBy, mine, changed = "", false, true
		}
	}
	if d.Probe && r.open && !now.Before(r.openUntil) && (r.probeBy == "" || mine) {
		r.probeBy, r.probeUntil, changed = req.Replica, now.Add(req.Lease), true
	}
	return changed
}

// Demand is what a replica's rows asked of a destination's slots since
// its last sync, and what the others' did, as they last recorded.
type Demand struct {
	// Wants: rows waited for a slot.
	Wants bool
	// Used is the most slots in use at once.
	Used int
	// Wanting is how many other replicas want more, WantingBefore how
	// many of them come before this one by name, and IdleHeld what the
	// others that want none hold.
	Wanting, WantingBefore, IdleHeld int
}

// Share is what a replica may have in flight of limit, among replicas
// live replicas, the rank-th by name, while the others hold others. While
// no replica wants more, an even split, the remainder to the first, or
// what the replica used if more (a replica that borrowed slots keeps them
// while its rows fit, rather than handing them to replicas without rows
// and asking again at the next sync). While
// some do, those that want none keep what they used (never more than the
// even split; none when they used none: a small limit split among many
// replicas would otherwise stay idle where no rows are), and those that
// want split the rest evenly, the remainder to the first of them. Either way
// only slots that the others do not hold. What the fleet records for the
// replica is at least what it may be using (its floor), so that a share
// shrinks in two syncs: the replica first stops taking more, then the
// fleet records the smaller share; a lender's rows that want slots again
// get their part within two syncs of the borrowers'.
func Share(limit, replicas, rank, others int, d Demand) int {
	replicas = max(replicas, 1)
	fair := limit / replicas
	if rank < limit%replicas {
		fair++
	}
	free := max(0, limit-others)
	switch {
	case d.Wants:
		pool, n := max(0, limit-d.IdleHeld), 1+d.Wanting
		part := pool / n
		if d.WantingBefore < pool%n {
			part++
		}
		return min(max(part, 0), free)
	case d.Wanting == 0:
		return min(max(fair, d.Used), free)
	default:
		return min(fair, free, d.Used)
	}
}

// ReplicaShare is a live replica's share of a destination's in-flight limit.
type ReplicaShare struct {
	Replica string
	Slots   int
	// Wants says rows of the replica waited for a slot at its last sync.
	Wants bool
}

// Shares returns each live replica's share of destination's in-flight
// limit, by replica name.
func (s *Store) Shares(ctx context.Context, destination string) ([]ReplicaShare, error) {
	rows, err := s.pool.Query(ctx, s.q.DestinationShares, destination)
	if err != nil {
		return nil, fmt.Errorf("read the fleet's shares: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReplicaShare, error) {
		var sh ReplicaShare
		err := row.Scan(&sh.Replica, &sh.Slots, &sh.Wants)
		return sh, err
	})
}
