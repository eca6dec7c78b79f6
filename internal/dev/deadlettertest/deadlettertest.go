// Package deadlettertest holds the fixtures of the dead-letter tests, shared
// by the store's and the HTTP API's: dead letters, parked keys and pending
// rows inserted as the relay leaves them, and what the tests check of them.
package deadlettertest

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Base is a fixed past moment the tests dead-letter rows around.
var Base = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

// Actor is who the tests act as.
var Actor = deadletter.Actor{Name: "alice", Source: "cli"}

func NewStore(t testing.TB, s *pgtest.Schema) *deadletter.Store {
	t.Helper()
	return NewStoreWith(t, s, deadletter.Config{})
}

// NewStoreWith is a store on s configured as cfg (its schema s's).
func NewStoreWith(t testing.TB, s *pgtest.Schema, cfg deadletter.Config) *deadletter.Store {
	t.Helper()
	cfg.Schema = s.Name
	st, err := deadletter.NewStore(s.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Query scans one row of sql into dest.
func Query(t testing.TB, s *pgtest.Schema, sql string, args []any, dest ...any) {
	t.Helper()
	if err := s.Pool.QueryRow(context.Background(), sql, args...).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// Count counts the rows of table that match cond.
func Count(t testing.TB, s *pgtest.Schema, table, cond string, args ...any) int {
	t.Helper()
	var n int
	Query(t, s, `SELECT count(*) FROM `+table+` WHERE `+cond, args, &n)
	return n
}

// DBNow is the database's clock, microsecond precise like timestamptz.
func DBNow(t testing.TB, s *pgtest.Schema) time.Time {
	t.Helper()
	var now time.Time
	Query(t, s, `SELECT now()`, nil, &now)
	return now.UTC()
}

// Dead describes a dead letter to insert. Zero fields take the defaults
// of addDead.
type Dead struct {
	Topic   string // default "orders"
	Key     string // "" is a null key
	Payload []byte // default {"n":1}
	Headers string // default {}
	Status  string // default dead_lettered
	Reason  string // default permanent
	// At is dead_lettered_at; default base.
	At        time.Time
	Dest      string // "" is null
	LastError string // default "HTTP 400"
	// History is the error_history JSON; default one entry holding
	// LastError.
	History string
	Retries int
	Parked  bool
	// Legacy leaves out the failure group, as relays before migration
	// 14 did.
	Legacy bool
}

// AddDead inserts a dead letter as the relay leaves one, and returns its id
// and event id.
func AddDead(t testing.TB, s *pgtest.Schema, d Dead) (int64, uuid.UUID) {
	t.Helper()
	if d.Topic == "" {
		d.Topic = "orders"
	}
	if d.Payload == nil {
		d.Payload = []byte(`{"n":1}`)
	}
	if d.Headers == "" {
		d.Headers = "{}"
	}
	if d.Status == "" {
		d.Status = deadletter.StatusDeadLettered
	}
	if d.Reason == "" {
		d.Reason = sink.ReasonPermanent
	}
	if d.At.IsZero() {
		d.At = Base
	}
	if d.LastError == "" {
		d.LastError = "HTTP 400"
	}
	if d.History == "" {
		h, err := json.Marshal([]map[string]any{{"at": d.At, "attempt": 1, "class": "permanent", "error": d.LastError}})
		if err != nil {
			t.Fatal(err)
		}
		d.History = string(h)
	}
	var id int64
	var ev uuid.UUID
	Query(t, s, `INSERT INTO outbox (topic, key, payload, headers) VALUES ($1, $2, $3, $4) RETURNING id, event_id`,
		[]any{d.Topic, Nullable(d.Key), d.Payload, d.Headers}, &id, &ev)
	s.Exec(t, `UPDATE outbox SET status = $2, dead_letter_reason = $3, dead_lettered_at = $4, destination = $5,
    last_error = $6, error_history = $7, retry_count = $8, key_parked = $9, last_attempt_at = $4
WHERE id = $1`, id, d.Status, d.Reason, d.At, Nullable(d.Dest), d.LastError, d.History, d.Retries, d.Parked)
	if !d.Legacy {
		s.Exec(t, `UPDATE outbox SET error_group = outbox_error_group(destination, dead_letter_reason, last_error) WHERE id = $1`, id)
	}
	return id, ev
}

// FailAgain dead-letters row id again, as the relay does when a replayed
// row fails once more.
func FailAgain(t testing.TB, s *pgtest.Schema, id int64) {
	t.Helper()
	if _, err := s.Pool.Exec(context.Background(), `UPDATE outbox SET status = 'dead_lettered', dead_lettered_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

// AddPending inserts a pending row of key, ready after delay (from the
// database's now), with lastError ("" is null) and error history (""
// is empty).
func AddPending(t testing.TB, s *pgtest.Schema, key string, delay time.Duration, lastError, history string) int64 {
	t.Helper()
	if history == "" {
		history = "[]"
	}
	var id int64
	Query(t, s, `INSERT INTO outbox (topic, key, payload, next_attempt_at, last_error, error_history)
VALUES ('orders', $1, '{}', now() + $2 * interval '1 microsecond', $3, $4) RETURNING id`,
		[]any{Nullable(key), delay.Microseconds(), Nullable(lastError), history}, &id)
	return id
}

// Nullable is s, or SQL null for "".
func Nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Parked is a key parked by a dead letter, with the rows behind it.
type Parked struct {
	Key string
	// Park is the dead letter that parks the key.
	Park int64
	// Noted waits behind the key and failed before: releasing the key
	// keeps its last error.
	Noted int64
	// NotedNew waits behind the key and never failed.
	NotedNew int64
	// Own is delayed by its producer, not parked behind the key.
	Own      int64
	OwnReady time.Time
}

// AddParked parks key with a dead letter dead-lettered at, and defers
// rows behind it as the relay does.
func AddParked(t testing.TB, s *pgtest.Schema, key string, at time.Time) Parked {
	t.Helper()
	p := Parked{Key: key}
	p.Park, _ = AddDead(t, s, Dead{Key: key, At: at, Parked: true, Dest: "webhook"})
	p.Noted = AddPending(t, s, key, store.ParkedRecheck, "HTTP 503",
		`[{"at":"2026-11-20T09:00:00Z","attempt":1,"class":"transient","error":"HTTP 500"},
		  {"at":"2026-11-20T09:01:00Z","attempt":2,"class":"transient","error":"HTTP 503"}]`)
	p.NotedNew = AddPending(t, s, key, store.ParkedRecheck, "", "")
	ParkBehind(t, s, p.Park, p.Noted, p.NotedNew)
	p.Own = AddPending(t, s, key, time.Hour, "", "")
	Query(t, s, `SELECT next_attempt_at FROM outbox WHERE id = $1`, []any{p.Own}, &p.OwnReady)
	return p
}

// ParkBehind marks rows as deferred behind the dead letter park, as the
// claim does.
func ParkBehind(t testing.TB, s *pgtest.Schema, park int64, ids ...int64) {
	t.Helper()
	s.Exec(t, `UPDATE outbox SET parked_behind = $1 WHERE id = ANY($2)`, park, ids)
}

// CheckReleased asserts that p's key no longer holds its rows back.
func CheckReleased(t testing.TB, s *pgtest.Schema, p Parked) {
	t.Helper()
	if n := Count(t, s, "outbox", "key = $1 AND key_parked", p.Key); n != 0 {
		t.Errorf("key %s: %d rows still park it", p.Key, n)
	}
	for _, c := range []struct {
		id        int64
		lastError *string
	}{{p.Noted, Nullable("HTTP 503")}, {p.NotedNew, nil}} {
		var ready, behind bool
		var lastError *string
		Query(t, s, `SELECT next_attempt_at <= now(), parked_behind IS NOT NULL, last_error FROM outbox WHERE id = $1`,
			[]any{c.id}, &ready, &behind, &lastError)
		if !ready || behind || !EqualPtr(lastError, c.lastError) {
			t.Errorf("row %d behind released key %s: ready %v, still parked behind it %v, last_error %v; want ready, not parked, with last_error %v",
				c.id, p.Key, ready, behind, Str(lastError), Str(c.lastError))
		}
	}
	CheckOwnDelay(t, s, p)
}

// CheckParked asserts that p's key still holds its rows back.
func CheckParked(t testing.TB, s *pgtest.Schema, p Parked) {
	t.Helper()
	if n := Count(t, s, "outbox", "id = $1 AND key_parked AND status = 'dead_lettered'", p.Park); n != 1 {
		t.Errorf("key %s: row %d no longer parks it", p.Key, p.Park)
	}
	if n := Count(t, s, "outbox", "id = ANY($1) AND next_attempt_at > now() AND parked_behind = $2",
		[]int64{p.Noted, p.NotedNew}, p.Park); n != 2 {
		t.Errorf("key %s: %d of its 2 waiting rows still wait, want both", p.Key, n)
	}
	CheckOwnDelay(t, s, p)
}

// CheckOwnDelay asserts that p's row delayed by its producer kept its delay.
func CheckOwnDelay(t testing.TB, s *pgtest.Schema, p Parked) {
	t.Helper()
	var next time.Time
	var lastError *string
	Query(t, s, `SELECT next_attempt_at, last_error FROM outbox WHERE id = $1`, []any{p.Own}, &next, &lastError)
	if !next.Equal(p.OwnReady) || lastError != nil {
		t.Errorf("row %d with its producer's delay: next_attempt_at %v last_error %v, want %v and null",
			p.Own, next, Str(lastError), p.OwnReady)
	}
}

// EqualPtr reports whether a and b are both null or equal.
func EqualPtr(a, b *string) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// Str quotes p, or says <null>.
func Str(p *string) string {
	if p == nil {
		return "<null>"
	}
	return strconv.Quote(*p)
}

// Snapshot is every row of the outbox and audit tables, to check that an
// action changed nothing.
func Snapshot(t testing.TB, s *pgtest.Schema) string {
	t.Helper()
	var rows, audit string
	Query(t, s, `SELECT coalesce(string_agg(row_to_json(o)::text, E'\n' ORDER BY id), '') FROM outbox AS o`, nil, &rows)
	Query(t, s, `SELECT coalesce(string_agg(row_to_json(a)::text, E'\n' ORDER BY id), '') FROM outbox_audit AS a`, nil, &audit)
	return rows + "\n--\n" + audit
}

// CheckUnchanged asserts that the tables are as Snapshot found them.
func CheckUnchanged(t testing.TB, s *pgtest.Schema, before string) {
	t.Helper()
	if after := Snapshot(t, s); after != before {
		t.Errorf("tables changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// AuditRecord is a row of outbox_audit.
type AuditRecord struct {
	Actor, Source, Action string
	Reason                *string
	RowIDs                []int64
	Details               map[string]any
}

// AuditRecords returns the audit trail, oldest first.
func AuditRecords(t testing.TB, s *pgtest.Schema) []AuditRecord {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `SELECT actor, source, action, reason, row_ids, details FROM outbox_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var recs []AuditRecord
	for rows.Next() {
		var r AuditRecord
		if err := rows.Scan(&r.Actor, &r.Source, &r.Action, &r.Reason, &r.RowIDs, &r.Details); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return recs
}

// State is what an action changes in a row.
type State struct {
	Status         string
	RetryCount     int
	Ready          bool
	NextAttemptAt  time.Time
	Reason         *string
	DeadLetteredAt *time.Time
	LastAttemptAt  *time.Time
	KeyParked      bool
	LastError      *string
	History        string
	Topic          string
	Headers        string
	Payload        []byte
}

// RowState reads row id's state.
func RowState(t testing.TB, s *pgtest.Schema, id int64) State {
	t.Helper()
	var r State
	Query(t, s, `SELECT status, retry_count, next_attempt_at <= now(), next_attempt_at, dead_letter_reason,
    dead_lettered_at, last_attempt_at, key_parked, last_error, error_history::text, topic, headers::text, payload
FROM outbox WHERE id = $1`, []any{id}, &r.Status, &r.RetryCount, &r.Ready, &r.NextAttemptAt, &r.Reason,
		&r.DeadLetteredAt, &r.LastAttemptAt, &r.KeyParked, &r.LastError, &r.History, &r.Topic, &r.Headers, &r.Payload)
	return r
}

// CheckReplayed asserts that row id is pending again as new, apart from
// its error history.
func CheckReplayed(t testing.TB, s *pgtest.Schema, id int64, history string) {
	t.Helper()
	r := RowState(t, s, id)
	if r.Status != "pending" || r.RetryCount != 0 || !r.Ready || r.Reason != nil || r.DeadLetteredAt != nil ||
		r.LastAttemptAt != nil || r.KeyParked {
		t.Errorf("row %d after replay = %+v, want pending, 0 retries, ready, no reason, dead-letter or attempt time", id, r)
	}
	if history != "" && r.History != history {
		t.Errorf("row %d error history = %s, want it kept: %s", id, r.History, history)
	}
}

// Statuses returns the status of each row of ids.
func Statuses(t testing.TB, s *pgtest.Schema, ids ...int64) []string {
	t.Helper()
	out := make([]string, len(ids))
	for i, id := range ids {
		Query(t, s, `SELECT status FROM outbox WHERE id = $1`, []any{id}, &out[i])
	}
	return out
}

// Sorted returns a sorted copy of ids.
func Sorted(ids []int64) []int64 {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

// IDsOf returns the row ids of ls.
func IDsOf(ls []deadletter.Letter) []int64 {
	out := make([]int64, len(ls))
	for i, l := range ls {
		out[i] = l.ID
	}
	return out
}
