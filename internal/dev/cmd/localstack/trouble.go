package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Outages of the in-process broker: down (every produce request's
// connection dropped) for outageLength every outageEvery.
const (
	outageEvery  = time.Minute
	outageLength = 10 * time.Second
)

// outages takes what is named down now and then, for outageLength,
// until ctx ends: down stops it, up brings it back. whose names the rows
// it holds, which the webhook's do not wait for.
func outages(ctx context.Context, what, whose string, down func(), up func() error) {
	t := time.NewTicker(outageEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		down()
		term.Printf("%s down for %s (on purpose): the webhook count keeps rising, its rows are not held back by %s", what, outageLength, whose)
		select {
		case <-ctx.Done():
			return
		case <-time.After(outageLength):
		}
		if err := up(); err != nil {
			term.Errorf("localstack: %v", err)
			return
		}
		term.Printf("%s back: %s rows catch up, each key's in id order", what, whose)
	}
}

// brokerOutages makes the in-process broker refuse produce requests now
// and then until ctx ends.
func brokerOutages(ctx context.Context, c *kfake.Cluster) {
	var down atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if down.Load() {
			return nil, errors.New("broker outage (localstack)"), true
		}
		return nil, nil, false
	})
	outages(ctx, "broker", "Kafka's", func() { down.Store(true) }, func() error { down.Store(false); return nil })
}

var orderID = regexp.MustCompile(`"order_id":([0-9]+)`)

// webhook is the demo's notification endpoint: it answers 503 with
// Retry-After to one request in eight, 422 to poison messages, and 204
// to the rest.
type webhook struct {
	url       string
	delivered atomic.Int64
}

func startWebhook() (*webhook, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, fmt.Errorf("webhook: %w", err)
	}
	h := &webhook{url: "http://" + ln.Addr().String() + "/hooks/notify"}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		switch {
		case strings.Contains(string(body), `"poison":true`):
			w.WriteHeader(http.StatusUnprocessableEntity)
			order := "?"
			if m := orderID.FindSubmatch(body); m != nil {
				order = string(m[1])
			}
			fmt.Fprintf(w, `{"error":"order %s: the customer's e-mail address bounced"}`, order)
		case mrand.IntN(8) == 0:
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, "mail service busy, try again shortly")
		default:
			h.delivered.Add(1)
			w.WriteHeader(http.StatusNoContent)
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	return h, func() { _ = srv.Close() }, nil
}

// orders is the orders' destination in the relay's configuration: its
// name, its entry under destinations (none for the kafka section's, whose
// brokers come from the environment), and the topic its route gives the
// orders, if any.
type orders struct{ name, entry, topic string }

var ordersToKafka = orders{name: "kafka"}

func ordersToNATS(url string) orders {
	return orders{name: "orders", entry: `
  orders:
    nats:
      servers: [` + url + `]`}
}

// writeConfig writes the relay's configuration for the demo: the
// notifications to the webhook, the rest to the orders' destination.
func writeConfig(hookURL string, o orders) (string, error) {
	dir, err := os.MkdirTemp("", "outbox-localstack-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "relay.yaml")
	cfg := `destinations:
  notify:
    http:
      url: ` + hookURL + `
      allow_private_networks: true
      timeout: 5s` + o.entry + `
routes:
  - topics: ["` + notifyTopic + `"]
    destination: notify
  - topics: ["*"]
    destination: ` + o.name + `
`
	if o.topic != "" {
		cfg += "    topic: " + o.topic + "\n"
	}
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return path, nil
}
