package main

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// An outbox captured from the log, through the binary: without its slot
// the relay is not ready and says why, 'capture setup' makes it, and then
// messages emitted in transactions are delivered, the slot's state is in
// the metrics and readiness names the replica that streams.
func TestCaptureFromTheLogThroughTheBinary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, pool := migrated(t)
	var level string
	if err := pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Skipf("the server runs with wal_level %s; capture from the log needs logical", level)
	}
	c := kafkatest.NewCluster(t, []string{"orders"})
	env := relayEnv(dsn, c, "OUTBOX_RELAY_CAPTURE=log")

	if r := runBinary(t, env, "capture", "setup", "--check"); r.code == 0 ||
		!strings.Contains(r.stdout, "slot         MISSING") || !strings.Contains(r.stdout, "run 'outbox-relay capture setup'") {
		t.Fatalf("capture setup --check before set-up: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	p := startRelay(t, env)
	addr := adminAddr(t, p)
	testwait.For(t, "readiness to name the missing slot", func() bool {
		code, body := get(t, addr, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "capture: replication slot outbox_public does not exist")
	})

	captureLog(t, dsn, pool) // 'capture setup', as an operator would
	testwait.For(t, "readiness once the slot exists", func() bool {
		code, body := get(t, addr, "/readyz")
		return code == http.StatusOK && strings.Contains(body, `"streaming": true`)
	})
	producer, err := outbox.NewProducer(outbox.ProducerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := producer.Emit(ctx, tx, outbox.Message{Topic: "orders", Key: "k", Payload: []byte("1")},
		outbox.Message{Topic: "orders", Key: "k", Payload: []byte("2")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var got []uuid.UUID
	testwait.For(t, "both messages at the broker", func() bool {
		got = got[:0]
		for _, r := range kafkatest.ConsumeAll(cctx, t, c, "orders") {
			id, _ := uuid.Parse(r.Headers[kafka.HeaderEventID])
			got = append(got, id)
		}
		return len(got) >= 2
	})
	if len(got) != 2 || got[0] != ids[0] || got[1] != ids[1] {
		t.Fatalf("delivered %v, want %v in order", got, ids)
	}
	if n := countRows(t, pool, "true"); n != 0 {
		t.Errorf("%d rows in the table: delivered messages never touch it", n)
	}
	testwait.For(t, "the slot's state in the metrics", func() bool {
		s := scrapeMetrics(t, addr)
		st, ok := s["outbox_capture_slot_status"]
		if !ok {
			return false
		}
		for _, m := range st.GetMetric() {
			if m.GetGauge().GetValue() == 1 && m.GetLabel()[len(m.GetLabel())-1].GetValue() == "reserved" {
				_, lag := s["outbox_capture_slot_lag_bytes"]
				return lag
			}
		}
		return false
	})
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, time.Minute); code != 0 {
		t.Errorf("exit %d after SIGTERM:\n%s", code, p.output)
	}
}
