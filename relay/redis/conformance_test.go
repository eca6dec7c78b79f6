package redis_test

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/publishertest"
	"github.com/outbox-relay/outbox-relay/relay/redis"
	"github.com/outbox-relay/outbox-relay/relay/redis/redistest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// The conformance entries take up to this many bytes.
const maxEntry = 64 << 10

func TestConformance(t *testing.T) {
	t.Parallel()
	// Each destination is a server of its own, so each can crash.
	destination := func(t *testing.T) (publishertest.Destination, *redistest.Server) {
		srv := redistest.Start(t, redistest.Options{})
		c := srv.Client(nil)
		return publishertest.Destination{
			Publisher: newPublisher(t, redis.Config{Addresses: []string{srv.Addr}, MaxEntryBytes: maxEntry}),
			Accepted: func(t *testing.T) []string {
				var got []string
				for _, stream := range []string{publishertest.TopicA, publishertest.TopicB} {
					for _, e := range redistest.Entries(t, c, stream) {
						got = append(got, e[redis.FieldPayload].(string))
					}
				}
				return got
			},
			// The record's headers are one field, a JSON object.
			Headers: func(t *testing.T) map[string]map[string]string {
				got := map[string]map[string]string{}
				for _, stream := range []string{publishertest.TopicA, publishertest.TopicB} {
					for _, e := range redistest.Entries(t, c, stream) {
						h := map[string]string{}
						if err := json.Unmarshal([]byte(fmt.Sprint(e[redis.FieldHeaders])), &h); err != nil {
							t.Fatalf("the %s field: %v", redis.FieldHeaders, err)
						}
						for _, f := range []string{redis.FieldEventID, redis.FieldID, redis.FieldKey} {
							if v, ok := e[f]; ok {
								h[f] = fmt.Sprint(v)
							}
						}
						got[fmt.Sprint(e[redis.FieldPayload])] = h
					}
				}
				return got
			},
		}, srv
	}
	publishertest.Run(t, publishertest.Sink{
		New: func(t *testing.T) publishertest.Destination {
			d, _ := destination(t)
			return d
		},
		Stoppable: func(t *testing.T) (publishertest.Destination, func(*testing.T), func(*testing.T)) {
			d, srv := destination(t)
			return d, func(*testing.T) { srv.Stop() }, func(*testing.T) { srv.Restart() }
		},
		Crashable: func(t *testing.T) (publishertest.Destination, func(*testing.T)) {
			d, srv := destination(t)
			return d, func(*testing.T) { srv.Crash() }
		},
		Reject:   func(rec *sink.Record) { rec.Topic = "" },
		TooLarge: func(rec *sink.Record) { rec.Payload = []byte(strings.Repeat("x", 2*maxEntry)) },
		Pings:    true,
		Unreachable: func(t *testing.T) sink.Publisher {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			_ = ln.Close()
			return newPublisher(t, redis.Config{Addresses: []string{addr}})
		},
	})
}
