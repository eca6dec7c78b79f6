// Package kafka publishes outbox records to Kafka with segmentio/kafka-go:
// synchronous writes acknowledged by all in-sync replicas, keys hashed like
// the Java client (murmur2), and every failure classified for the relay.
package kafka

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/sasl"
)

// Headers added to every message, beside the row's own.
const (
	HeaderEventID = sink.HeaderEventID
	HeaderID      = sink.HeaderID
)

// HeaderTombstone is the row header that asks for a tombstone: a message
// with the row's key and a null value, which deletes the key from a
// compacted topic. Its value must be "true", the row must have a key and
// an empty payload; the header itself is not sent.
const HeaderTombstone = "outbox-tombstone"

// Timestamp is where a message's timestamp comes from.
type Timestamp string

// Timestamps.
const (
	// TimestampPublish stamps a message with the time it is sent, as
	// Kafka producers do by default.
	TimestampPublish Timestamp = "publish"
	// TimestampCreatedAt stamps it with its row's created_at, the time
	// the application committed the event.
	TimestampCreatedAt Timestamp = "created_at"
)

// Defaults of Config.
const (
	DefaultClientID        = "outbox-relay"
	DefaultMaxMessageBytes = 1 << 20
	DefaultDialTimeout     = 5 * time.Second
)

// requestTimeout bounds each request to the brokers, as kafka-go's Writer
// does; a publish's own deadline, when sooner, wins. A produce request
// gives the broker half of it to gather the in-sync replicas'
// acknowledgements: without it kafka-go asks for them within 500 ms, and a
// replica lagging longer would fail healthy batches (to be sent again, as
// duplicates).
const requestTimeout = 10 * time.Second

// murmur2 maps keys to partitions as the Java client does.
var murmur2 kafkago.Murmur2Balancer

// partitionsTTL is how long a topic's partitions are reused before they
// are asked of the transport again, which keeps the cluster's metadata for
// at most as long: keys spread over partitions added to a topic within
// twice that.
const partitionsTTL = 6 * time.Second

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
	// MaxMessageBytes is the largest message sent, key, value and headers
	// included; a larger one is refused as too large without being sent.
	// Default 1 MiB.
	MaxMessageBytes int
	// DialTimeout bounds connecting to a broker. Default 5s.
	DialTimeout time.Duration
	// Compression compresses each produce request's records. Default
	// none here; the configuration's destinations default to
	// DefaultCompression (see Settings).
	Compression compress.Compression
	// Timestamp is where messages' timestamps come from. Default
	// TimestampPublish.
	Timestamp Timestamp
}

// Publisher writes records to the topics they name. It sends each topic
// partition's records of a publish in one produce request, acknowledged by
// all in-sync replicas, so that they succeed or fail together; the
// requests of a publish go out at once.
//
// It produces with kafka-go's Client rather than its Writer, which is
// built for asynchronous batching: a synchronous call waits for a batch to
// fill or its timer to fire, allocates a batch of BatchSize messages per
// partition, and copies the cluster's metadata, all on every call. Nor
// does a Publisher build a message to send: it encodes the records
// straight into the request's record batch (see batchEncoder).
type Publisher struct {
	sasl      bool
	createdAt bool                       // messages carry their rows' created_at
	cfg       Config                     // as opened: brokers, client id, dial timeout
	conn      atomic.Pointer[connection] // with the TLS and SASL in use
	maxBytes  int

	mu         sync.Mutex
	partitions map[string]topicPartitions
	failing    map[string]map[int]time.Time // partitions that failed lately, until when
	buffers    sync.Pool                    // of *encodeBuffer

	closing sync.RWMutex // held to read by each publish
	closed  bool
}

// connection is how a Publisher reaches the brokers, with the TLS and SASL
// settings Reload replaces.
type connection struct {
	transport *kafkago.Transport
	client    *kafkago.Client
}

func (p *Publisher) connect(tlsConf *tls.Config, mech sasl.Mechanism) *connection {
	transport := &kafkago.Transport{
		ClientID:    p.cfg.ClientID,
		TLS:         tlsConf,
		SASL:        mech,
		DialTimeout: p.cfg.DialTimeout,
		MetadataTTL: partitionsTTL,
	}
	return &connection{transport: transport,
		client: &kafkago.Client{Addr: kafkago.TCP(p.cfg.Brokers...), Transport: transport, Timeout: requestTimeout}}
}

