package relaycontainer_test

import (
	"cmp"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relaycontainer"
)

// An order placed in the application's transaction reaches the webhook the
// relay delivers it to.
func TestOrderPlacedReachesTheWebhook(t *testing.T) {
	ctx := context.Background()
	// The images: the relay as `make image` builds it, and PostgreSQL.
	// The variables name others (this repository's tests build both).
	relayImage := cmp.Or(os.Getenv("OUTBOX_RELAY_IMAGE"), "outbox-relay:local")
	postgresImage := cmp.Or(os.Getenv("POSTGRES_IMAGE"), "postgres:16-alpine")

	// The application's database, with the outbox table.
	db, err := postgres.Run(ctx, postgresImage, postgres.WithDatabase("shop"),
		postgres.WithUsername("shop"), postgres.WithPassword("secret"), postgres.BasicWaitStrategies())
	testcontainers.CleanupContainer(t, db)
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := db.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	if err := relaycontainer.MigrateUp(ctx, relayImage, relaycontainer.WithDatabaseURL(dsn),
		relaycontainer.WithHostNetwork()); err != nil {
		t.Fatal(err)
	}

	// Where the relay delivers: a webhook of the test's own.
	type delivery struct {
		eventID string
		body    string
	}
	deliveries := make(chan delivery, 10)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		deliveries <- delivery{r.Header.Get("Idempotency-Key"), string(body)}
	}))
	defer hook.Close()

	relay, err := relaycontainer.Run(ctx, relayImage, relaycontainer.WithDatabaseURL(dsn),
		relaycontainer.WithHostNetwork(), relaycontainer.WithConfig(`
destinations:
  shop:
    http:
      url: `+hook.URL+`
      allow_private_networks: true   # the test's webhook is on 127.0.0.1
routes:
  - topics: ["*"]
    destination: shop
`))
	testcontainers.CleanupContainer(t, relay)
	if err != nil {
		t.Fatal(err)
	}

	// The application places an order: the event commits with it.
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// ... INSERT INTO orders ... in tx ...
	ids, err := producer.Write(ctx, tx, outbox.Message{
		Topic: "orders.placed", Key: "order-1042", Payload: []byte(`{"order_id":1042}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	select {
	case d := <-deliveries:
		if d.eventID != ids[0].String() || d.body != `{"order_id":1042}` {
			t.Errorf("the webhook got event %s: %s; want event %s", d.eventID, d.body, ids[0])
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the order's event did not reach the webhook within 30 s")
	}
}
