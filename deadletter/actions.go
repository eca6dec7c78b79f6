package deadletter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"golang.org/x/time/rate"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Audit actions.
const (
	ActionReplay  = "replay"
	ActionEdit    = "edit"
	ActionDiscard = "discard"
	ActionRelease = "release"
)

// Actor is who performs an action, for the audit trail.
type Actor struct {
	// Name is the person or system acting.
	Name string
	// Source is how: cli or api.
	Source string
}

func (a Actor) validate() error {
	if strings.TrimSpace(a.Name) == "" || a.Source == "" {
		return &InputError{Problems: []string{"the actor is unknown: every action is recorded with who took it"}}
	}
	return nil
}

// Limiter paces bulk actions: WaitN blocks until n more rows may change.
// A *rate.Limiter from golang.org/x/time/rate fits.
type Limiter interface {
	WaitN(ctx context.Context, n int) error
}

// Selection names the rows an action applies to: by reference, by filter,
// or every dead letter. Exactly one must be given.
type Selection struct {
	Refs   []Ref  `json:"refs,omitempty"`
	Filter Filter `json:"filter,omitzero"`
	All    bool   `json:"all,omitempty"`
}

func (s Selection) validate() error {
	given := 0
	for _, b := range []bool{len(s.Refs) > 0, !s.Filter.IsZero(), s.All} {
		if b {
			given++
		}
	}
	switch {
	case given == 0:
		return &InputError{Problems: []string{"select rows by id, by filter, or all of them explicitly"}}
	case given > 1:
		return &InputError{Problems: []string{"select rows by id, by filter or all, not several at once"}}
	case len(s.Refs) > MaxBatchSize:
		return &InputError{Problems: []string{fmt.Sprintf("%d ids: name at most %d at once, or use a filter", len(s.Refs), MaxBatchSize)}}
	}
	return s.Filter.Validate()
}

// BulkParams are what Replay and Discard share.
type BulkParams struct {
	Selection
	// DryRun selects the rows and reports what would change, changing
	// nothing.
	DryRun bool
	// BatchSize is how many rows change per transaction. Default 500.
	BatchSize int
	// Rate, if positive, is the most rows changed per second: batches
	// shrink to at most a second's worth and are paced evenly.
	Rate float64
	// Limiter, if set, paces the batches instead of Rate.
	Limiter Limiter
	Actor   Actor
	// Reason says why, for the audit trail.
	Reason string
}

// ReplayParams select dead letters to deliver again.
type ReplayParams struct {
	BulkParams
	// At is when the rows become ready; zero means now.
	At time.Time
}

// Result reports what an action changed.
type Result struct {
	Action string `json:"action"`
	DryRun bool   `json:"dry_run"`
	// Count is the number of rows changed, or that would be in a dry run.
	Count int `json:"count"`
	// Changed are their ids, the first MaxReportedIDs of them; Truncated
	// says there were more.
	Changed   []int64 `json:"changed"`
	Truncated bool    `json:"truncated,omitempty"`
	// Unchanged are rows named by reference that were left alone because
	// they are not dead-lettered.
	Unchanged []Unchanged `json:"unchanged,omitempty"`
	// ReleasedKeys are keys whose later rows were let go.
	ReleasedKeys []string `json:"released_keys,omitempty"`
}

// MaxReportedIDs bounds the ids a Result lists: a bulk action may change
// millions of rows.
const MaxReportedIDs = 10000

// add counts ids as changed.
func (r *Result) add(ids ...int64) {
	r.Count += len(ids)
	room := max(0, MaxReportedIDs-len(r.Changed))
	if len(ids) > room {
		ids, r.Truncated = ids[:room], true
	}
	r.Changed = append(r.Changed, ids...)
}

// StatusGone is the status reported for a row that an operator acted on
// before and that is no longer in the table: delivered and deleted, or
// expired by retention.
const StatusGone = "gone"

// Unchanged is a row an action left alone, and its status.
type Unchanged struct {
	ID     int64  `json:"id"`
	Status string `json:"status"`
}

