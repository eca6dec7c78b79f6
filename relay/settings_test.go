package relay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay"
)

// Each settings type applies its own defaults and lists its own problems:
// the configuration decodes into these types and adds only its path.
func TestDestinationSettingsDefaultAndValidateOnce(t *testing.T) {
	t.Parallel()
	b := relay.BreakerConfig{Successes: 3}.WithDefaults()
	if b != (relay.BreakerConfig{Failures: relay.DefaultBreakerFailures, Successes: 3,
		FailingRows: relay.DefaultBreakerFailingRows, FailingFor: relay.DefaultBreakerFailingFor}) {
		t.Errorf("breaker defaults: %+v", b)
	}
	if r := (relay.RetryBudgetConfig{}).WithDefaults(); r.Ratio != relay.DefaultRetryBudgetRatio || r.MinPerSecond != relay.DefaultRetryBudgetMinRate {
		t.Errorf("retry budget defaults: %+v", r)
	}
	for _, c := range []struct {
		in   relay.RateLimitConfig
		want int
	}{{relay.RateLimitConfig{PerSecond: 2.5}, 3}, {relay.RateLimitConfig{PerSecond: 0.1}, 1}, {relay.RateLimitConfig{PerSecond: 5, Burst: 2}, 2}, {relay.RateLimitConfig{}, 0}} {
		if got := c.in.WithDefaults().Burst; got != c.want {
			t.Errorf("rate limit %+v: burst %d, want %d", c.in, got, c.want)
		}
	}
	d := relay.Destination{MaxInFlight: -1, Breaker: relay.BreakerConfig{Failures: -1, FailingFor: -time.Second},
		RetryBudget: relay.RetryBudgetConfig{Ratio: -1}, RateLimit: relay.RateLimitConfig{Burst: 3}}
	err := d.ValidateSettings()
	for _, want := range []string{"max_in_flight is -1", "breaker.failures is -1", "breaker.failing_for is -1s",
		"retry_budget.ratio is -1", "rate_limit.burst is 3 without rate_limit.rows_per_second"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateSettings = %v; want it to say %q", err, want)
		}
	}
}
