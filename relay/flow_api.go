package relay

import (
	"time"

	"github.com/outbox-relay/outbox-relay/relay/flow"
)

// The destinations and their flow control (package flow), as the relay's
// configuration and status name them.
type (
	Destination       = flow.Destination
	BreakerConfig     = flow.BreakerConfig
	RetryBudgetConfig = flow.RetryBudgetConfig
	RateLimitConfig   = flow.RateLimitConfig
	BreakerState      = flow.BreakerState
	BreakerChange     = flow.BreakerChange
	DestinationStatus = flow.DestinationStatus
	PauseStatus       = flow.PauseStatus
)

// The states of a destination's circuit breaker.
const (
	BreakerClosed   = flow.BreakerClosed
	BreakerHalfOpen = flow.BreakerHalfOpen
	BreakerOpen     = flow.BreakerOpen
)

// Defaults of BreakerConfig and RetryBudgetConfig.
const (
	DefaultBreakerFailures     = flow.DefaultBreakerFailures
	DefaultBreakerSuccesses    = flow.DefaultBreakerSuccesses
	DefaultBreakerFailingRows  = flow.DefaultBreakerFailingRows
	DefaultBreakerFailingFor   = flow.DefaultBreakerFailingFor
	DefaultRetryBudgetRatio    = flow.DefaultRetryBudgetRatio
	DefaultRetryBudgetMinRate  = flow.DefaultRetryBudgetMinRate
	DefaultRetryBudgetDuration = flow.DefaultRetryBudgetDuration
)

// ValidateOnDeadLetter checks a dead-letter policy: release, block, or
// empty for the default.
func ValidateOnDeadLetter(policy string) error { return flow.ValidateOnDeadLetter(policy) }

// A fleet of replicas sharing flow control (package fleet implements
// Fleet).
type (
	Fleet            = flow.Fleet
	FleetConfig      = flow.FleetConfig
	FleetSync        = flow.FleetSync
	FleetEvent       = flow.FleetEvent
	FleetDestination = flow.FleetDestination
	FleetView        = flow.FleetView
	FleetBreaker     = flow.FleetBreaker
	FleetStatus      = flow.FleetStatus
)

// What a replica tells the fleet of a destination's breaker.
const (
	FleetNothing = flow.FleetNothing
	FleetOpened  = flow.FleetOpened
	FleetClosed  = flow.FleetClosed
)

// Defaults of FleetConfig.
const (
	DefaultFleetInterval = flow.DefaultFleetInterval
	DefaultFleetLease    = flow.DefaultFleetLease
)

// MinFleetLease is the shortest lease for a sync interval: three
// intervals.
func MinFleetLease(interval time.Duration) time.Duration { return flow.MinFleetLease(interval) }

// RenewBelow is how much of a replica's lease may be left before a sync
// renews it (see flow.RenewBelow).
func RenewBelow(interval, lease time.Duration) time.Duration { return flow.RenewBelow(interval, lease) }
