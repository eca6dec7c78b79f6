package relay

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimitConfig is a token bucket of rows per destination: PerSecond
// rows a second on average, Burst at once after a quiet spell. Rows past
// it stay pending, untouched and without counting an attempt, and while
// it is spent the destination's topics are not claimed. It is per relay
// process: N replicas send up to N times PerSecond.
type RateLimitConfig struct {
	// PerSecond is the rows per second. 0 is unlimited.
	PerSecond float64
	// Burst is the most rows sent at once. Default one second's worth
	// (at least 1).
	Burst int
}

// rateLimit is a destination's token bucket of rows.
type rateLimit struct{ lim *rate.Limiter }

// newRateLimit returns c's bucket, full, or nil when c is unlimited.
func newRateLimit(c RateLimitConfig) *rateLimit {
	if c.PerSecond <= 0 {
		return nil
	}
	burst := c.Burst
	if burst == 0 {
		burst = max(1, int(math.Ceil(c.PerSecond)))
	}
	return &rateLimit{lim: rate.NewLimiter(rate.Limit(c.PerSecond), burst)}
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

// RetryBudgetConfig limits retries to a fraction of recent first attempts:
// each first attempt earns Ratio retries, MinPerSecond are earned whatever
// the traffic, up to ten seconds' worth, and a retry that succeeds gives
// its share back. A retry over budget waits a second without counting an
// attempt, so a recovering destination is not stampeded by its backlog of
// failed rows.
type RetryBudgetConfig struct {
	// Ratio is the retries earned per first attempt. Default 0.2.
	Ratio float64
	// MinPerSecond is the floor: retries earned per second. Default 10.
	MinPerSecond float64
	// Disabled turns the budget off.
	Disabled bool
}

// bulkhead counts a destination's rows in flight.
type bulkhead struct {
	max int // 0: unlimited
	mu  sync.Mutex
	n   int
}

// take grants up to n slots and returns how many.
func (h *bulkhead) take(n int) int {
	if h.max == 0 {
		return n
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n = min(n, h.max-h.n)
	h.n += n
	return n
}

func (h *bulkhead) give(n int) {
	if h.max == 0 || n == 0 {
		return
	}
	h.mu.Lock()
	h.n -= n
	h.mu.Unlock()
}

func (h *bulkhead) full() bool {
	if h.max == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n >= h.max
}

// retryBudget is a token bucket of retries. See RetryBudgetConfig.
type retryBudget struct {
	disabled    bool
	ratio, rate float64
	capacity    float64
	mu          sync.Mutex
	tokens      float64
	last        time.Time
}

func newRetryBudget(c RetryBudgetConfig) *retryBudget {
	if c.Ratio == 0 {
		c.Ratio = DefaultRetryBudgetRatio
	}
	if c.MinPerSecond == 0 {
		c.MinPerSecond = DefaultRetryBudgetMinRate
	}
	capacity := max(1, c.MinPerSecond*DefaultRetryBudgetDuration.Seconds())
	return &retryBudget{disabled: c.Disabled, ratio: c.Ratio, rate: c.MinPerSecond, capacity: capacity, tokens: capacity}
}

func (b *retryBudget) refill(now time.Time) {
	if !b.last.IsZero() && now.After(b.last) {
		b.tokens = min(b.capacity, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
}

// spend takes one retry from the budget, if there is one.
func (b *retryBudget) spend(now time.Time) bool {
	if b.disabled {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// earn credits first attempts (ratio each) and successful retries (their
// token back).
func (b *retryBudget) earn(now time.Time, firsts, retriesSent int) {
	if b.disabled || firsts+retriesSent == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	b.tokens = min(b.capacity, b.tokens+float64(firsts)*b.ratio+float64(retriesSent))
}
