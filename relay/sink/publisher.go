package sink

import (
	"context"
	"errors"
)

// Publisher delivers records to a destination. Publish returns one error
// per record, nil for each record the destination acknowledged. Errors are
// classified with the failure classes (failure.go); unclassified errors
// are transient. Records sharing a key are given in id order and must be
// delivered in that order: after a record fails, a Publisher must not send
// the later records of its key, and reports them with ErrNotSent. The
// records are the relay's, read by other workers while they are in flight:
// a Publisher reads them and never changes them.
type Publisher interface {
	Publish(ctx context.Context, records []Record) []error
}

// Partitioner tells which partition of its topic a record goes to, for
// destinations whose topics have partitions (Kafka). The relay asks it
// only while a partition of the record's topic is paused, to hold back
// that partition's rows and let the others go.
type Partitioner interface {
	// Partition returns rec's partition without I/O, or false when it is
	// not known in advance (a record without a key is placed per publish).
	Partition(rec Record) (int, bool)
}

// Decorate returns outer, a Publisher that wraps inner (to time, trace or
// format its publishes), with the optional interfaces of inner that outer
// lacks: Partitioner and Pinger. A wrapper returns Decorate(inner,
// itself), so that wrapping a publisher never hides what the relay asks
// of it.
func Decorate(inner, outer Publisher) Publisher {
	pt, addPart := inner.(Partitioner)
	if _, has := outer.(Partitioner); has {
		addPart = false
	}
	pg, addPing := inner.(Pinger)
	if _, has := outer.(Pinger); has {
		addPing = false
	}
	switch {
	case addPart && addPing:
		return partitionedPinged{Publisher: outer, Partitioner: pt, Pinger: pg}
	case addPart:
		return partitioned{Publisher: outer, Partitioner: pt}
	case addPing:
		return pinged{Publisher: outer, Pinger: pg}
	}
	return outer
}

// partitioned is a wrapper with the Partitioner of the publisher it wraps.
type partitioned struct {
	Publisher
	Partitioner
}

// pinged is a wrapper with the Pinger of the publisher it wraps.
type pinged struct {
	Publisher
	Pinger
}

// partitionedPinged is a wrapper with both.
type partitionedPinged struct {
	Publisher
	Partitioner
	Pinger
}

// Pinger says whether the destination's server answers at all, without
// publishing: a connection it can open or keeps. The relay pings a
// destination whose circuit breaker is open, and once a ping fails and a
// later one succeeds (a server refused connections and is back), it
// probes at once rather than at the end of the cool-down. A server that
// answers pings while publishes fail is probed on the cool-downs alone.
type Pinger interface {
	Ping(ctx context.Context) error
}

// ErrPingSkipped is what a Pinger returns when it cannot look now (its
// connection is busy with a publish): the ping tells nothing either way.
var ErrPingSkipped = errors.New("ping skipped")
