// Package deadletter finds, explains, fixes, replays and discards the
// outbox rows that could not be delivered, and records every operator
// action in an audit table.
//
// Dead letters stay in the outbox table with status dead_lettered (or
// discarded, once an operator has given up on them) until retention
// deletes them. Replaying a row makes it pending again, as if it were new
// apart from its error history, so the relay delivers it like any other.
package deadletter

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// Limits.
const (
	// DefaultListLimit is the page size of List and Audit.
	DefaultListLimit = 50
	// MaxListLimit is the largest page.
	MaxListLimit = 1000
	// DefaultBatchSize is how many rows a bulk action changes per
	// transaction.
	DefaultBatchSize = 500
	// MaxBatchSize is the largest batch a bulk action may use.
	MaxBatchSize = 10000
)

// Sentinel errors.
var (
	// ErrNotFound: no row has the id or event id.
	ErrNotFound = errors.New("not found")
	// ErrNotDeadLettered: the row is not dead-lettered, so it cannot be
	// edited.
	ErrNotDeadLettered = errors.New("not dead-lettered")
	// ErrNotParked: no dead letter parks the key.
	ErrNotParked = errors.New("key is not parked")
	// ErrChanged: an edit was made from a version of the row that is no
	// longer its content.
	ErrChanged = errors.New("changed since it was read")
)

// Config configures a Store.
type Config struct {
	// Schema holds the outbox table. Default "public".
	Schema string
	// AuditPayloads is what an edit's audit record keeps of the payload
	// before and after: AuditPayloadsFull (the default) or
	// AuditPayloadsDigest.
	AuditPayloads string
	// SentRetention is how long the relay keeps delivered rows (0: it
	// deletes them at once), for Find to say what an id that matches no
	// row means.
	SentRetention time.Duration
	// OrderScope names a topic's order scope (relay/store.EveryScope for a
	// topic without a route), for Find to tell which earlier row of a key
	// holds a row back; nil keeps a key's order across every topic.
	OrderScope func(topic string) string
	// MaxPayload, if positive, is the largest payload an edit may give a
	// row (the relay's payload cap).
	MaxPayload int
	// CheckTopic, if set, vets a topic an edit or a reroute gives rows
	// (that a route takes it), for every front end alike.
	CheckTopic func(topic string) error
}

// What the audit trail keeps of edited payloads.
const (
	// AuditPayloadsFull keeps the payloads, so an edit can be undone by
	// hand.
	AuditPayloadsFull = "full"
	// AuditPayloadsDigest keeps only their SHA-256 and length: enough to
	// tell which version was delivered, without a copy of personal data
	// that outlives the row.
	AuditPayloadsDigest = "digest"
)

// ValidateAuditPayloads reports whether v is an AuditPayloads value.
func ValidateAuditPayloads(v string) error {
	if v != AuditPayloadsFull && v != AuditPayloadsDigest {
		return fmt.Errorf("audit_payloads is %q; use full or digest", v)
	}
	return nil
}

// Store queries and changes dead letters in one schema.
type Store struct {
	pool          *pgxpool.Pool
	q             *outboxdb.Queries
	digest        bool
	sentRetention time.Duration
	orderScope    func(topic string) string
	maxPayload    int
	checkTopic    func(topic string) error
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if cfg.AuditPayloads == "" {
		cfg.AuditPayloads = AuditPayloadsFull
	}
	if err := ValidateAuditPayloads(cfg.AuditPayloads); err != nil {
		return nil, fmt.Errorf("dead-letter store: %w", err)
	}
	q, err := outboxdb.New(cfg.Schema, outboxdb.Options{})
	if err != nil {
		return nil, fmt.Errorf("dead-letter store: %w", err)
	}
	return &Store{pool: pool, q: q, digest: cfg.AuditPayloads == AuditPayloadsDigest, sentRetention: cfg.SentRetention,
		orderScope: cfg.OrderScope, maxPayload: cfg.MaxPayload, checkTopic: cfg.CheckTopic}, nil
}

// Letter is a dead letter, or any outbox row when looked up by Get.
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

