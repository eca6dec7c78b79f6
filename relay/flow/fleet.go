package flow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Fleet is where a relay's replicas share each destination's flow
// control: its breaker (one probe at a time across the fleet), its
// in-flight limit and, by counting the live replicas, its rate limit and
// retry budget. The fleet package keeps it in a PostgreSQL table.
type Fleet interface {
	// Sync renews the replica's lease, records what it learnt about its
	// destinations, and returns the fleet's view of them, in one
	// transaction.
	Sync(ctx context.Context, req FleetSync) (FleetView, error)
	// Leave removes a replica that stops, with its shares and any probe
	// it holds, so that the others need not wait for its lease to end.
	Leave(ctx context.Context, replica string) error
}

// FleetConfig shares flow control with the relay's other replicas.
type FleetConfig struct {
	// Fleet is the coordination store. Required.
	Fleet Fleet
	// Replica names this process in the fleet; unique among the
	// replicas. Required.
	Replica string
	// Interval is how often the replica syncs with the fleet: how long
	// another replica's breaker takes to reach it. A breaker that opens,
	// or waits for the probe, syncs at once. Default 200ms.
	Interval time.Duration
	// Lease is how long a replica's share of the fleet outlives the sync
	// that renewed it, which a sync does once less than RenewBelow of it
	// is left (five eighths at the defaults): a replica that dies holds
	// its share of an in-flight limit for that to the whole lease, and a
	// probe it held for the lease. A replica that cannot sync until its share ends falls
	// back to per-process flow control. Default 5s.
	Lease time.Duration
}

// Defaults of FleetConfig.
const (
	DefaultFleetInterval = 200 * time.Millisecond
	DefaultFleetLease    = 5 * time.Second
)

// Problems lists every problem of c.
func (c *FleetConfig) Problems() []error {
	var errs []error
	if c.Fleet == nil {
		errs = append(errs, errors.New("relay: fleet: a coordination store is required"))
	}
	if c.Replica == "" {
		errs = append(errs, errors.New("relay: fleet: the replica needs a name"))
	}
	if c.Interval < 0 || c.Lease < 0 {
		errs = append(errs, errors.New("relay: fleet: interval and lease must not be negative"))
	}
	if c.Interval > 0 && c.Lease > 0 && c.Lease < MinFleetLease(c.Interval) {
		errs = append(errs, fmt.Errorf("relay: fleet: lease %s is under three intervals (%s)", c.Lease, MinFleetLease(c.Interval)))
	}
	return errs
}

// MinFleetLease is the shortest lease for a sync interval: three
// intervals, so that one slow or failed sync does not drop a live replica
// from the fleet.
func MinFleetLease(interval time.Duration) time.Duration { return 3 * interval }

// RenewBelow is how much of a replica's lease may be left before a sync
// renews it: two and a half of its longest sync intervals (a quarter of
// the lease while it is quiet), so that one slow or failed sync after the
// last renewal does not drop the replica.
func RenewBelow(interval, lease time.Duration) time.Duration {
	return max(interval, lease/4) * 5 / 2
}

// FleetSync is one replica's sync: its lease and, per destination, what
// it learnt since its last sync.
type FleetSync struct {
	Replica string
	// Lease is how long the replica's entry lasts from now, once renewed;
	// it is renewed when less than RenewBelow of it is left (every sync
	// when RenewBelow is 0).
	Lease, RenewBelow time.Duration
	Destinations      []FleetDestination
}

// FleetEvent is a change of a replica's breaker that the fleet should
// know of.
type FleetEvent int

// Breaker events.
const (
	FleetNothing FleetEvent = iota
	// FleetOpened: the replica's breaker opened (or reopened after its
	// probe failed) for Cooldown.
	FleetOpened
	// FleetClosed: the replica's probes succeeded.
	FleetClosed
)

// FleetDestination is one destination in a sync.
type FleetDestination struct {
	Name  string
	Event FleetEvent
	// Cooldown, Streak and LastError describe an opening: how long until
	// a probe, the openings since the breaker was last closed, and why.
	Cooldown  time.Duration
	Streak    int
	LastError string
	// Probe asks for the fleet's probe (or keeps it): the replica's
	// breaker has cooled down.
	Probe bool
	// MaxInFlight is the destination's in-flight limit across the fleet,
	// 0 for none. Floor is the share the replica cannot go below now
	// (slots in use or allowed), 0 when it had none.
	MaxInFlight int
	Floor       int
	// Wants says rows waited for a slot since the last sync, and Used is
	// the most slots in use at once meanwhile: a replica that wants none
	// lends what it does not use.
	Wants bool
	Used  int
}

