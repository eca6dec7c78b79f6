package retry_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/retry"
)

func TestNetworkFailure(t *testing.T) {
	t.Parallel()
	dial := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	read := func(err error) error { return &net.OpError{Op: "read", Net: "tcp", Err: err} }
	for _, tc := range []struct {
		name  string
		err   error
		class retry.Class
	}{
		{"connection refused", dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)), retry.ClassSystemic},
		{"dial timeout", dial(os.ErrDeadlineExceeded), retry.ClassSystemic},
		{"host unreachable", fmt.Errorf("wrapped: %w", syscall.EHOSTUNREACH), retry.ClassSystemic},
		{"network unreachable", syscall.ENETUNREACH, retry.ClassSystemic},
		{"no such host", &net.DNSError{Err: "no such host", Name: "kafka.invalid", IsNotFound: true}, retry.ClassSystemic},
		{"unknown authority", x509.UnknownAuthorityError{}, retry.ClassSystemic},
		{"wrong host name", x509.HostnameError{Host: "other"}, retry.ClassSystemic},
		{"certificate verification", &tls.CertificateVerificationError{Err: errors.New("expired")}, retry.ClassSystemic},
		{"TLS alert", tls.AlertError(40), retry.ClassSystemic},
		{"not TLS", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, retry.ClassSystemic},
		{"reset once connected", read(os.NewSyscallError("read", syscall.ECONNRESET)), retry.ClassTransient},
		{"read timeout", read(os.ErrDeadlineExceeded), retry.ClassTransient},
		{"EOF", fmt.Errorf("kafka: %w", io.EOF), retry.ClassTransient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := retry.Classify(retry.NetworkFailure(tc.err))
			if c.Class != tc.class || c.Scope != retry.ScopeDestination || !errors.Is(c, tc.err) {
				t.Fatalf("got %s/%s (%v), want %s at the destination's scope, wrapping the error", c.Class, c.Scope, c, tc.class)
			}
		})
	}
}