// Detail is a row with its payload and error history, for Get.
type Detail struct {
	Letter
	Payload      []byte         `json:"-"`
	ErrorHistory []HistoryEntry `json:"error_history"`
	// Version names the row's topic, headers and payload as read: an edit
	// made from what was read carries it, and changes nothing if another
	// edit came first (EditParams.Version).
	Version string `json:"version"`
	// PayloadHidden says the payload is left out: the role of whoever
	// asked does not show payloads.
	PayloadHidden bool `json:"payload_hidden,omitempty"`
}

// contentVersion is the Version of a row with this topic, headers and
// payload: a digest of the three, each preceded by its length.
func contentVersion(topic string, headers, payload []byte) string {
	h := sha256.New()
	for _, b := range [][]byte{[]byte(topic), headers, payload} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)[:versionBytes])
}

const versionBytes = 12

// isVersion reports whether v has the form of a Version.
func isVersion(v string) bool {
	b, err := hex.DecodeString(v)
	return err == nil && len(b) == versionBytes && v == strings.ToLower(v)
}

// HistoryEntry is one recorded failure.
type HistoryEntry struct {
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt"`
	Class   string    `json:"class"`
	Error   string    `json:"error"`
}

// Payload encodings in JSON output.
const (
	EncodingJSON   = "json"
	EncodingText   = "text"
	EncodingBase64 = "base64"
)

// PayloadEncoding says how a payload is best shown: as JSON when it
// parses as JSON and is valid UTF-8, as text when it is valid UTF-8
// without control characters other than white space, else as base64.
// JSON with invalid UTF-8 in its strings would not survive being
// embedded: decoders replace the bad bytes.
func PayloadEncoding(b []byte) string {
	switch {
	case len(b) > 0 && utf8.Valid(b) && json.Valid(b):
		return EncodingJSON
	case utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool {
		return r < 0x20 && r != '\n' && r != '\r' && r != '\t' || r == 0x7f
	}):
		return EncodingText
	}
	return EncodingBase64
}

// MarshalJSON adds the payload, as a JSON value when it is JSON, a string
// when it is text, else base64, with payload_encoding saying which.
func (d Detail) MarshalJSON() ([]byte, error) {
	type plain Detail // without this method
	if d.PayloadHidden {
		return json.Marshal(struct {
			plain
			Payload any `json:"payload"`
		}{plain(d), nil})
	}
	enc := PayloadEncoding(d.Payload)
	var payload any
	switch enc {
	case EncodingJSON:
		payload = json.RawMessage(d.Payload)
	case EncodingText:
		payload = string(d.Payload)
	default:
		payload = base64.StdEncoding.EncodeToString(d.Payload)
	}
	return json.Marshal(struct {
		plain
		PayloadEncoding string `json:"payload_encoding"`
		Payload         any    `json:"payload"`
	}{plain(d), enc, payload})
}

// Ref names a row by id or event id.
type Ref struct {
	ID      int64
	EventID uuid.UUID
}

// ParseRef reads a row id (a positive integer) or an event id (a UUID).
func ParseRef(s string) (Ref, error) {
	s = strings.TrimSpace(s)
	if id, err := strconv.ParseInt(s, 10, 64); err == nil && id > 0 {
		return Ref{ID: id}, nil
	}
	if u, err := uuid.Parse(s); err == nil {
		return Ref{EventID: u}, nil
	}
	return Ref{}, &InputError{Problems: []string{fmt.Sprintf("%q is neither a row id (a positive integer) nor an event id (a UUID)", s)}}
}

func (r Ref) row() outboxdb.Ref { return outboxdb.Ref{ID: r.ID, EventID: r.EventID} }

// MarshalText writes the id or event id.
func (r Ref) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func (r Ref) String() string {
	if r.ID > 0 {
		return strconv.FormatInt(r.ID, 10)
	}
	return r.EventID.String()
}

// ParseRefs reads several references, reporting every bad one.
func ParseRefs(ss []string) ([]Ref, error) {
	var refs []Ref
	var p []string
	for _, s := range ss {
		r, err := ParseRef(s)
		if err != nil {
			p = append(p, err.Error())
			continue
		}
		refs = append(refs, r)
	}
	if len(p) > 0 {
		return nil, &InputError{Problems: p}
	}
	return refs, nil
}

// NotFoundError lists references that match no row.
type NotFoundError struct{ Refs []Ref }

func (e *NotFoundError) Error() string {
	s := make([]string, len(e.Refs))
	for i, r := range e.Refs {
		s[i] = r.String()
	}
	return "no outbox row has id or event id " + strings.Join(s, ", ")
}

