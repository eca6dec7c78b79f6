package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	relaystore "github.com/outbox-relay/outbox-relay/relay/store"
)

// What a search looks for (FindParams.Kind).
const (
	FindAuto  = ""
	FindEvent = "event"
	FindRow   = "row"
	FindKey   = "key"
)

// MaxQueryBytes bounds a search's text: the longest key it looks for.
const MaxQueryBytes = 4096

// FindParams is a search for a message.
type FindParams struct {
	// Query is an event id, a row id or a key.
	Query string
	// Kind says which; FindAuto takes a UUID for an event id, a positive
	// integer for a row id, and anything else, or a reference that
	// matches no row, for a key.
	Kind string
	// Limit bounds a key's rows. Default 100, at most MaxListLimit.
	Limit int
}

// Found is what a search found.
type Found struct {
	Query string `json:"query"`
	// Kind is what the query was taken for: event, row or key.
	Kind string `json:"kind"`
	// Rows are the rows found: one for an event or row id; a key's in id
	// order, its head first among those that wait.
	Rows []FoundRow `json:"rows"`
	// More says a key has more rows than Limit.
	More bool `json:"more,omitempty"`
	// Absent says what it means that no row matched.
	Absent string `json:"absent,omitempty"`
	// Audit are the audit trail's records of a row id that no row has
	// any more (replayed, then delivered and deleted), newest first.
	Audit []AuditRecord `json:"audit,omitempty"`
}

// FoundRow is a row where it is now, and what holds it.
type FoundRow struct {
	Letter
	ErrorHistory []HistoryEntry `json:"error_history"`
	SentAt       *time.Time     `json:"sent_at,omitempty"`
	DiscardedAt  *time.Time     `json:"discarded_at,omitempty"`
	// State is where the row is: pending, leased (a relay is delivering
	// it), sent (delivered, kept for relay.sent_retention),
	// dead_lettered or discarded.
	State string `json:"state"`
	// Where says it in words, with when.
	Where string `json:"where"`
	// Holds are what keep a pending row from being delivered now, as far
	// as the database tells: the console adds the relay's live state.
	Holds []Hold `json:"holds,omitempty"`
	// Do lists what an operator can do about it.
	Do []string `json:"do,omitempty"`
	// Audit is the audit trail's records of the row, newest first.
	Audit []AuditRecord `json:"audit,omitempty"`
}

// What holds a pending row (Hold.Kind).
const (
	HoldKeyAhead  = "key_ahead"  // an earlier row of its key is pending
	HoldParkedKey = "parked_key" // an earlier row of its key is parked
	HoldBackoff   = "backoff"    // it waits for its next attempt
	HoldLeased    = "leased"     // a relay is delivering it now
	HoldBreaker   = "breaker"    // its destination's breaker is open
	HoldPaused    = "paused"     // its topic or partition is paused
	HoldNoRoute   = "no_route"   // no route takes its topic
)

// Hold is one thing that keeps a row from being delivered now.
type Hold struct {
	Kind   string     `json:"kind"`
	Detail string     `json:"detail"`
	Until  *time.Time `json:"until,omitempty"`
	// Row is the row that holds it, for HoldKeyAhead and HoldParkedKey.
	Row int64 `json:"row,omitempty"`
}

// parseFind reads a search: its kind, and the reference or key.
func parseFind(p FindParams) (kind string, ref Ref, key string, err error) {
	q := strings.TrimSpace(p.Query)
	var problems []string
	switch {
	case q == "":
		problems = append(problems, "the search is empty: give an event id (a UUID), a row id (a positive integer) or a key")
	case len(p.Query) > MaxQueryBytes:
		problems = append(problems, fmt.Sprintf("the search is %d bytes long; at most %d", len(p.Query), MaxQueryBytes))
	case !utf8.ValidString(p.Query) || strings.ContainsRune(p.Query, 0):
		problems = append(problems, "the search is not valid text (UTF-8 without NUL)")
	}
	if p.Limit < 0 || p.Limit > MaxListLimit {
		problems = append(problems, fmt.Sprintf("limit is %d; it must be from 1 to %d (0 for the default)", p.Limit, MaxListLimit))
	}
	if len(problems) > 0 {
		return "", Ref{}, "", &InputError{Problems: problems}
	}
	switch p.Kind {
	case FindAuto:
		if u, err := uuid.Parse(q); err == nil {
			return FindEvent, Ref{EventID: u}, q, nil
		}
		if id, err := strconv.ParseInt(q, 10, 64); err == nil && id > 0 {
			return FindRow, Ref{ID: id}, q, nil
		}
		return FindKey, Ref{}, q, nil
	case FindEvent:
		u, err := uuid.Parse(q)
		if err != nil {
			return "", Ref{}, "", &InputError{Problems: []string{fmt.Sprintf("%q is not an event id (a UUID)", ClipText(q))}}
		}
		return FindEvent, Ref{EventID: u}, "", nil
	case FindRow:
		id, err := strconv.ParseInt(q, 10, 64)
		if err != nil || id < 1 {
			return "", Ref{}, "", &InputError{Problems: []string{fmt.Sprintf("%q is not a row id (a positive integer)", ClipText(q))}}
		}
		return FindRow, Ref{ID: id}, "", nil
	case FindKey:
		// A key is found as it is written, spaces included.
		return FindKey, Ref{}, p.Query, nil
	}
	return "", Ref{}, "", &InputError{Problems: []string{fmt.Sprintf("kind %q is not one of event, row or key", ClipText(p.Kind))}}
}

