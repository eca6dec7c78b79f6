package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/fleet"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// fleetCost measures what sharing flow control with a fleet costs a
// drain: the 10k-keys backlog drained by one relay with 2 workers into a
// destination with an in-flight limit (so the shared bulkhead is on the
// path of every row), without and with the coordination tables in the
// same database, syncing at the default interval, in alternating pairs.
func (r *runner) fleetCost(ctx context.Context) error {
	const name = "delete-on-send, 10k keys, 2 worker(s), max_in_flight"
	if !strings.Contains(name, r.cfg.Match) {
		return r.fleetSlots(ctx)
	}
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
					st, err := fleet.New(e.pool, e.schema)
					if err != nil {
						return err
					}
					cfg.Fleet = &relay.FleetConfig{Fleet: st, Replica: "bench"}
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
	r.add(Result{Group: "fleet", Name: name + ", per process", Value: a, Unit: "rows/s", Detail: "median of " + list(alone)})
	detail := fmt.Sprintf("median of %s; %+.1f%% against per process", list(shared), 100*(s-a)/a)
	if syncs > 0 {
		detail += fmt.Sprintf("; %d syncs, %.2f ms each", syncs, ms(syncTime)/float64(syncs))
	}
	r.add(Result{Group: "fleet", Name: name + ", shared by a fleet", Value: s, Unit: "rows/s", Detail: detail})
	return r.fleetSlots(ctx)
}

// fleetSlots measures how much of a destination's in-flight limit a fleet
// keeps busy: relays with their own stores, sharing flow control, drain a
// backlog into an endpoint that answers each publish after 20 ms, against
// a limit of 3 and of 30 across three replicas, and of 3 for one relay
// alone. The backlog is written once the replicas share the partitions;
// the figure is the rows in flight on average from the first publish to
// the last answer, against the limit.
func (r *runner) fleetSlots(ctx context.Context) error {
	for _, c := range []struct{ replicas, limit int }{{3, 3}, {3, 30}, {1, 3}} {
		if !strings.Contains(slotsName(c.replicas, c.limit), r.cfg.Match) {
			continue
		}
		if err := r.fleetSlotsOf(ctx, c.replicas, c.limit); err != nil {
			return fmt.Errorf("fleet slots, %d replicas, limit %d: %w", c.replicas, c.limit, err)
		}
	}
	if !strings.Contains(outageName(r.cfg.FleetOutage), r.cfg.Match) {
		return nil
	}
	return r.fleetOutage(ctx)
}

// slotsName names a fleetSlotsOf figure.
func slotsName(replicas, limit int) string {
	who := fmt.Sprintf("%d replicas", replicas)
	if replicas == 1 {
		who = "1 relay"
	}
	return fmt.Sprintf("%s, max_in_flight %d, 20 ms answers: slots busy", who, limit)
}

