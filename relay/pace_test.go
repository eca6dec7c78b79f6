package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// stuckTopicPublisher is a fakePublisher whose publishes of a batch with
// a row of topic stuck wait until release is closed (or their deadline).
type stuckTopicPublisher struct {
	fakePublisher
	stuck   string
	entered chan struct{} // closed when a publish gets stuck
	once    sync.Once
	release chan struct{}
}

func (p *stuckTopicPublisher) Publish(ctx context.Context, recs []sink.Record) []error {
	for _, r := range recs {
		if r.Topic == p.stuck {
			p.once.Do(func() { close(p.entered) })
			select {
			case <-p.release:
			case <-ctx.Done():
			}
			break
		}
	}
	return p.fakePublisher.Publish(ctx, recs)
}

// While the database bounds a backlog's drain, one worker takes the
// batches and the other stands by; a publish that hangs calls it, and the
// rest of the backlog goes out meanwhile.
func TestStuckPublishCallsTheWorkerStandingBy(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	pub := &stuckTopicPublisher{stuck: "stuck", entered: make(chan struct{}), release: make(chan struct{})}
	// A backlog that the database bounds (the publisher answers at once),
	// with a row whose publish hangs past its middle.
	insert(t, s, `INSERT INTO outbox (topic, key, payload)
		SELECT CASE WHEN g = 3000 THEN 'stuck' ELSE 'fast' END, g::text, 'x' FROM generate_series(1, 5000) g`)
	h := start(t, s, pub, options{cfg: relay.Config{Workers: 2, BatchSize: 100, PublishTimeout: 5 * time.Minute}})
	var release sync.Once
	unstick := func() { release.Do(func() { close(pub.release) }) }
	t.Cleanup(unstick) // before the relay stops
	<-pub.entered
	// The stuck batch and the one claimed ahead of it wait for the publish;
	// the rows past them do not.
	var stuck int64
	if err := s.Pool.QueryRow(context.Background(), `SELECT id FROM outbox WHERE topic = 'stuck'`).Scan(&stuck); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the rows past the stuck publish delivered", func() bool {
		return count(t, s.Pool, "id > $1", stuck+1000) == 0
	})
	unstick()
	testwait.For(t, "every row delivered", func() bool { return count(t, s.Pool, "true") == 0 })
	h.stop()
}
