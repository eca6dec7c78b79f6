// Package publishertest is the conformance suite of sink.Publisher: what
// the relay relies on from a sink, checked against a real destination of
// that sink. Every sink runs it from its tests; a new sink passes it before
// it is used.
//
// The suite checks: each key's records are delivered in order (every sink
// keeps a key's order: the relay's guarantee rests on it); Publish
// returns one error per record; after a key's record fails, its later
// records are not sent and are reported with sink.ErrNotSent; a record
// the destination refuses, or one too large for it, fails permanently
// (too_large for the latter) while the others go; a record's headers
// arrive with its event id, id and key under the names every sink uses;
// a record published again with its event id is kept once by a
// destination that deduplicates; a cancelled context
// fails every record without a permanent error; and a destination that
// refuses connections fails every record as the destination's failure, so
// that the breaker opens and no row is dead-lettered. Where the sink can
// give a destination a server of its own, that server is stopped (every
// publish fails fast as the destination's failure, and the first once it
// is back is delivered), and killed and started again on its data, five
// times, under a burst of publishes: no record fails for good, none is
// lost, and each key's records first arrive in order; duplicates are
// counted.
package publishertest

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// Topics the suite publishes to; a sink's destination must accept both.
const (
	TopicA = "conformance.a"
	TopicB = "conformance.b"
)

// Destination is a fresh, empty destination of the sink under test, with
// a Publisher to it.
type Destination struct {
	Publisher sink.Publisher
	// Accepted returns the payloads the destination has accepted so far,
	// in the order it accepted them (each topic's, or each partition's,
	// at least).
	Accepted func(t *testing.T) []string
	// Headers, when set, returns the headers of the messages the
	// destination accepted so far, by payload: each message's headers,
	// attributes or fields, with its key under sink.HeaderKey where the
	// destination keeps it apart (a Kafka record's key). Unset: the sink
	// carries no headers.
	Headers func(t *testing.T) map[string]map[string]string
}

// Sink tells the suite how to set up the sink under test.
type Sink struct {
	// New starts a fresh destination that accepts TopicA and TopicB.
	New func(t *testing.T) Destination
	// Reject changes rec so that the destination refuses it for good, as
	// it refuses a malformed message.
	Reject func(rec *sink.Record)
	// TooLarge changes rec so that it is larger than the destination, or
	// the sink, takes. Unset: neither has a size limit.
	TooLarge func(rec *sink.Record)
	// Deduplicates says that the destination keeps one message of
	// records published again with the same event id, as the relay
	// publishes a row again after a crash before its write-back (a NATS
	// stream's duplicate window, an SQS FIFO queue's deduplication).
	Deduplicates bool
	// Pings says that the sink's Publisher is a sink.Pinger: a ping fails
	// while the server is unreachable or stopped, and answers once it is
	// back.
	Pings bool
	// Unreachable returns a Publisher to a destination that refuses
	// connections.
	Unreachable func(t *testing.T) sink.Publisher
	// Crashable, when set, starts a destination on a server of its own
	// that keeps what it acknowledged on disk, and returns it with a
	// function that kills the server (SIGKILL: no goodbye to its clients)
	// and starts it again on the same address and data. Accepted must
	// read the destination afresh after a restart.
	Crashable func(t *testing.T) (Destination, func(t *testing.T))
	// Stoppable, when set, starts a destination on a server of its own,
	// and returns it with a function that stops the server and one that
	// starts it again on the same address and data, returning once it
	// answers.
	Stoppable func(t *testing.T) (d Destination, stop, start func(t *testing.T))
}

