package logsource_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/db/schema"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay/logsource"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.WaitingTests)
	goleak.VerifyNone(nil)
}

// capture is an outbox captured from the log in a test: its schema, set
// up, its store, and its sources, each streaming until the test ends.
type capture struct {
	t      *testing.T
	s      *pgtest.Schema
	st     *store.Store
	prod   *outbox.Producer
	wake   chan struct{}
	mu     sync.Mutex
	cancel []func()
}

func newCapture(t *testing.T) *capture {
	t.Helper()
	return newCaptureIn(t, pgtest.URL(t))
}

// newCaptureIn is newCapture in the database dbURL names.
func newCaptureIn(t *testing.T, dbURL string) *capture {
	t.Helper()
	ctx := context.Background()
	s := pgtest.NewSchemaIn(t, dbURL)
	var level string
	if err := s.Pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Skipf("the server runs with wal_level %s; capture from the log needs logical", level)
	}
	checks, err := logsource.Setup(ctx, s.Pool, s.Name, logsource.SetupOptions{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	if m := logsource.Missing(checks); m != "" {
		t.Fatalf("set-up left missing:\n%s", m)
	}
	st, err := store.New(s.Pool, store.Config{Schema: s.Name, ErrorHistory: 3})
	if err != nil {
		t.Fatal(err)
	}
	prod, err := outbox.NewProducer(outbox.ProducerConfig{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	c := &capture{t: t, s: s, st: st, prod: prod, wake: make(chan struct{}, 1)}
	t.Cleanup(func() {
		c.stopAll()
		// A slot outlives its schema, and holds the log: drop it.
		slot := slotName(t, s)
		testwait.For(t, "the slot to be free", func() bool {
			var active bool
			err := s.Pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
			return errors.Is(err, pgx.ErrNoRows) || (err == nil && !active)
		})
		if _, err := s.Pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot); err != nil {
			t.Errorf("drop slot: %v", err)
		}
		s.Exec(t, "DROP PUBLICATION IF EXISTS "+schema.Publication(s.Name))
	})
	return c
}

// source starts a Source streaming; stop ends it.
func (c *capture) source() (src *logsource.Source, stop func()) {
	c.t.Helper()
	conn, err := pgconn.ParseConfig(c.s.URL)
	if err != nil {
		c.t.Fatal(err)
	}
	src, err = logsource.New(logsource.Config{Conn: conn, Schema: c.s.Name, Store: c.st,
		Standby: 20 * time.Millisecond, Log: slog.New(slog.NewTextHandler(testLog{c.t}, nil))})
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = src.Run(ctx, func() {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		})
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	c.mu.Lock()
	c.cancel = append(c.cancel, stop)
	c.mu.Unlock()
	return src, stop
}

func (c *capture) stopAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, stop := range c.cancel {
		stop()
	}
}

// emit writes msgs in one transaction, committed or rolled back.
func (c *capture) emit(commit bool, msgs ...outbox.Message) {
	c.t.Helper()
	ctx := context.Background()
	tx, err := c.s.Pool.Begin(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := c.prod.Emit(ctx, tx, msgs...); err != nil {
		c.t.Fatal(err)
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			c.t.Fatal(err)
		}
	}
}

// claim takes a batch from src, waiting for one with rows up to a
// deadline.
func (c *capture) claim(src *logsource.Source, p store.ClaimParams) *logsource.Batch {
	c.t.Helper()
	if p.Limit == 0 {
		p.Limit = 100
	}
	deadline := time.After(testwait.DefaultTimeout)
	for {
		b, err := src.Claim(context.Background(), p)
		if err != nil {
			c.t.Fatal(err)
		}
		if len(b.Records) > 0 {
			return b
		}
		select {
		case <-c.wake: // a message came since the last wake
		case <-deadline:
			c.t.Fatal("no message came from the log")
		}
	}
}

func msg(topic, key, payload string) outbox.Message {
	return outbox.Message{Topic: topic, Key: key, Payload: []byte(payload)}
}

func payloads(recs []sink.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, fmt.Sprintf("%s/%s", r.Key, r.Payload))
	}
	return out
}

