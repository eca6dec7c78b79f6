package flow

import (
	"time"

	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// scopeState is what settling knows, besides the row and its error, when
// it decides a failed row's outcome: the destination's policy and whether
// the probe the row rode failed.
type scopeState struct {
	destination string
	policy      *retry.Policy
	// block parks a dead-lettered row's key.
	block bool
	// destProbeFailed: the row rode a probe of the destination that
	// delivered nothing (see failedProbes).
	destProbeFailed bool
	// pauseProbeFailed: the topics and partitions whose probes in this
	// publish delivered nothing.
	pauseProbeFailed map[subject]bool
}

// failureKind is what a failure says about its subject.
type failureKind int

const (
	// rowFailure: the row failed on its own (a permanent failure, or one
	// the sink scoped to the record).
	rowFailure failureKind = iota
	// systemicFailure: the subject as a whole cannot be used now.
	systemicFailure
	// transientFailure: the subject as a whole failed this time.
	transientFailure
)

// ruling is the decision about one row whose publish failed.
type ruling struct {
	// outcome is Retried with its delay, DeadLettered with its reason, or
	// Deferred; a deferral's delay comes later, from the cool-down of
	// what it waits on.
	outcome store.Outcome
	// about is the topic or partition the failure is evidence about, when
	// scoped; otherwise it is about the destination.
	about  subject
	scoped bool
	kind   failureKind
	// permanent: the failure was classified permanent.
	permanent bool
	// probed: the row rode a failed probe; deferred, it waits past the
	// next cool-down so that the next probe takes other rows.
	probed bool
}

// judge decides the outcome of one row whose publish failed with err, age
// after the row was written. It reads nothing but its arguments (the
// policy's jitter aside), so a table test covers every path.
func judge(rec sink.Record, err error, age time.Duration, s scopeState) ruling {
	ce := sink.Classify(err)
	v := ruling{permanent: ce.Class == sink.ClassPermanent}
	if !v.permanent {
		switch ce.Scope {
		case sink.ScopeTopic:
			v.about, v.scoped = subject{rec.Topic, wholeTopic}, true
		case sink.ScopePartition:
			v.about, v.scoped = subject{rec.Topic, ce.Partition}, true
			if ce.Partition < 0 { // the sink did not say which: the topic
				v.about.partition = wholeTopic
			}
		}
	}
	switch {
	case v.permanent || ce.Scope == sink.ScopeRecord:
		v.kind = rowFailure
	case ce.Class == sink.ClassSystemic:
		v.kind = systemicFailure
	default:
		v.kind = transientFailure
	}
	// The failure of a probe that failed is the outage's: the row waits
	// for the next probe, and ends by age only.
	v.probed = !v.permanent && (s.destProbeFailed ||
		v.scoped && (s.pauseProbeFailed[v.about] || s.pauseProbeFailed[subject{rec.Topic, wholeTopic}]))
	var dec retry.Decision
	switch {
	case v.probed && s.policy.Outlived(age):
		dec = retry.Decision{Action: retry.DeadLetter, Reason: sink.ReasonMaxAgeExceeded}
	case v.probed:
		dec = retry.Decision{Action: retry.Defer}
	default:
		dec = s.policy.Decide(retry.Failure{Err: err, Attempt: rec.RetryCount, Age: age, PrevDelay: rec.LastDelay})
	}
	o := store.Outcome{ID: rec.ID, Error: err.Error(), Class: ce.Class.String(), Attempted: true, Destination: s.destination}
	switch dec.Action {
	case retry.Retry:
		o.Kind, o.Delay = store.Retried, dec.Delay
	case retry.Defer:
		o.Kind, o.Reason = store.Deferred, DeferDestinationFailing
		if v.scoped {
			o.Reason = DeferTopicPaused
			if v.about.partition != wholeTopic {
				o.Reason = DeferPartitionPaused
			}
		}
	case retry.DeadLetter:
		o.Kind, o.Reason = store.DeadLettered, dec.Reason
		o.ParkKey = s.block && rec.HasKey
	}
	v.outcome = o
	return v
}