// Reload replaces the TLS configuration and the SASL mechanism (a rotated
// password, a renewed certificate or CA bundle). Requests under way finish
// on the connections they have; new connections use the new settings.
// Turning SASL on or off needs a new Publisher.
func (p *Publisher) Reload(tlsConf *tls.Config, mech sasl.Mechanism) error {
	if (mech != nil) != p.sasl {
		return errors.New("kafka: SASL cannot be turned on or off while running; restart")
	}
	old := p.conn.Swap(p.connect(tlsConf, mech))
	old.transport.CloseIdleConnections()
	return nil
}

type topicPartitions struct {
	ids []int
	at  time.Time
}

// New returns a Publisher for cfg. It does not connect until the first
// publish.
func New(cfg Config) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafka: at least one broker is required")
	}
	cfg.ClientID = cmp.Or(cfg.ClientID, DefaultClientID)
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	codec := codecOf(cfg.Compression)
	if cfg.Compression != compress.None && codec == nil {
		return nil, fmt.Errorf("kafka: unknown compression %d", cfg.Compression)
	}
	switch cfg.Timestamp {
	case "", TimestampPublish, TimestampCreatedAt:
	default:
		return nil, fmt.Errorf("kafka: unknown timestamp %q", cfg.Timestamp)
	}
	createdAt := cfg.Timestamp == TimestampCreatedAt
	p := &Publisher{
		sasl:       cfg.SASL != nil,
		createdAt:  createdAt,
		cfg:        cfg,
		maxBytes:   cfg.MaxMessageBytes,
		partitions: map[string]topicPartitions{},
		failing:    map[string]map[int]time.Time{},
		buffers: sync.Pool{New: func() any {
			return &encodeBuffer{enc: batchEncoder{codec: codec, createdAt: createdAt}}
		}},
	}
	p.conn.Store(p.connect(cfg.TLS, cfg.SASL))
	return p, nil
}

// Close waits for publishes under way, then closes the connections to the
// brokers. Later publishes fail.
func (p *Publisher) Close() error {
	p.closing.Lock()
	defer p.closing.Unlock()
	p.closed = true
	p.conn.Load().transport.CloseIdleConnections()
	return nil
}

// Ping says whether a broker answers (sink.Pinger): an ApiVersions
// request to the brokers.
func (p *Publisher) Ping(ctx context.Context) error {
	p.closing.RLock()
	defer p.closing.RUnlock()
	if p.closed {
		return errors.New("kafka: publisher closed")
	}
	if _, err := p.conn.Load().client.ApiVersions(ctx, &kafkago.ApiVersionsRequest{}); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	return nil
}

// batch is the records of one publish bound for one topic partition, in id
// order.
type batch struct {
	topic     string
	partition int
	idx       []int // into the published records
}

