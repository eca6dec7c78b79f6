// Package outbox is the producer side of the transactional outbox: it writes
// messages into the outbox table inside the caller's own database
// transaction, so a message is enqueued exactly when the business change
// that caused it commits.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/internal/db/schema"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// Message is one message to enqueue.
type Message struct {
	// Topic is the Kafka topic, or the name a route maps to a destination.
	// Required.
	Topic string
	// Key orders messages: those with the same key are delivered in the
	// order they were written. It is also the Kafka message key. Empty
	// means no key: unordered and fully parallel.
	Key string
	// Payload is the message body, opaque bytes. Nil is stored as empty.
	Payload []byte
	// Headers are forwarded as Kafka or HTTP headers.
	Headers map[string]string
	// Delay holds the message back for this long after the transaction's
	// start, measured by the database clock.
	Delay time.Duration
	// EventID is the stable id sent with every delivery so consumers can
	// deduplicate. Zero means a random one is generated.
	EventID uuid.UUID
}

// DB is what Write needs from a connection: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool all satisfy it. Pass the transaction that makes the business
// change, so the messages commit or roll back with it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error)
}

// ErrInvalidMessage is wrapped by every validation error of Write.
var ErrInvalidMessage = errors.New("invalid outbox message")

// Header names the relay sets on every delivery; producers may not set them.
const (
	HeaderEventID = sink.HeaderEventID
	HeaderID      = sink.HeaderID
)

// DefaultCopyThreshold is the batch size from which Write uses COPY.
const DefaultCopyThreshold = 200

// ProducerConfig configures a Producer.
type ProducerConfig struct {
	// Schema holds the outbox table. Default "public".
	Schema string
	// CopyThreshold is the number of messages from which Write uses COPY
	// instead of a single multi-row INSERT. COPY is faster for large
	// batches but cannot compute per-message delays on the database clock,
	// so batches with a delay always use INSERT. Default 200.
	CopyThreshold int
	// Propagator captures the trace context of the caller's span into the
	// message headers. Default: W3C Trace Context (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
}

// Producer writes messages into one schema's outbox table. It is safe for
// concurrent use.
type Producer struct {
	table         pgx.Identifier
	insert        outboxdb.Producer
	copyThreshold int
	propagator    propagation.TextMapPropagator
}

// NewProducer returns a Producer for cfg.
func NewProducer(cfg ProducerConfig) (*Producer, error) {
	if cfg.Schema == "" {
		cfg.Schema = schema.Default
	}
	if err := schema.Validate(cfg.Schema); err != nil {
		return nil, fmt.Errorf("outbox producer: %w", err)
	}
	if cfg.CopyThreshold <= 0 {
		cfg.CopyThreshold = DefaultCopyThreshold
	}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	insert, err := outboxdb.NewProducer(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outbox producer: %w", err)
	}
	return &Producer{
		table:         pgx.Identifier{cfg.Schema, "outbox"},
		insert:        insert,
		copyThreshold: cfg.CopyThreshold,
		propagator:    cfg.Propagator,
	}, nil
}

// Write enqueues msgs in one round trip, in order, and returns their event
// ids. Every message is validated first: if any is invalid, nothing is
// written and the error (wrapping ErrInvalidMessage) lists every problem.
// When ctx carries a recording or sampled OpenTelemetry span, its trace
// context is added to the headers of messages that carry none.
func (p *Producer) Write(ctx context.Context, db DB, msgs ...Message) ([]uuid.UUID, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if err := Validate(msgs...); err != nil {
		return nil, err
	}
	traceHdr := p.traceHeaders(ctx)
	ids := make([]uuid.UUID, len(msgs))
	keys := make([]pgtype.Text, len(msgs))
	headers := make([]string, len(msgs))
	delayed := false
	for i, m := range msgs {
		ids[i] = m.EventID
		if ids[i] == uuid.Nil {
			ids[i] = uuid.New()
		}
		keys[i] = pgtype.Text{String: m.Key, Valid: m.Key != ""}
		h, err := encodeHeaders(m.Headers, traceHdr)
		if err != nil {
			return nil, err
		}
		headers[i] = h
		delayed = delayed || m.Delay > 0
	}
	if len(msgs) >= p.copyThreshold && !delayed {
		if err := p.copy(ctx, db, msgs, ids, keys, headers); err != nil {
			return nil, err
		}
		return ids, nil
	}
	topics := make([]string, len(msgs))
	payloads := make([][]byte, len(msgs))
	delays := make([]int64, len(msgs))
	for i, m := range msgs {
		topics[i] = m.Topic
		payloads[i] = payloadOf(m)
		delays[i] = m.Delay.Microseconds()
	}
	err := p.insert.Insert(ctx, db, outboxdb.Messages{EventIDs: ids, Topics: topics, Keys: keys, Payloads: payloads, Headers: headers, DelaysUS: delays})
	if err != nil {
		return nil, fmt.Errorf("write %d outbox messages: %w", len(msgs), err)
	}
	return ids, nil
}

