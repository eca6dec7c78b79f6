package relay

import (
	"errors"
	"fmt"
	"math"
	"path"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/retry"
)

// Destination is one place rows are delivered to: a Kafka cluster or an
// HTTP endpoint. Each destination has its own circuit breaker, bulkhead and
// retry budget, so one failing destination never holds up the others.
type Destination struct {
	// Name identifies the destination in routes, logs and metrics.
	Name string
	// Publisher delivers the destination's rows. Required.
	Publisher Publisher
	// OnDeadLetter is release or block; default the relay's OnDeadLetter.
	OnDeadLetter string
	// Breaker configures the destination's circuit breaker.
	Breaker BreakerConfig
	// MaxInFlight is the bulkhead: the most rows of this destination being
	// delivered at once across all workers. Rows past it wait, and while it
	// is full the destination's topics are not claimed. 0 is unlimited.
	MaxInFlight int
	// RetryBudget limits retries while they keep failing.
	RetryBudget RetryBudgetConfig
	// Partitioner tells the partition of a row, so that a paused
	// partition holds only its own rows. Default the Publisher, when it
	// is one.
	Partitioner Partitioner
	// VisibilityTimeout, when set, delivers the destination's rows on a
	// lease instead of inside the claim's transaction: the claim hides
	// them for this long under a fresh lease token and counts the
	// attempt, commits, and the delivery runs outside any transaction,
	// writing back only while the token still matches. A relay that dies
	// mid-delivery leaves rows that become ready again when the lease
	// ends. For slow endpoints: they no longer hold a transaction open or
	// the other rows of a batch back. Deliveries are bounded by nine
	// tenths of it.
	VisibilityTimeout time.Duration
}

// Route sends the rows of matching topics to a destination. Routes are
// tried in order; the first match wins.
type Route struct {
	// Topics are exact topic names or glob patterns (*, ?, [a-z]).
	Topics []string
	// Destination names the destination.
	Destination string
	// Topic, when set, replaces the row's topic as the Kafka topic.
	Topic string
}

// Defaults of BreakerConfig and RetryBudgetConfig.
const (
	DefaultBreakerFailures     = 5
	DefaultBreakerSuccesses    = 2
	DefaultBreakerFailingRows  = 10
	DefaultBreakerFailingFor   = 2 * time.Second
	DefaultRetryBudgetRatio    = 0.2
	DefaultRetryBudgetMinRate  = 10.0
	DefaultRetryBudgetDuration = 10 * time.Second
	// budgetDeferral is how long a retry that is over budget waits.
	budgetDeferral = time.Second
)

// BreakerConfig configures a destination's circuit breaker. It opens only
// on evidence about the destination as a whole: at once on a systemic
// failure of the destination (refused connection, DNS, TLS, cluster
// authorization); after Failures consecutive transient failures of the
// destination (no answer: timeouts, reset connections); or when, for
// FailingFor and across at least FailingRows distinct rows, every row it
// was given failed on its own (an endpoint failing every row). Rows that
// fail beside successes, and failures of a topic or a partition, never
// open it. After a cool-down, which doubles from the relay's PauseBase up
// to PauseMax while probes keep failing, a probe of a few rows of
// different keys and topics goes; Successes successful probes close it.
// While it is open, the destination's rows are not claimed and no attempts
// are consumed.
type BreakerConfig struct {
	// Failures is the run of consecutive transient failures of the
	// destination that opens the breaker. Default 5.
	Failures int
	// Successes is the number of successful probes that close it.
	// Default 2.
	Successes int
	// FailingRows and FailingFor open the breaker when every row given to
	// the destination failed, across at least FailingRows distinct rows
	// and for at least FailingFor. Defaults 10 and 2s.
	FailingRows int
	FailingFor  time.Duration
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

// Validate reports every problem of d at once, or nil.
func (d *Destination) Validate() error {
	var errs []error
	name := d.Name
	if name == "" {
		errs = append(errs, errors.New("relay: a destination needs a name"))
		name = "(unnamed)"
	}
	if d.Publisher == nil {
		errs = append(errs, fmt.Errorf("relay: destination %s needs a publisher", name))
	}
	switch d.OnDeadLetter {
	case "", OnDeadLetterRelease, OnDeadLetterBlock:
	default:
		errs = append(errs, fmt.Errorf("relay: destination %s: on_dead_letter is %q; use release or block", name, d.OnDeadLetter))
	}
	if d.VisibilityTimeout < 0 || (d.VisibilityTimeout > 0 && d.VisibilityTimeout < time.Second) {
		errs = append(errs, fmt.Errorf("relay: destination %s: visibility_timeout %s must be 0 (inline delivery) or at least 1s", name, d.VisibilityTimeout))
	}
	if d.Breaker.Failures < 0 || d.Breaker.Successes < 0 || d.Breaker.FailingRows < 0 || d.Breaker.FailingFor < 0 || d.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("relay: destination %s: breaker thresholds and max_in_flight must not be negative", name))
	}
	if d.RetryBudget.Ratio < 0 || d.RetryBudget.MinPerSecond < 0 || math.IsNaN(d.RetryBudget.Ratio) || math.IsNaN(d.RetryBudget.MinPerSecond) {
		errs = append(errs, fmt.Errorf("relay: destination %s: retry budget ratio and min_per_second must not be negative", name))
	}
	return errors.Join(errs...)
}