func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// Get returns the row ref names, whatever its status, with its payload and
// error history.
func (s *Store) Get(ctx context.Context, ref Ref) (*Detail, error) {
	var d Detail
	l, payload, history, err := s.q.GetRow(ctx, s.pool, ref.row())
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &NotFoundError{Refs: []Ref{ref}}
	}
	if err != nil {
		return nil, fmt.Errorf("get outbox row %s: %w", ref, err)
	}
	d.Letter, d.Payload = Letter(l), payload
	d.Version = contentVersion(l.Topic, l.Headers, payload)
	if err := json.Unmarshal(history, &d.ErrorHistory); err != nil {
		return nil, fmt.Errorf("get outbox row %s: error history: %w", ref, err)
	}
	return &d, nil
}

// ListParams selects a page of dead letters, newest first.
type ListParams struct {
	Filter Filter
	// Status is dead_lettered (the default), discarded, or all.
	Status string
	// Limit is the page size. Default 50, at most 1000.
	Limit int
	// Cursor continues from a previous page's Next.
	Cursor string
}

// Page is one page of dead letters. Pages are keyed on when rows were
// dead-lettered: a walk through every page sees each row present at its
// start exactly once, while rows dead-lettered meanwhile appear only on a
// new walk.
type Page struct {
	Letters []Letter `json:"dead_letters"`
	// Next is the cursor of the next page; empty on the last.
	Next string `json:"next_cursor,omitempty"`
}

// List returns a page of dead letters matching p, newest first.
func (s *Store) List(ctx context.Context, p ListParams) (*Page, error) {
	var statuses []string
	switch p.Status {
	case "", StatusDeadLettered:
		statuses = []string{StatusDeadLettered}
	case StatusDiscarded:
		statuses = []string{StatusDiscarded}
	case "all":
		statuses = []string{StatusDeadLettered, StatusDiscarded}
	default:
		return nil, &InputError{Problems: []string{fmt.Sprintf("status %q: use dead_lettered, discarded or all", p.Status)}}
	}
	if err := p.Filter.Validate(); err != nil {
		return nil, err
	}
	limit, err := pageLimit(p.Limit)
	if err != nil {
		return nil, err
	}
	args := outboxdb.ListArgs{Statuses: statuses, Limit: limit + 1}
	var anchor time.Time
	if p.Cursor != "" {
		at, id, a, err := parseCursor(p.Cursor)
		if err != nil {
			return nil, err
		}
		args.Before = &outboxdb.Position{At: at, ID: id}
		anchor = a
	}
	if p.Filter.Since.Ago > 0 || p.Filter.Until.Ago > 0 {
		// Times before now count from the first page's now, carried in
		// the cursor, so the window does not slide during a walk.
		if anchor.IsZero() {
			if err := s.pool.QueryRow(ctx, outboxdb.Now).Scan(&anchor); err != nil {
				return nil, fmt.Errorf("list dead letters: %w", err)
			}
		}
		p.Filter.Since, p.Filter.Until = p.Filter.Since.at(anchor), p.Filter.Until.at(anchor)
	}
	args.Filter = p.Filter.rows()
	if p.Filter.Group != "" {
		if err := s.groupRows(ctx); err != nil {
			return nil, err
		}
	}
	letters, err := s.q.ListDeadLetters(ctx, s.pool, args)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	page := &Page{Letters: make([]Letter, len(letters))}
	for i, l := range letters {
		page.Letters[i] = Letter(l)
	}
	if len(letters) > limit {
		page.Letters = page.Letters[:limit]
		last := page.Letters[limit-1]
		page.Next = cursor(*last.DeadLetteredAt, last.ID, anchor)
	}
	return page, nil
}

func pageLimit(n int) (int, error) {
	switch {
	case n == 0:
		return DefaultListLimit, nil
	case n < 0 || n > MaxListLimit:
		return 0, &InputError{Problems: []string{fmt.Sprintf("limit %d: use 1 to %d", n, MaxListLimit)}}
	}
	return n, nil
}

// A cursor is the last row's dead-letter time in microseconds and its id,
// and when relative times were resolved, the moment they count from.
func cursor(at time.Time, id int64, anchor time.Time) string {
	c := strconv.FormatInt(at.UnixMicro(), 10) + "-" + strconv.FormatInt(id, 10)
	if !anchor.IsZero() {
		c += "-" + strconv.FormatInt(anchor.UnixMicro(), 10)
	}
	return c
}

