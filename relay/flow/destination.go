package flow

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/internal/problems"
	"github.com/outbox-relay/outbox-relay/internal/testsignal"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Destination is one place rows are delivered to: a Kafka cluster or an
// HTTP endpoint. Each destination has its own circuit breaker, bulkhead and
// retry budget, so one failing destination never holds up the others. Its
// settings are also those of destinations.<name> in the relay's
// configuration file (their koanf tags).
type Destination struct {
	// Name identifies the destination in routes, logs and metrics.
	Name string `koanf:"-"`
	// Publisher delivers the destination's rows. Required.
	Publisher sink.Publisher `koanf:"-"`
	// OnDeadLetter is release or block; default the relay's OnDeadLetter.
	OnDeadLetter string `koanf:"on_dead_letter"`
	// Breaker configures the destination's circuit breaker.
	Breaker BreakerConfig `koanf:"breaker"`
	// MaxInFlight is the bulkhead: the most rows of this destination being
	// delivered at once across all workers, and in a fleet across all
	// replicas. Rows past it wait, and while it is full the destination's
	// topics are not claimed. 0 is unlimited.
	MaxInFlight int `koanf:"max_in_flight"`
	// RetryBudget limits retries while they keep failing.
	RetryBudget RetryBudgetConfig `koanf:"retry_budget"`
	// RateLimit bounds the rows per second this relay, or its fleet, sends
	// to the destination, for receivers with a published quota.
	RateLimit RateLimitConfig `koanf:"rate_limit"`
	// Partitioner tells the partition of a row, so that a paused
	// partition holds only its own rows. Default the Publisher, when it
	// is one.
	Partitioner sink.Partitioner `koanf:"-"`
	// VisibilityTimeout, when set, delivers the destination's rows on a
	// lease instead of inside the claim's transaction: the claim hides
	// them for this long under a fresh lease token and counts the
	// attempt, commits, and the delivery runs outside any transaction,
	// writing back only while the token still matches. A relay that dies
	// mid-delivery leaves rows that become ready again when the lease
	// ends. For slow endpoints: they no longer hold a transaction open or
	// the other rows of a batch back. Deliveries are bounded by nine
	// tenths of it.
	VisibilityTimeout time.Duration `koanf:"visibility_timeout"`
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
	for _, err := range d.settingProblems() {
		errs = append(errs, fmt.Errorf("relay: destination %s: %w", name, err))
	}
	return errors.Join(errs...)
}

// ValidateSettings reports every problem of d's settings, all but its
// name and publisher, one per line, each starting with the setting's name
// as in the configuration file (on_dead_letter, breaker.failures, …), so
// that a configuration loader can put its own path in front.
func (d *Destination) ValidateSettings() error {
	return errors.Join(d.settingProblems()...)
}

func (d *Destination) settingProblems() []error {
	var errs []error
	if err := ValidateOnDeadLetter(d.OnDeadLetter); err != nil {
		errs = append(errs, err)
	}
	if d.VisibilityTimeout < 0 || (d.VisibilityTimeout > 0 && d.VisibilityTimeout < time.Second) {
		errs = append(errs, fmt.Errorf("visibility_timeout is %s; use 0 (deliver inside the claim) or at least 1s", d.VisibilityTimeout))
	}
	if d.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("max_in_flight is %d; it must not be negative", d.MaxInFlight))
	}
	for _, part := range []struct {
		at  string
		err error
	}{{"breaker.", d.Breaker.Validate()}, {"retry_budget.", d.RetryBudget.Validate()}, {"rate_limit.", d.RateLimit.Validate()}} {
		errs = append(errs, problems.Errors(part.at, part.err)...)
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errs
}

// ValidateOnDeadLetter checks a dead-letter policy: release, block, or
// empty for the default.
func ValidateOnDeadLetter(policy string) error {
	switch policy {
	case "", OnDeadLetterRelease, OnDeadLetterBlock:
		return nil
	}
	return fmt.Errorf("on_dead_letter is %q; use release or block", policy)
}