// Publish writes records and returns one classified error per record. Each
// topic partition's records go in one request, and the requests go out at
// once, so an unusable topic or partition fails only its own records.
func (p *Publisher) Publish(ctx context.Context, records []sink.Record) []error {
	errs := make([]error, len(records))
	p.closing.RLock()
	defer p.closing.RUnlock()
	if p.closed {
		err := sink.Systemic(errors.New("kafka: the publisher is closed"))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	var wg sync.WaitGroup
	for _, b := range p.route(ctx, records, errs) {
		wg.Go(func() { p.send(ctx, records, b, errs) })
	}
	wg.Wait()
	return errs
}

// route sorts records into partition batches. A key's records go to the
// partition of its murmur2 hash, as with the Java client, so that Java
// producers and consumers agree on it. Records without a key go to one
// partition of their topic, picked at random for each publish, as the Java
// client's sticky partitioner does: one request instead of one per
// partition. A record of an unknown or unreachable topic gets its topic's
// error, one above MaxMessageBytes a permanent error, and the later records
// of its key, in any topic, are not sent.
func (p *Publisher) route(ctx context.Context, records []sink.Record, errs []error) []*batch {
	type topicRoute struct {
		ids     []int
		err     error
		batches map[int]*batch
		keyless int // the partition of records without a key, or -1
	}
	var (
		topics  = map[string]*topicRoute{}
		batches []*batch
		stopped map[string]bool // keys of records refused here
		key     = make([]byte, 0, 64)
	)
	for i := range records {
		r := &records[i]
		t := topics[r.Topic]
		if t == nil {
			t = &topicRoute{batches: map[int]*batch{}, keyless: -1}
			if err := ValidateTopic(r.Topic); err != nil {
				// Never sent: a broker would refuse it, or worse, create it.
				t.err = sink.Permanent(err, sink.ReasonInvalidMessage)
			} else if t.ids, err = p.topicPartitions(ctx, r.Topic); err != nil {
				t.err = topicError(p.classifyCall(err))
			}
			topics[r.Topic] = t
		}
		if r.HasKey && stopped[r.Key] {
			errs[i] = sink.ErrNotSent
			continue
		}
		if t.err != nil {
			errs[i] = t.err
		} else if err := tombstoneProblem(r); err != nil {
			errs[i] = sink.Permanent(err, sink.ReasonInvalidMessage)
		} else if size := messageBytes(r); size > p.maxBytes {
			errs[i] = sink.Permanent(fmt.Errorf("kafka: message of %d bytes is above the %d-byte limit", size, p.maxBytes), sink.ReasonTooLarge)
		}
		if errs[i] != nil {
			if r.HasKey {
				if stopped == nil {
					stopped = map[string]bool{}
				}
				stopped[r.Key] = true
			}
			continue
		}
		var part int
		switch {
		case r.HasKey:
			key = append(key[:0], r.Key...) // never nil: an empty key is a key
			part = murmur2.Balance(kafkago.Message{Key: key}, t.ids...)
		case t.keyless >= 0:
			part = t.keyless
		default:
			part = p.keylessPartition(r.Topic, t.ids)
			t.keyless = part
		}
		b := t.batches[part]
		if b == nil {
			b = &batch{topic: r.Topic, partition: part}
			t.batches[part] = b
			batches = append(batches, b)
		}
		b.idx = append(b.idx, i)
	}
	return batches
}

// topicPartitions returns the partition ids of topic, from the cluster's
// metadata, kept for partitionsTTL.
func (p *Publisher) topicPartitions(ctx context.Context, topic string) ([]int, error) {
	p.mu.Lock()
	cached, ok := p.partitions[topic]
	p.mu.Unlock()
	if ok && time.Since(cached.at) < partitionsTTL {
		return cached.ids, nil
	}
	meta, err := p.conn.Load().client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, err
	}
	for _, t := range meta.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return nil, t.Error
		}
		if len(t.Partitions) == 0 {
			return nil, kafkago.LeaderNotAvailable
		}
		ids := make([]int, len(t.Partitions))
		for i, part := range t.Partitions {
			ids[i] = part.ID
		}
		sort.Ints(ids)
		p.mu.Lock()
		p.partitions[topic] = topicPartitions{ids: ids, at: time.Now()}
		p.mu.Unlock()
		return ids, nil
	}
	return nil, kafkago.UnknownTopicOrPartition
}

// topicError turns the classified failure of a topic's metadata into a
// failure of the topic: a topic whose partitions have no leader yet is
// being created, or is down as a whole.
func topicError(err error) error {
	if ce := sink.Classify(err); ce.Scope == sink.ScopePartition {
		return sink.TopicFailure(ce.Class, ce.Err)
	}
	return err
}

// keylessPartition picks the partition of a publish's records without a
// key in topic: at random, as the Java client's sticky partitioner does,
// among the partitions that have not failed lately, so that they go on
// flowing while one partition has no leader.
func (p *Publisher) keylessPartition(topic string, ids []int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if failing := p.failing[topic]; len(failing) > 0 {
		now := time.Now()
		healthy := make([]int, 0, len(ids))
		for _, id := range ids {
			if until, ok := failing[id]; !ok || now.After(until) {
				healthy = append(healthy, id)
			}
		}
		if len(healthy) > 0 {
			return healthy[rand.IntN(len(healthy))]
		}
	}
	return ids[rand.IntN(len(ids))]
}

// failingFor is how long records without a key keep away from a partition
// after it failed: about as long as the cluster takes to elect a leader.
// A success on the partition ends it sooner.
const failingFor = partitionsTTL

// markPartition records whether a request to a topic partition failed as
// a partition, for keylessPartition.
func (p *Publisher) markPartition(topic string, partition int, failed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	failing := p.failing[topic]
	if !failed {
		if _, ok := failing[partition]; ok {
			delete(failing, partition)
			if len(failing) == 0 {
				delete(p.failing, topic)
			}
		}
		return
	}
	if failing == nil {
		failing = map[int]time.Time{}
		p.failing[topic] = failing
	}
	failing[partition] = time.Now().Add(failingFor)
}

// Partition returns the partition rec goes to, from the partitions last
// read of its topic's metadata, without asking the cluster; false when
// rec has no key (its partition is picked per publish) or the topic's
// partitions are not known.
func (p *Publisher) Partition(rec sink.Record) (int, bool) {
	if !rec.HasKey {
		return 0, false
	}
	p.mu.Lock()
	cached, ok := p.partitions[rec.Topic]
	p.mu.Unlock()
	if !ok || len(cached.ids) == 0 {
		return 0, false
	}
	return murmur2.Balance(kafkago.Message{Key: []byte(rec.Key)}, cached.ids...), true
}

