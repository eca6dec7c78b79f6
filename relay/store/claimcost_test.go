package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// What a claim reads is bounded by the batch, not by the backlog: a key's
// rows pending behind the claim (one hot key, 100k rows, fresh or waiting
// for a retry) cost its statements no more than a few batches' worth do.
// Each order scope, both key check forms, and strict order claim the same
// pattern a worker does: a batch, the next one claimed ahead behind it,
// and another worker's claim that meets the key in flight, in turn. A
// statement that reads a key's rows up to its end (an index bound that does
// not stop the scan, a lateral probe the planner flattens into a join)
// reads the whole backlog at every claim.
func TestHotKeyClaimsReadTheBatchNotTheBacklog(t *testing.T) {
	t.Parallel()
	const batch, few, many = 100, 2_000, 100_000
	for _, waiting := range []bool{false, true} {
		name := "fresh rows"
		if waiting {
			name = "rows waiting for a retry"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			small, large := newHotKeyBacklog(t, few, waiting), newHotKeyBacklog(t, many, waiting)
			for _, strict := range []bool{false, true} {
				for _, scope := range hotKeyScopes {
					for _, form := range []store.KeyCheckForm{store.KeyCheckBySpan, store.KeyCheckByKey} {
						run := fmt.Sprintf("strict %v, %s scope, key check %v", strict, scope.name, form)
						a := small.drain(t, batch, strict, scope.of, form)
						b := large.drain(t, batch, strict, scope.of, form)
						if a.claimed == 0 || b.claimed == 0 {
							t.Fatalf("%s: %d rows claimed from %d pending, %d from %d", run, a.claimed, few, b.claimed, many)
						}
						// The key check's reads, a statement: bounded by the batch.
						per := func(d hotKeyDrain) float64 {
							if d.keyCheck.Calls == 0 {
								t.Fatalf("%s: no key check seen (a statement on the outbox with %q)", run, keyCheckPart)
							}
							return float64(d.keyCheck.Blocks) / float64(d.keyCheck.Calls)
						}
						t.Logf("%s: key check %.0f buffers with %d pending, %.0f with %d; every statement %.1f and %.1f a claimed row",
							run, per(a), few, per(b), many, float64(a.all.Blocks)/float64(a.claimed), float64(b.all.Blocks)/float64(b.claimed))
						if per(b) > 2*per(a)+10 {
							t.Errorf("%s: the key check read %.0f buffers with %d rows of the key pending, %.0f with %d: it reads the backlog",
								run, per(b), many, per(a), few)
						}
					}
				}
			}
		})
	}
}

var hotKeyScopes = []struct {
	name string
	of   func(topic string) string
}{
	{"global", nil},
	{"destination", func(topic string) string {
		if topic == "c" {
			return "webhook"
		}
		return "kafka"
	}},
	{"topic", func(topic string) string { return topic }},
}

// hotKeyBacklog is an outbox whose pending rows all share one key, spread
// over three topics, topped up to the same count before each drain.
type hotKeyBacklog struct {
	s       *pgtest.Schema
	pending int
	waiting bool
}

func newHotKeyBacklog(t *testing.T, pending int, waiting bool) *hotKeyBacklog {
	return &hotKeyBacklog{s: pgtest.NewSchema(t), pending: pending, waiting: waiting}
}

// hotKeyDrain is what one drain claimed and what its statements cost.
type hotKeyDrain struct {
	claimed  int
	keyCheck pgtest.Cost // the key checks'
	all      pgtest.Cost // every statement's on the outbox
}

// keyCheckPart is in every form of the key check: the claimed keys, as a
// relation.
const keyCheckPart = "AS c(key, id)"

// drain tops the backlog up, then claims as a worker does while another
// one looks for rows: batch after batch, each claimed ahead behind the one
// before, and between them another worker's claim, which finds the key in
// flight. It returns the rows claimed and what every statement on the
// outbox cost meanwhile.
func (b *hotKeyBacklog) drain(t *testing.T, batch int, strict bool, scope func(string) string, form store.KeyCheckForm) hotKeyDrain {
	t.Helper()
	ctx := context.Background()
	var n int
	if err := b.s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE status = 'pending'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	next := "now()"
	if b.waiting {
		next = "now() - interval '1 second'"
	}
	b.s.Exec(t, `INSERT INTO outbox (topic, key, payload, next_attempt_at)
		SELECT (ARRAY['a', 'b', 'c'])[g % 3 + 1], 'hot', 'p', `+next+` FROM generate_series(1, $1) AS g`, b.pending-n)
	if n == 0 {
		b.s.Exec(t, `ANALYZE outbox`)
	}
	st, err := store.New(b.s.Pool, store.Config{Schema: b.s.Name, StrictOrder: strict})
	if err != nil {
		t.Fatal(err)
	}
	store.SetKeyCheck(st, form)
	claim := func(follows *store.Claim) *store.Claim {
		t.Helper()
		p := store.ClaimParams{Limit: batch, PayloadCap: 100, OrderScope: scope}
		if follows != nil {
			for _, r := range follows.Records {
				p.Follows = append(p.Follows, store.KeyedRow{Key: r.Key, ID: r.ID})
			}
		}
		for deadline := time.Now().Add(time.Minute); ; {
			c, err := st.Claim(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Release(ctx) })
			// In strict order, a transaction anywhere in the cluster
			// (another test's) may hold every row back for a moment.
			if c.Claimed > 0 || c.HeldSince.IsZero() || time.Now().After(deadline) {
				return c
			}
			if err := c.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	deliver := func(c *store.Claim) int {
		t.Helper()
		outcomes := make([]store.Outcome, len(c.Records))
		for i, r := range c.Records {
			outcomes[i] = sent(r.ID)
		}
		complete(t, c, outcomes...)
		return len(outcomes)
	}
	before, checked := b.s.StatementCost(t, ""), b.s.StatementCost(t, keyCheckPart)
	d := hotKeyDrain{}
	current := claim(nil)
	for range 6 {
		ahead := claim(current)
		rival := claim(nil)
		if len(rival.Records) != 0 {
			t.Fatalf("another worker's claim took %d rows of the key in flight", len(rival.Records))
		}
		d.claimed += rival.Claimed
		if err := rival.Release(ctx); err != nil {
			t.Fatal(err)
		}
		d.claimed += deliver(current)
		current = ahead
	}
	d.claimed += deliver(current)
	d.all, d.keyCheck = b.s.StatementCost(t, "").Sub(before), b.s.StatementCost(t, keyCheckPart).Sub(checked)
	return d
}
