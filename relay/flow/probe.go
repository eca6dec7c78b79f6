package flow

import "github.com/outbox-relay/outbox-relay/relay/sink"

// Probes of a destination's breaker: a few rows of different keys and
// topics, first attempts rather than retries where the batch has them, so
// that rows failing on their own cannot fail the probe of a destination
// that is healthy for the rest.
const (
	ProbeRows        = 8
	ProbeRowsByTopic = ProbeRows / 2
	probeRetries     = 2
)

// probeMix is what a destination's probe holds so far.
type probeMix struct {
	keys    map[string]bool
	topics  map[string]int
	retries int
}

// fits reports whether rec, bound for topic, may join the probe.
func (m *probeMix) fits(rec sink.Record, topic string, rows int) bool {
	return rows < ProbeRows && !(rec.HasKey && m.keys[rec.Key]) &&
		m.topics[topic] < ProbeRowsByTopic && (rec.RetryCount == 0 || m.retries < probeRetries)
}

// fitsPause reports whether rec may join the probe of a paused topic or
// partition, whose rows are all of one topic.
func (m *probeMix) fitsPause(rec sink.Record) bool {
	rows := 0
	for _, n := range m.topics {
		rows += n
	}
	return rows < ProbeRows && !(rec.HasKey && m.keys[rec.Key]) && (rec.RetryCount == 0 || m.retries < probeRetries)
}

func (m *probeMix) add(rec sink.Record, topic string) {
	if rec.HasKey {
		m.keys[rec.Key] = true
	}
	m.topics[topic]++
	if rec.RetryCount > 0 {
		m.retries++
	}
}
