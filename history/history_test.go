package history_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.WaitingTests) }

func newStore(t *testing.T) (*history.Store, *pgtest.Schema) {
	t.Helper()
	s := pgtest.NewSchema(t)
	h, err := history.New(s.Pool, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	return h, s
}

// dbNow is the database's clock, which the history's window follows.
func dbNow(t *testing.T, s *pgtest.Schema) time.Time {
	t.Helper()
	var now time.Time
	if err := s.Pool.QueryRow(context.Background(), "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

func lag(bucket int, n int64) []int64 {
	out := make([]int64, len(history.LagBuckets)+1)
	out[bucket] = n
	return out
}

// Two replicas' counts for the same minutes add up, histograms bucket by
// bucket, so that the fleet's percentiles come from the fleet's rows; the
// backlog is counted by one replica a minute.
func TestReplicasAddUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h, s := newStore(t)
	now := dbNow(t, s)
	earlier := now.Add(-10 * time.Minute)
	for _, c := range []struct {
		at      time.Time
		replica string
		counts  []history.Counts
	}{
		{now, "a", []history.Counts{{Destination: "kafka", Delivered: 90, Retried: 2, Lag: lag(1, 90)}, {Destination: "hooks", DeadLettered: 1}}},
		{now, "b", []history.Counts{{Destination: "kafka", Delivered: 10, Lag: lag(8, 10)}}},
		{now, "a", []history.Counts{{Destination: "kafka", Delivered: 5, Lag: lag(1, 5)}}}, // the same minute again
		{earlier, "a", []history.Counts{{Destination: "kafka", Delivered: 7, Lag: lag(2, 7)}, {Destination: "idle"}}},
	} {
		if err := h.Add(ctx, c.at, c.replica, c.counts); err != nil {
			t.Fatal(err)
		}
	}
	counted := 0
	count := func(context.Context) (history.Backlog, error) {
		counted++
		return history.Backlog{Pending: 42, OldestPending: 3 * time.Second}, nil
	}
	for range 3 {
		if err := h.RecordBacklog(ctx, now, count); err != nil {
			t.Fatal(err)
		}
	}
	if counted != 1 {
		t.Errorf("the backlog was counted %d times in one minute, want once", counted)
	}

	tr, err := h.Read(ctx, time.Hour, time.Minute, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Outbox.Points) != 60 || tr.To.Sub(tr.From) != time.Hour {
		t.Fatalf("an hour in minutes: %d points from %s to %s", len(tr.Outbox.Points), tr.From, tr.To)
	}
	// The minute the counts were written in: the last point, or the one
	// before it if a minute began since.
	at := func(m time.Time) history.Point {
		t.Helper()
		for _, p := range tr.Outbox.Points {
			if p.At.Equal(m.Truncate(time.Minute)) {
				return p
			}
		}
		t.Fatalf("no point at %s in %s–%s", m.Truncate(time.Minute), tr.From, tr.To)
		return history.Point{}
	}
	last := at(now)
	if l := tr.Outbox.Points[59]; !l.At.Equal(now.Truncate(time.Minute)) && !l.At.Equal(now.Truncate(time.Minute).Add(time.Minute)) {
		t.Errorf("the last point is at %s, want the current minute", l.At)
	}
	if last.Delivered != 105 || last.Retried != 2 || last.DeadLettered != 1 || last.Failed() != 3 {
		t.Errorf("the current minute: %+v, want 105 delivered, 2 retried, 1 dead-lettered", last)
	}
	if !last.HasBacklog || last.Backlog.Pending != 42 || last.Backlog.OldestPending != 3*time.Second {
		t.Errorf("the current minute's backlog: %+v", last.Backlog)
	}
	// 95 rows at 5–10 ms and 10 at 1–2.5 s: the median is in the first
	// bucket, the 99th percentile in the other.
	if p50, ok := last.Quantile(0.5); !ok || p50 < 5*time.Millisecond || p50 > 10*time.Millisecond {
		t.Errorf("p50 = %s, want 5–10 ms", p50)
	}
	if p99, ok := last.Quantile(0.99); !ok || p99 < time.Second || p99 > 2500*time.Millisecond {
		t.Errorf("p99 = %s, want 1–2.5 s", p99)
	}
	if p := at(earlier); p.Delivered != 7 || p.HasBacklog {
		t.Errorf("ten minutes ago: %+v, want 7 delivered and no backlog", p)
	}
	var total int64
	for _, p := range tr.Outbox.Points {
		total += p.Delivered
	}
	if total != 112 {
		t.Errorf("the hour's deliveries add up to %d, want 112", total)
	}
	names := []string{}
	for _, d := range tr.Destinations {
		names = append(names, d.Destination)
	}
	if len(names) != 2 || names[0] != "hooks" || names[1] != "kafka" {
		t.Errorf("destinations %v, want hooks and kafka (one with only zero counts writes nothing)", names)
	}
	var kafka int64
	for _, p := range tr.Destinations[1].Points {
		kafka += p.Delivered
	}
	if kafka != 112 {
		t.Errorf("kafka's hour: %d delivered, want 112", kafka)
	}
	// Without the minute under way, the window ends with the last whole
	// minute, and this one's counts are not read yet.
	whole, err := h.Read(ctx, time.Hour, time.Minute, false)
	if err != nil {
		t.Fatal(err)
	}
	if l := whole.Outbox.Points[59]; !l.At.Before(now.Truncate(time.Minute)) || l.Span != time.Minute {
		t.Errorf("the last whole minute: %s (span %s), want one before %s", l.At, l.Span, now.Truncate(time.Minute))
	}

	day, err := h.Read(ctx, 24*time.Hour, 15*time.Minute, true)
	if err != nil {
		t.Fatal(err)
	}
	total = 0
	for _, p := range day.Outbox.Points {
		total += p.Delivered
	}
	if len(day.Outbox.Points) != 96 || total != 112 {
		t.Errorf("the day: %d points, %d delivered, want 96 and 112", len(day.Outbox.Points), total)
	}
	if _, err := h.Read(ctx, time.Hour, 90*time.Second, true); err == nil {
		t.Error("a step of 90s was accepted")
	}
}

// The history stays bounded: a replica writes one row a minute per
// destination however often it flushes, and rows older than the
// retention go.
func TestHistoryIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h, s := newStore(t)
	now := dbNow(t, s)
	old := now.Add(-history.Retention - 2*time.Minute)
	if err := h.Add(ctx, old, "a", []history.Counts{{Destination: "kafka", Delivered: 1}}); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		if err := h.Add(ctx, now.Truncate(time.Minute).Add(time.Duration(i)*time.Second), "a", []history.Counts{{Destination: "kafka", Delivered: 1}, {Destination: "hooks", Retried: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	var rows, oldRows int
	var delivered int64
	if err := s.Pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE minute < $1), coalesce(sum(delivered), 0) FROM outbox_history", now.Add(-time.Hour)).Scan(&rows, &oldRows, &delivered); err != nil {
		t.Fatal(err)
	}
	if rows != 2 || oldRows != 0 || delivered != 30 {
		t.Errorf("%d rows (%d older than the retention) holding %d deliveries; want 2, 0 and 30", rows, oldRows, delivered)
	}
}

// The recorder writes what the relay's metrics counted since it last
// wrote, per destination, and what it could not write comes with the
// next write.
func TestRecorderWritesTheMetricsIncrease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h, s := newStore(t)
	reg := prometheus.NewRegistry()
	m, err := metrics.NewRelay(reg)
	if err != nil {
		t.Fatal(err)
	}
	obs := m.Outbox("orders", []string{"kafka", "hooks"})
	other := m.Outbox("billing", []string{"kafka"})
	rec := &history.Recorder{Store: h, Outbox: "orders", Replica: "r1", Gatherer: reg,
		Backlog: func(context.Context) (history.Backlog, error) { return history.Backlog{Pending: 5}, nil }}
	settle := func(n int) {
		for range n {
			obs.Settled("kafka", store.Sent, "", 20*time.Millisecond)
			other.Settled("kafka", store.Sent, "", time.Millisecond)
		}
		obs.Settled("hooks", store.Retried, "", 0)
		obs.Settled("hooks", store.DeadLettered, "permanent", 0)
	}
	settle(100)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	settle(50)
	// A write that fails loses nothing: the next carries its counts.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := rec.Flush(cctx); err == nil {
		t.Fatal("a flush with a cancelled context succeeded")
	}
	settle(25)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var delivered, retried, dead, lag20 int64
	if err := s.Pool.QueryRow(ctx, `SELECT sum(delivered), sum(retried), sum(dead_lettered), sum(lag_counts[3]) FROM outbox_history WHERE destination <> ''`).
		Scan(&delivered, &retried, &dead, &lag20); err != nil {
		t.Fatal(err)
	}
	if delivered != 175 || retried != 3 || dead != 3 || lag20 != 175 {
		t.Errorf("the history holds %d delivered (%d at 10–25 ms), %d retried, %d dead-lettered; want 175 (175), 3, 3", delivered, lag20, retried, dead)
	}
	var pending int64
	if err := s.Pool.QueryRow(ctx, `SELECT pending FROM outbox_history WHERE destination = ''`).Scan(&pending); err != nil || pending != 5 {
		t.Errorf("the backlog row: %d, %v", pending, err)
	}
}

