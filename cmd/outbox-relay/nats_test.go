package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/nats"
	"github.com/outbox-relay/outbox-relay/relay/nats/natstest"
)

// natsEnv is the environment of a relay that delivers only to the
// destinations of its configuration file.
func natsEnv(dsn, cfg string, extra ...string) []string {
	return append([]string{
		"OUTBOX_DATABASE_URL=" + dsn,
		"OUTBOX_CONFIG=" + cfg,
		"OUTBOX_RELAY_POLL_INTERVAL=50ms",
		"OUTBOX_ADMIN_LISTEN=127.0.0.1:0",
		"OUTBOX_LOG_LEVEL=info",
	}, extra...)
}

// natsConfig routes inventory.* to a NATS destination named stream.
func natsConfig(t *testing.T, url string) string {
	return writeConfig(t, `
retry:
  pause_base: 50ms
  pause_max: 200ms
destinations:
  stream:
    nats:
      servers: [`+url+`]
routes:
  - topics: ["inventory.*"]
    destination: stream
`)
}

// The binary routes topics to a JetStream stream from its configuration:
// 1,000 rows stored once each, every key's in order, and a row the server
// cannot take dead-lettered too_large beside them.
func TestRunDeliversToNATS(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	srv := natstest.Start(t, natstest.Options{MaxPayload: 64 << 10})
	js := srv.Connect()
	natstest.AddStream(t, js, "INVENTORY", "inventory.>")
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
SELECT 'inventory.updated', 'k' || (g % 20), CASE WHEN g = 500 THEN repeat('x', 100000)::bytea ELSE g::text::bytea END
FROM generate_series(1, 1001) g`); err != nil {
		t.Fatal(err)
	}
	p := startRelay(t, natsEnv(dsn, natsConfig(t, srv.URL)))
	testwait.Within(t, 90*time.Second, "every row settled", func() bool { return countRows(t, pool, "status = 'pending'") == 0 })
	if n := countRows(t, pool, "status = 'dead_lettered' AND dead_letter_reason = 'too_large' AND length(payload) = 100000"); n != 1 {
		t.Fatalf("%d rows dead-lettered too_large, want the one too large for the server; output:\n%s", n, p.output)
	}
	if n := countRows(t, pool, "true"); n != 1 {
		t.Fatalf("%d rows left, want only the dead letter", n)
	}
	msgs := natstest.Messages(t, js, "INVENTORY")
	if len(msgs) != 1000 {
		t.Fatalf("the stream holds %d messages, want 1000", len(msgs))
	}
	byKey := map[string][]int{}
	for _, m := range msgs {
		n, err := strconv.Atoi(string(m.Data))
		if err != nil || m.Header.Get("outbox-key") != "k"+strconv.Itoa(n%20) || m.Header.Get("Nats-Msg-Id") == "" {
			t.Fatalf("message %q with headers %v", m.Data, m.Header)
		}
		byKey[m.Header.Get("outbox-key")] = append(byKey[m.Header.Get("outbox-key")], n)
	}
	inOrder(t, "the stream", byKey)
}

// The server stops while rows arrive, for many failed probes of the
// breaker, then comes back: every row is delivered once, in order per key,
// none is dead-lettered, and no attempt is counted for the refused
// connections.
func TestRunRidesOutANATSOutage(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	dsn, pool := migrated(t)
	srv := natstest.Start(t, natstest.Options{})
	natstest.AddStream(t, srv.Connect(), "INVENTORY", "inventory.>")
	rows := rideOutOutage(t, pool, natsEnv(dsn, natsConfig(t, srv.URL)),
		serverOutage{dest: "stream", topic: "inventory.updated", stop: srv.Stop, start: srv.Restart})
	msgs := natstest.Messages(t, srv.Connect(), "INVENTORY")
	if len(msgs) != rows {
		t.Fatalf("the stream holds %d messages, want %d", len(msgs), rows)
	}
	byKey := map[string][]int{}
	for _, m := range msgs {
		n, _ := strconv.Atoi(string(m.Data))
		byKey[m.Header.Get("outbox-key")] = append(byKey[m.Header.Get("outbox-key")], n)
	}
	inOrder(t, "the stream", byKey)
}

// The kill-and-restart checker against a real NATS server: producers
// commit rows over three subjects while three relays are SIGKILLed at
// random and the server itself is restarted twice. Every committed row
// reaches the stream, no rolled-back one does, each key's rows are stored
// first in id order, and the stream drops the redeliveries kills cause
// (Nats-Msg-Id).
func TestKillRestartCheckerNATS(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	const (
		rows     = 8_000
		relays   = 3
		minKills = 3
	)
	dsn, pool := migrated(t)
	srv := natstest.Start(t, natstest.Options{})
	js := srv.Connect()
	natstest.AddStream(t, js, "CHECK", "events", "changes", "audit")
	cfg := writeConfig(t, `
destinations:
  stream:
    nats:
      servers: [`+srv.URL+`]
routes:
  - {topics: [events, changes, audit], destination: stream}
`)
	env := checkerEnv(dsn, cfg)
	book := newLedger()
	producing := produceChecked(t, pool, book, false, rows, []string{"events", "changes", "audit"})
	// The server goes down twice while rows are written and delivered.
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		for _, share := range []int{4, 2} { // after a quarter of the rows, then half
			if ok, _ := testwait.Poll(time.Minute, func() (bool, string) {
				return countRows(t, pool, "true") > 0 && book.committedCount() > rows/share, ""
			}); !ok {
				t.Error("the producers did not get far enough to restart the server")
				return
			}
			srv.Restart()
		}
	}()
	kills := killAtRandom(t, env, relays, minKills, producing)
	<-restarted
	if t.Failed() {
		return
	}
	drainCalmly(t, env, relays, pool)

	msgs := natstest.Messages(t, js, "CHECK")
	delivered := map[uuid.UUID]int{}
	var arrived []arrival
	for _, m := range msgs {
		eid, err := uuid.Parse(m.Header.Get(nats.HeaderEventID))
		id, err2 := strconv.ParseInt(m.Header.Get(nats.HeaderID), 10, 64)
		if err != nil || err2 != nil {
			t.Fatalf("message without valid ids: %v", m.Header)
		}
		if delivered[eid] == 0 {
			arrived = append(arrived, arrival{id: id, key: m.Header.Get(nats.HeaderKey), topic: m.Subject})
		}
		delivered[eid]++
	}
	// One destination: its order scope is every topic's.
	checkScopeOrder(t, arrived, "global")
	book.check(t, delivered)
	duplicates := len(msgs) - len(delivered)
	t.Logf("%d committed rows, %d messages in the stream, %d duplicates, kills per relay %v",
		book.committedCount(), len(msgs), duplicates, kills)
	if duplicates != 0 {
		t.Errorf("%d duplicates in the stream: within its duplicate window it must drop every redelivery", duplicates)
	}
	for i, k := range kills {
		if k < minKills {
			t.Errorf("relay %d was killed %d times, want at least %d", i, k, minKills)
		}
	}
}
