package relay_test

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/nats"
	"github.com/outbox-relay/outbox-relay/relay/nats/natstest"
	"github.com/outbox-relay/outbox-relay/relay/rabbitmq"
	"github.com/outbox-relay/outbox-relay/relay/rabbitmq/rabbitmqtest"
	"github.com/outbox-relay/outbox-relay/relay/redis"
	"github.com/outbox-relay/outbox-relay/relay/redis/redistest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/sqs"
	"github.com/outbox-relay/outbox-relay/relay/sqs/sqstest"
)

// A ten-second outage of each sink's server (a Kafka broker that drops
// every connection; NATS, Redis and the SQS emulator stopped and started
// again on their data; RabbitMQ's application stopped and started) heals
// within healWithin of the server's return, as an HTTP endpoint's does
// (not parallel, see there).
func TestShortOutageOfEachSinkHealsWithinSeconds(t *testing.T) {
	testwait.SkipShort(t)
	checkHeals(t,
		kafkaRun(t, "kafka-heal", droppedConnections),
		natsHealRun(t, "nats-heal"),
		redisHealRun(t, "redis-heal"),
		rabbitmqHealRun(t, "rabbitmq-heal"),
		sqsHealRun(t, "sqs-heal"),
	)
}

func opened(t *testing.T, p sink.Publisher, err error) sink.Publisher {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := p.(interface{ Close() error }); ok {
		t.Cleanup(func() { _ = c.Close() })
	}
	return p
}

func natsHealRun(t *testing.T, name string) outageRun {
	srv := natstest.Start(t, natstest.Options{})
	js := srv.Connect()
	natstest.AddStream(t, js, "HEAL", name)
	return outageRun{
		name: name,
		dest: func(t *testing.T, name string, _ int) relay.Destination {
			p, err := nats.New(nats.Config{Servers: []string{srv.URL}})
			return relay.Destination{Name: name, Publisher: opened(t, p, err)}
		},
		down: func(down bool) {
			if down {
				srv.Stop()
			} else {
				srv.Restart()
			}
		},
		delivered: func(t *testing.T) []string {
			var got []string
			for _, m := range natstest.Messages(t, srv.Connect(), "HEAL") {
				got = append(got, string(m.Data))
			}
			return got
		},
	}
}

func redisHealRun(t *testing.T, name string) outageRun {
	srv := redistest.Start(t, redistest.Options{})
	return outageRun{
		name: name,
		dest: func(t *testing.T, name string, _ int) relay.Destination {
			p, err := redis.New(redis.Config{Addresses: []string{srv.Addr}})
			return relay.Destination{Name: name, Publisher: opened(t, p, err)}
		},
		down: func(down bool) {
			if down {
				srv.Stop()
			} else {
				srv.Restart()
			}
		},
		delivered: func(t *testing.T) []string {
			var got []string
			for _, e := range redistest.Entries(t, srv.Client(nil), name) {
				got = append(got, e[redis.FieldPayload].(string))
			}
			return got
		},
	}
}

// rabbitmqHealRun publishes to the default exchange, which routes to the
// durable queue named as the topic.
func rabbitmqHealRun(t *testing.T, name string) outageRun {
	node := rabbitmqtest.Start(t, rabbitmqtest.Options{})
	guest := amqp.Config{SASL: []amqp.Authentication{&amqp.PlainAuth{Username: "guest", Password: "guest"}}}
	conn := node.Dial(guest)
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	}
	_ = conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	return outageRun{
		name: name,
		dest: func(t *testing.T, name string, _ int) relay.Destination {
			p, err := rabbitmq.New(rabbitmq.Config{URL: node.URL, Password: "guest", DialTimeout: time.Second})
			return relay.Destination{Name: name, Publisher: opened(t, p, err)}
		},
		// The broker stops and starts again without its Erlang VM, whose
		// boot would add seconds to the outage.
		down: func(down bool) {
			if down {
				node.Ctl("stop_app")
			} else {
				node.Ctl("start_app")
			}
		},
		delivered: func(t *testing.T) []string {
			conn := node.Dial(guest)
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
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
		},
	}
}

// sqsHealRun sends to a FIFO queue, which keeps each key in order.
func sqsHealRun(t *testing.T, name string) outageRun {
	srv := sqstest.Start(t)
	url := srv.CreateQueue(t, name+".fifo", nil)
	reader := srv.Reader(url)
	return outageRun{
		name:  name,
		topic: name + ".fifo",
		dest: func(t *testing.T, name string, _ int) relay.Destination {
			s, _ := sink.Lookup("sqs")
			cfg := s.New().(*sqs.Settings)
			cfg.Endpoint, cfg.Region, cfg.AccessKeyID, cfg.SecretAccessKeyEnv = srv.Endpoint, sqstest.Region, "test", "SECRET"
			if err := cfg.Resolve(func(string) (string, bool) { return "test", true }); err != nil {
				t.Fatal(err)
			}
			p, err := cfg.Open(sink.Options{Name: name})
			return relay.Destination{Name: name, Publisher: opened(t, p, err)}
		},
		down: func(down bool) {
			if down {
				srv.Stop()
			} else {
				srv.Restart()
			}
		},
		delivered: func(t *testing.T) []string {
			var got []string
			for _, m := range reader.Read(t) {
				got = append(got, aws.ToString(m.Body))
			}
			return got
		},
	}
}
