package sink_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func TestNetworkFailure(t *testing.T) {
	t.Parallel()
	dial := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	read := func(err error) error { return &net.OpError{Op: "read", Net: "tcp", Err: err} }
	for _, tc := range []struct {
		name  string
		err   error
		class sink.Class
	}{
		{"connection refused", dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)), sink.ClassSystemic},
		{"dial timeout", dial(os.ErrDeadlineExceeded), sink.ClassSystemic},
		{"host unreachable", fmt.Errorf("wrapped: %w", syscall.EHOSTUNREACH), sink.ClassSystemic},
		{"network unreachable", syscall.ENETUNREACH, sink.ClassSystemic},
		{"no such host", &net.DNSError{Err: "no such host", Name: "kafka.invalid", IsNotFound: true}, sink.ClassSystemic},
		{"unknown authority", x509.UnknownAuthorityError{}, sink.ClassSystemic},
		{"wrong host name", x509.HostnameError{Host: "other"}, sink.ClassSystemic},
		{"certificate verification", &tls.CertificateVerificationError{Err: errors.New("expired")}, sink.ClassSystemic},
		{"TLS alert", tls.AlertError(40), sink.ClassSystemic},
		{"not TLS", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, sink.ClassSystemic},
		{"reset once connected", read(os.NewSyscallError("read", syscall.ECONNRESET)), sink.ClassTransient},
		{"read timeout", read(os.ErrDeadlineExceeded), sink.ClassTransient},
		{"EOF", fmt.Errorf("kafka: %w", io.EOF), sink.ClassTransient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := sink.Classify(sink.NetworkFailure(tc.err))
			if c.Class != tc.class || c.Scope != sink.ScopeDestination || !errors.Is(c, tc.err) {
				t.Fatalf("got %s/%s (%v), want %s at the destination's scope, wrapping the error", c.Class, c.Scope, c, tc.class)
			}
		})
	}
}

// A publish past its deadline got no answer in time: the destination's
// transient failure. One cancelled (the relay stopping) is the record's.
func TestContextFailure(t *testing.T) {
	for _, c := range []struct {
		err   error
		scope sink.Scope
	}{{context.DeadlineExceeded, sink.ScopeDestination}, {context.Canceled, sink.ScopeRecord}} {
		err := sink.ContextFailure("x", c.err)
		ce := sink.Classify(err)
		if ce.Class != sink.ClassTransient || ce.Scope != c.scope || !errors.Is(err, c.err) {
			t.Errorf("%v: %v (%s, %s), want transient with scope %s", c.err, err, ce.Class, ce.Scope, c.scope)
		}
	}
}
