// Package cetest reads CloudEvents off the messages a test received, with
// the CloudEvents SDK: a structured event from its JSON body, a binary
// one from its headers under a protocol binding's prefix (ce_ for Kafka,
// ce- for HTTP and NATS) and its body, the way each binding says.
package cetest

import (
	"bytes"
	"context"
	"io"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
)

// Parse reads the event a message carries: headers (names in any case)
// and body, with prefix the binding's attribute prefix.
func Parse(prefix string, headers map[string]string, body []byte) (*event.Event, error) {
	// Header names in any case: the prefix too (cloudEvents_ for AMQP).
	m := &message{headers: map[string]string{}, body: body, specs: spec.WithPrefix(strings.ToLower(prefix))}
	for k, v := range headers {
		m.headers[strings.ToLower(k)] = v
	}
	if f := format.Lookup(m.headers["content-type"]); f != nil {
		m.format = f
	} else {
		m.version = m.specs.Version(m.headers[m.specs.PrefixedSpecVersionName()])
	}
	return binding.ToEvent(context.Background(), m)
}

// message is a received message as the SDK's bindings read one.
type message struct {
	headers map[string]string
	body    []byte
	specs   *spec.Versions
	version spec.Version
	format  format.Format
}

func (m *message) ReadEncoding() binding.Encoding {
	switch {
	case m.format != nil:
		return binding.EncodingStructured
	case m.version != nil:
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m *message) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.body))
}

func (m *message) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range m.headers {
		switch {
		case k == "content-type":
			if err := w.SetAttribute(m.version.AttributeFromKind(spec.DataContentType), v); err != nil {
				return err
			}
		case m.version.Attribute(k) != nil:
			if err := w.SetAttribute(m.version.Attribute(k), v); err != nil {
				return err
			}
		case strings.HasPrefix(k, m.specs.Prefix()):
			if err := w.SetExtension(strings.TrimPrefix(k, m.specs.Prefix()), v); err != nil {
				return err
			}
		}
	}
	if len(m.body) > 0 {
		return w.SetData(io.NopCloser(bytes.NewReader(m.body)))
	}
	return nil
}

func (m *message) Finish(error) error { return nil }

// GetAttribute returns the attribute of kind k and its value, as the
// SDK's readers of binary messages do.
func (m *message) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	attr := m.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if k == spec.DataContentType {
		if v, ok := m.headers["content-type"]; ok {
			return attr, v
		}
	}
	if v, ok := m.headers[strings.ToLower(attr.PrefixedName())]; ok {
		return attr, v
	}
	return attr, nil
}

// GetExtension returns the extension attribute name's value, or nil.
func (m *message) GetExtension(name string) any {
	if v, ok := m.headers[m.specs.Prefix()+strings.ToLower(name)]; ok {
		return v
	}
	return nil
}
