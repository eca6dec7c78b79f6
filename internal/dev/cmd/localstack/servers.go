package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outbox-relay/outbox-relay/relay/rabbitmq/rabbitmqtest"
	"github.com/outbox-relay/outbox-relay/relay/redis/redistest"
	"github.com/outbox-relay/outbox-relay/relay/sqs/sqstest"
)

// localServer is a local broker process the demo starts: Redis, RabbitMQ,
// or the SQS emulator.
type localServer struct {
	// stop stops it for good and removes its data; halt stops it for an
	// outage, and relaunch starts it again with its data.
	stop     func()
	halt     func()
	relaunch func() error
	name     string
	orders   orders
	stored   func(ctx context.Context, last int64) int64
}

// startRedis starts redis-server with the orders stream's entries bounded
// by maxOrderSize, so that the poison orders are too large.
func startRedis() (*localServer, error) {
	dir, err := os.MkdirTemp("", "outbox-localstack-redis-")
	if err != nil {
		return nil, err
	}
	srv, err := redistest.Launch(dir, redistest.Options{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, MaxRetries: -1})
	return &localServer{
		name:     "redis-server",
		stop:     func() { _ = c.Close(); srv.Stop(); os.RemoveAll(dir) },
		halt:     srv.Stop,
		relaunch: srv.Relaunch,
		orders: orders{name: "orders", entry: fmt.Sprintf(`
  orders:
    redis:
      addresses: [%s]
      max_entry_bytes: %d`, srv.Addr, maxOrderSize)},
		stored: func(ctx context.Context, last int64) int64 {
			n, err := c.XLen(ctx, topic).Result()
			if err != nil {
				return last
			}
			return n
		},
	}, nil
}

// startRabbitMQ starts a RabbitMQ node with an exchange orders bound to a
// queue of the same name, messages bounded by maxOrderSize.
func startRabbitMQ() (*localServer, error) {
	dir, err := os.MkdirTemp("", "outbox-localstack-rabbitmq-")
	if err != nil {
		return nil, err
	}
	node, err := rabbitmqtest.Launch(dir, rabbitmqtest.Options{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	stop := func() { node.Stop(); os.RemoveAll(dir) }
	guest := strings.Replace(node.URL, "guest@", "guest:guest@", 1)
	conn, err := amqp.Dial(guest)
	if err != nil {
		stop()
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.ExchangeDeclare(topic, "direct", true, false, false, false, nil)
	}
	if err == nil {
		_, err = ch.QueueDeclare(topic, true, false, false, false, nil)
	}
	if err == nil {
		err = ch.QueueBind(topic, topic, topic, false, nil)
	}
	_ = conn.Close()
	if err != nil {
		stop()
		return nil, fmt.Errorf("rabbitmq: declare the orders exchange and queue: %w", err)
	}
	return &localServer{
		name:     "RabbitMQ node",
		stop:     stop,
		halt:     node.Stop,
		relaunch: node.Relaunch,
		orders: orders{name: "orders", entry: fmt.Sprintf(`
  orders:
    rabbitmq:
      url: %s
      password_env: LOCALSTACK_RABBITMQ_PASSWORD
      exchange: %s
      max_message_bytes: %d`, node.URL, topic, maxOrderSize)},
		stored: func(ctx context.Context, last int64) int64 {
			conn, err := amqp.DialConfig(guest, amqp.Config{Dial: amqp.DefaultDial(time.Second)})
			if err != nil {
				return last
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				return last
			}
			q, err := ch.QueueDeclarePassive(topic, true, false, false, false, nil)
			if err != nil {
				return last
			}
			return int64(q.Messages)
		},
	}, nil
}

// startSQS starts the SQS emulator with a FIFO queue orders.fifo, which
// the orders' route names, its messages bounded by maxOrderSize.
func startSQS() (*localServer, error) {
	dir, err := os.MkdirTemp("", "outbox-localstack-sqs-")
	if err != nil {
		return nil, err
	}
	srv, err := sqstest.Launch(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	stop := func() { srv.Stop(); os.RemoveAll(dir) }
	c := srv.SQS()
	q, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(topic + ".fifo"),
		Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		stop()
		return nil, fmt.Errorf("sqs: create the orders queue: %w", err)
	}
	return &localServer{
		name:     "SQS emulator",
		stop:     stop,
		halt:     srv.Stop,
		relaunch: srv.Relaunch,
		orders: orders{name: "orders", topic: topic + ".fifo", entry: fmt.Sprintf(`
  orders:
    sqs:
      endpoint: %s
      region: %s
      access_key_id: localstack
      secret_access_key_env: LOCALSTACK_SQS_SECRET
      max_message_bytes: %d`, srv.Endpoint, sqstest.Region, maxOrderSize)},
		stored: func(ctx context.Context, last int64) int64 {
			out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl,
				AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages}})
			if err != nil {
				return last
			}
			n, err := strconv.ParseInt(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)], 10, 64)
			if err != nil {
				return last
			}
			return n
		},
	}, nil
}