// Dest is a destination at work: it owns what decides whether its rows go
// now (its breaker, paused topics and partitions, bulkhead and retry
// budget), behind admit and take, and learns from each publish in settle.
type Dest struct {
	Destination
	block   bool
	breaker *breaker
	pauses  *pauseSet
	parts   sink.Partitioner // nil: partitions are not known
	bulk    bulkhead
	gates   []gate // bulk, rate, budget
	// fleetMax is MaxInFlight as configured, shared by the fleet; 0 when
	// unlimited or not in a fleet.
	fleetMax int
	rate     *rateLimit // nil: unlimited
	budget   *retryBudget
	policy   *retry.Policy
	// pauseBase is how long a deferred row waits when no breaker says;
	// pauseMax, the longest cool-down, how much longer a failed probe's
	// rows wait than the rest.
	pauseBase, pauseMax time.Duration
	// Publishing counts the rows handed to the publisher and not yet
	// answered.
	Publishing atomic.Int64
	// Freed wakes the idle workers: a full bulkhead has a slot again.
	Freed func()
	// waiter says a batch claimed with the destination's rows waits for
	// a slot of its full bulkhead: one at a time.
	waiter atomic.Bool
	// changes are the breaker's latest changes, oldest first.
	changesMu sync.Mutex
	changes   []BreakerChange
	// holds are the rows held while it, a topic or a partition was down.
	holds holds
	// pings are what pinging its server showed while its breaker is open.
	pings pingWatch
	log   *slog.Logger
}

// BreakerChange is a change of a destination's breaker, as this replica
// saw it.
type BreakerChange struct {
	// Seq numbers the relay's changes, across its destinations, from 1.
	Seq         uint64
	At          time.Time
	Destination string
	From, To    BreakerState
	// Cooldown is how long an opening lasts before a probe.
	Cooldown  time.Duration
	LastError string
	// ByFleet says another replica made it and this one adopted it.
	ByFleet bool
}

// maxChanges is how many of its breaker's changes a destination keeps.
const maxChanges = 32

// changeSeq numbers the breakers' changes.
var changeSeq atomic.Uint64

// noteChange keeps c, numbered, among the latest changes, and returns it.
func (d *Dest) noteChange(c BreakerChange) BreakerChange {
	d.changesMu.Lock()
	defer d.changesMu.Unlock()
	c.Seq = changeSeq.Add(1)
	if len(d.changes) == maxChanges {
		d.changes = append(d.changes[:0], d.changes[1:]...)
	}
	d.changes = append(d.changes, c)
	return c
}

// Settings are what a destination at work takes from the relay's
// configuration.
type Settings struct {
	// OnDeadLetter is the relay's policy, for a destination without one.
	OnDeadLetter string
	// InFleet says MaxInFlight is shared by a fleet of replicas.
	InFleet bool
	// LeasedBound bounds the rows a destination with a visibility timeout
	// holds: the workers' batches, at the largest.
	LeasedBound int
	// PauseBase and PauseMax are the shortest and longest cool-downs.
	PauseBase, PauseMax time.Duration
	Policy              *retry.Policy
	Logger              *slog.Logger
	// Changed hears of every change of the breaker.
	Changed *testsignal.Signal[BreakerChange]
}

