package nats_test

import (
	"net"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/nats"
	"github.com/outbox-relay/outbox-relay/relay/nats/natstest"
	"github.com/outbox-relay/outbox-relay/relay/publishertest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// The conformance server takes messages up to this size.
const maxPayload = 64 << 10

func TestConformance(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, publishertest.Sink{
		New: func(t *testing.T) publishertest.Destination {
			srv := natstest.Start(t, natstest.Options{MaxPayload: maxPayload})
			js := srv.Connect()
			natstest.AddStream(t, js, "CONFORMANCE", "conformance.>")
			return publishertest.Destination{
				Publisher: newPublisher(t, nats.Config{Servers: []string{srv.URL}}),
				Accepted: func(t *testing.T) []string {
					var got []string
					for _, m := range natstest.Messages(t, js, "CONFORMANCE") {
						got = append(got, string(m.Data))
					}
					return got
				},
				Headers: func(t *testing.T) map[string]map[string]string {
					got := map[string]map[string]string{}
					for _, m := range natstest.Messages(t, js, "CONFORMANCE") {
						h := map[string]string{}
						for k := range m.Header {
							h[k] = m.Header.Get(k)
						}
						got[string(m.Data)] = h
					}
					return got
				},
			}
		},
		// The stream keeps one message of an event id (Nats-Msg-Id) within
		// its duplicate window.
		Deduplicates: true,
		// The stream refuses a message that expects another stream.
		Reject:   func(rec *sink.Record) { rec.Headers = map[string]string{"Nats-Expected-Stream": "ELSEWHERE"} },
		TooLarge: func(rec *sink.Record) { rec.Payload = []byte(strings.Repeat("x", 2*maxPayload)) },
		Pings:    true,
		Unreachable: func(t *testing.T) sink.Publisher {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			url := "nats://" + ln.Addr().String()
			_ = ln.Close()
			return newPublisher(t, nats.Config{Servers: []string{url}})
		},
		Stoppable: func(t *testing.T) (publishertest.Destination, func(*testing.T), func(*testing.T)) {
			srv := natstest.Start(t, natstest.Options{MaxPayload: maxPayload})
			natstest.AddStream(t, srv.Connect(), "CONFORMANCE", "conformance.>")
			return publishertest.Destination{
				Publisher: newPublisher(t, nats.Config{Servers: []string{srv.URL}}),
				Accepted: func(t *testing.T) []string {
					var got []string
					for _, m := range natstest.Messages(t, srv.Connect(), "CONFORMANCE") {
						got = append(got, string(m.Data))
					}
					return got
				},
			}, func(*testing.T) { srv.Stop() }, func(*testing.T) { srv.Restart() }
		},
		Crashable: func(t *testing.T) (publishertest.Destination, func(*testing.T)) {
			srv := natstest.StartProcess(t, natstest.Options{MaxPayload: maxPayload})
			js := srv.Connect()
			natstest.AddStream(t, js, "CONFORMANCE", "conformance.>")
			return publishertest.Destination{
				Publisher: newPublisher(t, nats.Config{Servers: []string{srv.URL}}),
				Accepted: func(t *testing.T) []string {
					var got []string
					for _, m := range natstest.Messages(t, js, "CONFORMANCE") {
						got = append(got, string(m.Data))
					}
					return got
				},
			}, func(*testing.T) { srv.Crash() }
		},
	})
}

func newPublisher(t *testing.T, c nats.Config) *nats.Publisher {
	t.Helper()
	if c.Name == "" {
		c.Name = "test"
	}
	p, err := nats.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}
