package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/relay"
)

// Coordination shares each destination's flow control among the relay's
// replicas (its breaker with one probe at a time, max_in_flight, the
// retry budget and the rate limit), through small tables in one outbox's
// schema.
type Coordination struct {
	// Enabled turns sharing on. Default true; false gives each relay
	// process flow control of its own.
	Enabled bool `koanf:"enabled"`
	// Outbox names the outbox whose database and schema hold the
	// coordination tables; every replica must name the same one. Default
	// the first outbox.
	Outbox string `koanf:"outbox"`
	// Interval is how often a replica syncs: how long another replica's
	// breaker takes to reach it. Default 200ms.
	Interval time.Duration `koanf:"interval"`
	// Lease is how long a replica that stops syncing keeps its share: a
	// replica that dies frees its share and any probe it held after it,
	// and one that cannot reach the coordination database falls back to
	// per-process flow control after it. Default 5s; at least three
	// intervals.
	Lease time.Duration `koanf:"lease"`
}

func defaultCoordination() Coordination {
	return Coordination{Enabled: true, Interval: relay.DefaultFleetInterval, Lease: relay.DefaultFleetLease}
}

// CoordinationOutbox is the outbox whose database holds the coordination
// tables.
func (c *Config) CoordinationOutbox() (OutboxSettings, error) {
	all := c.Outboxes()
	if c.Coordination.Outbox == "" {
		return all[0], nil
	}
	return c.Outbox(c.Coordination.Outbox)
}

func (c *Config) coordinationProblems() []string {
	k := c.Coordination
	if !k.Enabled {
		return nil
	}
	var p []string
	if k.Outbox != "" {
		var names []string
		found := false
		for _, o := range c.Outboxes() {
			names = append(names, o.Name)
			found = found || o.Name == k.Outbox
		}
		if !found {
			p = append(p, fmt.Sprintf("coordination.outbox is %q; it must name an outbox: %s", k.Outbox, strings.Join(names, ", ")))
		}
	}
	if k.Interval <= 0 {
		p = append(p, fmt.Sprintf("coordination.interval is %s; it must be positive", k.Interval))
	}
	if k.Lease < relay.MinFleetLease(k.Interval) {
		p = append(p, fmt.Sprintf("coordination.lease is %s; it must be at least three intervals (%s)", k.Lease, relay.MinFleetLease(k.Interval)))
	}
	return p
}
