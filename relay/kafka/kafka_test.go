package kafka_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func record(id int64, topic, key, payload string) sink.Record {
	return sink.Record{ID: id, EventID: uuid.New(), Topic: topic, Key: key, HasKey: key != "",
		Payload: []byte(payload), PayloadSize: len(payload)}
}

func newPublisher(t testing.TB, c *kfake.Cluster) *kafka.Publisher {
	t.Helper()
	return newPublisherWith(t, c, kafka.Config{})
}

func publish(t *testing.T, p *kafka.Publisher, recs []sink.Record) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return p.Publish(ctx, recs)
}

func TestPublishDeliveryFormat(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"orders", "audit"})
	p := newPublisher(t, c)
	recs := []sink.Record{
		record(1, "orders", "order-1", `{"n":1}`),
		record(2, "audit", "", "no key"),
		record(3, "orders", "order-1", `{"n":2}`),
	}
	recs[0].Headers = map[string]string{"traceparent": "00-abc-def-01", "content-type": "application/json"}
	emptyKey := record(4, "audit", "", "empty key")
	emptyKey.HasKey = true
	tombstone := record(5, "audit", "gone", "")
	tombstone.Payload = nil
	recs = append(recs, emptyKey, tombstone)
	before := time.Now().Truncate(time.Millisecond)
	for i, err := range publish(t, p, recs) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	orders := kafkatest.Consume(ctx, t, c.ListenAddrs(), "orders", 2)
	if string(orders[0].Value) != `{"n":1}` || string(orders[1].Value) != `{"n":2}` {
		t.Fatalf("orders out of order: %s, %s", orders[0].Value, orders[1].Value)
	}
	h := orders[0].Headers
	if string(orders[0].Key) != "order-1" || h["traceparent"] != "00-abc-def-01" || h["content-type"] != "application/json" ||
		h[kafka.HeaderEventID] != recs[0].EventID.String() || h[kafka.HeaderID] != "1" {
		t.Fatalf("first message key %q headers %v", orders[0].Key, h)
	}
	// The row's headers sorted by name, then the relay's.
	if got := strings.Join(orders[0].HeaderKeys, ","); got != "content-type,traceparent,"+kafka.HeaderEventID+","+kafka.HeaderID {
		t.Fatalf("header order %s", got)
	}
	for _, m := range orders {
		if m.Timestamp.Before(before) || m.Timestamp.After(time.Now()) {
			t.Fatalf("message timestamp %v, want the time of the publish (after %v)", m.Timestamp, before)
		}
	}
	audit := kafkatest.Consume(ctx, t, c.ListenAddrs(), "audit", 3)
	byID := map[string]kafkatest.Record{}
	for _, m := range audit {
		byID[m.Headers[kafka.HeaderID]] = m
	}
	if m := byID["2"]; m.Key != nil || string(m.Value) != "no key" {
		t.Fatalf("null-key message: key %q value %q", m.Key, m.Value)
	}
	if m := byID["4"]; m.Key == nil || len(m.Key) != 0 {
		t.Fatalf("empty-key message: key %q, want an empty, non-null key", m.Key)
	}
	if m := byID["5"]; m.Value != nil || string(m.Key) != "gone" {
		t.Fatalf("null-payload message: key %q value %q, want a null value", m.Key, m.Value)
	}
}

// Every produce request, batched or isolating one record, asks for the
// acknowledgement of all in-sync replicas (acks=-1): with fewer, a broker
// that fails after its ack loses rows the relay has already deleted.
func TestPublishRequiresAllReplicasToAcknowledge(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, nil)
	if err := c.CreateTopic("small", 1, map[string]string{"max.message.bytes": "2000"}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTopic("orders", 3, nil); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	acks := map[int16]int{}
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		acks[req.(*kmsg.ProduceRequest).Acks]++
		mu.Unlock()
		return nil, nil, false
	})
	p := newPublisher(t, c)
	// Several partitions at once, and a refused batch sent again one record
	// at a time.
	errs := publish(t, p, []sink.Record{
		record(1, "orders", "a", "1"), record(2, "orders", "b", "2"), record(3, "orders", "c", "3"),
		record(4, "small", "k", "x"), record(5, "small", "j", strings.Repeat("x", 3000)),
	})
	if errs[0] != nil || errs[1] != nil || errs[2] != nil || errs[3] != nil || errs[4] == nil {
		t.Fatalf("publish: %v, want all but the oversized record delivered", errs)
	}
	mu.Lock()
	defer mu.Unlock()
	if acks[-1] < 4 || len(acks) != 1 {
		t.Fatalf("produce requests by acks: %v, want every one with acks=-1 (all in-sync replicas), at least 4", acks)
	}
}

