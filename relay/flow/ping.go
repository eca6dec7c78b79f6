package flow

import (
	"context"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// A destination whose server went away (refused or dropped connections)
// is probed at the end of each cool-down, up to a quarter of the outage so
// far: a probe sent just before the server came back costs a whole
// cool-down more. A destination whose publisher is a sink.Pinger is also
// pinged while its breaker is open, a light call that delivers nothing.
// Once a ping has failed, the first that succeeds ends the cool-down: the
// breaker is half-open at once and the next batch probes it. A server
// that answers pings while its publishes fail never ends a cool-down
// early: its probes keep to the cool-downs, as they would without pings.

// pingWatch is what a destination's pings have shown in its outage.
type pingWatch struct {
	mu     sync.Mutex
	outage time.Time // when the outage began (its first opening)
	failed bool      // a ping failed since it began, or since a ping last ended a cool-down
}

// Pings reports whether d can be pinged.
func (d *Dest) Pings() bool {
	_, ok := d.Publisher.(sink.Pinger)
	return ok
}

// Ping pings d's server once if its breaker is open, waiting at most
// timeout; after a failed ping of the same outage, a ping that succeeds
// ends the cool-down. It reports whether it did: the caller wakes the
// workers, whose next batch probes the destination. A failed ping counts
// across the outage's openings: a probe that failed just before the
// server came back opens the breaker again, and the next ping, which
// finds the server, ends that cool-down.
func (d *Dest) Ping(ctx context.Context, timeout time.Duration) bool {
	p, ok := d.Publisher.(sink.Pinger)
	if !ok {
		return false
	}
	outage, gen, open := d.breaker.openGen()
	if !open {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	err := p.Ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return false
	}
	w := &d.pings
	w.mu.Lock()
	if !w.outage.Equal(outage) {
		// What earlier pings showed is of another outage.
		w.outage, w.failed = outage, false
	}
	if err != nil {
		w.failed = true
		w.mu.Unlock()
		return false
	}
	seen := w.failed
	w.failed = false
	w.mu.Unlock()
	if !seen || !d.breaker.answering(time.Now(), gen) {
		return false
	}
	d.log.Info("destination answers a ping; probing it now, before the end of its cool-down")
	return true
}

// openGen returns when the breaker's outage began, its state's
// generation, and whether it is open.
func (b *breaker) openGen() (time.Time, int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cooled(time.Now())
	return b.since, b.gen, b.state == BreakerOpen
}

// answering ends the cool-down of a breaker still open as it was at
// generation gen: what it guards answers again. It reports whether it did.
func (b *breaker) answering(now time.Time, gen int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gen != gen || b.state != BreakerOpen {
		return false
	}
	b.until = now
	b.cooled(now)
	return true
}