func parseCursor(c string) (at time.Time, id int64, anchor time.Time, err error) {
	bad := &InputError{Problems: []string{fmt.Sprintf("cursor %q is not one this command returned", c)}}
	parts := strings.Split(c, "-")
	if len(parts) < 2 || len(parts) > 3 {
		return at, 0, anchor, bad
	}
	us, err1 := strconv.ParseInt(parts[0], 10, 64)
	id, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil || id < 1 {
		return at, 0, anchor, bad
	}
	if len(parts) == 3 {
		a, err := strconv.ParseInt(parts[2], 10, 64)
		if err != nil || a < 1 {
			return at, 0, anchor, bad
		}
		anchor = time.UnixMicro(a)
	}
	return time.UnixMicro(us), id, anchor, nil
}

// ParkedKey is a key held back by a dead letter (on_dead_letter: block).
type ParkedKey struct {
	Key string `json:"key"`
	// Row is the dead letter that parks the key.
	Row Letter `json:"row"`
	// Waiting counts the key's pending rows behind it.
	Waiting int `json:"waiting"`
}

// Keys lists parked keys, the longest parked first, at most limit
// (default and most 1000).
func (s *Store) Keys(ctx context.Context, limit int) ([]ParkedKey, error) {
	if limit <= 0 || limit > MaxListLimit {
		limit = MaxListLimit
	}
	parked, err := s.q.ParkedKeys(ctx, s.pool, limit)
	if err != nil {
		return nil, fmt.Errorf("list parked keys: %w", err)
	}
	keys := make([]ParkedKey, len(parked))
	for i, p := range parked {
		keys[i] = ParkedKey{Row: Letter(p.Letter), Waiting: p.Waiting}
		if p.Key != nil {
			keys[i].Key = *p.Key
		}
	}
	if keys == nil {
		keys = []ParkedKey{}
	}
	return keys, nil
}

// Stats summarises the dead letters.
type Stats struct {
	// DeadLettered and Discarded count rows by status; ParkedKeys counts
	// keys held back.
	DeadLettered int `json:"dead_lettered"`
	Discarded    int `json:"discarded"`
	ParkedKeys   int `json:"parked_keys"`
	// Oldest and Newest are when the oldest and newest dead-lettered row
	// were dead-lettered (discarded rows left out).
	Oldest *time.Time `json:"oldest,omitempty"`
	Newest *time.Time `json:"newest,omitempty"`
	// OldestAge is how long ago Oldest was, by the database clock.
	OldestAge time.Duration `json:"-"`
	// ByTopic, ByDestination and ByReason count dead-lettered rows.
	// Rows that never reached a destination count under "".
	ByTopic       map[string]int `json:"by_topic"`
	ByDestination map[string]int `json:"by_destination"`
	ByReason      map[string]int `json:"by_reason"`
}

// Stats counts dead letters by topic, destination and reason.
func (s *Store) Stats(ctx context.Context) (*Stats, error) {
	counts, err := s.q.CountDeadLetters(ctx, s.pool)
	if err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	st := &Stats{ByTopic: map[string]int{}, ByDestination: map[string]int{}, ByReason: map[string]int{}}
	for _, c := range counts {
		if c.Status == StatusDiscarded {
			st.Discarded += c.N
			continue
		}
		st.DeadLettered += c.N
		st.ByTopic[c.Topic] += c.N
		st.ByDestination[c.Destination] += c.N
		st.ByReason[c.Reason] += c.N
		if c.Oldest != nil && (st.Oldest == nil || c.Oldest.Before(*st.Oldest)) {
			t := *c.Oldest
			st.Oldest = &t
			st.OldestAge = c.OldestAge
		}
		if c.Newest != nil && (st.Newest == nil || c.Newest.After(*st.Newest)) {
			t := *c.Newest
			st.Newest = &t
		}
	}
	// A key is parked by one row as a rule; count keys all the same.
	if st.ParkedKeys, err = s.q.CountParkedKeys(ctx, s.pool); err != nil {
		return nil, fmt.Errorf("count parked keys: %w", err)
	}
	return st, nil
}
