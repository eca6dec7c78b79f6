//go:build unix

package kafka_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/compress"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// BenchmarkPublish publishes batches shaped like the end-to-end
// benchmark's drains (1000 records of about 200 bytes of JSON, each of its
// own key, to a topic of 6 partitions) to an in-process broker that checks
// and discards them, once per compression. It reports the CPU a record
// costs the whole process (sink, Kafka client and broker, which production
// does not run beside the relay): without a database on the cores, steadier
// to compare than a drain; and the bytes a record takes on the wire.
func BenchmarkPublish(b *testing.B) {
	for _, codec := range []compress.Compression{compress.None, compress.Gzip, compress.Snappy, compress.Lz4, compress.Zstd} {
		b.Run(codec.String(), func(b *testing.B) { benchmarkPublish(b, codec) })
	}
}

func benchmarkPublish(b *testing.B, codec compress.Compression) {
	c := kafkatest.NewCluster(b, nil, kfake.SeedTopics(6, "bench"), kfake.BlackholeProduce())
	var wire atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, t := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range t.Partitions {
				wire.Add(int64(len(p.Records)))
			}
		}
		return nil, nil, false
	})
	p := newPublisherWith(b, c, kafka.Config{Compression: codec})
	recs := make([]sink.Record, 1000)
	for i := range recs {
		key := fmt.Sprintf("order-%d", i*7919%10000)
		payload := fmt.Sprintf(`{"order_id":%q,"customer_id":"c-%d","status":"paid","amount_cents":%d,"currency":"EUR","items":[{"sku":"sku-%d","qty":%d}],"paid_at":"2026-11-24T10:%02d:%02d.%03dZ"}`,
			key, i*31%5000, 1000+i*37%90000, i*13%700, 1+i%4, i%60, i*7%60, i%1000)
		recs[i] = record(int64(i+1), "bench", key, payload)
		recs[i].Headers = map[string]string{"traceparent": fmt.Sprintf("00-%032x-%016x-01", i*104729, i*7)}
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
	wire.Store(0)
	start, n := processCPU(), 0
	for b.Loop() {
		publish()
		n++
	}
	b.ReportMetric(float64(processCPU()-start)/float64(n*len(recs)), "cpu-ns/record")
	b.ReportMetric(float64(wire.Load())/float64(n*len(recs)), "wire-bytes/record")
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
