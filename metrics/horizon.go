package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/relay/store"
)

// HorizonSource reports what holds the outbox database's xmin horizon
// (store.Store).
type HorizonSource interface {
	Horizon(ctx context.Context) (store.Horizon, error)
}

// Defaults of HorizonWatch.
const (
	// DefaultHorizonEvery is how often the horizon is looked at.
	DefaultHorizonEvery = 10 * time.Second
	// DefaultHorizonWarn is how long a holder keeps the horizon before it
	// is logged.
	DefaultHorizonWarn = 5 * time.Minute
)

// HorizonWatch shows what keeps the outbox database's deleted rows from
// being removed: the age of the oldest holder of the xmin horizon as
// gauges, one warning line per holder that has kept it for Warn (naming
// it), and a line when it lets go. It also shows how many index entries of
// deleted rows each scan of the outbox's pending-row indexes passed over.
//
// A holder's age is how long its transaction has been open where
// PostgreSQL says (a session's, to a role with pg_read_all_stats; a
// prepared transaction's), and otherwise how long the watch has seen it
// hold the horizon: slots and standbys do not say since when.
type HorizonWatch struct {
	src   HorizonSource
	log   *slog.Logger
	Every time.Duration
	Warn  time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time

	age, xids, pid, dead prometheus.Gauge

	seen     map[string]time.Time // when each holder was first seen
	warned   map[string]store.HorizonHolder
	told     bool // that the role does not see other sessions' details
	failing  bool // the last look failed, and that was logged
	last     store.Horizon
	haveLast bool
}

// NewHorizonWatch registers the horizon's gauges with reg.
func NewHorizonWatch(reg prometheus.Registerer, src HorizonSource, log *slog.Logger) (*HorizonWatch, error) {
	w := &HorizonWatch{
		src: src, log: log, Every: DefaultHorizonEvery, Warn: DefaultHorizonWarn,
		seen: map[string]time.Time{}, warned: map[string]store.HorizonHolder{},
		age: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "xmin_horizon_age_seconds",
			Help: "How long the oldest holder of the outbox database's xmin horizon (a session's snapshot, a prepared transaction, a replication slot, a standby's feedback) has kept deleted rows from being removed; 0 when none does.",
		}),
		xids: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "xmin_horizon_age_xids",
			Help: "How many transactions old the outbox database's xmin horizon is; 0 when nothing holds it.",
		}),
		pid: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "xmin_horizon_holder_pid",
			Help: "Backend process id of the oldest holder of the xmin horizon; 0 for a prepared transaction, an inactive slot, or none.",
		}),
		dead: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "index_dead_entries_per_scan",
			Help: "Index entries that gave no row (those of deleted rows, mostly) per scan of the outbox's pending-row indexes, over the last interval.",
		}),
	}
	for _, c := range []prometheus.Collector{w.age, w.xids, w.pid, w.dead} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Run looks at the horizon every Every until ctx ends.
func (w *HorizonWatch) Run(ctx context.Context) {
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

func (w *HorizonWatch) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

// Check looks at the horizon once.
func (w *HorizonWatch) Check(ctx context.Context) {
	h, err := w.src.Horizon(ctx)
	if err != nil {
		if ctx.Err() == nil && !w.failing {
			w.log.Warn("cannot read the database's xmin horizon; trying again", slog.Any("error", err))
			w.failing = true
		}
		return
	}
	if w.failing {
		w.log.Info("reading the database's xmin horizon again")
		w.failing = false
	}
	if !h.Privileged && !w.told {
		w.log.Info("the relay's role does not see other sessions' transactions in full: a holder of the xmin horizon is named by pid, user and application, and its age counts from when the relay first saw it; grant the role pg_monitor to see more")
		w.told = true
	}
	now := w.now()
	current := make(map[string]bool, len(h.Holders))
	var oldest time.Duration
	for i, o := range h.Holders {
		id := o.Identity()
		current[id] = true
		first, ok := w.seen[id]
		if !ok {
			first = now
			w.seen[id] = now
		}
		age := max(o.Age, now.Sub(first))
		if i == 0 {
			oldest = age
			w.xids.Set(float64(o.XidAge))
			w.pid.Set(float64(o.PID))
		}
		oldest = max(oldest, age)
		if _, done := w.warned[id]; age >= w.Warn && !done {
			w.log.Warn("the database's xmin horizon is held: rows deleted since cannot be removed, and every index scan from their start passes over them",
				append(holderAttrs(o), slog.Duration("held", age), slog.Int64("xid_age", o.XidAge))...)
			w.warned[id] = o
		}
	}
	if len(h.Holders) == 0 {
		w.xids.Set(0)
		w.pid.Set(0)
	}
	w.age.Set(oldest.Seconds())
	for id, o := range w.warned {
		if !current[id] {
			w.log.Info("the database's xmin horizon is no longer held by it", append(holderAttrs(o), slog.Duration("held_for", now.Sub(w.seen[id])))...)
			delete(w.warned, id)
		}
	}
	for id := range w.seen {
		if !current[id] {
			delete(w.seen, id)
		}
	}
	if w.haveLast {
		scans := h.IndexScans - w.last.IndexScans
		gone := (h.IndexEntries - w.last.IndexEntries) - (h.IndexRows - w.last.IndexRows)
		switch {
		case scans > 0 && gone >= 0:
			w.dead.Set(float64(gone) / float64(scans))
		case scans == 0:
			w.dead.Set(0)
		}
	}
	w.last, w.haveLast = h, true
}

func holderAttrs(o store.HorizonHolder) []any {
	a := []any{slog.String("kind", o.Kind), slog.String("xmin", o.Xmin)}
	if o.PID != 0 {
		a = append(a, slog.Int("pid", o.PID))
	}
	for _, kv := range [][2]string{{"name", o.Name}, {"user", o.User}, {"application", o.Application}, {"state", o.State}, {"client", o.Client}} {
		if kv[1] != "" {
			a = append(a, slog.String(kv[0], kv[1]))
		}
	}
	return a
}
