package relay_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// heldPublisher holds its first publish until released, then publishes
// through fakePublisher.
type heldPublisher struct {
	fakePublisher
	release chan struct{}
	held    chan struct{}
	once    sync.Once
	calls   atomic.Int32
}

func (p *heldPublisher) Publish(ctx context.Context, recs []sink.Record) []error {
	if p.calls.Add(1) == 1 {
		p.once.Do(func() { close(p.held) })
		select {
		case <-p.release:
		case <-ctx.Done():
			errs := make([]error, len(recs))
			for i := range errs {
				errs[i] = ctx.Err()
			}
			return errs
		}
	}
	return p.fakePublisher.Publish(ctx, recs)
}

func leasedConfig(p sink.Publisher, vt time.Duration) relay.Config {
	return relay.Config{
		Destinations: []relay.Destination{{Name: "hooks", Publisher: p, VisibilityTimeout: vt}},
		Routes:       []relay.Route{{Topics: []string{"*"}, Destination: "hooks"}},
	}
}

// blockedPublisher holds every publish until released.
type blockedPublisher struct {
	fakePublisher
	release chan struct{}
}

func (p *blockedPublisher) Publish(ctx context.Context, recs []sink.Record) []error {
	select {
	case <-p.release:
	case <-ctx.Done():
		errs := make([]error, len(recs))
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	}
	return p.fakePublisher.Publish(ctx, recs)
}

func TestLeasedDeliveriesBoundedByTheOutboxBatch(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	// The outbox claims 60 rows a batch, the relay's default batch being
	// 10: leased deliveries are bounded by the batches the workers hold
	// at once, the outbox's, not the relay's default.
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || g, 'a' FROM generate_series(1, 60) g`)
	p := &blockedPublisher{release: make(chan struct{})}
	cfg := leasedConfig(p, time.Hour)
	cfg.Workers, cfg.BatchSize = 1, 10
	h := start(t, s, nil, options{keepSent: true, outboxBatch: 60, cfg: cfg})
	testwait.For(t, "the outbox's whole batch leased at once", func() bool {
		return count(t, s.Pool, "lease_token IS NOT NULL") == 60
	})
	close(p.release)
	testwait.For(t, "every row delivered", func() bool { return count(t, s.Pool, "status = 'sent'") == 60 })
	h.stop()
}

func TestLeasedDeliveryOutsideTheClaim(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	p := &heldPublisher{release: make(chan struct{}), held: make(chan struct{})}
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || (g % 5), 'a' FROM generate_series(1, 50) g`)
	// An hour-long lease: rows waiting behind a leased row must not wait
	// for it to run out.
	h := start(t, s, nil, options{keepSent: true, cfg: leasedConfig(p, time.Hour)})
	<-p.held
	// The claim committed before delivery: the rows are visibly leased,
	// with the attempt counted, while the publish is still in progress.
	if n := count(t, s.Pool, `lease_token IS NOT NULL AND retry_count = 1 AND next_attempt_at > now() + interval '59 minutes'`); n == 0 {
		t.Fatal("no row is leased while its delivery runs")
	}
	insert(t, s, `INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || (g % 5), 'b' FROM generate_series(1, 50) g`)
	testwait.For(t, "later rows deferred behind the leased ones", func() bool { return h.relay.Stats().Deferred > 0 })
	close(p.release)
	testwait.For(t, "every row delivered", func() bool { return count(t, s.Pool, "status = 'sent'") == 100 })
	h.stop()
	checkKeyOrder(t, p.published(), keysOf(t, s))
	if n := count(t, s.Pool, "retry_count <> 0 OR lease_token IS NOT NULL"); n != 0 {
		t.Fatalf("%d delivered rows still count an attempt or hold a lease", n)
	}
}

