package rabbitmq_test

import (
	"net"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/relay/publishertest"
	"github.com/outbox-relay/outbox-relay/relay/rabbitmq"
	"github.com/outbox-relay/outbox-relay/relay/rabbitmq/rabbitmqtest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

const maxMessage = 64 << 10

func TestConformance(t *testing.T) {
	t.Parallel()
	node := rabbitmqtest.Start(t, rabbitmqtest.Options{})
	publishertest.Run(t, publishertest.Sink{
		New: func(t *testing.T) publishertest.Destination {
			q := declareQueue(t, node, publishertest.TopicA, publishertest.TopicB)
			return publishertest.Destination{
				Publisher: newPublisher(t, rabbitmq.Config{URL: node.URL, Password: "guest", Exchange: q.name, MaxMessageBytes: maxMessage}),
				Accepted:  q.bodies,
				Headers:   q.headers,
			}
		},
		Reject:   func(rec *sink.Record) { rec.Topic = strings.Repeat("x", 300) },
		TooLarge: func(rec *sink.Record) { rec.Payload = []byte(strings.Repeat("x", 2*maxMessage)) },
		Pings:    true,
		Unreachable: func(t *testing.T) sink.Publisher {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			url := "amqp://guest@" + ln.Addr().String() + "/"
			_ = ln.Close()
			return newPublisher(t, rabbitmq.Config{URL: url, Password: "guest"})
		},
		// The broker stops and starts again without its Erlang VM, whose
		// boot the crash test already pays for.
		Stoppable: func(t *testing.T) (publishertest.Destination, func(*testing.T), func(*testing.T)) {
			own := rabbitmqtest.Start(t, rabbitmqtest.Options{})
			exchange, received := declareDurable(t, own, publishertest.TopicA, publishertest.TopicB)
			return publishertest.Destination{
					Publisher: newPublisher(t, rabbitmq.Config{URL: own.URL, Password: "guest", Exchange: exchange, MaxMessageBytes: maxMessage}),
					Accepted:  received,
				}, func(*testing.T) { own.Ctl("stop_app") },
				func(*testing.T) { own.Ctl("start_app") }
		},
		Crashable: func(t *testing.T) (publishertest.Destination, func(*testing.T)) {
			own := rabbitmqtest.Start(t, rabbitmqtest.Options{})
			exchange, received := declareDurable(t, own, publishertest.TopicA, publishertest.TopicB)
			return publishertest.Destination{
				Publisher: newPublisher(t, rabbitmq.Config{URL: own.URL, Password: "guest", Exchange: exchange, MaxMessageBytes: maxMessage}),
				Accepted:  received,
			}, func(*testing.T) { own.Crash() }
		},
	})
}

// declareDurable declares, as users do, a durable exchange with a durable
// queue bound for each routing key, and returns the exchange and a function
// that returns the bodies the queue received so far, in order, on a
// connection of its own each time, so that it reads the node afresh after
// a crash.
func declareDurable(t *testing.T, node *rabbitmqtest.Node, keys ...string) (string, func(*testing.T) []string) {
	t.Helper()
	name, _ := declare(t, node, keys...)
	var got []string
	return name, func(t *testing.T) []string {
		conn := node.Dial(amqp.Config{})
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		for {
			m, ok, err := ch.Get(name, true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return append([]string(nil), got...)
			}
			got = append(got, string(m.Body))
		}
	}
}
