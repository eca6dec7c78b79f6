package flow

import (
	"context"
	"errors"
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
// early, and one whose pings misled once (the probe after a ping that
// ended a cool-down failed) does not again in that outage: its probes keep
// to the cool-downs, as they would without pings. A breaker shared with a
// fleet keeps to the fleet's cool-downs.

// pingWatch is what a destination's pings have shown in its outage.
type pingWatch struct {
	mu     sync.Mutex
	outage time.Time // when the outage began (its first opening)
	failed bool      // a ping failed since it began, or since a ping last ended a cool-down
	ended  int       // the breaker's generation when a ping ended its cool-down, 0 for none
	misled bool      // the probe after a ping that ended a cool-down failed
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
	w := &d.pings
	w.mu.Lock()
	if !w.outage.Equal(outage) {
		// What earlier pings showed is of another outage.
		w.outage, w.failed, w.ended, w.misled = outage, false, 0, false
	}
	if w.ended != 0 && w.ended != gen {
		// Open again after a ping ended the cool-down: the pings answer
		// while publishes fail. The outage keeps to its cool-downs.
		w.misled = true
	}
	misled := w.misled
	w.mu.Unlock()
	if misled {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	err := p.Ping(pctx)
	cancel()
	if ctx.Err() != nil || errors.Is(err, sink.ErrPingSkipped) {
		return false
	}
	w.mu.Lock()
	if err != nil {
		w.failed = true
		w.mu.Unlock()
		return false
	}
	seen := w.failed
	w.failed = false
	w.mu.Unlock()
	if !seen {
		return false
	}
	halfOpen, ok := d.breaker.answering(time.Now(), gen)
	if !ok {
		return false
	}
	w.mu.Lock()
	w.ended = halfOpen
	w.mu.Unlock()
	// The rows held for the outage wait for the cool-down it had: unless
	// they go now, the half-open breaker has nothing to probe with when
	// they are all there is (a backlog held whole by the first failure).
	d.holds.release(destWide, time.Now())
	d.log.Info("destination answers a ping; probing it now, before the end of its cool-down")
	return true
}

// openGen returns when the breaker's outage began, its state's
// generation, and whether it is open and its own: a breaker shared with a
// fleet keeps to the fleet's cool-downs, which one replica's ping does not
// end.
func (b *breaker) openGen() (time.Time, int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cooled(time.Now())
	return b.since, b.gen, b.state == BreakerOpen && !b.shared
}

// answering ends the cool-down of a breaker still open as it was at
// generation gen: what it guards answers again. It reports whether it
// did, and the generation of the half-open breaker it left.
func (b *breaker) answering(now time.Time, gen int) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gen != gen || b.state != BreakerOpen {
		return 0, false
	}
	b.until = now
	b.cooled(now)
	return b.gen, true
}
