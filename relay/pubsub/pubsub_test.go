package pubsub_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/relay/pubsub"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

const (
	project    = "outbox-test"
	maxMessage = 64 << 10
)

// emulator starts Pub/Sub's in-process fake (pstest) with topics.
func emulator(t *testing.T, topics ...string) *pstest.Server {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	for _, topic := range topics {
		if _, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topic}); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}

func newPublisher(t *testing.T, c pubsub.Config) *pubsub.Publisher {
	t.Helper()
	c.Project = project
	if c.Name == "" {
		c.Name = "test"
	}
	p, err := pubsub.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func rec(id int64, topic, key, payload string) sink.Record {
	return sink.Record{ID: id, EventID: uuid.New(), Topic: topic, Key: key, HasKey: key != "",
		Payload: []byte(payload), PayloadSize: len(payload), Headers: map[string]string{"content-type": "text/plain"}}
}

func publish(t *testing.T, p *pubsub.Publisher, recs ...sink.Record) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return p.Publish(ctx, recs)
}

// A message carries the key as its ordering key and the headers as
// attributes; a topic that does not exist pauses its topic alone, and a
// key spread over it and another topic is not sent past its failure.
func TestMessagesAndMissingTopic(t *testing.T) {
	t.Parallel()
	srv := emulator(t, "orders")
	p := newPublisher(t, pubsub.Config{Emulator: srv.Addr})
	r := rec(7, "orders", "c-1", "hello")
	if errs := publish(t, p, r); errs[0] != nil {
		t.Fatal(errs[0])
	}
	m := srv.Messages()[0]
	if m.OrderingKey != "c-1" || m.Attributes["content-type"] != "text/plain" || m.Attributes[pubsub.AttributeEventID] != r.EventID.String() ||
		m.Attributes[pubsub.AttributeID] != "7" || string(m.Data) != "hello" {
		t.Errorf("message %+v", m)
	}
	errs := publish(t, p, rec(1, "payments", "k", "1"), rec(2, "orders", "k", "2"), rec(3, "orders", "j", "3"))
	ce := sink.Classify(errs[0])
	if errs[0] == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeTopic || !strings.Contains(errs[0].Error(), "does not exist") {
		t.Errorf("a missing topic: %v (%s, %s)", errs[0], ce.Class, ce.Scope)
	}
	if !errors.Is(errs[1], sink.ErrNotSent) || errs[2] != nil {
		t.Errorf("beside it: %v, %v; want the key's later row not sent and the other key sent", errs[1], errs[2])
	}
	if n := len(srv.Messages()); n != 2 {
		t.Errorf("the emulator holds %d messages, want 2", n)
	}
	if errs := publish(t, p, rec(4, "orders", "k", "4")); errs[0] != nil {
		t.Errorf("the failed key publishes again: %v", errs[0])
	}
}

func TestSettingsValidate(t *testing.T) {
	t.Parallel()
	s := &pubsub.Settings{Emulator: "nohost", CredentialsFile: "/x.json", MaxMessageBytes: 11 << 20, Timeout: -time.Second}
	err := s.Validate()
	for _, want := range []string{"project is required", "an emulator takes no credentials", `emulator: "nohost" is not host:port`,
		"max_message_bytes is 11534336", "timeout is -1s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v; want it to say %q", err, want)
		}
	}
	for id, ok := range map[string]bool{"orders": true, "orders.created-v1": true, "ab": false, "1abc": false, "goog-x": false, "a b c": false} {
		if err := pubsub.ValidateTopic(id); (err == nil) != ok {
			t.Errorf("ValidateTopic(%q) = %v", id, err)
		}
	}
}

// The client name reaches the client, as its User-Agent.
func TestSettingsConfig(t *testing.T) {
	s := pubsub.Settings{Project: project, ClientName: "billing-relay", Timeout: time.Second}
	c := s.Config("orders")
	if c.ClientName != "billing-relay" || c.Name != "orders" || c.Project != project || c.Timeout != time.Second {
		t.Errorf("config %+v, want the settings' client name, project and timeout for destination orders", c)
	}
}
