package flow

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/retry"
)

// BreakerConfig configures a destination's circuit breaker. It opens only
// on evidence about the destination as a whole: at once on a systemic
// failure of the destination (refused connection, DNS, TLS, cluster
// authorization); after Failures consecutive transient failures of the
// destination (no answer: timeouts, reset connections); or when every row
// it was given failed on its own (an endpoint failing every row), across
// at least FailingRows distinct rows for FailingFor, or as soon as a row
// failed a third time while new rows failed their first attempt too (a
// fifth of FailingRows, at least two). Rows that fail beside successes,
// and failures of a topic or a partition, never open it. After a
// cool-down, which doubles from the relay's Pause.Base up to
// Pause.Max while probes keep failing, a probe of a few rows of different
// keys and topics goes; Successes successful probes close it, and a probe
// that delivers nothing and fails on anything but a permanent failure
// opens it again. While it is open, the destination's rows are not
// claimed, and a failed probe's rows count no attempt: they wait for the
// next probe, and end only at the retry policy's MaxAge.
type BreakerConfig struct {
	// Failures is the run of consecutive transient failures of the
	// destination that opens the breaker. Default 5.
	Failures int `koanf:"failures"`
	// Successes is the number of successful probes that close it.
	// Default 2.
	Successes int `koanf:"successes"`
	// FailingRows and FailingFor open the breaker when every row given to
	// the destination failed, across at least FailingRows distinct rows
	// and for at least FailingFor. Defaults 10 and 2s.
	FailingRows int           `koanf:"failing_rows"`
	FailingFor  time.Duration `koanf:"failing_for"`
}

// WithDefaults returns c with every setting left zero at its default.
func (c BreakerConfig) WithDefaults() BreakerConfig {
	c.Failures = cmp.Or(c.Failures, DefaultBreakerFailures)
	c.Successes = cmp.Or(c.Successes, DefaultBreakerSuccesses)
	c.FailingRows = cmp.Or(c.FailingRows, DefaultBreakerFailingRows)
	c.FailingFor = cmp.Or(c.FailingFor, DefaultBreakerFailingFor)
	return c
}

// Validate reports every problem of c at once, one per line, each
// starting with the setting's name; zero is the default.
func (c BreakerConfig) Validate() error {
	var errs []error
	for _, v := range []struct {
		name  string
		value int
	}{{"failures", c.Failures}, {"successes", c.Successes}, {"failing_rows", c.FailingRows}} {
		if v.value < 0 {
			errs = append(errs, fmt.Errorf("%s is %d; it must not be negative", v.name, v.value))
		}
	}
	if c.FailingFor < 0 {
		errs = append(errs, fmt.Errorf("failing_for is %s; it must not be negative", c.FailingFor))
	}
	return errors.Join(errs...)
}

// BreakerState is the state of a destination's circuit breaker.
type BreakerState int

// Breaker states.
const (
	BreakerClosed BreakerState = iota
	BreakerOpen
	BreakerHalfOpen
)

// String names the state as metrics and logs do.
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
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
	since    time.Time // when the first of them opened: the outage's start
	failed   int       // consecutive transient failures while closed
	window   failWindow
	probed   int           // successful probes while half-open
	probing  bool          // a probe is in flight
	probeAt  time.Time     // when it went
	cool     time.Duration // the last cool-down
	gen      int           // bumped at every state change: results of older admissions are stale
	lastErr  string
	onChange func(from, to BreakerState, cooldown time.Duration, lastErr string, byFleet bool)
	// onAnswer is told of a successful probe that leaves the breaker
	// half-open (more must succeed before it closes): the destination
	// answers again.
	onAnswer func()

	// Shared with the fleet (see fleet.go): while shared, the fleet's
	// state is adopted at each sync and a half-open breaker probes only
	// while it holds the fleet's probe.
	wakeFleet  func() // nil: not in a fleet
	shared     bool
	fleetProbe bool  // this replica holds the fleet's probe
	fleetGen   int64 // the fleet's generation last adopted
	event      FleetEvent
	cooldown   time.Duration // of an Opened event
	evSeq      uint64        // bumped with every event
	byFleet    bool          // set while a change comes from the fleet
}

// failWindow gathers the rows that failed on their own since the
// destination last delivered one.
type failWindow struct {
	start  time.Time     // the first failure
	ids    map[int64]int // failures of each row
	most   int           // the most failures of one row
	firsts int           // rows that failed their first attempt
}

