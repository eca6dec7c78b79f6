package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The xmin horizon. A row the relay deletes (or updates) stays in the table,
// and its entries in the indexes, until no transaction can still see it:
// until every snapshot older than the delete has ended. A session holding
// one open (a long report, pg_dump, a transaction left idle), a prepared
// transaction, a replication slot's xmin or a standby's hot_standby_feedback
// therefore keeps every row deleted since, and a statement that reads an
// index from its head passes over all of them. Sessions and prepared
// transactions hold the horizon of their own database only; slots and
// standbys hold every database's.

// HorizonHolder keeps deleted rows of the outbox's database from being
// removed.
type HorizonHolder struct {
	// Kind is "session", "prepared", "slot" or "standby".
	Kind string
	// PID is the backend's (a session's, a standby's walsender, an active
	// slot's); 0 for a prepared transaction or an inactive slot.
	PID int
	// Name is a prepared transaction's global id, a slot's name, or a
	// standby's application name.
	Name string
	// User, Application, State and Client (a standby's address, a slot's
	// type) describe it, where PostgreSQL shows them to the relay's role.
	User, Application, State, Client string
	// Xmin is the oldest transaction id it holds, as PostgreSQL prints it;
	// XidAge is how many transactions ago that was.
	Xmin   string
	XidAge int64
	// Age is how long its transaction has been open (a session's, shown to
	// roles with pg_read_all_stats, or a prepared transaction's); 0 when
	// PostgreSQL does not say (slots and standbys).
	Age time.Duration
}

// Identity tells holders apart: a session that ends its transaction and
// begins another is a new holder.
func (h HorizonHolder) Identity() string {
	return fmt.Sprintf("%s/%d/%s/%s", h.Kind, h.PID, h.Name, h.Xmin)
}

// Horizon is what holds the outbox database's horizon, and what it costs
// the indexes the relay reads.
type Horizon struct {
	// Holders are the oldest holders, the oldest first; at most
	// MaxHorizonHolders.
	Holders []HorizonHolder
	// Privileged says whether the relay's role sees other sessions'
	// transaction start and state (pg_read_all_stats, which pg_monitor
	// includes).
	Privileged bool
	// IndexScans, IndexEntries and IndexRows are the scans of the outbox's
	// indexes of pending rows since the statistics were reset, the entries
	// they read, and the live rows they fetched: entries read that gave no
	// row are mostly those of deleted rows.
	IndexScans, IndexEntries, IndexRows int64
}

// MaxHorizonHolders bounds the holders Horizon reports.
const MaxHorizonHolders = 10

// Horizon reports what holds the horizon of the outbox's database, and the
// statistics of the indexes the relay's claims read. It reads system views
// only: any role may, and pg_monitor shows more.
func (s *Store) Horizon(ctx context.Context) (Horizon, error) {
	var h Horizon
	b := &pgx.Batch{}
	b.Queue(s.q.Server().HorizonHolders, MaxHorizonHolders)
	b.Queue(s.q.Server().PendingIndexStats, s.table)
	res := s.pool.SendBatch(ctx, b)
	rows, err := res.Query()
	if err == nil {
		var o HorizonHolder
		var age float64
		_, err = pgx.ForEachRow(rows, []any{&o.Kind, &o.PID, &o.Name, &o.User, &o.Application, &o.State, &o.Client,
			&o.Xmin, &o.XidAge, &age}, func() error {
			o.Age = time.Duration(age * float64(time.Second))
			h.Holders = append(h.Holders, o)
			return nil
		})
	}
	if err == nil {
		err = res.QueryRow().Scan(&h.IndexScans, &h.IndexEntries, &h.IndexRows, &h.Privileged)
	}
	if err = errors.Join(err, res.Close()); err != nil {
		return Horizon{}, fmt.Errorf("read the database's xmin horizon: %w", err)
	}
	return h, nil
}
