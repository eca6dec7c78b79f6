package metrics_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

type holdSequence struct {
	holds []store.OrderHold
	err   error
}

func (h *holdSequence) OrderHold(context.Context) (store.OrderHold, error) {
	o := h.holds[0]
	h.holds = h.holds[1:]
	return o, h.err
}

func TestOrderHoldWatch(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	first := &store.OrderHolder{PID: 4242, Age: time.Minute, Application: "billing", State: "idle in transaction"}
	src := &holdSequence{holds: []store.OrderHold{
		{},
		{Held: 2 * time.Second, Holder: first}, // not yet long enough to log
		{Held: 6 * time.Second, Holder: first},
		{Held: 7 * time.Second, Holder: first}, // logged once
		{Held: 8 * time.Second, Holder: &store.OrderHolder{Prepared: "tx-17", Age: time.Hour, State: "prepared"}},
		{},
	}}
	w, err := metrics.NewOrderHoldWatch(reg, src, log)
	if err != nil {
		t.Fatal(err)
	}
	gauges := func() string {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, mf := range mfs {
			parts = append(parts, fmt.Sprintf("%s=%g", strings.TrimPrefix(mf.GetName(), "outbox_strict_order_"), mf.GetMetric()[0].GetGauge().GetValue()))
		}
		return strings.Join(parts, " ")
	}
	want := []string{
		"held_seconds=0 holder_age_seconds=0 holder_pid=0",
		"held_seconds=2 holder_age_seconds=60 holder_pid=4242",
		"held_seconds=6 holder_age_seconds=60 holder_pid=4242",
		"held_seconds=7 holder_age_seconds=60 holder_pid=4242",
		"held_seconds=8 holder_age_seconds=3600 holder_pid=0",
		"held_seconds=0 holder_age_seconds=0 holder_pid=0",
	}
	for i, w2 := range want {
		w.Check(context.Background())
		if got := gauges(); got != w2 {
			t.Fatalf("check %d: %s, want %s", i, got, w2)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "rows wait for an older transaction"); n != 2 {
		t.Errorf("%d warnings, want one per holder:\n%s", n, out)
	}
	for _, s := range []string{"pid=4242", "application=billing", "prepared=tx-17", `rows flow again" held_for=8s`} {
		if !strings.Contains(out, s) {
			t.Errorf("log lacks %q:\n%s", s, out)
		}
	}

	// A failed lookup still reports how long rows wait.
	src.holds, src.err = []store.OrderHold{{Held: time.Second}}, errors.New("connection refused")
	w.Check(context.Background())
	if got := gauges(); got != "held_seconds=1 holder_age_seconds=0 holder_pid=0" {
		t.Errorf("after a failed lookup: %s, want the time held", got)
	}
}
