package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// producers measures what each of the table's triggers costs producers:
// the wake-up trigger, and the one that gives an inserting transaction
// its id first (strict order), which every producer pays, strict or not.
func (r *runner) producers(ctx context.Context) error {
	for _, t := range []struct{ trigger, what string }{
		{"outbox_notify", "the wake-up trigger"},
		{"outbox_xid_first", "the strict-order trigger"},
	} {
		if err := r.triggerCost(ctx, t.trigger, t.what); err != nil {
			return fmt.Errorf("cost of %s: %w", t.what, err)
		}
	}
	return nil
}

// triggerCost measures producer throughput, single-row transactions from
// 8 connections, with and without one trigger. The two alternate in short
// rounds on one table (ABBA order), so a change in the disk's speed during
// the run weighs on both alike, and the trigger's cost is the median of
// the rounds' own.
func (r *runner) triggerCost(ctx context.Context, trigger, what string) error {
	const producers, rounds = 8, 16
	e, err := r.newEnv(ctx, producers+1)
	if err != nil {
		return err
	}
	defer e.close()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: e.schema})
	if err != nil {
		return err
	}
	payload := make([]byte, r.cfg.PayloadBytes)
	write := func() error {
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := producer.Write(ctx, tx, outbox.Message{Topic: "bench", Key: "k", Payload: payload})
			return err
		})
	}
	var rows [2]int64 // without, with
	var took [2]time.Duration
	var costs []float64 // of each round
	for i := range rounds {
		var rate [2]float64
		order := []int{1, 0}
		if i%2 == 1 {
			order = []int{0, 1}
		}
		for _, on := range order {
			state := "DISABLE"
			if on == 1 {
				state = "ENABLE"
			}
			if _, err := e.pool.Exec(ctx, "ALTER TABLE outbox "+state+" TRIGGER "+trigger); err != nil {
				return err
			}
			start := time.Now()
			n, err := repeatFor(producers, r.cfg.ProducersFor/rounds, write)
			if err != nil {
				return err
			}
			elapsed := time.Since(start)
			rows[on] += n
			took[on] += elapsed
			rate[on] = float64(n) / elapsed.Seconds()
		}
		costs = append(costs, 1-rate[1]/rate[0])
	}
	with := float64(rows[1]) / took[1].Seconds()
	without := float64(rows[0]) / took[0].Seconds()
	// A burst of background work (a checkpoint, autovacuum) can land in
	// one round: the median of the rounds' own costs is not moved by it.
	slices.Sort(costs)
	median := (costs[(rounds-1)/2] + costs[rounds/2]) / 2
	each := (r.cfg.ProducersFor / rounds).Round(time.Millisecond)
	detail := fmt.Sprintf("%d rounds, each %s with the trigger and %s without, in alternating order", rounds, each, each)
	r.add(Result{Group: "producer", Name: "insert, 1 row per transaction, with " + what, Value: with, Unit: "rows/s", Detail: detail})
	r.add(Result{Group: "producer", Name: "insert, 1 row per transaction, without " + what, Value: without, Unit: "rows/s", Detail: detail})
	r.add(Result{Group: "producer", Name: "cost of " + what, Value: 100 * median, Unit: "%",
		Detail: fmt.Sprintf("median of the %d rounds' costs (%.1f%% to %.1f%%); %.1f%% from the totals above",
			rounds, 100*costs[0], 100*costs[rounds-1], 100*(1-with/without))})
	return nil
}

// naive drains a backlog the simplest way: one row per transaction, one
// message per publish, through the relay's own Kafka sink, so that the
// ratio is the batching's.
func (r *runner) naive(ctx context.Context) error {
	e, err := r.newEnv(ctx, 2)
	if err != nil {
		return err
	}
	defer e.close()
	if err := r.fill(ctx, e, r.cfg.NaiveRows, distributions[0].expr); err != nil {
		return err
	}
	pub, err := r.publisher(e)
	if err != nil {
		return err
	}
	defer pub.Close()
	start := time.Now()
	deadline := start.Add(r.cfg.NaiveFor)
	n := 0
	for n < r.cfg.NaiveRows && time.Now().Before(deadline) {
		err := pgx.BeginFunc(ctx, e.relayPool, func(tx pgx.Tx) error {
			var key *string
			rec := sink.Record{Topic: "bench"}
			err := tx.QueryRow(ctx, `SELECT id, event_id, key, payload FROM outbox WHERE status = 'pending' AND next_attempt_at <= now()
				ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&rec.ID, &rec.EventID, &key, &rec.Payload)
			if err != nil {
				return err
			}
			if key != nil {
				rec.Key, rec.HasKey = *key, true
			}
			if err := pub.Publish(ctx, []sink.Record{rec})[0]; err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "DELETE FROM outbox WHERE id = $1", rec.ID)
			return err
		})
		if err != nil {
			return fmt.Errorf("naive relay: %w", err)
		}
		n++
	}
	naive := float64(n) / time.Since(start).Seconds()
	r.add(Result{Group: "baseline", Name: "naive relay, 1 row per transaction", Value: naive, Unit: "rows/s"})
	best := 0.0
	for _, res := range r.results {
		if res.Group == "drain" && strings.HasPrefix(res.Name, "delete-on-send") {
			best = math.Max(best, res.Value)
		}
	}
	if best > 0 {
		r.add(Result{Group: "baseline", Name: "relay (best delete-on-send drain) ÷ naive", Value: best / naive, Unit: "×"})
	}
	return nil
}

// claimsUnderMaintenance times every claim of a drain while ANALYZE and
// VACUUM run on the table over and over, with autovacuum set to fire
// often.
func (r *runner) claimsUnderMaintenance(ctx context.Context) error {
	e, err := r.newEnv(ctx, 4)
	if err != nil {
		return err
	}
	defer e.close()
	if err := r.fill(ctx, e, r.cfg.Rows, distributions[0].expr); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_vacuum_threshold = 1000,
		autovacuum_vacuum_scale_factor = 0, autovacuum_analyze_threshold = 1000, autovacuum_analyze_scale_factor = 0)`); err != nil {
		return err
	}
	st, err := claimingStore(ctx, e, store.Config{})
	if err != nil {
		return err
	}
	maintCtx, stopMaint := context.WithCancel(ctx)
	maintDone := make(chan int)
	go func() {
		rounds := 0
		for maintCtx.Err() == nil {
			for _, stmt := range []string{"ANALYZE outbox", "VACUUM outbox"} {
				if _, err := e.pool.Exec(maintCtx, stmt); err == nil {
					rounds++
				}
			}
		}
		maintDone <- rounds
	}()
	var done atomic.Int64
	var took []time.Duration
	for done.Load() < int64(r.cfg.Rows) {
		d, err := claimAndAck(ctx, st, r.cfg.BatchSize, &done)
		if err != nil {
			stopMaint()
			<-maintDone
			return err
		}
		took = append(took, d)
	}
	stopMaint()
	rounds := <-maintDone
	detail := fmt.Sprintf("%d claims, %d ANALYZE/VACUUM runs", len(took), rounds)
	r.add(Result{Group: "claim", Name: "claim p99 during ANALYZE and VACUUM", Value: ms(percentile(took, 99)), Unit: "ms", Detail: detail})
	r.add(Result{Group: "claim", Name: "claim max during ANALYZE and VACUUM", Value: ms(slices.Max(took)), Unit: "ms", Detail: detail})
	return nil
}