// The broker gets seconds, not kafka-go's default 500 ms, to gather the
// in-sync replicas' acknowledgements, and no more than the publish has.
func TestPublishGivesTheBrokerTimeToAcknowledge(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"orders"})
	timeouts := make(chan int32, 10)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		timeouts <- req.(*kmsg.ProduceRequest).TimeoutMillis
		return nil, nil, false
	})
	p := newPublisher(t, c)
	for _, tc := range []struct {
		within   time.Duration
		min, max int32
	}{{20 * time.Second, 4000, 5000}, {3 * time.Second, 1000, 1500}} {
		ctx, cancel := context.WithTimeout(context.Background(), tc.within)
		errs := p.Publish(ctx, []sink.Record{record(1, "orders", "k", "x")})
		cancel()
		if errs[0] != nil {
			t.Fatal(errs[0])
		}
		if got := <-timeouts; got < tc.min || got > tc.max {
			t.Errorf("publish within %v: the broker was given %d ms to acknowledge, want %d-%d", tc.within, got, tc.min, tc.max)
		}
	}
}

func TestPublishAfterCloseFails(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"orders"})
	p := newPublisher(t, c)
	p.Close()
	errs := publish(t, p, []sink.Record{record(1, "orders", "k", "x")})
	if e := sink.Classify(errs[0]); errs[0] == nil || e.Class != sink.ClassSystemic {
		t.Fatalf("publish after Close: %v, want a systemic error", errs[0])
	}
}

// A publish sends each partition's messages in one produce request, so
// that they succeed or fail together.
func TestPublishSendsEachPartitionInOneRequest(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"a", "b"})
	var mu sync.Mutex
	requests := map[string]int{} // produce requests per topic partition
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, topic := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range topic.Partitions {
				requests[fmt.Sprintf("%s/%d", topic.Topic, p.Partition)]++
			}
		}
		return nil, nil, false // the cluster handles it as usual
	})
	p := newPublisher(t, c)
	for round := range 5 {
		var recs []sink.Record
		for i := range 1500 {
			recs = append(recs, record(int64(round*1500+i+1), []string{"a", "b"}[i%2], fmt.Sprintf("key-%d", i%100), "x"))
		}
		mu.Lock()
		clear(requests)
		mu.Unlock()
		for i, err := range publish(t, p, recs) {
			if err != nil {
				t.Fatalf("round %d, record %d: %v", round, i, err)
			}
		}
		mu.Lock()
		if len(requests) != 6 {
			t.Errorf("round %d: produce requests for %d topic partitions, want all 6: %v", round, len(requests), requests)
		}
		for tp, n := range requests {
			if n != 1 {
				t.Errorf("round %d: %s's messages went out in %d produce requests, want 1", round, tp, n)
			}
		}
		mu.Unlock()
	}
}

// Keys go to the partition the Java client would choose.
func TestMurmur2Partitioning(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"orders"})
	p := newPublisher(t, c)
	var recs []sink.Record
	for i := range 30 {
		recs = append(recs, record(int64(i+1), "orders", fmt.Sprintf("key-%d", i), "x"))
	}
	for _, err := range publish(t, p, recs) {
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := kafkatest.Consume(ctx, t, c.ListenAddrs(), "orders", 30)
	partitions := []int{0, 1, 2}
	for _, r := range got {
		want := (&kafkago.Murmur2Balancer{}).Balance(kafkago.Message{Key: r.Key}, partitions...)
		if int(r.Partition) != want {
			t.Errorf("key %s on partition %d, murmur2 says %d", r.Key, r.Partition, want)
		}
	}
}

