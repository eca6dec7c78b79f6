// Package tracing traces deliveries with OpenTelemetry: one span per
// delivered row, a child of the span that wrote the row (its traceparent
// header), and carried on to the destination in the message's headers so
// that consumers continue the trace.
//
// Tracing is configured with the standard OTEL_* environment variables and
// is off unless an exporter is asked for.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// InstrumentationName names the relay's tracer.
const InstrumentationName = "github.com/outbox-relay/outbox-relay"

// Enabled reports whether the environment asks for traces: an exporter
// other than none in OTEL_TRACES_EXPORTER, or an OTLP endpoint, and not
// OTEL_SDK_DISABLED=true. getenv is os.Getenv or a stand-in.
func Enabled(getenv func(string) string) bool {
	if disabled, _ := strconv.ParseBool(getenv("OTEL_SDK_DISABLED")); disabled {
		return false
	}
	if e := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); e != "" {
		return e != "none"
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Tracing is a tracer provider and the propagator of trace context in
// message headers.
type Tracing struct {
	Provider   trace.TracerProvider
	Propagator propagation.TextMapPropagator
	// Shutdown flushes the spans not yet exported.
	Shutdown func(context.Context) error
}

// FromEnv builds tracing from the OTEL_* environment variables
// (exporter, endpoint, protocol, headers, sampler, resource attributes,
// service name, propagators). Call it only when Enabled.
func FromEnv(ctx context.Context, getenv func(string) string, version string) (*Tracing, error) {
	// W3C Trace Context and Baggage unless OTEL_PROPAGATORS names others;
	// a name it does not know is an error rather than a silent default.
	var prop propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	if names := strings.TrimSpace(getenv("OTEL_PROPAGATORS")); names != "" {
		var list []string
		for _, n := range strings.Split(names, ",") {
			list = append(list, strings.TrimSpace(n))
		}
		p, err := autoprop.TextMapPropagator(list...)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTEL_PROPAGATORS: %w", err)
		}
		prop = p
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: exporter from OTEL_* variables: %w", err)
	}
	// Later detectors win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the defaults.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("outbox-relay"), semconv.ServiceVersion(version)),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// The sampler comes from OTEL_TRACES_SAMPLER (default: follow the
	// parent's decision, sample roots).
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{Provider: tp, Propagator: prop, Shutdown: tp.Shutdown}, nil
}

// Publisher wraps the publisher of a destination to trace each record it
// delivers. system is the messaging system for the spans' attributes
// ("kafka"), or "" for HTTP endpoints.
func (t *Tracing) Publisher(destination, system string, p sink.Publisher) sink.Publisher {
	return sink.Decorate(p, &tracedPublisher{
		next:   p,
		tracer: t.Provider.Tracer(InstrumentationName),
		prop:   t.Propagator,
		dest:   destination,
		system: system,
	})
}

type tracedPublisher struct {
	next   sink.Publisher
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	dest   string
	system string
}

// Publish starts a span per record, parented on the record's own trace
// context, puts the span's context in a copy of the record's headers,
// and ends each span with the record's result.
func (p *tracedPublisher) Publish(ctx context.Context, records []sink.Record) []error {
	spans := make([]trace.Span, len(records))
	out := make([]sink.Record, len(records))
	for i, rec := range records {
		parent := p.prop.Extract(ctx, propagation.MapCarrier(rec.Headers))
		attrs := []attribute.KeyValue{
			semconv.MessagingOperationTypeSend,
			semconv.MessagingDestinationName(rec.Topic),
			semconv.MessagingMessageID(rec.EventID.String()),
			attribute.Int64("outbox.id", rec.ID),
			attribute.String("outbox.destination", p.dest),
			attribute.Int("outbox.attempt", rec.RetryCount+1),
		}
		if p.system != "" {
			attrs = append(attrs, semconv.MessagingSystemKey.String(p.system))
		}
		sctx, span := p.tracer.Start(parent, "send "+rec.Topic,
			trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
		spans[i] = span
		h := make(map[string]string, len(rec.Headers)+2)
		maps.Copy(h, rec.Headers)
		p.prop.Inject(sctx, propagation.MapCarrier(h))
		rec.Headers = h
		out[i] = rec
	}
	errs := p.next.Publish(ctx, out)
	for i, span := range spans {
		if i < len(errs) && errs[i] != nil {
			span.RecordError(errs[i])
			span.SetStatus(codes.Error, errs[i].Error())
		}
		span.End()
	}
	return errs
}
