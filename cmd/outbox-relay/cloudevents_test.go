package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/cloudevents/cetest"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/nats/natstest"
	"github.com/outbox-relay/outbox-relay/relay/redis"
	"github.com/outbox-relay/outbox-relay/relay/redis/redistest"
)

// ceReceiver reads each request's event with the SDK's HTTP binding.
type ceReceiver struct {
	mu     sync.Mutex
	events []*event.Event
	errs   []error
}

func (c *ceReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
	_, _ = io.Copy(io.Discard, r.Body)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.errs = append(c.errs, err)
	} else {
		c.events = append(c.events, e)
	}
	w.WriteHeader(http.StatusNoContent)
}

// Destinations formatted as CloudEvents, one per sink and mode: the Kafka
// section's in binary mode (ce_ headers), an HTTP endpoint in binary mode
// (ce- headers), a NATS stream in structured mode, a RabbitMQ exchange in
// binary mode (cloudEvents_ headers), a Redis stream in structured mode
// and a Pub/Sub topic in binary mode (ce- attributes). Each receiver reads
// the events with the CloudEvents SDK, and each event is its row: id,
// source, type from the row's header or its topic, time, content type
// and data.
func TestRunWritesCloudEvents(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	recv := &ceReceiver{}
	hook := httptest.NewServer(recv)
	defer hook.Close()
	srv := natstest.Start(t, natstest.Options{})
	js := srv.Connect()
	natstest.AddStream(t, js, "STOCK", "stock.>")
	node, rch := rabbitSetup(t)
	rdb := redistest.Start(t, redistest.Options{})
	gcp := pubsubEmulator(t, 0)
	defer gcp.Close()
	cfg := writeConfig(t, `
destinations:
  kafka:
    format: cloudevents
    cloudevents: {source: "//shop.example.com/orders", type_header: type}
  hook:
    http: {url: "`+hook.URL+`", allow_private_networks: true}
    format: cloudevents
    cloudevents: {mode: binary, source: "urn:example:notifications"}
  stream:
    nats: {servers: ["`+srv.URL+`"]}
    format: cloudevents
    cloudevents: {mode: structured, source: "//shop.example.com/stock"}
  fulfilment:
    rabbitmq: {url: "`+node.URL+`", password_env: RABBIT_PASSWORD, exchange: shipments}
    format: cloudevents
    cloudevents: {source: "//shop.example.com/shipping"}
  activity:
    redis: {addresses: ["`+rdb.Addr+`"]}
    format: cloudevents
    cloudevents: {mode: structured, source: "//shop.example.com/activity"}
  gcp:
    pubsub: {project: outbox-test, emulator: "`+gcp.Addr+`"}
    format: cloudevents
    cloudevents: {source: "//shop.example.com/metrics"}
routes:
  - {topics: [orders], destination: kafka}
  - {topics: [notify], destination: hook}
  - {topics: ["stock.*"], destination: stream}
  - {topics: ["shipment.*"], destination: fulfilment}
  - {topics: ["activity.*"], destination: activity}
  - {topics: ["metrics.*"], destination: gcp}
`)
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload, headers)
SELECT (ARRAY['orders', 'notify', 'stock.changed', 'shipment.created', 'activity.click', 'metrics.cpu'])[1 + g % 6], 'k' || (g % 5), ('{"n":' || g || '}')::bytea,
       jsonb_build_object('content-type', 'application/json', 'type', 'shop.' || (ARRAY['order', 'notice', 'stock', 'shipment', 'click', 'metric'])[1 + g % 6])
FROM generate_series(1, 120) g`); err != nil {
		t.Fatal(err)
	}
	rows := map[string]struct {
		topic string
		at    time.Time
	}{}
	r, err := pool.Query(context.Background(), `SELECT event_id::text, topic, created_at FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var id, topic string
		var at time.Time
		if err := r.Scan(&id, &topic, &at); err != nil {
			t.Fatal(err)
		}
		rows[id] = struct {
			topic string
			at    time.Time
		}{topic, at}
	}
	p := startRelay(t, relayEnv(dsn, c, "OUTBOX_CONFIG="+cfg, "RABBIT_PASSWORD=guest"))
	testwait.Within(t, 60*time.Second, "every row delivered", func() bool { return countRows(t, pool, "true") == 0 })
	p.signal(t, syscall.SIGTERM)
	p.wait(t, time.Minute)

	check := func(where string, e *event.Event, source, typ string) {
		t.Helper()
		row, ok := rows[e.ID()]
		if !ok {
			t.Errorf("%s: event %s is no row's", where, e.ID())
			return
		}
		if e.Source() != source || e.Type() != typ || !e.Time().Equal(row.at) || e.DataContentType() != "application/json" || len(e.Data()) == 0 {
			t.Errorf("%s: event %s", where, e)
		}
		delete(rows, e.ID())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, rec := range kafkatest.ConsumeAll(ctx, t, c, "orders") {
		e, err := cetest.Parse("ce_", rec.Headers, rec.Value)
		if err != nil {
			t.Fatalf("kafka: the SDK cannot read the event: %v (headers %v)", err, rec.Headers)
		}
		check("kafka", e, "//shop.example.com/orders", "shop.order")
	}
	recv.mu.Lock()
	if len(recv.errs) > 0 {
		t.Fatalf("http: the SDK cannot read %d events: %v", len(recv.errs), recv.errs[0])
	}
	for _, e := range recv.events {
		check("http", e, "urn:example:notifications", "notify")
	}
	recv.mu.Unlock()
	for _, m := range natstest.Messages(t, js, "STOCK") {
		h := map[string]string{}
		for k, v := range m.Header {
			h[k] = v[0]
		}
		e, err := cetest.Parse("ce-", h, m.Data)
		if err != nil {
			t.Fatalf("nats: the SDK cannot read the event: %v (%s)", err, m.Data)
		}
		check("nats", e, "//shop.example.com/stock", "stock.changed")
	}
	for {
		m, ok, err := rch.Get("shipments", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		h := map[string]string{"content-type": m.ContentType}
		for k, v := range m.Headers {
			if s, ok := v.(string); ok {
				h[k] = s
			}
		}
		e, err := cetest.Parse("cloudEvents_", h, m.Body)
		if err != nil {
			t.Fatalf("rabbitmq: the SDK cannot read the event: %v (headers %v)", err, h)
		}
		check("rabbitmq", e, "//shop.example.com/shipping", "shipment.created")
	}
	for _, entry := range redistest.Entries(t, rdb.Client(nil), "activity.click") {
		var h map[string]string
		if err := json.Unmarshal([]byte(entry[redis.FieldHeaders].(string)), &h); err != nil {
			t.Fatal(err)
		}
		e, err := cetest.Parse("", h, []byte(entry[redis.FieldPayload].(string)))
		if err != nil {
			t.Fatalf("redis: the SDK cannot read the event: %v (%v)", err, entry)
		}
		check("redis", e, "//shop.example.com/activity", "activity.click")
	}
	for _, m := range gcp.Messages() {
		e, err := cetest.Parse("ce-", m.Attributes, m.Data)
		if err != nil {
			t.Fatalf("pubsub: the SDK cannot read the event: %v (attributes %v)", err, m.Attributes)
		}
		check("pubsub", e, "//shop.example.com/metrics", "metrics.cpu")
	}
	if len(rows) != 0 {
		t.Errorf("%d rows arrived as no event", len(rows))
	}
}
