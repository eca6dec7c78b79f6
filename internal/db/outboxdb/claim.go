package outboxdb

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// ClaimBegin returns the statement that starts a claim's transaction, in
// the same round trip, with settings that keep its plans right whatever
// the statistics say. An outbox that keeps up is mostly dead rows, so an ANALYZE can leave the
// planner believing that no row is pending while thousands are.
//   - With sorts priced out, the key check's probe is served in (key, id)
//     order by the key index, not by scanning the pending rows once per
//     key, which a plan thinking them a handful would otherwise pick, at
//     seconds per claim; its read of a span, and the claim itself, stay
//     on an id index rather than reading the whole table.
//   - Without JIT, a plan with a high estimate (the key check's custom
//     plans, or any plan left with a sort priced out at 10^10) is not
//     compiled, at 300-400 ms, for a statement that runs in a few
//     milliseconds. The key check returns its rows unsorted so that it
//     has no such sort.
//   - With generic plans forced, each connection plans a statement once.
//     Left to choose, the server plans the first five calls of each
//     prepared statement on each connection anew, at 1-3 ms apiece for
//     the claim and its key check: a fifth of the database's CPU while a
//     freshly started relay drains a backlog. The plans the claim's
//     statements need are generic ones (the plan tests check them so).
//
// Each statement takes its own snapshot (read committed, whatever the
// role's default): the strict order watermark depends on it.
//
// The claim's commit does not wait for the WAL flush (it only records
// progress: a commit lost in a crash makes its rows pending again), and,
// when idle is positive, the server ends the transaction after idle
// without a statement from the relay. Both are set for the transaction
// only, not as session settings, so that they work through PgBouncer in
// transaction mode (which refuses such startup parameters) and never
// reach another client's session there.
func ClaimBegin(idle time.Duration) string {
	var ms int64
	if idle > 0 {
		ms = max(idle.Milliseconds(), 1)
	}
	b, err := render("claim_begin", struct{ IdleMS int64 }{ms})
	if err != nil {
		panic(err) // a broken template, which every test sees
	}
	return b
}

// ClaimArgs bound a claim.
type ClaimArgs struct {
	Limit         int
	PayloadCap    int      // larger payloads are not loaded
	ExcludeKeys   []string // not claimed
	ExcludeTopics []string // not claimed
	MinID         int64    // rows that never waited are claimed above it
	MaxID         int64    // the highest id claimed
	// PartLo and PartHi are the partitions claimed, inclusive.
	PartLo, PartHi int
	// Waited claims the rows that waited and are due, wherever they lie,
	// before the rows above MinID: at most WaitedLimit of them (Limit
	// when zero), the rest of Limit left to the rows above MinID.
	Waited      bool
	WaitedLimit int
}

// ClaimedRow is a locked pending row.
type ClaimedRow struct {
	ID      int64
	EventID [16]byte
	Topic   string
	Key     string
	HasKey  bool
	// Payload is nil when above the claim's cap.
	Payload     []byte
	PayloadSize int
	// Headers are decoded; HeadersProblem says why they could not be.
	Headers        map[string]string
	HeadersProblem string
	CreatedAt      time.Time
	RetryCount     int
	// LastDelay is the delay chosen after the previous failure, if any.
	LastDelay time.Duration
	// Waited says the row came from the rows that waited; it may come
	// back a second time from the rows above MinID.
	Waited bool
}

// ClaimResult is what a claim statement returns besides its rows.
type ClaimResult struct {
	// Now is the database clock.
	Now time.Time
}

