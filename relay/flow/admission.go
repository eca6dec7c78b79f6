package flow

import (
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// A gate is one limit an admitted row passes on its way into a publish:
// the bulkhead's slots, the rate limit's tokens, the retry budget. Each is
// its own type in its own file; Dest.Take composes them, in the order
// NewDest gives.
type gate interface {
	// enter lets rec through, taking what the gate gives it, or says why
	// not: held (the row waits for a later batch, untouched) or deferred
	// (it waits, without counting an attempt, for wait; reason says why).
	enter(rec sink.Record, now time.Time) (v Verdict, reason string, wait time.Duration)
	// leave gives back what enter took, when a later gate refuses the row.
	leave()
}

// Take passes rec through the destination's gates, in order; a gate that
// refuses it gets back what the earlier ones took.
func (d *Dest) Take(rec sink.Record, now time.Time) (Verdict, store.Outcome) {
	for i, g := range d.gates {
		v, reason, wait := g.enter(rec, now)
		if v == Admitted {
			continue
		}
		for _, passed := range d.gates[:i] {
			passed.leave()
		}
		if v == Deferred {
			return Deferred, d.deferral(rec, reason, wait)
		}
		return Held, store.Outcome{}
	}
	return Admitted, store.Outcome{}
}

// enter takes a slot of the bulkhead.
func (h *bulkhead) enter(sink.Record, time.Time) (Verdict, string, time.Duration) {
	if h.take(1) == 0 {
		return Held, "", 0
	}
	return Admitted, "", 0
}

func (h *bulkhead) leave() { h.give(1) }

// enter spends a token of the rate limit; nil is unlimited.
func (r *rateLimit) enter(_ sink.Record, now time.Time) (Verdict, string, time.Duration) {
	if !r.take(now) {
		return Held, "", 0
	}
	return Admitted, "", 0
}

// leave keeps the token: the rate limit counts rows offered, and a refused
// one is rare (its retry budget was spent).
func (r *rateLimit) leave() {}

// enter spends a share of the retry budget on a retry.
func (b *retryBudget) enter(rec sink.Record, now time.Time) (Verdict, string, time.Duration) {
	if rec.RetryCount > 0 && !b.spend(now) {
		return Deferred, DeferRetryBudget, budgetDeferral
	}
	return Admitted, "", 0
}

// leave is never called: the retry budget is the last gate.
func (b *retryBudget) leave() {}
