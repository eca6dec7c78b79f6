package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/console"
	"github.com/outbox-relay/outbox-relay/relay"
)

// consoleTimeout bounds the backlog count behind one overview; backlogCache
// is how long a count is shown again before the next, so that several
// open consoles cost the database one count every few seconds.
const (
	consoleTimeout = 2 * time.Second
	backlogCache   = 3 * time.Second
)

// consoleStatus reports the relay's state for the console's overview.
func consoleStatus(r *relay.Relay, outboxes []*runOutbox, redact func(string) string) func(context.Context) console.Status {
	var mu sync.Mutex
	type counted struct {
		at      time.Time
		pending int64
		oldest  time.Duration
		err     string
	}
	cache := map[string]counted{}
	backlog := func(ctx context.Context, o *runOutbox) counted {
		mu.Lock()
		defer mu.Unlock()
		if c, ok := cache[o.name]; ok && time.Since(c.at) < backlogCache {
			return c
		}
		c := counted{at: time.Now()}
		// Not the request's context: a closed tab must not leave an
		// error in the cache for the others.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), consoleTimeout)
		b, err := o.backlog(cctx)
		cancel()
		if err != nil {
			c.err = "backlog unknown: " + redact(err.Error())
		}
		c.pending, c.oldest = b.Pending, b.OldestPending
		cache[o.name] = c
		return c
	}
	return func(ctx context.Context) console.Status {
		var st console.Status
		stats := map[string]relay.Stats{}
		for _, o := range r.Outboxes() {
			stats[o.Name] = o.Stats
		}
		for _, o := range outboxes {
			b := backlog(ctx, o)
			s := stats[o.name]
			st.Outboxes = append(st.Outboxes, console.OutboxStatus{Name: o.name, Pending: b.pending,
				OldestPending: b.oldest.Round(time.Millisecond), BacklogError: b.err,
				Delivered: s.Delivered, Retried: s.Retried, DeadLettered: s.DeadLettered, Capture: captureStatus(ctx, o, redact)})
		}
		for _, d := range r.Destinations() {
			ds := console.DestinationStatus{Name: d.Name, Breaker: d.Breaker.String(), OpenUntil: d.OpenUntil,
				LastError: d.LastError, InFlight: d.InFlight, MaxInFlight: d.MaxInFlight, FleetMaxInFlight: d.FleetMaxInFlight,
				RateLimit: d.RateLimit}
			for _, p := range d.Paused {
				what := p.Topic
				if p.Partition >= 0 {
					what = fmt.Sprintf("%s[%d]", p.Topic, p.Partition)
				}
				ds.Paused = append(ds.Paused, what+" ("+p.State.String()+")")
				ds.Pauses = append(ds.Pauses, console.Pause{Topic: p.Topic, Partition: p.Partition, State: p.State.String(),
					OpenUntil: p.OpenUntil, LastError: p.LastError})
			}
			st.Destinations = append(st.Destinations, ds)
		}
		return st
	}
}

// captureStatus is the slot of an outbox captured from the log, nil for
// the table.
func captureStatus(ctx context.Context, o *runOutbox, redact func(string) string) *console.CaptureStatus {
	src := o.relay.Log
	if src == nil {
		return nil
	}
	c := &console.CaptureStatus{Slot: src.Slot(), Streaming: src.Streaming(), Problem: src.Problem()}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), consoleTimeout)
	defer cancel()
	st, err := src.State(cctx, o.pool)
	switch {
	case err != nil:
		c.Error = "slot unknown: " + redact(err.Error())
	case !st.Exists:
		c.WALStatus = "missing"
	default:
		c.WALStatus, c.Confirmed, c.LagBytes = st.WALStatus, st.Confirmed, st.LagBytes
	}
	return c
}
