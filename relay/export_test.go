package relay

import "github.com/outbox-relay/outbox-relay/internal/testsignal"

// What the tests of this directory see of the relay's test signals.
type CleanedBatch = cleanedBatch

// TestSignals tell a test what the relay did.
type TestSignals struct {
	// BreakerChanged: a destination's breaker changed state.
	BreakerChanged *testsignal.Signal[BreakerChange]
	// Cleaned: the cleaner ran one delete.
	Cleaned *testsignal.Signal[CleanedBatch]
	// LeaseWritten: a leased delivery wrote back, with the rows it
	// settled.
	LeaseWritten *testsignal.Signal[int]
}

// InitTestSignals starts the relay's test signals; call it before Run.
func (r *Relay) InitTestSignals() TestSignals {
	r.breakerChanged.Init()
	r.cleaned.Init()
	r.leaseWritten.Init()
	return TestSignals{
		BreakerChanged: &r.breakerChanged,
		Cleaned:        &r.cleaned,
		LeaseWritten:   &r.leaseWritten,
	}
}

// FleetResting reports whether the relay's fleet syncs at its quiet pace.
func (r *Relay) FleetResting() bool { return r.fleet != nil && r.fleet.Resting() }
