package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/internal/dev/tlstest"
	"github.com/outbox-relay/outbox-relay/relay/rabbitmq"
	"github.com/outbox-relay/outbox-relay/relay/rabbitmq/rabbitmqtest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

var exchanges atomic.Int64

// declare declares a direct exchange of its own with a queue bound for
// each routing key, and returns the exchange and a function that returns
// the bodies the queue received so far, in order.
func declare(t *testing.T, node *rabbitmqtest.Node, keys ...string) (string, func(*testing.T) []string) {
	t.Helper()
	q := declareQueue(t, node, keys...)
	return q.name, q.bodies
}

// queue is a test's queue, bound to an exchange of the same name, and
// what it received so far.
type queue struct {
	name string
	ch   *amqp.Channel
	mu   sync.Mutex
	got  []amqp.Delivery
}

// declareQueue declares a direct exchange of its own with a queue bound
// for each routing key.
func declareQueue(t *testing.T, node *rabbitmqtest.Node, keys ...string) *queue {
	t.Helper()
	ch, err := node.Dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("test-%d", exchanges.Add(1))
	if err := ch.ExchangeDeclare(name, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := ch.QueueBind(name, k, name, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	return &queue{name: name, ch: ch}
}

// received returns the messages the queue received so far, in order.
func (q *queue) received(t *testing.T) []amqp.Delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		m, ok, err := q.ch.Get(q.name, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return append([]amqp.Delivery(nil), q.got...)
		}
		q.got = append(q.got, m)
	}
}

// bodies returns the bodies the queue received so far, in order.
func (q *queue) bodies(t *testing.T) []string {
	var out []string
	for _, m := range q.received(t) {
		out = append(out, string(m.Body))
	}
	return out
}

// headers returns the headers of the messages the queue received so
// far, by body: the content-type header is the message's property.
func (q *queue) headers(t *testing.T) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, m := range q.received(t) {
		h := map[string]string{}
		for k, v := range m.Headers {
			h[k] = fmt.Sprint(v)
		}
		if m.ContentType != "" {
			h["content-type"] = m.ContentType
		}
		out[string(m.Body)] = h
	}
	return out
}

func newPublisher(t *testing.T, c rabbitmq.Config) *rabbitmq.Publisher {
	t.Helper()
	if c.Name == "" {
		c.Name = "test"
	}
	p, err := rabbitmq.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func rec(id int64, topic, key, payload string) sink.Record {
	return sink.Record{ID: id, EventID: uuid.New(), Topic: topic, Key: key, HasKey: key != "",
		Payload: []byte(payload), PayloadSize: len(payload), Headers: map[string]string{"content-type": "text/plain", "x-trace": "t1"}}
}

func publish(t *testing.T, p *rabbitmq.Publisher, recs ...sink.Record) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.Publish(ctx, recs)
}

