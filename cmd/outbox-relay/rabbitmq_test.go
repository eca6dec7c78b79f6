package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/dev/rabbitmqtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/rabbitmq"
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

// The node stops while rows arrive, for twenty failed probes of the
// breaker, then comes back: every row is confirmed, in order per key,
// none is dead-lettered, and no attempt is counted for the refused
// connections.
func TestRunRidesOutARabbitMQOutage(t *testing.T) {
	t.Parallel()
	node, ch := rabbitSetup(t)
	dsn, pool := migrated(t)
	p := startRelay(t, natsEnv(dsn, rabbitConfig(t, node.URL), "RABBIT_PASSWORD=guest", "OUTBOX_RELAY_SENT_RETENTION=1h"))
	addr := adminAddr(t, p)
	insert := func(from, to int) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
SELECT 'shipment.created', 'k' || (g % 20), g::text::bytea FROM generate_series($1::int, $2::int) g`, from, to); err != nil {
			t.Fatal(err)
		}
	}
	insert(1, 200)
	testwait.Within(t, 60*time.Second, "the first rows delivered", func() bool { return countRows(t, pool, "status = 'sent'") == 200 })
	node.Stop()
	insert(201, 500)
	testwait.Within(t, 60*time.Second, "20 failed probes", func() bool { return strings.Count(p.output.String(), "circuit opened") >= 20 })
	if s := scrapeMetrics(t, addr); s.sum("outbox_retried_total", "destination", "fulfilment") != 0 || s.sum("outbox_dead_lettered_total") != 0 {
		t.Fatalf("rows retried or dead-lettered while the node was down; output:\n%s", p.output)
	}
	node.Restart()
	testwait.Within(t, 90*time.Second, "every row delivered after the outage", func() bool { return countRows(t, pool, "status = 'sent'") == 500 })
	if n := countRows(t, pool, "retry_count > 0 OR status <> 'sent'"); n != 0 {
		t.Fatalf("%d rows counted an attempt or did not end sent; output:\n%s", n, p.output)
	}
	ch, err := node.Dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	n, byKey := drain(t, ch, "shipments")
	if n != 500 {
		t.Fatalf("the queue got %d messages, want 500", n)
	}
	inOrder(t, "the queue", byKey)
}
