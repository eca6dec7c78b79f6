// Package kafka publishes outbox records to Kafka with segmentio/kafka-go:
// synchronous writes acknowledged by all in-sync replicas, keys hashed like
// the Java client (murmur2), and every failure classified for the relay.
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay/retry"
)

// Headers added to every message, beside the row's own.
const (
	HeaderEventID = outbox.HeaderEventID
	HeaderID      = outbox.HeaderID
)

// Defaults of Config.
const (
	DefaultWriters      = 2
	DefaultBatchSize    = 500
	DefaultBatchBytes   = 1 << 20
	DefaultDialTimeout  = 5 * time.Second
	DefaultBatchTimeout = time.Microsecond
)

// Config configures a Publisher.
type Config struct {
	// Brokers are the bootstrap addresses, host:port. Required.
	Brokers []string
	// ClientID names the relay to the brokers. Default "outbox-relay".
	ClientID string
	// TLS enables TLS when set.
	TLS *tls.Config
	// SASL authenticates when set (PLAIN, SCRAM-SHA-256/512).
	SASL sasl.Mechanism
	// Balancer picks partitions. Default murmur2 on the key, like the Java
	// client, so Java consumers and producers agree on a key's partition.
	Balancer kafkago.Balancer
	// Writers bounds concurrent publishes; each has its own writer, so a
	// call's messages for one partition always form one produce request.
	// Set it to the relay's workers. Default 2.
	Writers int
	// BatchSize is the most messages per partition request; at least the
	// relay's batch size. Default 500.
	BatchSize int
	// BatchBytes is the most bytes per partition request; at least the
	// relay's max batch bytes plus per-message overhead. Default 1 MiB.
	BatchBytes int64
	// DialTimeout bounds connecting to a broker. Default 5s.
	DialTimeout time.Duration
}

// Publisher writes records to the topics they name.
type Publisher struct {
	sasl      bool
	transport *kafkago.Transport
	writers   chan *kafkago.Writer
	all       []*kafkago.Writer
}

// New returns a Publisher for cfg. It does not connect until the first
// publish.
func New(cfg Config) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafka: at least one broker is required")
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "outbox-relay"
	}
	if cfg.Balancer == nil {
		cfg.Balancer = &kafkago.Murmur2Balancer{}
	}
	if cfg.Writers <= 0 {
		cfg.Writers = DefaultWriters
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.BatchBytes <= 0 {
		cfg.BatchBytes = DefaultBatchBytes
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	transport := &kafkago.Transport{
		ClientID:    cfg.ClientID,
		TLS:         cfg.TLS,
		SASL:        cfg.SASL,
		DialTimeout: cfg.DialTimeout,
	}
	p := &Publisher{sasl: cfg.SASL != nil, transport: transport, writers: make(chan *kafkago.Writer, cfg.Writers)}
	for range cfg.Writers {
		w := &kafkago.Writer{
			Addr:         kafkago.TCP(cfg.Brokers...),
			Balancer:     cfg.Balancer,
			Transport:    transport,
			RequiredAcks: kafkago.RequireAll,
			// Retries are the relay's: they are counted, backed off and
			// bounded by the row's attempts and age.
			MaxAttempts: 1,
			BatchSize:   cfg.BatchSize,
			BatchBytes:  cfg.BatchBytes,
			// A synchronous writer flushes a partition batch when it is
			// full or after BatchTimeout, which then only adds latency:
			// kafka-go's 1s default would cap throughput at a few hundred
			// messages a second, and even 1ms was most of a publish at
			// low load. A timeout cannot split a call's messages for a
			// partition: the writer adds them under the partition's lock,
			// which a batch whose timer fires must take before it is sent.
			// And no other call's messages can join them: a publish has
			// the writer to itself, and writes each topic in one call.
			BatchTimeout:           DefaultBatchTimeout,
			AllowAutoTopicCreation: false,
		}
		p.writers <- w
		p.all = append(p.all, w)
	}
	return p, nil
}

// Close closes the writers and their connections.
func (p *Publisher) Close() error {
	var errs []error
	for _, w := range p.all {
		errs = append(errs, w.Close())
	}
	// Writers do not own a shared transport: its connection pools would
	// outlive them.
	p.transport.CloseIdleConnections()
	return errors.Join(errs...)
}

// Publish writes records and returns one classified error per record. The
// records of each topic are written in one call; topics are written
// concurrently, so one unusable topic fails only its own records.
func (p *Publisher) Publish(ctx context.Context, records []outbox.Record) []error {
	errs := make([]error, len(records))
	var w *kafkago.Writer
	select {
	case w = <-p.writers:
	case <-ctx.Done():
		for i := range errs {
			errs[i] = retry.Transient(fmt.Errorf("kafka: no writer free: %w", ctx.Err()), 0)
		}
		return errs
	}
	defer func() { p.writers <- w }()

	byTopic := map[string][]int{}
	var topics []string
	for i, r := range records {
		if _, ok := byTopic[r.Topic]; !ok {
			topics = append(topics, r.Topic)
		}
		byTopic[r.Topic] = append(byTopic[r.Topic], i)
	}
	var wg sync.WaitGroup
	for _, topic := range topics {
		idx := byTopic[topic]
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := make([]kafkago.Message, len(idx))
			for j, i := range idx {
				msgs[j] = Message(records[i])
			}
			for j, err := range p.write(ctx, w, msgs) {
				errs[idx[j]] = err
			}
		}()
	}
	wg.Wait()
	return errs
}