// Run runs the suite against s.
func Run(t *testing.T, s Sink) {
	t.Helper()
	t.Run("OrderPerKey", func(t *testing.T) { t.Parallel(); orderPerKey(t, s) })
	t.Run("OneErrorPerRecord", func(t *testing.T) { t.Parallel(); oneErrorPerRecord(t, s) })
	t.Run("FailureStopsItsKey", func(t *testing.T) { t.Parallel(); failureStopsItsKey(t, s) })
	if s.TooLarge != nil {
		t.Run("TooLarge", func(t *testing.T) { t.Parallel(); tooLarge(t, s) })
	}
	t.Run("Headers", func(t *testing.T) { t.Parallel(); headers(t, s) })
	if s.Deduplicates {
		t.Run("PublishedAgain", func(t *testing.T) { t.Parallel(); publishedAgain(t, s) })
	}
	t.Run("CancelledContext", func(t *testing.T) { t.Parallel(); cancelledContext(t, s) })
	t.Run("ConnectionRefused", func(t *testing.T) { t.Parallel(); connectionRefused(t, s) })
	if s.Stoppable != nil {
		t.Run("ServerStoppedAndBack", func(t *testing.T) { t.Parallel(); serverStopped(t, s) })
	}
	if s.Crashable != nil {
		t.Run("ServerKilledUnderABurst", func(t *testing.T) { testwait.SkipShort(t); t.Parallel(); serverKilled(t, s) })
	}
}

// publishTimeout bounds every publish of the suite.
const publishTimeout = 20 * time.Second

// record is the id'th record; its payload is its id. Its event id is its
// own, as every row's is: a destination that deduplicates by event id
// keeps each record.
func record(id int64, topic, key string) sink.Record {
	payload := []byte(strconv.FormatInt(id, 10))
	return sink.Record{ID: id, EventID: uuid.New(), Topic: topic, Key: key, HasKey: key != "", Payload: payload, PayloadSize: len(payload),
		Headers: map[string]string{"content-type": "text/plain"}, CreatedAt: time.Now()}
}

func publish(t *testing.T, p sink.Publisher, recs []sink.Record) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	errs := p.Publish(ctx, recs)
	if len(errs) != len(recs) {
		t.Fatalf("Publish returned %d errors for %d records", len(errs), len(recs))
	}
	return errs
}

// accepted returns how many times each id was accepted, and fails t when
// a key's records were accepted out of order.
func accepted(t *testing.T, d Destination, recs []sink.Record) map[int64]int {
	t.Helper()
	byID := map[int64]sink.Record{}
	for _, r := range recs {
		byID[r.ID] = r
	}
	count := map[int64]int{}
	last := map[string]int64{}
	for _, payload := range d.Accepted(t) {
		id, err := strconv.ParseInt(payload, 10, 64)
		r, ok := byID[id]
		if err != nil || !ok {
			t.Fatalf("the destination accepted %q, which the suite did not publish", payload)
		}
		count[id]++
		if r.HasKey && count[id] == 1 {
			if id < last[r.Key] {
				t.Errorf("key %s: record %d accepted after %d", r.Key, id, last[r.Key])
			}
			last[r.Key] = id
		}
	}
	return count
}

func orderPerKey(t *testing.T, s Sink) {
	d := s.New(t)
	var recs []sink.Record
	for i := range 60 {
		id := int64(i + 1)
		switch i % 4 {
		case 0, 1:
			recs = append(recs, record(id, TopicA, "k"+strconv.Itoa(i%2)))
		case 2:
			recs = append(recs, record(id, TopicB, "k2"))
		default:
			recs = append(recs, record(id, []string{TopicA, TopicB}[i%8/4], ""))
		}
	}
	for i, err := range publish(t, d.Publisher, recs) {
		if err != nil {
			t.Fatalf("record %d: %v", recs[i].ID, err)
		}
	}
	count := accepted(t, d, recs)
	for _, r := range recs {
		if count[r.ID] == 0 {
			t.Errorf("record %d acknowledged but not at the destination", r.ID)
		}
	}
}

func oneErrorPerRecord(t *testing.T, s Sink) {
	d := s.New(t)
	publish(t, d.Publisher, nil)
	publish(t, d.Publisher, []sink.Record{record(1, TopicA, "k")})
	publish(t, d.Publisher, []sink.Record{record(2, TopicA, ""), record(3, TopicB, "k"), record(4, TopicB, "")})
}

