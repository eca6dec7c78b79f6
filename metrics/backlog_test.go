package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// scriptedBacklog answers each measurement with the next of its answers.
type scriptedBacklog struct {
	mu      sync.Mutex
	answers [][]store.TopicBacklog
	calls   int
	fail    bool
}

func (s *scriptedBacklog) Backlog(context.Context) ([]store.TopicBacklog, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.fail {
		return nil, errors.New("database down")
	}
	a := s.answers[0]
	if len(s.answers) > 1 {
		s.answers = s.answers[1:]
	}
	return append([]store.TopicBacklog(nil), a...), nil
}

type stats struct{}

func (stats) Stats(context.Context) (*deadletter.Stats, error) {
	return &deadletter.Stats{ByReason: map[string]int{"permanent": 3}, ParkedKeys: 1, OldestAge: 90 * time.Minute}, nil
}

func TestBacklogCapsTopicsAndKeepsDrainedOnesAtZero(t *testing.T) {
	t.Parallel()
	var many []store.TopicBacklog
	for i := range 5 {
		many = append(many, store.TopicBacklog{Topic: fmt.Sprintf("t%d", i), Pending: int64(10 * (i + 1)), OldestAge: time.Duration(i+1) * time.Second})
	}
	src := &scriptedBacklog{answers: [][]store.TopicBacklog{many, {{Topic: "t4", Pending: 1, OldestAge: time.Second}}}}
	c := metrics.NewBacklog(metrics.BacklogConfig{Backlog: src, DeadLetters: stats{}, MaxAge: -1, MaxTopics: 3})

	// Three topics with the most rows, the other two summed.
	want := `
# HELP outbox_pending_rows Rows waiting for delivery (ready or waiting for a retry), by topic.
# TYPE outbox_pending_rows gauge
outbox_pending_rows{topic="_other"} 30
outbox_pending_rows{topic="t2"} 30
outbox_pending_rows{topic="t3"} 40
outbox_pending_rows{topic="t4"} 50
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "outbox_pending_rows"); err != nil {
		t.Error(err)
	}
	// t2, t3 and _other drained: reported at zero, with no age.
	want = `
# HELP outbox_oldest_pending_age_seconds Age of the oldest pending row by the database clock, by topic; 0 when none is pending.
# TYPE outbox_oldest_pending_age_seconds gauge
outbox_oldest_pending_age_seconds{topic="_other"} 0
outbox_oldest_pending_age_seconds{topic="t2"} 0
outbox_oldest_pending_age_seconds{topic="t3"} 0
outbox_oldest_pending_age_seconds{topic="t4"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "outbox_oldest_pending_age_seconds"); err != nil {
		t.Error(err)
	}
	want = `
# HELP outbox_dead_letters Rows in the dead-letter status, by reason.
# TYPE outbox_dead_letters gauge
outbox_dead_letters{reason="invalid_message"} 0
outbox_dead_letters{reason="max_age_exceeded"} 0
outbox_dead_letters{reason="no_route"} 0
outbox_dead_letters{reason="permanent"} 3
outbox_dead_letters{reason="retries_exhausted"} 0
outbox_dead_letters{reason="too_large"} 0
# HELP outbox_oldest_dead_letter_age_seconds How long the oldest unhandled dead letter has waited for an operator, by the database clock; 0 when there is none.
# TYPE outbox_oldest_dead_letter_age_seconds gauge
outbox_oldest_dead_letter_age_seconds 5400
# HELP outbox_parked_keys Keys held by a dead-lettered row until an operator releases them.
# TYPE outbox_parked_keys gauge
outbox_parked_keys 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "outbox_dead_letters", "outbox_oldest_dead_letter_age_seconds", "outbox_parked_keys"); err != nil {
		t.Error(err)
	}
}

func TestBacklogReusesAMeasurementAndReportsFailures(t *testing.T) {
	t.Parallel()
	src := &scriptedBacklog{answers: [][]store.TopicBacklog{{{Topic: "a", Pending: 2}}}}
	c := metrics.NewBacklog(metrics.BacklogConfig{Backlog: src, DeadLetters: stats{}, MaxAge: time.Hour})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	for range 3 {
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
	}
	if src.calls != 1 {
		t.Errorf("three scrapes within MaxAge measured %d times, want once", src.calls)
	}

	failing := &scriptedBacklog{fail: true}
	c = metrics.NewBacklog(metrics.BacklogConfig{Backlog: failing, DeadLetters: stats{}, MaxAge: time.Hour})
	want := `
# HELP outbox_backlog_query_failures_total Measurements of the backlog and dead letters that failed; their gauges were left out of the scrape.
# TYPE outbox_backlog_query_failures_total counter
outbox_backlog_query_failures_total 2
`
	_ = testutil.CollectAndCount(c) // the first failure
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err) // a failure is not cached: the second scrape tries again
	}
}
