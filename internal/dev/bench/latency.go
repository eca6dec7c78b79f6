package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// ackTimes wraps a publisher and records when each event was acknowledged.
type ackTimes struct {
	inner sink.Publisher
	mu    sync.Mutex
	at    map[uuid.UUID]time.Time
}

func (a *ackTimes) Publish(ctx context.Context, recs []sink.Record) []error {
	errs := a.inner.Publish(ctx, recs)
	now := time.Now()
	a.mu.Lock()
	for i, rec := range recs {
		if errs[i] == nil {
			if _, seen := a.at[rec.EventID]; !seen {
				a.at[rec.EventID] = now
			}
		}
	}
	a.mu.Unlock()
	return errs
}

// latencies measures commit-to-ack latency under offered load from
// concurrent producers, with LISTEN/NOTIFY wake-ups.
//
// Then, at the lowest rate, one row in twenty goes to a topic the cluster
// does not have: the healthy rows' latency beside failing rows on the same
// destination, which must pause only the failing topic. And the same
// load in strict order, whose producers do not serialise their keys.
func (r *runner) latencies(ctx context.Context) error {
	for _, rate := range r.cfg.Rates {
		lat, st, err := r.latency(ctx, rate, 0, false)
		if err != nil {
			return fmt.Errorf("latency at %d rows/s: %w", rate, err)
		}
		achieved := float64(len(lat)) / r.cfg.LatencyFor.Seconds()
		for _, q := range []float64{50, 95, 99} {
			r.add(Result{Group: "latency", Name: fmt.Sprintf("p%.0f commit→ack at %d rows/s offered", q, rate),
				Value: ms(percentile(lat, q)), Unit: "ms", Detail: fmt.Sprintf("%d rows, %.0f rows/s committed, %d batches, %d retried, %d deferred",
					len(lat), achieved, st.Batches, st.Retried, st.Deferred)})
		}
	}
	if len(r.cfg.Rates) == 0 {
		return nil
	}
	const failEvery = 20
	rate := slices.Min(r.cfg.Rates)
	lat, st, err := r.latency(ctx, rate, failEvery, false)
	if err != nil {
		return fmt.Errorf("latency at %d rows/s with failing rows: %w", rate, err)
	}
	for _, q := range []float64{50, 99} {
		r.add(Result{Group: "latency", Name: fmt.Sprintf("p%.0f commit→ack of healthy rows at %d rows/s offered, %d%% failing", q, rate, 100/failEvery),
			Value: ms(percentile(lat, q)), Unit: "ms", Detail: fmt.Sprintf("%d healthy rows; the failing rows go to a topic the cluster lacks; %d batches, %d retried, %d deferred",
				len(lat), st.Batches, st.Retried, st.Deferred)})
	}
	lat, st, err = r.latency(ctx, rate, 0, true)
	if err != nil {
		return fmt.Errorf("latency at %d rows/s in strict order: %w", rate, err)
	}
	for _, q := range []float64{50, 99} {
		r.add(Result{Group: "latency", Name: fmt.Sprintf("p%.0f commit→ack at %d rows/s offered, strict order", q, rate),
			Value: ms(percentile(lat, q)), Unit: "ms", Detail: fmt.Sprintf("%d rows; each waits for the transactions that could still commit a smaller id; %d batches, %d claims",
				len(lat), st.Batches, st.Claims)})
	}
	return nil
}

// latency offers rate rows/s for LatencyFor and returns the commit-to-ack
// latency of each row. With failEvery > 0, one row in failEvery goes to a
// topic the cluster lacks, without a key, and only the others are
// measured. strict claims in strict order.
func (r *runner) latency(ctx context.Context, rate, failEvery int, strict bool) (lat []time.Duration, st relay.Stats, err error) {
	const producers, workers = 8, 2
	e, err := r.newEnv(ctx, workers+4+producers)
	if err != nil {
		return nil, st, err
	}
	defer e.close()
	pub, err := r.publisher(e)
	if err != nil {
		return nil, st, err
	}
	defer pub.Close()
	acks := &ackTimes{inner: pub, at: map[uuid.UUID]time.Time{}}
	outboxStore, err := store.New(e.relayPool, store.Config{Schema: e.schema, StrictOrder: strict, Claimer: "bench"})
	if err != nil {
		return nil, st, err
	}
	listener, err := store.NewListener(e.relayPool, store.ListenerConfig{Schema: e.schema})
	if err != nil {
		return nil, st, err
	}
	rel, err := relay.New(relay.Config{Store: outboxStore, Publisher: acks, Listener: listener, Workers: workers, BatchSize: r.cfg.BatchSize})
	if err != nil {
		return nil, st, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rel.Run(runCtx) }()
	defer func() { stop(); <-done }()
	// Let the listener come up before the clock starts.
	if err := waitUntil(ctx, 10*time.Second, listener.Healthy); err != nil {
		return nil, st, fmt.Errorf("listener: %w", err)
	}

	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: e.schema})
	if err != nil {
		return nil, st, err
	}
	// Each producer commits transactions of perTx rows at a steady pace,
	// at most 100 a second: with fsync on, commits are the producers'
	// limit, not the relay's.
	perTx := max(1, rate/producers/100)
	interval := time.Duration(float64(time.Second) * float64(perTx*producers) / float64(rate))
	payload := make([]byte, r.cfg.PayloadBytes)
	var mu sync.Mutex
	committed := map[uuid.UUID]time.Time{}
	deadline := time.Now().Add(r.cfg.LatencyFor)
	err = parallel(producers, func(int) error {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		msgs := make([]outbox.Message, perTx)
		n := 0
		for time.Now().Before(deadline) {
			<-tick.C
			for i := range msgs {
				msgs[i] = outbox.Message{Topic: "bench", Key: "key-" + uuid.NewString()[:4], Payload: payload}
				if n++; failEvery > 0 && n%failEvery == 0 {
					msgs[i] = outbox.Message{Topic: "bench-missing", Payload: payload}
				}
			}
			ids, now, err := commit(ctx, e.pool, producer, msgs)
			if err != nil {
				return err
			}
			mu.Lock()
			for i, id := range ids {
				if msgs[i].Topic == "bench" {
					committed[id] = now
				}
			}
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, st, err
	}
	if err := waitUntil(ctx, time.Minute, func() bool { return rel.Stats().Delivered >= int64(len(committed)) }); err != nil {
		return nil, st, err
	}
	acks.mu.Lock()
	defer acks.mu.Unlock()
	lat = make([]time.Duration, 0, len(committed))
	for id, c := range committed {
		a, ok := acks.at[id]
		if !ok {
			return nil, st, fmt.Errorf("event %s committed but never acknowledged", id)
		}
		// An ack can land before the producer reads the clock after its
		// commit returns: that is a latency of about zero.
		lat = append(lat, max(0, a.Sub(c)))
	}
	return lat, rel.Stats(), nil
}

// commit writes msgs through producer in one transaction, and returns
// their event ids and when the commit returned.
func commit(ctx context.Context, pool *pgxpool.Pool, producer *outbox.Producer, msgs []outbox.Message) ([]uuid.UUID, time.Time, error) {
	var ids []uuid.UUID
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = producer.Write(ctx, tx, msgs...)
		return err
	})
	return ids, time.Now(), err
}
