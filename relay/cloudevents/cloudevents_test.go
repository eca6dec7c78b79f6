package cloudevents_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/relay/cloudevents"
	"github.com/outbox-relay/outbox-relay/relay/cloudevents/cetest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// capture keeps what it is given to publish.
type capture struct{ got []sink.Record }

func (c *capture) Publish(_ context.Context, recs []sink.Record) []error {
	c.got = append(c.got, recs...)
	return make([]error, len(recs))
}

func record(id int64, key, contentType, payload string) sink.Record {
	h := map[string]string{"type": "order.placed"}
	if contentType != "" {
		h["content-type"] = contentType
	}
	return sink.Record{ID: id, EventID: uuid.New(), Topic: "orders", Key: key, HasKey: key != "", Payload: []byte(payload),
		PayloadSize: len(payload), Headers: h, CreatedAt: time.Date(2026, 11, 27, 10, 0, 0, 123456000, time.UTC)}
}

// Each mode writes an event the SDK reads back with every attribute: id,
// source, type, time, datacontenttype and the data, JSON inline or not.
func TestEventsReadBackWithTheSDK(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		mode, prefix, typeHeader, contentType, payload, wantType string
	}{
		{cloudevents.ModeBinary, "ce_", "", "application/json", `{"id":1}`, "orders"},
		{cloudevents.ModeBinary, "ce-", "type", "text/plain", "hello", "order.placed"},
		{cloudevents.ModeStructured, "ce-", "type", "application/json", `{"id":1}`, "order.placed"},
		{cloudevents.ModeStructured, "ce-", "", "application/octet-stream", "\x00\x01binary", "orders"},
		{cloudevents.ModeStructured, "", "", "", "no content type", "orders"},
	} {
		t.Run(c.mode+" "+c.contentType, func(t *testing.T) {
			t.Parallel()
			next := &capture{}
			p := cloudevents.Wrap(next, cloudevents.Settings{Format: cloudevents.FormatCloudEvents,
				CloudEvents: cloudevents.Options{Mode: c.mode, Source: "//orders.example.com", TypeHeader: c.typeHeader}}, c.prefix)
			in := record(1, "k", c.contentType, c.payload)
			before := len(in.Headers)
			if errs := p.Publish(context.Background(), []sink.Record{in}); errs[0] != nil {
				t.Fatal(errs[0])
			}
			if len(in.Headers) != before {
				t.Fatal("the wrapper changed the caller's record")
			}
			out := next.got[0]
			e, err := cetest.Parse(c.prefix, out.Headers, out.Payload)
			if err != nil {
				t.Fatalf("the SDK cannot read the event: %v\nheaders %v\nbody %s", err, out.Headers, out.Payload)
			}
			if e.ID() != in.EventID.String() || e.Source() != "//orders.example.com" || e.Type() != c.wantType ||
				!e.Time().Equal(in.CreatedAt) || e.SpecVersion() != "1.0" || e.DataContentType() != c.contentType {
				t.Errorf("event %s", e)
			}
			if string(e.Data()) != c.payload {
				t.Errorf("data %q, want %q", e.Data(), c.payload)
			}
			if c.mode == cloudevents.ModeStructured && out.Headers["content-type"] != cloudevents.StructuredContentType {
				t.Errorf("structured content type %q", out.Headers["content-type"])
			}
		})
	}
}

// A row that cannot be an event fails alone and permanently, its key's
// later rows not sent; the rest are published.
func TestRowThatCannotBeAnEvent(t *testing.T) {
	t.Parallel()
	next := &capture{}
	p := cloudevents.Wrap(next, cloudevents.Settings{Format: cloudevents.FormatCloudEvents,
		CloudEvents: cloudevents.Options{Mode: cloudevents.ModeStructured, Source: "urn:example:orders"}}, "ce-")
	errs := p.Publish(context.Background(), []sink.Record{
		record(1, "a", "application/json", "{not json"), record(2, "a", "application/json", "{}"), record(3, "b", "application/json", "{}"),
	})
	ce := sink.Classify(errs[0])
	if errs[0] == nil || ce.Class != sink.ClassPermanent || ce.Reason != sink.ReasonInvalidMessage || !strings.Contains(errs[0].Error(), "not JSON") {
		t.Errorf("a JSON row that is not JSON: %v", errs[0])
	}
	if !errors.Is(errs[1], sink.ErrNotSent) || errs[2] != nil || len(next.got) != 1 || next.got[0].ID != 3 {
		t.Errorf("beside it: %v, %v; published %d", errs[1], errs[2], len(next.got))
	}
}

func TestSettingsValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s      cloudevents.Settings
		prefix string
		want   string
	}{
		{cloudevents.Settings{}, "ce-", ""},
		{cloudevents.Settings{Format: "avro"}, "ce-", `format is "avro"; use raw or cloudevents`},
		{cloudevents.Settings{CloudEvents: cloudevents.Options{Source: "//x"}}, "ce-", "set format: cloudevents"},
		{cloudevents.Settings{Format: "cloudevents"}, "ce-", "cloudevents.source is required"},
		{cloudevents.Settings{Format: "cloudevents", CloudEvents: cloudevents.Options{Source: "//x", Mode: "batch"}}, "ce-", `cloudevents.mode is "batch"`},
		{cloudevents.Settings{Format: "cloudevents", CloudEvents: cloudevents.Options{Source: "//x"}}, "", "this sink has no binary mode"},
		{cloudevents.Settings{Format: "cloudevents", CloudEvents: cloudevents.Options{Source: "//x", Mode: "structured"}}, "", ""},
	} {
		err := c.s.Validate(c.prefix)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.s, err, c.want)
		}
	}
}
