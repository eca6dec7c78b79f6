package pubsub_test

import (
	"maps"
	"net"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/publishertest"
	"github.com/outbox-relay/outbox-relay/relay/pubsub"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, publishertest.Sink{
		New: func(t *testing.T) publishertest.Destination {
			srv := emulator(t, publishertest.TopicA, publishertest.TopicB)
			return publishertest.Destination{
				Publisher: newPublisher(t, pubsub.Config{Emulator: srv.Addr, MaxMessageBytes: maxMessage}),
				Accepted: func(*testing.T) []string {
					var got []string
					for _, m := range srv.Messages() {
						got = append(got, string(m.Data))
					}
					return got
				},
				// The key is the ordering key.
				Headers: func(*testing.T) map[string]map[string]string {
					got := map[string]map[string]string{}
					for _, m := range srv.Messages() {
						h := maps.Clone(m.Attributes)
						if m.OrderingKey != "" {
							h[sink.HeaderKey] = m.OrderingKey
						}
						got[string(m.Data)] = h
					}
					return got
				},
			}
		},
		Reject:   func(rec *sink.Record) { rec.Headers = map[string]string{"goog-reserved": "x"} },
		TooLarge: func(rec *sink.Record) { rec.Payload = []byte(strings.Repeat("x", 2*maxMessage)) },
		Unreachable: func(t *testing.T) sink.Publisher {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			_ = ln.Close()
			return newPublisher(t, pubsub.Config{Emulator: addr})
		},
	})
}