func sent(recs []sink.Record) []store.Outcome {
	var out []store.Outcome
	for _, r := range recs {
		out = append(out, store.Outcome{ID: r.ID, Kind: store.Sent})
	}
	return out
}

// slotConfirmed reads the slot's confirmed position as the server has it.
func (c *capture) slotConfirmed() string {
	var lsn string
	if err := c.s.Pool.QueryRow(context.Background(),
		"SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = outbox_capture_slot()").Scan(&lsn); err != nil {
		c.t.Fatal(err)
	}
	return lsn
}

func (c *capture) lsnAtLeast(lsn, than string) bool {
	var ok bool
	if err := c.s.Pool.QueryRow(context.Background(), "SELECT $1::pg_lsn >= $2::pg_lsn", lsn, than).Scan(&ok); err != nil {
		c.t.Fatal(err)
	}
	return ok
}

func (c *capture) currentLSN() string {
	var lsn string
	if err := c.s.Pool.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		c.t.Fatal(err)
	}
	return lsn
}

// Committed messages come in commit order, a rolled-back transaction's
// never, and the slot is told the position once they are settled.
func TestCommittedMessagesInCommitOrder(t *testing.T) {
	t.Parallel()
	c := newCapture(t)
	src, _ := c.source()
	testwait.For(t, "the source to stream", src.Streaming)
	c.emit(true, msg("orders", "a", "1"), msg("orders", "b", "1"), msg("orders", "", "x"))
	c.emit(false, msg("orders", "a", "rolled back"))
	c.emit(true, msg("orders", "b", "2"))
	c.emit(true, msg("orders", "a", "2"))
	end := c.currentLSN()

	var got []string
	for len(got) < 5 {
		b := c.claim(src, store.ClaimParams{})
		got = append(got, payloads(b.Records)...)
		if err := b.Complete(context.Background(), sent(b.Records)); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"a/1", "b/1", "/x", "b/2", "a/2"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	testwait.For(t, "the slot to confirm past the messages", func() bool { return c.lsnAtLeast(c.slotConfirmed(), end) })
	var rows int
	if err := c.s.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("%d rows in the table: messages delivered from the log never touch it", rows)
	}
}