func failureStopsItsKey(t *testing.T, s Sink) {
	d := s.New(t)
	recs := []sink.Record{
		record(1, TopicA, "bad"), record(2, TopicA, "bad"), record(3, TopicA, "good"),
		record(4, TopicA, "bad"), record(5, TopicB, "bad"), record(6, TopicA, "good"),
		record(7, TopicA, ""), record(8, TopicA, ""),
	}
	change(&recs[1], s.Reject)
	change(&recs[6], s.Reject)
	errs := publish(t, d.Publisher, recs)
	want := map[int64]string{1: "sent", 2: "permanent", 3: "sent", 4: "not sent", 5: "not sent", 6: "sent", 7: "permanent", 8: "sent"}
	for i, r := range recs {
		if got := outcome(errs[i]); got != want[r.ID] {
			t.Errorf("record %d: %s (%v), want %s", r.ID, got, errs[i], want[r.ID])
		}
	}
	count := accepted(t, d, recs)
	for _, id := range []int64{2, 4, 5, 7} {
		if count[id] > 0 {
			t.Errorf("record %d reached the destination", id)
		}
	}
}

// change applies how to a record, keeping its payload size right.
func change(rec *sink.Record, how func(*sink.Record)) {
	how(rec)
	rec.PayloadSize = len(rec.Payload)
}

// outcome names what err says of a record.
func outcome(err error) string {
	switch {
	case err == nil:
		return "sent"
	case errors.Is(err, sink.ErrNotSent):
		return "not sent"
	}
	return sink.Classify(err).Class.String()
}

func tooLarge(t *testing.T, s Sink) {
	d := s.New(t)
	recs := []sink.Record{record(1, TopicA, "k"), record(2, TopicA, "k"), record(3, TopicA, ""), record(4, TopicA, "j")}
	change(&recs[1], s.TooLarge)
	errs := publish(t, d.Publisher, recs)
	ce := sink.Classify(errs[1])
	if errs[1] == nil || ce.Class != sink.ClassPermanent || ce.Reason != sink.ReasonTooLarge {
		t.Errorf("the record too large: %v (%s, reason %q), want permanent too_large", errs[1], ce.Class, ce.Reason)
	}
	for _, i := range []int{0, 2, 3} {
		if errs[i] != nil {
			t.Errorf("record %d beside the one too large: %v", recs[i].ID, errs[i])
		}
	}
}

func cancelledContext(t *testing.T, s Sink) {
	d := s.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	recs := []sink.Record{record(1, TopicA, "k"), record(2, TopicA, "k"), record(3, TopicB, "")}
	start := time.Now()
	errs := d.Publisher.Publish(ctx, recs)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Publish with a cancelled context took %s", took)
	}
	if len(errs) != len(recs) {
		t.Fatalf("Publish returned %d errors for %d records", len(errs), len(recs))
	}
	for i, err := range errs {
		if err == nil || sink.Classify(err).Class == sink.ClassPermanent {
			t.Errorf("record %d under a cancelled context: %v, want a failure that is not permanent", recs[i].ID, err)
		}
	}
	if n := len(d.Accepted(t)); n > 0 {
		t.Errorf("the destination accepted %d records published with a cancelled context", n)
	}
}

func connectionRefused(t *testing.T, s Sink) {
	p := s.Unreachable(t)
	ping(t, s, p, false)
	recs := []sink.Record{record(1, TopicA, "k"), record(2, TopicA, "k"), record(3, TopicB, "")}
	for i, err := range publish(t, p, recs) {
		if err == nil {
			t.Fatalf("record %d acknowledged by a destination that refuses connections", recs[i].ID)
		}
		if errors.Is(err, sink.ErrNotSent) {
			continue
		}
		ce := sink.Classify(err)
		if ce.Class == sink.ClassPermanent || ce.Scope != sink.ScopeDestination {
			t.Errorf("record %d: %v classified %s with scope %s; a refused connection is the destination's failure",
				recs[i].ID, err, ce.Class, ce.Scope)
		}
	}
}
