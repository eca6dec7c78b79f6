package kafka_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/compress"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func newPublisherWith(t testing.TB, c *kfake.Cluster, cfg kafka.Config) *kafka.Publisher {
	t.Helper()
	cfg.Brokers, cfg.DialTimeout = c.ListenAddrs(), time.Second
	p, err := kafka.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// Each codec's batches are marked with it in the batch attributes and read
// back whole by another client (franz-go), headers and keys included, in
// order, and come out smaller than the uncompressed batch. lz4 frames are
// written in 64 KiB blocks, as Kafka's producer writes them: readers
// allocate a block per batch (the batch here takes two).
func TestPublishCompressed(t *testing.T) {
	t.Parallel()
	for _, codec := range []compress.Compression{compress.Gzip, compress.Snappy, compress.Lz4, compress.Zstd} {
		t.Run(codec.String(), func(t *testing.T) {
			t.Parallel()
			c := kafkatest.NewCluster(t, []string{"orders"})
			var mu sync.Mutex
			var attrs []int16
			var sizes []int
			var lz4Blocks []byte // each lz4 frame's block maximum size (BD byte bits 4-6; 4 is 64 KiB)
			c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				for _, tp := range req.(*kmsg.ProduceRequest).Topics {
					for _, pp := range tp.Partitions {
						var b kmsg.RecordBatch
						if err := b.ReadFrom(pp.Records); err == nil {
							mu.Lock()
							attrs = append(attrs, b.Attributes)
							sizes = append(sizes, len(pp.Records))
							if b.Attributes&7 == int16(compress.Lz4) && len(b.Records) > 5 {
								lz4Blocks = append(lz4Blocks, b.Records[5]>>4&7)
							}
							mu.Unlock()
						}
					}
				}
				return nil, nil, false
			})
			p := newPublisherWith(t, c, kafka.Config{Compression: codec})
			var recs []sink.Record
			payload := strings.Repeat(`{"order":"o-1","status":"paid","amount":1250},`, 20)
			for i := range 100 {
				r := record(int64(i+1), "orders", "order-1", payload+string(rune('a'+i%26)))
				r.Headers = map[string]string{"traceparent": "00-abc-def-01"}
				recs = append(recs, r)
			}
			for i, err := range publish(t, p, recs) {
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			got := kafkatest.Consume(ctx, t, c.ListenAddrs(), "orders", len(recs))
			for i, m := range got {
				if string(m.Value) != string(recs[i].Payload) || string(m.Key) != "order-1" ||
					m.Headers["traceparent"] != "00-abc-def-01" || m.Headers[kafka.HeaderEventID] != recs[i].EventID.String() {
					t.Fatalf("message %d: key %q headers %v value %.30q", i, m.Key, m.Headers, m.Value)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(attrs) != 1 || attrs[0]&7 != int16(codec) {
				t.Fatalf("batch attributes %v, want one batch with codec %d", attrs, codec)
			}
			if raw := len(recs) * len(payload); sizes[0] > raw/4 {
				t.Fatalf("%s batch is %d bytes for %d bytes of payloads", codec, sizes[0], raw)
			}
			if codec == compress.Lz4 && !slices.Equal(lz4Blocks, []byte{4}) {
				t.Fatalf("lz4 frames' block sizes %v, want one frame of 64 KiB blocks (4)", lz4Blocks)
			}
		})
	}
}

// A row with the tombstone header becomes a message with its key and a
// null value, without the header; a tombstone that cannot be is refused
// as an invalid message, and its key's later rows wait.
func TestPublishTombstones(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"customers"})
	p := newPublisher(t, c)
	tomb := func(id int64, key, payload, value string) sink.Record {
		r := record(id, "customers", key, payload)
		r.Headers = map[string]string{kafka.HeaderTombstone: value, "traceparent": "00-abc-def-01"}
		return r
	}
	recs := []sink.Record{
		record(1, "customers", "c-1", `{"name":"Ada"}`),
		tomb(2, "c-1", "", "true"),
		tomb(3, "c-2", "", "yes"),
		record(4, "customers", "c-2", "after the bad tombstone"),
		tomb(5, "", "", "true"),
		tomb(6, "c-3", "{}", "true"),
		record(7, "customers", "c-4", "healthy"),
	}
	errs := publish(t, p, recs)
	for i, want := range []string{"", "", `is "yes"`, "", "needs a key", "payload is 2 bytes", ""} {
		switch {
		case want == "" && i == 3:
			if !errors.Is(errs[i], sink.ErrNotSent) {
				t.Errorf("record %d: %v, want not sent after its key's refused tombstone", recs[i].ID, errs[i])
			}
		case want == "":
			if errs[i] != nil {
				t.Errorf("record %d: %v", recs[i].ID, errs[i])
			}
		default:
			ce := sink.Classify(errs[i])
			if ce.Class != sink.ClassPermanent || ce.Reason != sink.ReasonInvalidMessage || !strings.Contains(errs[i].Error(), want) {
				t.Errorf("record %d: %v (%+v), want a permanent invalid_message saying %q", recs[i].ID, errs[i], ce, want)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := kafkatest.Consume(ctx, t, c.ListenAddrs(), "customers", 3)
	byID := map[string]kafkatest.Record{}
	for _, m := range got {
		byID[m.Headers[kafka.HeaderID]] = m
	}
	m, ok := byID["2"]
	if !ok || m.Value != nil || string(m.Key) != "c-1" || m.Headers["traceparent"] != "00-abc-def-01" {
		t.Fatalf("tombstone: %+v, want key c-1 and a null value", m)
	}
	if _, ok := m.Headers[kafka.HeaderTombstone]; ok {
		t.Fatalf("tombstone headers %v: the request header is sent", m.Headers)
	}
	if len(byID) != 3 || byID["1"].Value == nil || byID["7"].Value == nil {
		t.Fatalf("delivered %v, want rows 1, 2 and 7", byID)
	}
}

// With timestamp created_at, each message carries its row's created_at to
// the millisecond, in a batch whose rows were created out of id order.
func TestPublishCreatedAtTimestamps(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewCluster(t, []string{"orders"})
	p := newPublisherWith(t, c, kafka.Config{Timestamp: kafka.TimestampCreatedAt, Compression: compress.Lz4})
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	recs := []sink.Record{
		record(1, "orders", "k", "1"), record(2, "orders", "k", "2"), record(3, "orders", "k", "3"),
	}
	recs[0].CreatedAt = base.Add(1500 * time.Millisecond)
	recs[1].CreatedAt = base // committed earlier, with a later id
	recs[2].CreatedAt = base.Add(72 * time.Hour)
	for i, err := range publish(t, p, recs) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, m := range kafkatest.Consume(ctx, t, c.ListenAddrs(), "orders", 3) {
		if !m.Timestamp.Equal(recs[i].CreatedAt) {
			t.Errorf("message %d: timestamp %v, want its row's created_at %v", i, m.Timestamp.UTC(), recs[i].CreatedAt)
		}
	}
}

// A broker that refuses a message's timestamp refuses the row's created_at
// for good, and with the time of the publish points at this machine's
// clock: the destination pauses and no row is dead-lettered.
func TestInvalidTimestampIsClassifiedByItsSource(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ts    kafka.Timestamp
		class sink.Class
		says  string
	}{
		{kafka.TimestampCreatedAt, sink.ClassPermanent, "created_at"},
		{kafka.TimestampPublish, sink.ClassSystemic, "clock"},
	} {
		t.Run(string(tc.ts), func(t *testing.T) {
			t.Parallel()
			c := kafkatest.NewCluster(t, []string{"orders"})
			c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				r := req.(*kmsg.ProduceRequest)
				resp := r.ResponseKind().(*kmsg.ProduceResponse)
				for _, tp := range r.Topics {
					rt := kmsg.NewProduceResponseTopic()
					rt.Topic = tp.Topic
					for _, pp := range tp.Partitions {
						rp := kmsg.NewProduceResponseTopicPartition()
						rp.Partition = pp.Partition
						rp.ErrorCode = kerr.InvalidTimestamp.Code
						rt.Partitions = append(rt.Partitions, rp)
					}
					resp.Topics = append(resp.Topics, rt)
				}
				return resp, nil, true
			})
			p := newPublisherWith(t, c, kafka.Config{Timestamp: tc.ts})
			rec := record(1, "orders", "k", "x")
			rec.CreatedAt = time.Now().Add(-90 * 24 * time.Hour)
			err := publish(t, p, []sink.Record{rec})[0]
			ce := sink.Classify(err)
			if ce.Class != tc.class || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%v classified %+v, want class %v saying %q", err, ce, tc.class, tc.says)
			}
		})
	}
}

// A bad compression or timestamp setting lists both problems.
func TestSettingsValidateProducerOptions(t *testing.T) {
	t.Parallel()
	s := kafka.Settings{Brokers: []string{"kafka:9092"}, Compression: "brotli", Timestamp: "log_append"}
	err := s.Validate()
	if err == nil || !strings.Contains(err.Error(), `compression is "brotli"; use none, gzip, snappy, lz4 or zstd`) ||
		!strings.Contains(err.Error(), `timestamp is "log_append"; use publish or created_at`) {
		t.Fatalf("Validate: %v", err)
	}
	for _, name := range kafka.Compressions {
		s := kafka.Settings{Brokers: []string{"kafka:9092"}, Compression: name, Timestamp: "created_at"}
		if err := s.Validate(); err != nil {
			t.Fatalf("compression %s: %v", name, err)
		}
	}
}
