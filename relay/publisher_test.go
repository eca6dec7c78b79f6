package relay_test

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/publishertest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// The fake the relay's tests publish to keeps the Publisher contract too.
func TestFakePublisherConformance(t *testing.T) {
	t.Parallel()
	const limit = 1 << 10
	publishertest.Run(t, publishertest.Sink{
		New: func(t *testing.T) publishertest.Destination {
			f := &fakePublisher{fail: func(r sink.Record, _ int) error {
				switch {
				case r.Headers["X-Conformance"] == "reject":
					return sink.Permanent(errors.New("rejected"), "")
				case r.PayloadSize > limit:
					return sink.Permanent(fmt.Errorf("%d bytes", r.PayloadSize), sink.ReasonTooLarge)
				}
				return nil
			}}
			return publishertest.Destination{Publisher: f, Accepted: func(*testing.T) []string {
				var out []string
				for _, id := range f.published() {
					out = append(out, strconv.FormatInt(id, 10))
				}
				return out
			}}
		},
		Reject:   func(rec *sink.Record) { rec.Headers = map[string]string{"X-Conformance": "reject"} },
		TooLarge: func(rec *sink.Record) { rec.Payload = make([]byte, 2*limit) },
		Unreachable: func(*testing.T) sink.Publisher {
			refused := sink.NetworkFailure(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
			return &fakePublisher{fail: func(sink.Record, int) error { return refused }}
		},
	})
}
