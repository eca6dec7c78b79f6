package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// byTopic records acknowledged ids per topic, in publish order: each
// outbox of these tests writes topics of its own, and ids repeat between
// outboxes.
type byTopic struct {
	mu    sync.Mutex
	ids   map[string][]int64
	delay time.Duration
	// at, when set, is called with the counts after each publish.
	at func(counts map[string]int)
}

func (p *byTopic) Publish(ctx context.Context, recs []sink.Record) []error {
	if p.delay > 0 {
		// The destination's round trip: what makes turns worth having.
		time.Sleep(p.delay)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ids == nil {
		p.ids = map[string][]int64{}
	}
	for _, r := range recs {
		p.ids[r.Topic] = append(p.ids[r.Topic], r.ID)
	}
	if p.at != nil {
		counts := map[string]int{}
		for t, ids := range p.ids {
			counts[t] = len(ids)
		}
		p.at(counts)
	}
	return make([]error, len(recs))
}

func (p *byTopic) count(topic string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ids[topic])
}

// distinct counts the rows of topic published at least once: a batch whose
// write-back a database stop cut off is published again.
func (p *byTopic) distinct(topic string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[int64]bool{}
	for _, id := range p.ids[topic] {
		seen[id] = true
	}
	return len(seen)
}

func (p *byTopic) published(topic string) []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.ids[topic]...)
}

// runOutboxes runs one relay over the schemas, outbox i named after
// names[i]; each schema gets workers[i] workers (0: the relay's).
func runOutboxes(t *testing.T, cfg relay.Config, pub sink.Publisher, names []string, schemas []*pgtest.Schema, workers []int) *relay.Relay {
	t.Helper()
	for i, s := range schemas {
		st, err := store.New(s.Pool, store.Config{Schema: s.Name})
		if err != nil {
			t.Fatal(err)
		}
		o := relay.Outbox{Name: names[i], Store: st}
		if workers != nil {
			o.Workers = workers[i]
		}
		cfg.Outboxes = append(cfg.Outboxes, o)
	}
	cfg.Publisher = pub
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay.Run: %v", err)
		}
	})
	return r
}

// keyed inserts n rows of topic over 20 keys.
func keyed(t *testing.T, s *pgtest.Schema, topic string, n int) {
	t.Helper()
	insert(t, s, `INSERT INTO outbox (topic, key, payload)
		SELECT $1, 'k' || (g % 20), g::text::bytea FROM generate_series(1, $2::int) g`, topic, n)
}

// One relay delivers two schemas of one database and a schema of
// another, each in per-key order, and counts each outbox's work apart.
func TestSeveralOutboxes(t *testing.T) {
	t.Parallel()
	a, b := pgtest.NewSchema(t), pgtest.NewSchema(t)
	c := pgtest.NewSchemaIn(t, pgtest.NewDatabase(t))
	schemas := []*pgtest.Schema{a, b, c}
	names := []string{"tenant_a", "tenant_b", "shard-2"}
	for i, s := range schemas {
		keyed(t, s, names[i], 1000+500*i)
	}
	pub := &byTopic{}
	r := runOutboxes(t, relay.Config{Workers: 3, BatchSize: 100}, pub, names, schemas, nil)
	for i, s := range schemas {
		testwait.For(t, names[i]+" to drain", func() bool { return count(t, s.Pool, "true") == 0 })
	}
	for i, name := range names {
		if got, want := pub.count(name), 1000+500*i; got != want {
			t.Errorf("%s: %d rows published, want %d", name, got, want)
		}
	}
	// A batch is counted once its write-back has committed: the table may
	// be empty a moment before the last one is.
	testwait.For(t, "every delivery counted", func() bool { return r.Stats().Delivered >= 4500 })
	for i, st := range r.Outboxes() {
		if st.Name != names[i] || st.Stats.Delivered != int64(1000+500*i) {
			t.Errorf("outbox %d: %s delivered %d, want %s delivered %d", i, st.Name, st.Stats.Delivered, names[i], 1000+500*i)
		}
	}
	if got := r.Stats().Delivered; got != 4500 {
		t.Errorf("Stats().Delivered = %d, want 4500", got)
	}
	// Keys are per outbox: the same key names in each are separate keys.
	for _, name := range names {
		ids := pub.published(name)
		last := map[int64]int64{}
		for _, id := range ids {
			k := id % 20
			if id < last[k] {
				t.Fatalf("%s: key k%d: id %d published after %d", name, k, id, last[k])
			}
			last[k] = id
		}
	}
}

