package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/schema"
)

// Record is a claimed outbox row, ready to publish.
type Record struct {
	ID      int64
	EventID uuid.UUID
	Topic   string
	// Key is the ordering and Kafka message key; HasKey is false for a
	// null key.
	Key    string
	HasKey bool
	// Payload is nil when PayloadSize is above the claim's payload cap: an
	// oversized payload is never loaded.
	Payload     []byte
	PayloadSize int
	Headers     map[string]string
	CreatedAt   time.Time
	// RetryCount is the number of failed attempts so far.
	RetryCount int
	// LastDelay is the delay chosen after the previous failure, if any.
	LastDelay time.Duration
	// Undeliverable says why the row cannot be delivered as it is (empty
	// when it can); UndeliverableReason is its dead-letter reason.
	Undeliverable       string
	UndeliverableReason string
}

// Dead-letter reasons: the values the table's check constraint allows.
const (
	ReasonPermanent        = "permanent"
	ReasonRetriesExhausted = "retries_exhausted"
	ReasonMaxAgeExceeded   = "max_age_exceeded"
	ReasonTooLarge         = "too_large"
	ReasonNoRoute          = "no_route"
	ReasonInvalidMessage   = "invalid_message"
)

// ParkedRecheck is how long rows behind a parked key are deferred before
// they are looked at again. Releasing the key makes them ready at once.
const ParkedRecheck = 5 * time.Minute

// ParkedNote starts the last_error of a row deferred behind a parked key,
// followed by the parking row's id. Releasing the key finds the rows to
// make ready by it, and restores their own last error.
const ParkedNote = "waiting: key parked by dead-lettered row "

// DefaultErrorHistory is the number of recent failures kept per row.
const DefaultErrorHistory = 10

// MaxErrorLen bounds last_error and each error history entry, in bytes.
const MaxErrorLen = 2048

// StoreConfig configures a Store.
type StoreConfig struct {
	// Schema holds the outbox table. Default "public".
	Schema string
	// KeepSent marks delivered rows sent instead of deleting them, for
	// sent_retention > 0. Deleting is the default: half the WAL and no
	// bloat.
	KeepSent bool
	// ErrorHistory is the number of recent failures kept per row.
	// Default 10.
	ErrorHistory int
	// StrictOrder claims a row only once every transaction that could
	// still commit a smaller id has ended, so that rows of one key are
	// delivered in id order even when producers write a key from
	// concurrent transactions. A long write transaction anywhere in the
	// database cluster delays delivery until it ends. Needs migration 6.
	StrictOrder bool
}

// Store is the relay's access to the outbox table.
type Store struct {
	pool         *pgxpool.Pool
	keepSent     bool
	errorHistory int
	lockID       int64
	keyCheck     keyCheckForm // tests force a form; zero picks per claim
	table        string       // the outbox table, quoted
	tableName    string       // and as people write it
	strictOrder  bool
	strict       watermark
	sql          struct {
		claim, holdingBySpan, holdingByKey      string
		stillLeased, leaseOver                  string
		defer_, deferParked, sent               string
		fail, cleanup, expireDead               string
		lease, leasedSent, unlease, pullForward string
		leasedFail, backlog                     string
	}
}

