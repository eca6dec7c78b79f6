package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/internal/kafkatest"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// BenchmarkPublish publishes batches shaped like the end-to-end
// benchmark's drains (1000 records of 200 bytes over 10k keys, a topic of
// 6 partitions) to an in-process broker that checks and discards them. It
// reports the CPU a record of the whole process (sink, Kafka client and
// broker), which on a machine shared with PostgreSQL is what a publish
// costs the drain: steadier to compare than a drain, and without a
// database.
func BenchmarkPublish(b *testing.B) {
	c := kafkatest.NewCluster(b, nil, kfake.SeedTopics(6, "bench"), kfake.BlackholeProduce())
	p := newPublisher(b, c)
	recs := make([]outbox.Record, 1000)
	payload := strings.Repeat("x", 200)
	for i := range recs {
		recs[i] = record(int64(i+1), "bench", fmt.Sprintf("key-%d", i*7919%10000), payload)
	}
	ctx := context.Background()
	publish := func() {
		for i, err := range p.Publish(ctx, recs) {
			if err != nil {
				b.Fatalf("record %d: %v", i, err)
			}
		}
	}
	publish() // connect and read the metadata
	b.ReportAllocs()
	start := processCPU()
	b.ResetTimer()
	for range b.N {
		publish()
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-start)/float64(b.N*len(recs)), "cpu-ns/record")
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