// Claim locks up to a.Limit ready rows, skipping locked ones: due rows
// that waited first, then rows above a.MinID in id order. It passes each
// to each, in that order; the row is reused for the next. Statement:
// claim.
func (q *Queries) Claim(ctx context.Context, tx pgx.Tx, a ClaimArgs, each func(*ClaimedRow)) (ClaimResult, error) {
	var res ClaimResult
	exclude, excludeTopics := a.ExcludeKeys, a.ExcludeTopics
	if exclude == nil {
		exclude = []string{}
	}
	if excludeTopics == nil {
		excludeTopics = []string{}
	}
	rows, err := tx.Query(ctx, q.claim, a.Limit, a.PayloadCap, exclude, excludeTopics, a.MaxID, a.MinID,
		a.PartLo, a.PartHi, a.Waited, cmp.Or(a.WaitedLimit, a.Limit))
	if err != nil {
		return res, err
	}
	var (
		r       ClaimedRow
		topic   internedText
		key     pgtype.Text
		payload payloadSlab
		headers headersText
		lastUS  pgtype.Int8
		eventID pgtype.UUID // binary; uuid.UUID would go through its text form
	)
	for rows.Next() {
		if err := rows.Scan(&r.ID, &eventID, &topic, &key, &payload, &r.PayloadSize,
			&headers, &r.CreatedAt, &r.RetryCount, &lastUS, &res.Now, &r.Waited); err != nil {
			rows.Close()
			return res, fmt.Errorf("scan: %w", err)
		}
		r.EventID = eventID.Bytes
		r.Topic = topic.last
		r.Key, r.HasKey = key.String, key.Valid
		r.Payload = payload.last
		r.LastDelay = 0
		if lastUS.Valid {
			r.LastDelay = time.Duration(lastUS.Int64) * time.Microsecond
		}
		r.Headers, r.HeadersProblem = headers.decoded, headers.problem
		each(&r)
	}
	return res, rows.Err()
}

// MinPending returns the lowest pending id, 0 when none is. It reads the
// pending rows' index from its start. Statement: min_pending.
func (q *Queries) MinPending(ctx context.Context, db DB) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, q.minPending).Scan(&id)
	return id, err
}

// Stranded returns the lowest pending row at or below floor, in
// partitions lo to hi, that never waited; 0 when there is none. It reads
// every index entry below floor. Statement: stranded.
func (q *Queries) Stranded(ctx context.Context, db DB, floor int64, lo, hi int) (int64, error) {
	var id pgtype.Int8
	err := db.QueryRow(ctx, q.stranded, floor, lo, hi).Scan(&id)
	return id.Int64, err
}

// HoldersArgs name a claim's keyed rows, for the key check.
type HoldersArgs struct {
	// Keys and IDs are the claimed keyed rows, in id order, after any
	// rows the claim follows: the last id ends the claim's span.
	Keys []string
	IDs  []int64
	// Floor is where pending rows can hold a key from: below it, only
	// rows that wait can (and parked dead letters).
	Floor int64
	// PartLo and PartHi are the claim's partitions, inclusive: the span
	// leaves other processes' rows out.
	PartLo, PartHi int
	// BySpan reads the claim's id span rather than probing each key.
	BySpan bool
	// Scoped returns, for each key, the lowest holder of each topic
	// rather than only the key's lowest, for an order scope narrower
	// than the key.
	Scoped bool
}

// Holder is a row outside a claim that holds one of its keys.
type Holder struct {
	Key string
	ID  int64
	// Parked: a dead letter that parks the key.
	Parked bool
	// NextAttemptAt is when it is due; Waiting that it is not due yet.
	NextAttemptAt time.Time
	Waiting       bool
	Topic         string
	Leased        bool
}

// Holders returns the rows outside the claim, unsorted, that hold its
// keys: pending rows from Floor up, rows that wait below it, and parked
// dead letters, below each key's last claimed row. Statements:
// holding_by_span, holding_by_key, and for an order scope holding_in_span,
// holding_in_range.
func (q *Queries) Holders(ctx context.Context, tx pgx.Tx, a HoldersArgs) ([]Holder, error) {
	var rows pgx.Rows
	var err error
	bySpan, byKey := q.holdingBySpan, q.holdingByKey
	if a.Scoped {
		bySpan, byKey = q.holdingInSpan, q.holdingInRange
	}
	last := a.IDs[len(a.IDs)-1]
	switch {
	case a.BySpan:
		rows, err = tx.Query(ctx, bySpan, a.Keys, a.IDs, a.Floor, last, a.PartLo, a.PartHi)
	case a.Scoped:
		rows, err = tx.Query(ctx, byKey, a.Keys, a.IDs, a.Floor, last)
	default:
		rows, err = tx.Query(ctx, byKey, a.Keys, a.IDs, a.Floor)
	}
	if err != nil {
		return nil, err
	}
	var out []Holder
	var h Holder
	_, err = pgx.ForEachRow(rows, []any{&h.Key, &h.ID, &h.Parked, &h.NextAttemptAt, &h.Waiting, &h.Topic, &h.Leased}, func() error {
		out = append(out, h)
		return nil
	})
	return out, err
}