// One node serves the sink's own tests but those that stop it or need
// users or TLS.
func TestMessagesReturnsAndOutages(t *testing.T) {
	t.Parallel()
	node := rabbitmqtest.Start(t, rabbitmqtest.Options{Users: map[string]string{"relay": "s3cret"}})

	t.Run("message properties and headers", func(t *testing.T) {
		exchange, _ := declare(t, node, "orders")
		ch, err := node.Dial(amqp.Config{}).Channel()
		if err != nil {
			t.Fatal(err)
		}
		p := newPublisher(t, rabbitmq.Config{URL: node.URL, Password: "guest", Exchange: exchange, ClientName: "relay-a orders"})
		r := rec(7, "orders", "c-1", "hello")
		if errs := publish(t, p, r); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if out := node.Ctl("list_connections", "client_properties"); !strings.Contains(out, "relay-a orders") {
			t.Errorf("no connection named relay-a orders at the broker:\n%s", out)
		}
		m, ok, err := ch.Get(exchange, true)
		if err != nil || !ok {
			t.Fatalf("no message: %v", err)
		}
		if m.MessageId != r.EventID.String() || m.DeliveryMode != amqp.Persistent || m.ContentType != "text/plain" ||
			m.Headers[rabbitmq.HeaderKey] != "c-1" || m.Headers[rabbitmq.HeaderID] != "7" || m.Headers["x-trace"] != "t1" ||
			m.Headers[rabbitmq.HeaderEventID] != r.EventID.String() || string(m.Body) != "hello" {
			t.Errorf("message %+v", m)
		}
	})

	t.Run("unroutable is the topic's failure", func(t *testing.T) {
		exchange, accepted := declare(t, node, "orders")
		p := newPublisher(t, rabbitmq.Config{URL: node.URL, Password: "guest", Exchange: exchange})
		errs := publish(t, p, rec(1, "payments", "k", "1"), rec(2, "orders", "j", "2"), rec(3, "orders", "k", "3"))
		ce := sink.Classify(errs[0])
		if errs[0] == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeTopic || !strings.Contains(errs[0].Error(), "unroutable") {
			t.Errorf("an unroutable message: %v (%s, %s), want a systemic failure of its topic", errs[0], ce.Class, ce.Scope)
		}
		if errs[1] != nil || !errors.Is(errs[2], sink.ErrNotSent) {
			t.Errorf("beside it: %v, %v", errs[1], errs[2])
		}
		if got := accepted(t); len(got) != 1 || got[0] != "2" {
			t.Errorf("the queue got %v, want only 2", got)
		}
	})

	t.Run("missing exchange is the destination's failure", func(t *testing.T) {
		p := newPublisher(t, rabbitmq.Config{URL: node.URL, Password: "guest", Exchange: "no-such-exchange"})
		err := publish(t, p, rec(1, "orders", "k", "1"))[0]
		if ce := sink.Classify(err); err == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeDestination || !strings.Contains(err.Error(), "does not exist") {
			t.Errorf("a missing exchange: %v (%s, %s)", err, ce.Class, ce.Scope)
		}
	})

	t.Run("wrong password is the destination's failure", func(t *testing.T) {
		u := strings.Replace(node.URL, "guest@", "relay@", 1)
		bad := newPublisher(t, rabbitmq.Config{URL: u, Password: "wrong"})
		err := publish(t, bad, rec(1, "orders", "k", "1"))[0]
		if ce := sink.Classify(err); err == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeDestination {
			t.Errorf("wrong password: %v (%s, %s)", err, ce.Class, ce.Scope)
		}
		exchange, _ := declare(t, node, "orders")
		good := newPublisher(t, rabbitmq.Config{URL: u, Password: "s3cret", Exchange: exchange})
		if errs := publish(t, good, rec(2, "orders", "k", "2")); errs[0] != nil {
			t.Errorf("the right password: %v", errs[0])
		}
	})
}

// A node that stops fails the publish as the destination's systemic
// failure; once it is back the publisher connects again by itself.
func TestNodeStopsAndComesBack(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	node := rabbitmqtest.Start(t, rabbitmqtest.Options{})
	exchange, accepted := declare(t, node, "orders")
	p := newPublisher(t, rabbitmq.Config{URL: node.URL, Password: "guest", Exchange: exchange})
	if errs := publish(t, p, rec(1, "orders", "k", "1")); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if got := accepted(t); len(got) != 1 {
		t.Fatalf("before the stop: %v", got)
	}
	node.Stop()
	testwait.For(t, "a publish to fail as the destination's systemic failure", func() bool {
		err := publish(t, p, rec(2, "orders", "k", "2"))[0]
		ce := sink.Classify(err)
		return err != nil && ce.Class == sink.ClassSystemic && ce.Scope == sink.ScopeDestination
	})
	node.Restart()
	testwait.For(t, "a publish after the restart", func() bool { return publish(t, p, rec(3, "orders", "k", "3"))[0] == nil })
	_, accepted = declareExisting(t, node, exchange)
	if got := accepted(t); len(got) == 0 || got[len(got)-1] != "3" {
		t.Errorf("after the restart the queue holds %v", got)
	}
}