// NewStore returns a Store on pool for cfg.
func NewStore(pool *pgxpool.Pool, cfg StoreConfig) (*Store, error) {
	if cfg.Schema == "" {
		cfg.Schema = schema.Default
	}
	if err := schema.Validate(cfg.Schema); err != nil {
		return nil, fmt.Errorf("outbox store: %w", err)
	}
	if cfg.ErrorHistory <= 0 {
		cfg.ErrorHistory = DefaultErrorHistory
	}
	t := pgx.Identifier{cfg.Schema, "outbox"}.Sanitize()
	s := &Store{pool: pool, keepSent: cfg.KeepSent, errorHistory: cfg.ErrorHistory, lockID: schema.LockID(cfg.Schema) + 1,
		table: t, tableName: cfg.Schema + ".outbox", strictOrder: cfg.StrictOrder}

	s.sql.backlog = `SELECT topic, count(*), (extract(epoch FROM now() - min(created_at)) * 1e6)::bigint
FROM ` + t + `
WHERE status = 'pending'
GROUP BY topic`

	// The plain form on the partial index keeps its plan after ANALYZE;
	// IN (SELECT ... LIMIT) and CTE forms flip to generic plans that scan
	// the whole table.
	s.sql.claim = `SELECT id, event_id, topic, key,
       CASE WHEN octet_length(payload) <= $2 THEN payload END,
       octet_length(payload), headers::text, created_at, retry_count,
       CASE WHEN last_attempt_at IS NOT NULL
            THEN (extract(epoch FROM next_attempt_at - last_attempt_at) * 1e6)::bigint END,
       now(),
       (SELECT min(id) FROM ` + t + ` WHERE status = 'pending')
FROM ` + t + `
WHERE status = 'pending' AND next_attempt_at <= now()
  AND (key IS NULL OR NOT key = ANY($3::text[]))
  AND NOT topic = ANY($4::text[])
  AND id <= $5
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED`

	// Rows outside a claim that hold its keys: pending rows from the
	// lowest pending id ($3) up, or parked dead letters, below the key's
	// last claimed row. Most claims have none, and only they come back:
	// the claimed rows are dropped here against a hash of the claim's ids.
	// Starting at the lowest pending id skips the index entries of
	// delivered rows, dead until vacuum. Two forms find the same blockers
	// (keepKeyOrder picks one). The span's may also return rows of a key
	// above its last claimed row, below the claim's last: they hold back
	// none of the key's claimed rows, all below them.
	//
	// holdingBySpan reads the claim's own id span once, on an id index
	// (the pending index, or the primary key if stale statistics say so,
	// bounded by the span either way), and keeps the rows whose key is
	// claimed. On the pending index that is one entry per row in the
	// span: the claim's rows and those it passed over (locked, waiting,
	// or of an excluded topic). The key set is a hashed NOT IN under a
	// NOT: as IN, the planner would make it a join, free to probe the
	// pending rows once per key. ORDER BY id, with sorts priced out (see
	// claimBegin), keeps the scan on an id index whatever the statistics.
	//
	// holdingByKey probes each key on the key index instead, for a claim
	// that passed over many rows, or holds few keys. Per key, in id
	// order, as many rows as the claim holds of the key: if a blocker
	// exists it is among them, and the last claimed row ends the scan.
	// The bounds are row comparisons on (key, id), and nothing else: the
	// probe wants (key, id) order, which only the key index gives without
	// a sort. With key = beside them the planner would drop the key from
	// that order, and the scan would start at the key's first entry. The
	// index stops early on a row comparison's first column only, so the
	// upper bound is inclusive: LIMIT, reached at the last claimed row,
	// ends the scan. The LATERAL probe keeps the work bounded for a
	// dominant key too, where a plain join flips to hashing the whole
	// pending index.
	//
	// The rows come back unsorted.
	keys := `(SELECT c.key, max(c.id) AS max_id, count(*) AS n
      FROM unnest($1::text[], $2::bigint[]) AS c(key, id) GROUP BY c.key) AS c`
	parked := `
UNION ALL
SELECT p.key, p.id, true, p.next_attempt_at, false, p.topic, false
FROM ` + keys + `
JOIN ` + t + ` AS p ON p.key = c.key AND p.id < c.max_id AND p.key_parked`
	s.sql.holdingBySpan = `(SELECT p.key, p.id, false, p.next_attempt_at, p.next_attempt_at > now(), p.topic, p.lease_token IS NOT NULL
FROM ` + t + ` AS p
WHERE p.status = 'pending' AND p.id >= $3 AND p.id < $4 AND p.key IS NOT NULL
  AND NOT p.key NOT IN (SELECT unnest($1::text[]))
  AND p.id NOT IN (SELECT unnest($2::bigint[]))
ORDER BY p.id)` + parked
	s.sql.holdingByKey = `SELECT c.key, h.id, false, h.next_attempt_at, h.next_attempt_at > now(), h.topic, h.lease_token IS NOT NULL
FROM ` + keys + `
CROSS JOIN LATERAL (
    SELECT p.id, p.next_attempt_at, p.topic, p.lease_token FROM ` + t + ` AS p
    WHERE p.status = 'pending' AND p.key IS NOT NULL
      AND (p.key, p.id) >= (c.key, $3) AND (p.key, p.id) <= (c.key, c.max_id)
    ORDER BY p.key, p.id LIMIT c.n) AS h
WHERE h.id NOT IN (SELECT unnest($2::bigint[]))` + parked

	// After a claim that deferred rows behind a leased row commits: is the
	// row still leased as the key check saw it? A write-back under way is
	// waited for (a short statement batch, never a publish), then seen as
	// it ends. One row per statement, so no lock is held while waiting for
	// another: write-backs lock their rows in an order of their own. A
	// lease already past its end is over without a look, so a claim that
	// took its row again is never waited for.
	s.sql.stillLeased = `SELECT count(*) FROM (
    SELECT 1 FROM ` + t + `
    WHERE id = $1 AND $2 > now()
      AND status = 'pending' AND lease_token IS NOT NULL AND next_attempt_at = $2
    FOR SHARE) AS o`
	// Rows deferred to the end of a lease that is over: ready now. Rows
	// whose deferral has passed are ready already, and may be locked by a
	// claim: they are left alone.
	s.sql.leaseOver = `UPDATE ` + t + ` AS o SET next_attempt_at = statement_timestamp()
FROM unnest($1::bigint[], $2::timestamptz[]) AS d(id, until)
WHERE o.id = d.id AND d.until > now() AND o.status = 'pending' AND o.next_attempt_at = d.until`

	s.sql.defer_ = `UPDATE ` + t + ` AS o SET next_attempt_at = d.at
FROM unnest($1::bigint[], $2::timestamptz[]) AS d(id, at)
WHERE o.id = d.id`
	s.sql.deferParked = `UPDATE ` + t + ` AS o SET next_attempt_at = d.at, last_error = d.note
FROM unnest($1::bigint[], $2::timestamptz[], $3::text[]) AS d(id, at, note)
WHERE o.id = d.id`

	if cfg.KeepSent {
		s.sql.sent = `UPDATE ` + t + ` SET status = 'sent', sent_at = statement_timestamp(),
       last_attempt_at = statement_timestamp(), lease_token = NULL
WHERE id = ANY($1)`
	} else {
		s.sql.sent = `DELETE FROM ` + t + ` WHERE id = ANY($1)`
	}

	s.sql.fail = `UPDATE ` + t + ` AS o SET
    status = f.status,
    retry_count = o.retry_count + f.inc,
    next_attempt_at = CASE WHEN f.status = 'pending'
                           THEN statement_timestamp() + f.delay_us * interval '1 microsecond'
                           ELSE o.next_attempt_at END,
    last_error = f.err,
    last_attempt_at = CASE WHEN f.attempted THEN statement_timestamp() ELSE o.last_attempt_at END,
    dead_letter_reason = f.reason,
    dead_lettered_at = CASE WHEN f.status = 'dead_lettered' THEN statement_timestamp() END,
    key_parked = f.park,
    lease_token = NULL,
    destination = coalesce(f.dest, o.destination),
    error_history = (
        SELECT coalesce(jsonb_agg(h.e ORDER BY h.n), '[]')
        FROM jsonb_array_elements(o.error_history || jsonb_build_array(jsonb_build_object(
                 'at', statement_timestamp(), 'attempt', o.retry_count + f.inc,
                 'class', f.class, 'error', f.err)))
             WITH ORDINALITY AS h(e, n)
        WHERE h.n > jsonb_array_length(o.error_history) + 1 - $10)
FROM unnest($1::bigint[], $2::text[], $3::int[], $4::bigint[], $5::text[], $6::text[],
            $7::text[], $8::bool[], $9::bool[], $11::uuid[], $12::text[])
     AS f(id, status, inc, delay_us, err, class, reason, park, attempted, token, dest)
WHERE o.id = f.id AND (f.token IS NULL OR o.lease_token = f.token)`
	// A leased write-back learns which rows still held its lease.
	s.sql.leasedFail = s.sql.fail + `
RETURNING o.id`

	// A lease counts the attempt when it is taken, so a row that crashes
	// the relay every time still runs out of attempts.
	s.sql.lease = `UPDATE ` + t + ` AS o SET
    next_attempt_at = statement_timestamp() + l.vt_us * interval '1 microsecond',
    lease_token = l.token, retry_count = o.retry_count + 1, last_attempt_at = statement_timestamp()
FROM unnest($1::bigint[], $2::uuid[], $3::bigint[]) AS l(id, token, vt_us)
WHERE o.id = l.id
RETURNING o.id, o.next_attempt_at`
	if cfg.KeepSent {
		// retry_count counts failed attempts: the lease's is given back.
		s.sql.leasedSent = `UPDATE ` + t + ` AS o SET status = 'sent', sent_at = statement_timestamp(), lease_token = NULL,
    retry_count = o.retry_count - 1
FROM unnest($1::bigint[], $2::uuid[]) AS l(id, token)
WHERE o.id = l.id AND o.lease_token = l.token
RETURNING o.id`
	} else {
		s.sql.leasedSent = `DELETE FROM ` + t + ` AS o USING unnest($1::bigint[], $2::uuid[]) AS l(id, token)
WHERE o.id = l.id AND o.lease_token = l.token
RETURNING o.id`
	}
	// A leased row that was never sent gives its attempt back.
	s.sql.unlease = `UPDATE ` + t + ` AS o SET next_attempt_at = statement_timestamp(), lease_token = NULL,
    retry_count = o.retry_count - 1
FROM unnest($1::bigint[], $2::uuid[]) AS l(id, token)
WHERE o.id = l.id AND o.lease_token = l.token`
	// Rows deferred behind a leased row wait until its lease expires; once
	// it is done they may go at once. Only rows deferred to exactly that
	// moment are moved, never a producer's own delay.
	s.sql.pullForward = `UPDATE ` + t + ` AS o SET next_attempt_at = statement_timestamp()
FROM unnest($1::text[], $2::bigint[], $3::timestamptz[]) AS p(key, id, until)
WHERE o.key = p.key AND o.status = 'pending' AND o.id > p.id AND o.next_attempt_at = p.until`

	// The conditions stand in the outer WHERE too: PostgreSQL checks that
	// one again on a row changed meanwhile (a dead letter replayed while
	// the delete waited for its lock), the subquery's it does not.
	sent := `status = 'sent' AND sent_at < now() - $1 * interval '1 microsecond'`
	s.sql.cleanup = `DELETE FROM ` + t + `
WHERE id = ANY(ARRAY(
    SELECT id FROM ` + t + ` WHERE ` + sent + `
    ORDER BY sent_at LIMIT $2)) AND ` + sent
	expired := `status IN ('dead_lettered', 'discarded')
      AND dead_lettered_at < now() - $1 * interval '1 microsecond' AND NOT key_parked`
	s.sql.expireDead = `DELETE FROM ` + t + `
WHERE id = ANY(ARRAY(
    SELECT id FROM ` + t + ` WHERE ` + expired + `
    ORDER BY dead_lettered_at LIMIT $2)) AND ` + expired
	return s, nil
}

