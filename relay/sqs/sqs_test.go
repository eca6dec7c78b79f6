package sqs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// answering is an endpoint that answers every request with status and
// body, as AWS answers a failed call (SQS in JSON, SNS in XML).
func answering(t *testing.T, status int, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Content-Type"), "json") {
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		} else {
			w.Header().Set("Content-Type", "text/xml")
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func publisher(t *testing.T, service, endpoint string) *Publisher {
	t.Helper()
	s := &Settings{service: service, Endpoint: endpoint, Region: "eu-west-1", AccessKeyID: "id", secret: "secret"}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := s.Open(sink.Options{Name: "d"})
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Publisher)
}

func rec(id int64, topic, key string) sink.Record {
	return sink.Record{ID: id, EventID: uuid.New(), Topic: topic, Key: key, HasKey: key != "", Payload: []byte(fmt.Sprint(id)),
		Headers: map[string]string{"content-type": "text/plain"}}
}

func sqsError(code, message string) string {
	return fmt.Sprintf(`{"__type":"com.amazonaws.sqs#%s","message":%q}`, code, message)
}

func snsError(kind, code, message string) string {
	return fmt.Sprintf(`<ErrorResponse><Error><Type>%s</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>r</RequestId></ErrorResponse>`, kind, code, message)
}

// A failed call's answer, through the SDK, says what scope and class the
// records get: throttling and 5xx are the destination's and transient, a
// missing or forbidden queue its topic's, bad credentials the
// destination's for good, a malformed single message permanent.
func TestCallFailuresAreClassified(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, service string
		status        int
		body          string
		class         sink.Class
		scope         sink.Scope
		reason        string
	}{
		{"sqs throttled", "SQS", 400, sqsError("RequestThrottled", "slow down"), sink.ClassTransient, sink.ScopeDestination, ""},
		{"sqs 500", "SQS", 500, sqsError("InternalError", "oops"), sink.ClassTransient, sink.ScopeDestination, ""},
		{"sqs 503 without a body", "SQS", 503, "", sink.ClassTransient, sink.ScopeDestination, ""},
		{"sqs missing queue", "SQS", 400, sqsError("QueueDoesNotExist", "The specified queue does not exist."), sink.ClassSystemic, sink.ScopeTopic, ""},
		{"sqs denied", "SQS", 400, sqsError("AccessDenied", "not you"), sink.ClassSystemic, sink.ScopeTopic, ""},
		{"sqs bad key", "SQS", 400, sqsError("InvalidClientTokenId", "no such key"), sink.ClassSystemic, sink.ScopeDestination, ""},
		{"sqs kms", "SQS", 400, sqsError("KmsDisabled", "key disabled"), sink.ClassSystemic, sink.ScopeTopic, ""},
		{"sqs malformed", "SQS", 400, sqsError("InvalidParameterValue", "bad value"), sink.ClassPermanent, sink.ScopeRecord, sink.ReasonInvalidMessage},
		{"sqs too long", "SQS", 400, sqsError("InvalidParameterValue", "Message must be shorter than 1024 bytes."), sink.ClassPermanent, sink.ScopeRecord, sink.ReasonTooLarge},
		{"sqs unknown refusal", "SQS", 400, sqsError("SomethingNew", "?"), sink.ClassSystemic, sink.ScopeTopic, ""},
		{"sns throttled", "SNS", 400, snsError("Sender", "Throttling", "Rate exceeded"), sink.ClassTransient, sink.ScopeDestination, ""},
		{"sns missing topic", "SNS", 404, snsError("Sender", "NotFound", "Topic does not exist"), sink.ClassSystemic, sink.ScopeTopic, ""},
		{"sns denied", "SNS", 403, snsError("Sender", "AuthorizationError", "not you"), sink.ClassSystemic, sink.ScopeTopic, ""},
		{"sns 500", "SNS", 500, snsError("Receiver", "InternalError", "oops"), sink.ClassTransient, sink.ScopeDestination, ""},
		{"sns expired token", "SNS", 403, snsError("Sender", "ExpiredToken", "expired"), sink.ClassSystemic, sink.ScopeDestination, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := publisher(t, c.service, answering(t, c.status, c.body))
			// Named by URL or ARN: the call is the send itself.
			topic := map[string]string{"SQS": "https://sqs.eu-west-1.amazonaws.com/1/q", "SNS": "arn:aws:sns:eu-west-1:1:t"}[c.service]
			errs := p.Publish(context.Background(), []sink.Record{rec(1, topic, "k"), rec(2, topic, "k")})
			ce := sink.Classify(errs[0])
			if ce == nil || ce.Class != c.class || ce.Scope != c.scope || ce.Reason != c.reason {
				t.Fatalf("got %v (%v), want %s, scope %s, reason %q", errs[0], ce, c.class, c.scope, c.reason)
			}
			if !errors.Is(errs[1], sink.ErrNotSent) {
				t.Errorf("the key's next record: %v, want not sent", errs[1])
			}
		})
	}
}

