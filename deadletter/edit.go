package deadletter

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

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
	// Version, if set, is the Detail.Version the edit was made from: a
	// row whose topic, headers or payload have changed since is left as
	// it is, with ErrChanged.
	Version string
	// At is when the row becomes ready; zero means now.
	At     time.Time
	Actor  Actor
	Reason string
}

// Edit replaces the payload, headers or topic of a dead letter and
// replays it, in one transaction, keeping the row as it was in the audit
// record. Invalid input changes nothing.
func (s *Store) Edit(ctx context.Context, p EditParams) (*Result, error) {
	if err := p.Actor.validate("the reason", p.Reason, "the topic", p.Topic); err != nil {
		return nil, err
	}
	var headers map[string]string
	var problems []string
	if p.Topic == "" && p.Headers == nil && p.Payload == nil {
		problems = append(problems, "nothing to change: give a new payload, headers or topic")
	}
	if p.Topic != "" {
		if problem := topicProblem(p.Topic, s.checkTopic); problem != "" {
			problems = append(problems, problem)
		}
	}
	if p.Headers != nil {
		var err error
		if headers, err = parseHeaders(p.Headers); err != nil {
			problems = append(problems, "headers must be a JSON object of string values: "+err.Error())
		}
	}
	if p.Version != "" && !isVersion(p.Version) {
		problems = append(problems, fmt.Sprintf("version %q is not a row's version: give the one dlq show or the row's page printed (24 hex digits)", p.Version))
	}
	if s.maxPayload > 0 && len(p.Payload) > s.maxPayload {
		problems = append(problems, fmt.Sprintf("payload is %d bytes, above the payload cap of %d", len(p.Payload), s.maxPayload))
	}
	if len(problems) > 0 {
		return nil, &InputError{Problems: problems}
	}

	res := &Result{Action: ActionEdit}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		row, err := s.q.LockForEdit(ctx, tx, p.Ref.row())
		if errors.Is(err, pgx.ErrNoRows) {
			return &NotFoundError{Refs: []Ref{p.Ref}}
		}
		if err != nil {
			return fmt.Errorf("edit row %s: %w", p.Ref, err)
		}
		id, key := row.ID, row.Key
		if row.Status != StatusDeadLettered {
			return fmt.Errorf("row %d is %s: %w; only dead letters can be edited", id, row.Status, ErrNotDeadLettered)
		}
		if p.Version != "" && contentVersion(row.Topic, row.Headers, row.Payload) != p.Version {
			return fmt.Errorf("row %d has %w (version %s): its topic, headers or payload are no longer what the edit was made from; read it again", id, ErrChanged, p.Version)
		}
		if p.Payload != nil && !p.AllowNonJSON && json.Valid(row.Payload) && !json.Valid(p.Payload) {
			return &InputError{Problems: []string{fmt.Sprintf("row %d's payload is JSON and the new one is not; allow a payload that is not JSON to replace it anyway", id)}}
		}
		var newHeaders []byte
		if p.Headers != nil {
			newHeaders, _ = json.Marshal(headers) // normalised
		}
		var at *time.Time
		if !p.At.IsZero() {
			at = &p.At
		}
		var newKey []string
		if row.Parked && key != nil {
			newKey = []string{*key}
		}
		if err := s.q.Edit(ctx, tx, outboxdb.EditArgs{ID: id, Topic: nullIfEmpty(p.Topic), Headers: nullIfNil(newHeaders),
			Payload: p.Payload, At: at}); err != nil {
			return fmt.Errorf("edit row %d: %w", id, err)
		}
		if err := s.unpark(ctx, tx, newKey); err != nil {
			return err
		}
		before := map[string]any{"topic": row.Topic, "headers": json.RawMessage(row.Headers)}
		s.auditPayload(before, row.Payload)
		after := map[string]any{}
		if p.Topic != "" {
			after["topic"] = p.Topic
		}
		if newHeaders != nil {
			after["headers"] = json.RawMessage(newHeaders)
		}
		if p.Payload != nil {
			s.auditPayload(after, p.Payload)
		}
		details := map[string]any{"before": before, "after": after}
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

// auditPayload puts payload into an audit image: whole (base64 in JSON),
// or its SHA-256 and length when the store keeps digests.
func (s *Store) auditPayload(image map[string]any, payload []byte) {
	if s.digest {
		sum := sha256.Sum256(payload)
		image["payload_sha256"] = hex.EncodeToString(sum[:])
		image["payload_bytes"] = len(payload)
		return
	}
	image["payload"] = payload
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

// topicProblem says what is wrong with a topic an operator gives rows, or
// returns "".
func topicProblem(topic string, check func(string) error) string {
	if strings.TrimSpace(topic) != topic || strings.ContainsFunc(topic, unicode.IsControl) {
		return fmt.Sprintf("topic %q has surrounding white space or control characters", topic)
	}
	if check != nil {
		if err := check(topic); err != nil {
			return fmt.Sprintf("topic %q: %v", topic, err)
		}
	}
	return ""
}