func (p *Producer) copy(ctx context.Context, db DB, msgs []Message, ids []uuid.UUID, keys []pgtype.Text, headers []string) error {
	rows := make([][]any, len(msgs))
	for i, m := range msgs {
		rows[i] = []any{ids[i], m.Topic, keys[i], payloadOf(m), headers[i]}
	}
	n, err := db.CopyFrom(ctx, p.table, []string{"event_id", "topic", "key", "payload", "headers"}, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("copy %d outbox messages: %w", len(msgs), err)
	}
	if n != int64(len(msgs)) {
		return fmt.Errorf("copy outbox messages: wrote %d of %d", n, len(msgs))
	}
	return nil
}

func payloadOf(m Message) []byte {
	if m.Payload == nil {
		return []byte{}
	}
	return m.Payload
}

// traceHeaders returns the propagation headers of the span in ctx, if any.
func (p *Producer) traceHeaders(ctx context.Context) propagation.MapCarrier {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := propagation.MapCarrier{}
	p.propagator.Inject(ctx, c)
	return c
}

// encodeHeaders renders headers as a JSON object, adding the trace headers
// the message does not set itself.
func encodeHeaders(h map[string]string, traceHdr propagation.MapCarrier) (string, error) {
	if len(h) == 0 && len(traceHdr) == 0 {
		return "{}", nil
	}
	merged := make(map[string]string, len(h)+len(traceHdr))
	for k, v := range traceHdr {
		merged[k] = v
	}
	for k, v := range h {
		merged[k] = v
	}
	b, err := json.Marshal(merged)
	if err != nil {
		return "", fmt.Errorf("encode outbox headers: %w", err)
	}
	return string(b), nil
}

// Validate checks msgs as Write does and returns every problem at once,
// wrapping ErrInvalidMessage, or nil.
func Validate(msgs ...Message) error {
	var errs []error
	bad := func(i int, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: message %d: %s", ErrInvalidMessage, i, fmt.Sprintf(format, args...)))
	}
	for i, m := range msgs {
		switch {
		case m.Topic == "":
			bad(i, "topic is empty")
		case !validText(m.Topic):
			bad(i, "topic is not valid UTF-8 text without NUL bytes")
		}
		if !validText(m.Key) {
			bad(i, "key is not valid UTF-8 text without NUL bytes")
		}
		if m.Delay < 0 {
			bad(i, "delay %s is negative", m.Delay)
		}
		for k, v := range m.Headers {
			lk := strings.ToLower(k)
			switch {
			case k == "":
				bad(i, "header with an empty name")
			case !validText(k):
				bad(i, "header name %q is not valid UTF-8 text without NUL bytes", k)
			case lk == HeaderEventID || lk == HeaderID:
				bad(i, "header %q is set by the relay on every delivery", k)
			}
			if !validText(v) {
				bad(i, "header %q: value is not valid UTF-8 text without NUL bytes", k)
			}
		}
	}
	return errors.Join(errs...)
}

// validText reports whether s can be stored in a PostgreSQL text or jsonb
// string: valid UTF-8 and no NUL.
func validText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// Execer is what Emit needs from a connection: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool all satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ErrDelayInLog is returned by Emit for a message with a Delay: the
// write-ahead log delivers in commit order, without delays.
var ErrDelayInLog = fmt.Errorf("%w: a message written into the write-ahead log cannot have a delay", ErrInvalidMessage)

// Emit writes msgs into the write-ahead log rather than the outbox table,
// for an outbox the relay captures from the log (capture: log): one
// logical decoding message each, through the schema's outbox_emit, in one
// round trip and in order, and returns their event ids. They exist only
// if db's transaction commits, and touch no table. The schema's
// replication slot must exist ('outbox-relay capture setup'): without it
// the statement fails rather than write messages nobody would read.
// Messages are validated as by Write; a Delay is refused.
func (p *Producer) Emit(ctx context.Context, db Execer, msgs ...Message) ([]uuid.UUID, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if err := Validate(msgs...); err != nil {
		return nil, err
	}
	traceHdr := p.traceHeaders(ctx)
	m := outboxdb.Messages{EventIDs: make([]uuid.UUID, len(msgs)), Topics: make([]string, len(msgs)),
		Keys: make([]pgtype.Text, len(msgs)), Payloads: make([][]byte, len(msgs)), Headers: make([]string, len(msgs))}
	for i, msg := range msgs {
		if msg.Delay != 0 {
			return nil, fmt.Errorf("message %d: %w", i, ErrDelayInLog)
		}
		m.EventIDs[i] = msg.EventID
		if m.EventIDs[i] == uuid.Nil {
			m.EventIDs[i] = uuid.New()
		}
		m.Topics[i] = msg.Topic
		m.Keys[i] = pgtype.Text{String: msg.Key, Valid: msg.Key != ""}
		m.Payloads[i] = payloadOf(msg)
		h, err := encodeHeaders(msg.Headers, traceHdr)
		if err != nil {
			return nil, err
		}
		m.Headers[i] = h
	}
	if err := p.insert.Emit(ctx, db, m); err != nil {
		return nil, fmt.Errorf("emit %d outbox messages: %w", len(msgs), err)
	}
	return m.EventIDs, nil
}
