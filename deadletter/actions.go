package deadletter

import (
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
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"golang.org/x/time/rate"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// Actor is who performs an action, for the audit trail.
type Actor struct {
	// Name is the person or system acting.
	Name string
	// Source is how: cli, api, console or sso.
	Source string
	// Credential names the API token the request came with, or the
	// identity provider's subject; empty from the command line.
	Credential string
	// Role is the role the actor held (access.Role's name); empty from
	// the command line.
	Role string
}

// validate checks the actor, and the text given with the action, as name
// and value pairs (the reason first), is text the database keeps.
func (a Actor) validate(text ...string) error {
	if strings.TrimSpace(a.Name) == "" || a.Source == "" {
		return &InputError{Problems: []string{"the actor is unknown: every action is recorded with who took it"}}
	}
	if p := badText(append([]string{"the actor", a.Name}, text...)...); len(p) > 0 {
		return &InputError{Problems: p}
	}
	return nil
}

// badText describes the fields, given as name and value pairs, that are
// not text a PostgreSQL text column takes: valid UTF-8 without NUL.
func badText(pairs ...string) []string {
	var p []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if v := pairs[i+1]; !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			p = append(p, fmt.Sprintf("%s is not valid text (UTF-8 without NUL)", pairs[i]))
		}
	}
	return p
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

// BulkParams are what the actions on a selection share.
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
	return s.bulk(ctx, ActionReplay, p.BulkParams, details, func(ctx context.Context, tx pgx.Tx, ids []int64) (map[string]any, error) {
		return nil, s.q.Replay(ctx, tx, ids, at)
	})
}

// Discard gives up on dead letters: they stay, with status discarded,
// until retention deletes them. A reason is required, but for a dry run.
func (s *Store) Discard(ctx context.Context, p BulkParams) (*Result, error) {
	if !p.DryRun && strings.TrimSpace(p.Reason) == "" {
		return nil, &InputError{Problems: []string{"discarding needs a reason, for the audit trail"}}
	}
	return s.bulk(ctx, ActionDiscard, p, map[string]any{}, func(ctx context.Context, tx pgx.Tx, ids []int64) (map[string]any, error) {
		return nil, s.q.Discard(ctx, tx, ids)
	})
}

// Preview reports the rows that action would change in p's selection,
// changing nothing: a dry run that needs none of the action's inputs.
func (s *Store) Preview(ctx context.Context, action string, p BulkParams) (*Result, error) {
	p.DryRun = true
	return s.bulk(ctx, action, p, map[string]any{}, nil)
}

// RerouteParams select dead letters to deliver again under another topic.
type RerouteParams struct {
	BulkParams
	// Topic is the topic the rows get. Required.
	Topic string
	// At is when the rows become ready; zero means now.
	At time.Time
}

// Reroute gives dead letters another topic and makes them pending again,
// as Replay does. Each batch's audit record keeps the topics its rows had.
func (s *Store) Reroute(ctx context.Context, p RerouteParams) (*Result, error) {
	topic := p.Topic
	if topic == "" {
		return nil, &InputError{Problems: []string{"reroute needs the topic the rows get"}}
	}
	if problem := topicProblem(topic, s.checkTopic); problem != "" {
		return nil, &InputError{Problems: []string{problem}}
	}
	var at *time.Time
	details := map[string]any{"topic": topic}
	if !p.At.IsZero() {
		at = &p.At
		details["ready_at"] = at
	}
	return s.bulk(ctx, ActionReroute, p.BulkParams, details, func(ctx context.Context, tx pgx.Tx, ids []int64) (map[string]any, error) {
		from, err := s.q.Reroute(ctx, tx, ids, topic, at)
		return map[string]any{"from_topics": from}, err
	})
}

// bulk selects the rows of p in batches and applies change to each batch,
// with the release of parked keys and an audit record, in the batch's
// transaction. What change returns joins the batch's audit details.
func (s *Store) bulk(ctx context.Context, action string, p BulkParams, details map[string]any,
	change func(context.Context, pgx.Tx, []int64) (map[string]any, error)) (*Result, error) {
	if err := p.Selection.validate(); err != nil {
		return nil, err
	}
	if err := p.Actor.validate("the reason", p.Reason); err != nil {
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
					res.add(t.ID)
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

	if p.Filter.Group != "" {
		if err := s.groupRows(ctx); err != nil {
			return nil, err
		}
	}
	var cutoff time.Time
	if err := s.pool.QueryRow(ctx, outboxdb.Now).Scan(&cutoff); err != nil {
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
	var last *outboxdb.Position
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
		var targets []outboxdb.Target
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
				res.add(t.ID)
			}
		}
		if len(targets) < batch {
			return res, nil
		}
		t := targets[len(targets)-1]
		last = &outboxdb.Position{At: t.At, ID: t.ID}
	}
}

// errDryRun rolls back a transaction that was only looking.
var errDryRun = errors.New("dry run")

