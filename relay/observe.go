package relay

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/flow"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Observer is told what the relay does, for metrics. The workers call it
// concurrently; its methods must be quick.
type Observer interface {
	// Claimed reports one claim query: how long it took and how many
	// rows it returned.
	Claimed(elapsed time.Duration, rows int)
	// Settled reports one row's outcome once it is written back: the
	// destination ("" when the row never got one), the kind, the
	// dead-letter reason or the Defer* reason, and for a sent row the
	// time from its creation to the destination's acknowledgement, by
	// the database clock.
	Settled(destination string, kind store.OutcomeKind, reason string, lag time.Duration)
}

// Why rows are deferred (Observer.Settled's reason for Deferred rows), as
// package flow defines them.
const (
	DeferKeyWaiting         = flow.DeferKeyWaiting
	DeferCircuitOpen        = flow.DeferCircuitOpen
	DeferRetryBudget        = flow.DeferRetryBudget
	DeferDestinationFailing = flow.DeferDestinationFailing
	DeferTopicPaused        = flow.DeferTopicPaused
	DeferPartitionPaused    = flow.DeferPartitionPaused
)

// Stats counts what the relay did. Read it with Relay.Stats.
type Stats struct {
	// Claims counts claim queries; Batches those that found rows.
	Claims, Batches, Delivered, Retried, Deferred, DeadLettered int64
}

// tally counts what the relay did, for Stats, tells the Observer, and logs
// every row dead-lettered.
type tally struct {
	obs Observer
	log *slog.Logger

	claims, batches, delivered, retried, deferred, deadLettered atomic.Int64
}

// claimed counts one claim query that returned rows rows.
func (t *tally) claimed(elapsed time.Duration, rows int) {
	t.claims.Add(1)
	if t.obs != nil {
		t.obs.Claimed(elapsed, rows)
	}
}

// settled counts written-back outcomes of groups, and rows the claim
// deferred behind a waiting row of their key; recs are the rows the
// outcomes are about.
func (t *tally) settled(outcomes []store.Outcome, groups []*flow.Group, recs []sink.Record, deferredByClaim int) {
	t.count(outcomes, deferredByClaim)
	t.observe(outcomes, groups, deferredByClaim)
	t.logDeadLetters(outcomes, recs)
}

// logDeadLetters logs each dead-lettered outcome once it is written back,
// whoever decided it: the planner (a row undeliverable as it is, or without
// a route) or a destination's settling.
func (t *tally) logDeadLetters(outcomes []store.Outcome, recs []sink.Record) {
	var byID map[int64]*sink.Record
	for _, o := range outcomes {
		if o.Kind != store.DeadLettered || t.log == nil {
			continue
		}
		if byID == nil {
			byID = make(map[int64]*sink.Record, len(recs))
			for i := range recs {
				byID[recs[i].ID] = &recs[i]
			}
		}
		attrs := []any{slog.Int64("id", o.ID), slog.String("reason", o.Reason), slog.String("error", o.Error)}
		if o.Destination != "" {
			attrs = append(attrs, slog.String("destination", o.Destination))
		}
		if rec := byID[o.ID]; rec != nil {
			attempts := rec.RetryCount
			if o.Attempted {
				attempts++
			}
			attrs = append(attrs, slog.String("topic", rec.Topic), slog.Int("attempts", attempts))
		}
		t.log.Warn("row dead-lettered", attrs...)
	}
}

func (s *Stats) add(o Stats) {
	s.Claims += o.Claims
	s.Batches += o.Batches
	s.Delivered += o.Delivered
	s.Retried += o.Retried
	s.Deferred += o.Deferred
	s.DeadLettered += o.DeadLettered
}

func (t *tally) stats() Stats {
	return Stats{
		Claims:       t.claims.Load(),
		Batches:      t.batches.Load(),
		Delivered:    t.delivered.Load(),
		Retried:      t.retried.Load(),
		Deferred:     t.deferred.Load(),
		DeadLettered: t.deadLettered.Load(),
	}
}

// observe tells the observer of written-back outcomes, and of rows the
// claim deferred behind a waiting row of their key.
func (t *tally) observe(outcomes []store.Outcome, groups []*flow.Group, deferredByClaim int) {
	if t.obs == nil {
		return
	}
	for range deferredByClaim {
		t.obs.Settled("", store.Deferred, DeferKeyWaiting, 0)
	}
	var lag map[int64]time.Duration
	for _, g := range groups {
		acked := g.Acked()
		for _, rec := range g.Recs {
			if lag == nil {
				lag = make(map[int64]time.Duration, len(outcomes))
			}
			lag[rec.ID] = acked.Sub(rec.CreatedAt)
		}
	}
	for _, o := range outcomes {
		switch o.Kind {
		case store.Leased: // told when its delivery is done
		case store.Sent:
			t.obs.Settled(o.Destination, o.Kind, "", max(lag[o.ID], 0))
		default:
			t.obs.Settled(o.Destination, o.Kind, o.Reason, 0)
		}
	}
}

func (t *tally) count(outcomes []store.Outcome, deferredByClaim int) {
	t.deferred.Add(int64(deferredByClaim))
	for _, o := range outcomes {
		switch o.Kind {
		case store.Sent:
			t.delivered.Add(1)
		case store.Retried:
			t.retried.Add(1)
		case store.Deferred:
			t.deferred.Add(1)
		case store.DeadLettered:
			t.deadLettered.Add(1)
		}
	}
}