// ValidateRoutes checks routes against the destinations' names: every
// route names a known destination and has valid patterns.
func ValidateRoutes(routes []Route, destinations []string) error {
	var errs []error
	known := map[string]bool{}
	for _, d := range destinations {
		known[d] = true
	}
	for i, rt := range routes {
		if len(rt.Topics) == 0 {
			errs = append(errs, fmt.Errorf("route %d has no topics", i+1))
		}
		for _, t := range rt.Topics {
			if _, err := path.Match(t, ""); err != nil || t == "" {
				errs = append(errs, fmt.Errorf("route %d: topic pattern %q is not a valid glob", i+1, t))
			}
		}
		if !known[rt.Destination] {
			errs = append(errs, fmt.Errorf("route %d: destination %q is not defined", i+1, rt.Destination))
		}
	}
	return errors.Join(errs...)
}

// router maps topics to destinations, first matching route first, and
// remembers the answers: topics are few, rows are many.
type router struct {
	routes []compiledRoute
	mu     sync.RWMutex
	cache  map[string]routing
}

type compiledRoute struct {
	patterns []string
	dest     int
	topic    string
}

// routing is where a topic goes; dest is -1 when no route matches.
type routing struct {
	dest  int
	topic string
}

// maxCachedTopics bounds the router's memory whatever the producers write.
const maxCachedTopics = 10000

func newRouter(routes []Route, index map[string]int) *router {
	rt := &router{cache: map[string]routing{}}
	for _, r := range routes {
		rt.routes = append(rt.routes, compiledRoute{patterns: r.Topics, dest: index[r.Destination], topic: r.Topic})
	}
	return rt
}

func (rt *router) route(topic string) routing {
	rt.mu.RLock()
	got, ok := rt.cache[topic]
	rt.mu.RUnlock()
	if ok {
		return got
	}
	got = routing{dest: -1}
	for _, r := range rt.routes {
		if matchAny(r.patterns, topic) {
			got = routing{dest: r.dest, topic: r.topic}
			break
		}
	}
	if got.topic == "" {
		got.topic = topic
	}
	rt.mu.Lock()
	if len(rt.cache) < maxCachedTopics {
		rt.cache[topic] = got
	}
	rt.mu.Unlock()
	return got
}

// topicsOf returns the known topics whose routing matches.
func (rt *router) topicsOf(match func(routing) bool) []string {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	var out []string
	for topic, r := range rt.cache {
		if match(r) {
			out = append(out, topic)
		}
	}
	return out
}

// MatchRoute returns the first of routes that matches topic, as the relay
// routes it.
func MatchRoute(routes []Route, topic string) (Route, bool) {
	for _, r := range routes {
		if matchAny(r.Topics, topic) {
			return r, true
		}
	}
	return Route{}, false
}

func matchAny(patterns []string, topic string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, topic); ok {
			return true
		}
	}
	return false
}

// BreakerState is the state of a destination's circuit breaker.
type BreakerState int

// Breaker states.
const (
	BreakerClosed BreakerState = iota
	BreakerOpen
	BreakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("BreakerState(%d)", int(s))
}

// breaker is a circuit breaker: a destination's (see BreakerConfig), or
// a paused topic's or partition's (see pauseSet).
type breaker struct {
	failures, successes int           // thresholds
	failingRows         int           // distinct rows failing on their own that open it, with failingFor
	failingFor          time.Duration // 0: rows failing on their own never open it
	base, max           time.Duration // cool-down bounds

	mu       sync.Mutex
	state    BreakerState
	until    time.Time // open: when a probe may go
	streak   int       // consecutive openings, for the doubling cool-down
	failed   int       // consecutive transient failures while closed
	window   failWindow
	probed   int  // successful probes while half-open
	probing  bool // a probe is in flight
	gen      int  // bumped at every state change: results of older admissions are stale
	lastErr  string
	onChange func(from, to BreakerState, cooldown time.Duration, lastErr string)
}

// failWindow gathers the rows that failed on their own since the
// destination last delivered one.
type failWindow struct {
	start time.Time // the first failure
	ids   map[int64]struct{}
}

