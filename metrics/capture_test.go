package metrics_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay/logsource"
)

type slotSequence struct{ states []logsource.SlotState }

func (s *slotSequence) State(context.Context) (logsource.SlotState, error) {
	st := s.states[0]
	s.states = s.states[1:]
	return st, nil
}
func (s *slotSequence) Streaming() bool { return false }

// The slot's lag in time is how long its confirmed position has stood
// still with log past it; its state is one series at 1; a slot that turns
// unreserved, lost or missing is logged once.
func TestCaptureWatch(t *testing.T) {
	t.Parallel()
	st := func(confirmed string, lag int64, status string) logsource.SlotState {
		return logsource.SlotState{Exists: status != "missing", WALStatus: status, Confirmed: confirmed, LagBytes: lag}
	}
	src := &slotSequence{states: []logsource.SlotState{
		st("0/10", 100, "reserved"), st("0/10", 200, "reserved"), st("0/10", 300, "unreserved"),
		st("0/20", 50, "reserved"), st("0/20", 900, "lost"), st("0/20", 900, "lost"), st("", 0, "missing"),
	}}
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	w, err := metrics.NewCaptureWatch(reg, src, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	w.Now = func() time.Time { return now }
	var got []string
	for range 7 {
		w.Check(context.Background())
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, mf := range mfs {
			name := strings.TrimPrefix(mf.GetName(), "outbox_capture_")
			for _, m := range mf.GetMetric() {
				v := m.GetGauge().GetValue()
				if len(m.GetLabel()) > 0 {
					if v == 1 {
						parts = append(parts, m.GetLabel()[0].GetValue())
					}
					continue
				}
				if name != "streaming" {
					parts = append(parts, fmt.Sprintf("%s=%g", name, v))
				}
			}
		}
		got = append(got, strings.Join(parts, " "))
		now = now.Add(10 * time.Second)
	}
	want := []string{
		"slot_lag_bytes=100 slot_lag_seconds=0 reserved",
		"slot_lag_bytes=200 slot_lag_seconds=10 reserved",
		"slot_lag_bytes=300 slot_lag_seconds=20 unreserved",
		"slot_lag_bytes=50 slot_lag_seconds=0 reserved",
		"slot_lag_bytes=900 slot_lag_seconds=10 lost",
		"slot_lag_bytes=900 slot_lag_seconds=20 lost",
		"slot_lag_bytes=0 slot_lag_seconds=0 missing",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("gauges:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	l := logs.String()
	if strings.Count(l, "max_slot_wal_keep_size") != 1 || strings.Count(l, "slot is lost") != 1 || strings.Count(l, "slot is missing") != 1 {
		t.Errorf("logged:\n%s\nwant one line each for unreserved, lost and missing", l)
	}
}
