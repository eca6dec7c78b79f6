package outboxdb

import (
	"context"
	"time"
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

// Ahead is the earlier row of a pending row's key that holds it back.
type Ahead struct {
	ID     int64
	Topic  string
	Status string
	Parked bool
}

// FindRow returns the row r names and, for a pending row, the first
// earlier row of its key that is pending or parked (nil when none).
// pgx.ErrNoRows if there is none. Statement: find_row.
func (q *Queries) FindRow(ctx context.Context, db DB, r Ref) (Found, *Ahead, error) {
	id, ev := r.args()
	var f Found
	var aheadID *int64
	var aheadTopic, aheadStatus *string
	var aheadParked *bool
	l, err := scanLetter(db.QueryRow(ctx, q.findRow, id, ev), &f.History, &f.SentAt, &f.DiscardedAt, &f.Leased, &f.Now,
		&aheadID, &aheadTopic, &aheadStatus, &aheadParked)
	if err != nil {
		return f, nil, err
	}
	f.Letter = l
	if aheadID == nil {
		return f, nil, nil
	}
	return f, &Ahead{ID: *aheadID, Topic: *aheadTopic, Status: *aheadStatus, Parked: *aheadParked}, nil
}

// KeyRows returns up to limit of key's pending, dead-lettered and
// discarded rows, in id order. Statement: key_rows.
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
