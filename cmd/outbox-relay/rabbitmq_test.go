package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/rabbitmq"
	"github.com/outbox-relay/outbox-relay/relay/rabbitmq/rabbitmqtest"
)

// rabbitSetup starts a node with an exchange shipments bound to a queue of
// the same name for shipment.created, and returns it with a channel.
func rabbitSetup(t *testing.T) (*rabbitmqtest.Node, *amqp.Channel) {
	t.Helper()
	node := rabbitmqtest.Start(t, rabbitmqtest.Options{})
	ch, err := node.Dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("shipments", "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("shipments", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("shipments", "shipment.created", "shipments", false, nil); err != nil {
		t.Fatal(err)
	}
	return node, ch
}

func rabbitConfig(t *testing.T, url string) string {
	return writeConfig(t, `
retry:
  pause_base: 50ms
  pause_max: 200ms
destinations:
  fulfilment:
    rabbitmq:
      url: `+url+`
      password_env: RABBIT_PASSWORD
      exchange: shipments
      max_message_bytes: 65536
routes:
  - topics: ["shipment.*"]
    destination: fulfilment
`)
}

// drain reads every message of queue, in order, as key and number.
func drain(t *testing.T, ch *amqp.Channel, queue string) (n int, byKey map[string][]int) {
	t.Helper()
	byKey = map[string][]int{}
	for {
		m, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return n, byKey
		}
		v, err := strconv.Atoi(string(m.Body))
		key, _ := m.Headers[rabbitmq.HeaderKey].(string)
		if err != nil || key != "k"+strconv.Itoa(v%20) || m.MessageId == "" {
			t.Fatalf("message %q with headers %v", m.Body, m.Headers)
		}
		n++
		byKey[key] = append(byKey[key], v)
	}
}

// The binary routes topics to a RabbitMQ exchange from its configuration:
// 1,000 rows confirmed, every key's in order, a row too large dead-lettered
// too_large beside them, and a topic no queue is bound for paused on its
// own, its rows waiting without an attempt counted.
func TestRunDeliversToRabbitMQ(t *testing.T) {
	t.Parallel()
	node, ch := rabbitSetup(t)
	dsn, pool := migrated(t)
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
SELECT 'shipment.created', 'k' || (g % 20), CASE WHEN g = 500 THEN repeat('x', 100000)::bytea ELSE g::text::bytea END
FROM generate_series(1, 1001) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('shipment.lost', 'z', 'nowhere')`); err != nil {
		t.Fatal(err)
	}
	p := startRelay(t, natsEnv(dsn, rabbitConfig(t, node.URL), "RABBIT_PASSWORD=guest"))
	testwait.Within(t, 90*time.Second, "every routable row settled", func() bool {
		return countRows(t, pool, "status = 'pending' AND topic = 'shipment.created'") == 0
	})
	if n := countRows(t, pool, "status = 'dead_lettered' AND dead_letter_reason = 'too_large' AND length(payload) = 100000"); n != 1 {
		t.Fatalf("%d rows dead-lettered too_large, want the one too large; output:\n%s", n, p.output)
	}
	if n := countRows(t, pool, "topic = 'shipment.lost' AND status = 'pending' AND retry_count = 0"); n != 1 {
		t.Fatalf("the unroutable row: %d pending without an attempt, want it waiting; output:\n%s", n, p.output)
	}
	n, byKey := drain(t, ch, "shipments")
	if n != 1000 {
		t.Fatalf("the queue got %d messages, want 1000", n)
	}
	inOrder(t, "the queue", byKey)
	if !strings.Contains(p.output.String(), "unroutable") {
		t.Errorf("the paused topic's reason is not logged; output:\n%s", p.output)
	}
}

// The node stops while rows arrive, for many failed probes of the
// breaker, then comes back: every row is confirmed, in order per key, none
// is dead-lettered, and no attempt is counted for the refused connections.
func TestRunRidesOutARabbitMQOutage(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	node, _ := rabbitSetup(t)
	dsn, pool := migrated(t)
	rows := rideOutOutage(t, pool, natsEnv(dsn, rabbitConfig(t, node.URL), "RABBIT_PASSWORD=guest"),
		serverOutage{dest: "fulfilment", topic: "shipment.created", stop: node.Stop, start: node.Restart})
	ch, err := node.Dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	n, byKey := drain(t, ch, "shipments")
	if n != rows {
		t.Fatalf("the queue got %d messages, want %d", n, rows)
	}
	inOrder(t, "the queue", byKey)
}

// The kill-and-restart checker against a real RabbitMQ node, restarted
// once meanwhile: every committed row is confirmed and queued, no
// rolled-back one, each key's rows first in id order; duplicates come
// only from kills and the restart.
func TestKillRestartCheckerRabbitMQ(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	const (
		rows     = 8_000
		relays   = 3
		minKills = 3
	)
	node, _ := rabbitSetup(t)
	dsn, pool := migrated(t)
	setup, err := node.Dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"events", "changes", "audit"} {
		if err := setup.QueueBind("shipments", k, "shipments", false, nil); err != nil {
			t.Fatal(err)
		}
	}
	cfg := writeConfig(t, `
destinations:
  fulfilment:
    rabbitmq: {url: "`+node.URL+`", password_env: RABBIT_PASSWORD, exchange: shipments}
routes:
  - {topics: [events, changes, audit], destination: fulfilment}
`)
	env := checkerEnv(dsn, cfg, "RABBIT_PASSWORD=guest")
	book := newLedger()
	producing := produceChecked(t, pool, book, false, rows, []string{"events", "changes", "audit"})
	killed := make(chan []int, 1)
	go func() { killed <- killAtRandom(t, env, relays, minKills, producing) }()
	if ok, _ := testwait.Poll(time.Minute, func() (bool, string) { return book.committedCount() > rows/3, "" }); ok {
		node.Restart()
	} else {
		t.Error("the producers did not get far enough to restart the node")
	}
	kills := <-killed
	if t.Failed() {
		return
	}
	drainCalmly(t, env, relays, pool)
	ch, err := node.Dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	delivered := map[uuid.UUID]int{}
	var arrived []arrival
	messages := 0
	for {
		m, ok, err := ch.Get("shipments", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		messages++
		eid, err := uuid.Parse(m.MessageId)
		idText, _ := m.Headers[rabbitmq.HeaderID].(string)
		id, err2 := strconv.ParseInt(idText, 10, 64)
		if err != nil || err2 != nil {
			t.Fatalf("message without valid ids: %s %v", m.MessageId, m.Headers)
		}
		key, _ := m.Headers[rabbitmq.HeaderKey].(string)
		if delivered[eid] == 0 {
			arrived = append(arrived, arrival{id: id, key: key, topic: m.RoutingKey})
		}
		delivered[eid]++
	}
	// One destination, one queue: its order scope is every topic's.
	checkScopeOrder(t, arrived, "global")
	book.check(t, delivered)
	t.Logf("%d committed rows, %d messages, %d duplicates, kills per relay %v",
		book.committedCount(), messages, messages-len(delivered), kills)
	for i, k := range kills {
		if k < minKills {
			t.Errorf("relay %d was killed %d times, want at least %d", i, k, minKills)
		}
	}
}