// ClipText shortens text quoted in an error.
func ClipText(s string) string {
	if len(s) <= 80 {
		return s
	}
	return strings.ToValidUTF8(s[:80], "") + "…"
}

// Find finds a message by event id, row id or key, wherever it is:
// pending, leased, kept as sent, dead-lettered or discarded, with its
// attempts, what holds it and its audit trail. A key's rows are its
// pending, dead-lettered and discarded ones (rows kept as sent are found
// by their ids).
func (s *Store) Find(ctx context.Context, p FindParams) (*Found, error) {
	kind, ref, key, err := parseFind(p)
	if err != nil {
		return nil, err
	}
	f := &Found{Query: p.Query, Kind: kind}
	if kind != FindKey {
		row, err := s.q.FindRow(ctx, s.pool, ref.row())
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			if p.Kind == FindAuto {
				// Perhaps a key that looks like an id.
				if kf, err := s.findKey(ctx, key, p.Limit); err != nil || len(kf.Rows) > 0 {
					if kf != nil {
						kf.Query = p.Query
					}
					return kf, err
				}
			}
			f.Absent = absent(kind, s.sentRetention)
			if kind == FindRow {
				// The row is gone, but operators may have acted on it.
				audit, err := s.Audit(ctx, AuditParams{Row: ref.ID, Limit: 20})
				if err != nil {
					return nil, err
				}
				if f.Audit = audit.Records; len(f.Audit) > 0 {
					f.Absent += " The audit trail names it: an operator acted on it before it went."
				}
			}
			return f, nil
		case err != nil:
			return nil, fmt.Errorf("find %s: %w", ref, err)
		}
		fr, err := foundRow(row)
		if err != nil {
			return nil, err
		}
		if fr.Status == statusPending && fr.Key != nil {
			holders, err := s.q.KeyHolders(ctx, s.pool, *fr.Key, fr.ID, maxHolders)
			if err != nil {
				return nil, fmt.Errorf("find %s: %w", ref, err)
			}
			for _, h := range holders {
				if s.holds(h.Topic, fr.Topic) {
					fr.Holds = append([]Hold{aheadHold(h.ID, h.Topic, h.Parked)}, fr.Holds...)
					break
				}
			}
		}
		fr.Do = advice(fr)
		audit, err := s.Audit(ctx, AuditParams{Row: fr.ID, Limit: 20})
		if err != nil {
			return nil, err
		}
		fr.Audit = audit.Records
		f.Rows = []FoundRow{fr}
		return f, nil
	}
	kf, err := s.findKey(ctx, key, p.Limit)
	if kf != nil {
		kf.Query = p.Query
	}
	return kf, err
}

// findKey returns a key's rows; the first that waits heads it, and holds
// the later pending ones.
func (s *Store) findKey(ctx context.Context, key string, limit int) (*Found, error) {
	if limit == 0 {
		limit = 100
	}
	rows, err := s.q.KeyRows(ctx, s.pool, key, limit+1)
	if err != nil {
		return nil, fmt.Errorf("find key %q: %w", ClipText(key), err)
	}
	f := &Found{Kind: FindKey}
	if len(rows) > limit {
		// Pending rows first, then the latest of the others.
		f.More = true
		keep := make(map[int64]bool, limit)
		for _, r := range rows {
			if r.Status == statusPending && len(keep) < limit {
				keep[r.ID] = true
			}
		}
		for i := len(rows) - 1; i >= 0 && len(keep) < limit; i-- {
			keep[rows[i].ID] = true
		}
		rows = slices.DeleteFunc(rows, func(r outboxdb.Found) bool { return !keep[r.ID] })
	}
	// Each row is held by the first earlier row of its order scope that
	// waits: pending, or parked.
	var heads []FoundRow
	for _, r := range rows {
		fr, err := foundRow(r)
		if err != nil {
			return nil, err
		}
		if fr.Status == statusPending {
			for _, h := range heads {
				if s.holds(h.Topic, fr.Topic) {
					fr.Holds = append([]Hold{aheadHold(h.ID, h.Topic, h.ParksKey)}, fr.Holds...)
					break
				}
			}
		}
		fr.Do = advice(fr)
		f.Rows = append(f.Rows, fr)
		if fr.Status == statusPending || fr.ParksKey {
			heads = append(heads, fr)
		}
	}
	if len(f.Rows) == 0 {
		f.Absent = fmt.Sprintf("No pending, dead-lettered or discarded row has key %q. Rows kept as sent are found by their event or row id.", ClipText(key))
	}
	return f, nil
}

// maxHolders bounds the earlier rows of a key read to find the one that
// holds a row back in its order scope.
const maxHolders = 1000

