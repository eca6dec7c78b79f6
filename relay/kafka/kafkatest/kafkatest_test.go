package kafkatest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// kafka-go, the relay's client, talks to the in-process cluster over TCP.
func TestKafkaGoRoundTrip(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"orders"})
	w := &kafka.Writer{
		Addr:         kafka.TCP(c.ListenAddrs()...),
		Topic:        "orders",
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		Balancer:     &kafka.Hash{},
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 100
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{
			Key:     []byte(fmt.Sprintf("key-%d", i%7)),
			Value:   []byte(fmt.Sprint(i)),
			Headers: []kafka.Header{{Key: "seq", Value: []byte(fmt.Sprint(i))}},
		}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	got := kafkatest.Consume(ctx, t, c.ListenAddrs(), "orders", n)
	if len(got) != n {
		t.Fatalf("consumed %d records, want %d", len(got), n)
	}
	// Per key, the order written is the order stored.
	last := map[string]int{}
	partitionOf := map[string]int32{}
	for _, r := range got {
		var seq int
		fmt.Sscan(string(r.Value), &seq)
		if r.Headers["seq"] != string(r.Value) {
			t.Errorf("record %s: header seq=%q", r.Value, r.Headers["seq"])
		}
		k := string(r.Key)
		if p, ok := partitionOf[k]; ok && p != r.Partition {
			t.Errorf("key %s on partitions %d and %d", k, p, r.Partition)
		}
		partitionOf[k] = r.Partition
		if prev, ok := last[k]; ok && seq < prev {
			t.Errorf("key %s: %d after %d", k, seq, prev)
		}
		last[k] = seq
	}
}
