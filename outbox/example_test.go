package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Write a message in the same transaction as the business change it
// announces: both commit, or neither does.
func ExampleProducer_Write() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("OUTBOX_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{}) // schema "public"
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// ... INSERT INTO orders ... in tx ...
	_, err = producer.Write(ctx, tx, outbox.Message{
		Topic:   "orders.placed",
		Key:     "order-1042", // messages with this key are delivered in order
		Payload: []byte(`{"order_id":1042,"total_cents":4999}`),
		Headers: map[string]string{"content-type": "application/json"},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	var topic, key, status string
	err = pool.QueryRow(ctx, `SELECT topic, key, status FROM outbox WHERE key = 'order-1042'`).Scan(&topic, &key, &status)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(topic, key, status)
	// Output: orders.placed order-1042 pending
}

// Many messages go in one round trip, in order.
func ExampleProducer_Write_batch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("OUTBOX_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{})
	if err != nil {
		log.Fatal(err)
	}

	msgs := make([]outbox.Message, 0, 3)
	for i := 1; i <= 3; i++ {
		msgs = append(msgs, outbox.Message{
			Topic:   "shipments.updated",
			Key:     "shipment-7",
			Payload: fmt.Appendf(nil, `{"step":%d}`, i),
		})
	}
	// A pool (or a single connection) works too: the statement is atomic.
	eventIDs, err := producer.Write(ctx, pool, msgs...)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(eventIDs), "messages written")
	// Output: 3 messages written
}
