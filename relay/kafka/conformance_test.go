package kafka_test

import (
	"context"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/publishertest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// The sink under the conformance suite takes messages up to this size.
const conformanceLimit = 64 << 10

func TestConformance(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, publishertest.Sink{
		New: func(t *testing.T) publishertest.Destination {
			c := kafkatest.NewCluster(t, []string{publishertest.TopicA, publishertest.TopicB})
			return publishertest.Destination{
				Publisher: conformancePublisher(t, c.ListenAddrs()),
				Accepted: func(t *testing.T) []string {
					var out []string
					for _, topic := range []string{publishertest.TopicA, publishertest.TopicB} {
						for _, r := range kafkatest.ConsumeAll(context.Background(), t, c, topic) {
							out = append(out, string(r.Value))
						}
					}
					return out
				},
				// The key is the record's key.
				Headers: func(t *testing.T) map[string]map[string]string {
					got := map[string]map[string]string{}
					for _, topic := range []string{publishertest.TopicA, publishertest.TopicB} {
						for _, r := range kafkatest.ConsumeAll(context.Background(), t, c, topic) {
							h := maps.Clone(r.Headers)
							if len(r.Key) > 0 {
								h[sink.HeaderKey] = string(r.Key)
							}
							got[string(r.Value)] = h
						}
					}
					return got
				},
			}
		},
		Stoppable: func(t *testing.T) (publishertest.Destination, func(*testing.T), func(*testing.T)) {
			c := kafkatest.NewCluster(t, []string{publishertest.TopicA, publishertest.TopicB})
			outage := kafkatest.NewOutage(c)
			return publishertest.Destination{
				Publisher: conformancePublisher(t, c.ListenAddrs()),
				Accepted: func(t *testing.T) []string {
					var out []string
					for _, topic := range []string{publishertest.TopicA, publishertest.TopicB} {
						for _, r := range kafkatest.ConsumeAll(context.Background(), t, c, topic) {
							out = append(out, string(r.Value))
						}
					}
					return out
				},
			}, func(*testing.T) { outage.Down() }, func(*testing.T) { outage.Up() }
		},
		// A topic name no broker takes: refused before it is sent.
		Reject:   func(rec *sink.Record) { rec.Topic = "not a topic" },
		TooLarge: func(rec *sink.Record) { rec.Payload = []byte(strings.Repeat("x", 2*conformanceLimit)) },
		Pings:    true,
		Unreachable: func(t *testing.T) sink.Publisher {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			_ = ln.Close()
			return conformancePublisher(t, []string{addr})
		},
	})
}

func conformancePublisher(t *testing.T, brokers []string) *kafka.Publisher {
	t.Helper()
	p, err := kafka.New(kafka.Config{Brokers: brokers, DialTimeout: time.Second, MaxMessageBytes: conformanceLimit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}
