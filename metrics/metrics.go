// Package metrics exposes what the relay does as Prometheus metrics: what
// it claims and delivers, how long publishes take, the state of each
// destination's circuit, and the backlog and dead letters in the table.
//
// Every name starts with outbox_; labels are outbox and destination
// names, topics (capped), outcomes and reasons, never row ids or URLs. Ages and lags are
// measured by the database clock.
package metrics

import (
	"context"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Namespace starts every metric name.
const Namespace = "outbox"

// NoDestination is the destination label of rows that have none: held
// back behind their key before routing, or matching no route.
const NoDestination = "none"

// Buckets of the histograms, in seconds or rows.
var (
	LagBuckets       = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
	PublishBuckets   = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30}
	ClaimBuckets     = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
	BatchSizeBuckets = []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}
)

// Relay counts what the relay does: what each outbox claims and
// delivers (Outbox, a relay.Observer), and how long publishes take
// (Publisher).
type Relay struct {
	delivered    *prometheus.CounterVec
	retried      *prometheus.CounterVec
	deferred     *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	lag          *prometheus.HistogramVec
	publish      *prometheus.HistogramVec
	claim        *prometheus.HistogramVec
	batch        *prometheus.HistogramVec
	// own holds only these, for Gatherer.
	own *prometheus.Registry
}

// Gatherer gathers these metrics alone: what the relay counted, without
// the collectors that query the database on every gather.
func (m *Relay) Gatherer() prometheus.Gatherer { return m.own }

// NewRelay registers the relay's metrics with reg.
func NewRelay(reg prometheus.Registerer) (*Relay, error) {
	m := &Relay{
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "delivered_total",
			Help: "Rows delivered: acknowledged by the destination and written back.",
		}, []string{"outbox", "destination"}),
		retried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "retried_total",
			Help: "Failed attempts that will be retried after a backoff.",
		}, []string{"outbox", "destination"}),
		deferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "deferred_total",
			Help: "Deferrals: rows put off without counting an attempt, by reason (key_waiting, circuit_open, retry_budget, destination_failing). A row held back behind its key is counted each time it is rescheduled.",
		}, []string{"outbox", "destination", "reason"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "dead_lettered_total",
			Help: "Rows moved to the dead-letter status, by reason.",
		}, []string{"outbox", "destination", "reason"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "delivery_lag_seconds",
			Help:    "Time from a row's creation to the destination's acknowledgement, by the database clock.",
			Buckets: LagBuckets,
		}, []string{"outbox", "destination"}),
		publish: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "publish_duration_seconds",
			Help:    "Duration of one publish of a batch's records to a destination.",
			Buckets: PublishBuckets,
		}, []string{"destination"}),
		claim: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "claim_duration_seconds",
			Help:    "Duration of one claim of ready rows.",
			Buckets: ClaimBuckets,
		}, []string{"outbox"}),
		batch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "batch_rows",
			Help:    "Rows returned by one claim (empty claims included).",
			Buckets: BatchSizeBuckets,
		}, []string{"outbox"}),
	}
	m.own = prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{m.delivered, m.retried, m.deferred, m.deadLettered, m.lag, m.publish, m.claim, m.batch} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
		if err := m.own.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Outbox returns the observer of the named outbox, whose rows go to
// destinations, with its series made at zero from the start, so that
// rates and increase() see the first delivery, retry or dead letter.
func (m *Relay) Outbox(name string, destinations []string) relay.Observer {
	o := outboxMetrics{m: m, name: name, claim: m.claim.WithLabelValues(name), batch: m.batch.WithLabelValues(name)}
	// Rows without a destination: held back behind their key, or
	// dead-lettered before routing.
	m.deferred.WithLabelValues(name, NoDestination, relay.DeferKeyWaiting)
	for _, r := range deadLetterReasons {
		m.deadLettered.WithLabelValues(name, NoDestination, r)
	}
	for _, d := range destinations {
		m.delivered.WithLabelValues(name, d)
		m.retried.WithLabelValues(name, d)
		m.lag.WithLabelValues(name, d)
		for _, r := range []string{relay.DeferCircuitOpen, relay.DeferRetryBudget, relay.DeferDestinationFailing, relay.DeferTopicPaused, relay.DeferPartitionPaused} {
			m.deferred.WithLabelValues(name, d, r)
		}
		for _, r := range deadLetterReasons {
			m.deadLettered.WithLabelValues(name, d, r)
		}
	}
	return o
}

// outboxMetrics is one outbox's relay.Observer.
type outboxMetrics struct {
	m            *Relay
	name         string
	claim, batch prometheus.Observer
}

// Claimed implements relay.Observer.
func (o outboxMetrics) Claimed(elapsed time.Duration, rows int) {
	o.claim.Observe(elapsed.Seconds())
	o.batch.Observe(float64(rows))
}

// Settled implements relay.Observer.
func (o outboxMetrics) Settled(destination string, kind store.OutcomeKind, reason string, lag time.Duration) {
	m := o.m
	if destination == "" {
		destination = NoDestination
	}
	switch kind {
	case store.Sent:
		m.delivered.WithLabelValues(o.name, destination).Inc()
		m.lag.WithLabelValues(o.name, destination).Observe(lag.Seconds())
	case store.Retried:
		m.retried.WithLabelValues(o.name, destination).Inc()
	case store.Deferred:
		m.deferred.WithLabelValues(o.name, destination, reason).Inc()
	case store.DeadLettered:
		m.deadLettered.WithLabelValues(o.name, destination, reason).Inc()
	}
}

