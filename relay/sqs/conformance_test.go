package sqs_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/outbox-relay/outbox-relay/relay/publishertest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/sqs"
	"github.com/outbox-relay/outbox-relay/relay/sqs/sqstest"
)

// maxQueueMessage is what the conformance queues take (their
// MaximumMessageSize): a larger message is refused by the queue itself.
const maxQueueMessage = 1024

var queues atomic.Int64

// destination makes the conformance topics a fresh pair of FIFO queues,
// or of FIFO topics each with a queue, on srv, and returns a destination
// of the kind to them.
func destination(t *testing.T, srv *sqstest.Server, kind string) publishertest.Destination {
	n := queues.Add(1)
	names := map[string]string{}
	var readers []*sqstest.Reader
	for _, topic := range []string{publishertest.TopicA, publishertest.TopicB} {
		name := fmt.Sprintf("%s-%d.fifo", strings.ReplaceAll(topic, ".", "-"), n)
		url := srv.CreateQueue(t, name, map[string]string{"MaximumMessageSize": fmt.Sprint(maxQueueMessage)})
		names[topic] = name
		if kind == "sns" {
			names[topic] = srv.CreateTopic(t, "t-"+name, url)
		}
		readers = append(readers, srv.Reader(url))
	}
	next := open(t, srv.Endpoint, kind)
	return publishertest.Destination{
		Publisher: sink.Decorate(next, renamed{next: next, names: names}),
		Accepted: func(t *testing.T) []string {
			var got []string
			for _, r := range readers {
				for _, m := range r.Read(t) {
					got = append(got, *m.Body)
				}
			}
			return got
		},
		Headers: func(t *testing.T) map[string]map[string]string {
			got := map[string]map[string]string{}
			for _, r := range readers {
				for _, m := range r.Read(t) {
					h := map[string]string{}
					for k, v := range m.MessageAttributes {
						h[k] = aws.ToString(v.StringValue)
					}
					got[*m.Body] = h
				}
			}
			return got
		},
	}
}

func open(t *testing.T, endpoint, kind string) sink.Publisher {
	t.Helper()
	s, _ := sink.Lookup(kind)
	cfg := s.New().(*sqs.Settings)
	cfg.Endpoint, cfg.Region, cfg.AccessKeyID, cfg.SecretAccessKeyEnv = endpoint, sqstest.Region, "test", "SECRET"
	if err := cfg.Resolve(func(string) (string, bool) { return "test", true }); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := cfg.Open(sink.Options{Name: kind})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// renamed sends the suite's topics, which no queue or topic could be
// named, to the names the test gave them.
type renamed struct {
	next  sink.Publisher
	names map[string]string
}

func (r renamed) Publish(ctx context.Context, recs []sink.Record) []error {
	out := make([]sink.Record, len(recs))
	for i, rec := range recs {
		out[i] = rec
		out[i].Topic = r.names[rec.Topic]
	}
	return r.next.Publish(ctx, out)
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"sqs", "sns"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			srv := sqstest.Start(t)
			publishertest.Run(t, publishertest.Sink{
				New: func(t *testing.T) publishertest.Destination { return destination(t, srv, kind) },
				// FIFO queues and topics: the event id is the message's
				// deduplication id.
				Deduplicates: true,
				// A header no message attribute can be named so.
				Reject: func(rec *sink.Record) { rec.Headers = map[string]string{"not an attribute": "x"} },
				// SQS: the queue refuses it, below the sink's own limit.
				// SNS takes what it takes and drops what its queue
				// cannot: above its own limit.
				TooLarge: func(rec *sink.Record) {
					rec.Payload = []byte(strings.Repeat("x", map[string]int{"sqs": 2 * maxQueueMessage, "sns": sqs.DefaultSNSMessageBytes}[kind]))
				},
				Pings: true,
				Unreachable: func(t *testing.T) sink.Publisher {
					ln, err := net.Listen("tcp", "127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					endpoint := "http://" + ln.Addr().String()
					_ = ln.Close()
					// Named by URL or ARN, and by name: both the lookup
					// and the send meet the refusal.
					a := map[string]string{"sqs": endpoint + "/000000000000/a.fifo", "sns": "arn:aws:sns:us-east-1:000000000000:a.fifo"}[kind]
					next := open(t, endpoint, kind)
					return sink.Decorate(next, renamed{next: next, names: map[string]string{publishertest.TopicA: a, publishertest.TopicB: "b"}})
				},
				Stoppable: func(t *testing.T) (publishertest.Destination, func(*testing.T), func(*testing.T)) {
					own := sqstest.Start(t)
					return destination(t, own, kind), func(*testing.T) { own.Stop() }, func(*testing.T) { own.Restart() }
				},
				Crashable: func(t *testing.T) (publishertest.Destination, func(*testing.T)) {
					own := sqstest.Start(t)
					return destination(t, own, kind), func(*testing.T) { own.Crash() }
				},
			})
		})
	}
}

// A queue or topic that does not exist fails its records as its topic's
// failure, for the relay to hold them counting no attempt; once it is
// created, the same publisher finds it.
func TestMissingQueueOrTopicPausesItsTopic(t *testing.T) {
	t.Parallel()
	srv := sqstest.Start(t)
	for _, kind := range []string{"sqs", "sns"} {
		p := open(t, srv.Endpoint, kind)
		name := "later-" + kind
		recs := []sink.Record{{ID: 1, Topic: name, Key: "k", HasKey: true, Payload: []byte("1")}, {ID: 2, Topic: name, Key: "k", HasKey: true, Payload: []byte("2")}}
		errs := p.Publish(context.Background(), recs)
		if ce := sink.Classify(errs[0]); ce == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeTopic {
			t.Fatalf("%s: a missing %s: %v (%v), want systemic with the topic's scope", kind, name, errs[0], ce)
		}
		url := srv.CreateQueue(t, name, nil)
		if kind == "sns" {
			srv.CreateTopic(t, name, url)
		}
		for i, err := range p.Publish(context.Background(), recs) {
			if err != nil {
				t.Fatalf("%s: record %d once %s exists: %v", kind, i+1, name, err)
			}
		}
		if got := len(srv.Reader(url).Read(t)); got != 2 {
			t.Errorf("%s: %d messages reached %s, want 2", kind, got, name)
		}
	}
}
