package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.WaitingTests) }

func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close(); pool.Close() })
	return db
}

// migrateUp applies every migration to the default schema of db.
func migrateUp(t *testing.T, db *sql.DB) *migrations.Migrator {
	t.Helper()
	m, err := migrations.New(db, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// downThrough migrates down until migration version is undone.
func downThrough(t *testing.T, m *migrations.Migrator, version int64) {
	t.Helper()
	for {
		res, err := m.Down(context.Background())
		if err != nil {
			t.Fatalf("down: %v", err)
		}
		if res.Source.Version == version {
			return
		}
	}
}

func tableExists(t *testing.T, db *sql.DB, schema, table string) bool {
	t.Helper()
	var ok bool
	err := db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, schema+"."+table).Scan(&ok)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t, pgtest.NewDatabase(t))
	m, err := migrations.New(db, "") // default schema
	if err != nil {
		t.Fatal(err)
	}

	res, err := m.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) < 2 {
		t.Fatalf("applied %d migrations, want at least 2", len(res))
	}
	if !tableExists(t, db, "public", "outbox") {
		t.Fatal("public.outbox missing after up")
	}
	if !tableExists(t, db, "public", migrations.VersionTable) {
		t.Fatal("version table missing after up")
	}
	if tableExists(t, db, "public", "goose_db_version") {
		t.Fatal("goose's default version table was created; an application's own goose history would collide")
	}

	// Up again is a no-op.
	res, err = m.Up(ctx)
	if err != nil || len(res) != 0 {
		t.Fatalf("second up: %d results, err %v", len(res), err)
	}

	st, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.State != "applied" {
			t.Errorf("migration %d state %q, want applied", s.Source.Version, s.State)
		}
	}

	// Down all the way.
	for range st {
		if _, err := m.Down(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if tableExists(t, db, "public", "outbox") {
		t.Fatal("outbox still there after every migration was reverted")
	}
	var fn sql.NullString
	if err := db.QueryRow(`SELECT to_regproc('public.outbox_notify')::text`).Scan(&fn); err != nil {
		t.Fatal(err)
	}
	if fn.Valid {
		t.Fatal("notify function left behind by down")
	}

	// And up again.
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO public.outbox (topic, payload) VALUES ('t', 'x')`); err != nil {
		t.Fatalf("insert after up/down/up: %v", err)
	}
}

func TestDownRefusesToDropRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t, pgtest.NewDatabase(t))
	m, err := migrations.New(db, "app_outbox")
	if err != nil {
		t.Fatal(err)
	}
	st, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO app_outbox.outbox (topic, payload) VALUES ('orders', 'x')`); err != nil {
		t.Fatal(err)
	}
	// The audit trail is refused too while it holds records.
	if _, err := db.Exec(`INSERT INTO app_outbox.outbox_audit (actor, source, action, row_ids) VALUES ('alice', 'cli', 'replay', '{1}')`); err != nil {
		t.Fatal(err)
	}
	var downs int
	for ; downs < len(st); downs++ {
		_, err := m.Down(ctx)
		if err != nil {
			if !strings.Contains(err.Error(), "outbox_audit: it still holds records") {
				t.Fatalf("down with audit records: err = %v, want a refusal", err)
			}
			break
		}
	}
	if _, err := db.Exec(`DELETE FROM app_outbox.outbox_audit`); err != nil {
		t.Fatal(err)
	}
	// Revert everything above the table itself; the last step must refuse.
	for range len(st) - 1 - downs {
		if _, err := m.Down(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_, err = m.Down(ctx)
	if err == nil || !strings.Contains(err.Error(), "still holds rows") {
		t.Fatalf("down with rows: err = %v, want a refusal", err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM app_outbox.outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("rows after refused down = %d, want 1", n)
	}
}

func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	const replicas = 4
	var wg sync.WaitGroup
	errs := make([]error, replicas)
	start := make(chan struct{})
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := openDB(t, dsn)
			m, err := migrations.New(db, "shared")
			if err != nil {
				errs[i] = err
				return
			}
			<-start
			_, errs[i] = m.Up(ctx)
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
	db := openDB(t, dsn)
	var applied int
	if err := db.QueryRow(`SELECT count(*) FROM shared.` + migrations.VersionTable + ` WHERE version_id > 0`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	m, _ := migrations.New(db, "shared")
	st, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if applied != len(st) {
		t.Fatalf("version table has %d applied rows, want %d (each migration once)", applied, len(st))
	}
}

func TestPlainInsertFillsDefaults(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	ctx := context.Background()
	var (
		id                     int64
		eventID                string
		status                 string
		retries                int
		headers                string
		createdAt, nextAttempt time.Time
		now                    time.Time
		history                string
	)
	err := s.Pool.QueryRow(ctx, `
		INSERT INTO outbox (topic, key, payload, headers)
		VALUES ('orders', 'order-1', '\x7b7d', '{"traceparent": "00-abc"}')
		RETURNING id, event_id::text, status, retry_count, headers::text, created_at, next_attempt_at, now(), error_history::text`).
		Scan(&id, &eventID, &status, &retries, &headers, &createdAt, &nextAttempt, &now, &history)
	if err != nil {
		t.Fatal(err)
	}
	if id <= 0 || len(eventID) != 36 || status != "pending" || retries != 0 || history != "[]" {
		t.Fatalf("defaults: id=%d event_id=%q status=%q retry_count=%d history=%s", id, eventID, status, retries, history)
	}
	if !createdAt.Equal(now) || !nextAttempt.Equal(now) {
		t.Fatalf("created_at=%v next_attempt_at=%v, want the transaction's now() %v", createdAt, nextAttempt, now)
	}
	// Headers default to an empty object; the key may be null.
	if _, err := s.Pool.Exec(ctx, `INSERT INTO outbox (topic, payload) VALUES ('orders', '')`); err != nil {
		t.Fatal(err)
	}
}

func TestConstraints(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	ctx := context.Background()
	for name, stmt := range map[string]string{
		"empty topic":        `INSERT INTO outbox (topic, payload) VALUES ('', 'x')`,
		"null payload":       `INSERT INTO outbox (topic, payload) VALUES ('t', NULL)`,
		"headers not object": `INSERT INTO outbox (topic, payload, headers) VALUES ('t', 'x', '["a"]')`,
		"unknown status":     `INSERT INTO outbox (topic, payload, status) VALUES ('t', 'x', 'lost')`,
		"unknown reason":     `INSERT INTO outbox (topic, payload, status, dead_letter_reason) VALUES ('t', 'x', 'dead_lettered', 'bored')`,
		"reason on pending":  `INSERT INTO outbox (topic, payload, dead_letter_reason) VALUES ('t', 'x', 'permanent')`,
		"dead without time":  `INSERT INTO outbox (topic, payload, status, dead_letter_reason) VALUES ('t', 'x', 'dead_lettered', 'permanent')`,
		"explicit id":        `INSERT INTO outbox (id, topic, payload) VALUES (1, 't', 'x')`,
	} {
		if _, err := s.Pool.Exec(ctx, stmt); err == nil {
			t.Errorf("%s: insert succeeded, want a constraint error", name)
		}
	}
}

// The operators' view shows dead-lettered and discarded rows, without
// payload bytes; the audit table refuses an action it does not know.
func TestDeadLetterViewAndAudit(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	ctx := context.Background()
	if _, err := s.Pool.Exec(ctx, `INSERT INTO outbox (topic, payload, status, dead_letter_reason, dead_lettered_at, destination)
VALUES ('a', 'xyz', 'dead_lettered', 'permanent', now(), 'hooks'),
       ('b', 'xyz', 'discarded', 'too_large', now(), NULL),
       ('c', 'xyz', 'pending', NULL, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	rows, err := s.Pool.Query(ctx, `SELECT * FROM outbox_dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var topics []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		topics = append(topics, vals[2].(string))
	}
	for _, f := range rows.FieldDescriptions() {
		if f.Name == "payload" {
			t.Error("the view shows payload bytes")
		}
	}
	if rows.Err() != nil || strings.Join(topics, ",") != "a,b" {
		t.Fatalf("view rows: %v (%v)", topics, rows.Err())
	}
	var dest, reason string
	var size int
	if err := s.Pool.QueryRow(ctx, `SELECT destination, reason, payload_bytes FROM outbox_dead_letters WHERE topic = 'a'`).Scan(&dest, &reason, &size); err != nil ||
		dest != "hooks" || reason != "permanent" || size != 3 {
		t.Fatalf("view columns: %q %q %d (%v)", dest, reason, size, err)
	}
	if _, err := s.Pool.Exec(ctx, `INSERT INTO outbox_audit (actor, source, action, row_ids) VALUES ('a', 'cli', 'delete', '{1}')`); err == nil {
		t.Error("the audit table took an unknown action")
	}
	var validated bool
	if err := s.Pool.QueryRow(ctx, `SELECT convalidated FROM pg_constraint
WHERE conname = 'outbox_dead_lettered_at_check' AND connamespace = $1::regnamespace`, s.Name).Scan(&validated); err != nil || !validated {
		t.Errorf("dead-letter time constraint validated: %v (%v)", validated, err)
	}
}

// The wake-up trigger notifies once per statement, not once per row.
func TestWakeupOncePerStatement(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	w := listen(t, s)
	if _, err := s.Pool.Exec(context.Background(), `INSERT INTO outbox (topic, payload) SELECT 't', 'x' FROM generate_series(1, 500)`); err != nil {
		t.Fatal(err)
	}
	if got := w.count(t); got != 1 {
		t.Fatalf("500-row insert sent %d notifications, want 1", got)
	}
}

// wakeups listens to a schema's wake-up channel.
type wakeups struct {
	s       *pgtest.Schema
	conn    *pgx.Conn
	channel string
	marker  string
}

func listen(t *testing.T, s *pgtest.Schema) *wakeups {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	w := &wakeups{s: s, conn: conn, channel: s.Name + ".outbox", marker: s.Name + ".marker"}
	// The marker channel is the schema's own: parallel tests share the
	// database.
	for _, ch := range []string{w.channel, w.marker} {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// count returns the wake-ups received so far. It sends a marker: committed
// after everything before it, it arrives after all their notifications.
func (w *wakeups) count(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	if _, err := w.s.Pool.Exec(ctx, "SELECT pg_notify($1, '')", w.marker); err != nil {
		t.Fatal(err)
	}
	got := 0
	for {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := w.conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for notifications: %v", err)
		}
		switch n.Channel {
		case w.marker:
			return got
		case w.channel:
			got++
		default:
			t.Fatalf("notification on %q, want %q", n.Channel, w.channel)
		}
	}
}

func TestValidateSchema(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"public":                  true,
		"_outbox":                 true,
		"Orders2":                 true,
		"":                        false,
		"1abc":                    false,
		"a-b":                     false,
		`a"b`:                     false,
		"a.b":                     false,
		strings.Repeat("a", 56):   true,
		strings.Repeat("a", 57):   false,
		"robert'); DROP TABLE x;": false,
	} {
		err := migrations.ValidateSchema(name)
		if (err == nil) != ok {
			t.Errorf("ValidateSchema(%q) = %v, want ok=%v", name, err, ok)
		}
	}
	if _, err := migrations.New(nil, "bad-name"); err == nil {
		t.Error("New accepted an invalid schema name")
	}
}

// Of transactions inserting at the same time, one notifies: the others'
// rows are found by the claim that its notification triggers, or the next.
func TestWakeupOneNotifierAtATime(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	ctx := context.Background()
	w := listen(t, s)
	first, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tx := range []pgx.Tx{first, second} {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (topic, payload) VALUES ('t', 'x')`); err != nil {
			t.Fatal(err)
		}
	}
	for _, tx := range []pgx.Tx{second, first} {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A third, alone, notifies again.
	if _, err := s.Pool.Exec(ctx, `INSERT INTO outbox (topic, payload) VALUES ('t', 'y')`); err != nil {
		t.Fatal(err)
	}
	if got := w.count(t); got != 2 {
		t.Fatalf("%d notifications, want 2: one for the two overlapping transactions, one for the third", got)
	}
}

// The wake-up trigger tries its lock in its WHEN condition. Moving it
// there keeps a trigger an operator dropped dropped, and one disabled or
// set to fire always keeps that state, both ways; reverting puts the lock
// back in the function.
func TestWakeupLockMovesToWhen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t, pgtest.NewDatabase(t))
	m, err := migrations.New(db, "shop")
	if err != nil {
		t.Fatal(err)
	}
	up := func() {
		t.Helper()
		if _, err := m.Up(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// down reverts the migrations down to and including the one that
	// moved the lock.
	down := func() {
		t.Helper()
		for {
			res, err := m.Down(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if res.Source.Version == 5 {
				return
			}
		}
	}
	up()
	// state is the trigger's state ("" when dropped) and definition.
	state := func() (string, string) {
		t.Helper()
		var enabled, def string
		err := db.QueryRow(`SELECT tgenabled::text, pg_get_triggerdef(oid) FROM pg_trigger
WHERE tgrelid = 'shop.outbox'::regclass AND tgname = 'outbox_notify'`).Scan(&enabled, &def)
		if err == sql.ErrNoRows {
			return "", ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return enabled, def
	}
	const when = "WHEN (pg_try_advisory_xact_lock(1869903970, hashtext('shop.outbox'::text)))"
	if enabled, def := state(); enabled != "O" || !strings.Contains(def, when) {
		t.Fatalf("after up: trigger enabled %q, %s; want enabled, %s", enabled, def, when)
	}
	down()
	if enabled, def := state(); enabled != "O" || strings.Contains(def, "WHEN") {
		t.Fatalf("after down: trigger enabled %q, %s; want enabled, without WHEN", enabled, def)
	}
	var fn string
	if err := db.QueryRow(`SELECT prosrc FROM pg_proc WHERE oid = 'shop.outbox_notify'::regproc`).Scan(&fn); err != nil ||
		!strings.Contains(fn, "pg_try_advisory_xact_lock") {
		t.Fatalf("after down: notify function %q (%v), want the lock back in it", fn, err)
	}

	if _, err := db.Exec(`ALTER TABLE shop.outbox DISABLE TRIGGER outbox_notify`); err != nil {
		t.Fatal(err)
	}
	up()
	if enabled, def := state(); enabled != "D" || !strings.Contains(def, when) {
		t.Fatalf("up with the trigger disabled: enabled %q, %s; want disabled, %s", enabled, def, when)
	}

	down()
	if enabled, _ := state(); enabled != "D" {
		t.Fatalf("down with the trigger disabled: enabled %q, want disabled", enabled)
	}
	if _, err := db.Exec(`ALTER TABLE shop.outbox ENABLE ALWAYS TRIGGER outbox_notify`); err != nil {
		t.Fatal(err)
	}
	up()
	if enabled, def := state(); enabled != "A" || !strings.Contains(def, when) {
		t.Fatalf("up with the trigger firing always (logical replication): enabled %q, %s; want it still always, %s", enabled, def, when)
	}

	down()
	if _, err := db.Exec(`DROP TRIGGER outbox_notify ON shop.outbox`); err != nil {
		t.Fatal(err)
	}
	up()
	if enabled, def := state(); enabled != "" {
		t.Fatalf("up with the trigger dropped: it is back (%q, %s)", enabled, def)
	}
}

// An INSERT into the outbox has its transaction id before it builds its
// first row (and takes its id): strict order depends on it.
func TestInsertTakesItsTransactionIDFirst(t *testing.T) {
	t.Parallel()
	db := openDB(t, pgtest.NewDatabase(t))
	migrateUp(t, db)
	// A row trigger runs once the row, id included, is built: it records
	// whether the transaction had an id by then.
	for _, stmt := range []string{
		`CREATE FUNCTION record_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.headers := jsonb_build_object('xid', pg_current_xact_id_if_assigned()::text);
    RETURN NEW;
END $$`,
		`CREATE TRIGGER record_xid BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION record_xid()`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	// The rows' ids are given, not drawn: a draw from the sequence that
	// writes WAL (every 32nd, and the first after a checkpoint) takes a
	// transaction id of its own, which would pass for the trigger's.
	id := 1 << 40 // far from the ids the sequence gives
	xidAtRow := func() string {
		t.Helper()
		id++
		var xid sql.NullString
		if err := db.QueryRow(`INSERT INTO outbox (id, topic, payload) OVERRIDING SYSTEM VALUE VALUES ($1, 't', 'x') RETURNING headers->>'xid'`, id).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid.String
	}
	if xid := xidAtRow(); xid == "" {
		t.Fatal("the row was built before its transaction had an id")
	}
	if _, err := db.Exec(`ALTER TABLE outbox DISABLE TRIGGER outbox_xid_first`); err != nil {
		t.Fatal(err)
	}
	if xid := xidAtRow(); xid != "" {
		t.Fatalf("without the trigger the transaction already had id %s: the test proves nothing", xid)
	}
}

// Migrations that change the table while producers write to it do not
// queue producers behind a transaction writing to the table: they give up
// their lock wait within seconds, and 'migrate up' tries again until it
// gets through.
func TestTableMigrationsDoNotStallProducers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		version int64
		// statement starts the migration's statement that waits;
		// applied checks that it is applied.
		statement, applied string
	}{
		{6, "CREATE TRIGGER outbox_xid_first", `SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_xid_first'`},
		{7, "ALTER TABLE \"public\".outbox ADD COLUMN parked_behind", `SELECT count(*) FROM information_schema.columns
WHERE table_name = 'outbox' AND column_name = 'parked_behind'`},
		{14, "ALTER TABLE \"public\".outbox ADD COLUMN error_group", `SELECT count(*) FROM information_schema.columns
WHERE table_name = 'outbox' AND column_name = 'error_group'`},
		{15, "CREATE INDEX CONCURRENTLY outbox_failure_group_idx", `SELECT count(*) FROM pg_index
WHERE indexrelid = 'outbox_failure_group_idx'::regclass AND indisvalid`},
		{24, "CREATE INDEX CONCURRENTLY outbox_failure_group_next_idx", `SELECT count(*) FROM pg_index
WHERE indexrelid = 'outbox_failure_group_idx'::regclass AND indisvalid AND indnatts = 6`},
	} {
		t.Run(fmt.Sprint(c.version), func(t *testing.T) {
			t.Parallel()
			testMigrationDoesNotStallProducers(t, c.version, c.statement, c.applied)
		})
	}
}

func testMigrationDoesNotStallProducers(t *testing.T, version int64, statement, applied string) {
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	m := migrateUp(t, openDB(t, dsn))
	for {
		res, err := m.Down(ctx)
		if err != nil {
			t.Fatalf("down: %v", err)
		}
		if res.Source.Version == version {
			break
		}
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	writer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if _, err := writer.Exec(ctx, `INSERT INTO outbox (topic, payload) VALUES ('t', 'x')`); err != nil {
		t.Fatal(err)
	}

	migrated := make(chan error, 1)
	go func() {
		_, err := m.Up(ctx)
		migrated <- err
	}()
	// Wait until the migration is queued for its lock.
	testwait.For(t, "the migration to wait for its lock", func() bool {
		select {
		case err := <-migrated:
			t.Fatalf("the migration ended while the writer runs: %v", err)
		default:
		}
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND starts_with(query, $1))`, statement).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	// Another producer gets through while the writer still runs.
	insertCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := pool.Exec(insertCtx, `INSERT INTO outbox (topic, payload) VALUES ('t', 'y')`); err != nil {
		t.Fatalf("a producer was held behind the migration: %v", err)
	}
	select {
	case err := <-migrated:
		t.Fatalf("the migration ended while the writer runs: %v", err)
	default:
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-migrated; err != nil {
		t.Fatalf("migrate up after the writer ended: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, applied).Scan(&n); err != nil || n != 1 {
		t.Fatalf("migration %d applied %d times (%v), want 1", version, n, err)
	}
}

// Rows deferred behind a parked key by a relay from before the
// parked_behind column carry a note in last_error: the migrations move it
// to the column and give the rows back their own last error.
func TestParkedNoteBecomesColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	db := openDB(t, dsn)
	m := migrateUp(t, db)
	downThrough(t, m, 7)
	if _, err := db.Exec(`INSERT INTO outbox (topic, key, payload, status, dead_letter_reason, dead_lettered_at, key_parked)
VALUES ('t', 'K', 'x', 'dead_lettered', 'permanent', now(), true)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO outbox (topic, key, payload, last_error, error_history) VALUES
    ('t', 'K', 'x', 'waiting: key parked by dead-lettered row 1', '[{"error": "HTTP 503"}]'),
    ('t', 'K', 'x', 'waiting: key parked by dead-lettered row 1', '[]'),
    ('t', 'L', 'x', 'HTTP 500', '[{"error": "HTTP 500"}]')`); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT id, coalesce(parked_behind::text, '-'), coalesce(last_error, '-') FROM outbox WHERE status = 'pending' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var id int64
		var behind, lastError string
		if err := rows.Scan(&id, &behind, &lastError); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d behind %s: %s", id, behind, lastError))
	}
	want := []string{"2 behind 1: HTTP 503", "3 behind 1: -", "4 behind -: HTTP 500"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after migrating:\n got %q\nwant %q", got, want)
	}
}

func TestCheckVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	db := openDB(t, dsn)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	var ve *migrations.VersionError
	if _, err := migrations.Check(ctx, pool, "public"); !errors.As(err, &ve) || ve.Found != 0 || ve.Need != migrations.Version {
		t.Fatalf("unmigrated: %v", err)
	}
	m := migrateUp(t, db)
	sv, err := migrations.Check(ctx, pool, "public")
	if err != nil || sv.Found != migrations.Version || sv.CompatibleFrom != 8 {
		t.Fatalf("migrated: %+v, %v", sv, err)
	}
	if _, err := m.Down(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Check(ctx, pool, "public"); !errors.As(err, &ve) || ve.Found != migrations.Version-1 {
		t.Fatalf("one down: %v", err)
	}
}

// Autovacuum on the outbox table is throttled as on the rest of the
// server: migration 13 made it unthrottled, migration 20 resets that, and
// keeps a setting an operator chose, both ways.
func TestOutboxVacuumThrottle(t *testing.T) {
	t.Parallel()
	db := openDB(t, pgtest.NewDatabase(t))
	m := migrateUp(t, db)
	options := func() string {
		var opts sql.NullString
		if err := db.QueryRow(`SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = 'outbox'::regclass`).Scan(&opts); err != nil {
			t.Fatal(err)
		}
		return opts.String
	}
	if got := options(); got != "" {
		t.Fatalf("outbox table options %q, want none: the server's throttle", got)
	}
	downThrough(t, m, 20)
	if got := options(); got != "autovacuum_vacuum_cost_delay=0" {
		t.Fatalf("below migration 20, outbox table options %q, want autovacuum_vacuum_cost_delay=0", got)
	}
	downThrough(t, m, 13)
	if got := options(); got != "" {
		t.Fatalf("below migration 13, outbox table options %q, want none", got)
	}

	// An operator's own setting stays, down and up.
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`ALTER TABLE outbox SET (autovacuum_vacuum_cost_delay = 5)`); err != nil {
		t.Fatal(err)
	}
	downThrough(t, m, 20)
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := options(); got != "autovacuum_vacuum_cost_delay=5" {
		t.Fatalf("after down and up, outbox table options %q, want the operator's autovacuum_vacuum_cost_delay=5", got)
	}
}

// Rows dead-lettered before the failure groups get their group when the
// migrations run, in batches; pending rows get none; the groups'
// index is built valid, and both migrations go down and up again.
func TestFailureGroupsMigrations(t *testing.T) {
	t.Parallel()
	db := openDB(t, pgtest.NewDatabase(t))
	m := migrateUp(t, db)
	downThrough(t, m, 14)
	if _, err := db.Exec(`INSERT INTO outbox (topic, payload, status, dead_letter_reason, dead_lettered_at, last_error)
SELECT 't', 'x', CASE WHEN g % 10 = 0 THEN 'discarded' ELSE 'dead_lettered' END, 'permanent', now(), 'HTTP 400 for order ' || g
FROM generate_series(1, 12000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO outbox (topic, payload, last_error) VALUES ('t', 'x', 'HTTP 503 for order 1')`); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	var done, pending, valid int
	if err := db.QueryRow(`SELECT count(*) FILTER (WHERE error_group = outbox_error_group(NULL, 'permanent', 'HTTP 1 for order 2')
        AND status <> 'pending'),
    count(*) FILTER (WHERE error_group IS NOT NULL AND status = 'pending'),
    (SELECT count(*) FROM pg_index WHERE indexrelid = 'outbox_failure_group_idx'::regclass AND indisvalid)
FROM outbox`).Scan(&done, &pending, &valid); err != nil {
		t.Fatal(err)
	}
	if done != 12000 || pending != 0 || valid != 1 {
		t.Fatalf("after up: %d dead letters grouped (want 12000), %d pending rows (want 0), %d valid index (want 1)", done, pending, valid)
	}
	downThrough(t, m, 14)
	var left int
	if err := db.QueryRow(`SELECT count(*) FROM pg_proc WHERE proname = 'outbox_error_fingerprint'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("after down: %d fingerprint functions (%v), want 0", left, err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// Dead letters grouped by the first fingerprint are regrouped: answers
// that differ only in a value inside a JSON body, which it told apart,
// fall into one group; the others keep theirs. Down restores the first
// fingerprint and its groups.
func TestFingerprintMigrationRegroups(t *testing.T) {
	t.Parallel()
	db := openDB(t, pgtest.NewDatabase(t))
	m := migrateUp(t, db)
	downThrough(t, m, 17)
	if _, err := db.Exec(`INSERT INTO outbox (topic, payload, status, dead_letter_reason, dead_lettered_at, last_error, destination)
SELECT 't', 'x', 'dead_lettered', 'retries_exhausted', now(),
    CASE WHEN g % 2 = 0 THEN 'HTTP 500: "{\"error\":\"' || (ARRAY['card declined', 'insufficient funds', 'expired card'])[g % 3 + 1] || '\"}"'
        ELSE 'HTTP 400 for order ' || g END, 'hook'
FROM generate_series(1, 7000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE outbox SET error_group = outbox_error_group(destination, dead_letter_reason, last_error)`); err != nil {
		t.Fatal(err)
	}
	groups := func() (json, plain int) {
		t.Helper()
		if err := db.QueryRow(`SELECT count(DISTINCT error_group) FILTER (WHERE last_error LIKE 'HTTP 500%'),
    count(DISTINCT error_group) FILTER (WHERE last_error LIKE 'HTTP 400%') FROM outbox`).Scan(&json, &plain); err != nil {
			t.Fatal(err)
		}
		return json, plain
	}
	if json, plain := groups(); json != 3 || plain != 1 {
		t.Fatalf("before: %d groups of JSON answers (want 3: the first fingerprint tells their values apart), %d of plain ones (want 1)", json, plain)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	if json, plain := groups(); json != 1 || plain != 1 {
		t.Fatalf("after up: %d groups of JSON answers, %d of plain ones; want 1 and 1", json, plain)
	}
	var stale int
	if err := db.QueryRow(`SELECT count(*) FROM outbox WHERE error_group <> outbox_error_group(destination, dead_letter_reason, last_error)`).Scan(&stale); err != nil || stale != 0 {
		t.Fatalf("after up: %d rows whose group is not their fingerprint's (%v)", stale, err)
	}
	downThrough(t, m, 17)
	if json, plain := groups(); json != 3 || plain != 1 {
		t.Fatalf("after down: %d groups of JSON answers (want 3), %d of plain ones (want 1)", json, plain)
	}
}
