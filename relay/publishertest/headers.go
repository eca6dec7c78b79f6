package publishertest

import (
	"strconv"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// headers publishes a keyed record with headers and a keyless one, and
// reads what each message carries: the record's headers, its event id
// and id, and its key, under the names every sink uses; nothing of a key
// for the keyless one.
func headers(t *testing.T, s Sink) {
	d := s.New(t)
	if d.Headers == nil {
		t.Skip("the sink carries no headers")
	}
	recs := []sink.Record{record(1, TopicA, "k"), record(2, TopicB, "")}
	recs[0].Headers = map[string]string{"content-type": "application/json", "x-trace": "t-1"}
	for i, err := range publish(t, d.Publisher, recs) {
		if err != nil {
			t.Fatalf("record %d: %v", recs[i].ID, err)
		}
	}
	got := d.Headers(t)
	for _, r := range recs {
		h, ok := got[string(r.Payload)]
		if !ok {
			t.Errorf("record %d: no message at the destination", r.ID)
			continue
		}
		want := map[string]string{sink.HeaderEventID: r.EventID.String(), sink.HeaderID: strconv.FormatInt(r.ID, 10)}
		for k, v := range r.Headers {
			want[k] = v
		}
		if r.HasKey {
			want[sink.HeaderKey] = r.Key
		} else if k, ok := h[sink.HeaderKey]; ok {
			t.Errorf("keyless record %d carries the key %q", r.ID, k)
		}
		for k, v := range want {
			if h[k] != v {
				t.Errorf("record %d: %s = %q, want %q (it carries %v)", r.ID, k, h[k], v, h)
			}
		}
	}
}

// publishedAgain publishes a record, then the same record again, as the
// relay does when it crashed before writing back the first publish: the
// destination keeps one message.
func publishedAgain(t *testing.T, s Sink) {
	d := s.New(t)
	recs := []sink.Record{record(1, TopicA, "k"), record(2, TopicA, "")}
	for range 2 {
		for i, err := range publish(t, d.Publisher, recs) {
			if err != nil {
				t.Fatalf("record %d: %v", recs[i].ID, err)
			}
		}
	}
	count := accepted(t, d, recs)
	for _, r := range recs {
		if count[r.ID] != 1 {
			t.Errorf("record %d published twice with its event id: the destination holds it %d times, want once", r.ID, count[r.ID])
		}
	}
}
