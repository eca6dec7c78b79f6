//go:build unix

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
// benchmark's drains (1000 records of 200 bytes, each of its own key, to
// a topic of 6 partitions) to an in-process broker that checks and
// discards them. It reports the CPU a record of the whole process (sink,
// Kafka client and broker, which production does not run beside the
// relay): without a database on the cores, steadier to compare than a
// drain.
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
	start, n := processCPU(), 0
	for b.Loop() {
		publish()
		n++
	}
	b.ReportMetric(float64(processCPU()-start)/float64(n*len(recs)), "cpu-ns/record")
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