// Records without a key of one publish go to one partition, in one
// request; publishes spread them over the partitions.
func TestKeylessRecordsStickToAPartitionPerPublish(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"events"})
	p := newPublisher(t, c)
	const publishes, each = 20, 10
	for n := range publishes {
		var recs []sink.Record
		for i := range each {
			recs = append(recs, record(int64(n*each+i+1), "events", "", "x"))
		}
		for _, err := range publish(t, p, recs) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	partitionOf := map[int]int32{} // publish -> partition
	for _, r := range kafkatest.Consume(ctx, t, c.ListenAddrs(), "events", publishes*each) {
		id, _ := strconv.Atoi(r.Headers[kafka.HeaderID])
		n := (id - 1) / each
		if part, seen := partitionOf[n]; seen && part != r.Partition {
			t.Fatalf("publish %d went to partitions %d and %d", n, part, r.Partition)
		}
		partitionOf[n] = r.Partition
	}
	used := map[int32]bool{}
	for _, part := range partitionOf {
		used[part] = true
	}
	if len(used) < 2 {
		t.Fatalf("%d publishes all went to partition %v", publishes, used)
	}
}

// The balancer agrees with the Java client's Utils.murmur2 (values from
// Kafka's own tests): partition = (murmur2(key) & 0x7fffffff) % n.
func TestMurmur2MatchesJavaClient(t *testing.T) {
	t.Parallel()
	partitions := make([]int, 1000)
	for i := range partitions {
		partitions[i] = i
	}
	for key, javaHash := range map[string]int32{"21": -973932308, "foobar": -790332482} {
		want := int(uint32(javaHash)&0x7fffffff) % 1000
		if got := (&kafkago.Murmur2Balancer{}).Balance(kafkago.Message{Key: []byte(key)}, partitions...); got != want {
			t.Errorf("key %q: partition %d, the Java client picks %d", key, got, want)
		}
	}
}

// A failing topic fails only its own records.
func TestPublishIsolatesTopics(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"good", "bad"})
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "bad", Err: kerr.NotLeaderForPartition, Count: -1})
	p := newPublisher(t, c)
	errs := publish(t, p, []sink.Record{record(1, "good", "a", "1"), record(2, "bad", "b", "2"), record(3, "good", "", "3")})
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("good topic failed: %v", errs)
	}
	part, known := p.Partition(record(2, "bad", "b", "2"))
	if e := sink.Classify(errs[1]); errs[1] == nil || !known || e.Class != sink.ClassSystemic || e.Scope != sink.ScopePartition || e.Partition != part {
		t.Fatalf("bad topic: %v, want a systemic failure of partition %d (known: %v)", errs[1], part, known)
	}
}

// The broker refuses a batch holding one message above max.message.bytes:
// only that message is too large; its neighbours of other keys are
// delivered, its key's later message is not sent.
func TestPublishIsolatesOversizedMessage(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, nil)
	if err := c.CreateTopic("small", 1, map[string]string{"max.message.bytes": "2000"}); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, c)
	recs := []sink.Record{
		record(1, "small", "k", "a"),
		record(2, "small", "k", strings.Repeat("x", 3000)),
		record(3, "small", "k", "c"),
		record(4, "small", "other", "d"),
	}
	errs := publish(t, p, recs)
	if e := sink.Classify(errs[1]); errs[1] == nil || e.Class != sink.ClassPermanent || e.Reason != sink.ReasonTooLarge {
		t.Fatalf("oversized record: %v, want permanent too_large", errs[1])
	}
	if !errors.Is(errs[2], sink.ErrNotSent) {
		t.Fatalf("the oversized record's later key-mate: %v, want ErrNotSent", errs[2])
	}
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("records of other keys or earlier: %v", errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := kafkatest.ConsumeAll(ctx, t, c, "small")
	var order []string
	for _, r := range got {
		order = append(order, r.Headers[kafka.HeaderID])
	}
	if strings.Join(order, ",") != "1,4" {
		t.Fatalf("delivered ids %v, want 1,4 in order", order)
	}
}

