package tracing_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
	"github.com/outbox-relay/outbox-relay/tracing"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestEnabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, false},
	} {
		if got := tracing.Enabled(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("Enabled(%v) = %v, want %v", tc.env, got, tc.want)
		}
	}
}

func TestFromEnvRejectsUnknownPropagator(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OTEL_PROPAGATORS": "tracecontext,nonsense"}
	_, err := tracing.FromEnv(context.Background(), func(k string) string { return env[k] }, "test")
	if err == nil {
		t.Fatal("FromEnv accepted an unknown propagator")
	}
}

// A delivery's span is a child of the span that wrote the row, and the
// message carries the delivery span's context on to the consumer.
func TestDeliverySpanContinuesTheRowsTrace(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	ctx := context.Background()

	// The application's span, under which it writes two rows; a third
	// row is written outside any trace.
	app := sdktrace.NewTracerProvider()
	appCtx, appSpan := app.Tracer("app").Start(ctx, "place order")
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	write := func(ctx context.Context, key string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
			_, err := producer.Write(ctx, tx, outbox.Message{Topic: "orders", Key: key, Payload: []byte(`{}`)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	write(appCtx, "a")
	write(appCtx, "b")
	appSpan.End()
	write(ctx, "c")

	exp := tracetest.NewInMemoryExporter()
	tr := &tracing.Tracing{
		Provider:   sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)),
		Propagator: propagation.TraceContext{},
	}
	p, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs(), DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	st, err := store.New(s.Pool, store.Config{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Config{Store: st, Publisher: tr.Publisher("kafka", "kafka", p), PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	consumeCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msgs := kafkatest.Consume(consumeCtx, t, c.ListenAddrs(), "orders", 3)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 3 {
		t.Fatalf("consumed %d messages, want 3", len(msgs))
	}

	keyOf := map[int64]string{} // by outbox id, from the messages
	for _, m := range msgs {
		id, _ := strconv.ParseInt(m.Headers[sink.HeaderID], 10, 64)
		keyOf[id] = string(m.Key)
	}
	spans := map[string]tracetest.SpanStub{} // by key
	for _, sp := range exp.GetSpans() {
		if sp.Name != "send orders" {
			t.Errorf("span %q, want send orders", sp.Name)
			continue
		}
		if sp.SpanKind != trace.SpanKindProducer {
			t.Errorf("span kind %v, want producer", sp.SpanKind)
		}
		for _, a := range sp.Attributes {
			if a.Key == "messaging.kafka.message.key" {
				t.Errorf("span carries the message key %q: keys often identify people", a.Value.AsString())
			}
			if a.Key == "outbox.id" {
				spans[keyOf[a.Value.AsInt64()]] = sp
			}
		}
	}
	if len(spans) != 3 {
		t.Fatalf("got spans for keys %v, want a, b and c", keysOf(spans))
	}
	want := appSpan.SpanContext()
	for _, k := range []string{"a", "b"} {
		sp := spans[k]
		if sp.Parent.TraceID() != want.TraceID() || sp.Parent.SpanID() != want.SpanID() || !sp.Parent.IsRemote() {
			t.Errorf("row %s: delivery span's parent is %v/%v, want the application's span %v/%v",
				k, sp.Parent.TraceID(), sp.Parent.SpanID(), want.TraceID(), want.SpanID())
		}
	}
	if spans["c"].Parent.IsValid() {
		t.Errorf("row c had no trace; its delivery span has parent %v", spans["c"].Parent.SpanID())
	}
	for _, m := range msgs {
		sp := spans[string(m.Key)]
		got := propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(m.Headers))
		sc := trace.SpanContextFromContext(got)
		if sc.TraceID() != sp.SpanContext.TraceID() || sc.SpanID() != sp.SpanContext.SpanID() {
			t.Errorf("message %s carries traceparent %q; want the delivery span %v/%v",
				m.Key, m.Headers["traceparent"], sp.SpanContext.TraceID(), sp.SpanContext.SpanID())
		}
	}
}

type failSecond struct{ got []sink.Record }

func (f *failSecond) Publish(_ context.Context, recs []sink.Record) []error {
	f.got = recs
	errs := make([]error, len(recs))
	errs[1] = errors.New("broker said no")
	return errs
}

// A failed record's span says so; the records handed on carry the span's
// context in a copy of their headers, never in the caller's map.
func TestPublisherRecordsFailuresAndCopiesHeaders(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tr := &tracing.Tracing{Provider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)), Propagator: propagation.TraceContext{}}
	inner := &failSecond{}
	shared := map[string]string{"content-type": "application/json"}
	recs := []sink.Record{{ID: 1, Topic: "t", Headers: shared}, {ID: 2, Topic: "t", Headers: shared}}
	errs := tr.Publisher("hooks", "", inner).Publish(context.Background(), recs)
	if errs[0] != nil || errs[1] == nil {
		t.Fatalf("errors %v, want the inner publisher's", errs)
	}
	if len(shared) != 1 {
		t.Errorf("the caller's headers were changed: %v", shared)
	}
	for _, r := range inner.got {
		if r.Headers["traceparent"] == "" || r.Headers["content-type"] != "application/json" {
			t.Errorf("record %d headers %v: want traceparent added to the row's own", r.ID, r.Headers)
		}
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	for _, sp := range spans {
		failed := sp.Status.Code == codes.Error
		var id int64
		for _, a := range sp.Attributes {
			if a.Key == "outbox.id" {
				id = a.Value.AsInt64()
			}
		}
		if failed != (id == 2) {
			t.Errorf("span of row %d has status %v", id, sp.Status)
		}
	}
}

func keysOf(m map[string]tracetest.SpanStub) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
