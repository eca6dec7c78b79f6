package deadletter

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// Group is a failure group: the dead letters of one destination and
// reason whose errors have the same fingerprint, the error with what
// varies from row to row (quoted values, ids, numbers) masked. Its ID
// selects its rows in a Filter, to list, replay or discard them together.
type Group struct {
	ID          string `json:"id"`
	Destination string `json:"destination"`
	Reason      string `json:"reason"`
	Fingerprint string `json:"fingerprint"`
	Count       int    `json:"count"`
	// FirstSeen and LastSeen are when its first and last rows were
	// dead-lettered.
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// Example is the error of its latest row, unmasked.
	Example string `json:"example"`
}

// GroupParams select failure groups: those of the dead letters Filter
// matches, the Limit largest (default 50, at most 1000).
type GroupParams struct {
	Filter Filter
	Limit  int
}

// GroupPage is the largest failure groups, by rows, the most recent first
// among equals.
type GroupPage struct {
	Groups []Group `json:"groups"`
	// Total counts the groups, listed or not.
	Total int `json:"total"`
}

// groupIDPattern is what a group id looks like: the first 12 hexadecimal
// digits of the MD5 of destination, reason and fingerprint.
var groupIDPattern = regexp.MustCompile(`^[0-9a-f]{12}$`)

// Groups returns the failure groups of the dead-lettered rows p.Filter
// matches.
func (s *Store) Groups(ctx context.Context, p GroupParams) (*GroupPage, error) {
	if err := p.Filter.Validate(); err != nil {
		return nil, err
	}
	limit, err := pageLimit(p.Limit)
	if err != nil {
		return nil, err
	}
	if err := s.groupRows(ctx); err != nil {
		return nil, err
	}
	found, total, err := s.q.FailureGroups(ctx, s.pool, outboxdb.GroupArgs{Filter: p.Filter.rows(), Limit: limit})
	if err != nil {
		return nil, fmt.Errorf("list failure groups: %w", err)
	}
	page := &GroupPage{Groups: make([]Group, len(found)), Total: total}
	for i, g := range found {
		page.Groups[i] = Group{ID: g.ID, Destination: g.Destination, Reason: g.Reason, Fingerprint: g.Fingerprint,
			Count: g.N, FirstSeen: g.First, LastSeen: g.Last, Example: g.Example}
	}
	return page, nil
}

// groupRows gives their group the dead letters that a relay older than
// the failure groups (migration 14) left without one, before groups are
// read or a group's rows selected: none as a rule, found on the groups'
// index at once.
func (s *Store) groupRows(ctx context.Context) error {
	if _, err := s.q.GroupRows(ctx, s.pool); err != nil {
		return fmt.Errorf("group dead letters: %w", err)
	}
	return nil
}
