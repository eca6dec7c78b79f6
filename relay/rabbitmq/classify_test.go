package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Each failure gets the class and scope of what it speaks for. A
// connection that fails under a publish is the destination's transient
// failure whatever code the client library gives it: amqp091-go reports
// every read or write error on the connection as 501, frame error, and a
// message that may have reached the broker is sent again, never
// dead-lettered.
func TestClassify(t *testing.T) {
	p := &Publisher{cfg: Config{Exchange: "orders", ConfirmTimeout: DefaultConfirmTimeout}}
	server := func(code int, reason string) error {
		return &amqp.Error{Code: code, Reason: reason, Server: true, Recover: code < 500}
	}
	for _, tc := range []struct {
		name   string
		err    error
		class  sink.Class
		scope  sink.Scope
		reason string
	}{
		{"connection reset under a publish", &amqp.Error{Code: amqp.FrameError, Reason: "read tcp 127.0.0.1:5672: read: connection reset by peer"},
			sink.ClassTransient, sink.ScopeDestination, ""},
		{"write to a closed socket", &amqp.Error{Code: amqp.FrameError, Reason: "write tcp 127.0.0.1:5672: write: broken pipe"},
			sink.ClassTransient, sink.ScopeDestination, ""},
		{"a frame the client cannot parse", amqp.ErrFrame, sink.ClassTransient, sink.ScopeDestination, ""},
		{"a frame larger than frame_max from the server", amqp.ErrFrameTooLarge, sink.ClassTransient, sink.ScopeDestination, ""},
		{"connection already closed", amqp.ErrClosed, sink.ClassTransient, sink.ScopeDestination, ""},
		{"wrapped, as the publish returns it", fmt.Errorf("publish: %w", &amqp.Error{Code: amqp.FrameError, Reason: "EOF"}),
			sink.ClassTransient, sink.ScopeDestination, ""},
		{"server: frame error", server(amqp.FrameError, "FRAME_ERROR"), sink.ClassTransient, sink.ScopeDestination, ""},
		{"server: shutting down", server(amqp.ConnectionForced, "CONNECTION_FORCED - broker forced connection closure"),
			sink.ClassTransient, sink.ScopeDestination, ""},
		{"server: internal error", server(amqp.InternalError, "INTERNAL_ERROR"), sink.ClassTransient, sink.ScopeDestination, ""},
		{"server: message above max_message_size", server(amqp.PreconditionFailed, "PRECONDITION_FAILED - message size 2000000 is larger than configured max size 1048576"),
			sink.ClassPermanent, sink.ScopeRecord, sink.ReasonTooLarge},
		{"server: content too large", server(amqp.ContentTooLarge, "CONTENT_TOO_LARGE"), sink.ClassPermanent, sink.ScopeRecord, sink.ReasonTooLarge},
		{"server: another precondition", server(amqp.PreconditionFailed, "PRECONDITION_FAILED - invalid expiration"),
			sink.ClassPermanent, sink.ScopeRecord, sink.ReasonPermanent},
		{"server: access refused", server(amqp.AccessRefused, "ACCESS_REFUSED"), sink.ClassSystemic, sink.ScopeDestination, ""},
		{"login refused", amqp.ErrCredentials, sink.ClassSystemic, sink.ScopeDestination, ""},
		{"no access to the vhost", amqp.ErrVhost, sink.ClassSystemic, sink.ScopeDestination, ""},
		{"server: no such exchange", server(amqp.NotFound, "NOT_FOUND - no exchange 'orders'"), sink.ClassSystemic, sink.ScopeDestination, ""},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, sink.ClassSystemic, sink.ScopeDestination, ""},
		{"no confirm in time", context.DeadlineExceeded, sink.ClassTransient, sink.ScopeDestination, ""},
		{"reset outside the library", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, sink.ClassTransient, sink.ScopeDestination, ""},
		{"end of stream", errors.New("EOF"), sink.ClassTransient, sink.ScopeDestination, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ce := sink.Classify(p.classify(context.Background(), "orders.placed", tc.err))
			if ce == nil || ce.Class != tc.class || ce.Scope != tc.scope || (tc.reason != "" && ce.Reason != tc.reason) {
				t.Fatalf("classify(%v) = %+v; want class %v, scope %v, reason %q", tc.err, ce, tc.class, tc.scope, tc.reason)
			}
		})
	}
}
