package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/relay/store"
)

// OrderHoldSource reports how strict-order delivery is held
// (store.Store).
type OrderHoldSource interface {
	OrderHold(ctx context.Context) (store.OrderHold, error)
}

// Defaults of OrderHoldWatch.
const (
	// DefaultOrderHoldEvery is how often the hold is looked at.
	DefaultOrderHoldEvery = time.Second
	// DefaultOrderHoldWarn is how long rows wait before the holding
	// transaction is logged.
	DefaultOrderHoldWarn = 5 * time.Second
)

// OrderHoldWatch shows, in strict order, how long rows wait for older
// transactions and which backend holds them: as gauges, and as one log
// line when a transaction has held them for Warn and one when they flow
// again. The holder's pid is a gauge's value, not a label.
type OrderHoldWatch struct {
	src   OrderHoldSource
	log   *slog.Logger
	Every time.Duration
	Warn  time.Duration

	held, age, pid prometheus.Gauge

	logged *store.OrderHolder // the holder last logged, while held
	since  time.Duration      // how long the logged hold had lasted
}

// NewOrderHoldWatch registers the strict-order gauges with reg.
func NewOrderHoldWatch(reg prometheus.Registerer, src OrderHoldSource, log *slog.Logger) (*OrderHoldWatch, error) {
	w := &OrderHoldWatch{
		src: src, log: log, Every: DefaultOrderHoldEvery, Warn: DefaultOrderHoldWarn,
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "strict_order_held_seconds",
			Help: "Strict order: how long the newest rows have waited for transactions that could still commit a smaller id; 0 when none waits.",
		}),
		age: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "strict_order_holder_age_seconds",
			Help: "Strict order: age of the oldest running transaction while rows wait for it; 0 when none waits or its start is not visible to the relay's role.",
		}),
		pid: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "strict_order_holder_pid",
			Help: "Strict order: backend process id of the oldest running transaction while rows wait for it; 0 when none waits or it is a prepared transaction.",
		}),
	}
	for _, c := range []prometheus.Collector{w.held, w.age, w.pid} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Run looks at the hold every Every until ctx ends.
func (w *OrderHoldWatch) Run(ctx context.Context) {
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

// Check looks at the hold once.
func (w *OrderHoldWatch) Check(ctx context.Context) {
	h, err := w.src.OrderHold(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("strict order: cannot find the holding transaction", slog.Any("error", err))
		}
		// Held is known without the database.
	}
	w.held.Set(h.Held.Seconds())
	var age time.Duration
	pid := 0
	if h.Holder != nil {
		age, pid = h.Holder.Age, h.Holder.PID
	}
	w.age.Set(age.Seconds())
	w.pid.Set(float64(pid))

	switch {
	case h.Held == 0 && w.logged != nil:
		w.log.Info("strict order: rows flow again", slog.Duration("held_for", w.since))
		w.logged = nil
	case h.Held >= w.Warn && h.Holder != nil &&
		(w.logged == nil || w.logged.PID != h.Holder.PID || w.logged.Prepared != h.Holder.Prepared):
		o := h.Holder
		w.log.Warn("strict order: rows wait for an older transaction to end",
			slog.Duration("held", h.Held), slog.Int("pid", o.PID), slog.String("prepared", o.Prepared),
			slog.Duration("transaction_age", o.Age), slog.String("database", o.Database), slog.String("user", o.User),
			slog.String("application", o.Application), slog.String("state", o.State))
		w.logged = o
	}
	if w.logged != nil {
		w.since = h.Held
	}
}
