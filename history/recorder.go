package history

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
)

// DefaultInterval is how often a Recorder writes: once a minute, just
// after the minute ends.
const DefaultInterval = time.Minute

// Recorder writes one outbox's counts, as one replica's metrics hold
// them, into its history, and the outbox's backlog when no other replica
// has this minute.
type Recorder struct {
	// Store is the outbox's history; Outbox its name in the metrics.
	Store  *Store
	Outbox string
	// Replica names this process among the relay's replicas.
	Replica string
	// Gatherer holds the relay's metrics: metrics.Relay's Gatherer, which
	// gathers them alone.
	Gatherer prometheus.Gatherer
	// Backlog counts the outbox's backlog.
	Backlog func(context.Context) (Backlog, error)
	// Changes returns the relay's breakers' latest changes (each
	// destination's, numbered by Seq); the recorder writes those this
	// replica made and has not written yet. Nil records none: one
	// outbox's recorder is enough.
	Changes func() []relay.BreakerChange
	// Interval is how often it writes, at most a minute: DefaultInterval
	// when zero.
	Interval time.Duration
	Logger   *slog.Logger

	// written are the counters' values last written, by destination.
	written map[string]Counts
	// since is when the counts not yet written began.
	since time.Time
	// lastSeq is the newest breaker change written, by destination.
	lastSeq map[string]uint64
}

// Run writes every Interval until ctx ends, then once more, so that a
// relay that stops leaves its last counts.
func (r *Recorder) Run(ctx context.Context) {
	every := r.Interval
	if every <= 0 || every > time.Minute {
		every = DefaultInterval
	}
	r.since = time.Now()
	// Just after each boundary of the interval, so that a minute's counts
	// land in that minute.
	next := time.Now().Truncate(every).Add(every + every/30)
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			r.write(fctx)
			return
		case <-timer.C:
			r.write(ctx)
			next = time.Now().Truncate(every).Add(every + every/30)
			timer.Reset(time.Until(next))
		}
	}
}

func (r *Recorder) write(ctx context.Context) {
	if err := r.Flush(ctx); err != nil && ctx.Err() == nil && r.Logger != nil {
		r.Logger.Warn("the console's history was not written; it will be next time", slog.String("outbox", r.Outbox), slog.Any("error", err))
	}
}

// Flush writes the counts since the last Flush that wrote, in the minute
// halfway through them, and the backlog if it is due. Counts it could not
// write are written by the next.
func (r *Recorder) Flush(ctx context.Context) error {
	now := time.Now()
	if r.since.IsZero() {
		r.since = now
	}
	cur, err := r.gather()
	if err != nil {
		return err
	}
	var delta []Counts
	for dest, c := range cur {
		w := r.written[dest]
		d := Counts{Destination: dest, Delivered: c.Delivered - w.Delivered, Retried: c.Retried - w.Retried,
			DeadLettered: c.DeadLettered - w.DeadLettered}
		if len(c.Lag) > 0 {
			d.Lag = make([]int64, len(c.Lag))
			for i := range c.Lag {
				d.Lag[i] = c.Lag[i]
				if i < len(w.Lag) {
					d.Lag[i] -= w.Lag[i]
				}
			}
		}
		delta = append(delta, d)
	}
	// Each destination's changes are numbered in order: a watermark per
	// destination. A destination keeps its last few changes only, so one
	// that flaps more often than that between two writes loses some.
	var changes []Change
	seqs := map[string]uint64{}
	if r.Changes != nil {
		for _, c := range r.Changes() {
			if c.Seq <= r.lastSeq[c.Destination] {
				continue
			}
			seqs[c.Destination] = max(seqs[c.Destination], c.Seq)
			if c.ByFleet {
				// The replica that made it records it.
				continue
			}
			changes = append(changes, Change{At: c.At, Destination: c.Destination, From: c.From.String(), To: c.To.String(),
				Cooldown: c.Cooldown, LastError: storable(c.LastError)})
		}
	}
	at := r.since.Add(now.Sub(r.since) / 2)
	if err := r.Store.Add(ctx, at, r.Replica, delta, changes...); err != nil {
		return err
	}
	r.written, r.since = cur, now
	if r.lastSeq == nil {
		r.lastSeq = map[string]uint64{}
	}
	for d, s := range seqs {
		r.lastSeq[d] = s
	}
	if r.Backlog != nil {
		return r.Store.RecordBacklog(ctx, now, r.Backlog)
	}
	return nil
}

// Metric names the recorder reads.
var (
	deliveredName    = metrics.Namespace + "_delivered_total"
	retriedName      = metrics.Namespace + "_retried_total"
	deadLetteredName = metrics.Namespace + "_dead_lettered_total"
	lagName          = metrics.Namespace + "_delivery_lag_seconds"
)

// gather reads the outbox's counters, by destination, as they stand.
func (r *Recorder) gather() (map[string]Counts, error) {
	families, err := r.Gatherer.Gather()
	if err != nil && len(families) == 0 {
		return nil, fmt.Errorf("history: read the metrics: %w", err)
	}
	out := map[string]Counts{}
	for _, f := range families {
		name := f.GetName()
		if name != deliveredName && name != retriedName && name != deadLetteredName && name != lagName {
			continue
		}
		for _, m := range f.GetMetric() {
			var outbox, dest string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "outbox":
					outbox = l.GetValue()
				case "destination":
					dest = l.GetValue()
				}
			}
			if outbox != r.Outbox {
				continue
			}
			c := out[dest]
			c.Destination = dest
			switch name {
			case deliveredName:
				c.Delivered += int64(m.GetCounter().GetValue())
			case retriedName:
				c.Retried += int64(m.GetCounter().GetValue())
			case deadLetteredName:
				c.DeadLettered += int64(m.GetCounter().GetValue())
			case lagName:
				c.Lag = lagCounts(m.GetHistogram())
			}
			out[dest] = c
		}
	}
	return out, nil
}

// lagCounts turns a histogram's cumulative buckets into counts per
// bucket, the last for the samples above every bound.
func lagCounts(h *dto.Histogram) []int64 {
	buckets := h.GetBucket()
	out := make([]int64, len(buckets)+1)
	var below uint64
	for i, b := range buckets {
		out[i] = int64(b.GetCumulativeCount() - below)
		below = b.GetCumulativeCount()
	}
	out[len(buckets)] = int64(h.GetSampleCount() - below)
	return out
}

// storable is an error as text the database takes: valid UTF-8 without
// NUL, at most 1,000 bytes.
func storable(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) > 1000 {
		s = strings.ToValidUTF8(s[:1000], "") + "…"
	}
	return s
}
