// Package history keeps a short history of what the relay's replicas did,
// minute by minute, in each outbox's schema (table outbox_history,
// migration 22), for the console's trends: rows delivered, retried and
// dead-lettered, and their delivery lag, per destination; and the
// outbox's backlog.
//
// Every replica adds its own counts (a Recorder reads them off its
// metrics and writes what changed, once a minute), so the table's sums are
// the fleet's, and they survive restarts. Lag is kept as histogram
// buckets, which add up across replicas, so the fleet's percentiles are
// computed from the fleet's rows, not averaged. One replica a minute
// counts the backlog, which is the same table for all of them. The
// replicas that write delete what is older than Retention: at most one
// row a minute per destination and replica, and one for the backlog.
package history

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/metrics"
)

// Retention is how long the history is kept: the console's longest trend,
// a day, and an hour to spare.
const Retention = 25 * time.Hour

// LagBuckets are the upper bounds, in seconds, of the lag histograms'
// buckets: the relay's metric's, so that a minute's counts are that
// metric's increase. The history's arrays have one more, unbounded.
var LagBuckets = metrics.LagBuckets

// Store is the history of one outbox's schema.
type Store struct {
	pool *pgxpool.Pool
	q    outboxdb.History
}

// New returns the Store of the history in schemaName on pool. The caller
// keeps the pool.
func New(pool *pgxpool.Pool, schemaName string) (*Store, error) {
	q, err := outboxdb.NewHistory(schemaName, len(LagBuckets)+1)
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, q: q}, nil
}

// Counts are what one destination's rows did over a while.
type Counts struct {
	Destination                      string
	Delivered, Retried, DeadLettered int64
	// Lag counts the rows delivered by delivery lag: one count per bucket
	// of LagBuckets, and the last for longer ones. Nil when none was
	// delivered.
	Lag []int64
}

func (c Counts) zero() bool {
	return c.Delivered == 0 && c.Retried == 0 && c.DeadLettered == 0 && !slices.ContainsFunc(c.Lag, func(n int64) bool { return n != 0 })
}

// Change is a change of a destination's breaker that a replica made.
type Change struct {
	At          time.Time
	Destination string
	Replica     string
	// From and To are the breaker's states: closed, open, half_open.
	From, To  string
	Cooldown  time.Duration
	LastError string
}

// Add adds a replica's counts to the minute of at and its breakers'
// changes, and deletes the history older than Retention, in one round
// trip.
func (s *Store) Add(ctx context.Context, at time.Time, replica string, counts []Counts, changes ...Change) error {
	var b pgx.Batch
	for _, c := range counts {
		if c.zero() {
			continue
		}
		b.Queue(s.q.Add, at, c.Destination, replica, c.Delivered, c.Retried, c.DeadLettered, c.Lag)
	}
	for _, c := range changes {
		b.Queue(s.q.ChangeAdd, c.At, c.Destination, replica, c.From, c.To, c.Cooldown.Milliseconds(), c.LastError)
	}
	b.Queue(s.q.Trim, Retention.Microseconds())
	b.Queue(s.q.ChangesTrim, Retention.Microseconds())
	if err := s.pool.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("write the history: %w", err)
	}
	return nil
}

// Backlog is an outbox's backlog at a time.
type Backlog struct {
	Pending int64
	// OldestPending is the age of the oldest pending row.
	OldestPending time.Duration
}

// RecordBacklog records the backlog in the minute of at, unless a replica
// did already: count is called only then.
func (s *Store) RecordBacklog(ctx context.Context, at time.Time, count func(context.Context) (Backlog, error)) error {
	var due bool
	if err := s.pool.QueryRow(ctx, s.q.BacklogDue, at).Scan(&due); err != nil {
		return fmt.Errorf("read the history: %w", err)
	}
	if !due {
		return nil
	}
	b, err := count(ctx)
	if err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, s.q.Backlog, at, b.Pending, b.OldestPending.Milliseconds()); err != nil {
		return fmt.Errorf("write the history: %w", err)
	}
	return nil
}

// Point is one step of a trend.
type Point struct {
	At                               time.Time
	Delivered, Retried, DeadLettered int64
	// Lag counts the rows delivered in the step by delivery lag (see
	// Counts.Lag).
	Lag []int64
	// Backlog is the highest backlog recorded in the step; HasBacklog
	// says whether one was.
	Backlog    Backlog
	HasBacklog bool
	// Span is how much of the step the data covers: the step, but for
	// the last, which may be under way, and steps after the data.
	Span time.Duration
}

// Failed counts the failed attempts: retried or dead-lettered.
func (p Point) Failed() int64 { return p.Retried + p.DeadLettered }

// Quantile returns the q-quantile (0 < q < 1) of the step's delivery lag,
// interpolated within its bucket as Prometheus's histogram_quantile does,
// and false when nothing was delivered.
func (p Point) Quantile(q float64) (time.Duration, bool) { return Quantile(p.Lag, q) }

// Trend is a destination's steps, or the whole outbox's.
type Trend struct {
	// Destination is empty for the whole outbox's.
	Destination string
	Points      []Point
}

// Trends is an outbox's history over a window, in steps.
type Trends struct {
	From, To time.Time
	Step     time.Duration
	// Outbox sums every destination's counts and carries the backlog;
	// Destinations are each destination's, by name.
	Outbox       Trend
	Destinations []Trend
}