// tableRows reads the table's rows: key/payload, status, retry count and
// whether it is due.
func (c *capture) tableRows() []string {
	c.t.Helper()
	rows, err := c.s.Pool.Query(context.Background(),
		`SELECT coalesce(key, '') || '/' || convert_from(payload, 'UTF8') || ' ' || status || ' ' || retry_count
		        || CASE WHEN next_attempt_at <= now() THEN ' due' ELSE ' later' END FROM outbox ORDER BY id`)
	if err != nil {
		c.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// A message that failed goes into the table with its attempt; its key's
// later messages follow it there, in order, until the key's rows are gone;
// other keys keep coming from the log. A permanent failure is a dead
// letter in the table.
func TestFailuresGoToTheTableAndTheirKeysFollow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCapture(t)
	src, _ := c.source()
	c.emit(true, msg("orders", "a", "1"), msg("orders", "b", "1"), msg("orders", "c", "1"))
	b := c.claim(src, store.ClaimParams{})
	if len(b.Records) != 3 {
		t.Fatalf("claimed %v", payloads(b.Records))
	}
	err := b.Complete(ctx, []store.Outcome{
		{ID: b.Records[0].ID, Kind: store.Retried, Delay: time.Hour, Error: "503 Service Unavailable", Attempted: true, Destination: "orders"},
		{ID: b.Records[1].ID, Kind: store.Sent},
		{ID: b.Records[2].ID, Kind: store.DeadLettered, Reason: sink.ReasonPermanent, Error: "400 Bad Request", Attempted: true, Destination: "orders"},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.emit(true, msg("orders", "a", "2"), msg("orders", "b", "2"))
	b = c.claim(src, store.ClaimParams{})
	if got := payloads(b.Records); fmt.Sprint(got) != "[b/2]" || b.Deferred != 1 {
		t.Fatalf("claimed %v with %d deferred, want [b/2] with a/2 written into the table behind a/1", got, b.Deferred)
	}
	if err := b.Complete(ctx, sent(b.Records)); err != nil {
		t.Fatal(err)
	}
	want := []string{"a/1 pending 1 later", "c/1 dead_lettered 1 due", "a/2 pending 0 due"}
	if got := c.tableRows(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("table holds %q, want %q", got, want)
	}
	// The table's claims deliver a/2 only after a/1.
	claimTable := func() []string {
		cl, err := c.st.Claim(ctx, store.ClaimParams{Limit: 10, PayloadCap: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		got := payloads(cl.Records)
		if err := cl.Complete(ctx, sent(cl.Records)); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := claimTable(); len(got) != 0 {
		t.Fatalf("the table delivered %v while a/1 waits", got)
	}
	c.s.Exec(t, "UPDATE outbox SET next_attempt_at = now() WHERE status = 'pending'")
	if got := claimTable(); fmt.Sprint(got) != "[a/1 a/2]" {
		t.Fatalf("the table delivered %v, want [a/1 a/2]", got)
	}
	// The key's rows are gone: its messages come from the log again.
	c.emit(true, msg("orders", "a", "3"))
	b = c.claim(src, store.ClaimParams{})
	if got := payloads(b.Records); fmt.Sprint(got) != "[a/3]" {
		t.Fatalf("claimed %v, want [a/3]", got)
	}
	if err := b.Complete(ctx, sent(b.Records)); err != nil {
		t.Fatal(err)
	}
	end := c.currentLSN()
	testwait.For(t, "the slot to confirm past the messages", func() bool { return c.lsnAtLeast(c.slotConfirmed(), end) })
}

// Messages of a topic whose destination takes none now wait in the table,
// and their keys' later messages behind them; the rest flows.
func TestMessagesOfAClosedDestinationWaitInTheTable(t *testing.T) {
	t.Parallel()
	c := newCapture(t)
	src, _ := c.source()
	c.emit(true, msg("down", "a", "1"), msg("orders", "a", "2"), msg("orders", "b", "1"))
	b := c.claim(src, store.ClaimParams{ExcludeTopics: []string{"down"}, ExcludeFor: time.Hour})
	if got := payloads(b.Records); fmt.Sprint(got) != "[b/1]" || b.Deferred != 2 {
		t.Fatalf("claimed %v with %d deferred, want [b/1] and two in the table", got, b.Deferred)
	}
	if err := b.Complete(context.Background(), sent(b.Records)); err != nil {
		t.Fatal(err)
	}
	want := []string{"a/1 pending 0 later", "a/2 pending 0 due"}
	if got := c.tableRows(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("table holds %q, want %q", got, want)
	}
}

// A stream that stops starts again from the confirmed position: messages
// settled are not read again, those not settled are.
func TestAStreamStartsAgainFromTheConfirmedPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCapture(t)
	src, stop := c.source()
	c.emit(true, msg("orders", "a", "1"))
	c.emit(true, msg("orders", "a", "2"), msg("orders", "b", "1"))
	var got []sinkRecords
	for n := 0; n < 2; {
		b := c.claim(src, store.ClaimParams{})
		n += len(b.Records)
		got = append(got, b.Records)
		// Only a/1 is settled; the rest is given back.
		var out []store.Outcome
		for _, r := range b.Records {
			if string(r.Payload) == "1" && r.Key == "a" {
				out = append(out, store.Outcome{ID: r.ID, Kind: store.Sent})
			}
		}
		if err := b.Complete(ctx, out); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	src, _ = c.source()
	b := c.claim(src, store.ClaimParams{})
	if got := payloads(b.Records); fmt.Sprint(got) != "[a/2 b/1]" {
		t.Fatalf("after the restart claimed %v, want [a/2 b/1] (a/1 was settled)", got)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

type sinkRecords = []sink.Record

// One replica streams from the slot; another stands by and takes over
// when the first stops.
func TestOneReplicaStreamsAnotherTakesOver(t *testing.T) {
	t.Parallel()
	c := newCapture(t)
	first, stopFirst := c.source()
	testwait.For(t, "the first to stream", first.Streaming)
	second, _ := c.source()
	c.emit(true, msg("orders", "a", "1"))
	b := c.claim(first, store.ClaimParams{})
	if err := b.Complete(context.Background(), sent(b.Records)); err != nil {
		t.Fatal(err)
	}
	if second.Streaming() {
		t.Fatal("two replicas stream from one slot")
	}
	stopFirst()
	testwait.For(t, "the second to take over", second.Streaming)
	c.emit(true, msg("orders", "a", "2"))
	b = c.claim(second, store.ClaimParams{})
	if got := payloads(b.Records); fmt.Sprint(got) != "[a/2]" {
		t.Fatalf("the second claimed %v, want [a/2]", got)
	}
	if err := b.Complete(context.Background(), sent(b.Records)); err != nil {
		t.Fatal(err)
	}
}

// testLog writes the sources' logs to the test's.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// A message with the outbox's prefix that cannot be read is handed out
// undeliverable, to be dead-lettered with its content whole; the messages
// around it flow.
func TestAnUnreadableMessageBecomesADeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCapture(t)
	src, _ := c.source()
	c.emit(true, msg("orders", "a", "1"))
	c.s.Exec(t, "SELECT pg_logical_emit_message(true, $1, '\\x01ff'::bytea)", schema.MessagePrefix(c.s.Name))
	c.emit(true, msg("orders", "a", "2"))
	var got []sink.Record
	for len(got) < 3 {
		b := c.claim(src, store.ClaimParams{})
		var out []store.Outcome
		for _, r := range b.Records {
			if r.Undeliverable != "" {
				out = append(out, store.Outcome{ID: r.ID, Kind: store.DeadLettered, Reason: r.UndeliverableReason, Error: r.Undeliverable})
			} else {
				out = append(out, store.Outcome{ID: r.ID, Kind: store.Sent})
			}
		}
		if err := b.Complete(ctx, out); err != nil {
			t.Fatal(err)
		}
		got = append(got, b.Records...)
	}
	if got[1].UndeliverableReason != sink.ReasonInvalidMessage || !strings.Contains(got[1].Undeliverable, "cannot be read") {
		t.Fatalf("the unreadable message came as %+v", got[1])
	}
	var topic, reason string
	var content []byte
	if err := c.s.Pool.QueryRow(ctx, "SELECT topic, dead_letter_reason, payload FROM outbox WHERE status = 'dead_lettered'").Scan(&topic, &reason, &content); err != nil {
		t.Fatal(err)
	}
	if reason != "invalid_message" || string(content) != "\x01\xff" {
		t.Fatalf("dead letter %s, %s, %x", topic, reason, content)
	}
}

// A slot the server invalidated (it removed log the slot had not
// confirmed, past max_slot_wal_keep_size) is reported, not streamed from:
// the source names the slot and the position from which messages are
// lost, its state says lost, and set-up recreates it only when told to.
func TestALostSlotIsReported(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	srv := pgtest.NewServerWith(t, map[string]string{"wal_level": "logical", "max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB"})
	s := pgtest.NewSchemaIn(t, srv.DSN("postgres"))
	if _, err := logsource.Setup(ctx, s.Pool, s.Name, logsource.SetupOptions{Create: true}); err != nil {
		t.Fatal(err)
	}
	st, err := store.New(s.Pool, store.Config{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	prod, err := outbox.NewProducer(outbox.ProducerConfig{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prod.Emit(ctx, s.Pool, msg("orders", "a", "lost")); err != nil {
		t.Fatal(err)
	}
	// Log past the cap, with nobody reading: a checkpoint invalidates the
	// slot.
	testwait.For(t, "the slot to be lost", func() bool {
		s.Exec(t, "CREATE TEMP TABLE IF NOT EXISTS filler AS SELECT 1 AS x")
		s.Exec(t, "INSERT INTO filler SELECT g FROM generate_series(1, 100000) g")
		s.Exec(t, "SELECT pg_switch_wal()")
		s.Exec(t, "CHECKPOINT")
		var status string
		err := s.Pool.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = outbox_capture_slot()").Scan(&status)
		return err == nil && status == "lost"
	})
	conn, err := pgconn.ParseConfig(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	src, err := logsource.New(logsource.Config{Conn: conn, Schema: s.Name, Store: st, Standby: 20 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(testLog{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(runCtx, func() {}) }()
	testwait.For(t, "the source to report the lost slot", func() bool { return src.Problem() != "" })
	cancel()
	<-done
	state, err := src.State(ctx, s.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if p := src.Problem(); !state.Lost() || !strings.Contains(p, "lost") || !strings.Contains(p, state.Confirmed) || src.Streaming() {
		t.Fatalf("problem %q, state %+v: want the lost slot named with its confirmed position %s", p, state, state.Confirmed)
	}
	if _, err := logsource.Setup(ctx, s.Pool, s.Name, logsource.SetupOptions{Create: true}); err == nil || !strings.Contains(err.Error(), "--recreate") {
		t.Fatalf("set-up of a lost slot without --recreate: %v", err)
	}
	checks, err := logsource.Setup(ctx, s.Pool, s.Name, logsource.SetupOptions{Create: true, Recreate: true})
	if err != nil || logsource.Missing(checks) != "" {
		t.Fatalf("recreate: %v %v", checks, err)
	}
}

// A PostgreSQL crash and restart: the stream starts again from the
// position the server kept, messages it had not kept are read again, once
// more at most, and those already written into the table stay one row.
func TestAServerRestart(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	srv := pgtest.NewServerWith(t, map[string]string{"wal_level": "logical"})
	c := newCaptureIn(t, srv.DSN("postgres"))
	src, _ := c.source()
	c.emit(true, msg("orders", "a", "1"), msg("orders", "b", "1"))
	b := c.claim(src, store.ClaimParams{})
	if got := payloads(b.Records); fmt.Sprint(got) != "[a/1 b/1]" {
		t.Fatalf("claimed %v", got)
	}
	if err := b.Complete(ctx, []store.Outcome{
		{ID: b.Records[0].ID, Kind: store.Retried, Delay: time.Hour, Error: "503", Attempted: true},
		{ID: b.Records[1].ID, Kind: store.Sent},
	}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The pool's connections died with the server.
	c.s.Pool.Reset()
	testwait.For(t, "the server to answer", func() bool { return c.s.Pool.Ping(ctx) == nil })
	c.emit(true, msg("orders", "a", "2"), msg("orders", "b", "2"))
	var got []string
	for !slices.Contains(got, "b/2") {
		b := c.claim(src, store.ClaimParams{})
		got = append(got, payloads(b.Records)...)
		if err := b.Complete(ctx, sent(b.Records)); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(got) != "[b/2]" && fmt.Sprint(got) != "[b/1 b/2]" {
		t.Fatalf("after the restart delivered %v, want b/2 (after b/1 read again, at most)", got)
	}
	want := []string{"a/1 pending 1 later", "a/2 pending 0 due"}
	if rows := c.tableRows(); fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Fatalf("table holds %q, want %q", rows, want)
	}
}

// Serializable producers, each updating its own row in transactions of
// its own and writing a message: outbox_emit touches no table, so it
// adds no serialization failure to what the updates have without any
// outbox; the table's insert is measured beside.
func TestSerializableProducers(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	ctx := context.Background()
	c := newCapture(t)
	c.s.Exec(t, "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
	c.s.Exec(t, "INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 8) g")
	pool := c.s.WithConns(t, 10).Pool
	failures := func(write func(tx pgx.Tx, id int) error) int {
		var mu sync.Mutex
		failed := 0
		var wg sync.WaitGroup
		for id := 1; id <= 8; id++ {
			wg.Go(func() {
				for range 150 {
					err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", id); err != nil {
							return err
						}
						return write(tx, id)
					})
					var pe *pgconn.PgError
					switch {
					case errors.As(err, &pe) && pe.Code == "40001":
						mu.Lock()
						failed++
						mu.Unlock()
					case err != nil:
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return failed
	}
	none := failures(func(pgx.Tx, int) error { return nil })
	emit := failures(func(tx pgx.Tx, id int) error {
		_, err := c.prod.Emit(ctx, tx, msg("accounts", strconv.Itoa(id), "changed"))
		return err
	})
	table := failures(func(tx pgx.Tx, id int) error {
		_, err := c.prod.Write(ctx, tx, msg("accounts", strconv.Itoa(id), "changed"))
		return err
	})
	t.Logf("serialization failures in 1,200 transactions: %d without an outbox, %d with outbox_emit, %d with the table", none, emit, table)
	// The counts are small and vary from run to run (updates that find no
	// room on their page conflict in the index): what holds for certain is
	// that outbox_emit reads no relation, so it takes no predicate lock
	// that another transaction's write could conflict with.
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := c.prod.Emit(ctx, tx, msg("accounts", "1", "changed")); err != nil {
		t.Fatal(err)
	}
	var locks []string
	// (The catalogs it reads, the slot's and the database's, are not
	// subject to serializable isolation.)
	rows, err := tx.Query(ctx, `SELECT l.mode || ' ' || l.locktype || ' ' || coalesce(l.relation::regclass::text, '')
FROM pg_locks AS l LEFT JOIN pg_class AS c ON c.oid = l.relation LEFT JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE l.pid = pg_backend_pid() AND (l.mode = 'SIReadLock' OR l.locktype = 'relation' AND n.nspname <> 'pg_catalog')
ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(locks) > 0 {
		t.Errorf("a serializable transaction holds %q after outbox_emit, want no relation and no predicate lock", locks)
	}
	if emit > none+5 {
		t.Errorf("outbox_emit added serialization failures: %d against %d without an outbox", emit, none)
	}
}

// slotName is the name of s's slot, as its schema's function gives it.
func slotName(t *testing.T, s *pgtest.Schema) string {
	t.Helper()
	var n string
	if err := s.Pool.QueryRow(context.Background(), "SELECT outbox_capture_slot()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Messages are delivered under ids from the sequence the id column's
// identity made; set-up checks that it is the one the relay names, and
// says what to do when it is not.
func TestSetUpChecksTheIdentity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSchema(t)
	check := func() []logsource.Check {
		checks, err := logsource.Setup(ctx, s.Pool, s.Name, logsource.SetupOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return checks
	}
	identity := func(checks []logsource.Check) logsource.Check {
		for _, c := range checks {
			if c.What == "identity" {
				return c
			}
		}
		t.Fatalf("no identity check among %v", checks)
		return logsource.Check{}
	}
	if c := identity(check()); !c.OK {
		t.Fatalf("a migrated outbox's identity: %+v", c)
	}
	if _, err := s.Pool.Exec(ctx, `ALTER SEQUENCE outbox_id_seq RENAME TO outbox_ids`); err != nil {
		t.Fatal(err)
	}
	checks := check()
	if c := identity(checks); c.OK || !strings.Contains(c.Found, "outbox_ids") ||
		!strings.Contains(logsource.Missing(checks), "identity (the outbox's id column takes its values from "+s.Name+".outbox_ids): messages are delivered under ids from the sequence outbox_id_seq") {
		t.Errorf("a renamed sequence: %+v\n%s", c, logsource.Missing(checks))
	}
}