// ClaimParams bounds a claim.
type ClaimParams struct {
	// Limit is the most rows claimed.
	Limit int
	// PayloadCap is the largest payload loaded, in bytes; larger rows come
	// back undeliverable (too_large) without their payload.
	PayloadCap int
	// ExcludeKeys are keys not to claim: keys in flight elsewhere, whose
	// rows the claim could only lock and skip, getting in the way of the
	// worker that delivers them. Keep it short.
	ExcludeKeys []string
	// ExcludeTopics are topics not to claim: their destination is not
	// taking deliveries. A row of such a topic that holds its key counts
	// as waiting for ExcludeFor, so the key's later rows are deferred
	// rather than claimed again and again.
	ExcludeTopics []string
	ExcludeFor    time.Duration
}

// Claim is a batch of rows locked by one open transaction. Finish it with
// Complete or Release.
type Claim struct {
	store *Store
	tx    pgx.Tx
	// Records are the claimed rows in id order. For each key they are the
	// oldest rows that still hold it, consecutive: no other row of the key
	// comes before or between them.
	Records []Record
	// Now is the database clock at the claim.
	Now time.Time
	// Claimed counts the rows locked, before rows were held back for their
	// key; a claim that reached its limit suggests more rows are ready.
	Claimed int

	minPending int64 // the lowest pending id when the claim ran
	// Deferred counts rows held back because an earlier row of their key
	// is waiting (backoff, a delay, or a parked key); they were rescheduled
	// for when it is due, without counting an attempt.
	Deferred int
	// Skipped counts rows held back because an earlier row of their key is
	// in flight elsewhere; they stay ready. SkippedKeys are their keys.
	Skipped     int
	SkippedKeys []string
	// LeaseExpiry is, after Complete, when each Leased row's lease ends.
	LeaseExpiry map[int64]time.Time
	// HeldSince is, in strict order, since when ids above the watermark
	// have waited for transactions that could still commit a smaller one:
	// their rows become ready, without a wake-up, when those end. Zero
	// when none waits, and outside strict order.
	HeldSince time.Time

	behindLeases []behindLease // rows deferred behind leased rows
}