// Read returns the history of the window that ends now (by the database's
// clock) in steps of step; window is a whole number of steps, each a
// whole number of minutes. Steps without rows count zero. With current,
// the minute under way is read too: the replicas write more often than
// once a minute. Without, the window ends with the last whole minute,
// whose counts are written just after it ends. Each point's Span is the
// part of its step that the data covers: the last step's may be shorter.
func (s *Store) Read(ctx context.Context, window, step time.Duration, current bool) (*Trends, error) {
	if step < time.Minute || step%time.Minute != 0 || window < step || window%step != 0 {
		return nil, fmt.Errorf("history: a window of %s in steps of %s: steps must be whole minutes that divide the window", window, step)
	}
	var now time.Time
	if err := s.pool.QueryRow(ctx, s.q.Now).Scan(&now); err != nil {
		return nil, fmt.Errorf("read the history: %w", err)
	}
	// The data ends now, or with the last whole minute.
	end, through := now.Truncate(time.Minute), now.Truncate(time.Minute)
	if current {
		end, through = end.Add(time.Minute), now
	}
	to := end.Truncate(step)
	if to.Before(end) {
		to = to.Add(step)
	}
	from := to.Add(-window)
	t := &Trends{From: from, To: to, Step: step}
	n := int(window / step)
	blank := func(dest string) Trend {
		tr := Trend{Destination: dest, Points: make([]Point, n)}
		for i := range tr.Points {
			p := &tr.Points[i]
			p.At = from.Add(time.Duration(i) * step)
			p.Span = max(min(step, through.Sub(p.At)), 0)
		}
		return tr
	}
	t.Outbox = blank("")
	byDest := map[string]*Trend{}
	rows, err := s.pool.Query(ctx, s.q.Series, from, end, step.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("read the history: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			at                               time.Time
			dest                             string
			delivered, retried, deadLettered int64
			pending, oldestMS                *int64
		)
		lag := make([]int64, len(LagBuckets)+1)
		dst := []any{&at, &dest, &delivered, &retried, &deadLettered, &pending, &oldestMS}
		for i := range lag {
			dst = append(dst, &lag[i])
		}
		if err := rows.Scan(dst...); err != nil {
			return nil, fmt.Errorf("read the history: %w", err)
		}
		i := int(at.Sub(from) / step)
		if i < 0 || i >= n {
			continue
		}
		if dest == "" {
			if pending != nil {
				p := &t.Outbox.Points[i]
				p.HasBacklog = true
				p.Backlog = Backlog{Pending: *pending, OldestPending: time.Duration(deref(oldestMS)) * time.Millisecond}
			}
			continue
		}
		tr := byDest[dest]
		if tr == nil {
			b := blank(dest)
			tr = &b
			byDest[dest] = tr
		}
		for _, p := range []*Point{&tr.Points[i], &t.Outbox.Points[i]} {
			p.Delivered += delivered
			p.Retried += retried
			p.DeadLettered += deadLettered
			p.Lag = AddLag(p.Lag, lag)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the history: %w", err)
	}
	for _, tr := range byDest {
		t.Destinations = append(t.Destinations, *tr)
	}
	slices.SortFunc(t.Destinations, func(a, b Trend) int { return cmpString(a.Destination, b.Destination) })
	return t, nil
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// AddLag adds the lag counts b to a, bucket by bucket, and returns a.
func AddLag(a, b []int64) []int64 {
	if len(b) > len(a) {
		a = append(a, make([]int64, len(b)-len(a))...)
	}
	for i, n := range b {
		a[i] += n
	}
	return a
}

// Quantile returns the q-quantile (0 < q < 1) of the lags that counts
// hold, one count per bucket of LagBuckets and the last for longer ones,
// interpolated linearly within a bucket, as Prometheus's
// histogram_quantile does: in the unbounded bucket it is the highest
// bound. It is false when counts hold none.
func Quantile(counts []int64, q float64) (time.Duration, bool) {
	var total int64
	for _, n := range counts {
		total += n
	}
	if total == 0 || q <= 0 || q >= 1 {
		return 0, false
	}
	rank := q * float64(total)
	var below int64
	for i, n := range counts {
		if float64(below+n) < rank || n == 0 {
			below += n
			continue
		}
		if i >= len(LagBuckets) {
			break
		}
		lo := 0.0
		if i > 0 {
			lo = LagBuckets[i-1]
		}
		hi := LagBuckets[i]
		secs := lo + (hi-lo)*(rank-float64(below))/float64(n)
		return time.Duration(math.Round(secs * float64(time.Second))), true
	}
	return time.Duration(LagBuckets[len(LagBuckets)-1] * float64(time.Second)), true
}

// Changes returns a destination's latest breaker changes across the
// fleet, newest first, at most limit.
func (s *Store) Changes(ctx context.Context, destination string, limit int) ([]Change, error) {
	rows, err := s.pool.Query(ctx, s.q.Changes, destination, limit)
	if err != nil {
		return nil, fmt.Errorf("read the breakers' changes: %w", err)
	}
	defer rows.Close()
	var out []Change
	for rows.Next() {
		c := Change{Destination: destination}
		var ms int64
		if err := rows.Scan(&c.At, &c.Replica, &c.From, &c.To, &ms, &c.LastError); err != nil {
			return nil, fmt.Errorf("read the breakers' changes: %w", err)
		}
		c.Cooldown = time.Duration(ms) * time.Millisecond
		out = append(out, c)
	}
	return out, rows.Err()
}
