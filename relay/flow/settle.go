package flow

import (
	"errors"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Settle turns a group's publish results into outcomes and feeds them, as
// evidence by scope, to its destination's breaker, the pauses of its
// topics and partitions, and its retry budget. After a failure, the later
// rows of the same key get no outcome: they stay as they were, their turn
// comes after the failed row's. The rows of a probe that failed count no
// attempt (see failedProbes). abandoned says the publish was cut short by
// shutdown: it counts nothing.
func (d *Dest) Settle(g *Group, abandoned bool) []store.Outcome {
	st := settlement{d: d, g: g, elapsed: g.Done.Sub(g.Start), abandoned: abandoned,
		outcomes: make([]store.Outcome, 0, len(g.Recs)), failedKeys: map[string]bool{},
		state: scopeState{destination: d.Name, policy: d.policy, block: d.block}}
	st.state.destProbeFailed, st.state.pauseProbeFailed = failedProbes(g, d.breaker.openedSince(g.Adm.gen))
	for i, rec := range g.Recs {
		st.row(i, rec)
	}
	now := time.Now()
	if abandoned {
		d.budget.earn(now, 0, st.refunds)
		d.Abandon(g)
		return st.outcomes
	}
	d.budget.earn(now, st.firsts, st.retriesSent+st.refunds)
	cooldown, pausedFor := st.learn(now)
	st.delay(now, cooldown, pausedFor)
	return st.outcomes
}

// settlement is one group's settling under way: the outcomes so far, the
// evidence about the destination and about each paused topic and
// partition, and the attempts the retry budget counts.
type settlement struct {
	d         *Dest
	g         *Group
	elapsed   time.Duration // the publish's
	abandoned bool
	state     scopeState
	outcomes  []store.Outcome
	// failedKeys are the keys whose later rows get no outcome.
	failedKeys                   map[string]bool
	firsts, retriesSent, refunds int
	dev                          evidence              // about the destination
	sev                          map[subject]*evidence // about its topics and partitions
	pausedBy                     map[int]subject       // deferred outcomes, by index, waiting on a pause
	probed                       map[int]bool          // deferred outcomes, by index, of a failed probe's rows: true for keyed ones
	retries                      map[int]int           // deferred outcomes' rows' retry counts, by index
}

// row settles the group's i-th row.
func (st *settlement) row(i int, rec sink.Record) {
	if rec.HasKey && st.failedKeys[rec.Key] {
		return
	}
	err := st.g.Errs[i]
	if err == nil {
		st.sent(i, rec)
		return
	}
	if rec.HasKey {
		st.failedKeys[rec.Key] = true
	}
	if st.abandoned || errors.Is(err, sink.ErrNotSent) {
		// Shutting down: an interrupted publish counts nothing. Not
		// sent: the row waits for its key's failed row. Either way a
		// retry's budget is given back.
		if rec.RetryCount > 0 {
			st.refunds++
		}
		return
	}
	if rec.RetryCount == 0 {
		st.firsts++
	}
	st.failed(rec, err)
}

// sent settles the group's i-th row, delivered.
func (st *settlement) sent(i int, rec sink.Record) {
	st.outcomes = append(st.outcomes, store.Outcome{ID: rec.ID, Kind: store.Sent, Destination: st.d.Name})
	st.dev.sent++
	if g := st.g; len(g.pauses) > 0 {
		if _, ok := g.pauses[subject{rec.Topic, wholeTopic}]; ok {
			st.about(subject{rec.Topic, wholeTopic}).sent++
		}
		if part, ok := g.parts[i]; ok {
			st.about(subject{rec.Topic, part}).sent++
		}
	}
	if rec.RetryCount > 0 {
		st.retriesSent++
	} else {
		st.firsts++
	}
}

// failed settles rec, which failed with err, as judge rules.
func (st *settlement) failed(rec sink.Record, err error) {
	v := judge(rec, err, st.g.Claimed.Sub(rec.CreatedAt)+st.elapsed, st.state)
	ev := &st.dev
	if v.scoped {
		ev = st.about(v.about)
	}
	ev.add(v, rec)
	switch v.outcome.Kind {
	case store.Deferred:
		if st.retries == nil {
			st.retries = map[int]int{}
		}
		st.retries[len(st.outcomes)] = rec.RetryCount
		if v.scoped {
			if st.pausedBy == nil {
				st.pausedBy = map[int]subject{}
			}
			st.pausedBy[len(st.outcomes)] = v.about
		}
		if v.probed {
			if st.probed == nil {
				st.probed = map[int]bool{}
			}
			st.probed[len(st.outcomes)] = rec.HasKey
		}
	case store.DeadLettered:
		if rec.HasKey && !v.outcome.ParkKey {
			delete(st.failedKeys, rec.Key) // released: the key's next row may go
		}
	}
	st.outcomes = append(st.outcomes, v.outcome)
}

// about is the evidence about topic or partition s.
func (st *settlement) about(s subject) *evidence {
	if st.sev == nil {
		st.sev = map[subject]*evidence{}
	}
	e := st.sev[s]
	if e == nil {
		e = &evidence{}
		st.sev[s] = e
	}
	return e
}

// learn feeds the evidence to the destination's breaker and to the pauses
// of its topics and partitions. It returns how long the breaker stays
// open, and how long each of those pauses lasts.
func (st *settlement) learn(now time.Time) (cooldown time.Duration, pausedFor map[subject]time.Duration) {
	d, g, dev := st.d, st.g, st.dev
	if dev.sent == 0 && dev.systemic+dev.transient == 0 && failedPartitions(st.sev) >= 2 {
		// Every partition the publish reached failed, and nothing was
		// delivered: a broker answering every produce with a timeout is
		// the destination failing, not its partitions.
		dev.transient++
		dev.lastErr = lastErr(st.sev)
	}
	cooldown = d.breaker.result(now, g.Adm.gen, dev, g.Adm.probe)
	// A pause's probe whose rows were all held behind their keys says
	// nothing: another goes.
	for s, a := range g.pauses {
		if _, seen := st.sev[s]; !seen && a.probe {
			d.pauses.abandoned(s, a.gen)
		}
	}
	for s, ev := range st.sev {
		a, tracked := g.pauses[s]
		if pausedFor == nil {
			pausedFor = map[subject]time.Duration{}
		}
		pausedFor[s] = d.pauses.result(now, s, tracked, a.gen, a.probe, *ev)
	}
	return cooldown, pausedFor
}

// delay sets how long each deferred row waits: as long as the breaker
// stays open, or as its pause lasts; the destination holds it until then,
// or until what holds it answers again.
func (st *settlement) delay(now time.Time, cooldown time.Duration, pausedFor map[subject]time.Duration) {
	for i := range st.outcomes {
		if st.outcomes[i].Kind != store.Deferred {
			continue
		}
		wait, by := cooldown, destWide
		if s, ok := st.pausedBy[i]; ok {
			wait, by = pausedFor[s], s
		}
		keyed, probed := st.probed[i]
		handBack := false
		switch {
		case wait == 0:
			// Stale evidence (a probe answered after another closed the
			// breaker, or went instead of it): look again soon.
			wait = st.d.pauseBase
		case probed && (by != destWide || st.g.Adm.probe):
			// Past the next cool-down, whatever it turns out to be (a
			// fleet's may differ): the next probe takes other rows, of
			// other keys, so that rows failing on their own cannot fail
			// every probe of a destination that is back. The rows of a
			// publish the breaker's opening overtook were no probe: they
			// wait the cool-down, as the rows it deferred do, and are
			// there for the next probe to take (held a pause_max, a
			// whole batch of keys would leave the half-open breaker
			// nothing to probe with).
			wait += st.d.pauseMax
			// A keyed row holds its key's later rows behind it: when
			// every key waits so, it is handed back for the next probe
			// (see breaker.starved). A keyless one holds nothing back.
			handBack = keyed
		}
		st.outcomes[i].Delay = wait
		st.d.holds.hold(by, st.g.Owner, st.outcomes[i].ID, st.retries[i], now, wait, handBack)
	}
}

// failedProbes reports which probes g carried that failed: they delivered
// none of their rows. A failure of a probe's subject (the destination, a
// topic or a partition) in such a probe says the subject is still down,
// not that the row is bad: the row counts no attempt. A probe some of
// whose rows were delivered did not fail, and its failed rows follow the
// retry policy. A publish that delivered nothing while the destination's
// breaker opened (on other publishes' evidence, or the fleet's) counts as
// a failed probe of the destination: its failures are the outage's too.
func failedProbes(g *Group, openedSince bool) (dest bool, pauses map[subject]bool) {
	for s, a := range g.pauses {
		if a.probe {
			if pauses == nil {
				pauses = map[subject]bool{}
			}
			pauses[s] = true
		}
	}
	dest = g.Adm.probe || openedSince
	if !dest && pauses == nil {
		return false, nil
	}
	for i, rec := range g.Recs {
		if g.Errs[i] != nil {
			continue
		}
		dest = false
		if len(pauses) > 0 {
			delete(pauses, subject{rec.Topic, wholeTopic})
			if part, ok := g.parts[i]; ok {
				delete(pauses, subject{rec.Topic, part})
			}
		}
	}
	return dest, pauses
}
