package flow

import (
	"cmp"
	"errors"
	"fmt"
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
	PerSecond float64 `koanf:"rows_per_second"`
	// Burst is the most rows sent at once. Default one second's worth
	// (at least 1).
	Burst int `koanf:"burst"`
}

// WithDefaults returns c with its burst at one second's worth when it is
// limited and sets none.
func (c RateLimitConfig) WithDefaults() RateLimitConfig {
	if c.PerSecond > 0 {
		c.Burst = cmp.Or(c.Burst, max(1, int(math.Ceil(c.PerSecond))))
	}
	return c
}

// Validate reports every problem of c at once, one per line, each
// starting with the setting's name as in the configuration file.
func (c RateLimitConfig) Validate() error {
	var errs []error
	if r := c.PerSecond; r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		errs = append(errs, fmt.Errorf("rows_per_second is %v; it must not be negative (0 is unlimited)", r))
	}
	if c.Burst < 0 {
		errs = append(errs, fmt.Errorf("burst is %d; it must not be negative", c.Burst))
	} else if c.Burst > 0 && c.PerSecond == 0 {
		errs = append(errs, fmt.Errorf("burst is %d without rate_limit.rows_per_second", c.Burst))
	}
	return errors.Join(errs...)
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
	c = c.WithDefaults()
	return &rateLimit{lim: rate.NewLimiter(rate.Limit(c.PerSecond), c.Burst), perSecond: c.PerSecond, burst: c.Burst, k: 1}
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
