package metrics_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

type horizonSequence struct {
	views []store.Horizon
	errs  []error
}

func (h *horizonSequence) Horizon(context.Context) (store.Horizon, error) {
	v, err := h.views[0], h.errs[0]
	h.views, h.errs = h.views[1:], h.errs[1:]
	return v, err
}

func TestHorizonWatch(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	report := store.HorizonHolder{Kind: "session", PID: 4242, User: "analyst", Application: "nightly-report", Xmin: "900", XidAge: 5000}
	slot := store.HorizonHolder{Kind: "slot", Name: "standby_1", Client: "physical", State: "inactive", Xmin: "950", XidAge: 4000}
	prepared := store.HorizonHolder{Kind: "prepared", Name: "tx-17", User: "app", Xmin: "990", XidAge: 100, Age: 6 * time.Minute}
	stats := func(scans, entries, rows int64) store.Horizon {
		return store.Horizon{IndexScans: scans, IndexEntries: entries, IndexRows: rows}
	}
	with := func(h store.Horizon, holders ...store.HorizonHolder) store.Horizon {
		h.Holders = holders
		return h
	}
	src := &horizonSequence{
		views: []store.Horizon{
			with(stats(10, 100, 100)),
			with(stats(20, 5100, 200), report),         // 10 scans passed 4,900 dead entries
			with(stats(20, 5100, 200), report, slot),   // no scans: nothing passed
			with(stats(30, 9100, 300), report, slot),   // the report has held it for the warning's time
			with(stats(40, 9200, 400), prepared, slot), // the report ended; a prepared transaction, open for 6 min
			{},                         // a failed look
			{},                         // and another
			with(stats(50, 9300, 500)), // all gone
		},
		errs: []error{nil, nil, nil, nil, nil, errors.New("connection refused"), errors.New("connection refused"), nil},
	}
	w, err := metrics.NewHorizonWatch(reg, src, log)
	if err != nil {
		t.Fatal(err)
	}
	w.Warn = 5 * time.Minute
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	w.Now = func() time.Time { return now }
	gauges := func() string {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, mf := range mfs {
			parts = append(parts, fmt.Sprintf("%s=%g", strings.TrimPrefix(mf.GetName(), "outbox_"), mf.GetMetric()[0].GetGauge().GetValue()))
		}
		sort.Strings(parts)
		return strings.Join(parts, " ")
	}
	steps := []struct {
		after time.Duration
		want  string
	}{
		{0, "index_dead_entries_per_scan=0 xmin_horizon_age_seconds=0 xmin_horizon_age_xids=0 xmin_horizon_holder_pid=0"},
		{10 * time.Second, "index_dead_entries_per_scan=490 xmin_horizon_age_seconds=0 xmin_horizon_age_xids=5000 xmin_horizon_holder_pid=4242"},
		{time.Minute, "index_dead_entries_per_scan=0 xmin_horizon_age_seconds=60 xmin_horizon_age_xids=5000 xmin_horizon_holder_pid=4242"},
		{5 * time.Minute, "index_dead_entries_per_scan=390 xmin_horizon_age_seconds=360 xmin_horizon_age_xids=5000 xmin_horizon_holder_pid=4242"},
		// The prepared transaction says its own age, longer than the slot's as seen.
		{time.Minute, "index_dead_entries_per_scan=0 xmin_horizon_age_seconds=360 xmin_horizon_age_xids=100 xmin_horizon_holder_pid=0"},
		// A failed look leaves the gauges as they were.
		{10 * time.Second, "index_dead_entries_per_scan=0 xmin_horizon_age_seconds=360 xmin_horizon_age_xids=100 xmin_horizon_holder_pid=0"},
		{10 * time.Second, "index_dead_entries_per_scan=0 xmin_horizon_age_seconds=360 xmin_horizon_age_xids=100 xmin_horizon_holder_pid=0"},
		{10 * time.Second, "index_dead_entries_per_scan=0 xmin_horizon_age_seconds=0 xmin_horizon_age_xids=0 xmin_horizon_holder_pid=0"},
	}
	for i, s := range steps {
		now = now.Add(s.after)
		w.Check(context.Background())
		if got := gauges(); got != s.want {
			t.Fatalf("check %d: %s, want %s", i, got, s.want)
		}
	}
	out := logs.String()
	for _, want := range []struct {
		text string
		n    int
	}{
		{"xmin horizon is held", 3},                      // the report, the prepared transaction, the slot: once each
		{"no longer held by it", 3},                      // each let go
		{"does not see other sessions' transactions", 1}, // said once
		{"cannot read the database's xmin horizon", 1},   // two failed looks, said once
		{"reading the database's xmin horizon again", 1},
	} {
		if got := strings.Count(out, want.text); got != want.n {
			t.Errorf("%d lines with %q, want %d:\n%s", got, want.text, want.n, out)
		}
	}
	for _, want := range []string{"pid=4242", "application=nightly-report", "user=analyst", "name=tx-17", "name=standby_1", "client=physical", "xid_age=5000"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