// Publisher wraps p, the publisher of the named destination, to time its
// publishes.
func (m *Relay) Publisher(destination string, p sink.Publisher) sink.Publisher {
	return sink.Decorate(p, timedPublisher{next: p, hist: m.publish.WithLabelValues(destination)})
}

type timedPublisher struct {
	next sink.Publisher
	hist prometheus.Observer
}

func (t timedPublisher) Publish(ctx context.Context, records []sink.Record) []error {
	start := time.Now()
	errs := t.next.Publish(ctx, records)
	t.hist.Observe(time.Since(start).Seconds())
	return errs
}

// Circuit states, the values of outbox_circuit_state's state label.
var circuitStates = []relay.BreakerState{relay.BreakerClosed, relay.BreakerHalfOpen, relay.BreakerOpen}

func stateLabel(s relay.BreakerState) string { return s.String() }

// destinations reports the circuit of every destination, and its paused
// topics and partitions, at each scrape.
type destinations struct {
	status                   func() []relay.DestinationStatus
	state, paused            *prometheus.Desc
	topicPaused, partsPaused *prometheus.Desc
}

// NewDestinations returns a collector of the circuit state of the
// destinations that status reports (Relay.Destinations).
func NewDestinations(status func() []relay.DestinationStatus) prometheus.Collector {
	return &destinations{
		status: status,
		state: prometheus.NewDesc(Namespace+"_circuit_state",
			"1 for the current state of the destination's circuit breaker (closed, half_open, open), 0 for the others.",
			[]string{"destination", "state"}, nil),
		paused: prometheus.NewDesc(Namespace+"_destination_paused",
			"1 while the destination's circuit is open: its rows wait without counting attempts.",
			[]string{"destination"}, nil),
		topicPaused: prometheus.NewDesc(Namespace+"_topic_paused",
			"Present while a topic of the destination is paused on its own (unknown topic, topic authorization): 1 while it waits, 0 while its next rows probe it. The rest of the destination flows.",
			[]string{"destination", "topic"}, nil),
		partsPaused: prometheus.NewDesc(Namespace+"_partitions_paused",
			"Present while partitions of a topic are paused on their own (no leader): how many wait. The other partitions flow.",
			[]string{"destination", "topic"}, nil),
	}
}

func (d *destinations) Describe(ch chan<- *prometheus.Desc) {
	ch <- d.state
	ch <- d.paused
	ch <- d.topicPaused
	ch <- d.partsPaused
}

func (d *destinations) Collect(ch chan<- prometheus.Metric) {
	for _, st := range d.status() {
		for _, s := range circuitStates {
			ch <- prometheus.MustNewConstMetric(d.state, prometheus.GaugeValue, boolValue(st.Breaker == s), st.Name, stateLabel(s))
		}
		ch <- prometheus.MustNewConstMetric(d.paused, prometheus.GaugeValue, boolValue(st.Breaker == relay.BreakerOpen), st.Name)
		parts := map[string]int{}
		var topics []string
		for _, p := range st.Paused {
			if p.Partition < 0 {
				ch <- prometheus.MustNewConstMetric(d.topicPaused, prometheus.GaugeValue, boolValue(p.State == relay.BreakerOpen), st.Name, p.Topic)
				continue
			}
			if _, seen := parts[p.Topic]; !seen {
				topics = append(topics, p.Topic)
			}
			parts[p.Topic] += int(boolValue(p.State == relay.BreakerOpen))
		}
		for _, t := range topics {
			ch <- prometheus.MustNewConstMetric(d.partsPaused, prometheus.GaugeValue, float64(parts[t]), st.Name, t)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// NewBuildInfo returns outbox_build_info: always 1, with the version, the
// VCS revision, the build date and the Go version as labels.
func NewBuildInfo(version, revision, date string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help:        "Always 1; the labels say which build is running.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "build_date": date, "go_version": runtime.Version()},
	})
	g.Set(1)
	return g
}

// NewFleet returns a collector of the relay's view of its fleet (see
// relay.Relay.Fleet); it reports nothing when replicas do not share flow
// control.
func NewFleet(status func() (relay.FleetStatus, bool)) prometheus.Collector {
	return &fleet{
		status: status,
		up: prometheus.NewDesc(Namespace+"_fleet_coordination_up",
			"1 while this replica shares flow control with the fleet through the coordination tables; 0 while it cannot reach them and has flow control of its own.", nil, nil),
		replicas: prometheus.NewDesc(Namespace+"_fleet_replicas",
			"Live replicas at this replica's last sync with the fleet, itself included.", nil, nil),
		syncs: prometheus.NewDesc(Namespace+"_fleet_syncs_total",
			"Syncs with the fleet's coordination tables, failed ones included.", nil, nil),
		seconds: prometheus.NewDesc(Namespace+"_fleet_sync_seconds_total",
			"Time spent syncing with the fleet: its cost, with outbox_fleet_syncs_total.", nil, nil),
	}
}

type fleet struct {
	status                       func() (relay.FleetStatus, bool)
	up, replicas, syncs, seconds *prometheus.Desc
}

func (f *fleet) Describe(ch chan<- *prometheus.Desc) {
	ch <- f.up
	ch <- f.replicas
	ch <- f.syncs
	ch <- f.seconds
}

func (f *fleet) Collect(ch chan<- prometheus.Metric) {
	st, ok := f.status()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(f.up, prometheus.GaugeValue, boolValue(st.Up))
	ch <- prometheus.MustNewConstMetric(f.replicas, prometheus.GaugeValue, float64(st.Replicas))
	ch <- prometheus.MustNewConstMetric(f.syncs, prometheus.CounterValue, float64(st.Syncs))
	ch <- prometheus.MustNewConstMetric(f.seconds, prometheus.CounterValue, st.SyncTime.Seconds())
}