// Message is the Kafka message for r, per the delivery format: topic, key
// (absent for a null key), payload as value, the row's headers plus the
// event id and row id.
func Message(r outbox.Record) kafkago.Message {
	m := kafkago.Message{Topic: r.Topic, Value: r.Payload}
	if r.HasKey {
		m.Key = []byte(r.Key)
	}
	names := make([]string, 0, len(r.Headers))
	for k := range r.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	m.Headers = make([]kafkago.Header, 0, len(names)+2)
	for _, k := range names {
		m.Headers = append(m.Headers, kafkago.Header{Key: k, Value: []byte(r.Headers[k])})
	}
	m.Headers = append(m.Headers,
		kafkago.Header{Key: HeaderEventID, Value: []byte(r.EventID.String())},
		kafkago.Header{Key: HeaderID, Value: []byte(strconv.FormatInt(r.ID, 10))},
	)
	return m
}

// write writes msgs (one topic, in id order) and returns one classified
// error per message. After a message of a key fails, the key's later
// messages are not sent (retry.ErrNotSent), so a key is never published out
// of order, whatever the relay then does with the failed one.
func (p *Publisher) write(ctx context.Context, w *kafkago.Writer, msgs []kafkago.Message) []error {
	errs := make([]error, len(msgs))
	pending := make([]int, len(msgs))
	for i := range pending {
		pending[i] = i
	}
	for len(pending) > 0 {
		batch := make([]kafkago.Message, len(pending))
		for j, i := range pending {
			batch[j] = msgs[i]
		}
		err := w.WriteMessages(ctx, batch...)
		var tooLarge kafkago.MessageTooLargeError
		var perMessage kafkago.WriteErrors
		switch {
		case err == nil:
			return errs
		case errors.As(err, &tooLarge):
			// Checked before anything is sent: drop the culprit and its
			// key's later messages, send the rest.
			j := culprit(batch, tooLarge)
			errs[pending[j]] = retry.Permanent(fmt.Errorf("kafka: message of %d bytes is above the writer's batch limit", len(batch[j].Value)), retry.ReasonTooLarge)
			pending = stopKey(msgs, pending, j, errs)
			continue
		case errors.As(err, &perMessage) && len(perMessage) == len(batch):
			var refused []int // permanent failures: maybe one culprit failing its partition batch
			for j, e := range perMessage {
				if e == nil {
					continue
				}
				errs[pending[j]] = p.classifyCall(e)
				if retry.Classify(errs[pending[j]]).Class == retry.ClassPermanent {
					refused = append(refused, pending[j])
				}
			}
			if len(refused) > 1 {
				p.isolate(ctx, w, msgs, refused, errs)
			}
			return errs
		default:
			classified := p.classifyCall(err)
			for _, i := range pending {
				errs[i] = classified
			}
			return errs
		}
	}
	return errs
}

