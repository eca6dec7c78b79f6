package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// soaks offers the outbox-relay binary, at its default configuration, a
// steady load for SoakFor: SoakRate rows a second in transactions of one to
// seven rows over 1000 keys, first with a session of the same database
// holding a REPEATABLE READ snapshot throughout, then without. Each
// SoakMinute it reports commit → broker ack percentiles of the rows
// committed in it, what the claims cost the database (pg_stat_statements),
// the CPU a row of the relay, its backends and the whole server, and the
// most rows committed but not yet acknowledged. After the load, the relay
// idles on the empty outbox for SoakIdle (the snapshot still held): its
// CPU and its backends' is the idle cost.
//
// A held snapshot keeps every row deleted since it began: their entries
// stay in the outbox's indexes, and a statement that reads an index from
// its head passes over all of them.
func (r *runner) soaks(ctx context.Context) error {
	if r.cfg.SoakFor <= 0 {
		return nil
	}
	bin, cleanup, err := r.binary(ctx)
	if err != nil {
		return err
	}
	defer cleanup()
	for _, p := range []struct {
		mode string
		held bool
	}{{"table", true}, {"table", false}, {"log", true}} {
		if err := r.soak(ctx, bin, p.mode, p.held); err != nil {
			return fmt.Errorf("soak (%s, held snapshot %v): %w", p.mode, p.held, err)
		}
	}
	return nil
}

// soakMinute is what one interval of a soak measured.
type soakMinute struct {
	rows       int64
	unacked    int64 // the most rows committed and not yet acknowledged
	spent      spent
	relayCPU   time.Duration
	latencies  []time.Duration
	intervalOf time.Duration
}

func (r *runner) soak(ctx context.Context, bin, mode string, held bool) error {
	const producers = 8
	phase := "no snapshot"
	if held {
		phase = "held snapshot"
	}
	if mode == "log" {
		phase = "log, " + phase
	}
	e, err := r.newEnv(ctx, producers+2)
	if err != nil {
		return err
	}
	defer e.close()
	statementsReady(ctx, e.pool)

	book := newEventBook()
	watchEventAcks(e.cluster, "bench", book.acked)

	relays, cleanup, err := r.startCapture(ctx, bin, e, mode)
	if err != nil {
		return err
	}
	defer cleanup()
	if held {
		conn, err := e.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		// The snapshot is taken by the first statement and held until
		// the transaction ends.
		if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		defer conn.Exec(context.WithoutCancel(ctx), "ROLLBACK") //nolint:errcheck // the connection is released either way
	}

	pid := relays.cmds[0].Process.Pid

	loadStart := time.Now()
	deadline := loadStart.Add(r.cfg.SoakFor)
	minutes := int((r.cfg.SoakFor + r.cfg.SoakMinute - 1) / r.cfg.SoakMinute)
	stats := make([]soakMinute, minutes)

	// The sampler: each second, rows committed and not yet acknowledged;
	// each minute, the database's and the relay's spending.
	sampled := make(chan error, 1)
	go func() {
		tick := time.NewTicker(min(time.Second, r.cfg.SoakMinute/4))
		defer tick.Stop()
		prev, prevCPU := readCost(ctx, e.pool, e.schema), relayCPU(pid)
		for m := 0; m < minutes; {
			select {
			case <-ctx.Done():
				sampled <- ctx.Err()
				return
			case now := <-tick.C:
				i := min(int(now.Sub(loadStart)/r.cfg.SoakMinute), minutes-1)
				stats[i].unacked = max(stats[i].unacked, book.unacked())
				if now.Before(loadStart.Add(time.Duration(m+1) * r.cfg.SoakMinute)) {
					continue
				}
				cur, cpu := readCost(ctx, e.pool, e.schema), relayCPU(pid)
				stats[m].spent, stats[m].relayCPU = prev.until(cur), cpu-prevCPU
				prev, prevCPU = cur, cpu
				m++
			}
		}
		sampled <- nil
	}()

	if err := r.produce(ctx, e, mode, producers, r.cfg.SoakRate, deadline, book); err != nil {
		return err
	}
	if err := <-sampled; err != nil {
		return err
	}
	if err := waitUntil(ctx, 5*time.Minute, func() bool { return book.unacked() == 0 }); err != nil {
		return fmt.Errorf("%d rows committed were not acknowledged within 5 minutes of the load's end", book.unacked())
	}
	for i, lat := range book.byInterval(loadStart, r.cfg.SoakMinute) {
		if i < minutes {
			stats[i].latencies = lat
			stats[i].rows = int64(len(lat))
		}
	}

	// Idle: the outbox is empty; the snapshot, if any, still held.
	idleFrom, idleCPU := readCost(ctx, e.pool, e.schema), relayCPU(pid)
	idleStart := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(r.cfg.SoakIdle):
	}
	idle := idleFrom.until(readCost(ctx, e.pool, e.schema))
	idleRelay := relayCPU(pid) - idleCPU
	idleFor := time.Since(idleStart)
	if err := relays.stop(); err != nil {
		return err
	}

	for i, m := range stats {
		name := fmt.Sprintf("%s, minute %d: p99 commit→ack", phase, i+1)
		if r.cfg.SoakMinute != time.Minute {
			name = fmt.Sprintf("%s, interval %d of %s: p99 commit→ack", phase, i+1, r.cfg.SoakMinute)
		}
		detail := fmt.Sprintf("p50 %.1f ms; %d rows (%.0f/s); %s; relay %.1f µs CPU a row; %s; at most %d rows unacknowledged",
			ms(percentile(m.latencies, 50)), m.rows, float64(m.rows)/r.cfg.SoakMinute.Seconds(), m.spent.claimsNote(),
			us(m.relayCPU)/float64(max(m.rows, 1)), m.spent.perRow(m.rows), m.unacked)
		detail += fmt.Sprintf("; max %.0f ms", ms(percentile(m.latencies, 100)))
		if note := m.spent.statementsNote(m.rows, 6); note != "" {
			detail += "; " + note
		}
		r.add(Result{Group: "soak", Name: name, Value: ms(percentile(m.latencies, 99)), Unit: "ms", Detail: detail})
	}
	first, last := stats[0].spent, stats[len(stats)-1].spent
	if first.statements && first.claims > 0 && last.claims > 0 {
		a := float64(first.claimBuffers) / float64(first.claims)
		b := float64(last.claimBuffers) / float64(last.claims)
		r.add(Result{Group: "soak", Name: phase + ": buffers a claim, last interval ÷ first", Value: b / a, Unit: "×",
			Detail: fmt.Sprintf("%.0f → %.0f buffers a claim", a, b)})
	}
	share := 100 * float64(idleRelay+idle.relayBackends) / float64(idleFor)
	detail := fmt.Sprintf("relay %.2f%%, its backends %.2f%% of a core over %s on an empty outbox; %s",
		100*float64(idleRelay)/float64(idleFor), 100*float64(idle.relayBackends)/float64(idleFor), idleFor.Round(time.Second), idle.claimsNote())
	if !idle.cpu {
		detail += "; the server's processes are not visible here: the backends' CPU is left out"
	}
	if note := idle.statementsNote(0, 6); note != "" {
		detail += "; " + note
	}
	if w := relays.warnings(); w != "" {
		detail += "; the relay warned: " + w
	}
	r.add(Result{Group: "soak", Name: phase + ": idle relay and its backends", Value: share, Unit: "% of a core", Detail: detail})
	return nil
}