// A message above MaxMessageBytes is refused without being sent; its key's
// later message is not sent either, and the others are delivered.
func TestPublishRefusesMessageAboveLimit(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"orders"})
	p, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs(), MaxMessageBytes: 1000, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	errs := publish(t, p, []sink.Record{
		record(1, "orders", "k", "a"),
		record(2, "orders", "k", strings.Repeat("x", 1000)),
		record(3, "orders", "k", "c"),
		record(4, "orders", "other", "d"),
		record(5, "orders", "", "e"),
	})
	if e := sink.Classify(errs[1]); errs[1] == nil || e.Class != sink.ClassPermanent || e.Reason != sink.ReasonTooLarge {
		t.Fatalf("oversized record: %v, want permanent too_large", errs[1])
	}
	if !errors.Is(errs[2], sink.ErrNotSent) {
		t.Fatalf("the oversized record's later key-mate: %v, want ErrNotSent", errs[2])
	}
	if errs[0] != nil || errs[3] != nil || errs[4] != nil {
		t.Fatalf("records of other keys or earlier: %v", errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ids []string
	for _, r := range kafkatest.ConsumeAll(ctx, t, c, "orders") {
		ids = append(ids, r.Headers[kafka.HeaderID])
	}
	slices.Sort(ids)
	if strings.Join(ids, ",") != "1,4,5" {
		t.Fatalf("delivered ids %v, want 1, 4 and 5", ids)
	}
}

// A topic the cluster does not have fails its own records, as a transient
// error (it may be being created), and holds back its keys' later records;
// the other records go.
func TestPublishUnknownTopic(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"orders"})
	p := newPublisher(t, c)
	errs := publish(t, p, []sink.Record{
		record(1, "missing", "k", "a"),
		record(2, "orders", "k", "b"),
		record(3, "missing", "", "c"),
		record(4, "orders", "j", "d"),
		record(5, "orders", "", "e"),
	})
	for _, i := range []int{0, 2} {
		if e := sink.Classify(errs[i]); errs[i] == nil || e.Class != sink.ClassTransient || !errors.Is(errs[i], kafkago.UnknownTopicOrPartition) {
			t.Errorf("record %d of the missing topic: %v, want transient UnknownTopicOrPartition", i+1, errs[i])
		}
	}
	if !errors.Is(errs[1], sink.ErrNotSent) {
		t.Errorf("later record of a failed key: %v, want ErrNotSent", errs[1])
	}
	if errs[3] != nil || errs[4] != nil {
		t.Fatalf("records of other keys: %v", errs)
	}
}

