package flow

import "github.com/outbox-relay/outbox-relay/relay/sink"

// evidence is what one publish says about a breaker's subject.
type evidence struct {
	sent      int     // rows delivered
	systemic  int     // systemic failures of the subject as a whole
	transient int     // transient failures of the subject as a whole
	rowFailed []int64 // rows that failed on their own
	// rowTransient counts rowFailed's failures that were not permanent:
	// a 5xx, say, rather than a refused payload; rowFirsts, those of them
	// that were the row's first attempt.
	rowTransient, rowFirsts int
	lastErr                 string
}

// add counts v, the ruling on rec, as evidence about its subject.
func (ev *evidence) add(v ruling, rec sink.Record) {
	switch v.kind {
	case rowFailure:
		ev.rowFailed = append(ev.rowFailed, rec.ID)
		if !v.permanent {
			ev.rowTransient++
			if rec.RetryCount == 0 {
				ev.rowFirsts++
			}
		}
	case systemicFailure:
		ev.systemic++
	default:
		ev.transient++
	}
	ev.lastErr = v.outcome.Error
}

// failedPartitions counts the partitions whose rows failed as partitions.
func failedPartitions(sev map[subject]*evidence) int {
	n := 0
	for s, ev := range sev {
		if s.partition != wholeTopic && ev.systemic+ev.transient > 0 {
			n++
		}
	}
	return n
}

// lastErr is one of the failures of the topics and partitions.
func lastErr(sev map[subject]*evidence) string {
	for _, ev := range sev {
		if ev.lastErr != "" {
			return ev.lastErr
		}
	}
	return ""
}