// add records ids failed at now and reports whether the window holds at
// least rows distinct rows (it keeps no more).
func (w *failWindow) add(now time.Time, ids []int64, rows int) bool {
	if len(ids) == 0 {
		return false
	}
	if w.ids == nil {
		w.start, w.ids = now, make(map[int64]struct{}, rows)
	}
	for _, id := range ids {
		if len(w.ids) >= rows {
			break
		}
		w.ids[id] = struct{}{}
	}
	return len(w.ids) >= rows
}

// admission is what the breaker lets through now.
type admission struct {
	ok    bool      // rows may be published
	probe bool      // a few rows only, as the half-open probe
	until time.Time // when not ok: when to look again
	gen   int       // the breaker state it was given in
}

func (b *breaker) admit(now time.Time) admission {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cooled(now)
	switch b.state {
	case BreakerOpen:
		return admission{until: b.until, gen: b.gen}
	case BreakerHalfOpen:
		if b.probing {
			return admission{until: now.Add(b.base), gen: b.gen}
		}
		b.probing = true
		return admission{ok: true, probe: true, gen: b.gen}
	}
	return admission{ok: true, gen: b.gen}
}

// cooled moves an open breaker whose cool-down is over to half-open,
// whether or not a row is waiting to probe it.
func (b *breaker) cooled(now time.Time) {
	if b.state == BreakerOpen && !now.Before(b.until) {
		b.set(BreakerHalfOpen, 0)
	}
}

// blocked reports whether the breaker is taking no rows now, and until when.
func (b *breaker) blocked(now time.Time) (bool, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cooled(now)
	switch {
	case b.state == BreakerOpen && now.Before(b.until):
		return true, b.until
	case b.state != BreakerClosed && b.probing:
		return true, now.Add(b.base)
	}
	return false, time.Time{}
}

// evidence is what one publish says about a breaker's subject.
type evidence struct {
	sent      int     // rows delivered
	systemic  int     // systemic failures of the subject as a whole
	transient int     // transient failures of the subject as a whole
	rowFailed []int64 // rows that failed on their own
	lastErr   string
}

// result feeds one publish's evidence to the breaker, and returns how long
// the breaker stays open from now (0 when it is not open): how long rows
// deferred by this publish should wait. Evidence of a publish admitted
// before the breaker last changed state is ignored: it says nothing about
// the subject since.
func (b *breaker) result(now time.Time, gen int, ev evidence, probe bool) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if gen == b.gen {
		if probe {
			b.probing = false
		}
		b.feed(now, ev)
	}
	if b.state == BreakerOpen && now.Before(b.until) {
		return b.until.Sub(now)
	}
	return 0
}

// feed applies one publish's evidence. A publish that delivered a row
// shows the destination answering; one that failed only rows failing on
// their own adds them to the window, which opens the breaker once it has
// held at least failingRows distinct rows for failingFor. In half-open,
// the same holds for probes: a probe of rows that fail on their own is
// inconclusive (they go into their own backoff, and the next probe takes
// other rows) until the window fills.
func (b *breaker) feed(now time.Time, ev evidence) {
	if ev.lastErr != "" {
		b.lastErr = ev.lastErr
	}
	switch {
	case ev.systemic > 0:
		b.open(now)
		return
	case ev.sent > 0:
		if b.state == BreakerHalfOpen {
			b.probed++
			if b.probed >= b.successes {
				b.streak = 0
				b.set(BreakerClosed, 0)
			}
			return
		}
		// The destination answers: its failures in this publish were not
		// the destination's.
		b.failed, b.window = 0, failWindow{}
		return
	}
	b.failed += ev.transient
	if b.failed >= b.failures || (b.state == BreakerHalfOpen && ev.transient > 0) {
		b.open(now)
		return
	}
	if b.failingFor > 0 && b.window.add(now, ev.rowFailed, b.failingRows) && now.Sub(b.window.start) >= b.failingFor {
		b.open(now)
	}
}

// abandoned returns a probe slot whose publish never finished.
func (b *breaker) abandoned(gen int) {
	b.mu.Lock()
	if gen == b.gen {
		b.probing = false
	}
	b.mu.Unlock()
}

// open opens the breaker for a cool-down that doubles with each opening
// since it was last closed.
func (b *breaker) open(now time.Time) {
	d := retry.Exponential(b.streak, b.base, b.max)
	b.streak++
	b.until = now.Add(d)
	b.set(BreakerOpen, d)
}

func (b *breaker) set(to BreakerState, cooldown time.Duration) {
	from := b.state
	b.state, b.failed, b.probed, b.probing = to, 0, 0, false
	b.window = failWindow{}
	b.gen++
	if from != to && b.onChange != nil {
		b.onChange(from, to, cooldown, b.lastErr)
	}
}

func (b *breaker) snapshot() (BreakerState, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cooled(time.Now())
	return b.state, b.until
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