// What a service refuses of one entry in a batch fails that entry alone.
func TestRefusedEntries(t *testing.T) {
	t.Parallel()
	p := &Publisher{service: "SQS"}
	for _, c := range []struct {
		r      refusal
		class  sink.Class
		scope  sink.Scope
		reason string
	}{
		{refusal{"InvalidParameterValue", "Value for parameter MessageBody is invalid", true}, sink.ClassPermanent, sink.ScopeRecord, sink.ReasonInvalidMessage},
		{refusal{"InvalidParameterValue", "Message must be shorter than 262144 bytes.", true}, sink.ClassPermanent, sink.ScopeRecord, sink.ReasonTooLarge},
		{refusal{"InternalError", "oops", false}, sink.ClassTransient, sink.ScopeRecord, ""},
		{refusal{"Unanswered", "", false}, sink.ClassTransient, sink.ScopeRecord, ""},
		{refusal{"KmsThrottled", "slow", true}, sink.ClassTransient, sink.ScopeDestination, ""},
		{refusal{"KmsAccessDenied", "no", true}, sink.ClassSystemic, sink.ScopeTopic, ""},
	} {
		ce := sink.Classify(p.refused("q", c.r))
		if ce.Class != c.class || ce.Scope != c.scope || ce.Reason != c.reason {
			t.Errorf("%+v: %s, scope %s, reason %q; want %s, %s, %q", c.r, ce.Class, ce.Scope, ce.Reason, c.class, c.scope, c.reason)
		}
	}
}

// Rows that cannot be a message are dead-lettered with a reason that says
// why, and a FIFO queue's messages carry their key as their group.
func TestEntries(t *testing.T) {
	t.Parallel()
	p := newPublisher("SQS", Config{MaxMessageBytes: 400}, nil)
	many := map[string]string{}
	for i := range 8 {
		many[fmt.Sprint("h", i)] = "v"
	}
	for _, c := range []struct {
		name   string
		change func(*sink.Record)
		reason string
		says   string
	}{
		{"empty", func(r *sink.Record) { r.Payload = nil }, sink.ReasonInvalidMessage, "empty"},
		{"not UTF-8", func(r *sink.Record) { r.Payload = []byte{0xff, 0xfe} }, sink.ReasonInvalidMessage, "UTF-8"},
		{"a control character", func(r *sink.Record) { r.Payload = []byte("a\x01b") }, sink.ReasonInvalidMessage, "U+0001"},
		{"eleven attributes", func(r *sink.Record) { r.Headers = many }, sink.ReasonInvalidMessage, "11 message attributes"},
		{"a header name with a space", func(r *sink.Record) { r.Headers = map[string]string{"a b": "x"} }, sink.ReasonInvalidMessage, "letters, digits"},
		{"a reserved header name", func(r *sink.Record) { r.Headers = map[string]string{"AWS.x": "x"} }, sink.ReasonInvalidMessage, "reserves"},
		{"an empty header", func(r *sink.Record) { r.Headers = map[string]string{"h": ""} }, sink.ReasonInvalidMessage, "empty"},
		{"too large", func(r *sink.Record) { r.Payload = []byte(strings.Repeat("x", 450)) }, sink.ReasonTooLarge, "the limit is 400"},
		{"a key too long for a group", func(r *sink.Record) { r.Key = strings.Repeat("k", 129) }, sink.ReasonInvalidMessage, "MessageGroupId"},
	} {
		r := rec(7, "q.fifo", "k")
		c.change(&r)
		_, err := p.entry(&r, 0, "https://sqs/1/q.fifo")
		ce := sink.Classify(err)
		if err == nil || ce.Class != sink.ClassPermanent || ce.Reason != c.reason || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want permanent %s saying %q", c.name, err, c.reason, c.says)
		}
	}
	r := rec(7, "q.fifo", "k")
	e, err := p.entry(&r, 0, "https://sqs/1/q.fifo")
	if err != nil || e.group != "k" || e.dedup != r.EventID.String() {
		t.Errorf("a FIFO entry: %+v, %v; want group k and the event id as its deduplication id", e, err)
	}
	r.HasKey, r.Key = false, ""
	if e, _ := p.entry(&r, 0, "https://sqs/1/q.fifo"); e.group != DefaultGroupID {
		t.Errorf("a FIFO entry without a key is in group %q, want %q", e.group, DefaultGroupID)
	}
	if e, _ := p.entry(&r, 0, "https://sqs/1/q"); e.group != "" || e.dedup != "" {
		t.Errorf("a standard queue's entry has group %q and deduplication id %q", e.group, e.dedup)
	}
}

