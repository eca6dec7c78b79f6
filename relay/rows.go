package relay

import (
	"context"
	"sync/atomic"

	"github.com/outbox-relay/outbox-relay/relay/logsource"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// RowSource is where an outbox's workers take their rows and where they
// hand them back settled: the outbox table's claims (tableRows), and any
// other source of rows, such as the write-ahead log, without a change to
// flow control, routing or the sinks. ARCHITECTURE.md states its
// contract: the order of the rows, how long a batch holds them, and what
// settled means.
type RowSource interface {
	// Claim takes a batch of ready rows as p asks, held for the worker
	// until it settles them (Complete) or gives them back (Release).
	Claim(ctx context.Context, p store.ClaimParams) (Claimed, error)
	// SpareConns is how many more claims or write-backs could start now
	// without waiting: a worker claims its next batch ahead only with two
	// to spare.
	SpareConns() int
	// ReleaseHeld makes ready now the rows a destination held, without
	// an attempt, while it or a topic or partition of it was down, and
	// those held behind them for their keys, once it answers again; rows
	// settled or attempted since stay as they are. It returns how many
	// it made ready.
	ReleaseHeld(ctx context.Context, rows []store.HeldRow) (int64, error)
}

// Claimed is a batch of rows a RowSource handed out.
type Claimed interface {
	// Rows are its rows and what the source saw beyond them.
	Rows() *store.Batch
	// Complete settles the batch: every outcome durably at once, or none.
	// A row without an outcome stays as it was, ready again.
	Complete(ctx context.Context, outcomes []store.Outcome) error
	// Release gives the batch back unsettled: its rows stay as they were.
	Release(ctx context.Context) error
}

// tableRows is the outbox table's RowSource: the store's claims.
type tableRows struct{ *store.Store }

func (t tableRows) Claim(ctx context.Context, p store.ClaimParams) (Claimed, error) {
	c, err := t.Store.Claim(ctx, p)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// logRows is an outbox captured from the write-ahead log: batches of the
// messages its slot streams (to the replica that holds the slot) and of
// its table, where messages that must wait went. The log goes first, the
// table every fourth claim and whenever the log has nothing, so that
// neither starves the other.
type logRows struct {
	tableRows
	log  *logsource.Source
	turn atomic.Uint32
}

func (l *logRows) Claim(ctx context.Context, p store.ClaimParams) (Claimed, error) {
	tableFirst := l.turn.Add(1)%4 == 0
	if tableFirst {
		c, err := l.tableRows.Claim(ctx, p)
		if err != nil || !empty(c) {
			return c, err
		}
		if err := c.Release(ctx); err != nil {
			return nil, err
		}
	}
	b, err := l.log.Claim(ctx, p)
	if err != nil {
		return nil, err
	}
	if !empty(b) || tableFirst {
		return b, nil
	}
	if err := b.Release(ctx); err != nil {
		return nil, err
	}
	return l.tableRows.Claim(ctx, p)
}

// empty says c holds nothing to deliver or write back.
func empty(c Claimed) bool {
	r := c.Rows()
	return len(r.Records) == 0 && r.Deferred == 0
}