// relayCPU is the relay process's CPU time, 0 where /proc does not show it.
func relayCPU(pid int) time.Duration {
	t, _ := processCPU(pid)
	return t
}

// eventBook records when each message committed and was first
// acknowledged, by event id.
type eventBook struct {
	mu      sync.Mutex
	pending map[uuid.UUID]time.Time // committed, not yet acknowledged
	early   map[uuid.UUID]time.Time // acknowledged before its commit was recorded
	done    []delivery
}

// delivery is one message's commit and its latency to the broker's ack.
type delivery struct {
	commit time.Time
	lat    time.Duration
}

func newEventBook() *eventBook {
	return &eventBook{pending: map[uuid.UUID]time.Time{}, early: map[uuid.UUID]time.Time{}}
}

func (b *eventBook) committed(ids []uuid.UUID, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		if acked, ok := b.early[id]; ok {
			// An ack can land before the producer reads the clock after
			// its commit returns: a latency of about zero.
			delete(b.early, id)
			b.done = append(b.done, delivery{at, max(acked.Sub(at), 0)})
			continue
		}
		b.pending[id] = at
	}
}

func (b *eventBook) acked(id uuid.UUID, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.pending[id]
	if !ok {
		if _, dup := b.early[id]; !dup {
			b.early[id] = at
		}
		return
	}
	delete(b.pending, id)
	b.done = append(b.done, delivery{c, at.Sub(c)})
}

func (b *eventBook) unacked() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int64(len(b.pending))
}

func (b *eventBook) latencies() []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	lat := make([]time.Duration, len(b.done))
	for i, d := range b.done {
		lat[i] = d.lat
	}
	return lat
}

// byInterval returns the commit → ack latency of the messages committed
// in each interval since start.
func (b *eventBook) byInterval(start time.Time, interval time.Duration) [][]time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out [][]time.Duration
	for _, d := range b.done {
		i := max(int(d.commit.Sub(start)/interval), 0)
		for len(out) <= i {
			out = append(out, nil)
		}
		out[i] = append(out[i], d.lat)
	}
	return out
}

// watchEventAcks calls acked for each record of topic the broker
// receives, with its event id.
func watchEventAcks(c *kfake.Cluster, topic string, acked func(id uuid.UUID, at time.Time)) {
	kafkatest.WatchProduce(c, func(t string, _ int32, rec *kmsg.Record) {
		if t != topic {
			return
		}
		for _, h := range rec.Headers {
			if h.Key == kafka.HeaderEventID {
				if id, err := uuid.Parse(string(h.Value)); err == nil {
					acked(id, time.Now())
				}
			}
		}
	})
}
