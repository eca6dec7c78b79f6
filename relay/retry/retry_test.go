package retry_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// fixedRand returns a fixed fraction of its range: 0 for the bottom,
// 1 for the top.
type fixedRand struct{ frac float64 }

func (f fixedRand) Int64N(n int64) int64 {
	v := int64(f.frac * float64(n))
	if v >= n {
		v = n - 1
	}
	return v
}

var (
	bottom = fixedRand{0}
	top    = fixedRand{1}
	middle = fixedRand{0.5}
)

func TestExponential(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		attempt int
		want    time.Duration
	}{
		{-1, time.Second},
		{0, time.Second},
		{1, 2 * time.Second},
		{5, 32 * time.Second},
		{8, 256 * time.Second},
		{9, 5 * time.Minute}, // 512s capped
		{63, 5 * time.Minute},
		{10_000, 5 * time.Minute},
	} {
		if got := retry.Exponential(tc.attempt, time.Second, 5*time.Minute); got != tc.want {
			t.Errorf("Exponential(%d) = %v, want %v", tc.attempt, got, tc.want)
		}
	}
	if got := retry.Exponential(3, 0, time.Minute); got != 0 {
		t.Errorf("zero base: %v", got)
	}
}

func TestBackoffStrategies(t *testing.T) {
	t.Parallel()
	base, maxDelay := 100*time.Millisecond, 10*time.Second
	for _, tc := range []struct {
		name     string
		strategy retry.Strategy
		attempt  int
		prev     time.Duration
		r        retry.Rand
		want     time.Duration
	}{
		{"none ignores randomness", retry.StrategyNone, 3, 0, top, 800 * time.Millisecond},
		{"none capped", retry.StrategyNone, 20, 0, top, maxDelay},

		{"full bottom", retry.StrategyFull, 3, 0, bottom, 0},
		{"full top", retry.StrategyFull, 3, 0, top, 800 * time.Millisecond},
		{"full middle", retry.StrategyFull, 3, 0, middle, 400 * time.Millisecond},
		{"full capped", retry.StrategyFull, 30, 0, top, maxDelay},
		{"empty strategy is full", "", 2, 0, top, 400 * time.Millisecond},

		{"equal bottom", retry.StrategyEqual, 3, 0, bottom, 400 * time.Millisecond},
		{"equal top", retry.StrategyEqual, 3, 0, top, 800 * time.Millisecond},
		{"equal capped", retry.StrategyEqual, 30, 0, bottom, maxDelay / 2},

		{"decorrelated first uses base as prev, bottom", retry.StrategyDecorrelated, 0, 0, bottom, base},
		{"decorrelated first, top", retry.StrategyDecorrelated, 0, 0, top, 300 * time.Millisecond},
		{"decorrelated grows from prev", retry.StrategyDecorrelated, 4, 2 * time.Second, top, 6 * time.Second},
		{"decorrelated capped", retry.StrategyDecorrelated, 4, 9 * time.Second, top, maxDelay},
		{"decorrelated huge prev", retry.StrategyDecorrelated, 4, time.Duration(1 << 62), top, maxDelay},
	} {
		b := retry.Backoff{Strategy: tc.strategy, Base: base, Max: maxDelay}
		if got := b.Delay(tc.attempt, tc.prev, tc.r); got != tc.want {
			t.Errorf("%s: Delay(%d, %v) = %v, want %v", tc.name, tc.attempt, tc.prev, got, tc.want)
		}
	}
}