// FleetView is the fleet as one sync found it.
type FleetView struct {
	// Now is the coordination database's clock, for OpenUntil.
	Now time.Time
	// Left is how long the replica's entry lasts from Now.
	Left time.Duration
	// Replicas is the number of live replicas, this one included.
	Replicas int
	// Unleased is the number of live replicas that claim rows without
	// leasing the outbox's partitions (relays older than migration 16):
	// while any does, claims check keys from the lowest pending row.
	Unleased int
	// Destinations are in the order of the sync's.
	Destinations []FleetBreaker
}

// FleetBreaker is a destination's shared state.
type FleetBreaker struct {
	// Generation changes with every opening and closing.
	Generation int64
	Open       bool
	OpenUntil  time.Time
	Streak     int
	LastError  string
	// Probe reports that this replica holds the destination's probe.
	Probe bool
	// Slots is this replica's share of MaxInFlight; OthersWant says other
	// replicas' rows wait for slots of it.
	Slots      int
	OthersWant bool
}

// FleetStatus is a replica's view of the fleet, for metrics.
type FleetStatus struct {
	// Up reports that flow control is shared: the last sync is within
	// the lease. Otherwise each replica has its own.
	Up bool
	// Replicas is the number of live replicas at the last sync.
	Replicas int
	// Syncs and SyncTime count the syncs and their total time.
	Syncs    int64
	SyncTime time.Duration
}

// Replica runs a replica's syncs: it gathers what the destinations learnt,
// syncs, and hands each destination the fleet's view.
type Replica struct {
	cfg   FleetConfig
	dests []*Dest
	wakeC chan struct{}
	// WakeWorkers nudges the workers of every outbox, when a sync lets
	// rows go that were held.
	WakeWorkers func()
	// Unleased tells the outboxes whether a live replica claims without
	// leasing partitions.
	Unleased func(present bool)
	// Quiet reports that the replica has nothing in flight and every
	// breaker closed: it has nothing to tell the fleet, and nothing it
	// would do with what the fleet tells, so it syncs less often
	// (resting) until work arrives.
	Quiet   func() bool
	resting atomic.Bool
	// stirred is when rows were last claimed, in Unix nanoseconds.
	stirred atomic.Int64
	log     *slog.Logger
	timeout time.Duration

	mu     sync.Mutex
	status FleetStatus
	lastOK time.Time // the local clock when the last good sync began
	ends   time.Time // the local clock when the replica's entry ends without a sync
}

// NewReplica readies the syncs of the replica cfg names for dests; Run
// runs them.
func NewReplica(cfg FleetConfig, dests []*Dest, queryTimeout time.Duration, log *slog.Logger) *Replica {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultFleetInterval
	}
	if cfg.Lease == 0 {
		cfg.Lease = max(DefaultFleetLease, MinFleetLease(cfg.Interval))
	}
	f := &Replica{cfg: cfg, dests: dests, wakeC: make(chan struct{}, 1), log: log.With(slog.String("replica", cfg.Replica)),
		timeout: min(queryTimeout, cfg.Lease/2)}
	for _, d := range dests {
		d.breaker.wakeFleet = f.wake
	}
	return f
}

// wake asks for a sync now.
func (f *Replica) wake() {
	select {
	case f.wakeC <- struct{}{}:
	default:
	}
}

// Run syncs every interval, or at once when woken, until ctx ends.
func (f *Replica) Run(ctx context.Context) error {
	t := time.NewTimer(f.next())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-f.wakeC:
		}
		f.Sync(ctx)
		t.Reset(f.next())
	}
}

// next is how long until the next sync: the interval, or, while the
// replica is quiet, a quarter of the lease, which still keeps it among
// the live replicas through a failed sync or two. Work ends the rest at
// once (stir): the replica then learns of the others' breakers while it
// publishes its first batch, as it would within an interval.
func (f *Replica) next() time.Duration {
	// A steady trickle leaves nothing in flight between its batches: the
	// replica rests only once no batch has come for a few intervals, else
	// it would sync on each.
	stirred := time.Duration(time.Now().UnixNano() - f.stirred.Load())
	if f.Quiet != nil && f.Quiet() && stirred >= restAfter*f.cfg.Interval {
		f.resting.Store(true)
		return max(f.cfg.Interval, f.cfg.Lease/4)
	}
	f.resting.Store(false)
	return f.cfg.Interval
}

