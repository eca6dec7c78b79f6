package main

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay/cloudevents"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/tracing"
)

// plainSink acknowledges every record.
type plainSink struct{}

func (plainSink) Publish(_ context.Context, recs []sink.Record) []error {
	return make([]error, len(recs))
}

// partitionedSink puts every record in partition 7.
type partitionedSink struct{ plainSink }

func (partitionedSink) Partition(sink.Record) (int, bool) { return 7, true }

// The wrappers a destination's publisher goes through (its format,
// metrics, traces) keep what the relay asks of the sink: a Kafka topic's
// paused partition is held back only if the relay can tell a row's
// partition.
func TestWrappersKeepThePartitioner(t *testing.T) {
	m, err := metrics.NewRelay(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	tr := &tracing.Tracing{Provider: noop.NewTracerProvider(), Propagator: propagation.TraceContext{}}
	ce := cloudevents.Settings{Format: cloudevents.FormatCloudEvents, CloudEvents: cloudevents.Options{Source: "/test"}}
	for name, wrap := range map[string]func(sink.Publisher) sink.Publisher{
		"cloudevents": func(p sink.Publisher) sink.Publisher { return cloudevents.Wrap(p, ce, "ce_") },
		"metrics":     func(p sink.Publisher) sink.Publisher { return m.Publisher("d", p) },
		"tracing":     func(p sink.Publisher) sink.Publisher { return tr.Publisher("d", "kafka", p) },
		"all": func(p sink.Publisher) sink.Publisher {
			return tr.Publisher("d", "kafka", m.Publisher("d", cloudevents.Wrap(p, ce, "ce_")))
		},
	} {
		pt, ok := wrap(partitionedSink{}).(sink.Partitioner)
		if !ok {
			t.Errorf("%s: the wrapped publisher is no Partitioner", name)
			continue
		}
		if n, known := pt.Partition(sink.Record{}); n != 7 || !known {
			t.Errorf("%s: Partition = %d, %v; want the sink's 7, true", name, n, known)
		}
		if _, ok := wrap(plainSink{}).(sink.Partitioner); ok {
			t.Errorf("%s: a publisher without partitions came out a Partitioner", name)
		}
	}
}
