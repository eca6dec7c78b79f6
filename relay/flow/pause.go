package flow

import (
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// subject is a part of a destination that can pause on its own: a topic
// (partition -1) or one partition of it. Topics are the ones published,
// after a route's rename.
type subject struct {
	topic     string
	partition int
}

// wholeTopic is the partition of a subject that is a whole topic.
const wholeTopic = -1

// maxPauses bounds the topics and partitions a destination keeps paused at
// once, whatever the producers write. Failures past it still follow the
// retry policy; they only do not pause their topic.
const maxPauses = 1000

// pauseSet holds the paused topics and partitions of one destination, each
// with a breaker of its own: it opens on the first failure that speaks for
// the whole topic or partition, for a cool-down that doubles while probes
// fail; when it cools down, the next batch's rows of the topic or
// partition go as the probe, and one success closes it. A closed pause is
// forgotten, as is a half-open one that no row probed within the longest
// cool-down: nothing was sent there to say it is still failing.
type pauseSet struct {
	dest      string
	base, max time.Duration
	log       *slog.Logger

	n     atomic.Int32 // len(m), read without the lock on every row
	mu    sync.Mutex
	m     map[subject]*breaker
	parts map[string]int // paused partitions by topic
	// closed is told of a pause that closed: its topic or partition
	// answers again.
	closed func(s subject)
	// starved is told of a half-open pause with nothing to probe with.
	starved func(s subject)
}

func newPauseSet(dest string, base, max time.Duration, log *slog.Logger) *pauseSet {
	return &pauseSet{dest: dest, base: base, max: max, log: log, m: map[subject]*breaker{}, parts: map[string]int{}}
}

// empty reports, without locking, whether nothing is paused.
func (p *pauseSet) empty() bool { return p.n.Load() == 0 }

// admit says whether rows of s may be published now; tracked is false
// when s is not paused, and its rows go as usual.
func (p *pauseSet) admit(s subject, now time.Time) (a admission, tracked bool) {
	if p.empty() {
		return admission{ok: true}, false
	}
	p.mu.Lock()
	b := p.m[s]
	p.mu.Unlock()
	if b == nil {
		return admission{ok: true}, false
	}
	return b.admit(now), true
}

// hasPartitions reports whether a partition of topic is paused.
func (p *pauseSet) hasPartitions(topic string) bool {
	if p.empty() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.parts[topic] > 0
}

// result feeds a publish's evidence about s. tracked says the rows were
// admitted under s's pause (gen and probe are that admission's); rows
// admitted before s was paused say nothing about it, except that a failure
// of s pauses s when it is not paused yet. It returns how long s stays
// paused from now, 0 when it is not.
func (p *pauseSet) result(now time.Time, s subject, tracked bool, gen int, probe bool, ev evidence) time.Duration {
	failed := ev.systemic+ev.transient > 0
	p.mu.Lock()
	b := p.m[s]
	if b == nil {
		if !failed || len(p.m) >= maxPauses {
			p.mu.Unlock()
			return 0
		}
		b = p.newBreaker(s)
		b.feed(now, ev) // under p.mu: the pause is not shared yet
		if b.state != BreakerOpen {
			p.mu.Unlock()
			return 0
		}
		p.m[s] = b
		p.n.Store(int32(len(p.m)))
		if s.partition != wholeTopic {
			p.parts[s.topic]++
		}
		p.mu.Unlock()
		return b.until.Sub(now)
	}
	p.mu.Unlock()
	if !tracked {
		gen = -1 // stale: admitted before the pause
	}
	left := b.result(now, gen, ev, probe)
	p.forgetClosed(s, b)
	return left
}

// abandoned returns the probe slot of s, whose publish never finished.
func (p *pauseSet) abandoned(s subject, gen int) {
	p.mu.Lock()
	b := p.m[s]
	p.mu.Unlock()
	if b != nil {
		b.abandoned(gen)
	}
}

// forgetClosed drops s once its breaker b has closed.
func (p *pauseSet) forgetClosed(s subject, b *breaker) {
	if state, _ := b.snapshot(); state != BreakerClosed {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m[s] == b {
		p.remove(s)
	}
}

// remove drops s; p.mu is held.
func (p *pauseSet) remove(s subject) {
	delete(p.m, s)
	p.n.Store(int32(len(p.m)))
	if s.partition != wholeTopic {
		if p.parts[s.topic]--; p.parts[s.topic] <= 0 {
			delete(p.parts, s.topic)
		}
	}
}

// blockedTopics returns the topics paused as a whole that take no rows now
// (open, or probing), and how long the earliest of them stays so. It
// forgets the half-open pauses that no row probed for twice the longest
// cool-down.
func (p *pauseSet) blockedTopics(now time.Time) ([]string, time.Duration) {
	if p.empty() {
		return nil, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var topics []string
	var soonest time.Duration
	for s, b := range p.m {
		b.mu.Lock()
		b.cooled(now)
		// The rows of its last probe, if it failed, come back a longest
		// cool-down after it ended (see settle): stale only past them.
		stale := b.state == BreakerHalfOpen && !b.probing && now.Sub(b.until) > 2*p.max+p.base
		starved := b.starvedLocked(now)
		b.mu.Unlock()
		if starved && p.starved != nil {
			p.starved(s)
		}
		if stale {
			p.log.Info("no rows probed a paused "+s.kind()+" for a while; no longer paused", s.attrs()...)
			p.remove(s)
			continue
		}
		if s.partition != wholeTopic {
			continue
		}
		blocked, until := b.blocked(now)
		if !blocked {
			continue
		}
		topics = append(topics, s.topic)
		if left := until.Sub(now); soonest == 0 || left < soonest {
			soonest = left
		}
	}
	return topics, soonest
}

// PauseStatus is a paused topic, or partition of a topic, of a destination.
type PauseStatus struct {
	// Topic is the topic as published.
	Topic string
	// Partition is the paused partition, or -1 when the whole topic is.
	Partition int
	// State is the pause's breaker: open while the topic or partition
	// waits, half-open while its next rows probe it.
	State BreakerState
	// OpenUntil is when an open pause lets a probe through.
	OpenUntil time.Time
	// LastError is the failure that paused it, or the latest probe's.
	LastError string
}

// status reports every pause, topics first, in name order.
func (p *pauseSet) status() []PauseStatus {
	if p.empty() {
		return nil
	}
	p.mu.Lock()
	out := make([]PauseStatus, 0, len(p.m))
	for s, b := range p.m {
		state, until := b.snapshot()
		b.mu.Lock()
		lastErr := b.lastErr
		b.mu.Unlock()
		st := PauseStatus{Topic: s.topic, Partition: s.partition, State: state, LastError: lastErr}
		if state == BreakerOpen {
			st.OpenUntil = until
		}
		out = append(out, st)
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}

// newBreaker makes the breaker of a new pause of s: the first failure
// opens it, the first successful probe closes it.
func (p *pauseSet) newBreaker(s subject) *breaker {
	attrs := s.attrs()
	kind := s.kind()
	return &breaker{failures: 1, successes: 1, base: p.base, max: p.max,
		onChange: func(from, to BreakerState, cooldown time.Duration, lastErr string, _ bool) {
			switch to {
			case BreakerOpen:
				p.log.Warn(kind+" failing; paused, its rows wait while the rest of the destination flows",
					slices.Concat(attrs, []any{slog.Duration("cooldown", cooldown), slog.String("error", lastErr)})...)
			case BreakerHalfOpen:
				p.log.Info(kind+" pause cooled down; its next rows probe it", attrs...)
			case BreakerClosed:
				p.log.Info(kind+" recovered; no longer paused", attrs...)
				if p.closed != nil {
					p.closed(s)
				}
			}
		}}
}

func (s subject) kind() string {
	if s.partition == wholeTopic {
		return "topic"
	}
	return "partition"
}

func (s subject) attrs() []any {
	attrs := []any{slog.String("topic", s.topic)}
	if s.partition != wholeTopic {
		attrs = append(attrs, slog.Int("partition", s.partition))
	}
	return attrs
}