// Resting reports whether the replica syncs at its quiet pace.
func (f *Replica) Resting() bool { return f.resting.Load() }

// restAfter is how many intervals without a claimed batch a quiet
// replica waits before it rests.
const restAfter = 5

// Stir has a resting replica sync now: it claimed rows.
func (f *Replica) Stir() {
	f.stirred.Store(time.Now().UnixNano())
	if f.resting.Load() {
		f.wake()
	}
}

// Sync runs one sync and applies its view; past the lease without a good
// sync, it falls back to per-process flow control.
func (f *Replica) Sync(ctx context.Context) {
	start := time.Now()
	req := FleetSync{Replica: f.cfg.Replica, Lease: f.cfg.Lease, RenewBelow: RenewBelow(f.cfg.Interval, f.cfg.Lease),
		Destinations: make([]FleetDestination, len(f.dests))}
	seqs := make([]uint64, len(f.dests))
	for i, d := range f.dests {
		req.Destinations[i], seqs[i] = d.fleetRequest()
	}
	sctx, cancel := context.WithTimeout(ctx, f.timeout)
	view, err := f.cfg.Fleet.Sync(sctx, req)
	cancel()
	took := time.Since(start)
	if err == nil && len(view.Destinations) != len(f.dests) {
		err = errors.New("the fleet's view does not match the destinations")
	}

	f.mu.Lock()
	f.status.Syncs++
	f.status.SyncTime += took
	if err == nil {
		f.lastOK, f.ends, f.status.Replicas = start, start.Add(view.Left), view.Replicas
	}
	wasUp, first := f.status.Up, f.status.Syncs == 1
	f.status.Up = err == nil || (wasUp && time.Now().Before(f.ends))
	nowUp := f.status.Up
	f.mu.Unlock()

	switch {
	case err != nil && ctx.Err() != nil:
		return
	case err == nil:
		if !wasUp {
			f.log.Info("sharing flow control with the fleet", slog.Int("replicas", view.Replicas))
		}
		if f.Unleased != nil {
			f.Unleased(view.Unleased > 0)
		}
		freed := false
		for i, d := range f.dests {
			if d.fleetApply(view.Destinations[i], seqs[i], view.Replicas, start, view.Now) {
				freed = true
			}
		}
		if freed && f.WakeWorkers != nil {
			f.WakeWorkers()
		}
	case wasUp && !nowUp:
		f.log.Warn("fleet coordination unreachable; flow control is per process until it returns",
			slog.Duration("since", time.Since(f.lastOK).Round(time.Millisecond)), slog.String("error", err.Error()))
		for _, d := range f.dests {
			d.fleetLost()
		}
		if f.WakeWorkers != nil {
			f.WakeWorkers()
		}
	case first:
		f.log.Warn("fleet coordination unreachable; flow control is per process until it returns", slog.String("error", err.Error()))
	}
}

// Leave tells the fleet this replica is gone, once its deliveries are
// over; a replica that cannot is forgotten when its lease ends.
func (f *Replica) Leave(ctx context.Context) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.timeout)
	defer cancel()
	if err := f.cfg.Fleet.Leave(lctx, f.cfg.Replica); err != nil {
		f.log.Warn("could not leave the fleet; the others forget this replica when its lease ends", slog.String("error", err.Error()))
	}
}

// Snapshot is the replica's fleet status now.
func (f *Replica) Snapshot() FleetStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

// fleetRequest is what d tells the fleet in this sync, and the sequence
// of its breaker's events it covers.
func (d *Dest) fleetRequest() (FleetDestination, uint64) {
	fd := FleetDestination{Name: d.Name, MaxInFlight: d.fleetMax}
	seq := d.breaker.fleetEvent(time.Now(), &fd)
	if d.fleetMax > 0 {
		fd.Floor = d.bulk.floor()
		fd.Wants, fd.Used = d.bulk.demand()
	}
	return fd, seq
}

// fleetApply hands d the fleet's view. It reports whether rows that were
// held may go now.
func (d *Dest) fleetApply(v FleetBreaker, seq uint64, replicas int, now, dbNow time.Time) bool {
	freed := d.breaker.adopt(v, seq, now, dbNow)
	if d.fleetMax > 0 && d.bulk.share(v.Slots, v.OthersWant) {
		freed = true
	}
	d.rate.share(replicas)
	d.budget.share(replicas)
	return freed
}

// fleetLost returns d to per-process flow control.
func (d *Dest) fleetLost() {
	d.breaker.unshare()
	d.bulk.unshare()
	d.rate.share(1)
	d.budget.share(1)
}