// Defer makes rows wait until at, without counting an attempt.
// Statement: defer.
func (q *Queries) Defer(ctx context.Context, db DB, ids []int64, at []time.Time) error {
	_, err := db.Exec(ctx, q.deferRows, ids, at)
	return err
}

// QueueDefer adds Defer to a batch.
func (q *Queries) QueueDefer(b *pgx.Batch, ids []int64, at []time.Time) {
	b.Queue(q.deferRows, ids, at)
}

// DeferParked makes rows wait behind the dead letters that park their
// keys (parkers, one per row) until at, or until the key is released.
// Statement: defer_parked.
func (q *Queries) DeferParked(ctx context.Context, db DB, ids []int64, at []time.Time, parkers []int64) error {
	_, err := db.Exec(ctx, q.deferParked, ids, at, parkers)
	return err
}

// StillLeased reports whether row id is still leased until until, waiting
// for a write-back under way. Statement: still_leased.
func (q *Queries) StillLeased(ctx context.Context, db DB, id int64, until time.Time) (bool, error) {
	var n int
	err := db.QueryRow(ctx, q.stillLeased, id, until).Scan(&n)
	return n > 0, err
}

// LeaseOver makes ready the rows deferred to the end of leases that are
// over (ids[i] waited until until[i]). Statement: lease_over.
func (q *Queries) LeaseOver(ctx context.Context, db DB, ids []int64, until []time.Time) error {
	_, err := db.Exec(ctx, q.leaseOver, ids, until)
	return err
}

// internedText scans a text column, reusing the previous row's string
// when the value repeats, as a claim's topics mostly do.
type internedText struct{ last string }

// ScanBytes implements pgtype.BytesScanner; v is valid only during the call.
func (t *internedText) ScanBytes(v []byte) error {
	if v == nil {
		return errors.New("unexpected NULL")
	}
	if string(v) != t.last { // compared without a copy
		t.last = string(v)
	}
	return nil
}

// payloadChunk is the size of the buffers a claim's payloads are copied
// into. A payload above a quarter of it gets a buffer of its own, so that
// at most that much of a buffer is left unused when the next one starts.
const payloadChunk = 64 << 10

// payloadSlab scans a bytea column into shared buffers, so a claim of a
// thousand small payloads makes a few allocations rather than a thousand.
// A buffer is never written again where a payload was handed out, and
// each payload's capacity ends with it, so appending to one cannot touch
// its neighbour.
type payloadSlab struct {
	buf  []byte
	last []byte // nil for NULL
}

// ScanBytes implements pgtype.BytesScanner; v is valid only during the call.
func (s *payloadSlab) ScanBytes(v []byte) error {
	switch {
	case v == nil:
		s.last = nil
		return nil
	case len(v) == 0:
		s.last = []byte{}
		return nil
	case len(v) > payloadChunk/4:
		s.last = append(make([]byte, 0, len(v)), v...)
		return nil
	}
	if cap(s.buf)-len(s.buf) < len(v) {
		s.buf = make([]byte, 0, payloadChunk)
	}
	start := len(s.buf)
	s.buf = append(s.buf, v...)
	s.last = s.buf[start:len(s.buf):len(s.buf)]
	return nil
}

// headersText scans the headers column, as text, and decodes it.
type headersText struct {
	decoded map[string]string
	problem string
}

// ScanBytes implements pgtype.BytesScanner; v is valid only during the call.
func (h *headersText) ScanBytes(v []byte) error {
	if v == nil {
		return errors.New("unexpected NULL")
	}
	h.decoded, h.problem = decodeHeaders(v)
	return nil
}

// decodeHeaders parses a headers column. Producers writing plain SQL can
// store any JSON object; a value that is not a string makes the row
// undeliverable, and problem says which. The common empty object costs
// nothing; text is not kept.
func decodeHeaders(text []byte) (map[string]string, string) {
	if string(text) == "{}" {
		return nil, ""
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(text, &raw); err != nil {
		return nil, fmt.Sprintf("headers are not a JSON object: %v", err)
	}
	h := make(map[string]string, len(raw))
	var bad []string
	for k, v := range raw {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			bad = append(bad, fmt.Sprintf("header %q is %s, not a string", k, jsonKind(v)))
			continue
		}
		h[k] = s
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return nil, strings.Join(bad, "; ")
	}
	return h, ""
}

func jsonKind(v json.RawMessage) string {
	if len(v) == 0 {
		return "empty"
	}
	switch v[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}
