package outboxdb

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Execer runs a statement: a pool, a connection, or the application's
// transaction a producer writes in.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Producer is the producer's statement on one schema's outbox
// (sql/produce.sql).
type Producer struct{ insert, emit string }

// NewProducer renders the producer's statement for schemaName (default
// "public").
func NewProducer(schemaName string) (Producer, error) {
	n, err := quoted(schemaName)
	if err != nil {
		return Producer{}, err
	}
	var p Producer
	if p.insert, err = render("produce", n); err != nil {
		return Producer{}, err
	}
	p.emit, err = render("emit", n)
	return p, err
}

// Messages are the columns of the messages one write inserts, an element
// of each a message, in delivery order.
type Messages struct {
	EventIDs []uuid.UUID
	Topics   []string
	Keys     []pgtype.Text
	Payloads [][]byte
	Headers  []string // JSON objects
	DelaysUS []int64  // from the database's clock, in microseconds
}

// Insert writes m in one statement through db.
func (p Producer) Insert(ctx context.Context, db Execer, m Messages) error {
	_, err := db.Exec(ctx, p.insert, m.EventIDs, m.Topics, m.Keys, m.Payloads, m.Headers, m.DelaysUS)
	return err
}

// Emit writes m into the write-ahead log through db, one logical decoding
// message each (the schema's outbox_emit), in one statement. m.DelaysUS
// is not read: a message in the log has no delay.
func (p Producer) Emit(ctx context.Context, db Execer, m Messages) error {
	_, err := db.Exec(ctx, p.emit, m.EventIDs, m.Topics, m.Keys, m.Payloads, m.Headers)
	return err
}