// SpareConns is how many more connections the store's pool could hand out
// now without waiting.
func (s *Store) SpareConns() int {
	st := s.pool.Stat()
	return int(st.MaxConns() - st.AcquiredConns() - st.ConstructingConns())
}

// claimBegin starts a claim's transaction, in the same round trip, with
// settings that keep its plans right whatever the statistics say. An
// outbox that keeps up is mostly dead rows, so an ANALYZE can leave the
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
//
// Each statement takes its own snapshot (read committed, whatever the
// role's default): the strict order watermark depends on it.
const claimBegin = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL enable_sort = off; SET LOCAL jit = off"

// Claim locks up to p.Limit ready rows and returns them in an open
// transaction. Rows whose key is held by an earlier row outside the claim
// are left out, so rows of one key are always published in id order.
func (s *Store) Claim(ctx context.Context, p ClaimParams) (*Claim, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: claimBegin})
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: begin: %w", err)
	}
	c := &Claim{store: s, tx: tx}
	if err := c.claim(ctx, p); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return c, nil
}

func (c *Claim) claim(ctx context.Context, p ClaimParams) error {
	exclude, excludeTopics := p.ExcludeKeys, p.ExcludeTopics
	if exclude == nil {
		exclude = []string{}
	}
	if excludeTopics == nil {
		excludeTopics = []string{}
	}
	bound, err := c.strictBound(ctx)
	if err != nil {
		return err
	}
	rows, err := c.tx.Query(ctx, c.store.sql.claim, p.Limit, p.PayloadCap, exclude, excludeTopics, bound)
	if err != nil {
		return fmt.Errorf("claim outbox rows: %w", err)
	}
	var (
		recs    = make([]Record, 0, p.Limit)
		topic   internedText
		key     pgtype.Text
		payload payloadSlab
		headers headersText
		lastUS  pgtype.Int8
		eventID pgtype.UUID // binary; uuid.UUID would go through its text form
	)
	for rows.Next() {
		// Scanned in place: a Record of its own would escape to the heap,
		// once a row.
		recs = append(recs, Record{})
		r := &recs[len(recs)-1]
		if err := rows.Scan(&r.ID, &eventID, &topic, &key, &payload, &r.PayloadSize,
			&headers, &r.CreatedAt, &r.RetryCount, &lastUS, &c.Now, &c.minPending); err != nil {
			rows.Close()
			return fmt.Errorf("claim outbox rows: scan: %w", err)
		}
		r.EventID = eventID.Bytes
		r.Topic = topic.last
		r.Key, r.HasKey = key.String, key.Valid
		r.Payload = payload.last
		if lastUS.Valid {
			r.LastDelay = time.Duration(lastUS.Int64) * time.Microsecond
		}
		r.Headers, r.Undeliverable = headers.decoded, headers.problem
		if r.Undeliverable != "" {
			r.UndeliverableReason = ReasonInvalidMessage
		}
		if r.Payload == nil && r.Undeliverable == "" {
			r.Undeliverable = fmt.Sprintf("payload is %d bytes, above the %d-byte cap", r.PayloadSize, p.PayloadCap)
			r.UndeliverableReason = ReasonTooLarge
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("claim outbox rows: %w", err)
	}
	c.Records = recs
	c.Claimed = len(recs)
	if len(recs) == 0 {
		return nil
	}
	return c.keepKeyOrder(ctx, p)
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

// keepKeyOrder drops the claimed rows that an earlier row of their key,
// outside the claim, must precede, and defers them when that row is
// waiting rather than in flight.
func (c *Claim) keepKeyOrder(ctx context.Context, p ClaimParams) error {
	var keys []string
	var ids []int64
	for _, r := range c.Records {
		if r.HasKey {
			keys = append(keys, r.Key)
			ids = append(ids, r.ID)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	var rows pgx.Rows
	var err error
	last := ids[len(ids)-1]
	if c.store.keyCheck.bySpan(last-c.minPending+1, keys) {
		rows, err = c.tx.Query(ctx, c.store.sql.holdingBySpan, keys, ids, c.minPending, last)
	} else {
		rows, err = c.tx.Query(ctx, c.store.sql.holdingByKey, keys, ids, c.minPending)
	}
	if err != nil {
		return fmt.Errorf("check key order: %w", err)
	}
	excluded := make(map[string]bool, len(p.ExcludeTopics))
	for _, t := range p.ExcludeTopics {
		excluded[t] = true
	}
	blocked := map[string]blocker{}
	for rows.Next() {
		var (
			key             string
			id              int64
			parked, waiting bool
			next            time.Time
			topic           string
			leased          bool
		)
		if err := rows.Scan(&key, &id, &parked, &next, &waiting, &topic, &leased); err != nil {
			rows.Close()
			return fmt.Errorf("check key order: scan: %w", err)
		}
		if b, seen := blocked[key]; seen && b.id < id {
			continue // only the key's lowest blocker counts
		}
		b := blocker{id: id, waiting: parked || waiting, parked: parked, leased: leased && waiting, until: next}
		switch {
		case parked:
			b.until = c.Now.Add(ParkedRecheck)
		case !waiting && excluded[topic]:
			b.waiting, b.until = true, c.Now.Add(max(p.ExcludeFor, time.Millisecond))
		}
		blocked[key] = b
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check key order: %w", err)
	}
	if len(blocked) == 0 {
		return nil
	}
	kept := c.Records[:0]
	var deferIDs, parkedIDs []int64
	var deferAt, parkedAt []time.Time
	var parkedNotes []string
	for _, r := range c.Records {
		b, ok := blocked[r.Key]
		// A blocker above the row (the key check by span may find one)
		// does not hold it back.
		if !r.HasKey || !ok || r.ID < b.id {
			kept = append(kept, r)
			continue
		}
		switch {
		case b.parked:
			parkedIDs = append(parkedIDs, r.ID)
			parkedAt = append(parkedAt, b.until)
			parkedNotes = append(parkedNotes, ParkedNote+strconv.FormatInt(b.id, 10))
			c.Deferred++
		case b.waiting:
			deferIDs = append(deferIDs, r.ID)
			deferAt = append(deferAt, b.until)
			c.Deferred++
			if b.leased {
				c.behindLeases = append(c.behindLeases, behindLease{id: r.ID, lease: b.id, until: b.until})
			}
		default:
			if c.Skipped == 0 || c.SkippedKeys[len(c.SkippedKeys)-1] != r.Key {
				c.SkippedKeys = append(c.SkippedKeys, r.Key)
			}
			c.Skipped++
		}
	}
	c.Records = kept
	if len(deferIDs) > 0 {
		if _, err := c.tx.Exec(ctx, c.store.sql.defer_, deferIDs, deferAt); err != nil {
			return fmt.Errorf("defer rows behind a waiting key: %w", err)
		}
	}
	if len(parkedIDs) > 0 {
		if _, err := c.tx.Exec(ctx, c.store.sql.deferParked, parkedIDs, parkedAt, parkedNotes); err != nil {
			return fmt.Errorf("defer rows behind a parked key: %w", err)
		}
	}
	return nil
}

// keyCheckForm is how a claim's key check looks for blockers.
type keyCheckForm int

const (
	keyCheckAuto keyCheckForm = iota
	keyCheckBySpan
	keyCheckByKey
)

// spanEntriesPerKey is how many entries of the span the key check reads
// for the price of one key's probe. A probe, a descent of the key index,
// costs about 6 µs, and an entry along the pending index about 0.7 µs
// (claims of 1000 rows and 1000 keys): some 8 entries. Half that makes
// the span the choice only where it is clearly the cheaper.
const spanEntriesPerKey = 4

// bySpan says whether to read the claim's id span, span ids wide, rather
// than probe each of the claimed keys (one per claimed keyed row). Both
// read the claimed rows' entries; the span reads the rows passed over
// too, and the probes descend the key index once a key. Keys are counted
// only as far as the answer needs: a hash of 1000 keys costs more than
// the rest of the choice.
func (f keyCheckForm) bySpan(span int64, keys []string) bool {
	switch f {
	case keyCheckBySpan:
		return true
	case keyCheckByKey:
		return false
	}
	passed := span - int64(len(keys)) // at most, the rows passed over
	if passed <= 0 {
		return true
	}
	// The distinct keys whose probes would cost more than the rows passed.
	need := (passed + spanEntriesPerKey - 1) / spanEntriesPerKey
	if need > int64(len(keys)) {
		return false
	}
	seen := make(map[string]struct{}, need)
	for _, k := range keys {
		seen[k] = struct{}{}
		if int64(len(seen)) >= need {
			return true
		}
	}
	return false
}

// blocker is the lowest row outside a claim that holds a claimed key.
type blocker struct {
	id      int64
	waiting bool      // parked or not yet due, rather than in flight
	parked  bool      // a dead letter that parks the key
	leased  bool      // being delivered under a lease
	until   time.Time // when its rows may be looked at again
}

// behindLease is a row a claim deferred to the end of a leased row's lease.
type behindLease struct {
	id, lease int64
	until     time.Time
}

// releaseEndedLeases, once a claim has committed, makes ready the rows it
// deferred behind leases that have ended meanwhile. A lease's write-back
// pulls forward the rows deferred behind it, but one that ran between the
// claim's key check and its commit could not see them, and they would
// wait for the whole lease. Now either the write-back comes after the
// commit and finds them, or it is over (waited for, if under way) and this
// finds it over. Best effort: if it fails, the rows wait for the lease's
// end, as they would have.
func (c *Claim) releaseEndedLeases(ctx context.Context) {
	over := map[int64]bool{}
	var ids []int64
	var at []time.Time
	for _, b := range c.behindLeases {
		ended, seen := over[b.lease]
		if !seen {
			var still int
			if err := c.store.pool.QueryRow(ctx, c.store.sql.stillLeased, b.lease, b.until).Scan(&still); err != nil {
				return
			}
			ended = still == 0
			over[b.lease] = ended
		}
		if ended {
			ids = append(ids, b.id)
			at = append(at, b.until)
		}
	}
	if len(ids) > 0 {
		_, _ = c.store.pool.Exec(ctx, c.store.sql.leaseOver, ids, at)
	}
}

// Outcome kinds.
type OutcomeKind int

const (
	// Sent rows are deleted, or marked sent when kept.
	Sent OutcomeKind = iota
	// Retried rows count an attempt and wait Delay.
	Retried
	// Deferred rows wait Delay without counting an attempt.
	Deferred
	// DeadLettered rows move to the dead-letter status with Reason.
	DeadLettered
	// Leased rows are handed to a delivery outside the claim's
	// transaction: hidden for Delay (the visibility timeout) under a lease
	// token, with the attempt counted now. Finish them with CompleteLeased.
	Leased
)

// Outcome is what happened to one claimed row. Rows of a claim without an
// outcome are left as they were.
type Outcome struct {
	ID    int64
	Kind  OutcomeKind
	Delay time.Duration
	// Error describes the failure (all kinds but Sent).
	Error string
	// Class is the failure's class, kept in the error history.
	Class string
	// Reason is the dead-letter reason (DeadLettered). A Deferred row may
	// say why it waits, for metrics; that is not stored.
	Reason string
	// Attempted is true when the row was handed to the destination; an
	// attempted failure counts towards retry_count unless Deferred. A
	// Deferred row that was not attempted keeps its error and history.
	Attempted bool
	// ParkKey makes a dead-lettered row hold its key until released.
	ParkKey bool
	// Destination names where the row went; empty when it never got one.
	// It is stored for attempted failures and dead letters.
	Destination string
	// Token is the lease of a Leased row and, in CompleteLeased, the lease
	// the outcome applies to: it is written only while the row still
	// holds it.
	Token uuid.UUID
}

// Complete writes the outcomes back, with the claim's deferrals, and
// commits. On error the transaction is rolled back and every row stays as
// it was before the claim.
func (c *Claim) Complete(ctx context.Context, outcomes []Outcome) error {
	var sent, deferIDs []int64
	var deferAt []time.Time
	var leased, leaseFor []int64
	var leaseTokens []uuid.UUID
	var fails failures
	for _, o := range outcomes {
		if o.Kind == Sent {
			sent = append(sent, o.ID)
			continue
		}
		if o.Kind == Leased {
			leased = append(leased, o.ID)
			leaseTokens = append(leaseTokens, o.Token)
			leaseFor = append(leaseFor, o.Delay.Microseconds())
			continue
		}
		if o.Kind == Deferred && !o.Attempted {
			// Never handed to the destination: nothing to record but when
			// to look again.
			deferIDs = append(deferIDs, o.ID)
			deferAt = append(deferAt, c.Now.Add(o.Delay))
			continue
		}
		inc := int32(0)
		if o.Attempted && o.Kind != Deferred {
			inc = 1
		}
		fails.add(o, inc, o.Attempted, pgtype.UUID{})
	}
	b := &pgx.Batch{}
	if len(sent) > 0 {
		b.Queue(c.store.sql.sent, sent)
	}
	if len(deferIDs) > 0 {
		b.Queue(c.store.sql.defer_, deferIDs, deferAt)
	}
	fails.queue(b, c.store.sql.fail, c.store.errorHistory)
	if len(leased) > 0 {
		c.LeaseExpiry = make(map[int64]time.Time, len(leased))
		b.Queue(c.store.sql.lease, leased, leaseTokens, leaseFor).Query(func(rows pgx.Rows) error {
			var id int64
			var until time.Time
			_, err := pgx.ForEachRow(rows, []any{&id, &until}, func() error {
				c.LeaseExpiry[id] = until
				return nil
			})
			return err
		})
	}
	if b.Len() > 0 {
		if err := c.tx.SendBatch(ctx, b).Close(); err != nil {
			_ = c.tx.Rollback(context.WithoutCancel(ctx))
			return fmt.Errorf("write back %d outcomes: %w", len(outcomes), err)
		}
	}
	if err := c.tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit %d outcomes: %w", len(outcomes), err)
	}
	if len(c.behindLeases) > 0 {
		c.releaseEndedLeases(ctx)
	}
	return nil
}

// failures gathers the parameters of the fail statement, one array per
// column.
type failures struct {
	ids                     []int64
	statuses, errs, classes []string
	incs                    []int32
	delays                  []int64
	reasons                 []pgtype.Text
	parks, attempted        []bool
	tokens                  []pgtype.UUID
	dests                   []pgtype.Text
}

func (f *failures) add(o Outcome, inc int32, attempted bool, token pgtype.UUID) {
	status, reason := "pending", pgtype.Text{}
	if o.Kind == DeadLettered {
		status = "dead_lettered"
		reason = pgtype.Text{String: o.Reason, Valid: true}
	}
	f.ids = append(f.ids, o.ID)
	f.statuses = append(f.statuses, status)
	f.incs = append(f.incs, inc)
	f.delays = append(f.delays, o.Delay.Microseconds())
	f.errs = append(f.errs, truncate(storable(o.Error), MaxErrorLen))
	f.classes = append(f.classes, o.Class)
	f.reasons = append(f.reasons, reason)
	f.parks = append(f.parks, o.ParkKey && o.Kind == DeadLettered)
	f.attempted = append(f.attempted, attempted)
	f.tokens = append(f.tokens, token)
	f.dests = append(f.dests, pgtype.Text{String: o.Destination, Valid: o.Destination != ""})
}

// queue adds the fail statement to b, if any row failed, and returns it.
func (f *failures) queue(b *pgx.Batch, sql string, history int) *pgx.QueuedQuery {
	if len(f.ids) == 0 {
		return nil
	}
	return b.Queue(sql, f.ids, f.statuses, f.incs, f.delays, f.errs, f.classes, f.reasons, f.parks, f.attempted, history, f.tokens, f.dests)
}

// LeasedWork is where a leased key's rows sat when they were leased: rows
// of the key deferred to the lease's end are pulled forward once the
// delivery is over.
type LeasedWork struct {
	Key     string
	FirstID int64
	Until   time.Time
}

// CompleteLeased writes back the outcomes of a leased delivery, each only
// where the row still holds the outcome's Token: a lease that expired and
// was taken by another delivery is left to that one. Attempts were counted
// when the rows were leased, so Retried and DeadLettered outcomes count
// none; Deferred outcomes (a systemic failure) and rows in unsent (never
// handed to the destination) give theirs back. Rows deferred behind the
// leased keys are then made ready. It returns the outcomes written back,
// in their order: those of rows that still held the lease.
func (s *Store) CompleteLeased(ctx context.Context, outcomes []Outcome, unsent []Outcome, keys []LeasedWork) ([]Outcome, error) {
	var sentIDs, unsentIDs []int64
	var sentTokens, unsentTokens []uuid.UUID
	var fails failures
	for _, o := range outcomes {
		switch o.Kind {
		case Sent:
			sentIDs = append(sentIDs, o.ID)
			sentTokens = append(sentTokens, o.Token)
			continue
		case Leased:
			continue
		}
		inc := int32(0)
		if o.Kind == Deferred {
			inc = -1 // a systemic failure gives the lease's attempt back
		}
		// last_attempt_at was set by the lease.
		fails.add(o, inc, false, pgtype.UUID{Bytes: o.Token, Valid: true})
	}
	for _, o := range unsent {
		unsentIDs = append(unsentIDs, o.ID)
		unsentTokens = append(unsentTokens, o.Token)
	}
	b := &pgx.Batch{}
	applied := map[int64]bool{}
	collect := func(rows pgx.Rows) error {
		var id int64
		_, err := pgx.ForEachRow(rows, []any{&id}, func() error {
			applied[id] = true
			return nil
		})
		return err
	}
	if len(sentIDs) > 0 {
		b.Queue(s.sql.leasedSent, sentIDs, sentTokens).Query(collect)
	}
	if q := fails.queue(b, s.sql.leasedFail, s.errorHistory); q != nil {
		q.Query(collect)
	}
	if len(unsentIDs) > 0 {
		b.Queue(s.sql.unlease, unsentIDs, unsentTokens)
	}
	if len(keys) > 0 {
		k := make([]string, len(keys))
		first := make([]int64, len(keys))
		until := make([]time.Time, len(keys))
		for i, w := range keys {
			k[i], first[i], until[i] = w.Key, w.FirstID, w.Until
		}
		b.Queue(s.sql.pullForward, k, first, until)
	}
	if b.Len() == 0 {
		return nil, nil
	}
	// One implicit transaction: all or nothing.
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("write back %d leased outcomes: %w", len(outcomes)+len(unsent), err)
	}
	var done []Outcome
	for _, o := range outcomes {
		if applied[o.ID] {
			done = append(done, o)
		}
	}
	return done, nil
}

// Release ends the claim without writing anything: every row stays as it
// was before the claim, including rows the claim deferred. Use Complete
// with no outcomes to keep those deferrals.
func (c *Claim) Release(ctx context.Context) error {
	if err := c.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("release claim: %w", err)
	}
	return nil
}

// DeleteSent deletes up to limit rows marked sent longer than retention
// ago, on one replica at a time: when another replica is cleaning up, it
// returns 0 and busy. Only rows kept with KeepSent are ever sent.
func (s *Store) DeleteSent(ctx context.Context, retention time.Duration, limit int) (deleted int64, busy bool, err error) {
	return s.maintain(ctx, "delete sent rows", s.sql.cleanup, retention, limit)
}

// DeleteExpiredDeadLetters deletes up to limit dead-lettered and discarded
// rows dead-lettered longer than retention ago, on one replica at a time
// like DeleteSent. A row that parks its key is kept: deleting it would
// release the key without anyone deciding to.
func (s *Store) DeleteExpiredDeadLetters(ctx context.Context, retention time.Duration, limit int) (deleted int64, busy bool, err error) {
	return s.maintain(ctx, "delete expired dead letters", s.sql.expireDead, retention, limit)
}

// TopicBacklog is what waits for delivery on one topic.
type TopicBacklog struct {
	Topic string
	// Pending counts the topic's pending rows, ready or waiting.
	Pending int64
	// OldestAge is the age of its oldest pending row, by the database
	// clock.
	OldestAge time.Duration
}

// Backlog reports the pending rows of every topic that has some. It reads
// every pending row: call it every few seconds at most.
func (s *Store) Backlog(ctx context.Context) ([]TopicBacklog, error) {
	rows, err := s.pool.Query(ctx, s.sql.backlog)
	if err != nil {
		return nil, fmt.Errorf("measure the backlog: %w", err)
	}
	var out []TopicBacklog
	var b TopicBacklog
	var ageUS int64
	_, err = pgx.ForEachRow(rows, []any{&b.Topic, &b.Pending, &ageUS}, func() error {
		b.OldestAge = time.Duration(max(ageUS, 0)) * time.Microsecond
		out = append(out, b)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("measure the backlog: %w", err)
	}
	return out, nil
}

// maintain runs a bounded maintenance statement under the maintenance
// lock, which one replica holds at a time.
func (s *Store) maintain(ctx context.Context, what, sql string, retention time.Duration, limit int) (int64, bool, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("%s: begin: %w", what, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	var locked bool
	if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", s.lockID).Scan(&locked); err != nil {
		return 0, false, fmt.Errorf("%s: lock: %w", what, err)
	}
	if !locked {
		return 0, true, nil
	}
	tag, err := tx.Exec(ctx, sql, retention.Microseconds(), limit)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("%s: commit: %w", what, err)
	}
	return tag.RowsAffected(), false, nil
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
		return nil, joinProblems(bad)
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

func joinProblems(p []string) string {
	out := p[0]
	for _, s := range p[1:] {
		out += "; " + s
	}
	return out
}

// storable makes an error text fit a text column: valid UTF-8 without NUL
// (a destination's response can contain anything).
func storable(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// truncate shortens s to at most n bytes without splitting a character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
