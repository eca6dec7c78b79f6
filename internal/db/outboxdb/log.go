package outboxdb

import (
	"cmp"
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/internal/db/schema"
)

// ReserveIDs takes n ids from the outbox table's identity, for messages
// read from the write-ahead log. Statement: log_reserve_ids.
func (q *Queries) ReserveIDs(ctx context.Context, db DB, n int) ([]int64, error) {
	rows, err := db.Query(ctx, q.logReserveIDs, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// KeysInTable returns, of keys, those with a pending row or a parked dead
// letter in the table. Statement: log_keys_in_table.
func (q *Queries) KeysInTable(ctx context.Context, db DB, keys []string) ([]string, error) {
	rows, err := db.Query(ctx, q.logKeysInTable, keys)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Adopted are messages read from the log to write into the table, an
// element of each a message.
type Adopted struct {
	IDs        []int64
	EventIDs   []uuid.UUID
	Topics     []string
	Keys       []pgtype.Text
	Payloads   [][]byte
	Headers    []string // JSON objects
	CreatedAts []time.Time
}

// Len is the number of messages.
func (a *Adopted) Len() int { return len(a.IDs) }

// QueueAdopt adds to b the insert of a's messages as pending rows, ready
// now. Statement: log_adopt.
func (q *Queries) QueueAdopt(b *pgx.Batch, a *Adopted) {
	b.Queue(q.logAdopt, a.IDs, a.EventIDs, a.Topics, a.Keys, a.Payloads, a.Headers, a.CreatedAts)
}

// Capture are the statements of an outbox captured from the write-ahead
// log (sql/log.sql), rendered for one schema: they name its publication,
// and its slot through the schema's outbox_capture_slot(), so that they
// run on a replication connection too.
type Capture struct {
	// Publication is the publication's name.
	Publication string
	// Slot reads the slot's name, its confirmed position and wal_status.
	Slot string
	// SlotState reads whether it streams, its wal_status, its confirmed
	// position and how many bytes of the log are behind it.
	SlotState string
	// Check returns what capture needs, a row each: what, ok, found;
	// SlotCheck the slot's row, once the function exists.
	Check, SlotCheck string
	// CreatePublication, CreateSlot and DropSlot set it up.
	CreatePublication, CreateSlot, DropSlot string
}

// NewCapture renders the statements of Capture for schemaName.
func NewCapture(schemaName string) (Capture, error) {
	schemaName = cmp.Or(schemaName, schema.Default)
	n, err := quoted(schemaName)
	if err != nil {
		return Capture{}, err
	}
	pub := schema.Publication(schemaName)
	data := struct {
		names
		Schema, Publication, PublicationIdent string
	}{n, pgx.Identifier{schemaName}.Sanitize(), pub, pgx.Identifier{pub}.Sanitize()}
	c := Capture{Publication: pub}
	for name, dst := range map[string]*string{
		"capture_slot": &c.Slot, "capture_slot_state": &c.SlotState, "capture_check": &c.Check,
		"capture_slot_check": &c.SlotCheck, "capture_create_publication": &c.CreatePublication,
		"capture_create_slot": &c.CreateSlot, "capture_drop_slot": &c.DropSlot,
	} {
		if *dst, err = render(name, data); err != nil {
			return Capture{}, err
		}
	}
	return c, nil
}