// declareExisting reads the queue of an exchange declared before a
// restart (durable, so it is still there).
func declareExisting(t *testing.T, node *rabbitmqtest.Node, name string) (string, func(*testing.T) []string) {
	t.Helper()
	ch, err := node.Dial(amqp.Config{}).Channel()
	if err != nil {
		t.Fatal(err)
	}
	return name, func(t *testing.T) []string {
		var got []string
		for {
			m, ok, err := ch.Get(name, true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return got
			}
			got = append(got, string(m.Body))
		}
	}
}

// TLS with the sink's settings: roots from a file, an amqps URL.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "rabbitmq test CA")
	certPEM, keyPEM := tlstest.PEM(t, ca.Server(t, "localhost"))
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	caFile := write("ca.pem", ca.PEM())
	node := rabbitmqtest.Start(t, rabbitmqtest.Options{TLSCert: write("cert.pem", certPEM), TLSKey: write("key.pem", keyPEM), TLSCA: caFile})
	s := &rabbitmq.Settings{URL: node.URL, PasswordEnv: "PW"}
	s.TLS.CAFile, s.TLS.ServerName = caFile, "localhost"
	if err := errors.Join(s.Resolve(func(string) (string, bool) { return "guest", true }), s.Validate()); err != nil {
		t.Fatal(err)
	}
	c, err := s.Config("tls", 0)
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, c)
	// The default exchange routes to the queue named by the routing key.
	tlsConn := node.Dial(amqp.Config{TLSClientConfig: c.TLS})
	ch, err := tlsConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("orders", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if errs := publish(t, p, rec(1, "orders", "k", "1")); errs[0] != nil {
		t.Fatalf("over TLS: %v", errs[0])
	}
	untrusted := newPublisher(t, rabbitmq.Config{URL: node.URL, Password: "guest"})
	err = publish(t, untrusted, rec(2, "orders", "k", "2"))[0]
	if ce := sink.Classify(err); err == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeDestination {
		t.Errorf("an untrusted certificate: %v (%s, %s)", err, ce.Class, ce.Scope)
	}
}

func TestSettingsValidate(t *testing.T) {
	t.Parallel()
	s := &rabbitmq.Settings{URL: "amqp://u:pw@host/", MaxMessageBytes: -1, ConfirmTimeout: -time.Second}
	s.TLS.Enabled = true
	err := errors.Join(s.Resolve(nil), s.Validate())
	for _, want := range []string{"url: no password in it", "max_message_bytes is -1", "confirm_timeout is -1s", "tls.enabled is not used"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v; want it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "pw") {
		t.Errorf("the error shows the password: %v", err)
	}
	if err := (&rabbitmq.Settings{URL: "http://x"}).Validate(); err == nil || !strings.Contains(err.Error(), "use amqp://") {
		t.Errorf("an http URL: %v", err)
	}
}

// A memory alarm blocks publishing: once the broker says so, the
// destination's systemic failure at once, without waiting on a blocked
// socket; once the alarm clears, messages go again. A message sent before
// the broker said so has an unknown outcome (no confirm in time): it may
// arrive later, in its place.
func TestMemoryAlarmBlocksPublishing(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	node := rabbitmqtest.Start(t, rabbitmqtest.Options{})
	exchange, accepted := declare(t, node, "orders")
	p := newPublisher(t, rabbitmq.Config{URL: node.URL, Password: "guest", Exchange: exchange, ConfirmTimeout: 2 * time.Second})
	if errs := publish(t, p, rec(1, "orders", "k", "1")); errs[0] != nil {
		t.Fatal(errs[0])
	}
	node.Ctl("set_vm_memory_high_watermark", "0.000001")
	testwait.For(t, "a publish to fail as blocked by the alarm", func() bool {
		err := publish(t, p, rec(2, "orders", "k", "2"))[0]
		ce := sink.Classify(err)
		return err != nil && ce.Class == sink.ClassSystemic && ce.Scope == sink.ScopeDestination && strings.Contains(err.Error(), "blocks publishing")
	})
	node.Ctl("set_vm_memory_high_watermark", "0.8")
	testwait.For(t, "a publish once the alarm cleared", func() bool { return publish(t, p, rec(3, "orders", "k", "3"))[0] == nil })
	if got := strings.Join(accepted(t), " "); got != "1 3" && got != "1 2 3" {
		t.Errorf("the queue holds %s, want 1 and 3, and 2 between them at most", got)
	}
}

