package relay

import (
	"errors"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// settle turns a group's publish results into outcomes and feeds them, as
// evidence by scope, to its destination's breaker, the pauses of its
// topics and partitions, and its retry budget. After a failure, the later
// rows of the same key get no outcome: they stay as they were, their turn
// comes after the failed row's. The rows of a probe that failed count no
// attempt (see failedProbes).
func (d *dest) settle(g *group, abandoned bool) []store.Outcome {
	elapsed := g.done.Sub(g.start)
	outcomes := make([]store.Outcome, 0, len(g.recs))
	failedKeys := map[string]bool{}
	firsts, retriesSent, refunds := 0, 0, 0
	var dev evidence              // about the destination
	var sev map[subject]*evidence // about its topics and partitions
	var pausedBy map[int]subject  // deferred outcomes, by index, waiting on a pause
	var probed map[int]bool       // deferred outcomes, by index, of a failed probe's rows
	state := scopeState{destination: d.Name, policy: d.policy, block: d.block}
	state.destProbeFailed, state.pauseProbeFailed = failedProbes(g, d.breaker.openedSince(g.adm.gen))
	about := func(s subject) *evidence {
		if sev == nil {
			sev = map[subject]*evidence{}
		}
		e := sev[s]
		if e == nil {
			e = &evidence{}
			sev[s] = e
		}
		return e
	}
	for i, rec := range g.recs {
		if rec.HasKey && failedKeys[rec.Key] {
			continue
		}
		err := g.errs[i]
		if err == nil {
			outcomes = append(outcomes, store.Outcome{ID: rec.ID, Kind: store.Sent, Destination: d.Name})
			dev.sent++
			if len(g.pauses) > 0 {
				if _, ok := g.pauses[subject{rec.Topic, wholeTopic}]; ok {
					about(subject{rec.Topic, wholeTopic}).sent++
				}
				if part, ok := g.parts[i]; ok {
					about(subject{rec.Topic, part}).sent++
				}
			}
			if rec.RetryCount > 0 {
				retriesSent++
			} else {
				firsts++
			}
			continue
		}
		if rec.HasKey {
			failedKeys[rec.Key] = true
		}
		if abandoned || errors.Is(err, sink.ErrNotSent) {
			// Shutting down: an interrupted publish counts nothing. Not
			// sent: the row waits for its key's failed row. Either way a
			// retry's budget is given back.
			if rec.RetryCount > 0 {
				refunds++
			}
			continue
		}
		if rec.RetryCount == 0 {
			firsts++
		}
		v := judge(rec, err, g.claimed.Sub(rec.CreatedAt)+elapsed, state)
		ev := &dev
		if v.scoped {
			ev = about(v.about)
		}
		ev.add(v, rec)
		switch v.outcome.Kind {
		case store.Deferred:
			if v.scoped {
				if pausedBy == nil {
					pausedBy = map[int]subject{}
				}
				pausedBy[len(outcomes)] = v.about
			}
			if v.probed {
				if probed == nil {
					probed = map[int]bool{}
				}
				probed[len(outcomes)] = true
			}
		case store.DeadLettered:
			if rec.HasKey && !v.outcome.ParkKey {
				delete(failedKeys, rec.Key) // released: the key's next row may go
			}
		}
		outcomes = append(outcomes, v.outcome)
	}
	now := time.Now()
	if abandoned {
		d.budget.earn(now, 0, refunds)
		d.abandon(g)
		return outcomes
	}
	d.budget.earn(now, firsts, retriesSent+refunds)
	if dev.sent == 0 && dev.systemic+dev.transient == 0 && failedPartitions(sev) >= 2 {
		// Every partition the publish reached failed, and nothing was
		// delivered: a broker answering every produce with a timeout is
		// the destination failing, not its partitions.
		dev.transient++
		dev.lastErr = lastErr(sev)
	}
	cooldown := d.breaker.result(now, g.adm.gen, dev, g.adm.probe)
	// A pause's probe whose rows were all held behind their keys says
	// nothing: another goes.
	for s, a := range g.pauses {
		if _, seen := sev[s]; !seen && a.probe {
			d.pauses.abandoned(s, a.gen)
		}
	}
	var pausedFor map[subject]time.Duration
	for s, ev := range sev {
		a, tracked := g.pauses[s]
		left := d.pauses.result(now, s, tracked, a.gen, a.probe, *ev)
		if pausedFor == nil {
			pausedFor = map[subject]time.Duration{}
		}
		pausedFor[s] = left
	}
	for i := range outcomes {
		if outcomes[i].Kind != store.Deferred {
			continue
		}
		wait := cooldown
		if s, ok := pausedBy[i]; ok {
			wait = pausedFor[s]
		}
		if wait == 0 {
			wait = d.pauseBase // a stale systemic failure: look again soon
		}
		if probed[i] {
			// Past the next cool-down, whatever it turns out to be (a
			// fleet's may differ): the next probe takes other rows, of
			// other keys, so that rows failing on their own cannot fail
			// every probe of a destination that is back.
			wait += d.pauseMax
		}
		outcomes[i].Delay = wait
	}
	return outcomes
}

// failedProbes reports which probes g carried that failed: they delivered
// none of their rows. A failure of a probe's subject (the destination, a
// topic or a partition) in such a probe says the subject is still down,
// not that the row is bad: the row counts no attempt. A probe some of
// whose rows were delivered did not fail, and its failed rows follow the
// retry policy. A publish that delivered nothing while the destination's
// breaker opened (on other publishes' evidence, or the fleet's) counts as
// a failed probe of the destination: its failures are the outage's too.
func failedProbes(g *group, openedSince bool) (dest bool, pauses map[subject]bool) {
	for s, a := range g.pauses {
		if a.probe {
			if pauses == nil {
				pauses = map[subject]bool{}
			}
			pauses[s] = true
		}
	}
	dest = g.adm.probe || openedSince
	if !dest && pauses == nil {
		return false, nil
	}
	for i, rec := range g.recs {
		if g.errs[i] != nil {
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

// failedPartitions counts the partitions whose rows failed as partitions.
func failedPartitions(sev map[subject]*evidence) int {
	n := 0
	for s, ev := range sev {
		if s.partition != wholeTopic && ev.systemic+ev.transient > 0 {
			n++
		}
	}
	return n
}

// lastErr is one of the failures of the topics and partitions.
func lastErr(sev map[subject]*evidence) string {
	for _, ev := range sev {
		if ev.lastErr != "" {
			return ev.lastErr
		}
	}
	return ""
}