// A round's entries go in calls of ten at most, within the byte limit.
func TestBatches(t *testing.T) {
	t.Parallel()
	p := newPublisher("SNS", Config{MaxMessageBytes: 100}, nil)
	var es []*entry
	for i := range 23 {
		es = append(es, &entry{id: fmt.Sprint(i), size: 10})
	}
	es[20].size = 95
	calls := p.batches([]string{"a", "b"}, map[string][]*entry{"a": es, "b": es[:3]})
	var sizes []int
	for _, c := range calls {
		sizes = append(sizes, len(c.entries))
	}
	if got := fmt.Sprint(sizes); got != "[10 10 1 2 3]" {
		t.Errorf("calls of %s entries, want [10 10 1 2 3]", got)
	}
}

func TestSettingsValidate(t *testing.T) {
	t.Parallel()
	s := &Settings{service: "SNS", AccessKeyID: "id", Endpoint: "ftp://x", MaxMessageBytes: 300 << 10, GroupID: strings.Repeat("g", 129), Timeout: -1}
	err := s.Validate()
	for _, want := range []string{"access_key_id and a secret access key", "endpoint", "max_message_bytes is 307200; SNS takes 1 to 262144", "group_id", "timeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want it to say %q", err, want)
		}
	}
	for _, c := range []struct {
		check func(string) error
		name  string
		ok    bool
	}{
		{ValidateQueue, "orders", true}, {ValidateQueue, "orders.fifo", true}, {ValidateQueue, "https://sqs.eu-west-1.amazonaws.com/1/q", true},
		{ValidateQueue, "orders.created", false}, {ValidateQueue, strings.Repeat("q", 81), false}, {ValidateQueue, "", false},
		{ValidateTopic, "orders", true}, {ValidateTopic, "arn:aws:sns:eu-west-1:1:orders", true}, {ValidateTopic, "a b", false},
	} {
		if err := c.check(c.name); (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok %v", c.name, err, c.ok)
		}
	}
}

// A queue that cannot be found is looked up once a publish, however many
// of its rows the publish holds.
func TestMissingQueueLookedUpOncePerPublish(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(400)
		_, _ = w.Write([]byte(sqsError("QueueDoesNotExist", "The specified queue does not exist.")))
	}))
	t.Cleanup(srv.Close)
	p := publisher(t, "SQS", srv.URL)
	var recs []sink.Record
	for i := range 20 {
		recs = append(recs, rec(int64(i+1), "orders", fmt.Sprint("k", i)))
	}
	for i, err := range p.Publish(context.Background(), recs) {
		if ce := sink.Classify(err); ce == nil || ce.Scope != sink.ScopeTopic {
			t.Fatalf("record %d: %v, want its topic's failure", i+1, err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d requests for 20 rows of a missing queue, want 1", n)
	}
}
