package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/fleet"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
)

// fleetCost measures what sharing flow control with a fleet costs a
// drain: the 10k-keys backlog drained by one relay with 2 workers into a
// destination with an in-flight limit (so the shared bulkhead is on the
// path of every row), without and with the coordination tables in the
// same database, syncing at the default interval, in alternating pairs.
func (r *runner) fleetCost(ctx context.Context) error {
	pairs := max(r.cfg.Pairs, 1)
	var alone, shared []float64
	var syncs int64
	var syncTime time.Duration
	for range pairs {
		for _, withFleet := range []bool{false, true} {
			tune := func(cfg *relay.Config, e *env) error {
				cfg.Destinations = []relay.Destination{{Name: "kafka", Publisher: cfg.Publisher, MaxInFlight: 4 * r.cfg.BatchSize}}
				cfg.Routes = []relay.Route{{Topics: []string{"*"}, Destination: "kafka"}}
				cfg.Publisher = nil
				if withFleet {
					store, err := fleet.New(e.pool, e.schema)
					if err != nil {
						return err
					}
					cfg.Fleet = &relay.FleetConfig{Fleet: store, Replica: "bench"}
				}
				return nil
			}
			after := func(rel *relay.Relay) {
				if st, ok := rel.Fleet(); ok {
					syncs += st.Syncs
					syncTime += st.SyncTime
				}
			}
			got, _, err := r.drainWith(ctx, false, distributions[0].expr, 2, tune, after)
			if err != nil {
				return fmt.Errorf("fleet cost: %w", err)
			}
			if withFleet {
				shared = append(shared, got)
			} else {
				alone = append(alone, got)
			}
		}
	}
	a, s := median(alone), median(shared)
	name := "delete-on-send, 10k keys, 2 worker(s), max_in_flight"
	r.add(Result{Group: "fleet", Name: name + ", per process", Value: a, Unit: "rows/s", Detail: "median of " + list(alone)})
	detail := fmt.Sprintf("median of %s; %+.1f%% against per process", list(shared), 100*(s-a)/a)
	if syncs > 0 {
		detail += fmt.Sprintf("; %d syncs, %.2f ms each", syncs, ms(syncTime)/float64(syncs))
	}
	r.add(Result{Group: "fleet", Name: name + ", shared by a fleet", Value: s, Unit: "rows/s", Detail: detail})
	return r.fleetSlots(ctx)
}

// fleetSlots measures how much of a destination's in-flight limit a fleet
// keeps busy: three relays with their own stores, sharing flow control,
// drain a backlog into an endpoint that answers each publish after 20 ms
// and takes 3 rows at once across the fleet. The figure is the rows in
// flight on average over the drain, against the limit.
func (r *runner) fleetSlots(ctx context.Context) error {
	const (
		replicas = 3
		limit    = 3
		answer   = 20 * time.Millisecond
	)
	rows := min(1500, max(150, r.cfg.Rows/10))
	e, err := r.newEnv(ctx, int32(replicas*6))
	if err != nil {
		return err
	}
	defer e.close()
	if err := r.fill(ctx, e, rows, distributions[0].expr); err != nil {
		return err
	}
	coord, err := fleet.New(e.pool, e.schema)
	if err != nil {
		return err
	}
	ep := &slowEndpoint{answer: answer}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var rels []*relay.Relay
	done := make(chan error, replicas)
	for i := range replicas {
		name := fmt.Sprintf("bench-%d", i)
		store, err := outbox.NewStore(e.relayPool, outbox.StoreConfig{Schema: e.schema, Claimer: name})
		if err != nil {
			return err
		}
		rel, err := relay.New(relay.Config{
			Store: store, Workers: 2, BatchSize: r.cfg.BatchSize, PayloadCap: r.cfg.PayloadBytes * 2,
			Destinations: []relay.Destination{{Name: "endpoint", Publisher: ep, MaxInFlight: limit}},
			Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "endpoint"}},
			Fleet:        &relay.FleetConfig{Fleet: coord, Replica: name},
		})
		if err != nil {
			return err
		}
		rels = append(rels, rel)
		go func() { done <- rel.Run(runCtx) }()
	}
	delivered := func() int64 {
		var n int64
		for _, rel := range rels {
			n += rel.Stats().Delivered
		}
		return n
	}
	start := time.Now()
	err = waitUntil(ctx, 10*time.Minute, func() bool { return delivered() >= int64(rows) })
	elapsed := time.Since(start)
	stop()
	for range rels {
		if runErr := <-done; runErr != nil && err == nil {
			err = runErr
		}
	}
	if err != nil {
		return fmt.Errorf("fleet slots: %w (delivered %d of %d)", err, delivered(), rows)
	}
	avg := ep.average()
	r.add(Result{Group: "fleet", Name: fmt.Sprintf("%d replicas, max_in_flight %d, 20 ms answers: slots busy", replicas, limit),
		Value: 100 * avg / limit, Unit: "%",
		Detail: fmt.Sprintf("%.2f rows in flight on average; %d rows at %.0f rows/s (at most %.0f)", avg, rows,
			float64(rows)/elapsed.Seconds(), limit/answer.Seconds())})
	return nil
}

// slowEndpoint answers every publish after a fixed time, and keeps the
// rows in flight over time.
type slowEndpoint struct {
	answer   time.Duration
	mu       sync.Mutex
	inFlight int
	area     float64 // row-seconds
	began    time.Time
	changed  time.Time
}

