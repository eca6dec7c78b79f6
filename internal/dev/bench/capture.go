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

	"github.com/outbox-relay/outbox-relay/internal/db/schema"
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
// delivered. Then a backlog of CaptureBacklog messages, in each mode.
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
	for _, mode := range []string{"table", "log"} {
		if err := r.captureBacklog(ctx, bin, mode, r.cfg.CaptureBacklog); err != nil {
			return fmt.Errorf("capture %s, a backlog: %w", mode, err)
		}
	}
	return nil
}

// captureAt runs the capture scenario at rate messages a second.
func (r *runner) captureAt(ctx context.Context, bin string, rate int) error {
	type round struct {
		cpu, relayCPU, sender, process, wal, p50, p99 float64
		size, dead                                    int64
		msgs                                          int64
	}
	results := map[string][]round{}
	modes := []string{"table", "log"}
	for range r.cfg.CaptureRounds {
		for _, mode := range modes {
			var rd round
			err := r.captureRound(ctx, bin, mode, rate, func(msgs int64, spent roundCost, relayCPU time.Duration, wal int64, lat []time.Duration, size, dead int64) {
				n := float64(max(msgs, 1))
				rd = round{cpu: us(spent.cluster) / n, relayCPU: us(spent.backends) / n, sender: us(spent.senders) / n, process: us(relayCPU) / n, wal: float64(wal) / n,
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
			Detail: fmt.Sprintf("median of %d rounds, %.0f messages/s committed; the relay's backends %.1f µs (the log's sender %.1f µs) and the relay %.1f µs a message; WAL %.0f bytes a message; commit→ack p50 %.1f ms, p99 %.1f ms; after the last round the table is %d kB with %d dead tuples",
				len(results[mode]), med(mode, func(x round) float64 { return float64(x.msgs) / r.cfg.CaptureFor.Seconds() }),
				med(mode, func(x round) float64 { return x.relayCPU }), med(mode, func(x round) float64 { return x.sender }),
				med(mode, func(x round) float64 { return x.process }),
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

// roundCost is what a round cost the server: whole, the relay's backends,
// and of those the log's sender.
type roundCost struct{ cluster, backends, senders time.Duration }

// captureRound runs one round of captures in mode and reports it to done.
func (r *runner) captureRound(ctx context.Context, bin, mode string, rate int,
	done func(msgs int64, s roundCost, relayCPU time.Duration, wal int64, lat []time.Duration, size, dead int64)) error {
	const producers = 8
	e, err := r.newEnv(ctx, producers+2)
	if err != nil {
		return err
	}
	defer e.close()
	book := newEventBook()
	watchEventAcks(e.cluster, "bench", book.acked)
	relays, cleanup, err := r.startCapture(ctx, bin, e, mode)
	if err != nil {
		return err
	}
	defer cleanup()
	pid := relays.cmds[0].Process.Pid
	before, walBefore, cpuBefore := readCost(ctx, e.pool, e.schema), walLSN(ctx, e), relayCPU(pid)
	if err := r.produce(ctx, e, mode, producers, rate, time.Now().Add(r.cfg.CaptureFor), book); err != nil {
		return err
	}
	if err := waitUntil(ctx, 5*time.Minute, func() bool { return book.unacked() == 0 }); err != nil {
		return fmt.Errorf("%d messages committed were not acknowledged within 5 minutes of the load's end", book.unacked())
	}
	after, walAfter, cpuAfter := readCost(ctx, e.pool, e.schema), walLSN(ctx, e), relayCPU(pid)
	spent := before.until(after)
	var size, dead int64
	_ = e.pool.QueryRow(ctx, `SELECT pg_total_relation_size(relid), n_dead_tup FROM pg_stat_user_tables
		WHERE schemaname = $1 AND relname = 'outbox'`, e.schema).Scan(&size, &dead)
	lat := book.latencies()
	done(int64(len(lat)), roundCost{cluster: spent.cluster, backends: spent.relayBackends, senders: spent.senders}, cpuAfter-cpuBefore, walAfter-walBefore, lat, size, dead)
	return relays.stop()
}

// startCapture starts one outbox-relay on e's outbox at its defaults,
// capturing from mode: for the log, with the publication and the slot
// made first, and once the relay streams from the slot. cleanup stops the
// relay, and drops the slot.
func (r *runner) startCapture(ctx context.Context, bin string, e *env, mode string) (_ *relays, cleanup func(), err error) {
	env := r.relayEnv(e, false)
	drop := func() {}
	if mode == "log" {
		checks, err := logsource.Setup(ctx, e.pool, e.schema, logsource.SetupOptions{Create: true})
		if err != nil {
			return nil, nil, err
		}
		if m := logsource.Missing(checks); m != "" {
			return nil, nil, fmt.Errorf("capture from the log is not set up on the benchmark's server:\n%s", m)
		}
		drop = func() { dropSlot(e) }
		env = append(env, "OUTBOX_RELAY_CAPTURE=log")
	}
	relays, err := startRelays(ctx, bin, env, 1)
	if err != nil {
		drop()
		return nil, nil, err
	}
	cleanup = func() { _ = relays.stop(); drop() }
	if mode == "log" {
		if err := waitUntil(ctx, time.Minute, func() bool { return slotActive(ctx, e) }); err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("no relay streams from the slot: %w", err)
		}
	}
	return relays, cleanup, nil
}

// produce has producers offer rate messages a second until deadline, in
// transactions of one to seven over 1000 keys, into mode: the table
// (INSERT) or the write-ahead log (outbox_emit). It records each commit in
// book.
func (r *runner) produce(ctx context.Context, e *env, mode string, producers, rate int, deadline time.Time, book *eventBook) error {
	const keys = 1000
	payload := make([]byte, r.cfg.PayloadBytes)
	interval := time.Duration(float64(time.Second) * float64(producers) * 4 / float64(rate))
	write := `INSERT INTO outbox (topic, key, payload) SELECT 'bench', k, $2 FROM unnest($1::text[]) AS k RETURNING event_id`
	if mode == "log" {
		write = `SELECT outbox_emit('bench', k, $2) FROM unnest($1::text[]) AS k`
	}
	seed := uint64(time.Now().UnixNano())
	return parallel(producers, func(p int) error {
		rng := rand.New(rand.NewPCG(uint64(p), seed))
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

// captureBacklog times one outbox-relay at its defaults delivering a
// backlog of n messages over 10,000 keys, written beforehand into mode (in
// transactions of 1000, while no relay runs): from the relay's start to
// the broker's ack of the last. It reports the drain rate, the server's
// CPU a message while draining, the WAL a message written by the
// producers, and the table's size and dead tuples at the end.
func (r *runner) captureBacklog(ctx context.Context, bin, mode string, n int) error {
	const sessions, perTx = 2, 1000
	e, err := r.newEnv(ctx, sessions+2)
	if err != nil {
		return err
	}
	defer e.close()
	if mode == "log" {
		// The slot must be there before the messages are written: it
		// keeps the log from its creation on.
		checks, err := logsource.Setup(ctx, e.pool, e.schema, logsource.SetupOptions{Create: true})
		if err != nil {
			return err
		}
		if m := logsource.Missing(checks); m != "" {
			return fmt.Errorf("capture from the log is not set up on the benchmark's server:\n%s", m)
		}
		defer dropSlot(e)
	}
	write := `INSERT INTO outbox (topic, key, payload) SELECT 'bench', 'key-' || (random() * 9999)::int, $1 FROM generate_series(1, $2)`
	if mode == "log" {
		write = `SELECT count(outbox_emit('bench', 'key-' || (random() * 9999)::int, $1)) FROM generate_series(1, $2)`
	}
	payload := make([]byte, r.cfg.PayloadBytes)
	walBefore := walLSN(ctx, e)
	writeStart := time.Now()
	err = parallel(sessions, func(s int) error {
		for i := s * perTx; i < n; i += sessions * perTx {
			if _, err := e.pool.Exec(ctx, write, payload, min(perTx, n-i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write the backlog: %w", err)
	}
	writeFor, wal := time.Since(writeStart), walLSN(ctx, e)-walBefore

	var mu sync.Mutex
	seen := make(map[uuid.UUID]struct{}, n)
	watchEventAcks(e.cluster, "bench", func(id uuid.UUID, _ time.Time) {
		mu.Lock()
		seen[id] = struct{}{}
		mu.Unlock()
	})
	delivered := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	statementsReady(ctx, e.pool)
	before := readCost(ctx, e.pool, e.schema)
	relays, cleanup, err := r.startCapture(ctx, bin, e, mode)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := waitUntil(ctx, 30*time.Minute, func() bool { return delivered() >= n }); err != nil {
		return fmt.Errorf("%d of the backlog's %d messages were delivered in 30 minutes", delivered(), n)
	}
	elapsed := time.Since(relays.started)
	spent := before.until(readCost(ctx, e.pool, e.schema))
	var size, dead int64
	_ = e.pool.QueryRow(ctx, `SELECT pg_total_relation_size(relid), n_dead_tup FROM pg_stat_user_tables
		WHERE schemaname = $1 AND relname = 'outbox'`, e.schema).Scan(&size, &dead)
	r.add(Result{Group: "capture", Name: fmt.Sprintf("%s, a backlog of %s messages: drain rate", mode, count(n)),
		Value: float64(n) / elapsed.Seconds(), Unit: "messages/s",
		Detail: fmt.Sprintf("from the relay's start to the last ack; server CPU %.1f µs a message while draining (the relay's backends %.1f µs, the log's sender %.1f µs); written in %.1f s, %.0f bytes of WAL a message; then the table is %d kB with %d dead tuples",
			us(spent.cluster)/float64(n), us(spent.relayBackends)/float64(n), us(spent.senders)/float64(n), writeFor.Seconds(), float64(wal)/float64(n), size/1024, dead)})
	return relays.stop()
}
