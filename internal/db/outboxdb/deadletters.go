package outboxdb

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Letter is an outbox row as the dead-letter operations show it: a dead
// letter, or any row when looked up by reference.
type Letter struct {
	ID      int64     `json:"id"`
	EventID uuid.UUID `json:"event_id"`
	Topic   string    `json:"topic"`
	// Key is nil for a row without a key.
	Key *string `json:"key"`
	// Destination is where the row last failed; empty when it never
	// reached one.
	Destination string `json:"destination,omitempty"`
	Status      string `json:"status"`
	Reason      string `json:"reason,omitempty"`
	// ParksKey is true while the row holds back its key's later rows.
	ParksKey bool `json:"parks_key"`
	// ParkedBehind is, for a pending row held back by a parked key, the
	// dead letter that parks it.
	ParkedBehind   *int64     `json:"parked_behind,omitempty"`
	Attempts       int        `json:"attempts"`
	LastError      string     `json:"last_error,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	NextAttemptAt  time.Time  `json:"next_attempt_at"`
	LastAttemptAt  *time.Time `json:"last_attempt_at,omitempty"`
	DeadLetteredAt *time.Time `json:"dead_lettered_at,omitempty"`
	PayloadBytes   int        `json:"payload_bytes"`
	// Headers are the row's headers as stored: a JSON object, though a
	// row dead-lettered invalid_message may hold anything.
	Headers json.RawMessage `json:"headers"`
}

func scanLetter(row pgx.Row, extra ...any) (Letter, error) {
	var l Letter
	var headers []byte
	dest := append([]any{&l.ID, &l.EventID, &l.Topic, &l.Key, &l.Destination, &l.Status,
		&l.Reason, &l.ParksKey, &l.ParkedBehind, &l.Attempts, &l.LastError,
		&l.CreatedAt, &l.NextAttemptAt, &l.LastAttemptAt, &l.DeadLetteredAt, &l.PayloadBytes, &headers}, extra...)
	if err := row.Scan(dest...); err != nil {
		return l, err
	}
	l.Headers = json.RawMessage(headers)
	return l, nil
}

// Ref names a row by id, or by event id when ID is 0.
type Ref struct {
	ID      int64
	EventID uuid.UUID
}

// args are the parameters of ref_match: only the column r names, so that
// a row with a zero event id never matches a lookup by id.
func (r Ref) args() (int64, pgtype.UUID) {
	if r.ID > 0 {
		return r.ID, pgtype.UUID{}
	}
	return 0, pgtype.UUID{Bytes: r.EventID, Valid: true}
}

// GetRow returns the row r names, whatever its status, with its payload
// and error history (a JSON array). pgx.ErrNoRows if there is none.
// Statement: get_row.
func (q *Queries) GetRow(ctx context.Context, db DB, r Ref) (l Letter, payload, history []byte, err error) {
	id, ev := r.args()
	l, err = scanLetter(db.QueryRow(ctx, q.getRow, id, ev), &payload, &history)
	return l, payload, history, err
}

// Bound is a time bound: At, or Ago before the statement's now().
type Bound struct {
	At  time.Time
	Ago time.Duration
}

// IsZero reports whether b bounds nothing.
func (b Bound) IsZero() bool { return b.At.IsZero() && b.Ago == 0 }

// LetterFilter selects dead letters; zero fields match everything.
type LetterFilter struct {
	// Topic is a name, or a glob where * matches any run of characters
	// and ? one character.
	Topic, Destination, Reason, Key string
	// Since (inclusive) and Until (exclusive) bound dead_lettered_at.
	Since, Until Bound
	// ErrorContains is text in last_error, without regard to case.
	ErrorContains string
	// Group is a failure group's id.
	Group string
}

func (w *where) letters(f LetterFilter) {
	if f.Topic != "" {
		if strings.ContainsAny(f.Topic, "*?") {
			w.add(`topic LIKE ?`, globToLike(f.Topic))
		} else {
			w.add("topic = ?", f.Topic)
		}
	}
	if f.Destination != "" {
		w.add("destination = ?", f.Destination)
	}
	if f.Reason != "" {
		w.add("dead_letter_reason = ?", f.Reason)
	}
	if f.Key != "" {
		w.add("key = ?", f.Key)
	}
	w.bound("dead_lettered_at", ">=", f.Since)
	w.bound("dead_lettered_at", "<", f.Until)
	if f.ErrorContains != "" {
		w.add("strpos(lower(last_error), lower(?)) > 0", f.ErrorContains)
	}
	if f.Group != "" {
		w.add("error_group = ?", f.Group)
	}
}

// bound adds column op b, if b bounds anything.
func (w *where) bound(column, op string, b Bound) {
	switch {
	case b.Ago > 0:
		w.add(column+" "+op+" now() - ? * interval '1 microsecond'", b.Ago.Microseconds())
	case !b.At.IsZero():
		w.add(column+" "+op+" ?", b.At)
	}
}

// globToLike turns a glob into a LIKE pattern with \ as the escape.
func globToLike(glob string) string {
	var b strings.Builder
	for _, r := range glob {
		switch r {
		case '*':
			b.WriteByte('%')
		case '?':
			b.WriteByte('_')
		case '%', '_', '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Position is a place in dead-letter order: when a row was dead-lettered,
// and its id.
type Position struct {
	At time.Time
	ID int64
}

// ListArgs select a page of dead letters, newest first.
type ListArgs struct {
	// Statuses are dead_lettered, discarded, or both.
	Statuses []string
	Filter   LetterFilter
	// Before, if set, continues after a previous page's last row.
	Before *Position
	Limit  int
}

// ListDeadLetters returns a page of rows. Statement: list_dead_letters.
func (q *Queries) ListDeadLetters(ctx context.Context, db DB, a ListArgs) ([]Letter, error) {
	var w where
	w.add("status = ANY(?)", a.Statuses)
	if a.Before != nil {
		w.add("(dead_lettered_at, id) < (?, ?)", a.Before.At, a.Before.ID)
	}
	w.letters(a.Filter)
	sql, args, err := q.dynamic("list_dead_letters", &w, a.Limit, "")
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Letter, error) { return scanLetter(r) })
}

// ParkedLetter is a dead letter that parks its key, and how many pending
// rows of the key wait behind it.
type ParkedLetter struct {
	Letter
	Waiting int
}

// ParkedKeys lists the rows that park keys, the longest parked first.
// Statement: parked_keys.
func (q *Queries) ParkedKeys(ctx context.Context, db DB, limit int) ([]ParkedLetter, error) {
	rows, err := db.Query(ctx, q.parkedKeys, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedLetter, error) {
		var p ParkedLetter
		var err error
		p.Letter, err = scanLetter(r, &p.Waiting)
		return p, err
	})
}

// LetterCount counts dead letters of one status, topic, destination and
// reason.
type LetterCount struct {
	Status, Topic, Destination, Reason string
	N                                  int
	Oldest, Newest                     *time.Time
	// OldestAge is the age of Oldest by the database clock.
	OldestAge time.Duration
}

// CountDeadLetters counts dead-lettered and discarded rows by status,
// topic, destination and reason. Statement: dead_letter_counts.
func (q *Queries) CountDeadLetters(ctx context.Context, db DB) ([]LetterCount, error) {
	rows, err := db.Query(ctx, q.counts)
	if err != nil {
		return nil, err
	}
	var out []LetterCount
	var c LetterCount
	var ageUS int64
	_, err = pgx.ForEachRow(rows, []any{&c.Status, &c.Topic, &c.Destination, &c.Reason, &c.N, &c.Oldest, &c.Newest, &ageUS}, func() error {
		c.OldestAge = time.Duration(max(ageUS, 0)) * time.Microsecond
		out = append(out, c)
		return nil
	})
	return out, err
}

// FailureGroup is the dead letters of one destination and reason whose
// errors have one fingerprint.
type FailureGroup struct {
	ID, Destination, Reason, Fingerprint string
	N                                    int
	First, Last                          time.Time
	// Example is the error of the group's latest row.
	Example string
}

// GroupArgs select failure groups: of the dead letters Filter matches,
// the Limit largest.
type GroupArgs struct {
	Filter LetterFilter
	Limit  int
}

// GroupRows gives the dead letters without a failure group theirs, and
// returns how many it changed. Statement: group_rows.
func (q *Queries) GroupRows(ctx context.Context, db DB) (int64, error) {
	tag, err := db.Exec(ctx, q.groupRows)
	return tag.RowsAffected(), err
}

// FailureGroups returns the largest failure groups, and how many groups
// there are in all. Statement: failure_groups.
func (q *Queries) FailureGroups(ctx context.Context, db DB, a GroupArgs) ([]FailureGroup, int, error) {
	var w where
	w.letters(a.Filter)
	sql, args, err := q.dynamic("failure_groups", &w, a.Limit, "")
	if err != nil {
		return nil, 0, err
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, 0, err
	}
	var out []FailureGroup
	var g FailureGroup
	total := 0
	_, err = pgx.ForEachRow(rows, []any{&g.ID, &g.Destination, &g.Reason, &g.Fingerprint, &g.N, &g.First, &g.Last, &total, &g.Example}, func() error {
		out = append(out, g)
		return nil
	})
	return out, total, err
}

// CountParkedKeys counts the keys held back. Statement: parked_key_count.
func (q *Queries) CountParkedKeys(ctx context.Context, db DB) (int, error) {
	var n int
	err := db.QueryRow(ctx, q.parkedCount).Scan(&n)
	return n, err
}

// Target is a row an action applies to.
type Target struct {
	ID     int64
	Key    *string
	Parked bool
	// At is when it was dead-lettered (now for rows that were not).
	At time.Time
}

// LockedRef is a row named by reference, locked.
type LockedRef struct {
	Target
	EventID uuid.UUID
	Status  string
}

// LockRefs locks the rows with the ids or event ids, in id order.
// Statement: lock_refs.
func (q *Queries) LockRefs(ctx context.Context, tx pgx.Tx, ids []int64, events []uuid.UUID) ([]LockedRef, error) {
	rows, err := tx.Query(ctx, q.lockRefs, ids, events)
	if err != nil {
		return nil, err
	}
	var out []LockedRef
	var r LockedRef
	_, err = pgx.ForEachRow(rows, []any{&r.ID, &r.EventID, &r.Status, &r.Key, &r.Parked, &r.At}, func() error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// AuditedRows returns which of ids an operator acted on before.
// Statement: audited_rows.
func (q *Queries) AuditedRows(ctx context.Context, db DB, ids []int64) ([]int64, error) {
	rows, err := db.Query(ctx, q.auditedRows, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// LockArgs select the next batch of dead letters for a bulk action.
type LockArgs struct {
	Filter LetterFilter
	// Cutoff: only rows dead-lettered by then.
	Cutoff time.Time
	// After, if set, is the previous batch's last row.
	After *Position
	Limit int
	// Lock takes row locks; a dry run only looks.
	Lock bool
}

// LockDeadLetters selects a batch of dead letters in the order of the
// dead-letter index. Statement: lock_dead_letters.
func (q *Queries) LockDeadLetters(ctx context.Context, tx pgx.Tx, a LockArgs) ([]Target, error) {
	var w where
	w.add("status = ?", StatusDeadLettered)
	w.add("dead_lettered_at <= ?", a.Cutoff)
	w.letters(a.Filter)
	if a.After != nil {
		w.add("(dead_lettered_at, id) > (?, ?)", a.After.At, a.After.ID)
	}
	lock := ""
	if a.Lock {
		lock = " FOR UPDATE"
	}
	sql, args, err := q.dynamic("lock_dead_letters", &w, a.Limit, lock)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	var out []Target
	var t Target
	_, err = pgx.ForEachRow(rows, []any{&t.ID, &t.Key, &t.Parked, &t.At}, func() error {
		out = append(out, t)
		return nil
	})
	return out, err
}

// Replay makes the dead letters among ids pending again, ready at at
// (now if nil). Statement: replay.
func (q *Queries) Replay(ctx context.Context, tx pgx.Tx, ids []int64, at *time.Time) error {
	_, err := tx.Exec(ctx, q.replay, ids, at)
	return err
}

// Reroute gives the dead letters among ids topic and makes them pending,
// ready at at (now if nil), and returns the topics they had. Statement:
// reroute.
func (q *Queries) Reroute(ctx context.Context, tx pgx.Tx, ids []int64, topic string, at *time.Time) ([]string, error) {
	rows, err := tx.Query(ctx, q.reroute, ids, at, topic)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Discard gives up on the dead letters among ids. Statement: discard.
func (q *Queries) Discard(ctx context.Context, tx pgx.Tx, ids []int64) error {
	_, err := tx.Exec(ctx, q.discard, ids)
	return err
}

// EditRow is a row locked for an edit: its editable fields as they were.
type EditRow struct {
	ID      int64
	Status  string
	Topic   string
	Headers json.RawMessage
	Payload []byte
	Key     *string
	Parked  bool
}

// LockForEdit locks the row r names. pgx.ErrNoRows if there is none.
// Statement: lock_for_edit.
func (q *Queries) LockForEdit(ctx context.Context, tx pgx.Tx, r Ref) (EditRow, error) {
	var e EditRow
	id, ev := r.args()
	err := tx.QueryRow(ctx, q.lockForEdit, id, ev).Scan(&e.ID, &e.Status, &e.Topic, &e.Headers, &e.Payload, &e.Key, &e.Parked)
	return e, err
}

// EditArgs replace fields of a row and make it pending again; nil fields
// keep their value.
type EditArgs struct {
	ID      int64
	Topic   *string
	Headers *string // a JSON object
	Payload []byte
	At      *time.Time // ready at; now if nil
}

// Edit applies a. Statement: edit.
func (q *Queries) Edit(ctx context.Context, tx pgx.Tx, a EditArgs) error {
	_, err := tx.Exec(ctx, q.edit, a.ID, a.At, a.Topic, a.Headers, a.Payload)
	return err
}

// ReleaseKey stops the rows that park key from parking it, discarding
// them if asked, and returns their ids. Statement: release_key.
func (q *Queries) ReleaseKey(ctx context.Context, tx pgx.Tx, key string, discard bool) ([]int64, error) {
	status := StatusDeadLettered
	if discard {
		status = StatusDiscarded
	}
	rows, err := tx.Query(ctx, q.releaseKey, key, status)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// Unpark makes the rows held back behind the keys' parked rows ready at
// once, after waiting for claims that hold them. Statements:
// lock_behind_keys, unpark.
func (q *Queries) Unpark(ctx context.Context, tx pgx.Tx, keys []string) error {
	if _, err := tx.Exec(ctx, q.lockBehindKeys, keys); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, q.unpark, keys)
	return err
}

// AuditEntry is one operator action to record.
type AuditEntry struct {
	Actor, Source, Action string
	// Credential names the API token the action came with; empty from
	// the command line.
	Credential string
	// Role is the role the actor held; empty from the command line.
	Role   string
	Reason *string
	RowIDs []int64
	// Details are stored as JSON.
	Details any
}

// InsertAudit records e. Statement: insert_audit.
func (q *Queries) InsertAudit(ctx context.Context, tx pgx.Tx, e AuditEntry) error {
	var cred, role *string
	if e.Credential != "" {
		cred = &e.Credential
	}
	if e.Role != "" {
		role = &e.Role
	}
	_, err := tx.Exec(ctx, q.insertAudit, e.Actor, e.Source, e.Action, e.Reason, e.RowIDs, e.Details, cred, role)
	return err
}

// AuditRecord is one recorded operator action.
type AuditRecord struct {
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Source string    `json:"source"`
	// Credential is the name of the API token the action came with.
	Credential string          `json:"credential,omitempty"`
	Action     string          `json:"action"`
	Reason     string          `json:"reason,omitempty"`
	RowIDs     []int64         `json:"row_ids"`
	Details    json.RawMessage `json:"details"`
	Role       string          `json:"role,omitempty"`
}

// AuditArgs select audit records, newest first; zero fields match all.
type AuditArgs struct {
	Action, Actor string
	// Row selects records that touched the row.
	Row          int64
	Since, Until Bound
	// BeforeID continues after a previous page's last record.
	BeforeID int64
	Limit    int
}

// ListAudit returns audit records. Statement: list_audit.
func (q *Queries) ListAudit(ctx context.Context, db DB, a AuditArgs) ([]AuditRecord, error) {
	var w where
	if a.BeforeID > 0 {
		w.add("id < ?", a.BeforeID)
	}
	if a.Action != "" {
		w.add("action = ?", a.Action)
	}
	if a.Actor != "" {
		w.add("actor = ?", a.Actor)
	}
	if a.Row > 0 {
		w.add("? = ANY(row_ids)", a.Row)
	}
	w.bound("at", ">=", a.Since)
	w.bound("at", "<", a.Until)
	sql, args, err := q.dynamic("list_audit", &w, a.Limit, "")
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditRecord, error) {
		var a AuditRecord
		var details []byte
		err := r.Scan(&a.ID, &a.At, &a.Actor, &a.Source, &a.Credential, &a.Action, &a.Reason, &a.RowIDs, &details, &a.Role)
		a.Details = details
		return a, err
	})
}
