package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

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
	for _, held := range []bool{true, false} {
		if err := r.soak(ctx, bin, held); err != nil {
			return fmt.Errorf("soak (held snapshot %v): %w", held, err)
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

func (r *runner) soak(ctx context.Context, bin string, held bool) error {
	const producers, keys = 8, 1000
	phase := "no snapshot"
	if held {
		phase = "held snapshot"
	}
	e, err := r.newEnv(ctx, producers+2)
	if err != nil {
		return err
	}
	defer e.close()
	statementsReady(ctx, e.pool)

	book := newAckBook()
	watchAcks(e.cluster, "bench", book.acked)

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

	relays, err := startRelays(ctx, bin, r.relayEnv(e, false), 1)
	if err != nil {
		return err
	}
	defer relays.stop()
	pid := relays.cmds[0].Process.Pid

	payload := make([]byte, r.cfg.PayloadBytes)
	interval := time.Duration(float64(time.Second) * producers * 4 / float64(r.cfg.SoakRate))
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

	err = parallel(producers, func(p int) error {
		rng := rand.New(rand.NewPCG(uint64(p), uint64(loadStart.UnixNano())))
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			ks := make([]string, 1+rng.IntN(7))
			for i := range ks {
				ks[i] = "key-" + strconv.Itoa(rng.IntN(keys))
			}
			var ids []int64
			err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				rows, err := tx.Query(ctx, `INSERT INTO outbox (topic, key, payload)
					SELECT 'bench', k, $2 FROM unnest($1::text[]) AS k RETURNING id`, ks, payload)
				if err != nil {
					return err
				}
				ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
				return err
			})
			if err != nil {
				return err
			}
			book.committed(ids, time.Now())
		}
		return nil
	})
	if err != nil {
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

// ackBook records when each row was committed and when the broker first
// received it, by the row's id.
type ackBook struct {
	mu                   sync.Mutex
	commit, ack          []time.Time // by id
	committedN, ackedN   int64
	ackedBeforeCommitted map[int64]time.Time
}

func newAckBook() *ackBook { return &ackBook{ackedBeforeCommitted: map[int64]time.Time{}} }

func grow(s []time.Time, id int64) []time.Time {
	if int(id) < len(s) {
		return s
	}
	return append(s, make([]time.Time, int(id)+1-len(s)+len(s)/2)...)
}

func (b *ackBook) committed(ids []int64, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		b.commit = grow(b.commit, id)
		b.commit[id] = at
		b.committedN++
	}
}

func (b *ackBook) acked(id int64, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ack = grow(b.ack, id)
	if b.ack[id].IsZero() {
		b.ack[id] = at
		b.ackedN++
	}
}

func (b *ackBook) unacked() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.committedN - b.ackedN
}

// byInterval returns the commit → ack latency of the rows committed in
// each interval since start.
func (b *ackBook) byInterval(start time.Time, interval time.Duration) [][]time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out [][]time.Duration
	for id, c := range b.commit {
		if c.IsZero() {
			continue
		}
		i := int(c.Sub(start) / interval)
		for len(out) <= i {
			out = append(out, nil)
		}
		var a time.Time
		if id < len(b.ack) {
			a = b.ack[id]
		}
		// An ack can land before the producer reads the clock after its
		// commit returns: a latency of about zero.
		out[i] = append(out[i], max(0, a.Sub(c)))
	}
	return out
}

// watchAcks has the broker tell each row it receives for topic, by the
// outbox-id header of its record, as it receives it.
func watchAcks(c *kfake.Cluster, topic string, acked func(id int64, at time.Time)) {
	kafkatest.WatchProduce(c, func(t string, _ int32, rec *kmsg.Record) {
		if t != topic {
			return
		}
		for _, h := range rec.Headers {
			if h.Key == "outbox-id" {
				if id, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
					acked(id, time.Now())
				}
			}
		}
	})
}