func (p *slowEndpoint) Publish(ctx context.Context, recs []outbox.Record) []error {
	p.move(len(recs))
	select {
	case <-time.After(p.answer):
	case <-ctx.Done():
	}
	p.move(-len(recs))
	errs := make([]error, len(recs))
	if ctx.Err() != nil {
		for i := range errs {
			errs[i] = ctx.Err()
		}
	}
	return errs
}

func (p *slowEndpoint) move(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.began.IsZero() {
		p.began = now
	} else {
		p.area += float64(p.inFlight) * now.Sub(p.changed).Seconds()
	}
	p.inFlight += n
	p.changed = now
}

// average is the rows in flight on average from the first publish to the
// last answer.
func (p *slowEndpoint) average() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if span := p.changed.Sub(p.began).Seconds(); span > 0 {
		return p.area / span
	}
	return 0
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// fairness runs one relay over two outboxes in one database: a busy one
// with a backlog of FairnessRows, and a quiet one offered FairnessRate
// rows a second while the backlog drains. It reports both outboxes'
// throughput over that time and the quiet one's commit-to-ack latency:
// the quiet outbox must not wait for the backlog.
func (r *runner) fairness(ctx context.Context) error {
	if r.cfg.FairnessRows == 0 || r.cfg.FairnessRate == 0 {
		return nil
	}
	const workers = 2
	busy, err := r.newEnv(ctx, workers+4)
	if err != nil {
		return err
	}
	defer busy.close()
	quiet, err := r.newEnv(ctx, workers+6)
	if err != nil {
		return err
	}
	defer quiet.close()
	if err := r.fill(ctx, busy, r.cfg.FairnessRows, distributions[0].expr); err != nil {
		return err
	}
	pub, err := r.publisher(busy)
	if err != nil {
		return err
	}
	defer pub.Close()
	acks := &ackTimes{inner: pub, at: map[uuid.UUID]time.Time{}}
	var outboxes []relay.Outbox
	for _, o := range []struct {
		name string
		e    *env
	}{{"busy", busy}, {"quiet", quiet}} {
		store, err := outbox.NewStore(o.e.relayPool, outbox.StoreConfig{Schema: o.e.schema, Claimer: "bench"})
		if err != nil {
			return err
		}
		listener, err := outbox.NewListener(o.e.relayPool, outbox.ListenerConfig{Schema: o.e.schema})
		if err != nil {
			return err
		}
		outboxes = append(outboxes, relay.Outbox{Name: o.name, Store: store, Listener: listener})
	}
	rel, err := relay.New(relay.Config{Outboxes: outboxes, Publisher: acks, Workers: workers, BatchSize: r.cfg.BatchSize})
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	defer func() { stop(); <-done }()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: quiet.schema})
	if err != nil {
		return err
	}

	// The quiet outbox's producer commits 100 transactions a second until
	// the backlog is drained.
	perTx := max(1, r.cfg.FairnessRate/100)
	payload := make([]byte, r.cfg.PayloadBytes)
	committed := map[uuid.UUID]time.Time{}
	delivered := func(name string) int64 {
		for _, o := range rel.Outboxes() {
			if o.Name == name {
				return o.Stats.Delivered
			}
		}
		return 0
	}
	start := time.Now()
	go func() { done <- rel.Run(runCtx) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	msgs := make([]outbox.Message, perTx)
	for delivered("busy") < int64(r.cfg.FairnessRows) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-done:
			done <- err
			return fmt.Errorf("fairness: the relay stopped: %v", err)
		case <-tick.C:
		}
		if time.Since(start) > 10*time.Minute {
			return fmt.Errorf("fairness: the backlog did not drain in 10 minutes (%d of %d)", delivered("busy"), r.cfg.FairnessRows)
		}
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "bench", Key: "key-" + uuid.NewString()[:4], Payload: payload}
		}
		ids, now, err := commit(ctx, quiet.pool, producer, msgs)
		if err != nil {
			return err
		}
		for _, id := range ids {
			committed[id] = now
		}
	}
	elapsed := time.Since(start)
	quietDone := delivered("quiet")
	if err := waitUntil(ctx, time.Minute, func() bool { return delivered("quiet") >= int64(len(committed)) }); err != nil {
		return fmt.Errorf("fairness: the quiet outbox: %w", err)
	}
	acks.mu.Lock()
	lat := make([]time.Duration, 0, len(committed))
	for id, c := range committed {
		if a, ok := acks.at[id]; ok {
			lat = append(lat, max(0, a.Sub(c)))
		}
	}
	acks.mu.Unlock()
	name := fmt.Sprintf("%d-row backlog beside %d rows/s offered, %d workers", r.cfg.FairnessRows, r.cfg.FairnessRate, workers)
	r.add(Result{Group: "fairness", Name: "busy outbox: " + name, Value: float64(r.cfg.FairnessRows) / elapsed.Seconds(), Unit: "rows/s",
		Detail: fmt.Sprintf("drained in %s", elapsed.Round(time.Millisecond))})
	r.add(Result{Group: "fairness", Name: "quiet outbox: " + name, Value: float64(quietDone) / elapsed.Seconds(), Unit: "rows/s",
		Detail: fmt.Sprintf("%d of %d offered rows delivered while the backlog drained", quietDone, len(committed))})
	r.add(Result{Group: "fairness", Name: "quiet outbox p50 commit→ack", Value: ms(percentile(lat, 50)), Unit: "ms",
		Detail: fmt.Sprintf("p99 %.1f ms, max %.1f ms, %d rows", ms(percentile(lat, 99)), ms(percentile(lat, 100)), len(lat))})
	return nil
}