// add records ids failed at now, firsts of them on their first attempt;
// the window keeps at most rows distinct rows.
func (w *failWindow) add(now time.Time, ids []int64, firsts, rows int) {
	if len(ids) == 0 {
		return
	}
	if w.ids == nil {
		w.start, w.ids = now, make(map[int64]int, rows)
	}
	w.firsts += firsts
	for _, id := range ids {
		if n, again := w.ids[id]; again {
			w.ids[id] = n + 1
			w.most = max(w.most, n+1)
		} else if len(w.ids) < rows {
			w.ids[id] = 1
			w.most = max(w.most, 1)
		}
	}
}

// retriedFailures is how often one row of a window fails, beside new rows
// failing too, before the window opens the breaker whatever its age: its
// next attempt would be a fourth. Replicas that lease the outbox's
// partitions each attempt the rows of their own keys.
const retriedFailures = 3

// failing reports whether the window shows a destination that fails
// every row: at least rows distinct rows for failingFor; or, sooner, a row
// failing for the third time while rows failed their first attempt too
// (a fifth of rows, at least two), so that no row spends more than three
// attempts on an outage that answers, however fast its retries come. Rows
// that fail their retries alone (a payload the destination rejects,
// after the rest of the traffic went through) are no such evidence: they
// run out of attempts first.
func (w *failWindow) failing(now time.Time, rows int, failingFor time.Duration) bool {
	if len(w.ids) >= rows && now.Sub(w.start) >= failingFor {
		return true
	}
	return w.most >= retriedFailures && w.firsts >= max(2, rows/5)
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
		if b.awaiting(now) || !b.mayProbe() {
			return admission{until: now.Add(b.base), gen: b.gen}
		}
		b.probing, b.probeAt = true, now
		return admission{ok: true, probe: true, gen: b.gen}
	}
	return admission{ok: true, gen: b.gen}
}

// cooled moves an open breaker whose cool-down is over to half-open,
// whether or not a row is waiting to probe it.
func (b *breaker) cooled(now time.Time) {
	if b.state == BreakerOpen && !now.Before(b.until) {
		b.set(BreakerHalfOpen, 0)
		if b.shared {
			b.wakeFleet() // to ask for the probe
		}
	}
}

// awaiting reports whether a probe in flight is awaited: for a cool-down
// (the last one, at least the base) after it went. One unanswered for
// longer, sent into the outage and still waiting for its timeout, does
// not keep the breaker from probing again: the destination may be back,
// and the next probe finds out at once.
func (b *breaker) awaiting(now time.Time) bool {
	return b.probing && now.Sub(b.probeAt) < max(b.cool, b.base)
}

// starved reports whether a half-open breaker that may probe has had
// nothing to probe with for a base cool-down: no row it could take was
// claimed since it could have (or since its last probe, or since an
// unanswered one stopped being awaited). That is every row of its subject
// waiting behind the rows of its failed probes, which wait past the next
// cool-down so that the next probe takes other rows: when there are no
// other rows, they are what the next probe must take.
func (b *breaker) starved(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cooled(now)
	return b.starvedLocked(now)
}

func (b *breaker) starvedLocked(now time.Time) bool {
	if b.state != BreakerHalfOpen || !b.mayProbe() || b.awaiting(now) {
		return false
	}
	since := b.until
	if b.probeAt.After(since) {
		since = b.probeAt
		if b.probing {
			since = since.Add(max(b.cool, b.base))
		}
	}
	return now.Sub(since) >= b.base
}

// mayProbe reports whether a half-open breaker may send a probe: always
// on its own, and in a fleet only while it holds the fleet's probe.
func (b *breaker) mayProbe() bool { return !b.shared || b.fleetProbe }

// blocked reports whether the breaker is taking no rows now, and until when.
func (b *breaker) blocked(now time.Time) (bool, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cooled(now)
	switch {
	case b.state == BreakerOpen && now.Before(b.until):
		return true, b.until
	case b.state != BreakerClosed && (b.awaiting(now) || !b.mayProbe()):
		return true, now.Add(b.base)
	}
	return false, time.Time{}
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
// their own adds them to the window, which opens the breaker once it
// holds at least failingRows distinct rows that failed for failingFor,
// or sooner (see failing). In half-open, a probe that delivered nothing
// and failed on anything but a permanent failure opens it again: a 5xx
// or a timeout to every probed row is the outage going on. A probe whose
// rows were all refused for good is inconclusive: they are dead letters,
// and the next probe takes others.
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
				b.tell(FleetClosed, 0)
			} else if b.onAnswer != nil {
				b.onAnswer()
			}
			return
		}
		// The destination answers: its failures in this publish were not
		// the destination's.
		b.failed, b.window = 0, failWindow{}
		return
	}
	b.failed += ev.transient
	if b.failed >= b.failures || (b.state == BreakerHalfOpen && ev.transient+ev.rowTransient > 0) {
		b.open(now)
		return
	}
	if b.failingFor > 0 {
		b.window.add(now, ev.rowFailed, ev.rowFirsts, b.failingRows)
		if b.window.failing(now, b.failingRows, b.failingFor) {
			b.open(now)
		}
	}
}

