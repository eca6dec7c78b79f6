package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kmsg"

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
		return code == http.StatusServiceUnavailable && strings.Contains(body, "capture: replication slot outbox_public_") && strings.Contains(body, "does not exist")
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
	// The slot's gauges (their changes are TestCaptureWatch's).
	s := scrapeMetrics(t, addr)
	for _, name := range []string{"outbox_capture_slot_status", "outbox_capture_slot_lag_bytes", "outbox_capture_slot_lag_seconds", "outbox_capture_streaming"} {
		if _, ok := s[name]; !ok {
			t.Errorf("/metrics has no %s", name)
		}
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, time.Minute); code != 0 {
		t.Errorf("exit %d after SIGTERM:\n%s", code, p.output)
	}
}

// SIGKILL while the relay streams a backlog from the log: the next relay
// starts from the confirmed position; nothing is lost, each key stays in
// commit order, and what is delivered twice is at most the batch that
// was in flight.
func TestCaptureSIGKILLMidStream(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	dsn, pool := migrated(t)
	captureLog(t, dsn, pool)
	const (
		messages = 20_000
		batch    = 200
	)
	c := kafkatest.NewCluster(t, []string{"orders"})
	var produced atomic.Int64
	kafkatest.WatchProduce(c, func(string, int32, *kmsg.Record) { produced.Add(1) })
	producer, err := outbox.NewProducer(outbox.ProducerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < messages; n += batch {
		msgs := make([]outbox.Message, batch)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "orders", Key: fmt.Sprintf("k%d", (n+i)%100), Payload: []byte(strconv.Itoa(n + i))}
		}
		if _, err := producer.Emit(ctx, pool, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	var end string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		t.Fatal(err)
	}
	env := relayEnv(dsn, c, "OUTBOX_RELAY_CAPTURE=log", "OUTBOX_RELAY_WORKERS=1", fmt.Sprintf("OUTBOX_RELAY_BATCH_SIZE=%d", batch))
	p := startRelay(t, env)
	testwait.For(t, "a quarter of the messages at the broker", func() bool { return produced.Load() >= messages/4 })
	p.signal(t, syscall.SIGKILL)
	p.wait(t, time.Minute)
	killedAt := produced.Load()

	p = startRelay(t, env)
	testwait.Within(t, 2*time.Minute, "the slot to confirm every message", func() bool {
		var done bool
		if err := pool.QueryRow(ctx, "SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = outbox_capture_slot()", end).Scan(&done); err != nil {
			t.Fatal(err)
		}
		return done
	})
	p.signal(t, syscall.SIGTERM)
	p.wait(t, time.Minute)

	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	seen := map[string]int{}
	last := map[string]int{}
	firsts := 0
	for _, r := range kafkatest.ConsumeAll(cctx, t, c, "orders") {
		n, _ := strconv.Atoi(string(r.Value))
		seen[string(r.Value)]++
		if seen[string(r.Value)] > 1 {
			continue
		}
		firsts++
		if l, ok := last[string(r.Key)]; ok && n < l {
			t.Errorf("key %s: message %d first delivered after %d", r.Key, n, l)
		}
		last[string(r.Key)] = n
	}
	dups := 0
	for _, k := range seen {
		dups += k - 1
	}
	t.Logf("%d messages, %d delivered before the kill, %d delivered twice", messages, killedAt, dups)
	if firsts != messages {
		t.Errorf("%d of %d messages delivered", firsts, messages)
	}
	if dups > batch {
		t.Errorf("%d messages delivered twice, more than the batch of %d in flight", dups, batch)
	}
}
