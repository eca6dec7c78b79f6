package relay

import (
	"context"
	"sync/atomic"
	"time"

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

// tellingClaim is a Claimed whose source tells a server how far it got
// (a replication slot): the worker lets it catch up on the batches before
// it (WaitTold) before it publishes the batch, so that a crash delivers
// again the batch in flight, and not the one settled before it too.
type tellingClaim interface {
	WaitTold(ctx context.Context)
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
// table every fourth claim and whenever the log has nothing, but only
// when it may hold ready rows: a notification came (rows were inserted,
// by this source too), held rows were released, a claim of it last found
// some, or the poll interval passed since one found none.
type logRows struct {
	tableRows
	log  *logsource.Source
	poll time.Duration
	turn atomic.Uint32
	// notified: rows may have become ready in the table since its last
	// claim; emptyAt: when its last claim found none (0: it found some).
	notified atomic.Bool
	emptyAt  atomic.Int64
}

func (l *logRows) Claim(ctx context.Context, p store.ClaimParams) (Claimed, error) {
	tableFirst := l.turn.Add(1)%4 == 0 && l.tableDue()
	if tableFirst {
		c, err := l.claimTable(ctx, p)
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
	if !empty(b) || tableFirst || !l.tableDue() {
		return b, nil
	}
	if err := b.Release(ctx); err != nil {
		return nil, err
	}
	return l.claimTable(ctx, p)
}

// tableDue says the table may hold ready rows.
func (l *logRows) tableDue() bool {
	if l.notified.Swap(false) {
		return true
	}
	at := l.emptyAt.Load()
	return at == 0 || time.Since(time.Unix(0, at)) >= l.poll
}

// claimTable claims the table's rows, noting whether it found any.
func (l *logRows) claimTable(ctx context.Context, p store.ClaimParams) (Claimed, error) {
	c, err := l.tableRows.Claim(ctx, p)
	switch {
	case err != nil:
		l.notified.Store(true)
	case empty(c):
		l.emptyAt.Store(time.Now().UnixNano())
	default:
		l.emptyAt.Store(0)
	}
	return c, err
}

// ReleaseHeld makes the held rows ready in the table, which then has
// rows to claim.
func (l *logRows) ReleaseHeld(ctx context.Context, rows []store.HeldRow) (int64, error) {
	n, err := l.tableRows.ReleaseHeld(ctx, rows)
	l.notified.Store(true)
	return n, err
}

// empty says c holds nothing to deliver or write back.
func empty(c Claimed) bool {
	r := c.Rows()
	return len(r.Records) == 0 && r.Deferred == 0
}