// openedSince reports whether the breaker opened after admission gen of
// a closed breaker, and is not closed again.
func (b *breaker) openedSince(gen int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return gen != b.gen && b.state != BreakerClosed
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
// since it was last closed, but is never longer than a quarter of the
// outage so far (nor shorter than the base): once what failed answers
// again, the next probe finds it within a quarter of the time it was
// down, and a long outage is still probed only every max.
func (b *breaker) open(now time.Time) {
	if b.streak == 0 || b.since.IsZero() {
		b.since = now
	}
	d := min(retry.Exponential(b.streak, b.base, b.max), max(b.base, now.Sub(b.since)/4))
	b.streak++
	b.until = now.Add(d)
	b.set(BreakerOpen, d)
	b.tell(FleetOpened, d)
}

// tell records a change the fleet should know of, and asks for a sync.
func (b *breaker) tell(e FleetEvent, cooldown time.Duration) {
	if b.wakeFleet == nil {
		return
	}
	b.event, b.cooldown = e, cooldown
	b.evSeq++
	b.wakeFleet()
}

// fleetEvent fills in fd what the breaker has to tell the fleet, and
// returns the sequence of the events it covers.
func (b *breaker) fleetEvent(now time.Time, fd *FleetDestination) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	fd.Event, fd.Cooldown, fd.Streak, fd.LastError = b.event, b.cooldown, b.streak, b.lastErr
	// Cooled down, whether or not a worker has asked since: asking here
	// through cooled would wake the sync under way for another.
	fd.Probe = b.state == BreakerHalfOpen || (b.state == BreakerOpen && !now.Before(b.until))
	return b.evSeq
}

// adopt takes the fleet's state of the breaker, found by a sync that told
// the fleet the events up to seq; now and dbNow are the local and the
// fleet's clocks at the sync. It reports whether the breaker lets rows go
// that it held. A breaker with an event newer than seq waits for the next
// sync, which tells the fleet first.
func (b *breaker) adopt(v FleetBreaker, seq uint64, now, dbNow time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.evSeq != seq {
		return false
	}
	b.event = FleetNothing
	freed := v.Probe && !b.fleetProbe
	b.shared, b.fleetProbe = true, v.Probe
	if v.Generation == b.fleetGen {
		return freed
	}
	b.fleetGen = v.Generation
	until := now.Add(v.OpenUntil.Sub(dbNow))
	b.byFleet = true
	defer func() { b.byFleet = false }()
	switch {
	case v.Open && b.state == BreakerClosed:
		b.streak, b.until, b.lastErr, b.since = v.Streak, until, v.LastError, now
		b.set(BreakerOpen, until.Sub(now))
	case v.Open:
		// Open here too: take the fleet's cool-down, and go back to open
		// if another replica's probe failed.
		b.streak, b.until = v.Streak, until
		b.cool = max(b.cool, until.Sub(now))
		if b.state == BreakerHalfOpen && now.Before(until) {
			b.set(BreakerOpen, until.Sub(now))
		}
	case b.state != BreakerClosed:
		b.streak = 0
		b.set(BreakerClosed, 0)
		freed = true
	}
	return freed
}

// unshare returns the breaker to its own state: the fleet is out of reach.
func (b *breaker) unshare() {
	b.mu.Lock()
	b.shared, b.fleetProbe = false, false
	b.mu.Unlock()
}

func (b *breaker) set(to BreakerState, cooldown time.Duration) {
	from := b.state
	b.state, b.failed, b.probed, b.probing = to, 0, 0, false
	b.window = failWindow{}
	if to == BreakerOpen {
		b.cool = cooldown
	}
	b.gen++
	if from != to && b.onChange != nil {
		b.onChange(from, to, cooldown, b.lastErr, b.byFleet)
	}
}

func (b *breaker) snapshot() (BreakerState, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cooled(time.Now())
	return b.state, b.until
}

// lastError is the latest failure the breaker counted.
func (b *breaker) lastError() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastErr
}
