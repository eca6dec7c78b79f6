package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/relay/logsource"
)

// CaptureSource reports an outbox's replication slot (logsource.Source
// with the outbox's pool).
type CaptureSource interface {
	State(ctx context.Context) (logsource.SlotState, error)
	Streaming() bool
}

// DefaultCaptureEvery is how often a CaptureWatch looks at the slot.
const DefaultCaptureEvery = 10 * time.Second

// slotStatuses are the states outbox_capture_slot_status reports: the
// server's wal_status, and missing.
var slotStatuses = []string{"reserved", "extended", "unreserved", "lost", "missing"}

// CaptureWatch shows an outbox captured from the write-ahead log: how far
// its slot's confirmed position is behind the end of the log, in bytes
// and in time, the slot's wal_status, and whether this replica streams.
// The slot keeps that much log on the server's disk; a slot unreserved
// is about to lose messages, a lost one has.
type CaptureWatch struct {
	src   CaptureSource
	log   *slog.Logger
	Every time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time

	lagBytes, lagAge, streaming prometheus.Gauge
	status                      *prometheus.GaugeVec

	confirmed string
	since     time.Time // when the confirmed position last moved, or caught up
	was       string    // the last status, logged when it changes
}

// NewCaptureWatch registers the slot's gauges with reg.
func NewCaptureWatch(reg prometheus.Registerer, src CaptureSource, log *slog.Logger) (*CaptureWatch, error) {
	w := &CaptureWatch{
		src: src, log: log, Every: DefaultCaptureEvery,
		lagBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "capture_slot_lag_bytes",
			Help: "Bytes of write-ahead log past the replication slot's confirmed position: what the slot keeps on the server's disk.",
		}),
		lagAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "capture_slot_lag_seconds",
			Help: "How long the replication slot's confirmed position has stood still with log past it; 0 when it is caught up.",
		}),
		streaming: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "capture_streaming",
			Help: "1 on the replica that streams the outbox's messages from its replication slot, 0 on those that stand by.",
		}),
		status: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "capture_slot_status",
			Help: "1 for the replication slot's state: the server's wal_status (reserved, extended, unreserved: may lose log at the next checkpoint, lost: it has), or missing.",
		}, []string{"status"}),
	}
	for _, c := range []prometheus.Collector{w.lagBytes, w.lagAge, w.streaming, w.status} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Run looks at the slot every Every until ctx ends.
func (w *CaptureWatch) Run(ctx context.Context) {
	t := time.NewTicker(w.Every)
	defer t.Stop()
	for {
		w.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *CaptureWatch) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

// Check looks at the slot once.
func (w *CaptureWatch) Check(ctx context.Context) {
	w.streaming.Set(boolGauge(w.src.Streaming()))
	st, err := w.src.State(ctx)
	if err != nil {
		return // the database's own gauges and readiness say it is down
	}
	now := w.now()
	status := st.WALStatus
	if !st.Exists {
		status = "missing"
	}
	for _, s := range slotStatuses {
		w.status.WithLabelValues(s).Set(boolGauge(s == status))
	}
	if status != w.was {
		switch status {
		case "lost", "missing":
			w.log.Error("the outbox's replication slot is "+status+": see docs/capture.md", slog.String("confirmed", st.Confirmed))
		case "unreserved":
			w.log.Warn("the outbox's replication slot holds more log than max_slot_wal_keep_size: its messages may be lost at the next checkpoint",
				slog.Int64("lag_bytes", st.LagBytes))
		}
		w.was = status
	}
	w.lagBytes.Set(float64(st.LagBytes))
	if st.Confirmed != w.confirmed || st.LagBytes <= 0 || w.since.IsZero() {
		w.confirmed, w.since = st.Confirmed, now
	}
	w.lagAge.Set(now.Sub(w.since).Seconds())
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