func newPolicy(t *testing.T, c retry.PolicyConfig) *retry.Policy {
	t.Helper()
	p, err := retry.NewPolicy(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecide(t *testing.T) {
	t.Parallel()
	p := newPolicy(t, retry.PolicyConfig{
		MaxAttempts: 5, MaxAge: time.Hour, Strategy: retry.StrategyNone,
		BaseDelay: time.Second, MaxDelay: time.Minute, MaxRetryAfter: 30 * time.Second,
	})
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		f    retry.Failure
		want retry.Decision
	}{
		{"unclassified is transient", retry.Failure{Err: boom, Attempt: 0}, retry.Decision{Action: retry.Retry, Delay: time.Second}},
		{"transient backs off", retry.Failure{Err: sink.Transient(boom, 0), Attempt: 2}, retry.Decision{Action: retry.Retry, Delay: 4 * time.Second}},
		{"retry-after above backoff wins", retry.Failure{Err: sink.Transient(boom, 7*time.Second), Attempt: 0}, retry.Decision{Action: retry.Retry, Delay: 7 * time.Second}},
		{"retry-after below backoff loses", retry.Failure{Err: sink.Transient(boom, time.Second), Attempt: 3}, retry.Decision{Action: retry.Retry, Delay: 8 * time.Second}},
		{"retry-after capped", retry.Failure{Err: sink.Transient(boom, 24*time.Hour), Attempt: 0}, retry.Decision{Action: retry.Retry, Delay: 30 * time.Second}},
		{"last attempt exhausts", retry.Failure{Err: boom, Attempt: 4}, retry.Decision{Action: retry.DeadLetter, Reason: sink.ReasonRetriesExhausted}},
		{"too old", retry.Failure{Err: boom, Attempt: 1, Age: time.Hour}, retry.Decision{Action: retry.DeadLetter, Reason: sink.ReasonMaxAgeExceeded}},
		{"just young enough", retry.Failure{Err: boom, Attempt: 1, Age: time.Hour - time.Nanosecond}, retry.Decision{Action: retry.Retry, Delay: 2 * time.Second}},
		{"permanent", retry.Failure{Err: sink.Permanent(boom, "")}, retry.Decision{Action: retry.DeadLetter, Reason: sink.ReasonPermanent}},
		{"permanent with reason", retry.Failure{Err: sink.Permanent(boom, sink.ReasonTooLarge)}, retry.Decision{Action: retry.DeadLetter, Reason: sink.ReasonTooLarge}},
		{"systemic defers, even when out of attempts", retry.Failure{Err: sink.Systemic(boom), Attempt: 99, Age: 99 * time.Hour}, retry.Decision{Action: retry.Defer}},
	} {
		if got := p.Decide(tc.f); got != tc.want {
			t.Errorf("%s: Decide = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestClassifyWrapped(t *testing.T) {
	t.Parallel()
	inner := sink.Systemic(errors.New("connection refused"))
	wrapped := errors.Join(errors.New("context"), inner)
	if c := sink.Classify(wrapped).Class; c != sink.ClassSystemic {
		t.Fatalf("class of wrapped systemic error = %v", c)
	}
	if !errors.Is(inner, errors.Unwrap(inner)) {
		t.Fatal("classified error does not unwrap to its cause")
	}
}

func TestPolicyDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	p := newPolicy(t, retry.PolicyConfig{Rand: top})
	if p.MaxAttempts != retry.DefaultMaxAttempts || p.MaxAge != retry.DefaultMaxAge ||
		p.Backoff.Base != retry.DefaultBaseDelay || p.Backoff.Max != retry.DefaultMaxDelay ||
		p.Backoff.Strategy != retry.StrategyFull || p.MaxRetryAfter != retry.DefaultMaxRetryAfter {
		t.Fatalf("defaults: %+v", p)
	}
	if d := p.Decide(retry.Failure{Err: errors.New("x"), Attempt: 1}); d.Delay != 2*time.Second {
		t.Fatalf("full jitter at the top of attempt 1 = %v, want 2s", d.Delay)
	}
	p = newPolicy(t, retry.PolicyConfig{MaxAge: retry.Forever, MaxAttempts: 1000})
	if d := p.Decide(retry.Failure{Err: errors.New("boom"), Age: 100 * 365 * 24 * time.Hour}); d.Action != retry.Retry {
		t.Fatalf("a century-old row with max age Forever: %+v, want a retry", d)
	}
	if _, err := retry.NewPolicy(retry.PolicyConfig{MaxAge: -time.Hour}); err == nil {
		t.Fatal("a negative max age was accepted")
	}
	_, err := retry.NewPolicy(retry.PolicyConfig{MaxAttempts: -1, Strategy: "random", BaseDelay: time.Minute, MaxDelay: time.Second})
	if err == nil {
		t.Fatal("invalid policy accepted")
	}
	for _, want := range []string{"max_attempts", "strategy", "max_delay"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}