// holds reports whether a waiting row of topic holder holds back a later
// row of the same key and topic row: in the same order scope, or in every
// scope (a row without a route).
func (s *Store) holds(holder, row string) bool {
	if s.orderScope == nil {
		return true
	}
	hs := s.orderScope(holder)
	return hs == relaystore.EveryScope || hs == s.orderScope(row)
}

// absent says what it means that no row has an event or row id.
func absent(kind string, sentRetention time.Duration) string {
	what := "event id"
	if kind == FindRow {
		what = "row id"
	}
	if sentRetention <= 0 {
		return "No row has this " + what + ". The relay deletes a row once it is delivered (relay.sent_retention is 0), so it was delivered, or never written: the relay cannot tell which. Set relay.sent_retention to keep delivered rows for a while and find them here."
	}
	return fmt.Sprintf("No row has this %s. The relay keeps delivered rows for %s (relay.sent_retention), and discarded rows until their retention: it was never written, or it was delivered or discarded before that.", what, sentRetention)
}

func aheadHold(id int64, topic string, parked bool) Hold {
	if parked {
		return Hold{Kind: HoldParkedKey, Row: id, Detail: fmt.Sprintf("row %d of its key (topic %s) is dead-lettered and parks the key: its later rows wait until it is replayed or the key released", id, topic)}
	}
	return Hold{Kind: HoldKeyAhead, Row: id, Detail: fmt.Sprintf("row %d of its key (topic %s) is ahead of it: a key's rows are delivered in order", id, topic)}
}

// foundRow says where r is and what of the database holds it.
func foundRow(r outboxdb.Found) (FoundRow, error) {
	fr := FoundRow{Letter: Letter(r.Letter), SentAt: r.SentAt, DiscardedAt: r.DiscardedAt, State: r.Status}
	if err := json.Unmarshal(r.History, &fr.ErrorHistory); err != nil {
		return fr, fmt.Errorf("row %d: error history: %w", r.ID, err)
	}
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	switch {
	case r.Status == "pending" && r.Leased:
		fr.State = "leased"
		fr.Where = "leased: a relay is delivering it now"
		fr.Holds = append(fr.Holds, Hold{Kind: HoldLeased, Detail: "a relay holds it while its delivery is in flight; if that relay dies, the lease ends and it is delivered again"})
	case r.Status == "pending":
		fr.Where = "pending since " + at(r.CreatedAt)
		switch r.Attempts {
		case 0:
			fr.Where += ", not tried yet"
		case 1:
			fr.Where += ", after 1 attempt"
		default:
			fr.Where += fmt.Sprintf(", after %d attempts", r.Attempts)
		}
		if r.NextAttemptAt.After(r.Now) {
			until := r.NextAttemptAt
			why := "its producer delayed it"
			if r.Attempts > 0 {
				why = fmt.Sprintf("backoff after attempt %d failed: %s", r.Attempts, r.LastError)
			}
			fr.Holds = append(fr.Holds, Hold{Kind: HoldBackoff, Until: &until, Detail: "waits until " + at(until) + ": " + why})
		}
	case r.Status == "sent":
		fr.Where = "delivered"
		if r.SentAt != nil {
			fr.Where += " at " + at(*r.SentAt)
		}
		fr.Where += ", kept for relay.sent_retention"
	case r.Status == "dead_lettered":
		fr.Where = "dead-lettered (" + r.Reason + ")"
		if r.DeadLetteredAt != nil {
			fr.Where += " at " + at(*r.DeadLetteredAt)
		}
		if r.ParksKey {
			fr.Where += "; it parks its key"
		}
	case r.Status == "discarded":
		fr.Where = "discarded"
		if r.DiscardedAt != nil {
			fr.Where += " at " + at(*r.DiscardedAt)
		}
	}
	return fr, nil
}

// advice lists what an operator can do about r.
func advice(r FoundRow) []string {
	var do []string
	switch r.State {
	case "dead_lettered":
		do = append(do, "fix and replay it (dlq edit, or dlq replay), reroute it, or discard it")
		if r.ParksKey {
			do = append(do, "or release its key (dlq release) to let the key's later rows go without it")
		}
	case "discarded":
		do = append(do, "nothing is left to do: it will not be delivered; its record stays until the discarded rows' retention")
	case "sent":
		do = append(do, "nothing: it was delivered")
	case "pending", "leased":
		for _, h := range r.Holds {
			switch h.Kind {
			case HoldParkedKey:
				do = append(do, fmt.Sprintf("deal with row %d, which parks the key: replay it, or release the key", h.Row))
			case HoldKeyAhead:
				do = append(do, fmt.Sprintf("look at row %d, ahead of it: it goes once that one is delivered or dead-lettered", h.Row))
			case HoldBackoff:
				do = append(do, "wait: it is tried again at its next attempt")
			}
		}
		if len(do) == 0 {
			do = append(do, "wait: nothing in the database holds it")
		}
	}
	return do
}

// statusPending is the status of a row not yet delivered.
const statusPending = "pending"
