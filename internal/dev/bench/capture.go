package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/internal/db/schema"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/logsource"
)

// captures compares the two sources of rows at the binary's defaults, in
// the same run and in alternating rounds: producers offer each of
// CaptureRates messages a second (transactions of one to seven over 1000 keys, as the
// soak's) for CaptureFor, into the table (INSERT) or the write-ahead log
// (outbox_emit), and the relay delivers them. Each reports, per message,
// the whole server's CPU (the producers' backends, the relay's, and the
// rest: checkpoints, vacuum, the WAL writer), the relay's backends' (the
// log's sender included), the WAL written, commit → broker ack
// percentiles, and the table's size and dead tuples once all is
// delivered.
func (r *runner) captures(ctx context.Context) error {
	if r.cfg.CaptureFor <= 0 {
		return nil
	}
	bin, cleanup, err := r.binary(ctx)
	if err != nil {
		return err
	}
	defer cleanup()
	for _, rate := range r.cfg.CaptureRates {
		if err := r.captureAt(ctx, bin, rate); err != nil {
			return err
		}
	}
	return nil
}

// captureAt runs the capture scenario at rate messages a second.
func (r *runner) captureAt(ctx context.Context, bin string, rate int) error {
	type round struct {
		cpu, relayCPU, process, wal, p50, p99 float64
		size, dead                            int64
		msgs                                  int64
	}
	results := map[string][]round{}
	modes := []string{"table", "log"}
	for range r.cfg.CaptureRounds {
		for _, mode := range modes {
			var rd round
			err := r.captureRound(ctx, bin, mode, rate, func(msgs int64, spent roundCost, relayCPU time.Duration, wal int64, lat []time.Duration, size, dead int64) {
				n := float64(max(msgs, 1))
				rd = round{cpu: us(spent.cluster) / n, relayCPU: us(spent.backends) / n, process: us(relayCPU) / n, wal: float64(wal) / n,
					p50: ms(percentile(lat, 50)), p99: ms(percentile(lat, 99)), size: size, dead: dead, msgs: msgs}
			})
			if err != nil {
				return fmt.Errorf("capture %s at %d messages/s: %w", mode, rate, err)
			}
			results[mode] = append(results[mode], rd)
		}
	}
	med := func(mode string, f func(round) float64) float64 {
		var v []float64
		for _, rd := range results[mode] {
			v = append(v, f(rd))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	for _, mode := range modes {
		last := results[mode][len(results[mode])-1]
		r.add(Result{Group: "capture", Name: fmt.Sprintf("%s, %d messages/s: server CPU a message", mode, rate),
			Value: med(mode, func(x round) float64 { return x.cpu }), Unit: "µs",
			Detail: fmt.Sprintf("median of %d rounds, %.0f messages/s committed; the relay's backends %.1f µs and the relay %.1f µs a message; WAL %.0f bytes a message; commit→ack p50 %.1f ms, p99 %.1f ms; after the last round the table is %d kB with %d dead tuples",
				len(results[mode]), med(mode, func(x round) float64 { return float64(x.msgs) / r.cfg.CaptureFor.Seconds() }),
				med(mode, func(x round) float64 { return x.relayCPU }), med(mode, func(x round) float64 { return x.process }),
				med(mode, func(x round) float64 { return x.wal }),
				med(mode, func(x round) float64 { return x.p50 }), med(mode, func(x round) float64 { return x.p99 }), last.size/1024, last.dead)})
	}
	r.add(Result{Group: "capture", Name: fmt.Sprintf("log ÷ table, %d messages/s: server CPU a message", rate),
		Value: med("log", func(x round) float64 { return x.cpu }) / med("table", func(x round) float64 { return x.cpu }), Unit: "×",
		Detail: fmt.Sprintf("WAL a message %.2f×; p99 %.2f×",
			med("log", func(x round) float64 { return x.wal })/med("table", func(x round) float64 { return x.wal }),
			med("log", func(x round) float64 { return x.p99 })/med("table", func(x round) float64 { return x.p99 }))})
	return nil
}

// roundCost is what a round cost the server, whole and the relay's
// backends.
type roundCost struct{ cluster, backends time.Duration }

// captureRound runs one round of captures in mode and reports it to done.
func (r *runner) captureRound(ctx context.Context, bin, mode string, rate int,
	done func(msgs int64, s roundCost, relayCPU time.Duration, wal int64, lat []time.Duration, size, dead int64)) error {
	const producers, keys = 8, 1000
	e, err := r.newEnv(ctx, producers+2)
	if err != nil {
		return err
	}
	defer e.close()
	env := r.relayEnv(e, false)
	if mode == "log" {
		checks, err := logsource.Setup(ctx, e.pool, e.schema, logsource.SetupOptions{Create: true})
		if err != nil {
			return err
		}
		if m := logsource.Missing(checks); m != "" {
			return fmt.Errorf("capture from the log is not set up on the benchmark's server:\n%s", m)
		}
		defer dropSlot(e)
		env = append(env, "OUTBOX_RELAY_CAPTURE=log")
	}
	book := newEventBook()
	watchEventAcks(e.cluster, "bench", book.acked)
	relays, err := startRelays(ctx, bin, env, 1)
	if err != nil {
		return err
	}
	defer relays.stop()
	pid := relays.cmds[0].Process.Pid
	if mode == "log" {
		if err := waitUntil(ctx, time.Minute, func() bool { return slotActive(ctx, e) }); err != nil {
			return fmt.Errorf("no relay streams from the slot: %w", err)
		}
	}
	payload := make([]byte, r.cfg.PayloadBytes)
	interval := time.Duration(float64(time.Second) * producers * 4 / float64(rate))
	write := `INSERT INTO outbox (topic, key, payload) SELECT 'bench', k, $2 FROM unnest($1::text[]) AS k RETURNING event_id`
	if mode == "log" {
		write = `SELECT outbox_emit('bench', k, $2) FROM unnest($1::text[]) AS k`
	}
	before, walBefore, cpuBefore := readCost(ctx, e.pool, e.schema), walLSN(ctx, e), relayCPU(pid)
	start := time.Now()
	deadline := start.Add(r.cfg.CaptureFor)
	err = parallel(producers, func(p int) error {
		rng := rand.New(rand.NewPCG(uint64(p), uint64(start.UnixNano())))
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
			var ids []uuid.UUID
			err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				rows, err := tx.Query(ctx, write, ks, payload)
				if err != nil {
					return err
				}
				ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
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
	if err := waitUntil(ctx, 5*time.Minute, func() bool { return book.unacked() == 0 }); err != nil {
		return fmt.Errorf("%d messages committed were not acknowledged within 5 minutes of the load's end", book.unacked())
	}
	after, walAfter, cpuAfter := readCost(ctx, e.pool, e.schema), walLSN(ctx, e), relayCPU(pid)
	var backends time.Duration
	for p, t := range after.relayBackends {
		backends += t - before.relayBackends[p]
	}
	var size, dead int64
	_ = e.pool.QueryRow(ctx, `SELECT pg_total_relation_size(relid), n_dead_tup FROM pg_stat_user_tables
		WHERE schemaname = $1 AND relname = 'outbox'`, e.schema).Scan(&size, &dead)
	lat := book.latencies()
	done(int64(len(lat)), roundCost{cluster: after.cluster - before.cluster, backends: backends}, cpuAfter-cpuBefore, walAfter-walBefore, lat, size, dead)
	return relays.stop()
}

// walLSN is the server's WAL insert position, in bytes.
func walLSN(ctx context.Context, e *env) int64 {
	var n int64
	_ = e.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").Scan(&n)
	return n
}

// slotActive says a relay streams from e's slot.
func slotActive(ctx context.Context, e *env) bool {
	var active bool
	_ = e.pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = outbox_capture_slot()").Scan(&active)
	return active
}

// dropSlot drops e's slot and publication once no relay streams.
func dropSlot(e *env) {
	ctx := context.Background()
	_ = waitUntil(ctx, time.Minute, func() bool { return !slotActive(ctx, e) })
	_, _ = e.pool.Exec(ctx, "SELECT pg_drop_replication_slot(outbox_capture_slot())")
	_, _ = e.pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+schema.Publication(e.schema))
}

// eventBook records when each message committed and was first
// acknowledged, by event id.
type eventBook struct {
	mu      sync.Mutex
	pending map[uuid.UUID]time.Time // committed, not yet acknowledged
	lat     []time.Duration
	early   map[uuid.UUID]time.Time // acknowledged before its commit was recorded
}

func newEventBook() *eventBook {
	return &eventBook{pending: map[uuid.UUID]time.Time{}, early: map[uuid.UUID]time.Time{}}
}

func (b *eventBook) committed(ids []uuid.UUID, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		if acked, ok := b.early[id]; ok {
			delete(b.early, id)
			b.lat = append(b.lat, max(acked.Sub(at), 0))
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
	b.lat = append(b.lat, at.Sub(c))
}

func (b *eventBook) unacked() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

func (b *eventBook) latencies() []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.lat)
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
