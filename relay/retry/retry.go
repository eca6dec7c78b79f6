// Package retry decides what happens to a failed delivery: retry it later,
// defer it without counting an attempt, or dead-letter it.
//
// Sinks classify their own errors with the failure classes of the sink
// package; the relay never parses error strings. An error nobody classified
// is transient: retried, counted, and dead-lettered once attempts or time
// run out, so it can neither be lost nor retried forever.
package retry

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// Strategy names a backoff jitter strategy.
type Strategy string

// Strategies. See Backoff.Delay.
const (
	StrategyFull         Strategy = "full"
	StrategyEqual        Strategy = "equal"
	StrategyDecorrelated Strategy = "decorrelated"
	StrategyNone         Strategy = "none"
)

// Strategies lists the valid strategies.
var Strategies = []Strategy{StrategyFull, StrategyEqual, StrategyDecorrelated, StrategyNone}

// Rand is the randomness backoff needs; *rand.Rand satisfies it.
type Rand interface {
	// Int64N returns a uniform value in [0, n).
	Int64N(n int64) int64
}

// Backoff computes capped exponential delays with jitter.
type Backoff struct {
	Strategy Strategy
	Base     time.Duration
	Max      time.Duration
}

// Exponential returns base * 2^attempt capped at max, without jitter.
// attempt 0 is the delay after the first failure.
func Exponential(attempt int, base, max time.Duration) time.Duration {
	if base <= 0 {
		return 0
	}
	if attempt < 0 {
		attempt = 0
	}
	if attempt >= 62 || float64(base)*math.Pow(2, float64(attempt)) >= float64(max) {
		return max
	}
	return base << attempt
}

// Delay returns the delay before the next attempt after failure number
// attempt+1 (attempt 0 is the first failure). prev is the delay chosen after
// the previous failure, used by the decorrelated strategy.
//
//   - none: d = min(max, base*2^attempt)
//   - full: uniform in [0, d]
//   - equal: d/2 + uniform in [0, d/2]
//   - decorrelated: min(max, uniform in [base, 3*prev]), with prev ≥ base
func (b Backoff) Delay(attempt int, prev time.Duration, r Rand) time.Duration {
	d := Exponential(attempt, b.Base, b.Max)
	switch b.Strategy {
	case StrategyNone:
		return d
	case StrategyEqual:
		return d/2 + uniform(r, 0, d-d/2)
	case StrategyDecorrelated:
		if prev < b.Base {
			prev = b.Base
		}
		hi := prev * 3
		if hi/3 != prev || hi > b.Max { // overflow or past the cap
			hi = b.Max
		}
		if hi < b.Base {
			return hi
		}
		return uniform(r, b.Base, hi)
	default: // full
		return uniform(r, 0, d)
	}
}