func (r *runner) fleetSlotsOf(ctx context.Context, replicas, limit int) error {
	const answer = 20 * time.Millisecond
	// About ten seconds' worth at the limit; a tenth of the drains'
	// backlog in a short run.
	rows := min(limit*500, max(150, r.cfg.Rows/10))
	e, err := r.newEnv(ctx, int32(replicas*6))
	if err != nil {
		return err
	}
	defer e.close()
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
		st, err := store.New(e.relayPool, store.Config{Schema: e.schema, Claimer: name})
		if err != nil {
			return err
		}
		cfg := relay.Config{
			Store: st, Workers: 2, BatchSize: r.cfg.BatchSize, PayloadCap: r.cfg.PayloadBytes * 2,
			Destinations: []relay.Destination{{Name: "endpoint", Publisher: ep, MaxInFlight: limit}},
			Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "endpoint"}},
		}
		if replicas > 1 {
			cfg.Fleet = &relay.FleetConfig{Fleet: coord, Replica: name}
		}
		rel, err := relay.New(cfg)
		if err != nil {
			return err
		}
		rels = append(rels, rel)
		go func() { done <- rel.Run(runCtx) }()
	}
	settled := func() bool {
		var owners, free int
		err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT owner), count(*) FILTER (WHERE owner IS NULL) FROM outbox_claim_partitions`).Scan(&owners, &free)
		return err == nil && owners == replicas && free == 0
	}
	if err := waitUntil(ctx, time.Minute, settled); err != nil {
		return fmt.Errorf("the replicas to share the partitions: %w", err)
	}
	// A plain insert: the drains' fill rebuilds indexes, which the
	// running relays would deadlock with.
	if _, err := e.pool.Exec(ctx, `INSERT INTO outbox (topic, key, payload)
		SELECT 'bench', 'k' || (g % 10000), convert_to(repeat('x', $2), 'UTF8') FROM generate_series(1, $1) g`,
		rows, r.cfg.PayloadBytes); err != nil {
		return fmt.Errorf("write the backlog: %w", err)
	}
	delivered := func() int64 {
		var n int64
		for _, rel := range rels {
			n += rel.Stats().Delivered
		}
		return n
	}
	// The steady part: from a tenth of the backlog delivered to nine
	// tenths, past the start (the shares settle) and before the end
	// (replicas whose partitions are drained lend their slots a sync or
	// two later).
	var from, to struct {
		area float64
		at   time.Time
	}
	err = waitUntil(ctx, 10*time.Minute, func() bool {
		n := delivered()
		if from.at.IsZero() && n >= int64(rows)/10 {
			from.area, from.at = ep.areaNow()
		}
		if to.at.IsZero() && n >= int64(rows)*9/10 {
			to.area, to.at = ep.areaNow()
		}
		return n >= int64(rows)
	})
	stop()
	for range rels {
		if runErr := <-done; runErr != nil && err == nil {
			err = runErr
		}
	}
	if err != nil {
		return fmt.Errorf("%w (delivered %d of %d)", err, delivered(), rows)
	}
	avg, span := ep.average()
	steady := avg
	if d := to.at.Sub(from.at).Seconds(); d > 0 {
		steady = (to.area - from.area) / d
	}
	r.add(Result{Group: "fleet", Name: slotsName(replicas, limit),
		Value: 100 * steady / float64(limit), Unit: "%",
		Detail: fmt.Sprintf("%.2f rows in flight on average from 10%% to 90%% of the backlog delivered, %.2f over the whole drain, %d at most; %d rows at %.0f rows/s (at most %.0f)",
			steady, avg, ep.most, rows, float64(rows)/span.Seconds(), float64(limit)/answer.Seconds())})
	return nil
}

// slowEndpoint answers every publish after a fixed time, and keeps the
// rows in flight over time.
type slowEndpoint struct {
	answer   time.Duration
	mu       sync.Mutex
	inFlight int
	most     int     // the most rows in flight at once
	area     float64 // row-seconds
	began    time.Time
	changed  time.Time
}

func (p *slowEndpoint) Publish(ctx context.Context, recs []sink.Record) []error {
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
	p.most = max(p.most, p.inFlight)
	p.changed = now
}

// areaNow is the row-seconds in flight so far, and when.
func (p *slowEndpoint) areaNow() (float64, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.began.IsZero() {
		return 0, now
	}
	return p.area + float64(p.inFlight)*now.Sub(p.changed).Seconds(), now
}

// average is the rows in flight on average from the first publish to the
// last answer, and that time.
func (p *slowEndpoint) average() (float64, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	span := p.changed.Sub(p.began)
	if span <= 0 {
		return 0, 0
	}
	return p.area / span.Seconds(), span
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
		st, err := store.New(o.e.relayPool, store.Config{Schema: o.e.schema, Claimer: "bench"})
		if err != nil {
			return err
		}
		listener, err := store.NewListener(o.e.relayPool, store.ListenerConfig{Schema: o.e.schema})
		if err != nil {
			return err
		}
		outboxes = append(outboxes, relay.Outbox{Name: o.name, Store: st, Listener: listener})
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
