package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// StatusClass is the default class of a response status that is not a
// success. A systemic status speaks for the whole endpoint; the others
// for the row they answer.
func StatusClass(code int) sink.Class {
	switch code {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusConflict,
		http.StatusGone, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return sink.ClassPermanent
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return sink.ClassTransient
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired:
		return sink.ClassSystemic
	}
	switch {
	case code >= 500:
		return sink.ClassTransient
	case code >= 400:
		return sink.ClassPermanent
	default:
		// 1xx leftovers and 3xx: a redirect means the configured URL is
		// wrong for every row, not that this row is bad.
		return sink.ClassSystemic
	}
}

// classifyStatus wraps err, made from resp, with its class.
func (p *Publisher) classifyStatus(resp *http.Response, err error) error {
	class, ok := p.cfg.StatusClasses[resp.StatusCode]
	if !ok {
		class = StatusClass(resp.StatusCode)
	}
	switch class {
	case sink.ClassPermanent:
		if resp.StatusCode == http.StatusRequestEntityTooLarge {
			return sink.Permanent(err, sink.ReasonTooLarge)
		}
		return sink.Permanent(err, "")
	case sink.ClassSystemic:
		return sink.Systemic(err)
	}
	var hint time.Duration
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		hint = ParseRetryAfter(resp.Header.Get("Retry-After"), p.cfg.Now())
	}
	return sink.Transient(err, hint)
}

// maxRetryAfter bounds a parsed hint before the policy caps it, so that
// absurd values cannot overflow.
const maxRetryAfter = 365 * 24 * time.Hour

// ParseRetryAfter parses a Retry-After value, delta-seconds or an
// HTTP-date, relative to now. Missing, malformed, negative and past values
// give 0 (no hint); huge values are clamped to a year, for the retry
// policy to cap.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if isDigits(v) {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil || secs > uint64(maxRetryAfter/time.Second) {
			return maxRetryAfter // all digits, too large to parse: huge
		}
		return time.Duration(secs) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	d := t.Sub(now)
	if d <= 0 {
		return 0
	}
	return min(d, maxRetryAfter)
}

func isDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// classifyTransport classifies a request that got no response.
func (p *Publisher) classifyTransport(ctx, parent context.Context, err error) error {
	err = fmt.Errorf("POST %s: %w", p.url, unwrapURLError(err))
	if errors.Is(err, errGuard) {
		return sink.Systemic(err)
	}
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout() {
		switch {
		case parent.Err() != nil:
			err = fmt.Errorf("%w (the delivery's deadline passed mid-request)", err)
		case ctx.Err() != nil:
			err = fmt.Errorf("%w (timed out after %s)", err, p.cfg.Timeout)
		}
	}
	// The network's classification, shared with every sink.
	return sink.NetworkFailure(err)
}

// unwrapURLError drops net/http's *url.Error wrapper, whose text repeats
// the full URL, query included.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err
	}
	return err
}