func TestPublishBrokerDownIsSystemic(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens here now
	p, err := kafka.New(kafka.Config{Brokers: []string{addr}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	errs := publish(t, p, []sink.Record{record(1, "orders", "k", "x"), record(2, "orders", "", "y")})
	for i, err := range errs {
		if e := sink.Classify(err); err == nil || e.Class != sink.ClassSystemic {
			t.Errorf("record %d: %v, want systemic", i, err)
		}
	}
}

// The mapping of docs/failures.md: class, scope and dead-letter reason of
// every error a publish can meet.
func TestClassify(t *testing.T) {
	t.Parallel()
	const (
		record      = sink.ScopeRecord
		topic       = sink.ScopeTopic
		partition   = sink.ScopePartition
		destination = sink.ScopeDestination
	)
	for _, tc := range []struct {
		err    error
		class  sink.Class
		scope  sink.Scope
		reason string
	}{
		{kafkago.MessageSizeTooLarge, sink.ClassPermanent, record, sink.ReasonTooLarge},
		{fmt.Errorf("write: %w", kafkago.MessageSizeTooLarge), sink.ClassPermanent, record, sink.ReasonTooLarge},
		{kafkago.RecordListTooLarge, sink.ClassPermanent, record, sink.ReasonTooLarge},
		{kafkago.InvalidRecord, sink.ClassPermanent, record, sink.ReasonPermanent},
		{kafkago.UnsupportedForMessageFormat, sink.ClassPermanent, record, sink.ReasonPermanent},
		{kafkago.InvalidTopic, sink.ClassPermanent, record, sink.ReasonInvalidMessage},
		{kafkago.UnsupportedCompressionType, sink.ClassSystemic, destination, ""},
		{kafkago.InvalidMessage, sink.ClassTransient, record, ""}, // a corrupt message: Kafka retries it
		{kafkago.UnknownTopicOrPartition, sink.ClassTransient, topic, ""},
		{kafkago.TopicAuthorizationFailed, sink.ClassSystemic, topic, ""},
		{kafkago.NotLeaderForPartition, sink.ClassSystemic, partition, ""},
		{kafkago.LeaderNotAvailable, sink.ClassSystemic, partition, ""},
		{kafkago.ReplicaNotAvailable, sink.ClassSystemic, partition, ""},
		{kafkago.NotEnoughReplicas, sink.ClassSystemic, partition, ""},
		{kafkago.NotEnoughReplicasAfterAppend, sink.ClassSystemic, partition, ""},
		{kafkago.KafkaStorageError, sink.ClassSystemic, partition, ""},
		{kafkago.FencedLeaderEpoch, sink.ClassSystemic, partition, ""},
		{kafkago.UnknownLeaderEpoch, sink.ClassSystemic, partition, ""},
		{kafkago.RequestTimedOut, sink.ClassTransient, partition, ""},
		{kafkago.ClusterAuthorizationFailed, sink.ClassSystemic, destination, ""},
		{kafkago.SASLAuthenticationFailed, sink.ClassSystemic, destination, ""},
		{kafkago.UnsupportedSASLMechanism, sink.ClassSystemic, destination, ""},
		{kafkago.IllegalSASLState, sink.ClassSystemic, destination, ""},
		{kafkago.BrokerNotAvailable, sink.ClassSystemic, destination, ""},
		{kafkago.TransactionalIDAuthorizationFailed, sink.ClassSystemic, destination, ""},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, sink.ClassSystemic, destination, ""},
		{&net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}, sink.ClassSystemic, destination, ""},
		{&net.DNSError{Err: "no such host", Name: "kafka"}, sink.ClassSystemic, destination, ""},
		{&tls.CertificateVerificationError{Err: errors.New("unknown authority")}, sink.ClassSystemic, destination, ""},
		{&net.OpError{Op: "read", Err: syscall.ECONNRESET}, sink.ClassTransient, destination, ""},
		{context.DeadlineExceeded, sink.ClassTransient, destination, ""},
		{io.ErrUnexpectedEOF, sink.ClassTransient, destination, ""},
		{sink.Permanent(errors.New("already classified"), "no_route"), sink.ClassPermanent, record, "no_route"},
	} {
		got := sink.Classify(kafka.Classify(tc.err))
		if got.Class != tc.class || got.Scope != tc.scope || got.Reason != tc.reason {
			t.Errorf("Classify(%v) = %v/%v/%q, want %v/%v/%q", tc.err, got.Class, got.Scope, got.Reason, tc.class, tc.scope, tc.reason)
		}
	}
	if kafka.Classify(nil) != nil {
		t.Error("Classify(nil) is not nil")
	}
}

func TestValidateTopic(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"orders", "a", "Orders.v2_placed-eu", strings.Repeat("x", 249)} {
		if err := kafka.ValidateTopic(ok); err != nil {
			t.Errorf("ValidateTopic(%q): %v", ok, err)
		}
	}
	for name, want := range map[string]string{
		"":                       "empty",
		".":                      "not a legal topic name",
		"..":                     "not a legal topic name",
		strings.Repeat("x", 250): "250 characters long; Kafka allows at most 249",
		"orders placed":          `illegal character at byte 6`,
		"orders/placed":          `illegal character at byte 6`,
		"ordërs":                 `illegal character at byte 3`,
	} {
		if err := kafka.ValidateTopic(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateTopic(%.20q) = %v, want an error saying %q", name, err, want)
		}
	}
}

