package relay

import (
	"math"
	"time"

	"golang.org/x/time/rate"
)

// RateLimitConfig is a token bucket of rows per destination: PerSecond
// rows a second on average, Burst at once after a quiet spell. Rows past
// it stay pending, untouched and without counting an attempt, and while
// it is spent the destination's topics are not claimed. In a fleet it is
// the fleet's: each of N live replicas sends up to PerSecond/N; on its
// own, a relay process sends up to PerSecond.
type RateLimitConfig struct {
	// PerSecond is the rows per second. 0 is unlimited.
	PerSecond float64
	// Burst is the most rows sent at once. Default one second's worth
	// (at least 1).
	Burst int
}

// rateLimit is a destination's token bucket of rows. In a fleet, each
// of k live replicas has 1/k of the rate and burst.
type rateLimit struct {
	lim       *rate.Limiter
	perSecond float64
	burst     int
	k         int // the replicas it is shared by
}

// newRateLimit returns c's bucket, full, or nil when c is unlimited.
func newRateLimit(c RateLimitConfig) *rateLimit {
	if c.PerSecond <= 0 {
		return nil
	}
	burst := c.Burst
	if burst == 0 {
		burst = max(1, int(math.Ceil(c.PerSecond)))
	}
	return &rateLimit{lim: rate.NewLimiter(rate.Limit(c.PerSecond), burst), perSecond: c.PerSecond, burst: burst, k: 1}
}

// share gives this replica its share of the rate among k replicas. Only
// the fleet's sync calls it.
func (r *rateLimit) share(k int) {
	if r == nil || k < 1 || k == r.k {
		return
	}
	r.k = k
	r.lim.SetLimit(rate.Limit(r.perSecond / float64(k)))
	r.lim.SetBurst(max(1, r.burst/k))
}

// take spends a token if there is one.
func (r *rateLimit) take(now time.Time) bool { return r == nil || r.lim.AllowN(now, 1) }

// wait is how long until the next token, 0 when there is one now.
func (r *rateLimit) wait(now time.Time) time.Duration {
	if r == nil {
		return 0
	}
	missing := 1 - r.lim.TokensAt(now)
	if missing <= 0 {
		return 0
	}
	return time.Duration(missing / float64(r.lim.Limit()) * float64(time.Second))
}