func TestQuantile(t *testing.T) {
	t.Parallel()
	if _, ok := history.Quantile(nil, 0.5); ok {
		t.Error("a quantile of nothing")
	}
	// Everything above the last bound: the highest bound.
	top := time.Duration(history.LagBuckets[len(history.LagBuckets)-1] * float64(time.Second))
	if q, ok := history.Quantile(lag(len(history.LagBuckets), 3), 0.5); !ok || q != top {
		t.Errorf("in the unbounded bucket: %s, want %s", q, top)
	}
	// Ten in the first bucket (0–5 ms): the median halfway.
	if q, _ := history.Quantile(lag(0, 10), 0.5); q != 2500*time.Microsecond {
		t.Errorf("the median of ten rows under 5 ms: %s, want 2.5ms", q)
	}
}

// The recorder writes the breakers' changes this replica made, once
// each; those it adopted from the fleet are the other replica's to write.
func TestRecorderWritesBreakerChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h, _ := newStore(t)
	reg := prometheus.NewRegistry()
	if _, err := metrics.NewRelay(reg); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Minute)
	changes := []relay.BreakerChange{
		{Seq: 1, At: at, Destination: "hooks", From: relay.BreakerClosed, To: relay.BreakerOpen, Cooldown: 2 * time.Second, LastError: "HTTP 503"},
		{Seq: 2, At: at.Add(2 * time.Second), Destination: "hooks", From: relay.BreakerOpen, To: relay.BreakerHalfOpen},
		{Seq: 3, At: at.Add(3 * time.Second), Destination: "kafka", From: relay.BreakerClosed, To: relay.BreakerOpen, ByFleet: true},
	}
	rec := &history.Recorder{Store: h, Outbox: "orders", Replica: "r1", Gatherer: reg,
		Changes: func() []relay.BreakerChange { return changes }}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	changes = append(changes, relay.BreakerChange{Seq: 4, At: at.Add(4 * time.Second), Destination: "hooks", From: relay.BreakerHalfOpen, To: relay.BreakerClosed})
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := h.Changes(ctx, "hooks", 10)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, c := range got {
		seen = append(seen, c.From+"→"+c.To+"@"+c.Replica)
	}
	if want := "half_open→closed@r1 open→half_open@r1 closed→open@r1"; strings.Join(seen, " ") != want {
		t.Errorf("hooks' changes, newest first: %v, want %s", seen, want)
	}
	if got[2].Cooldown != 2*time.Second || got[2].LastError != "HTTP 503" {
		t.Errorf("the opening: %+v", got[2])
	}
	if k, err := h.Changes(ctx, "kafka", 10); err != nil || len(k) != 0 {
		t.Errorf("a change adopted from the fleet was written: %v %v", k, err)
	}
	// Changes are numbered across destinations, but each is read on its
	// own: a lower number that shows up after a higher one of another
	// destination was written is written too.
	changes = []relay.BreakerChange{{Seq: 9, At: at, Destination: "orders-api", From: relay.BreakerClosed, To: relay.BreakerOpen}}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	changes = append(changes, relay.BreakerChange{Seq: 8, At: at, Destination: "billing", From: relay.BreakerClosed, To: relay.BreakerOpen})
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"orders-api", "billing"} {
		if got, err := h.Changes(ctx, d, 10); err != nil || len(got) != 1 {
			t.Errorf("%s's changes: %v %v, want one", d, got, err)
		}
	}
}
