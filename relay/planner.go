package relay

import (
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/flow"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// planner decides, for each claimed batch, which rows are published now
// and where. It holds no database: routing, key runs, the byte budget and
// the destinations' admission are all it needs.
type planner struct {
	dests  []*flow.Dest
	router *router
	// maxBytes bounds the bytes of a batch (see Config.MaxBatchBytes).
	maxBytes int
	// block parks the keys of rows dead-lettered without a destination.
	block       bool
	maxAttempts int
}

func newPlanner(cfg *Config, dests []*flow.Dest) *planner {
	index := map[string]int{}
	for i, d := range dests {
		index[d.Name] = i
	}
	return &planner{
		dests:       dests,
		router:      newRouter(cfg.Routes, index),
		maxBytes:    cfg.MaxBatchBytes,
		block:       cfg.OnDeadLetter == OnDeadLetterBlock,
		maxAttempts: cfg.Policy.MaxAttempts,
	}
}

// plan routes the claimed rows and picks those to publish now, per
// destination, in id order. Undeliverable and unroutable rows get their
// dead-letter outcome here; rows of a destination whose breaker is open, or
// retries over its budget, are deferred without counting an attempt. A
// key's rows in one order scope (scope, nil for the key's every row)
// travel together only while they go to one destination and topic, so
// that a failure in one place can never let a later row of the key through
// in another; and once the batch's byte budget or a destination's
// bulkhead is spent, the remaining rows wait for the next batch, untouched.
// The rows a destination holds are owner's (see flow.Group.Owner).
func (p *planner) plan(owner any, recs []sink.Record, now time.Time, scope func(topic string) string) ([]*flow.Group, []store.Outcome) {
	pl := planning{planner: p, owner: owner, now: now, scope: scope, batch: len(recs),
		// Sized for the batch, as growing them showed in profiles of drains.
		runs: make(map[string]*keyRun, len(recs)), runBuf: make([]keyRun, 0, len(recs)),
		groups: map[int]*flow.Group{}}
	for _, rec := range recs {
		pl.add(&rec) // a copy: the claim's records stay as claimed
	}
	out := pl.order[:0]
	for _, g := range pl.order {
		g.Dest.Planned(g)
		if len(g.Recs) > 0 {
			out = append(out, g)
		}
	}
	return out, pl.outcomes
}

// planning is one batch's plan as it is made.
type planning struct {
	*planner
	owner any
	now   time.Time
	scope func(topic string) string
	batch int // rows claimed

	runs             map[string]*keyRun // by key and order scope
	runBuf           []keyRun           // never grows: pointers stay valid
	parkedEverywhere map[string]bool    // keys parked in every scope by a row without a route
	groups           map[int]*flow.Group
	order            []*flow.Group
	outcomes         []store.Outcome
	bytes            int
	full             bool // the byte budget is spent
}

// keyRun is where a key's rows of the batch go, in one order scope, and
// whether they stopped: a row of it waits, so the rest of it does too.
type keyRun struct {
	dest    int
	topic   string
	stopped bool
}

func (r *keyRun) stop() {
	if r != nil {
		r.stopped = true
	}
}

// add plans rec: a dead letter, a row published now, or one that waits.
func (pl *planning) add(rec *sink.Record) {
	rt := pl.router.route(rec.Topic)
	if rec.Undeliverable == "" && rt.dest < 0 {
		rec.Undeliverable = fmt.Sprintf("no route matches topic %q", rec.Topic)
		rec.UndeliverableReason = sink.ReasonNoRoute
	}
	run, ok := pl.run(rec, rt)
	if !ok {
		return
	}
	var d *flow.Dest
	if rt.dest >= 0 {
		d = pl.dests[rt.dest]
	}
	if o, ok := pl.deadLetter(d, *rec); ok {
		pl.outcomes = append(pl.outcomes, o)
		if o.ParkKey {
			run.stop()
			if pl.scope != nil && rt.dest < 0 {
				if pl.parkedEverywhere == nil {
					pl.parkedEverywhere = map[string]bool{}
				}
				pl.parkedEverywhere[rec.Key] = true
			}
		}
		return
	}
	if !pl.admit(d, rt, rec) {
		run.stop()
	}
}

// run is rec's key run (nil without a key), or false when rec waits: its
// key is parked everywhere, or an earlier row of its run stopped or went
// to another destination or topic.
func (pl *planning) run(rec *sink.Record, rt routing) (*keyRun, bool) {
	if !rec.HasKey {
		return nil, true
	}
	if pl.parkedEverywhere[rec.Key] {
		return nil, false
	}
	key := scopedKey(pl.scope, rec)
	run := pl.runs[key]
	if run == nil {
		pl.runBuf = append(pl.runBuf, keyRun{dest: rt.dest, topic: rt.topic})
		run = &pl.runBuf[len(pl.runBuf)-1]
		pl.runs[key] = run
	}
	if run.stopped || run.dest != rt.dest || run.topic != rt.topic {
		run.stopped = true
		return nil, false
	}
	return run, true
}

// admit offers rec to d and adds it to d's group when d takes it within the
// batch's byte budget; false when it waits (a deferral is an outcome).
func (pl *planning) admit(d *flow.Dest, rt routing, rec *sink.Record) bool {
	g := pl.groups[rt.dest]
	if g == nil {
		g = d.Begin(pl.now, pl.batch)
		g.Owner = pl.owner
		pl.groups[rt.dest] = g
		pl.order = append(pl.order, g)
	}
	v, o, paused := d.Admit(g, *rec, rt.topic, pl.now)
	if v == flow.Admitted {
		size := recordSize(*rec)
		if pl.full || (pl.bytes > 0 && pl.bytes+size > pl.maxBytes) {
			pl.full = pl.full || !g.Probe()
			v = flow.Held
		} else if v, o = d.Take(*rec, pl.now); v == flow.Admitted {
			pl.bytes += size
			g.Add(*rec, rt.topic, paused)
			return true
		}
	}
	if v == flow.Deferred {
		pl.outcomes = append(pl.outcomes, o)
	}
	return false
}

// deadLetter returns the outcome of a row that cannot be delivered at all,
// bound for d (nil without a route): one the claim found undeliverable, or
// a leased row whose attempts all ran out.
func (p *planner) deadLetter(d *flow.Dest, rec sink.Record) (store.Outcome, bool) {
	if rec.Undeliverable != "" {
		// Without a destination, the relay's own policy applies.
		park := rec.HasKey && ((d != nil && d.Blocks()) || (d == nil && p.block))
		o := store.Outcome{ID: rec.ID, Kind: store.DeadLettered,
			Reason: rec.UndeliverableReason, Error: rec.Undeliverable, Class: sink.ClassPermanent.String(), ParkKey: park}
		if d != nil {
			o.Destination = d.Name
		}
		return o, true
	}
	if d.VisibilityTimeout > 0 && rec.RetryCount >= p.maxAttempts {
		// Leases count their attempt up front: this row's leases all
		// ended without an outcome, as when it crashes the relay.
		msg := fmt.Sprintf("all %d attempts used; the last leases ended without an outcome (the relay stopped or crashed while delivering)", rec.RetryCount)
		return store.Outcome{ID: rec.ID, Kind: store.DeadLettered, Reason: sink.ReasonRetriesExhausted,
			Error: msg, Class: sink.ClassTransient.String(), ParkKey: d.Blocks() && rec.HasKey, Destination: d.Name}, true
	}
	return store.Outcome{}, false
}

// recordSize is what a record counts against MaxBatchBytes.
func recordSize(rec sink.Record) int {
	size := RecordOverhead + rec.PayloadSize + len(rec.Key)
	for k, v := range rec.Headers {
		size += len(k) + len(v)
	}
	return size
}

// destOf is the destination rec goes to, or false when it goes to the
// dead letters (undeliverable, or without a route).
func (p *planner) destOf(rec *sink.Record) (*flow.Dest, bool) {
	rt := p.router.route(rec.Topic)
	if rec.Undeliverable != "" || rt.dest < 0 {
		return nil, false
	}
	return p.dests[rt.dest], true
}
