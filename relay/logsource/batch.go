package logsource

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Batch is a batch of messages read from the log, held for one worker
// until Complete or Release.
type Batch struct {
	store.Batch
	src  *Source
	gen  uint64
	msgs []*message // in Records' order
}

// Rows returns what the batch took.
func (b *Batch) Rows() *store.Batch { return &b.Batch }

// Claim takes a batch of messages read from the log, as p asks, in commit
// order, held until Complete or Release; messages that must wait behind
// their keys' rows in the table, or whose destination takes none now
// (p.ExcludeTopics), are written into the table instead. A replica that
// does not hold the slot takes none.
func (s *Source) Claim(ctx context.Context, p store.ClaimParams) (*Batch, error) {
	pk := s.q.take(max(p.Limit, 1), p.ExcludeKeys, p.ExcludeTopics)
	b := &Batch{src: s, gen: pk.gen}
	b.Now = time.Now()
	if len(pk.batch)+len(pk.table)+len(pk.waiting) == 0 {
		b.SkippedKeys = pk.skipped
		return b, nil
	}
	taken := slices.Concat(pk.batch, pk.table, pk.waiting)
	fail := func(err error) (*Batch, error) {
		s.q.settle(pk.gen, taken, false)
		return nil, err
	}
	// A key with rows in the table follows them there.
	var keys []string
	for _, m := range pk.batch {
		if m.Record.HasKey {
			keys = append(keys, m.Record.Key)
		}
	}
	inTable, err := s.store.KeysInTable(ctx, keys)
	if err != nil {
		return fail(err)
	}
	deliver := pk.batch[:0:0]
	for _, m := range pk.batch {
		if m.Record.HasKey && inTable[m.Record.Key] {
			pk.table = append(pk.table, m)
		} else {
			deliver = append(deliver, m)
		}
	}
	if err := s.reserve(ctx, taken); err != nil {
		return fail(err)
	}
	if len(pk.table)+len(pk.waiting) > 0 {
		wait := max(p.ExcludeFor, time.Millisecond)
		var msgs []store.Message
		var outcomes []store.Outcome
		for _, m := range pk.table {
			msgs = append(msgs, m.Message)
		}
		for _, m := range pk.waiting {
			msgs = append(msgs, m.Message)
			outcomes = append(outcomes, store.Outcome{ID: m.Record.ID, Kind: store.Deferred, Delay: wait})
		}
		if _, err := s.store.Adopt(ctx, msgs, outcomes); err != nil {
			return fail(err)
		}
		s.q.settle(pk.gen, slices.Concat(pk.table, pk.waiting), true)
		b.Deferred = len(msgs)
	}
	slices.SortFunc(deliver, func(x, y *message) int { return cmp.Compare(x.Record.ID, y.Record.ID) })
	b.msgs = deliver
	for _, m := range deliver {
		b.Records = append(b.Records, record(m, p.PayloadCap))
	}
	b.Claimed = len(taken)
	b.Full = pk.more
	b.Skipped = len(pk.skipped)
	b.SkippedKeys = pk.skipped
	return b, nil
}

// reserve gives the messages that have none an id from the table's, in
// commit order: a key's later messages get higher ids.
func (s *Source) reserve(ctx context.Context, msgs []*message) error {
	msgs = slices.Clone(msgs)
	slices.SortFunc(msgs, func(x, y *message) int { return cmp.Compare(x.seq, y.seq) })
	n := 0
	for _, m := range msgs {
		if m.Record.ID == 0 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	ids, err := s.store.ReserveIDs(ctx, n)
	if err != nil {
		return err
	}
	if len(ids) != n {
		return fmt.Errorf("reserved %d ids, asked for %d", len(ids), n)
	}
	slices.Sort(ids)
	for _, m := range msgs {
		if m.Record.ID == 0 {
			m.Record.ID, ids = ids[0], ids[1:]
		}
	}
	return nil
}

// record is m as a batch hands it out: without its payload above the cap.
func record(m *message, payloadCap int) sink.Record {
	r := m.Record
	r.Payload, r.PayloadSize = m.Payload, len(m.Payload)
	if payloadCap > 0 && r.PayloadSize > payloadCap && r.Undeliverable == "" {
		r.Payload = nil
		r.Undeliverable = fmt.Sprintf("payload is %d bytes, above the %d-byte cap", r.PayloadSize, payloadCap)
		r.UndeliverableReason = sink.ReasonTooLarge
	}
	return r
}

// Complete settles the batch: sent messages are done, the others are
// written into the table with their outcomes (durably, all at once, or
// none), and messages without an outcome are ready again. Only then may
// their position be confirmed.
func (b *Batch) Complete(ctx context.Context, outcomes []store.Outcome) error {
	byID := make(map[int64]*message, len(b.msgs))
	for _, m := range b.msgs {
		byID[m.Record.ID] = m
	}
	var done []*message
	var adopt []store.Message
	var written []store.Outcome
	for _, o := range outcomes {
		m, ok := byID[o.ID]
		if !ok {
			continue
		}
		delete(byID, o.ID)
		done = append(done, m)
		if o.Kind != store.Sent {
			adopt = append(adopt, m.Message)
			written = append(written, o)
		}
	}
	if len(adopt) > 0 {
		expiry, err := b.src.store.Adopt(ctx, adopt, written)
		if err != nil {
			b.src.q.settle(b.gen, b.msgs, false)
			return err
		}
		b.LeaseExpiry = expiry
	}
	var back []*message
	for _, m := range b.msgs {
		if _, left := byID[m.Record.ID]; left {
			back = append(back, m)
		}
	}
	b.src.q.settle(b.gen, done, true)
	b.src.q.settle(b.gen, back, false)
	return nil
}

// toldWait bounds how long a batch waits for the stream to tell the server
// where the batches before it left the slot.
const toldWait = 20 * time.Millisecond

// WaitTold waits, briefly, until the server has been told the position the
// batches settled before this one moved the slot to, as the stream does
// within milliseconds: a crash while this batch is published then
// delivers this batch again, not the one before it too.
func (b *Batch) WaitTold(ctx context.Context) { b.src.q.waitTold(ctx, toldWait) }

// Release gives the batch back: its messages are ready again.
func (b *Batch) Release(context.Context) error {
	b.src.q.settle(b.gen, b.msgs, false)
	return nil
}
