package relay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/store"
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

// The relay's settings have one set of defaults and one set of rules,
// shared by programs and the configuration file: 0 takes the default,
// and what the file may not say, New refuses too.
func TestRelaySettingsDefaultAndValidateOnce(t *testing.T) {
	t.Parallel()
	c := relay.Config{MaxBatchBytes: 4096, Pause: relay.PauseConfig{Base: time.Minute}}.WithDefaults()
	if c.Workers != relay.DefaultWorkers || c.BatchSize != relay.DefaultBatchSize || c.PayloadCap != 4096 ||
		c.PollInterval != relay.DefaultPollInterval || c.QueryTimeout != relay.DefaultQueryTimeout ||
		c.DeadLetterRetention != relay.DefaultDeadLetterRetention || c.SentRetention != 0 ||
		c.OnDeadLetter != relay.OnDeadLetterRelease || c.OrderScope != relay.OrderScopeDestination {
		t.Errorf("defaults: %+v", c)
	}
	if c.Pause != (relay.PauseConfig{Base: time.Minute, Max: time.Minute}) {
		t.Errorf("a pause base above the default max: %+v, want the max to follow it", c.Pause)
	}
	if err := c.ValidateSettings(); err != nil {
		t.Errorf("the defaults do not validate: %v", err)
	}
	bad := relay.Config{Workers: -1, BatchSize: relay.MaxBatchSize + 1, MaxBatchBytes: 100, PayloadCap: 200,
		PollInterval: -time.Second, SentRetention: -time.Second, OrderScope: "key"}.WithDefaults()
	err := bad.ValidateSettings()
	want := []string{"batch_size is 10001; at most 10000 rows fit one claim", "order_scope is \"key\"",
		"payload_cap 200 is above max_batch_bytes 100", "poll_interval is -1s; it must be positive",
		"sent_retention is -1s", "workers is -1; it must be at least 1"}
	if err == nil || len(strings.Split(err.Error(), "\n")) != len(want) {
		t.Fatalf("ValidateSettings = %v; want %d problems", err, len(want))
	}
	for i, line := range strings.Split(err.Error(), "\n") {
		if !strings.HasPrefix(line, want[i]) {
			t.Errorf("problem %d is %q; want it to start %q", i, line, want[i])
		}
	}
	if err := (&relay.Config{}).ValidateSettings(); err == nil || !strings.Contains(err.Error(), "workers is 0") {
		t.Errorf("an explicit 0 is not reported: %v", err)
	}
	if _, err := relay.New(relay.Config{Publisher: &fakePublisher{}, Store: &store.Store{}, BatchSize: 20000}); err == nil ||
		!strings.Contains(err.Error(), "relay: batch_size is 20000") {
		t.Errorf("New accepts a batch the file may not set: %v", err)
	}
}