// Replay makes dead letters pending again: retry_count 0, ready at p.At
// (now by default), error history kept. Rows named by reference that are
// no longer dead-lettered are reported unchanged. A filter applies to the
// rows dead-lettered when the replay starts, so rows that fail again
// while it runs are not replayed twice.
func (s *Store) Replay(ctx context.Context, p ReplayParams) (*Result, error) {
	var at *time.Time
	if !p.At.IsZero() {
		at = &p.At
	}
	details := map[string]any{}
	if at != nil {
		details["ready_at"] = at
	}
	return s.bulk(ctx, ActionReplay, p.BulkParams, details, func(ctx context.Context, tx pgx.Tx, ids []int64) error {
		_, err := tx.Exec(ctx, `UPDATE `+s.outbox+` SET status = 'pending', retry_count = 0,
    next_attempt_at = coalesce($2, now()), dead_letter_reason = NULL, dead_lettered_at = NULL,
    key_parked = false, lease_token = NULL, last_attempt_at = NULL
WHERE id = ANY($1) AND status = 'dead_lettered'`, ids, at)
		return err
	})
}

// Discard gives up on dead letters: they stay, with status discarded,
// until retention deletes them. A reason is required.
func (s *Store) Discard(ctx context.Context, p BulkParams) (*Result, error) {
	if strings.TrimSpace(p.Reason) == "" {
		return nil, &InputError{Problems: []string{"discarding needs a reason, for the audit trail"}}
	}
	return s.bulk(ctx, ActionDiscard, p, map[string]any{}, func(ctx context.Context, tx pgx.Tx, ids []int64) error {
		_, err := tx.Exec(ctx, `UPDATE `+s.outbox+` SET status = 'discarded', key_parked = false
WHERE id = ANY($1) AND status = 'dead_lettered'`, ids)
		return err
	})
}

type target struct {
	id     int64
	key    *string
	parked bool
	at     time.Time
}

// bulk selects the rows of p in batches and applies change to each batch,
// with the release of parked keys and an audit record, in the batch's
// transaction.
func (s *Store) bulk(ctx context.Context, action string, p BulkParams, details map[string]any,
	change func(context.Context, pgx.Tx, []int64) error) (*Result, error) {
	if err := p.Selection.validate(); err != nil {
		return nil, err
	}
	if err := p.Actor.validate(); err != nil {
		return nil, err
	}
	batch := p.BatchSize
	switch {
	case batch == 0:
		batch = DefaultBatchSize
	case batch < 0 || batch > MaxBatchSize:
		return nil, &InputError{Problems: []string{fmt.Sprintf("batch size %d: use 1 to %d", batch, MaxBatchSize)}}
	}
	switch {
	case p.Rate < 0 || math.IsNaN(p.Rate) || math.IsInf(p.Rate, 0):
		return nil, &InputError{Problems: []string{fmt.Sprintf("rate %v: use a positive number of rows per second, or 0 for no limit", p.Rate)}}
	case p.Rate > 0 && p.Limiter == nil:
		// Small batches at a steady pace rather than bursts.
		batch = max(1, min(batch, int(math.Ceil(p.Rate))))
		p.Limiter = rate.NewLimiter(rate.Limit(p.Rate), batch)
	}
	res := &Result{Action: action, DryRun: p.DryRun, Changed: []int64{}}
	if len(p.Refs) > 0 {
		details["refs"] = p.Refs
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			targets, err := s.lockRefs(ctx, tx, p.Refs, res)
			if err != nil {
				return err
			}
			if p.DryRun || len(targets) == 0 {
				for _, t := range targets {
					res.add(t.id)
				}
				return errDryRun
			}
			return s.apply(ctx, tx, action, p, details, targets, res, change)
		})
		if err != nil && !errors.Is(err, errDryRun) {
			return nil, err
		}
		return res, nil
	}

	var cutoff time.Time
	if err := s.pool.QueryRow(ctx, "SELECT now()").Scan(&cutoff); err != nil {
		return nil, fmt.Errorf("%s: %w", action, err)
	}
	// Times before now are fixed at the start, so the selection does not
	// drift while the batches run.
	p.Filter.Since, p.Filter.Until = p.Filter.Since.at(cutoff), p.Filter.Until.at(cutoff)
	if p.All {
		details["all"] = true
	} else {
		details["filter"] = p.Filter
	}
	var last *target
	for {
		if p.Limiter != nil && !p.DryRun {
			// Outside the transaction: no locks are held while waiting.
			if err := p.Limiter.WaitN(ctx, batch); err != nil {
				err = fmt.Errorf("wait for the rate limit: %w", err)
				if res.Count > 0 {
					return res, fmt.Errorf("%s stopped after %d rows: %w", action, res.Count, err)
				}
				return nil, fmt.Errorf("%s: %w", action, err)
			}
		}
		var targets []target
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			var err error
			targets, err = s.lockBatch(ctx, tx, p, cutoff, last, batch)
			if err != nil {
				return err
			}
			if p.DryRun || len(targets) == 0 {
				return errDryRun
			}
			return s.apply(ctx, tx, action, p, details, targets, res, change)
		})
		if err != nil && !errors.Is(err, errDryRun) {
			// Earlier batches are committed: say how far it got.
			if res.Count > 0 {
				return res, fmt.Errorf("%s stopped after %d rows: %w", action, res.Count, err)
			}
			return nil, err
		}
		if p.DryRun {
			for _, t := range targets {
				res.add(t.id)
			}
		}
		if len(targets) < batch {
			return res, nil
		}
		last = &targets[len(targets)-1]
	}
}

