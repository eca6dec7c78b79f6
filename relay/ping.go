package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// minPingEvery bounds how often a destination whose breaker is open is
// pinged, however short the cool-downs.
const minPingEvery = 100 * time.Millisecond

// pingDown pings, until ctx ends, every destination whose breaker is open
// and whose publisher can be pinged (flow.Dest.Ping), every half base
// cool-down: once a server that failed a ping answers one, its breaker is
// half-open at once, and the idle workers are woken to probe it.
func (r *Relay) pingDown(ctx context.Context) error {
	every := max(r.cfg.Pause.Base/2, minPingEvery)
	timeout := max(every, time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		var wg sync.WaitGroup
		var answered atomic.Bool
		for _, d := range r.dests {
			if d.Pings() {
				wg.Go(func() {
					if d.Ping(ctx, timeout) {
						answered.Store(true)
					}
				})
			}
		}
		wg.Wait()
		if answered.Load() {
			for _, s := range r.sources {
				s.wakeAll()
			}
		}
	}
}
