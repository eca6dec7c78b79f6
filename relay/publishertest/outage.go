package publishertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// outageProbes is how many publishes, one a relay's probe each, go to
// the stopped server after the first, before it starts again.
const outageProbes = 3

// failFastWithin bounds a publish to a server that is down: a probe must
// find out, not wait out the relay's publish timeout.
const failFastWithin = 5 * time.Second

// serverStopped publishes while the destination's server is stopped, and
// once it is back. While it is down, every record fails as the
// destination's failure, never permanently, and each publish fails fast,
// so that the relay's breaker opens, its probes stay light and no row is
// dead-lettered. Once it is back, the first publish, the relay's next
// probe, is delivered: the sink reconnects when asked to publish, not on
// a schedule of its own that would hold the destination shut for another
// cool-down.
func serverStopped(t *testing.T, s Sink) {
	d, stop, start := s.Stoppable(t)
	id := int64(0)
	batch := func() []sink.Record {
		recs := []sink.Record{record(id+1, TopicA, "k"), record(id+2, TopicA, "k"), record(id+3, TopicB, "")}
		id += 3
		return recs
	}
	var sent []sink.Record
	before := batch()
	for i, err := range publish(t, d.Publisher, before) {
		if err != nil {
			t.Fatalf("record %d before the server stopped: %v", before[i].ID, err)
		}
	}
	sent = append(sent, before...)
	ping(t, s, d.Publisher, true)
	stop(t)
	ping(t, s, d.Publisher, false)
	for probe := range outageProbes + 1 {
		recs := batch()
		began := time.Now()
		errs := publish(t, d.Publisher, recs)
		// The first publish may meet a connection the client does not
		// know is gone yet, and wait for its answer (an acknowledgement's
		// timeout), as a publish under way when a server dies does. The
		// probes after it must not.
		if took := time.Since(began); probe > 0 && took > failFastWithin {
			t.Errorf("a publish while the server is down took %s, want at most %s", took.Round(time.Millisecond), failFastWithin)
		}
		for i, err := range errs {
			switch ce := sink.Classify(err); {
			case err == nil:
				t.Fatalf("record %d acknowledged while the server is down", recs[i].ID)
			case errors.Is(err, sink.ErrNotSent):
			case ce.Class == sink.ClassPermanent || ce.Scope != sink.ScopeDestination:
				t.Errorf("record %d while the server is down: %v classified %s with scope %s, want the destination's failure",
					recs[i].ID, err, ce.Class, ce.Scope)
			}
		}
	}
	start(t)
	ping(t, s, d.Publisher, true)
	after := batch()
	for i, err := range publish(t, d.Publisher, after) {
		if err != nil {
			t.Fatalf("record %d, in the first publish once the server is back: %v", after[i].ID, err)
		}
	}
	sent = append(sent, after...)
	count := accepted(t, d, sent)
	for _, r := range sent {
		if count[r.ID] == 0 {
			t.Errorf("record %d acknowledged but not in the destination", r.ID)
		}
	}
}

// ping checks, for a sink that pings, that p's ping answers when up says
// the server does, and fails fast when it does not.
func ping(t *testing.T, s Sink, p sink.Publisher, up bool) {
	t.Helper()
	if !s.Pings {
		return
	}
	pg, ok := p.(sink.Pinger)
	if !ok {
		t.Fatalf("the sink pings, but its publisher %T is no sink.Pinger", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	began := time.Now()
	err := pg.Ping(ctx)
	switch took := time.Since(began); {
	case up && err != nil:
		t.Errorf("ping of a server that is up: %v", err)
	case !up && err == nil:
		t.Error("ping of a server that is down answered")
	case !up && took > failFastWithin:
		t.Errorf("ping of a server that is down took %s, want at most %s", took.Round(time.Millisecond), failFastWithin)
	}
}