// A row whose lease ran out during its delivery, and was leased again by
// another delivery, is that one's to write back and to count: the late
// write-back leaves it as it is, and counts only the rows it wrote.
func TestLeasedDeliveryCountsOnlyRowsItStillHeld(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	p := &heldPublisher{release: make(chan struct{}), held: make(chan struct{})}
	insert(t, s, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'a', 'x'), ('t', 'b', 'x')`)
	cfg := leasedConfig(p, time.Hour)
	cfg.Workers = 1 // one delivery holds both rows
	h := start(t, s, nil, options{keepSent: true, cfg: cfg})
	<-p.held
	// Row 2's lease ran out and another replica leased it again.
	tag, err := s.Pool.Exec(context.Background(), `UPDATE outbox SET lease_token = gen_random_uuid() WHERE id = 2 AND lease_token IS NOT NULL`)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("row 2 is not leased while its delivery is held: %v, %d rows", err, tag.RowsAffected())
	}
	close(p.release)
	if n := h.signals.LeaseWritten.Wait(t, "the leased write-back"); n != 1 {
		t.Errorf("the leased write-back settled %d rows, want 1", n)
	}
	h.stop() // waits for the leased delivery to end
	if st := h.relay.Stats(); st.Delivered != 1 {
		t.Errorf("delivered %d, want 1: row 2 belongs to the delivery that holds its lease now", st.Delivered)
	}
	if n := count(t, s.Pool, "id = 2 AND status = 'pending' AND lease_token IS NOT NULL"); n != 1 {
		t.Error("the late write-back changed the row another delivery holds")
	}
}

func TestLeasedDeliveryAbandonedOnStopGivesRowsBack(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	p := &heldPublisher{release: make(chan struct{}), held: make(chan struct{})}
	insert(t, s, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', 'x')`)
	cfg := leasedConfig(p, time.Hour)
	cfg.DrainTimeout = 50 * time.Millisecond
	h := start(t, s, nil, options{cfg: cfg})
	<-p.held
	h.stop()
	if n := count(t, s.Pool, `status = 'pending' AND retry_count = 0 AND lease_token IS NULL AND next_attempt_at <= now()`); n != 1 {
		t.Fatal("an abandoned leased delivery did not give its row back, ready and uncounted")
	}
}

func TestLeasedRowsThatNeverFinishRunOutOfAttempts(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	// Three leases ended without an outcome, as when the row crashes the
	// relay each time.
	insert(t, s, `INSERT INTO outbox (topic, payload, retry_count) VALUES ('t', 'x', 3)`)
	p := &fakePublisher{}
	h := start(t, s, nil, options{policy: retry.PolicyConfig{MaxAttempts: 3}, cfg: leasedConfig(p, time.Minute)})
	testwait.For(t, "the row dead-lettered", func() bool { return count(t, s.Pool, "status = 'dead_lettered'") == 1 })
	h.stop()
	if n := count(t, s.Pool, `dead_letter_reason = 'retries_exhausted' AND retry_count = 3 AND last_error LIKE '%leases ended without an outcome%'`); n != 1 {
		t.Fatal("not dead-lettered retries_exhausted with the reason")
	}
	if len(p.published()) != 0 {
		t.Fatal("a row out of attempts was delivered again")
	}
}

func TestLeasedFailuresRetryAndDeferLikeInline(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	p := &fakePublisher{fail: func(r sink.Record, attempt int) error {
		switch string(r.Payload) {
		case "transient":
			if attempt == 1 {
				return sink.Transient(errFake("503"), 0)
			}
		case "systemic":
			if attempt == 1 {
				return sink.Systemic(errFake("401"))
			}
		case "permanent":
			return sink.Permanent(errFake("422"), "")
		}
		return nil
	}}
	insert(t, s, `INSERT INTO outbox (topic, key, payload) VALUES ('t', 'a', 'transient'), ('t', 'a', 'after'),
        ('t', 'b', 'systemic'), ('t', 'c', 'permanent')`)
	h := start(t, s, nil, options{keepSent: true, cfg: leasedConfig(p, time.Hour)})
	testwait.For(t, "all rows done", func() bool { return count(t, s.Pool, "status = 'pending'") == 0 })
	h.stop()
	for payload, want := range map[string]string{
		"transient": "status = 'sent' AND retry_count = 1",
		"after":     "status = 'sent' AND retry_count = 0",
		"systemic":  "status = 'sent' AND retry_count = 0",
		"permanent": "status = 'dead_lettered' AND dead_letter_reason = 'permanent' AND retry_count = 1",
	} {
		if n := count(t, s.Pool, "payload = $1 AND "+want, payload); n != 1 {
			t.Errorf("%s: not %s", payload, want)
		}
	}
	checkKeyOrder(t, p.published(), keysOf(t, s))
}

type errFake string

func (e errFake) Error() string { return string(e) }

func TestLeasedDeliveriesAreBounded(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	g := &gate{release: make(chan struct{})}
	insert(t, s, `INSERT INTO outbox (topic, payload) SELECT 't', 'x' FROM generate_series(1, 100)`)
	cfg := leasedConfig(g, time.Hour)
	cfg.Workers, cfg.BatchSize = 2, 10
	h := start(t, s, nil, options{cfg: cfg})
	testwait.For(t, "leased deliveries in flight", func() bool { return g.inFlight.Load() == 20 })
	claims := h.relay.Stats().Claims
	testwait.For(t, "more claims", func() bool { return h.relay.Stats().Claims > claims+3 })
	if n := g.inFlight.Load(); n != 20 {
		t.Fatalf("%d rows in leased deliveries; without max_in_flight they are bounded by workers × batch size (20)", n)
	}
	close(g.release)
	testwait.For(t, "every row delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	h.stop()
}