// errDryRun rolls back a transaction that was only looking.
var errDryRun = errors.New("dry run")

// lockRefs locks the rows refs name and returns the dead-lettered ones;
// the others go to res.Unchanged. A reference that matches no row fails
// the whole action.
func (s *Store) lockRefs(ctx context.Context, tx pgx.Tx, refs []Ref, res *Result) ([]target, error) {
	var ids []int64
	var events []uuid.UUID
	for _, r := range refs {
		if r.ID > 0 {
			ids = append(ids, r.ID)
		} else {
			events = append(events, r.EventID)
		}
	}
	rows, err := tx.Query(ctx, `SELECT id, event_id, status, key, key_parked, coalesce(dead_lettered_at, now())
FROM `+s.outbox+` WHERE id = ANY($1) OR event_id = ANY($2) ORDER BY id FOR UPDATE`, ids, events)
	if err != nil {
		return nil, fmt.Errorf("select rows: %w", err)
	}
	foundID := map[int64]bool{}
	foundEvent := map[uuid.UUID]bool{}
	var targets []target
	var t target
	var ev uuid.UUID
	var status string
	_, err = pgx.ForEachRow(rows, []any{&t.id, &ev, &status, &t.key, &t.parked, &t.at}, func() error {
		foundID[t.id], foundEvent[ev] = true, true
		if status == StatusDeadLettered {
			targets = append(targets, t)
		} else {
			res.Unchanged = append(res.Unchanged, Unchanged{ID: t.id, Status: status})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("select rows: %w", err)
	}
	var missing []Ref
	var missingIDs []int64
	for _, r := range refs {
		if (r.ID > 0 && !foundID[r.ID]) || (r.ID == 0 && !foundEvent[r.EventID]) {
			missing = append(missing, r)
			if r.ID > 0 {
				missingIDs = append(missingIDs, r.ID)
			}
		}
	}
	if len(missing) == 0 {
		return targets, nil
	}
	// A row an operator acted on before may since have been delivered and
	// deleted, or expired: that is not a mistake in the input.
	rows, err = tx.Query(ctx, `SELECT DISTINCT r FROM `+s.audit+` AS a, unnest(a.row_ids) AS r
WHERE a.row_ids && $1::bigint[] AND r = ANY($1)`, missingIDs)
	if err != nil {
		return nil, fmt.Errorf("look for rows in the audit trail: %w", err)
	}
	gone, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("look for rows in the audit trail: %w", err)
	}
	unknown := missing[:0]
	for _, r := range missing {
		if r.ID > 0 && slices.Contains(gone, r.ID) {
			res.Unchanged = append(res.Unchanged, Unchanged{ID: r.ID, Status: StatusGone})
			continue
		}
		unknown = append(unknown, r)
	}
	if len(unknown) > 0 {
		return nil, &NotFoundError{Refs: unknown}
	}
	return targets, nil
}

// lockBatch selects the next batch of dead letters matching p, dead-lettered
// by cutoff, after last, in the order of the dead-letter index.
func (s *Store) lockBatch(ctx context.Context, tx pgx.Tx, p BulkParams, cutoff time.Time, last *target, n int) ([]target, error) {
	var w where
	w.add("status = 'dead_lettered'")
	w.add("dead_lettered_at <= ?", cutoff)
	w.filter(p.Filter)
	if last != nil {
		w.add("(dead_lettered_at, id) > (?, ?)", last.at, last.id)
	}
	lock := " FOR UPDATE"
	if p.DryRun {
		lock = ""
	}
	w.args = append(w.args, n)
	rows, err := tx.Query(ctx, `SELECT id, key, key_parked, dead_lettered_at FROM `+s.outbox+`
WHERE `+w.sql()+`
ORDER BY dead_lettered_at, id LIMIT $`+strconv.Itoa(len(w.args))+lock, w.args...)
	if err != nil {
		return nil, fmt.Errorf("select dead letters: %w", err)
	}
	var targets []target
	var t target
	_, err = pgx.ForEachRow(rows, []any{&t.id, &t.key, &t.parked, &t.at}, func() error {
		targets = append(targets, t)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("select dead letters: %w", err)
	}
	return targets, nil
}

// apply changes one batch, lets go of the keys it parked, and records it.
func (s *Store) apply(ctx context.Context, tx pgx.Tx, action string, p BulkParams, details map[string]any,
	targets []target, res *Result, change func(context.Context, pgx.Tx, []int64) error) error {
	ids := make([]int64, len(targets))
	var keys []string
	for i, t := range targets {
		ids[i] = t.id
		if t.parked && t.key != nil && !slices.Contains(keys, *t.key) {
			keys = append(keys, *t.key)
		}
	}
	if err := change(ctx, tx, ids); err != nil {
		return fmt.Errorf("%s %d rows: %w", action, len(ids), err)
	}
	if err := s.unpark(ctx, tx, keys); err != nil {
		return err
	}
	batch := details
	if len(keys) > 0 {
		batch = maps.Clone(details)
		batch["released_keys"] = keys
	}
	if err := s.record(ctx, tx, p.Actor, action, p.Reason, ids, batch); err != nil {
		return err
	}
	res.add(ids...)
	res.ReleasedKeys = append(res.ReleasedKeys, keys...)
	return nil
}

// unpark makes the rows deferred behind the parked keys ready at once and
// gives them back their own last error.
func (s *Store) unpark(ctx context.Context, tx pgx.Tx, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	// First wait for claims that hold the keys' rows: one that saw the key
	// parked may be deferring them behind it right now, and its note must
	// be visible to the update below, or they would wait minutes more.
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+s.outbox+` WHERE key = ANY($1) AND status = 'pending' ORDER BY id FOR UPDATE`, keys); err != nil {
		return fmt.Errorf("lock the rows behind parked keys: %w", err)
	}
	_, err := tx.Exec(ctx, `UPDATE `+s.outbox+` SET next_attempt_at = now(),
    last_error = error_history -> -1 ->> 'error'
WHERE key = ANY($1) AND status = 'pending' AND lease_token IS NULL AND starts_with(last_error, $2)`, keys, outbox.ParkedNote)
	if err != nil {
		return fmt.Errorf("let go of the rows behind parked keys: %w", err)
	}
	return nil
}

func (s *Store) record(ctx context.Context, tx pgx.Tx, a Actor, action, reason string, ids []int64, details any) error {
	var why *string
	if r := strings.TrimSpace(reason); r != "" {
		why = &r
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+s.audit+` (actor, source, action, reason, row_ids, details)
VALUES ($1, $2, $3, $4, $5, $6)`, a.Name, a.Source, action, why, ids, details)
	if err != nil {
		return fmt.Errorf("write the audit record: %w", err)
	}
	return nil
}

// EditParams replace parts of a dead letter before it is replayed. Fields
// left nil or empty keep their value; at least one must change.
type EditParams struct {
	Ref Ref
	// Topic replaces the topic.
	Topic string
	// Headers replace the headers: a JSON object of strings.
	Headers json.RawMessage
	// Payload replaces the payload.
	Payload []byte
	// AllowNonJSON accepts a payload that is not JSON in place of one
	// that was: without it, such an edit is refused as a likely mistake.
	AllowNonJSON bool
	// MaxPayload, if positive, is the largest payload accepted (the
	// relay's payload cap).
	MaxPayload int
	// CheckTopic, if set, vets a new topic (that a route matches it).
	CheckTopic func(topic string) error
	// At is when the row becomes ready; zero means now.
	At     time.Time
	Actor  Actor
	Reason string
}

// rowImage is a row's editable fields, as the audit trail keeps them.
type rowImage struct {
	Topic   string          `json:"topic"`
	Headers json.RawMessage `json:"headers"`
	// Payload is base64 in JSON.
	Payload []byte `json:"payload"`
}

// Edit replaces the payload, headers or topic of a dead letter and
// replays it, in one transaction, keeping the row as it was in the audit
// record. Invalid input changes nothing.
func (s *Store) Edit(ctx context.Context, p EditParams) (*Result, error) {
	if err := p.Actor.validate(); err != nil {
		return nil, err
	}
	var headers map[string]string
	var problems []string
	if p.Topic == "" && p.Headers == nil && p.Payload == nil {
		problems = append(problems, "nothing to change: give a new payload, headers or topic")
	}
	if p.Topic != "" && (strings.TrimSpace(p.Topic) != p.Topic || strings.ContainsFunc(p.Topic, unicode.IsControl)) {
		problems = append(problems, fmt.Sprintf("topic %q has surrounding white space or control characters", p.Topic))
	} else if p.Topic != "" && p.CheckTopic != nil {
		if err := p.CheckTopic(p.Topic); err != nil {
			problems = append(problems, fmt.Sprintf("topic %q: %v", p.Topic, err))
		}
	}
	if p.Headers != nil {
		var err error
		if headers, err = parseHeaders(p.Headers); err != nil {
			problems = append(problems, "headers must be a JSON object of string values: "+err.Error())
		}
	}
	if p.MaxPayload > 0 && len(p.Payload) > p.MaxPayload {
		problems = append(problems, fmt.Sprintf("payload is %d bytes, above the payload cap of %d", len(p.Payload), p.MaxPayload))
	}
	if len(problems) > 0 {
		return nil, &InputError{Problems: problems}
	}

	res := &Result{Action: ActionEdit}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var before rowImage
		var status string
		var key *string
		var parked bool
		var id int64
		cond, arg := p.Ref.match()
		err := tx.QueryRow(ctx, `SELECT id, status, topic, headers, payload, key, key_parked FROM `+s.outbox+`
WHERE `+cond+` FOR UPDATE`, arg).Scan(&id, &status, &before.Topic, &before.Headers, &before.Payload, &key, &parked)
		if errors.Is(err, pgx.ErrNoRows) {
			return &NotFoundError{Refs: []Ref{p.Ref}}
		}
		if err != nil {
			return fmt.Errorf("edit row %s: %w", p.Ref, err)
		}
		if status != StatusDeadLettered {
			return fmt.Errorf("row %d is %s: %w; only dead letters can be edited", id, status, ErrNotDeadLettered)
		}
		if p.Payload != nil && !p.AllowNonJSON && json.Valid(before.Payload) && !json.Valid(p.Payload) {
			return &InputError{Problems: []string{fmt.Sprintf("row %d's payload is JSON and the new one is not; allow a payload that is not JSON to replace it anyway", id)}}
		}
		after := rowImage{Topic: p.Topic, Payload: p.Payload}
		if p.Headers != nil {
			after.Headers, _ = json.Marshal(headers) // normalised
		}
		var at *time.Time
		if !p.At.IsZero() {
			at = &p.At
		}
		var newKey []string
		if parked && key != nil {
			newKey = []string{*key}
		}
		if _, err := tx.Exec(ctx, `UPDATE `+s.outbox+` SET
    topic = coalesce($2, topic), headers = coalesce($3::jsonb, headers), payload = coalesce($4, payload),
    status = 'pending', retry_count = 0, next_attempt_at = coalesce($5, now()),
    dead_letter_reason = NULL, dead_lettered_at = NULL, key_parked = false, lease_token = NULL,
    last_attempt_at = NULL
WHERE id = $1`, id, nullIfEmpty(p.Topic), nullIfNil(after.Headers), p.Payload, at); err != nil {
			return fmt.Errorf("edit row %d: %w", id, err)
		}
		if err := s.unpark(ctx, tx, newKey); err != nil {
			return err
		}
		details := map[string]any{"before": before, "after": editedFields(after)}
		if at != nil {
			details["ready_at"] = at
		}
		if err := s.record(ctx, tx, p.Actor, ActionEdit, p.Reason, []int64{id}, details); err != nil {
			return err
		}
		res.add(id)
		res.ReleasedKeys = newKey
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// parseHeaders reads a JSON object whose values are all strings, as the
// relay requires of the headers column.
func parseHeaders(b []byte) (map[string]string, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil {
		return nil, err
	}
	if raw == nil || dec.More() {
		return nil, errors.New("not a single JSON object")
	}
	h := make(map[string]string, len(raw))
	var bad []string
	for k, v := range raw {
		var s string
		if bytes.HasPrefix(bytes.TrimSpace(v), []byte("null")) || json.Unmarshal(v, &s) != nil {
			bad = append(bad, strconv.Quote(k))
			continue
		}
		h[k] = s
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return nil, fmt.Errorf("the value of %s is not a string", strings.Join(bad, ", "))
	}
	return h, nil
}

// editedFields is the audit record's "after": only what the edit set.
func editedFields(a rowImage) map[string]any {
	m := map[string]any{}
	if a.Topic != "" {
		m["topic"] = a.Topic
	}
	if a.Headers != nil {
		m["headers"] = a.Headers
	}
	if a.Payload != nil {
		m["payload"] = a.Payload
	}
	return m
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullIfNil(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// ReleaseParams name a parked key to release.
type ReleaseParams struct {
	Key string
	// Discard discards the dead letter that parks the key; otherwise it
	// stays dead-lettered, no longer parking the key.
	Discard bool
	Actor   Actor
	// Reason is required when discarding.
	Reason string
}

// Release lets a parked key's later rows go on, in order, at once.
func (s *Store) Release(ctx context.Context, p ReleaseParams) (*Result, error) {
	if err := p.Actor.validate(); err != nil {
		return nil, err
	}
	if p.Key == "" {
		return nil, &InputError{Problems: []string{"name the key to release"}}
	}
	if p.Discard && strings.TrimSpace(p.Reason) == "" {
		return nil, &InputError{Problems: []string{"discarding needs a reason, for the audit trail"}}
	}
	res := &Result{Action: ActionRelease}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		status := "dead_lettered"
		if p.Discard {
			status = "discarded"
		}
		rows, err := tx.Query(ctx, `UPDATE `+s.outbox+` SET key_parked = false, status = $2
WHERE key = $1 AND key_parked RETURNING id`, p.Key, status)
		if err != nil {
			return fmt.Errorf("release key %q: %w", p.Key, err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("release key %q: %w", p.Key, err)
		}
		if len(ids) == 0 {
			return fmt.Errorf("release key %q: %w", p.Key, ErrNotParked)
		}
		if err := s.unpark(ctx, tx, []string{p.Key}); err != nil {
			return err
		}
		details := map[string]any{"key": p.Key, "discarded": p.Discard}
		if err := s.record(ctx, tx, p.Actor, ActionRelease, p.Reason, ids, details); err != nil {
			return err
		}
		res.add(ids...)
		res.ReleasedKeys = []string{p.Key}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// AuditRecord is one operator action.
type AuditRecord struct {
	ID      int64           `json:"id"`
	At      time.Time       `json:"at"`
	Actor   string          `json:"actor"`
	Source  string          `json:"source"`
	Action  string          `json:"action"`
	Reason  string          `json:"reason,omitempty"`
	RowIDs  []int64         `json:"row_ids"`
	Details json.RawMessage `json:"details"`
}

// AuditParams select audit records, newest first.
type AuditParams struct {
	// Action is replay, edit, discard or release.
	Action string
	// Actor is who acted, exactly.
	Actor string
	// Row selects records that touched this row id.
	Row          int64
	Since, Until TimeBound
	Limit        int
	Cursor       string
}

// AuditPage is one page of the audit trail.
type AuditPage struct {
	Records []AuditRecord `json:"records"`
	Next    string        `json:"next_cursor,omitempty"`
}

// Audit lists operator actions, newest first.
func (s *Store) Audit(ctx context.Context, p AuditParams) (*AuditPage, error) {
	var problems []string
	actions := []string{ActionReplay, ActionEdit, ActionDiscard, ActionRelease}
	if p.Action != "" && !slices.Contains(actions, p.Action) {
		problems = append(problems, fmt.Sprintf("action %q: use one of %s", p.Action, strings.Join(actions, ", ")))
	}
	limit, err := pageLimit(p.Limit)
	if err != nil {
		problems = append(problems, err.Error())
	}
	var w where
	if p.Cursor != "" {
		id, err := strconv.ParseInt(p.Cursor, 10, 64)
		if err != nil || id < 1 {
			problems = append(problems, fmt.Sprintf("cursor %q is not one this command returned", p.Cursor))
		}
		w.add("id < ?", id)
	}
	if len(problems) > 0 {
		return nil, &InputError{Problems: problems}
	}
	if p.Action != "" {
		w.add("action = ?", p.Action)
	}
	if p.Actor != "" {
		w.add("actor = ?", p.Actor)
	}
	if p.Row > 0 {
		w.add("? = ANY(row_ids)", p.Row)
	}
	if !p.Since.IsZero() {
		w.bound("at", ">=", p.Since)
	}
	if !p.Until.IsZero() {
		w.bound("at", "<", p.Until)
	}
	w.args = append(w.args, limit+1)
	rows, err := s.pool.Query(ctx, `SELECT id, at, actor, source, action, coalesce(reason, ''), row_ids, details
FROM `+s.audit+` WHERE `+w.sql()+` ORDER BY id DESC LIMIT $`+strconv.Itoa(len(w.args)), w.args...)
	if err != nil {
		return nil, fmt.Errorf("list audit records: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditRecord, error) {
		var a AuditRecord
		var details []byte
		err := r.Scan(&a.ID, &a.At, &a.Actor, &a.Source, &a.Action, &a.Reason, &a.RowIDs, &details)
		a.Details = details
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list audit records: %w", err)
	}
	page := &AuditPage{Records: recs}
	if len(recs) > limit {
		page.Records = recs[:limit]
		page.Next = strconv.FormatInt(page.Records[limit-1].ID, 10)
	}
	if page.Records == nil {
		page.Records = []AuditRecord{}
	}
	return page, nil
}
