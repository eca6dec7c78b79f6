package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// The binary applies the kafka section's producer settings: zstd batches,
// each message stamped with its row's created_at, a tombstone from a row
// that asks for one, and a tombstone that cannot be dead-lettered with the
// reason while its neighbours are delivered.
func TestRunKafkaProducerSettings(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"customers"})
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (topic, key, payload, headers, created_at) VALUES
  ('customers', 'c-1', '{"name":"Ada"}', '{}', '2026-01-02 03:04:05.678+00'),
  ('customers', 'c-1', '', '{"outbox-tombstone":"true"}', '2026-01-02 03:04:06.001+00'),
  ('customers', 'c-2', 'not empty', '{"outbox-tombstone":"true"}', now()),
  ('customers', 'c-3', '{"name":"Grace"}', '{}', '2026-02-03 04:05:06.789+00')`); err != nil {
		t.Fatal(err)
	}
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_KAFKA_COMPRESSION=zstd", "OUTBOX_KAFKA_TIMESTAMP=created_at"))
	testwait.Within(t, 60*time.Second, "every row handled", func() bool { return countRows(t, pool, "status = 'pending'") == 0 })
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d; output:\n%s", code, p.output)
	}
	var reason, lastError string
	if err := pool.QueryRow(ctx, `SELECT dead_letter_reason, last_error FROM outbox WHERE status = 'dead_lettered' AND key = 'c-2'`).
		Scan(&reason, &lastError); err != nil {
		t.Fatalf("the bad tombstone's dead letter: %v", err)
	}
	if reason != "invalid_message" || !strings.Contains(lastError, "write an empty payload") {
		t.Fatalf("bad tombstone dead-lettered %s: %s", reason, lastError)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msgs := kafkatest.Consume(cctx, t, c.ListenAddrs(), "customers", 3)
	byKey := map[string][]kafkatest.Record{}
	for _, m := range msgs {
		byKey[string(m.Key)] = append(byKey[string(m.Key)], m)
	}
	want := map[string][]string{
		"c-1": {"2026-01-02T03:04:05.678Z", "2026-01-02T03:04:06.001Z"},
		"c-3": {"2026-02-03T04:05:06.789Z"},
	}
	for key, stamps := range want {
		got := byKey[key]
		if len(got) != len(stamps) {
			t.Fatalf("key %s: %d messages, want %d", key, len(got), len(stamps))
		}
		for i, ts := range stamps {
			if s := got[i].Timestamp.UTC().Format("2006-01-02T15:04:05.000Z"); s != ts {
				t.Errorf("key %s message %d: timestamp %s, want the row's created_at %s", key, i, s, ts)
			}
		}
	}
	if m := byKey["c-1"][1]; m.Value != nil || m.Headers["outbox-tombstone"] != "" {
		t.Fatalf("tombstone: value %q headers %v, want a null value without the request header", m.Value, m.Headers)
	}
	if string(byKey["c-1"][0].Value) != `{"name":"Ada"}` {
		t.Fatalf("c-1's first message is %q", byKey["c-1"][0].Value)
	}
}