// NewDest readies d under cfg, its defaults applied.
func NewDest(d Destination, cfg Settings) *Dest {
	changed := cfg.Changed
	if d.OnDeadLetter == "" {
		d.OnDeadLetter = cfg.OnDeadLetter
	}
	d.Breaker = d.Breaker.WithDefaults()
	if d.Partitioner == nil {
		d.Partitioner, _ = d.Publisher.(sink.Partitioner)
	}
	fleetMax := 0
	if cfg.InFleet {
		fleetMax = d.MaxInFlight
	}
	if d.VisibilityTimeout > 0 {
		// Leased deliveries outlive their batch: bound them as the
		// workers' batches are, so memory stays bounded.
		if limit := cfg.LeasedBound; d.MaxInFlight == 0 || d.MaxInFlight > limit {
			d.MaxInFlight = limit
		}
	}
	log := cfg.Logger.With(slog.String("destination", d.Name))
	x := &Dest{
		Destination: d,
		block:       d.OnDeadLetter == OnDeadLetterBlock,
		parts:       d.Partitioner,
		bulk:        bulkhead{max: d.MaxInFlight, limited: d.MaxInFlight > 0},
		fleetMax:    fleetMax,
		budget:      newRetryBudget(d.RetryBudget),
		rate:        newRateLimit(d.RateLimit),
		policy:      cfg.Policy,
		pauseBase:   cfg.PauseBase,
		pauseMax:    cfg.PauseMax,
		pauses:      newPauseSet(d.Name, cfg.PauseBase, cfg.PauseMax, log),
		log:         log,
	}
	x.pauses.closed = func(s subject) { x.holds.release(s, time.Now()) }
	x.pauses.starved = func(s subject) { x.holds.releaseProbes(s, time.Now()) }
	// The limits an admitted row passes, in order (see Take).
	x.gates = []gate{&x.bulk, x.rate, x.budget}
	x.breaker = &breaker{failures: d.Breaker.Failures, successes: d.Breaker.Successes,
		failingRows: d.Breaker.FailingRows, failingFor: d.Breaker.FailingFor, base: cfg.PauseBase, max: cfg.PauseMax,
		onChange: func(from, to BreakerState, cooldown time.Duration, lastErr string, byFleet bool) {
			changed.Send(x.noteChange(BreakerChange{At: time.Now(), Destination: d.Name, From: from, To: to,
				Cooldown: cooldown, LastError: lastErr, ByFleet: byFleet}))
			switch {
			case to == BreakerOpen && byFleet && from == BreakerHalfOpen:
				log.Info("another replica's probe failed; circuit open again", slog.Duration("cooldown", cooldown))
			case to == BreakerOpen && byFleet:
				log.Warn("destination failing at another replica; circuit opened, its rows wait without counting attempts",
					slog.Duration("cooldown", cooldown), slog.String("error", lastErr))
			case to == BreakerOpen:
				log.Warn("destination failing; circuit opened, its rows wait without counting attempts",
					slog.Duration("cooldown", cooldown), slog.String("error", lastErr))
			case to == BreakerHalfOpen:
				log.Info("circuit half-open; the destination may be probed")
			case to == BreakerClosed && byFleet:
				log.Info("destination recovered, probed by another replica; circuit closed")
			case to == BreakerClosed:
				log.Info("destination recovered; circuit closed")
			}
			if to == BreakerClosed {
				x.holds.release(destWide, time.Now())
			}
		},
		// The rows held for the outage go once a probe is answered, not
		// only once the breaker closes: the next probes take them, rather
		// than starving behind them for a cool-down while every key of
		// the traffic waits behind them.
		onAnswer: func() { x.holds.release(destWide, time.Now()) },
	}
	return x
}

// Group is the share of one batch that goes to one destination: its rows,
// in id order, what the destination admitted them under, and what their
// publish returned.
type Group struct {
	Dest *Dest
	// Owner is the source of the batch's rows, for the rows the
	// destination holds (see Released); nil remembers none.
	Owner any
	Adm   admission // the breaker's, for the whole batch
	Recs  []sink.Record
	Errs  []error
	Token uuid.UUID // the lease, for a destination with a visibility timeout
	// asked are the pauses asked about in this batch (the first ask of a
	// cooled-down pause takes its probe, so each is asked once); pauses,
	// those whose probe the group carries; parts, by index into recs, the
	// partition of each row admitted as a partition's probe.
	asked  map[subject]admission
	pauses map[subject]admission
	parts  map[int]int
	mix    *probeMix // what a destination probe holds so far
	// probing is what each pause's probe holds so far.
	probing map[subject]*probeMix

	Claimed time.Time // the database clock at the claim
	Start   time.Time // the local clock when the claim began
	Done    time.Time // the local clock when the publish returned
}

// Probe says the group is its destination's probe: the breaker lets a
// few rows through to see whether the destination is back.
func (g *Group) Probe() bool { return g.Adm.probe }

// Acked is when the group's publish returned, by the database clock.
func (g *Group) Acked() time.Time { return g.Claimed.Add(g.Done.Sub(g.Start)) }

// Begin starts the destination's group of a batch: the breaker is asked
// once a batch.
func (d *Dest) Begin(now time.Time, rows int) *Group {
	g := &Group{Dest: d, Adm: d.breaker.admit(now)}
	if g.Adm.probe {
		g.mix = &probeMix{keys: map[string]bool{}, topics: map[string]int{}}
	} else if g.Adm.ok {
		g.Recs = make([]sink.Record, 0, rows)
	}
	return g
}

// Verdict is what admission says of one row.
type Verdict int

const (
	Admitted Verdict = iota
	// Held: the row waits for a later batch, untouched.
	Held
	// Deferred: the row waits without counting an attempt; its outcome
	// says for how long.
	Deferred
)

