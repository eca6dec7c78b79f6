package relay

import (
	"context"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/flow"
)

// A destination whose breaker is open is pinged every half base
// cool-down, but at least every maxPingEvery and at most every
// minPingEvery.
const (
	minPingEvery = 100 * time.Millisecond
	maxPingEvery = 500 * time.Millisecond
)

// pingDown pings, until ctx ends, every destination whose breaker is open
// and whose publisher can be pinged (flow.Dest.Ping), every half base
// cool-down (within minPingEvery and maxPingEvery): once a server that failed a ping answers one, its breaker is
// half-open at once, and the idle workers are woken to probe it. Each
// destination is pinged on its own: a ping that waits for its timeout
// (a broker that takes connections and answers nothing) holds back no
// other destination's, and the next ping of it goes once it is over.
func (r *Relay) pingDown(ctx context.Context) error {
	every := min(max(r.cfg.Pause.Base/2, minPingEvery), maxPingEvery)
	timeout := max(every, time.Second)
	busy := make(map[*flow.Dest]bool)
	var mu sync.Mutex
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, d := range r.dests {
			if !d.Pings() {
				continue
			}
			mu.Lock()
			pinging := busy[d]
			busy[d] = true
			mu.Unlock()
			if pinging {
				continue
			}
			wg.Go(func() {
				if d.Ping(ctx, timeout) {
					for _, s := range r.sources {
						s.wakeAll()
					}
				}
				mu.Lock()
				busy[d] = false
				mu.Unlock()
			})
		}
	}
}
