package main

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

// pubsubEmulator starts Pub/Sub's in-process fake on port (0: any) with
// the topic metrics.
func pubsubEmulator(t *testing.T, port int) *pstest.Server {
	t.Helper()
	srv := pstest.NewServerWithPort(port)
	if _, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/outbox-test/topics/metrics.cpu"}); err != nil {
		t.Fatal(err)
	}
	return srv
}

func pubsubConfig(t *testing.T, addr string) string {
	return writeConfig(t, `
retry:
  pause_base: 50ms
  pause_max: 200ms
destinations:
  gcp:
    pubsub:
      project: outbox-test
      emulator: `+addr+`
      max_message_bytes: 65536
      timeout: 2s
routes:
  - topics: ["metrics.*"]
    destination: gcp
`)
}

// ordered returns the emulator's messages by ordering key, as numbers.
func ordered(t *testing.T, srv *pstest.Server) (int, map[string][]int) {
	t.Helper()
	byKey := map[string][]int{}
	msgs := srv.Messages()
	for _, m := range msgs {
		n, err := strconv.Atoi(string(m.Data))
		if err != nil || m.OrderingKey != "k"+strconv.Itoa(n%20) || m.Attributes["outbox-event-id"] == "" {
			t.Fatalf("message %q ordering key %q attributes %v", m.Data, m.OrderingKey, m.Attributes)
		}
		byKey[m.OrderingKey] = append(byKey[m.OrderingKey], n)
	}
	return len(msgs), byKey
}

// The binary routes topics to Pub/Sub (here its emulator, pstest) from
// its configuration: 1,000 rows published, every key's in order, and a
// row too large dead-lettered too_large beside them.
func TestRunDeliversToPubSub(t *testing.T) {
	t.Parallel()
	srv := pubsubEmulator(t, 0)
	defer srv.Close()
	dsn, pool := migrated(t)
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
SELECT 'metrics.cpu', 'k' || (g % 20), CASE WHEN g = 500 THEN repeat('x', 100000)::bytea ELSE g::text::bytea END
FROM generate_series(1, 1001) g`); err != nil {
		t.Fatal(err)
	}
	p := startRelay(t, natsEnv(dsn, pubsubConfig(t, srv.Addr)))
	testwait.Within(t, 90*time.Second, "every row settled", func() bool { return countRows(t, pool, "status = 'pending'") == 0 })
	if n := countRows(t, pool, "status = 'dead_lettered' AND dead_letter_reason = 'too_large'"); n != 1 {
		t.Fatalf("%d rows dead-lettered too_large, want the one too large; output:\n%s", n, p.output)
	}
	n, byKey := ordered(t, srv)
	if n != 1000 {
		t.Fatalf("the emulator holds %d messages, want 1000", n)
	}
	inOrder(t, "Pub/Sub", byKey)
}

// The emulator goes away while rows arrive, for many failed probes of the
// breaker, and a new one comes up on its port: every row is published, in
// order per key, none is dead-lettered, and no attempt is counted for the
// refused connections.
func TestRunRidesOutAPubSubOutage(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	first := pubsubEmulator(t, port)
	dsn, pool := migrated(t)
	var before int
	var second *pstest.Server
	rows := rideOutOutage(t, pool, natsEnv(dsn, pubsubConfig(t, first.Addr)), serverOutage{dest: "gcp", topic: "metrics.cpu",
		stop:  func() { before, _ = ordered(t, first); _ = first.Close() },
		start: func() { second = pubsubEmulator(t, port) }})
	defer second.Close()
	after, byKey := ordered(t, second)
	if before != 200 || after != rows-200 {
		t.Fatalf("the emulators got %d and %d messages, want 200 and %d", before, after, rows-200)
	}
	inOrder(t, "Pub/Sub", byKey)
}