// Admit asks the breaker and the pauses whether rec, bound for topic, may
// go in g now. A paused topic or partition holds its rows; its probe, as
// a destination's, takes a few rows of different keys; the rest of the
// batch's rows there wait for a later batch. On admitted, the row is the
// group's to take (see Take), with the pauses whose probe it joins.
func (d *Dest) Admit(g *Group, rec sink.Record, topic string, now time.Time) (Verdict, store.Outcome, []subject) {
	if !g.Adm.ok {
		d.holds.hold(destWide, g.Owner, rec.ID, rec.RetryCount, now, g.Adm.until.Sub(now), false)
		return Deferred, d.deferral(rec, DeferCircuitOpen, g.Adm.until.Sub(now)), nil
	}
	var paused []subject
	if !d.pauses.empty() {
		var reason string
		var until time.Time
		var by subject
		paused, reason, until, by = d.askPauses(g, rec, topic, now)
		if reason != "" {
			d.holds.hold(by, g.Owner, rec.ID, rec.RetryCount, now, until.Sub(now), false)
			return Deferred, d.deferral(rec, reason, until.Sub(now)), nil
		}
	}
	if g.Adm.probe && !g.mix.fits(rec, topic, len(g.Recs)) {
		return Held, store.Outcome{}, nil
	}
	for _, s := range paused {
		if m := g.probing[s]; m != nil && !m.fitsPause(rec) {
			return Held, store.Outcome{}, nil
		}
	}
	return Admitted, store.Outcome{}, paused
}

func (d *Dest) deferral(rec sink.Record, reason string, wait time.Duration) store.Outcome {
	return store.Outcome{ID: rec.ID, Kind: store.Deferred, Delay: max(wait, time.Millisecond), Reason: reason, Destination: d.Name}
}

// Add puts an admitted and taken rec, bound for topic, in g.
func (g *Group) Add(rec sink.Record, topic string, paused []subject) {
	if g.Adm.probe {
		g.mix.add(rec, topic)
	}
	for _, sj := range paused {
		if g.pauses == nil {
			g.pauses = map[subject]admission{}
		}
		g.pauses[sj] = g.asked[sj]
		if g.asked[sj].probe {
			if g.probing == nil {
				g.probing = map[subject]*probeMix{}
			}
			m := g.probing[sj]
			if m == nil {
				m = &probeMix{keys: map[string]bool{}, topics: map[string]int{}}
				g.probing[sj] = m
			}
			m.add(rec, topic)
		}
		if sj.partition != wholeTopic {
			if g.parts == nil {
				g.parts = map[int]int{}
			}
			g.parts[len(g.Recs)] = sj.partition
		}
	}
	rec.Topic = topic
	g.Recs = append(g.Recs, rec)
}

// askPauses checks rec, bound for topic, against the destination's paused
// topic and partitions. It returns the pauses whose probe rec joins, or,
// when rec must wait, the deferral reason, until when, and the pause that
// holds it.
func (d *Dest) askPauses(g *Group, rec sink.Record, topic string, now time.Time) (probes []subject, reason string, until time.Time, by subject) {
	ask := func(s subject) (admission, bool) {
		if a, ok := g.asked[s]; ok {
			return a, true
		}
		a, tracked := d.pauses.admit(s, now)
		if tracked {
			if g.asked == nil {
				g.asked = map[subject]admission{}
			}
			g.asked[s] = a
		}
		return a, tracked
	}
	s := subject{topic: topic, partition: wholeTopic}
	if a, tracked := ask(s); tracked {
		if !a.ok {
			return nil, DeferTopicPaused, a.until, s
		}
		probes = append(probes, s)
	}
	if d.parts != nil && d.pauses.hasPartitions(topic) {
		rec.Topic = topic
		if part, ok := d.parts.Partition(rec); ok {
			s := subject{topic: topic, partition: part}
			if a, tracked := ask(s); tracked {
				if !a.ok {
					return nil, DeferPartitionPaused, a.until, s
				}
				probes = append(probes, s)
			}
		}
	}
	return probes, "", time.Time{}, subject{}
}

// Planned gives back the probes that a group's plan took but that carry
// no row (all its rows stayed behind): another batch probes instead.
func (d *Dest) Planned(g *Group) {
	if len(g.Recs) == 0 && g.Adm.probe {
		d.breaker.abandoned(g.Adm.gen)
	}
	for s, a := range g.asked {
		if _, carried := g.pauses[s]; a.probe && !carried {
			d.pauses.abandoned(s, a.gen)
		}
	}
}

