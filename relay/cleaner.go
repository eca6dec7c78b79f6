package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testsignal"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// cleanerConfig configures the cleaner.
type cleanerConfig struct {
	// SentRetention, DeadLetterRetention, DiscardedRetention and
	// AuditRetention are how long sent rows, dead letters, discarded rows
	// and audit records are kept; 0 leaves them to others (sent rows are
	// deleted as they are sent) and retry.Forever keeps them.
	SentRetention       time.Duration
	DeadLetterRetention time.Duration
	DiscardedRetention  time.Duration
	AuditRetention      time.Duration
	// Interval is how often the cleaner runs.
	Interval time.Duration
	// Timeout bounds each delete.
	Timeout time.Duration
	// BatchSize is the most rows one delete removes.
	BatchSize int
}

type cleanedBatch struct {
	What    string // "sent rows", "dead letters", "discarded rows" or "audit records"
	Deleted int64
}

// cleaner deletes sent rows, dead letters, discarded rows and audit records
// past their retention, in
// bounded batches, on one replica at a time (the store's deletes take the
// maintenance lock and report busy when another replica holds it).
type cleaner struct {
	config  cleanerConfig
	store   *store.Store
	log     *slog.Logger
	signals *testsignal.Signal[cleanedBatch] // tells tests of each delete
}

// cleanerResult is what one run deleted.
type cleanerResult struct {
	SentDeleted, DeadLettersDeleted, DiscardedDeleted, AuditDeleted int64
}

// enabled reports whether the cleaner has anything to do.
func (c *cleaner) enabled() bool {
	return kept(c.config.SentRetention) || kept(c.config.DeadLetterRetention) ||
		kept(c.config.DiscardedRetention) || kept(c.config.AuditRetention)
}

// kept reports whether rows kept for retention are cleaned up after it.
func kept(retention time.Duration) bool { return retention > 0 && retention != retry.Forever }

// run runs the cleaner every Interval until ctx ends.
func (c *cleaner) run(ctx context.Context) error {
	t := time.NewTicker(c.config.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		res := c.runOnce(ctx)
		for what, n := range map[string]int64{"sent rows": res.SentDeleted, "dead letters": res.DeadLettersDeleted,
			"discarded rows": res.DiscardedDeleted, "audit records": res.AuditDeleted} {
			if n > 0 {
				c.log.Info("deleted rows past retention", slog.String("rows", what), slog.Int64("deleted", n))
			}
		}
	}
}

// runOnce deletes what is past its retention now, batch by batch, until a
// batch comes back short or another replica holds the maintenance lock. A
// failed delete is logged and tried again at the next run.
func (c *cleaner) runOnce(ctx context.Context) cleanerResult {
	var res cleanerResult
	tasks := []struct {
		what      string
		retention time.Duration
		delete    func(context.Context, time.Duration, int) (int64, bool, error)
		total     *int64
	}{
		{"sent rows", c.config.SentRetention, c.store.DeleteSent, &res.SentDeleted},
		{"dead letters", c.config.DeadLetterRetention, c.store.DeleteExpiredDeadLetters, &res.DeadLettersDeleted},
		{"discarded rows", c.config.DiscardedRetention, c.store.DeleteDiscarded, &res.DiscardedDeleted},
		{"audit records", c.config.AuditRetention, c.store.DeleteAudit, &res.AuditDeleted},
	}
	for _, tk := range tasks {
		if !kept(tk.retention) {
			continue
		}
		for ctx.Err() == nil {
			batchCtx, cancel := context.WithTimeout(ctx, c.config.Timeout)
			n, busy, err := tk.delete(batchCtx, tk.retention, c.config.BatchSize)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					c.log.Error("cleanup failed", slog.String("rows", tk.what), slog.Any("error", err))
				}
				break
			}
			*tk.total += n
			c.signals.Send(cleanedBatch{What: tk.what, Deleted: n})
			if busy || n < int64(c.config.BatchSize) {
				break
			}
		}
	}
	return res
}