// A record whose topic Kafka would refuse is dead-lettered invalid_message
// without a request to the cluster; the other records go.
func TestPublishRefusesIllegalTopicLocally(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"orders"})
	var asked atomic.Int32
	c.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, t := range req.(*kmsg.MetadataRequest).Topics {
			if t.Topic != nil && *t.Topic != "orders" {
				asked.Add(1)
			}
		}
		return nil, nil, false
	})
	p := newPublisher(t, c)
	errs := publish(t, p, []sink.Record{
		record(1, "orders placed", "k", "a"),
		record(2, "orders", "k", "b"),
		record(3, "orders", "j", "c"),
	})
	e := sink.Classify(errs[0])
	if errs[0] == nil || e.Class != sink.ClassPermanent || e.Reason != sink.ReasonInvalidMessage ||
		!strings.Contains(errs[0].Error(), `topic name "orders placed" has an illegal character`) {
		t.Fatalf("illegal topic: %v, want permanent invalid_message naming the topic", errs[0])
	}
	if !errors.Is(errs[1], sink.ErrNotSent) || errs[2] != nil {
		t.Fatalf("the key's later record and another key's: %v, want ErrNotSent and delivered", errs[1:])
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("the cluster was asked about an illegal topic %d times", n)
	}
}

// Records without a key keep away from a partition that has just failed,
// so that they go on flowing while it has no leader.
func TestKeylessRecordsAvoidAFailingPartition(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"events"}, kfake.DefaultNumPartitions(2))
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "events", Partitions: []int32{1}, Err: kerr.NotLeaderForPartition, Count: -1})
	p := newPublisher(t, c)
	// Until partition 1 is picked once, nothing is known against it. Its
	// other partitions work.
	deadline := time.Now().Add(10 * time.Second)
	for {
		errs := publish(t, p, []sink.Record{record(1, "events", "", "x")})
		if errs[0] != nil {
			e := sink.Classify(errs[0])
			if e.Scope != sink.ScopePartition || e.Partition != 1 {
				t.Fatalf("failure %v: scope %v partition %d, want partition 1", errs[0], e.Scope, e.Partition)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("partition 1 was never picked")
		}
	}
	for i := range 20 {
		if errs := publish(t, p, []sink.Record{record(int64(i+2), "events", "", "x")}); errs[0] != nil {
			t.Fatalf("publish %d after partition 1 failed: %v; records without a key should go to partition 0", i+1, errs[0])
		}
	}
	if _, ok := p.Partition(record(1, "events", "k", "x")); !ok {
		t.Fatal("Partition of a keyed record is not known")
	}
	if _, ok := p.Partition(record(1, "events", "", "x")); ok {
		t.Fatal("Partition of a record without a key is known; it is picked per publish")
	}
}

func TestPublishWithSASL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		method string
		mech   func(user, pass string) (sasl.Mechanism, error)
	}{
		{"PLAIN", func(u, p string) (sasl.Mechanism, error) { return plain.Mechanism{Username: u, Password: p}, nil }},
		{"SCRAM-SHA-256", func(u, p string) (sasl.Mechanism, error) { return scram.Mechanism(scram.SHA256, u, p) }},
		{"SCRAM-SHA-512", func(u, p string) (sasl.Mechanism, error) { return scram.Mechanism(scram.SHA512, u, p) }},
	} {
		t.Run(tc.method, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.NewCluster(t, []string{"orders"}, kfake.EnableSASL(), kfake.Superuser(tc.method, "relay", "s3cret"))
			for _, pass := range []string{"s3cret", "wrong"} {
				mech, err := tc.mech("relay", pass)
				if err != nil {
					t.Fatal(err)
				}
				p, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs(), SASL: mech, DialTimeout: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				errs := publish(t, p, []sink.Record{record(1, "orders", "k", "x")})
				p.Close()
				if pass == "s3cret" && errs[0] != nil {
					t.Fatalf("with the right password: %v", errs[0])
				}
				if pass == "wrong" {
					if e := sink.Classify(errs[0]); errs[0] == nil || e.Class != sink.ClassSystemic {
						t.Fatalf("with a wrong password: %v, want a systemic failure", errs[0])
					}
				}
			}
		})
	}
}