// uniform returns a value in [lo, hi].
func uniform(r Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// Action is what to do with a failed row.
type Action int

const (
	// Retry counts an attempt and schedules the next one after Delay.
	Retry Action = iota
	// Defer schedules the next attempt without counting one.
	Defer
	// DeadLetter moves the row to the dead-letter status with Reason.
	DeadLetter
)

func (a Action) String() string {
	switch a {
	case Retry:
		return "retry"
	case Defer:
		return "defer"
	case DeadLetter:
		return "dead_letter"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Decision is the outcome of a failure.
type Decision struct {
	Action Action
	// Delay until the next attempt (Retry; Defer leaves it to the caller,
	// which knows how long the destination is paused).
	Delay time.Duration
	// Reason is the dead-letter reason (DeadLetter).
	Reason string
}

// Failure describes one failed delivery attempt.
type Failure struct {
	// Err is the sink's error, classified or not.
	Err error
	// Attempt is the number of failed attempts before this one
	// (the row's retry_count).
	Attempt int
	// Age is the time since the row was created, by the database clock.
	Age time.Duration
	// PrevDelay is the delay chosen after the previous failure, if any.
	PrevDelay time.Duration
}

// Forever is a limit that never ends: a MaxAge (or a retention) of
// Forever turns the limit off. It is the longest time.Duration, so that
// comparisons with it need no special case.
const Forever = time.Duration(math.MaxInt64)

// Defaults of Policy.
const (
	DefaultMaxAttempts   = 25
	DefaultMaxAge        = 72 * time.Hour
	DefaultBaseDelay     = time.Second
	DefaultMaxDelay      = 5 * time.Minute
	DefaultMaxRetryAfter = 15 * time.Minute
	DefaultStrategy      = StrategyFull
)

// Policy turns failures into decisions. It is safe for concurrent use.
type Policy struct {
	// MaxAttempts is the number of attempts, the first included, after
	// which a transient failure dead-letters the row (retries_exhausted).
	MaxAttempts int
	// MaxAge is the age after which a failing row is dead-lettered
	// (max_age_exceeded) whatever its attempts; Forever disables the
	// limit.
	MaxAge  time.Duration
	Backoff Backoff
	// MaxRetryAfter caps a destination's Retry-After hint, so a receiver
	// can neither stall a row nor disable retries.
	MaxRetryAfter time.Duration

	mu   sync.Mutex
	rand Rand
}

// PolicyConfig configures NewPolicy; it is also the retry section of the
// relay's configuration file (its koanf tags). Zero values take the
// defaults (WithDefaults).
type PolicyConfig struct {
	// MaxAttempts is the number of attempts, the first included, before a
	// row is dead-lettered retries_exhausted. Default 25.
	MaxAttempts int `koanf:"max_attempts"`
	// MaxAge dead-letters a failing row older than this
	// (max_age_exceeded); Forever turns the limit off. Default 72h.
	MaxAge time.Duration `koanf:"max_age"`
	// Strategy is the backoff jitter: full (default), equal, decorrelated
	// or none.
	Strategy Strategy `koanf:"strategy"`
	// BaseDelay is the first retry's delay before jitter. Default 1s.
	BaseDelay time.Duration `koanf:"base_delay"`
	// MaxDelay caps the delay. Default 5m, or BaseDelay when it is
	// longer.
	MaxDelay time.Duration `koanf:"max_delay"`
	// MaxRetryAfter caps a destination's Retry-After hint. Default 15m.
	MaxRetryAfter time.Duration `koanf:"max_retry_after"`
	// Rand is the source of jitter; default a randomly seeded PCG.
	Rand Rand `koanf:"-"`
}

// WithDefaults returns c with every setting left zero at its default.
func (c PolicyConfig) WithDefaults() PolicyConfig {
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.MaxAge = cmp.Or(c.MaxAge, DefaultMaxAge)
	c.Strategy = cmp.Or(c.Strategy, DefaultStrategy)
	c.BaseDelay = cmp.Or(c.BaseDelay, DefaultBaseDelay)
	c.MaxDelay = cmp.Or(c.MaxDelay, max(DefaultMaxDelay, c.BaseDelay))
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, DefaultMaxRetryAfter)
	return c
}

// Validate reports every problem of c, defaults applied, at once: one per
// line, each starting with the setting's name.
func (c PolicyConfig) Validate() error {
	var errs []error
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("max_attempts is %d; it must be at least 1", c.MaxAttempts))
	}
	if c.MaxAge <= 0 {
		errs = append(errs, fmt.Errorf("max_age is %s; it must be positive, or forever to turn the limit off", c.MaxAge))
	}
	if !slices.Contains(Strategies, c.Strategy) {
		errs = append(errs, fmt.Errorf("strategy is %q; use full, equal, decorrelated or none", c.Strategy))
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"base_delay", c.BaseDelay}, {"max_delay", c.MaxDelay}, {"max_retry_after", c.MaxRetryAfter}} {
		if d.value <= 0 {
			errs = append(errs, fmt.Errorf("%s is %s; it must be positive", d.name, d.value))
		}
	}
	if c.MaxDelay > 0 && c.MaxDelay < c.BaseDelay {
		errs = append(errs, fmt.Errorf("max_delay %s is below base_delay %s", c.MaxDelay, c.BaseDelay))
	}
	return errors.Join(errs...)
}

// NewPolicy returns a Policy for c, its defaults applied.
func NewPolicy(c PolicyConfig) (*Policy, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	p := &Policy{
		MaxAttempts:   c.MaxAttempts,
		MaxAge:        c.MaxAge,
		Backoff:       Backoff{Strategy: c.Strategy, Base: c.BaseDelay, Max: c.MaxDelay},
		MaxRetryAfter: c.MaxRetryAfter,
		rand:          c.Rand,
	}
	if p.rand == nil {
		p.rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return p, nil
}

// Outlived reports whether a failing row of age is past MaxAge: it is
// dead-lettered (max_age_exceeded) whatever its attempts, even when its
// failure counts none.
func (p *Policy) Outlived(age time.Duration) bool { return p.MaxAge > 0 && age >= p.MaxAge }

// Decide returns what to do with f.
func (p *Policy) Decide(f Failure) Decision {
	e := sink.Classify(f.Err)
	switch e.Class {
	case sink.ClassPermanent:
		reason := e.Reason
		if reason == "" {
			reason = sink.ReasonPermanent
		}
		return Decision{Action: DeadLetter, Reason: reason}
	case sink.ClassSystemic:
		return Decision{Action: Defer}
	}
	if f.Attempt+1 >= p.MaxAttempts {
		return Decision{Action: DeadLetter, Reason: sink.ReasonRetriesExhausted}
	}
	if p.Outlived(f.Age) {
		return Decision{Action: DeadLetter, Reason: sink.ReasonMaxAgeExceeded}
	}
	p.mu.Lock()
	d := p.Backoff.Delay(f.Attempt, f.PrevDelay, p.rand)
	p.mu.Unlock()
	if e.RetryAfter > 0 {
		d = max(d, min(e.RetryAfter, p.MaxRetryAfter))
	}
	return Decision{Action: Retry, Delay: d}
}
