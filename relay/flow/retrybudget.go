package flow

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// RetryBudgetConfig limits retries to a fraction of recent first attempts:
// each first attempt earns Ratio retries, MinPerSecond are earned whatever
// the traffic, up to ten seconds' worth, and a retry that succeeds gives
// its share back. A retry over budget waits a second without counting an
// attempt, so a recovering destination is not stampeded by its backlog of
// failed rows.
type RetryBudgetConfig struct {
	// Ratio is the retries earned per first attempt. Default 0.2.
	Ratio float64 `koanf:"ratio"`
	// MinPerSecond is the floor: retries earned per second. Default 10.
	MinPerSecond float64 `koanf:"min_per_second"`
	// Disabled turns the budget off.
	Disabled bool `koanf:"disabled"`
}

// WithDefaults returns c with every setting left zero at its default.
func (c RetryBudgetConfig) WithDefaults() RetryBudgetConfig {
	c.Ratio = cmp.Or(c.Ratio, DefaultRetryBudgetRatio)
	c.MinPerSecond = cmp.Or(c.MinPerSecond, DefaultRetryBudgetMinRate)
	return c
}

// Validate reports every problem of c at once, one per line, each
// starting with the setting's name; zero is the default.
func (c RetryBudgetConfig) Validate() error {
	var errs []error
	for _, v := range []struct {
		name  string
		value float64
	}{{"min_per_second", c.MinPerSecond}, {"ratio", c.Ratio}} {
		if v.value < 0 || math.IsNaN(v.value) {
			errs = append(errs, fmt.Errorf("%s is %v; it must not be negative", v.name, v.value))
		}
	}
	return errors.Join(errs...)
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
	c = c.WithDefaults()
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