// Abandon gives back the probe slots of a group whose publish never
// finished, or never started.
func (d *Dest) Abandon(g *Group) {
	if g.Adm.probe {
		d.breaker.abandoned(g.Adm.gen)
	}
	for s, a := range g.pauses {
		if a.probe {
			d.pauses.abandoned(s, a.gen)
		}
	}
}

// Release gives back the group's bulkhead slots once its rows are settled,
// and wakes the idle workers if rows were held back for want of one.
func (d *Dest) Release(g *Group) {
	if d.bulk.give(len(g.Recs)) && d.Freed != nil {
		d.Freed()
	}
}

// Closed reports whether the destination takes no rows now (its breaker
// open or probing, its bulkhead full or its rate limit spent) and until
// when, or else the topics it has paused as a whole and how long the
// earliest stays so.
//
// A destination closed only because its bulkhead is full stays open to
// claims that may wait for a slot: wait takes the destination's one place
// for a waiting batch, and says whether it got it (see SlotWaits).
func (d *Dest) Closed(now time.Time, wait func(*Dest) bool) (blocked bool, until time.Time, topics []string, left time.Duration) {
	if d.breaker.starved(now) {
		d.holds.releaseProbes(destWide, now)
	}
	blocked, until = d.breaker.blocked(now)
	if !blocked {
		if w := d.rate.wait(now); w > 0 {
			blocked, until = true, now.Add(w)
		}
	}
	if !blocked && d.bulk.full() && (wait == nil || !wait(d)) {
		blocked, until = true, now.Add(bulkheadRecheck)
	}
	if blocked {
		return true, until, nil, 0
	}
	topics, left = d.pauses.blockedTopics(now)
	return false, time.Time{}, topics, left
}

// bulkheadRecheck is how long rows behind a row of a destination with a
// full bulkhead wait: deliveries finish quickly or time out. The row
// itself is claimed as soon as a slot is free (see release).
const bulkheadRecheck = 100 * time.Millisecond

// Blocks says a dead letter parks its key (on_dead_letter: block).
func (d *Dest) Blocks() bool { return d.block }

// Room is the bulkhead's free slots and limit now, ok false when it has
// none.
func (d *Dest) Room() (free, limit int, ok bool) { return d.bulk.room() }

// Lends reports whether the replica holds slots of the fleet's in-flight
// limit that other replicas want: it lends what it does not use at its
// next syncs, so it must not rest between them.
func (d *Dest) Lends() bool { return d.bulk.lends() }

// BreakerState is the breaker's state, and until when an open one stays
// open.
func (d *Dest) BreakerState() (BreakerState, time.Time) { return d.breaker.snapshot() }

// DestinationStatus is a destination's state, for readiness and metrics.
type DestinationStatus struct {
	Name    string
	Breaker BreakerState
	// OpenUntil is when an open breaker lets a probe through.
	OpenUntil time.Time
	// LastError is the failure that opened the breaker, or the latest
	// probe's, while it is not closed.
	LastError string
	// Paused are the destination's paused topics and partitions.
	Paused []PauseStatus
	// InFlight counts the rows being published to it now; MaxInFlight
	// is this replica's limit now (its share of FleetMaxInFlight in a
	// fleet), 0 for none.
	InFlight, MaxInFlight int
	// FleetMaxInFlight is the limit across the fleet, 0 outside one.
	FleetMaxInFlight int
	// RateLimit is the destination's rows per second, 0 for none.
	RateLimit float64
	// Changes are the breaker's latest changes, oldest first.
	Changes []BreakerChange
}

// Status is the destination's state now.
func (d *Dest) Status() DestinationStatus {
	state, until := d.breaker.snapshot()
	st := DestinationStatus{Name: d.Name, Breaker: state, Paused: d.pauses.status(), InFlight: int(d.Publishing.Load()),
		FleetMaxInFlight: d.fleetMax, RateLimit: d.RateLimit.PerSecond}
	d.bulk.mu.Lock()
	st.MaxInFlight, _ = d.bulk.limit()
	d.bulk.mu.Unlock()
	d.changesMu.Lock()
	st.Changes = append([]BreakerChange(nil), d.changes...)
	d.changesMu.Unlock()
	if state == BreakerOpen {
		st.OpenUntil = until
	}
	if state != BreakerClosed {
		st.LastError = d.breaker.lastError()
	}
	return st
}
