package metrics

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Defaults of BacklogConfig.
const (
	DefaultBacklogMaxAge  = 10 * time.Second
	DefaultBacklogTimeout = 5 * time.Second
	DefaultMaxTopics      = 50
)

// OtherTopics is the topic label that sums the topics past MaxTopics.
const OtherTopics = "_other"

// BacklogSource measures the pending rows by topic (store.Store).
type BacklogSource interface {
	Backlog(ctx context.Context) ([]store.TopicBacklog, error)
}

// DeadLetterSource counts dead letters (deadletter.Store).
type DeadLetterSource interface {
	Stats(ctx context.Context) (*deadletter.Stats, error)
}

// BacklogConfig configures NewBacklog.
type BacklogConfig struct {
	// Backlog and DeadLetters are queried at scrapes. Required.
	Backlog     BacklogSource
	DeadLetters DeadLetterSource
	// MaxAge is how long a measurement is reused by later scrapes: the
	// queries read every pending row and every dead letter, and every
	// replica answers its own scrapes. Default 10s; negative measures at
	// every scrape.
	MaxAge time.Duration
	// Timeout bounds the queries of one measurement. Default 5s.
	Timeout time.Duration
	// MaxTopics bounds the topic label's values: the topics with the
	// most pending rows keep their own, the rest are summed under
	// OtherTopics. Default 50.
	MaxTopics int
	// Logger receives failed measurements. Default discards.
	Logger *slog.Logger
}

// backlog reports the table's state at scrapes: pending rows and the
// oldest pending age by topic, dead letters by reason, and parked keys.
type backlog struct {
	cfg                                             BacklogConfig
	pending, oldest, dead, deadAge, parked, failing *prometheus.Desc
	failures                                        prometheus.Counter

	mu     sync.Mutex
	at     time.Time // when last measured, zero before the first
	topics []store.TopicBacklog
	stats  *deadletter.Stats
	seen   map[string]bool // topics reported before: reported at zero once drained
}

// NewBacklog returns a collector of the table's state. When a measurement
// fails, its gauges are left out of the scrape and
// outbox_backlog_query_failures_total counts it.
func NewBacklog(cfg BacklogConfig) prometheus.Collector {
	if cfg.MaxAge == 0 {
		cfg.MaxAge = DefaultBacklogMaxAge
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultBacklogTimeout
	}
	if cfg.MaxTopics <= 0 {
		cfg.MaxTopics = DefaultMaxTopics
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &backlog{
		cfg: cfg,
		pending: prometheus.NewDesc(Namespace+"_pending_rows",
			"Rows waiting for delivery (ready or waiting for a retry), by topic.", []string{"topic"}, nil),
		oldest: prometheus.NewDesc(Namespace+"_oldest_pending_age_seconds",
			"Age of the oldest pending row by the database clock, by topic; 0 when none is pending.", []string{"topic"}, nil),
		dead: prometheus.NewDesc(Namespace+"_dead_letters",
			"Rows in the dead-letter status, by reason.", []string{"reason"}, nil),
		deadAge: prometheus.NewDesc(Namespace+"_oldest_dead_letter_age_seconds",
			"How long the oldest unhandled dead letter has waited for an operator, by the database clock; 0 when there is none.", nil, nil),
		parked: prometheus.NewDesc(Namespace+"_parked_keys",
			"Keys held by a dead-lettered row until an operator releases them.", nil, nil),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "backlog_query_failures_total",
			Help: "Measurements of the backlog and dead letters that failed; their gauges were left out of the scrape.",
		}),
		seen: map[string]bool{},
	}
}

func (b *backlog) Describe(ch chan<- *prometheus.Desc) {
	ch <- b.pending
	ch <- b.oldest
	ch <- b.dead
	ch <- b.deadAge
	ch <- b.parked
	b.failures.Describe(ch)
}

func (b *backlog) Collect(ch chan<- prometheus.Metric) {
	topics, stats, ok := b.measure()
	b.failures.Collect(ch)
	if !ok {
		return
	}
	for _, t := range topics {
		// A topic name that is not valid UTF-8 (a SQL_ASCII database)
		// cannot be a label value: leave it out rather than fail.
		if m, err := prometheus.NewConstMetric(b.pending, prometheus.GaugeValue, float64(t.Pending), t.Topic); err == nil {
			ch <- m
			ch <- prometheus.MustNewConstMetric(b.oldest, prometheus.GaugeValue, t.OldestAge.Seconds(), t.Topic)
		}
	}
	for _, r := range deadLetterReasons {
		ch <- prometheus.MustNewConstMetric(b.dead, prometheus.GaugeValue, float64(stats.ByReason[r]), r)
	}
	ch <- prometheus.MustNewConstMetric(b.deadAge, prometheus.GaugeValue, stats.OldestAge.Seconds())
	ch <- prometheus.MustNewConstMetric(b.parked, prometheus.GaugeValue, float64(stats.ParkedKeys))
}

var deadLetterReasons = []string{sink.ReasonPermanent, sink.ReasonRetriesExhausted, sink.ReasonMaxAgeExceeded,
	sink.ReasonTooLarge, sink.ReasonNoRoute, sink.ReasonInvalidMessage}

// measure returns the latest measurement, taking a new one when the last
// is older than MaxAge. Scrapes at the same time wait for one
// measurement.
func (b *backlog) measure() ([]store.TopicBacklog, *deadletter.Stats, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.at.IsZero() && time.Since(b.at) < b.cfg.MaxAge {
		return b.topics, b.stats, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Timeout)
	defer cancel()
	topics, err := b.cfg.Backlog.Backlog(ctx)
	var stats *deadletter.Stats
	if err == nil {
		stats, err = b.cfg.DeadLetters.Stats(ctx)
	}
	if err != nil {
		b.failures.Inc()
		b.at = time.Time{}
		b.cfg.Logger.Warn("measuring the backlog for metrics failed", slog.Any("error", err))
		return nil, nil, false
	}
	b.topics, b.stats, b.at = b.capTopics(topics), stats, time.Now()
	return b.topics, b.stats, true
}

// capTopics keeps the MaxTopics topics with the most pending rows and sums
// the others, and reports topics seen before at zero.
func (b *backlog) capTopics(topics []store.TopicBacklog) []store.TopicBacklog {
	slices.SortFunc(topics, func(x, y store.TopicBacklog) int {
		return cmp.Or(cmp.Compare(y.Pending, x.Pending), cmp.Compare(x.Topic, y.Topic))
	})
	out := topics
	if len(topics) > b.cfg.MaxTopics {
		out = slices.Clone(topics[:b.cfg.MaxTopics])
		other := store.TopicBacklog{Topic: OtherTopics}
		for _, t := range topics[b.cfg.MaxTopics:] {
			other.Pending += t.Pending
			other.OldestAge = max(other.OldestAge, t.OldestAge)
		}
		out = append(out, other)
	}
	// Topics reported before and now drained are reported at zero, so
	// their series end at 0 rather than vanish; a topic summed into
	// OtherTopics still has rows and is not. The set is bounded: past
	// twice MaxTopics it starts again from the topics of this scrape.
	present := make(map[string]bool, len(topics)+1)
	for _, t := range topics {
		present[t.Topic] = true
	}
	if len(topics) > b.cfg.MaxTopics {
		present[OtherTopics] = true
	}
	for t := range b.seen {
		if !present[t] {
			out = append(out, store.TopicBacklog{Topic: t})
		}
	}
	if len(b.seen) > 2*b.cfg.MaxTopics {
		clear(b.seen)
	}
	for _, t := range out {
		b.seen[t.Topic] = true
	}
	return out
}
