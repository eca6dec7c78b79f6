package sink

import "context"

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
// lacks: Partitioner. A wrapper returns Decorate(inner, itself), so that
// wrapping a publisher never hides what the relay asks of it.
func Decorate(inner, outer Publisher) Publisher {
	if pt, ok := inner.(Partitioner); ok {
		if _, has := outer.(Partitioner); !has {
			return partitioned{Publisher: outer, Partitioner: pt}
		}
	}
	return outer
}

// partitioned is a wrapper with the Partitioner of the publisher it wraps.
type partitioned struct {
	Publisher
	Partitioner
}
