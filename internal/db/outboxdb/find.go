package outboxdb

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Found is a row as a search finds it.
type Found struct {
	Letter
	// History is the row's error history, a JSON array.
	History             []byte
	SentAt, DiscardedAt *time.Time
	Leased              bool
	// Now is the database's clock when the row was read.
	Now time.Time
}

// KeyHolder is an earlier row of a key that can hold its later rows back.
type KeyHolder struct {
	ID     int64
	Topic  string
	Status string
	Parked bool
}

// FindRow returns the row r names; pgx.ErrNoRows if there is none.
// Statement: find_row.
func (q *Queries) FindRow(ctx context.Context, db DB, r Ref) (Found, error) {
	id, ev := r.args()
	var f Found
	l, err := scanLetter(db.QueryRow(ctx, q.findRow, id, ev), &f.History, &f.SentAt, &f.DiscardedAt, &f.Leased, &f.Now)
	f.Letter = l
	return f, err
}

// KeyHolders returns key's rows below id that are pending or parked, in
// id order, up to limit of each. Statement: key_holders.
func (q *Queries) KeyHolders(ctx context.Context, db DB, key string, below int64, limit int) ([]KeyHolder, error) {
	rows, err := db.Query(ctx, q.keyHolders, key, below, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (KeyHolder, error) {
		var h KeyHolder
		err := row.Scan(&h.ID, &h.Topic, &h.Status, &h.Parked)
		return h, err
	})
}

// KeyRows returns key's first limit pending rows and its latest limit
// dead-lettered and discarded ones, in id order. Statement: key_rows.
func (q *Queries) KeyRows(ctx context.Context, db DB, key string, limit int) ([]Found, error) {
	rows, err := db.Query(ctx, q.keyRows, key, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Found
	for rows.Next() {
		var f Found
		l, err := scanLetter(rows, &f.History, &f.SentAt, &f.DiscardedAt, &f.Leased, &f.Now)
		if err != nil {
			return nil, err
		}
		f.Letter = l
		out = append(out, f)
	}
	return out, rows.Err()
}
