// Package cloudevents formats a destination's messages as CloudEvents 1.0:
// in binary mode each event attribute travels as a header under the
// sink's protocol binding prefix (ce_ for Kafka, ce- for HTTP and NATS)
// and the payload is the data; in structured mode the message is the JSON
// event format (application/cloudevents+json), data inline when it is
// JSON and base64 otherwise.
//
// The event's id is the row's event id, its source the destination's
// setting, its type the topic or a header of the row, its time the row's
// created_at, its datacontenttype the row's content-type header.
package cloudevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	ce "github.com/cloudevents/sdk-go/v2/event"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// Formats of a destination's messages.
const (
	// FormatRaw sends the payload and headers as they are.
	FormatRaw = "raw"
	// FormatCloudEvents sends CloudEvents.
	FormatCloudEvents = "cloudevents"
)

// Content modes.
const (
	ModeBinary     = "binary"
	ModeStructured = "structured"
)

// StructuredContentType is the content type of a structured event.
const StructuredContentType = "application/cloudevents+json"

// Settings are a destination's format: format and cloudevents in its
// configuration.
type Settings struct {
	// Format is raw (the default) or cloudevents.
	Format      string  `koanf:"format"`
	CloudEvents Options `koanf:"cloudevents"`
}

// Options are the settings of the cloudevents format.
type Options struct {
	// Mode is binary (the default) or structured.
	Mode string `koanf:"mode"`
	// Source is the events' source, a URI reference such as
	// //orders.example.com or urn:example:orders. Required.
	Source string `koanf:"source"`
	// TypeHeader names the row header that gives the event's type; a
	// row without it, or an empty TypeHeader, takes its topic.
	TypeHeader string `koanf:"type_header"`
}

// Enabled reports whether s formats messages as CloudEvents.
func (s Settings) Enabled() bool { return s.Format == FormatCloudEvents }

// Validate reports every problem of s at once, each starting with the
// setting's name. prefix is the sink's binary-mode header prefix; a sink
// without one takes structured mode only.
func (s Settings) Validate(prefix string) error {
	var errs []error
	switch s.Format {
	case "", FormatRaw:
		if s.CloudEvents != (Options{}) {
			errs = append(errs, errors.New("cloudevents: set format: cloudevents to use it"))
		}
		return errors.Join(errs...)
	case FormatCloudEvents:
	default:
		return fmt.Errorf("format is %q; use raw or cloudevents", s.Format)
	}
	switch s.CloudEvents.Mode {
	case "", ModeBinary:
		if prefix == "" {
			errs = append(errs, errors.New("cloudevents.mode: this sink has no binary mode; use structured"))
		}
	case ModeStructured:
	default:
		errs = append(errs, fmt.Errorf("cloudevents.mode is %q; use binary or structured", s.CloudEvents.Mode))
	}
	if s.CloudEvents.Source == "" {
		errs = append(errs, errors.New("cloudevents.source is required: the events' source, a URI reference such as //orders.example.com"))
	} else if _, err := url.Parse(s.CloudEvents.Source); err != nil {
		errs = append(errs, fmt.Errorf("cloudevents.source %q is not a URI reference: %w", s.CloudEvents.Source, err))
	}
	return errors.Join(errs...)
}

// Overhead bounds what formatting adds to one message of a payload up to
// maxPayload bytes: the attributes' headers, or the envelope and base64.
func (s Settings) Overhead(maxPayload int) int {
	if !s.Enabled() {
		return 0
	}
	const attributes = 512 // names, id, time, spec version, and a type
	if s.CloudEvents.Mode == ModeStructured {
		return attributes + len(s.CloudEvents.Source) + maxPayload/3 + 4
	}
	return attributes + len(s.CloudEvents.Source)
}

// Wrap returns a Publisher that formats records as s says and publishes
// them through p. prefix is the sink's binary-mode header prefix.
func Wrap(p sink.Publisher, s Settings, prefix string) sink.Publisher {
	if !s.Enabled() {
		return p
	}
	if s.CloudEvents.Mode == "" {
		s.CloudEvents.Mode = ModeBinary
	}
	return sink.Decorate(p, &publisher{next: p, opts: s.CloudEvents, prefix: prefix})
}

