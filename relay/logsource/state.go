package logsource

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// SlotState is the slot as the server sees it.
type SlotState struct {
	// Exists is false for a slot that does not exist.
	Exists bool
	// Active says a replica streams from it.
	Active bool
	// WALStatus is PostgreSQL's: reserved, extended, unreserved (the log
	// it needs is past max_slot_wal_keep_size and may go at the next
	// checkpoint) or lost (it went: the slot is invalidated).
	WALStatus string
	// Confirmed is the position up to which every message is settled.
	Confirmed string
	// LagBytes is how much of the log lies past Confirmed: what the slot
	// keeps on the server's disk.
	LagBytes int64
}

// Lost says the slot's messages since Confirmed are gone from the log.
func (st SlotState) Lost() bool { return st.Exists && st.WALStatus == "lost" }

// State reads the slot's state through db (the outbox's pool).
func (s *Source) State(ctx context.Context, db outboxdb.DB) (SlotState, error) {
	st := SlotState{Exists: true}
	err := db.QueryRow(ctx, s.sql.SlotState).Scan(&st.Active, &st.WALStatus, &st.Confirmed, &st.LagBytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotState{}, nil
	}
	if err != nil {
		return SlotState{}, fmt.Errorf("read the slot: %w", err)
	}
	return st, nil
}

// Problem is why the stream cannot run, for readiness: the slot is
// missing or lost (see Run); "" when it streams or stands by.
func (s *Source) Problem() string {
	p, _ := s.problem.Load().(string)
	return p
}
