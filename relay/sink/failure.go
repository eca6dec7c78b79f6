package sink

import (
	"errors"
	"fmt"
	"time"
)

// Class says how a failure is handled.
type Class int

const (
	// ClassTransient failures are retried with backoff and count an attempt:
	// timeouts, connection resets, HTTP 429/5xx, Kafka retriable errors.
	ClassTransient Class = iota
	// ClassPermanent failures dead-letter the row at once: malformed or
	// oversized messages, HTTP 400/404/410/422, Kafka InvalidTopic.
	ClassPermanent
	// ClassSystemic failures mean the destination as a whole is unusable:
	// refused connections, DNS failures, authentication and authorization
	// errors. The destination is paused and rows are deferred without
	// counting an attempt, so an outage never dead-letters healthy rows.
	ClassSystemic
)

func (c Class) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassPermanent:
		return "permanent"
	case ClassSystemic:
		return "systemic"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Scope is what a failure speaks for: the part of the destination that it
// shows to be failing. The class decides attempts and dead-lettering; the
// scope decides what pauses, so that a failing record, topic or partition
// never holds up the healthy rest of its destination.
type Scope int

const (
	// ScopeUnset takes the class's default scope: the destination for a
	// systemic failure, the record for the others.
	ScopeUnset Scope = iota
	// ScopeRecord failures concern the record alone (refused payload,
	// 4xx, too large, invalid): it follows the retry policy, and nothing
	// pauses.
	ScopeRecord
	// ScopeTopic failures concern every record of the record's topic
	// (unknown topic, topic authorization): the topic pauses.
	ScopeTopic
	// ScopePartition failures concern the records of one partition of
	// the topic (no leader): that partition pauses.
	ScopePartition
	// ScopeDestination failures concern the whole destination
	// (connection refused, DNS, TLS, cluster authorization, no answer):
	// its circuit breaker counts them.
	ScopeDestination
)

func (s Scope) String() string {
	switch s {
	case ScopeUnset:
		return "unset"
	case ScopeRecord:
		return "record"
	case ScopeTopic:
		return "topic"
	case ScopePartition:
		return "partition"
	case ScopeDestination:
		return "destination"
	}
	return fmt.Sprintf("Scope(%d)", int(s))
}

// Dead-letter reasons: the values the outbox table's check constraint allows.
const (
	ReasonPermanent        = "permanent"
	ReasonRetriesExhausted = "retries_exhausted"
	ReasonMaxAgeExceeded   = "max_age_exceeded"
	ReasonTooLarge         = "too_large"
	ReasonNoRoute          = "no_route"
	ReasonInvalidMessage   = "invalid_message"
)

// ErrNotSent marks a record a Publisher did not send because an earlier
// record of the same key in the call failed. The relay leaves such a row as
// it was, without counting an attempt: its turn comes after the failed
// row's.
var ErrNotSent = errors.New("not sent: an earlier message with the same key failed")

// Error is a classified delivery failure.
type Error struct {
	Class Class
	// Scope is what the failure speaks for; ScopeUnset takes the class's
	// default (Classify fills it in).
	Scope Scope
	// Partition is the failing partition of a ScopePartition failure.
	Partition int
	// Reason is the dead-letter reason of a permanent failure; empty means
	// ReasonPermanent.
	Reason string
	// RetryAfter is the destination's hint (HTTP Retry-After); zero if none.
	RetryAfter time.Duration
	Err        error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Permanent classifies err as permanent with the given dead-letter reason
// (ReasonPermanent when empty).
func Permanent(err error, reason string) error {
	return &Error{Class: ClassPermanent, Reason: reason, Err: err}
}

// Transient classifies err as transient, with an optional retry-after hint.
func Transient(err error, retryAfter time.Duration) error {
	return &Error{Class: ClassTransient, RetryAfter: retryAfter, Err: err}
}

// Systemic classifies err as a failure of the destination as a whole.
func Systemic(err error) error { return &Error{Class: ClassSystemic, Err: err} }

// Classify returns err's classification, its scope filled in;
// unclassified errors are transient failures of the record.
func Classify(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		if e.Scope == ScopeUnset {
			c := *e
			c.Scope = defaultScope(c.Class)
			return &c
		}
		return e
	}
	return &Error{Class: ClassTransient, Scope: ScopeRecord, Err: err}
}

// defaultScope is the scope of a failure its sink did not scope: a
// systemic failure is the destination's, by definition; any other is the
// record's, which pauses nothing.
func defaultScope(c Class) Scope {
	if c == ClassSystemic {
		return ScopeDestination
	}
	return ScopeRecord
}

// DestinationFailure classifies err as a failure of the destination as a
// whole: a transient one (no answer, a reset connection) counts towards
// its breaker; a systemic one opens it.
func DestinationFailure(class Class, err error) error {
	return &Error{Class: class, Scope: ScopeDestination, Err: err}
}

// TopicFailure classifies err as a failure of every record of its topic.
func TopicFailure(class Class, err error) error {
	return &Error{Class: class, Scope: ScopeTopic, Err: err}
}

// PartitionFailure classifies err as a failure of every record bound for
// partition of its topic.
func PartitionFailure(class Class, partition int, err error) error {
	return &Error{Class: class, Scope: ScopePartition, Partition: partition, Err: err}
}
