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

// bulkhead counts a destination's rows in flight. In a fleet, the
// destination's limit is shared among the replicas, and this one may use
// only its share (slots); it tells the fleet, as its floor, the most it
// may be using, so that the shares never add up to more than the limit.
type bulkhead struct {
	max     int  // per process; 0: unlimited
	limited bool // a limit of its own or the fleet's
	mu      sync.Mutex
	n       int
	shared  bool
	slots   int // this replica's share, while shared
	// Since demand was last read: whether rows found it full, and the
	// most slots in use at once.
	wanted bool
	peak   int
	// opened is closed when a full bulkhead gets a free slot; nil while
	// no one waits for one.
	opened chan struct{}
}

// opening returns a channel closed once the bulkhead has a free slot, or
// nil when it has one now.
func (h *bulkhead) opening() <-chan struct{} {
	if !h.limited {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if lim, ok := h.limit(); !ok || h.n < lim {
		return nil
	}
	if h.opened == nil {
		h.opened = make(chan struct{})
	}
	return h.opened
}

// signalLocked wakes those waiting for a slot, if one is free.
func (h *bulkhead) signalLocked() {
	if h.opened == nil {
		return
	}
	if lim, ok := h.limit(); !ok || h.n < lim {
		close(h.opened)
		h.opened = nil
	}
}

// limit is the most rows in flight now, and whether there is a limit.
func (h *bulkhead) limit() (int, bool) {
	if !h.shared {
		return h.max, h.max > 0
	}
	if h.max > 0 {
		return min(h.max, h.slots), true
	}
	return h.slots, true
}

// take grants up to n slots and returns how many.
func (h *bulkhead) take(n int) int {
	if !h.limited {
		return n
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if lim, ok := h.limit(); ok {
		granted := max(0, min(n, lim-h.n))
		h.wanted = h.wanted || granted < n
		n = granted
	}
	h.n += n
	h.peak = max(h.peak, h.n)
	return n
}

// room is how many more rows the bulkhead takes now, and its limit; ok is
// false when it has none.
func (h *bulkhead) room() (free, limit int, ok bool) {
	if !h.limited {
		return 0, 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	lim, ok := h.limit()
	if !ok {
		return 0, 0, false
	}
	return max(0, lim-h.n), lim, true
}

// give returns n slots, and reports whether that opened a full bulkhead:
// rows held back for a slot may go now.
func (h *bulkhead) give(n int) bool {
	if !h.limited || n == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	lim, ok := h.limit()
	wasFull := ok && h.n >= lim
	h.n -= n
	h.signalLocked()
	return wasFull && h.n < lim
}

// full reports whether every slot is taken; rows that find it so want
// more.
func (h *bulkhead) full() bool {
	if !h.limited {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	lim, ok := h.limit()
	full := ok && h.n >= lim
	h.wanted = h.wanted || full
	return full
}

// demand reports, and starts counting anew, whether rows found the
// bulkhead full since the last call, and the most slots in use at once.
func (h *bulkhead) demand() (wanted bool, peak int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	wanted, peak = h.wanted, h.peak
	h.wanted, h.peak = false, h.n
	return wanted, peak
}

// floor is the share the fleet must keep for this replica: its share, or
// more while rows taken under a larger one are still in flight; 0 when it
// has no share.
func (h *bulkhead) floor() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.shared {
		return 0
	}
	return max(h.slots, h.n)
}

// share sets this replica's share of the fleet's limit, and reports
// whether the limit grew.
func (h *bulkhead) share(slots int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	before, was := h.limit()
	h.shared, h.slots = true, slots
	after, _ := h.limit()
	h.signalLocked()
	return was && after > before
}

// unshare returns to the per-process limit.
func (h *bulkhead) unshare() {
	h.mu.Lock()
	h.shared = false
	h.signalLocked()
	h.mu.Unlock()
}

// retryBudget is a token bucket of retries. See RetryBudgetConfig.
type retryBudget struct {
	disabled    bool
	ratio, rate float64
	capacity    float64
	mu          sync.Mutex
	tokens      float64
	last        time.Time
	// In a fleet of k replicas, each earns 1/k of the floor and holds
	// 1/k of the capacity; the ratio is earned on its own first attempts.
	minRate, maxTokens float64
	k                  int
}

func newRetryBudget(c RetryBudgetConfig) *retryBudget {
	if c.Ratio == 0 {
		c.Ratio = DefaultRetryBudgetRatio
	}
	if c.MinPerSecond == 0 {
		c.MinPerSecond = DefaultRetryBudgetMinRate
	}
	capacity := max(1, c.MinPerSecond*DefaultRetryBudgetDuration.Seconds())
	return &retryBudget{disabled: c.Disabled, ratio: c.Ratio, rate: c.MinPerSecond, capacity: capacity, tokens: capacity,
		minRate: c.MinPerSecond, maxTokens: capacity, k: 1}
}

// share gives this replica its share of the budget among k replicas.
func (b *retryBudget) share(k int) {
	if b.disabled || k < 1 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if k == b.k {
		return
	}
	b.k = k
	b.rate = b.minRate / float64(k)
	b.capacity = max(1, b.maxTokens/float64(k))
	b.tokens = min(b.tokens, b.capacity)
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