// stopKey removes pending[j] and, when it has a key, the key's later
// pending messages, which get ErrNotSent.
func stopKey(msgs []kafkago.Message, pending []int, j int, errs []error) []int {
	key := msgs[pending[j]].Key
	out := append([]int(nil), pending[:j]...)
	for _, i := range pending[j+1:] {
		if key != nil && msgs[i].Key != nil && string(msgs[i].Key) == string(key) {
			errs[i] = retry.ErrNotSent
			continue
		}
		out = append(out, i)
	}
	return out
}

// isolate handles messages the broker refused for good. The broker judges
// a whole partition batch, so one bad message (too large, an invalid
// record) fails its neighbours too: send each alone, in order, to tell them
// apart. After a key's message fails, its later ones are not sent.
func (p *Publisher) isolate(ctx context.Context, w *kafkago.Writer, msgs []kafkago.Message, idx []int, errs []error) {
	stopped := map[string]bool{}
	for _, i := range idx {
		key := msgs[i].Key
		if key != nil && stopped[string(key)] {
			errs[i] = retry.ErrNotSent
			continue
		}
		errs[i] = p.classifyCall(w.WriteMessages(ctx, msgs[i]))
		if errs[i] != nil && key != nil {
			stopped[string(key)] = true
		}
	}
}

// classifyCall classifies an error that failed a whole write. With SASL,
// brokers answer a failed authentication by closing the connection, which
// kafka-go reports as a bare EOF: treat that as the destination refusing
// the relay (pause, count nothing) rather than as a message failure that
// burns attempts. A genuine network EOF then only costs a short pause.
func (p *Publisher) classifyCall(err error) error {
	if err == nil {
		return nil
	}
	if p.sasl && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
		return retry.Systemic(fmt.Errorf("kafka: the broker closed the connection; with SASL this usually means authentication failed (check kafka.sasl): %w", err))
	}
	return Classify(err)
}

// culprit finds the message kafka-go refused, by its event id.
func culprit(batch []kafkago.Message, e kafkago.MessageTooLargeError) int {
	id := eventID(e.Message)
	for j := range batch {
		if eventID(batch[j]) == id {
			return j
		}
	}
	return 0
}

func eventID(m kafkago.Message) string {
	for _, h := range m.Headers {
		if h.Key == HeaderEventID {
			return string(h.Value)
		}
	}
	return ""
}

// Classify maps a kafka-go error to the relay's classes; nil stays nil.
//
//   - permanent: the message itself is refused (too large, invalid topic or
//     record); retrying cannot help.
//   - systemic: the cluster as a whole is unusable (unreachable, DNS, TLS,
//     authentication or authorization): pause and defer, count nothing.
//   - transient: everything else, including kafka-go's Temporary() errors
//     and timeouts, whose outcome is unknown: retried, so a duplicate is
//     possible and a loss is not.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var ce *retry.Error
	if errors.As(err, &ce) {
		return err
	}
	// A write of one message reports its error as WriteErrors of one.
	var we kafkago.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil {
				return Classify(e)
			}
		}
	}
	var kerr kafkago.Error
	if errors.As(err, &kerr) {
		switch kerr {
		case kafkago.MessageSizeTooLarge, kafkago.RecordListTooLarge:
			return retry.Permanent(fmt.Errorf("kafka: %w", err), retry.ReasonTooLarge)
		case kafkago.InvalidTopic, kafkago.InvalidRecord, kafkago.UnsupportedForMessageFormat:
			return retry.Permanent(fmt.Errorf("kafka: %w", err), retry.ReasonPermanent)
		case kafkago.TopicAuthorizationFailed, kafkago.ClusterAuthorizationFailed,
			kafkago.SASLAuthenticationFailed, kafkago.UnsupportedSASLMechanism, kafkago.IllegalSASLState,
			kafkago.BrokerNotAvailable, kafkago.TransactionalIDAuthorizationFailed:
			return retry.Systemic(fmt.Errorf("kafka: %w", err))
		}
		return retry.Transient(fmt.Errorf("kafka: %w", err), 0)
	}
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var recordErr tls.RecordHeaderError
	var opErr *net.OpError
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial",
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.As(err, &dnsErr),
		errors.As(err, &certErr), errors.As(err, &recordErr):
		return retry.Systemic(fmt.Errorf("kafka: %w", err))
	}
	return retry.Transient(fmt.Errorf("kafka: %w", err), 0)
}