// send produces b's records in one request and sets their errors. When the
// broker refuses the request for good, one bad record may have failed its
// neighbours: they are sent again one at a time to tell them apart.
func (p *Publisher) send(ctx context.Context, records []sink.Record, b *batch, errs []error) {
	err := p.produce(ctx, records, b.topic, b.partition, b.idx)
	if err == nil {
		p.markPartition(b.topic, b.partition, false)
		return
	}
	err = partitionError(p.classifyCall(err), b.partition)
	if ce := sink.Classify(err); ce.Scope == sink.ScopePartition {
		p.markPartition(b.topic, b.partition, true)
	}
	for _, i := range b.idx {
		errs[i] = err
	}
	if len(b.idx) > 1 && sink.Classify(err).Class == sink.ClassPermanent {
		p.isolate(ctx, records, b, errs)
	}
}

// isolate sends each of b's records alone, in order. After a key's record
// fails, its later ones are not sent.
func (p *Publisher) isolate(ctx context.Context, records []sink.Record, b *batch, errs []error) {
	stopped := map[string]bool{}
	for _, i := range b.idx {
		r := &records[i]
		if r.HasKey && stopped[r.Key] {
			errs[i] = sink.ErrNotSent
			continue
		}
		errs[i] = partitionError(p.classifyCall(p.produce(ctx, records, b.topic, b.partition, []int{i})), b.partition)
		if errs[i] != nil && r.HasKey {
			stopped[r.Key] = true
		}
	}
}

// produce sends records[idx] to one topic partition in one request.
func (p *Publisher) produce(ctx context.Context, records []sink.Record, topic string, partition int, idx []int) error {
	buf := p.buffers.Get().(*encodeBuffer)
	buf.data = buf.enc.encode(buf.data[:0], records, idx, time.Now())
	buf.reader.Reset(buf.data)
	res, err := p.conn.Load().client.RawProduce(ctx, &kafkago.RawProduceRequest{
		Topic:        topic,
		Partition:    partition,
		RequiredAcks: kafkago.RequireAll,
		RawRecords:   protocol.RawRecordSet{Reader: &buf.reader},
	})
	if err != nil {
		// The call may have ended with its context, or with the client's
		// own timeout, while kafka-go was still writing the request: only
		// a buffer whose request got an answer is reused.
		return err
	}
	p.buffers.Put(buf)
	return res.Error
}

// encodeBuffer is a produce request's encoded records, kept for the next
// request once the broker has read them.
type encodeBuffer struct {
	enc    batchEncoder
	data   []byte
	reader bytes.Reader
}

// messageBytes is what a record weighs against MaxMessageBytes: what its
// message carries, and the per-record framing.
func messageBytes(r *sink.Record) int {
	const framing = 64 // lengths, offsets and timestamp deltas, generously
	n := framing + len(r.Key) + len(r.Payload) +
		len(HeaderEventID) + 36 + len(HeaderID) + 20
	for k, v := range r.Headers {
		n += len(k) + len(v)
	}
	return n
}

// tombstoneProblem says why r cannot be the tombstone its headers ask for;
// nil when they do not ask for one or it can.
func tombstoneProblem(r *sink.Record) error {
	v, ok := r.Headers[HeaderTombstone]
	switch {
	case !ok:
		return nil
	case v != "true":
		return fmt.Errorf("kafka: header %s is %q; the only value it takes is \"true\"", HeaderTombstone, v)
	case !r.HasKey:
		return fmt.Errorf("kafka: header %s asks for a tombstone, which needs a key, and the row's key is null", HeaderTombstone)
	case max(len(r.Payload), r.PayloadSize) > 0:
		return fmt.Errorf("kafka: header %s asks for a tombstone, which has no value, and the row's payload is %d bytes; write an empty payload", HeaderTombstone, max(len(r.Payload), r.PayloadSize))
	}
	return nil
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
	if errors.Is(err, kafkago.InvalidTimestamp) {
		if p.createdAt {
			// The row's created_at is further from the broker's clock
			// than the topic allows: this row can never be sent so.
			return sink.Permanent(fmt.Errorf("kafka: the broker refused the message's timestamp, the row's created_at (see the topic's message.timestamp.before.max.ms and after.max.ms): %w", err), sink.ReasonInvalidMessage)
		}
		// The time of the publish is refused: the relay's clock is off,
		// whatever the message.
		return sink.Systemic(fmt.Errorf("kafka: the broker refused the time of the publish as the message's timestamp; check this machine's clock against the brokers': %w", err))
	}
	if p.sasl && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
		return sink.Systemic(fmt.Errorf("kafka: the broker closed the connection; with SASL this usually means authentication failed (check kafka.sasl): %w", err))
	}
	return Classify(err)
}