// An outbox with a large backlog and many workers takes only its share
// of the relay's workers while another outbox has work: both drain at
// the same pace until the smaller one is done.
func TestBusyOutboxTakesOnlyItsShare(t *testing.T) {
	t.Parallel()
	big, small := pgtest.NewSchema(t), pgtest.NewSchema(t)
	// Rows without keys, so that every worker of an outbox can take a
	// batch at once.
	for s, n := range map[*pgtest.Schema]int{big: 20000, small: 2000} {
		insert(t, s, `INSERT INTO outbox (topic, payload) SELECT $1, 'x' FROM generate_series(1, $2::int)`,
			map[*pgtest.Schema]string{big: "big", small: "small"}[s], n)
	}
	// What the big outbox published from the small one's first batch to
	// its last: before the small one's workers first claim (later than
	// the big one's, on a busy machine), the big one has every turn.
	bigWhenSmallDone := make(chan int, 1)
	bigAtStart := -1 // under pub's lock
	pub := &byTopic{delay: 50 * time.Millisecond, at: func(counts map[string]int) {
		if bigAtStart < 0 && counts["small"] > 0 {
			bigAtStart = counts["big"]
		}
		if counts["small"] == 2000 {
			select {
			case bigWhenSmallDone <- counts["big"] - bigAtStart:
			default:
			}
		}
	}}
	// The big outbox runs six workers, the small one two; two publish at
	// a time. Served first come first served, the big one publishes about
	// twice as many rows.
	runOutboxes(t, relay.Config{Workers: 2, BatchSize: 50}, pub, []string{"big", "small"},
		[]*pgtest.Schema{big, small}, []int{6, 2})
	var bigDone int
	select {
	case bigDone = <-bigWhenSmallDone:
	case <-time.After(time.Minute):
		t.Fatalf("the small outbox did not drain within a minute: %d of 2000", pub.count("small"))
	}
	// A fair share is one turn each: as many rows each, give or take the
	// batches under way when both began. (Without turns, about twice as
	// many.)
	if bigDone > 3000 {
		t.Fatalf("the big outbox published %d rows while the small one published its 2000: more than its share", bigDone)
	}
	t.Logf("big outbox: %d rows while the small one published 2000", bigDone)
}

// A database that is down holds only its own outbox: the other keeps
// delivering, and the stopped one catches up once its database is back.
func TestDownDatabaseHoldsOnlyItsOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := pgtest.NewServer(t)
	down := pgtest.NewSchemaIn(t, srv.DSN("postgres"))
	up := pgtest.NewSchema(t)
	keyed(t, down, "down", 100)
	pub := &byTopic{}
	runOutboxes(t, relay.Config{Workers: 2, BatchSize: 100, QueryTimeout: 2 * time.Second}, pub,
		[]string{"down", "up"}, []*pgtest.Schema{down, up}, nil)
	testwait.For(t, "the first outbox's rows", func() bool { return pub.distinct("down") == 100 })
	if err := srv.Halt(ctx); err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		keyed(t, up, "up", 200)
		want := 200 * (round + 1)
		testwait.For(t, fmt.Sprintf("%d rows of the outbox whose database is up", want), func() bool { return pub.count("up") == want })
	}
	if err := srv.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	keyed(t, down, "down", 100)
	// A worker backs off while its database is down, up to 30s between
	// claims, and may be asleep when it comes back.
	testwait.State(t, time.Minute, func() (bool, string) {
		n := pub.distinct("down")
		return n == 200, fmt.Sprintf("the stopped outbox did not catch up: %d of 200 rows published, %d pending", n, count(t, down.Pool, "true"))
	})
}