// A message the broker refuses by closing the channel (406, above its
// max_message_size) is dead-lettered alone: the other keys' messages the
// channel took down with it fail without being blamed, and the key's
// later message is not sent.
func TestChannelClosedOverOneMessage(t *testing.T) {
	t.Parallel()
	node := rabbitmqtest.Start(t, rabbitmqtest.Options{Conf: []string{"max_message_size = 4096"}})
	exchange, accepted := declare(t, node, "orders")
	p := newPublisher(t, rabbitmq.Config{URL: node.URL, Password: "guest", Exchange: exchange})
	errs := publish(t, p, rec(1, "orders", "a", "1"), rec(2, "orders", "big", strings.Repeat("x", 10000)),
		rec(3, "orders", "b", "3"), rec(4, "orders", "big", "4"))
	if ce := sink.Classify(errs[0]); errs[0] != nil && ce.Class == sink.ClassPermanent {
		t.Errorf("the message before the culprit: %v, want it delivered or not permanent", errs[0])
	}
	if ce := sink.Classify(errs[1]); errs[1] == nil || ce.Class != sink.ClassPermanent || ce.Reason != sink.ReasonTooLarge {
		t.Errorf("the message above max_message_size: %v (%s %q), want permanent too_large", errs[1], ce.Class, ce.Reason)
	}
	if ce := sink.Classify(errs[2]); errs[2] != nil && ce.Class == sink.ClassPermanent {
		t.Errorf("another key's message the closing channel took down: %v, want it not permanent", errs[2])
	}
	if !errors.Is(errs[3], sink.ErrNotSent) {
		t.Errorf("the key's later message: %v, want not sent", errs[3])
	}
	if errs := publish(t, p, rec(5, "orders", "b", "5")); errs[0] != nil {
		t.Errorf("after the channel closed: %v; the next publish opens another", errs[0])
	}
	if got := accepted(t); len(got) == 0 || got[len(got)-1] != "5" {
		t.Errorf("the queue holds %v", got)
	}
	// The channel closes while the round is still being sent: the key's
	// later message is still not sent, and the rest are not blamed.
	recs := []sink.Record{rec(10, "orders", "big", strings.Repeat("x", 10000))}
	for i := range 300 {
		recs = append(recs, rec(int64(11+i), "orders", fmt.Sprintf("k%d", i), "x"))
	}
	recs = append(recs, rec(400, "orders", "big", "400"))
	errs = publish(t, p, recs...)
	if ce := sink.Classify(errs[0]); errs[0] == nil || ce.Reason != sink.ReasonTooLarge {
		t.Errorf("the message above max_message_size: %v, want permanent too_large", errs[0])
	}
	for i, err := range errs[1 : len(errs)-1] {
		if ce := sink.Classify(err); err != nil && ce.Class == sink.ClassPermanent {
			t.Errorf("another key's message %d: %v, want it delivered or not permanent", i+1, err)
		}
	}
	if err := errs[len(errs)-1]; !errors.Is(err, sink.ErrNotSent) {
		t.Errorf("the key's later message, behind a round the closing channel cut short: %v, want not sent", err)
	}
}