type publisher struct {
	next   sink.Publisher
	opts   Options
	prefix string
}

// Publish formats each record, without changing the caller's, and
// publishes those it could format; a record that cannot be an event fails
// alone, permanently (invalid_message).
func (p *publisher) Publish(ctx context.Context, records []sink.Record) []error {
	errs := make([]error, len(records))
	out := make([]sink.Record, 0, len(records))
	at := make([]int, 0, len(records))
	failedKeys := map[string]bool{}
	for i := range records {
		r := &records[i]
		if r.HasKey && failedKeys[r.Key] {
			errs[i] = sink.ErrNotSent
			continue
		}
		f, err := p.format(r)
		if err != nil {
			errs[i] = sink.Permanent(fmt.Errorf("cloudevents: row %d: %w", r.ID, err), sink.ReasonInvalidMessage)
			if r.HasKey {
				failedKeys[r.Key] = true
			}
			continue
		}
		out = append(out, f)
		at = append(at, i)
	}
	results := p.next.Publish(ctx, out)
	if len(results) != len(out) {
		err := sink.Transient(fmt.Errorf("cloudevents: the sink returned %d results for %d records", len(results), len(out)), 0)
		for _, i := range at {
			errs[i] = err
		}
		return errs
	}
	for j, err := range results {
		errs[at[j]] = err
	}
	return errs
}

// format returns r as an event.
func (p *publisher) format(r *sink.Record) (sink.Record, error) {
	e := ce.New(ce.CloudEventsVersionV1)
	e.SetID(r.EventID.String())
	e.SetSource(p.opts.Source)
	typ := r.Topic
	if v, ok := r.Headers[p.opts.TypeHeader]; ok && p.opts.TypeHeader != "" && v != "" {
		typ = v
	}
	e.SetType(typ)
	e.SetTime(r.CreatedAt)
	contentType := headerValue(r.Headers, "content-type")
	if contentType != "" {
		e.SetDataContentType(contentType)
	}
	if err := e.Validate(); err != nil {
		return sink.Record{}, err
	}
	f := *r
	if p.opts.Mode == ModeStructured {
		if isJSON(contentType) {
			if !json.Valid(r.Payload) {
				return sink.Record{}, fmt.Errorf("the content type is %s, but the payload is not JSON", contentType)
			}
			e.DataEncoded = r.Payload
		} else {
			e.DataBase64 = true
			e.DataEncoded = r.Payload
		}
		body, err := e.MarshalJSON()
		if err != nil {
			return sink.Record{}, err
		}
		f.Payload, f.PayloadSize = body, len(body)
		f.Headers = make(map[string]string, len(r.Headers)+1)
		for k, v := range r.Headers {
			if !strings.EqualFold(k, "content-type") {
				f.Headers[k] = v
			}
		}
		f.Headers["content-type"] = StructuredContentType
		return f, nil
	}
	f.Headers = make(map[string]string, len(r.Headers)+5)
	for k, v := range r.Headers {
		f.Headers[k] = v
	}
	f.Headers[p.prefix+"specversion"] = ce.CloudEventsVersionV1
	f.Headers[p.prefix+"id"] = e.ID()
	f.Headers[p.prefix+"source"] = e.Source()
	f.Headers[p.prefix+"type"] = e.Type()
	f.Headers[p.prefix+"time"] = e.Time().UTC().Format(time.RFC3339Nano)
	return f, nil
}

// headerValue returns the header name of h, whatever its case.
func headerValue(h map[string]string, name string) string {
	if v, ok := h[name]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// isJSON reports whether a content type is JSON (application/json, or a
// +json type), which structured mode carries inline.
func isJSON(contentType string) bool {
	mt, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(contentType)), ";")
	mt = strings.TrimSpace(mt)
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}