// Classify maps a kafka-go error to the relay's classes and scopes; nil
// stays nil. The mapping is documented in docs/failures.md.
//
//   - permanent: the message itself is refused (too large, invalid topic or
//     record); retrying cannot help.
//   - systemic: a part of the cluster cannot be used, whatever the message:
//     the whole cluster (unreachable, DNS, TLS, authentication, cluster
//     authorization), a topic (topic authorization) or a partition (no
//     leader, too few in-sync replicas). That part pauses and its rows
//     wait without counting attempts.
//   - transient: everything else, including kafka-go's Temporary() errors
//     and timeouts, whose outcome is unknown: retried, so a duplicate is
//     possible and a loss is not. An unknown topic is transient and
//     pauses its topic: it may be being created, and a typo still ends as
//     a dead letter when attempts or time run out.
//
// Partition-scoped errors name no partition here: the caller that knows
// it sets it (see partitionError).
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var ce *sink.Error
	if errors.As(err, &ce) {
		return err
	}
	var kerr kafkago.Error
	if errors.As(err, &kerr) {
		wrapped := fmt.Errorf("kafka: %w", err)
		switch kerr {
		case kafkago.MessageSizeTooLarge, kafkago.RecordListTooLarge:
			return sink.Permanent(wrapped, sink.ReasonTooLarge)
		case kafkago.InvalidRecord, kafkago.UnsupportedForMessageFormat:
			return sink.Permanent(wrapped, sink.ReasonPermanent)
		case kafkago.InvalidTopic:
			return sink.Permanent(wrapped, sink.ReasonInvalidMessage)
		case kafkago.UnknownTopicOrPartition:
			return sink.TopicFailure(sink.ClassTransient, wrapped)
		case kafkago.TopicAuthorizationFailed:
			return sink.TopicFailure(sink.ClassSystemic, wrapped)
		case kafkago.NotLeaderForPartition, kafkago.LeaderNotAvailable, kafkago.ReplicaNotAvailable,
			kafkago.NotEnoughReplicas, kafkago.NotEnoughReplicasAfterAppend, kafkago.KafkaStorageError,
			kafkago.FencedLeaderEpoch, kafkago.UnknownLeaderEpoch:
			return sink.PartitionFailure(sink.ClassSystemic, -1, wrapped)
		case kafkago.RequestTimedOut:
			// The leader did not hear from enough replicas in time.
			return sink.PartitionFailure(sink.ClassTransient, -1, wrapped)
		case kafkago.ClusterAuthorizationFailed, kafkago.SASLAuthenticationFailed,
			kafkago.UnsupportedSASLMechanism, kafkago.IllegalSASLState,
			kafkago.BrokerNotAvailable, kafkago.TransactionalIDAuthorizationFailed:
			return sink.Systemic(wrapped)
		case kafkago.UnsupportedCompressionType:
			// The cluster cannot take kafka.compression (zstd needs Kafka
			// 2.1): every row would fail alike.
			return sink.Systemic(fmt.Errorf("kafka: the brokers do not support this compression; choose another kafka.compression: %w", err))
		}
		return sink.Transient(wrapped, 0)
	}
	// No answer: the network's classification, shared with every sink.
	return sink.NetworkFailure(fmt.Errorf("kafka: %w", err))
}

// partitionError sets the partition of a partition-scoped failure of a
// request to that partition.
func partitionError(err error, partition int) error {
	var ce *sink.Error
	if errors.As(err, &ce) && ce.Scope == sink.ScopePartition {
		c := *ce
		c.Partition = partition
		return &c
	}
	return err
}

// maxTopicLen is the longest topic name Kafka accepts.
const maxTopicLen = 249

// ValidateTopic reports whether name is a legal Kafka topic name: 1 to 249
// ASCII letters, digits, '.', '_' and '-', and neither "." nor "..".
func ValidateTopic(name string) error {
	switch {
	case name == "":
		return errors.New("kafka: the topic name is empty")
	case len(name) > maxTopicLen:
		return fmt.Errorf("kafka: topic name %.40q... is %d characters long; Kafka allows at most %d", name, len(name), maxTopicLen)
	case name == "." || name == "..":
		return fmt.Errorf("kafka: %q is not a legal topic name", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("kafka: topic name %q has an illegal character at byte %d; Kafka allows only ASCII letters, digits, '.', '_' and '-'", name, i)
		}
	}
	return nil
}
