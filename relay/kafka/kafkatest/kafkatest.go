// Package kafkatest runs an in-process Kafka-protocol cluster (franz-go's
// kfake) for tests, and reads back what was produced to it.
package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// NewCluster starts a cluster on loopback ports with topics created (three
// partitions each) and closes it when the test ends. Extra options, such as
// kfake.NumBrokers, are passed through.
func NewCluster(tb testing.TB, topics []string, opts ...kfake.Opt) *kfake.Cluster {
	tb.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.DefaultNumPartitions(3)}, opts...)
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(3, topics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		tb.Fatalf("kafkatest: start cluster: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Record is one consumed message.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   map[string]string
	// HeaderKeys are the headers' names in the order they came.
	HeaderKeys []string
	Timestamp  time.Time
}

// ConsumeAll reads every record topic holds now, duplicates included.
func ConsumeAll(ctx context.Context, tb testing.TB, c *kfake.Cluster, topic string) []Record {
	tb.Helper()
	return ConsumeTopic(ctx, tb, c.ListenAddrs(), topic)
}

// Consume reads topic from the start until it has n records or ctx ends,
// and returns them in partition then offset order as they arrive.
func Consume(ctx context.Context, tb testing.TB, brokers []string, topic string, n int) []Record {
	tb.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
		// Without fetch sessions: franz-go's Close reads a session's id
		// while a fetch still in flight may write it (a data race in the
		// library, seen under -race).
		kgo.DisableFetchSessions(),
	)
	if err != nil {
		tb.Fatalf("kafkatest: consumer: %v", err)
	}
	defer cl.Close()
	var out []Record
	for len(out) < n {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			tb.Fatalf("kafkatest: consumed %d of %d records from %s: %v", len(out), n, topic, ctx.Err())
		}
		for _, e := range fetches.Errors() {
			tb.Logf("kafkatest: fetch %s/%d: %v", e.Topic, e.Partition, e.Err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			rec := Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value,
				Headers: make(map[string]string, len(r.Headers)), Timestamp: r.Timestamp}
			for _, x := range r.Headers {
				rec.Headers[x.Key] = string(x.Value)
				rec.HeaderKeys = append(rec.HeaderKeys, x.Key)
			}
			out = append(out, rec)
		})
	}
	return out
}
