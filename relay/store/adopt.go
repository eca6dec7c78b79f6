package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// The table's side of another source of rows (the write-ahead log): the
// ids its messages are delivered under, whether the table holds their
// keys, and writing into the table the messages that must wait there.

// ReserveIDs takes n ids from the outbox table's identity. A message of
// another source delivered under one keeps it if it is written into the
// table (Adopt), and the ids of a key's later messages are higher.
func (s *Store) ReserveIDs(ctx context.Context, n int) ([]int64, error) {
	ids, err := s.q.ReserveIDs(ctx, s.pool, n)
	if err != nil {
		return nil, fmt.Errorf("reserve %d ids: %w", n, err)
	}
	return ids, nil
}

// KeysInTable returns which of keys have rows in the table that go first:
// pending ones (waiting, ready or in flight), or a dead letter that parks
// the key. A message of such a key from another source is written into
// the table behind them (Adopt), not delivered.
func (s *Store) KeysInTable(ctx context.Context, keys []string) (map[string]bool, error) {
	held := map[string]bool{}
	if len(keys) == 0 {
		return held, nil
	}
	found, err := s.q.KeysInTable(ctx, s.pool, keys)
	if err != nil {
		return nil, fmt.Errorf("look for %d keys in the table: %w", len(keys), err)
	}
	for _, k := range found {
		held[k] = true
	}
	return held, nil
}

// Message is a message of another source, whole: its Record as handed
// out, with its payload and headers as written.
type Message struct {
	Record  sink.Record
	Payload []byte // whole, whatever the payload cap
	Headers []byte // a JSON object; empty for none
}

// Adopt writes messages of another source into the table, durably (the
// commit waits for the WAL flush: the source forgets them once it
// returns), as pending rows under their Records' ids, ready now; then
// writes the outcomes given for some of them over those rows, as a
// claim's Complete does (no outcome: ready now). Sent outcomes are not
// written: a sent message is not adopted. A message whose event id the
// table already holds keeps that row, and its outcome is not written. It
// returns when each Leased row's lease ends.
func (s *Store) Adopt(ctx context.Context, msgs []Message, outcomes []Outcome) (map[int64]time.Time, error) {
	var a outboxdb.Adopted
	for _, m := range msgs {
		r := m.Record
		headers := string(m.Headers)
		if headers == "" {
			headers = "{}"
		}
		a.IDs = append(a.IDs, r.ID)
		a.EventIDs = append(a.EventIDs, r.EventID)
		a.Topics = append(a.Topics, r.Topic)
		a.Keys = append(a.Keys, pgtype.Text{String: r.Key, Valid: r.HasKey})
		a.Payloads = append(a.Payloads, m.Payload)
		a.Headers = append(a.Headers, headers)
		a.CreatedAts = append(a.CreatedAts, r.CreatedAt)
	}
	if a.Len() == 0 {
		return nil, nil
	}
	var expiry map[int64]time.Time
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var now time.Time
		if err := tx.QueryRow(ctx, outboxdb.Now).Scan(&now); err != nil {
			return err
		}
		b := &pgx.Batch{}
		s.q.QueueAdopt(b, &a)
		var w writes
		for _, o := range outcomes {
			if o.Kind != Sent {
				w.add(o, now)
			}
		}
		expiry = w.queue(s.q, b, s.errorHistory)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, fmt.Errorf("write %d messages into the table: %w", a.Len(), err)
	}
	return expiry, nil
}