// lockRefs locks the rows refs name and returns the dead-lettered ones;
// the others go to res.Unchanged. A reference that matches no row fails
// the whole action.
func (s *Store) lockRefs(ctx context.Context, tx pgx.Tx, refs []Ref, res *Result) ([]outboxdb.Target, error) {
	var ids []int64
	var events []uuid.UUID
	for _, r := range refs {
		if r.ID > 0 {
			ids = append(ids, r.ID)
		} else {
			events = append(events, r.EventID)
		}
	}
	locked, err := s.q.LockRefs(ctx, tx, ids, events)
	if err != nil {
		return nil, fmt.Errorf("select rows: %w", err)
	}
	foundID := map[int64]bool{}
	foundEvent := map[uuid.UUID]bool{}
	var targets []outboxdb.Target
	for _, r := range locked {
		foundID[r.ID], foundEvent[r.EventID] = true, true
		if r.Status == StatusDeadLettered {
			targets = append(targets, r.Target)
		} else {
			res.Unchanged = append(res.Unchanged, Unchanged{ID: r.ID, Status: r.Status})
		}
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
	gone, err := s.q.AuditedRows(ctx, tx, missingIDs)
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
func (s *Store) lockBatch(ctx context.Context, tx pgx.Tx, p BulkParams, cutoff time.Time, last *outboxdb.Position, n int) ([]outboxdb.Target, error) {
	targets, err := s.q.LockDeadLetters(ctx, tx, outboxdb.LockArgs{Filter: p.Filter.rows(), Cutoff: cutoff,
		After: last, Limit: n, Lock: !p.DryRun})
	if err != nil {
		return nil, fmt.Errorf("select dead letters: %w", err)
	}
	return targets, nil
}

// apply changes one batch, lets go of the keys it parked, and records it.
func (s *Store) apply(ctx context.Context, tx pgx.Tx, action string, p BulkParams, details map[string]any,
	targets []outboxdb.Target, res *Result, change func(context.Context, pgx.Tx, []int64) (map[string]any, error)) error {
	ids := make([]int64, len(targets))
	var keys []string
	for i, t := range targets {
		ids[i] = t.ID
		if t.Parked && t.Key != nil && !slices.Contains(keys, *t.Key) {
			keys = append(keys, *t.Key)
		}
	}
	extra, err := change(ctx, tx, ids)
	if err != nil {
		return fmt.Errorf("%s %d rows: %w", action, len(ids), err)
	}
	if err := s.unpark(ctx, tx, keys); err != nil {
		return err
	}
	batch := details
	if len(keys) > 0 || len(extra) > 0 {
		batch = maps.Clone(details)
		maps.Copy(batch, extra)
		if len(keys) > 0 {
			batch["released_keys"] = keys
		}
	}
	if err := s.record(ctx, tx, p.Actor, action, p.Reason, ids, batch); err != nil {
		return err
	}
	res.add(ids...)
	res.ReleasedKeys = append(res.ReleasedKeys, keys...)
	return nil
}

// unpark makes the rows deferred behind the parked keys ready at once.
func (s *Store) unpark(ctx context.Context, tx pgx.Tx, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if err := s.q.Unpark(ctx, tx, keys); err != nil {
		return fmt.Errorf("let go of the rows behind parked keys: %w", err)
	}
	return nil
}

func (s *Store) record(ctx context.Context, tx pgx.Tx, a Actor, action, reason string, ids []int64, details any) error {
	var why *string
	if r := strings.TrimSpace(reason); r != "" {
		why = &r
	}
	err := s.q.InsertAudit(ctx, tx, outboxdb.AuditEntry{Actor: a.Name, Source: a.Source, Credential: a.Credential, Role: a.Role,
		Action: action, Reason: why, RowIDs: ids, Details: details})
	if err != nil {
		return fmt.Errorf("write the audit record: %w", err)
	}
	return nil
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
	if err := p.Actor.validate("the reason", p.Reason, "the key", p.Key); err != nil {
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
		ids, err := s.q.ReleaseKey(ctx, tx, p.Key, p.Discard)
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
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Source string    `json:"source"`
	// Credential is the name of the API token the action came with, or
	// the identity provider's issuer and subject (issuer|sub).
	Credential string `json:"credential,omitempty"`
	// Action is one of Actions.
	Action  string          `json:"action"`
	Reason  string          `json:"reason,omitempty"`
	RowIDs  []int64         `json:"row_ids"`
	Details json.RawMessage `json:"details"`
	// Role is the role the actor held; empty from the command line,
	// which works on the database directly.
	Role string `json:"role,omitempty"`
	// PayloadsHidden says payloads are left out of Details: the
	// role of whoever asked does not show them.
	PayloadsHidden bool `json:"payloads_hidden,omitempty"`
}

// AuditParams select audit records, newest first.
type AuditParams struct {
	// Action is one of Actions.
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
	if _, ok := LookupAction(p.Action); p.Action != "" && !ok {
		problems = append(problems, fmt.Sprintf("action %q: use one of %s", p.Action, strings.Join(ActionNames(), ", ")))
	}
	limit, err := pageLimit(p.Limit)
	if err != nil {
		problems = append(problems, err.Error())
	}
	args := outboxdb.AuditArgs{Action: p.Action, Actor: p.Actor, Row: p.Row,
		Since: outboxdb.Bound(p.Since), Until: outboxdb.Bound(p.Until), Limit: limit + 1}
	if p.Cursor != "" {
		id, err := strconv.ParseInt(p.Cursor, 10, 64)
		if err != nil || id < 1 {
			problems = append(problems, fmt.Sprintf("cursor %q is not one this command returned", p.Cursor))
		}
		args.BeforeID = id
	}
	if len(problems) > 0 {
		return nil, &InputError{Problems: problems}
	}
	recs, err := s.q.ListAudit(ctx, s.pool, args)
	if err != nil {
		return nil, fmt.Errorf("list audit records: %w", err)
	}
	page := &AuditPage{Records: make([]AuditRecord, len(recs))}
	for i, r := range recs {
		page.Records[i] = AuditRecord{ID: r.ID, At: r.At, Actor: r.Actor, Source: r.Source, Credential: r.Credential,
			Action: r.Action, Reason: r.Reason, RowIDs: r.RowIDs, Details: r.Details, Role: r.Role}
	}
	if len(recs) > limit {
		page.Records = page.Records[:limit]
		page.Next = strconv.FormatInt(page.Records[limit-1].ID, 10)
	}
	return page, nil
}
