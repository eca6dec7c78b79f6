package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// The examples read OUTBOX_DATABASE_URL like an application would; point it
// at a database with a migrated public schema.
func TestMain(m *testing.M) {
	pgtest.Main(m, func(serverURL string) (func(), error) {
		ctx := context.Background()
		name := pgtest.UniqueName("examples")
		dsn, err := pgtest.CreateDatabase(ctx, serverURL, name)
		if err != nil {
			return nil, err
		}
		drop := func() { _ = pgtest.DropDatabase(context.Background(), serverURL, name) }
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			drop()
			return nil, err
		}
		defer pool.Close()
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		mig, err := migrations.New(db, "public")
		if err == nil {
			_, err = mig.Up(ctx)
		}
		if err == nil {
			err = os.Setenv("OUTBOX_DATABASE_URL", dsn)
		}
		if err != nil {
			drop()
			return nil, err
		}
		return drop, nil
	})
}

type row struct {
	id          int64
	eventID     uuid.UUID
	topic       string
	key         *string
	payload     []byte
	headers     map[string]string
	status      string
	nextAttempt time.Time
	createdAt   time.Time
}

func readRows(t *testing.T, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) []row {
	t.Helper()
	rows, err := db.Query(context.Background(),
		`SELECT id, event_id, topic, key, payload, headers, status, next_attempt_at, created_at FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.eventID, &x.topic, &x.key, &x.payload, &x.headers, &x.status, &x.nextAttempt, &x.createdAt)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func newProducer(t *testing.T, s *pgtest.Schema, cfg outbox.ProducerConfig) *outbox.Producer {
	t.Helper()
	cfg.Schema = s.Name
	p, err := outbox.NewProducer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestWriteCommitAndRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	p := newProducer(t, s, outbox.ProducerConfig{})

	// Committed: every field and default is there.
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := p.Write(ctx, tx,
		outbox.Message{Topic: "orders", Key: "order-1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"content-type": "application/json"}},
		outbox.Message{Topic: "audit"}, // no key, no payload, no headers
	)
	if err != nil {
		t.Fatal(err)
	}
	var txNow time.Time
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&txNow); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Rolled back: not there.
	tx, err = s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Write(ctx, tx, outbox.Message{Topic: "orders", Key: "order-2", Payload: []byte("lost")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	got := readRows(t, s.Pool)
	if len(got) != 2 {
		t.Fatalf("got %d rows, want the 2 committed ones", len(got))
	}
	a, b := got[0], got[1]
	if a.eventID != ids[0] || b.eventID != ids[1] {
		t.Errorf("event ids %v %v, want %v", a.eventID, b.eventID, ids)
	}
	if a.topic != "orders" || a.key == nil || *a.key != "order-1" || string(a.payload) != `{"n":1}` ||
		a.headers["content-type"] != "application/json" || a.status != "pending" {
		t.Errorf("first row = %+v", a)
	}
	if b.topic != "audit" || b.key != nil || b.payload == nil || len(b.payload) != 0 || len(b.headers) != 0 {
		t.Errorf("second row = %+v, want null key, empty payload and headers", b)
	}
	for _, r := range got {
		if !r.createdAt.Equal(txNow) || !r.nextAttempt.Equal(txNow) {
			t.Errorf("row %d: created_at %v next_attempt_at %v, want transaction time %v", r.id, r.createdAt, r.nextAttempt, txNow)
		}
	}
}

// roundTrips counts the statements and COPYs a connection sends.
type roundTrips struct{ n atomic.Int64 }

func (c *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *roundTrips) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *roundTrips) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

func TestWriteManyInOneRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		delay time.Duration // a delay forces the INSERT path
	}{
		{"copy", 0},
		{"insert", time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := pgtest.NewSchema(t)
			p := newProducer(t, s, outbox.ProducerConfig{})
			cfg, err := pgx.ParseConfig(s.URL)
			if err != nil {
				t.Fatal(err)
			}
			counter := &roundTrips{}
			cfg.Tracer = counter
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)

			const n = 10_000
			msgs := make([]outbox.Message, n)
			for i := range msgs {
				msgs[i] = outbox.Message{
					Topic:   "orders",
					Key:     fmt.Sprintf("k%d", i%50),
					Payload: fmt.Appendf(nil, "%d", i),
					Headers: map[string]string{"seq": fmt.Sprint(i)},
					Delay:   tc.delay,
				}
			}
			before := counter.n.Load()
			ids, err := p.Write(ctx, conn, msgs...)
			if err != nil {
				t.Fatal(err)
			}
			if trips := counter.n.Load() - before; trips != 1 {
				t.Fatalf("%d messages took %d round trips, want 1", n, trips)
			}
			got := readRows(t, s.Pool)
			if len(got) != n {
				t.Fatalf("got %d rows, want %d", len(got), n)
			}
			// Ids follow the caller's order: that is the per-key delivery order.
			for i, r := range got {
				if string(r.payload) != fmt.Sprint(i) || r.headers["seq"] != fmt.Sprint(i) || r.eventID != ids[i] {
					t.Fatalf("row %d (id %d) holds message %s, want message %d in id order", i, r.id, r.payload, i)
				}
			}
		})
	}
}

func TestWriteDelayUsesDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	p := newProducer(t, s, outbox.ProducerConfig{})
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := p.Write(ctx, tx, outbox.Message{Topic: "reminders", Delay: 90 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	var secs float64
	if err := tx.QueryRow(ctx, `SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM outbox`).Scan(&secs); err != nil {
		t.Fatal(err)
	}
	delay := time.Duration(secs * float64(time.Second))
	if delay != 90*time.Minute {
		t.Fatalf("next_attempt_at - now() = %v, want 90m", delay)
	}
}

func TestWriteWithPoolAndGivenEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	p := newProducer(t, s, outbox.ProducerConfig{})
	id := uuid.MustParse("0b5e6f0e-3c55-4f6c-9c8e-5f9d8a3a7c11")
	got, err := p.Write(ctx, s.Pool, outbox.Message{Topic: "orders", EventID: id})
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != id {
		t.Fatalf("returned event id %v, want the given %v", got[0], id)
	}
	rows := readRows(t, s.Pool)
	if len(rows) != 1 || rows[0].eventID != id {
		t.Fatalf("rows = %+v, want one with event id %v", rows, id)
	}
	// The same event id twice is refused by the database.
	if _, err := p.Write(ctx, s.Pool, outbox.Message{Topic: "orders", EventID: id}); err == nil {
		t.Fatal("duplicate event id accepted")
	}
}

func TestWriteCapturesTraceparent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	p := newProducer(t, s, outbox.ProducerConfig{})
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(ctx)
	spanCtx, span := tp.Tracer("test").Start(ctx, "place order")
	sc := span.SpanContext()
	_, err := p.Write(spanCtx, s.Pool,
		outbox.Message{Topic: "orders", Headers: map[string]string{"a": "b"}},
		outbox.Message{Topic: "orders", Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
	)
	span.End()
	if err != nil {
		t.Fatal(err)
	}
	rows := readRows(t, s.Pool)
	want := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
	if rows[0].headers["traceparent"] != want || rows[0].headers["a"] != "b" {
		t.Errorf("headers = %v, want traceparent %s beside a=b", rows[0].headers, want)
	}
	if rows[1].headers["traceparent"] != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Errorf("a message's own traceparent was overwritten: %v", rows[1].headers)
	}

	// Without a span, no trace headers.
	if _, err := p.Write(ctx, s.Pool, outbox.Message{Topic: "orders"}); err != nil {
		t.Fatal(err)
	}
	rows = readRows(t, s.Pool)
	if _, ok := rows[2].headers["traceparent"]; ok {
		t.Errorf("traceparent added without a span: %v", rows[2].headers)
	}
}

// failDB fails the test if Write touches the database.
type failDB struct{ t *testing.T }

func (f failDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	f.t.Error("Exec called for invalid input")
	return pgconn.CommandTag{}, nil
}

func (f failDB) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	f.t.Error("CopyFrom called for invalid input")
	return 0, nil
}

func TestWriteRejectsInvalidInput(t *testing.T) {
	t.Parallel()
	p, err := outbox.NewProducer(outbox.ProducerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		msgs []outbox.Message
		want []string
	}{
		{"empty topic", []outbox.Message{{Payload: []byte("x")}}, []string{"message 0: topic is empty"}},
		{"NUL in topic", []outbox.Message{{Topic: "a\x00b"}}, []string{"topic is not valid UTF-8"}},
		{"invalid UTF-8 key", []outbox.Message{{Topic: "t", Key: "\xff"}}, []string{"key is not valid UTF-8"}},
		{"negative delay", []outbox.Message{{Topic: "t", Delay: -time.Second}}, []string{"delay -1s is negative"}},
		{"empty header name", []outbox.Message{{Topic: "t", Headers: map[string]string{"": "v"}}}, []string{"header with an empty name"}},
		{"NUL in header value", []outbox.Message{{Topic: "t", Headers: map[string]string{"h": "a\x00"}}}, []string{`header "h": value is not valid`}},
		{"reserved header", []outbox.Message{{Topic: "t", Headers: map[string]string{"Outbox-Event-Id": "x"}}}, []string{"set by the relay"}},
		{"every problem at once", []outbox.Message{{Topic: "ok"}, {Key: "\xff"}, {Topic: "t", Delay: -1}},
			[]string{"message 1: topic is empty", "message 1: key is not valid", "message 2: delay"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Write(context.Background(), failDB{t}, tc.msgs...)
			if !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("err = %v, want ErrInvalidMessage", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if _, err := outbox.NewProducer(outbox.ProducerConfig{Schema: "no-such;schema"}); err == nil {
		t.Error("NewProducer accepted an invalid schema name")
	}
}

// Emit refuses, naming the slot, while the outbox's replication slot does
// not exist: a message written then would never be read. A delay is
// refused before the database is touched.
func TestEmitNeedsTheSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	p := newProducer(t, s, outbox.ProducerConfig{})
	_, err := p.Emit(ctx, s.Pool, outbox.Message{Topic: "orders", Key: "k", Payload: []byte("x")})
	var slot string
	if err := s.Pool.QueryRow(ctx, "SELECT outbox_capture_slot()").Scan(&slot); err != nil {
		t.Fatal(err)
	}
	if err == nil || !strings.Contains(err.Error(), slot) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Emit without the slot: %v, want an error naming slot %s", err, slot)
	}
	_, err = p.Emit(ctx, s.Pool, outbox.Message{Topic: "orders", Delay: time.Second})
	if !errors.Is(err, outbox.ErrDelayInLog) || !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Fatalf("Emit with a delay: %v, want ErrDelayInLog", err)
	}
	if _, err := p.Emit(ctx, s.Pool, outbox.Message{Topic: ""}); !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Fatalf("Emit without a topic: %v, want ErrInvalidMessage", err)
	}
}
