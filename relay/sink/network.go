package sink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"syscall"
)

// NetworkFailure classifies an error that left a request to a destination
// without an answer; every sink shares it, so that the same network fault
// means the same thing whatever the destination.
//
//   - Systemic, the destination's scope: the destination cannot be used
//     now, whatever the row. A dial that failed (connection refused,
//     unreachable host or network, a dial timeout), a name that does not
//     resolve, and TLS set-up (certificates, alerts, a peer that does not
//     speak TLS): the same for every row, so no attempt is counted.
//   - Transient, the destination's scope: no answer once connected (a
//     reset, an EOF, a timeout). The next attempt may get through; the
//     destination's breaker counts these when nothing else gets through.
func NetworkFailure(err error) error {
	var (
		opErr   *net.OpError
		dnsErr  *net.DNSError
		unknown x509.UnknownAuthorityError
		invalid x509.CertificateInvalidError
		host    x509.HostnameError
		verify  *tls.CertificateVerificationError
		alert   tls.AlertError
		record  tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial",
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.As(err, &dnsErr):
		return Systemic(err)
	case errors.As(err, &unknown), errors.As(err, &invalid), errors.As(err, &host), errors.As(err, &verify),
		errors.As(err, &alert), errors.As(err, &record):
		return Systemic(err)
	}
	return DestinationFailure(ClassTransient, err)
}

// ContextFailure classifies a publish that ended with its context: past
// its deadline, the destination did not answer in the publish's time,
// which is the destination's transient failure (as a timeout on the
// network is), so that a probe that meets it counts no attempt; cancelled
// (the relay stopping), the record's own transient failure. err is
// ctx.Err(), prefix names the sink.
func ContextFailure(prefix string, err error) error {
	wrapped := fmt.Errorf("%s: %w", prefix, err)
	if errors.Is(err, context.DeadlineExceeded) {
		return DestinationFailure(ClassTransient, wrapped)
	}
	return Transient(wrapped, 0)
}
