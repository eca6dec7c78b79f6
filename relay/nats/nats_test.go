package nats_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/internal/dev/tlstest"
	"github.com/outbox-relay/outbox-relay/relay/nats"
	"github.com/outbox-relay/outbox-relay/relay/nats/natstest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func rec(id int64, subject, key, payload string) sink.Record {
	return sink.Record{ID: id, EventID: uuid.New(), Topic: subject, Key: key, HasKey: key != "",
		Payload: []byte(payload), PayloadSize: len(payload), Headers: map[string]string{"content-type": "text/plain"}}
}

func publish(t *testing.T, p *nats.Publisher, recs ...sink.Record) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return p.Publish(ctx, recs)
}

// The stream stores each row once with its headers, the event id as
// Nats-Msg-Id and the key in outbox-key; a row published again (after a
// crash before its write-back) is dropped by the stream as a duplicate.
func TestMessagesCarryIDsAndHeadersAndDeduplicate(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.Options{})
	js := srv.Connect()
	natstest.AddStream(t, js, "ORDERS", "orders.>")
	p := newPublisher(t, nats.Config{Servers: []string{srv.URL}})
	r := rec(7, "orders.created", "c-1", `{"id":1}`)
	r.Headers["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for range 2 {
		if errs := publish(t, p, r); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	msgs := natstest.Messages(t, js, "ORDERS")
	if len(msgs) != 1 {
		t.Fatalf("the stream holds %d messages; a row published twice must be stored once", len(msgs))
	}
	m := msgs[0]
	for k, want := range map[string]string{
		"Nats-Msg-Id": r.EventID.String(), nats.HeaderEventID: r.EventID.String(), nats.HeaderID: "7",
		nats.HeaderKey: "c-1", "content-type": "text/plain", "traceparent": r.Headers["traceparent"],
	} {
		if got := m.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if m.Subject != "orders.created" || string(m.Data) != `{"id":1}` {
		t.Errorf("stored %s %q", m.Subject, m.Data)
	}
	keyless := rec(8, "orders.created", "", "x")
	if errs := publish(t, p, keyless); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if got := natstest.Messages(t, js, "ORDERS")[1].Header.Values(nats.HeaderKey); len(got) != 0 {
		t.Errorf("a row without a key carries %s %q", nats.HeaderKey, got)
	}
}

// A subject no stream takes is its topic's failure, systemic: the topic
// pauses, its rows count no attempt, and the other topics of the batch go.
func TestSubjectWithoutStreamIsItsTopicsFailure(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.Options{})
	js := srv.Connect()
	natstest.AddStream(t, js, "ORDERS", "orders.>")
	p := newPublisher(t, nats.Config{Servers: []string{srv.URL}})
	errs := publish(t, p, rec(1, "payments.done", "k", "1"), rec(2, "orders.created", "j", "2"), rec(3, "payments.done", "k", "3"))
	ce := sink.Classify(errs[0])
	if errs[0] == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeTopic || !strings.Contains(errs[0].Error(), "no stream takes subject payments.done") {
		t.Errorf("a subject without a stream: %v (%s, %s), want a systemic failure of its topic that says so", errs[0], ce.Class, ce.Scope)
	}
	if errs[1] != nil || !errors.Is(errs[2], sink.ErrNotSent) {
		t.Errorf("beside it: %v, %v; want the other topic sent and the key's later row not sent", errs[1], errs[2])
	}
	if got := sink.Classify(publish(t, p, rec(4, "orders.*", "", "4"))[0]); got.Class != sink.ClassPermanent || got.Reason != sink.ReasonInvalidMessage {
		t.Errorf("a wildcard subject: %s %q, want permanent invalid_message", got.Class, got.Reason)
	}
}

// A server that stops is the destination's systemic failure, at once and
// without buffering; once it is back the publisher reconnects by itself.
func TestServerStopsAndComesBack(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.Options{})
	js := srv.Connect()
	natstest.AddStream(t, js, "ORDERS", "orders.>")
	p := newPublisher(t, nats.Config{Servers: []string{srv.URL}})
	if errs := publish(t, p, rec(1, "orders.a", "k", "1")); errs[0] != nil {
		t.Fatal(errs[0])
	}
	srv.Stop()
	var err error
	testwait.For(t, "a publish to fail while the server is down", func() bool {
		err = publish(t, p, rec(2, "orders.a", "k", "2"))[0]
		return err != nil
	})
	start := time.Now()
	errs := publish(t, p, rec(3, "orders.a", "k", "3"), rec(4, "orders.b", "", "4"))
	for _, err := range errs {
		ce := sink.Classify(err)
		if err == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeDestination {
			t.Errorf("while the server is down: %v (%s, %s), want a systemic failure of the destination", err, ce.Class, ce.Scope)
		}
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a publish while disconnected took %s; it must fail at once", took)
	}
	// The first publish once the server is back, the relay's probe, finds
	// it: the client tries to reconnect then, not after its pause.
	srv.Restart()
	if errs := publish(t, p, rec(5, "orders.a", "k", "5")); errs[0] != nil {
		t.Fatalf("the first publish after the server came back: %v", errs[0])
	}
	got := natstest.Messages(t, srv.Connect(), "ORDERS")
	if len(got) != 2 || string(got[0].Data) != "1" || string(got[1].Data) != "5" {
		t.Errorf("the stream holds %d messages after the restart, want 1 and 5", len(got))
	}
}

// Wrong credentials fail every row as the destination's systemic failure,
// naming the authorization violation; a user without permission to
// publish to a subject pauses its topic.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.Options{Users: []*server.User{
		{Username: "relay", Password: "s3cret"},
		{Username: "narrow", Password: "pw", Permissions: &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{"orders.>", "$JS.API.>", "_INBOX.>"}}}},
	}})
	js := srv.Connect(natsgo.UserInfo("relay", "s3cret"))
	natstest.AddStream(t, js, "ALL", "orders.>", "payments.>")

	good := newPublisher(t, nats.Config{Servers: []string{srv.URL}, Username: "relay", Password: "s3cret"})
	testwait.For(t, "the publisher to connect", func() bool { return publish(t, good, rec(1, "orders.a", "k", "1"))[0] == nil })

	bad := newPublisher(t, nats.Config{Servers: []string{srv.URL}, Username: "relay", Password: "wrong"})
	err := publish(t, bad, rec(2, "orders.a", "k", "2"))[0]
	ce := sink.Classify(err)
	if err == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeDestination {
		t.Errorf("wrong password: %v (%s, %s), want a systemic failure of the destination", err, ce.Class, ce.Scope)
	}
	testwait.For(t, "the failure to name the authorization violation", func() bool {
		err := publish(t, bad, rec(3, "orders.a", "k", "3"))[0]
		return errors.Is(err, natsgo.ErrAuthorization) && strings.Contains(strings.ToLower(err.Error()), "authorization violation")
	})

	narrow := newPublisher(t, nats.Config{Servers: []string{srv.URL}, Username: "narrow", Password: "pw", AckTimeout: 500 * time.Millisecond})
	testwait.For(t, "the narrow publisher to connect", func() bool { return publish(t, narrow, rec(4, "orders.a", "k", "4"))[0] == nil })
	testwait.For(t, "a denied subject to be told from a timeout", func() bool {
		err := publish(t, narrow, rec(5, "payments.a", "k", "5"))[0]
		ce := sink.Classify(err)
		return err != nil && ce.Class == sink.ClassSystemic && ce.Scope == sink.ScopeTopic && strings.Contains(err.Error(), "permissions violation")
	})
}

// TLS with the sink's settings: roots from a file; without them the
// server's certificate is refused, systemic for the destination.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "nats test CA")
	cert := ca.Server(t, "localhost")
	srv := natstest.Start(t, natstest.Options{TLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	js := srv.Connect(natsgo.Secure(&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}))
	natstest.AddStream(t, js, "ORDERS", "orders.>")

	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &nats.Settings{Servers: []string{srv.URL}}
	s.TLS.CAFile, s.TLS.ServerName = caFile, "localhost"
	if err := errors.Join(s.Resolve(nil), s.Validate()); err != nil {
		t.Fatal(err)
	}
	c, err := s.Config("tls")
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, c)
	testwait.For(t, "a publish over TLS", func() bool { return publish(t, p, rec(1, "orders.a", "k", "1"))[0] == nil })

	untrusted := newPublisher(t, nats.Config{Servers: []string{srv.URL}})
	err = publish(t, untrusted, rec(2, "orders.a", "k", "2"))[0]
	if ce := sink.Classify(err); err == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeDestination {
		t.Errorf("an untrusted server certificate: %v (%s, %s), want a systemic failure of the destination", err, ce.Class, ce.Scope)
	}
}

// Rotated credentials reach a running publisher: it connects again with
// them, and keeps the connection it has when they do not work.
func TestReloadConnectsWithNewCredentials(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.Options{Users: []*server.User{{Username: "old", Password: "pw-old"}, {Username: "new", Password: "pw-new"}}})
	js := srv.Connect(natsgo.UserInfo("old", "pw-old"))
	natstest.AddStream(t, js, "ORDERS", "orders.>")
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "password")
	settings := func(user, pw string) *nats.Settings {
		t.Helper()
		if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s := &nats.Settings{Servers: []string{srv.URL}, Auth: nats.Auth{Username: user, PasswordFile: pwFile}}
		if err := errors.Join(s.Resolve(nil), s.Validate()); err != nil {
			t.Fatal(err)
		}
		return s
	}
	c, err := settings("old", "pw-old").Config("reload")
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, c)
	testwait.For(t, "the publisher to connect", func() bool { return publish(t, p, rec(1, "orders.a", "k", "1"))[0] == nil })
	if err := settings("new", "not-it").Reload(p); err == nil {
		t.Fatal("a reload with a wrong password succeeded")
	}
	if errs := publish(t, p, rec(2, "orders.a", "k", "2")); errs[0] != nil {
		t.Fatalf("after a failed reload: %v; the publisher must keep its connection", errs[0])
	}
	if err := settings("new", "pw-new").Reload(p); err != nil {
		t.Fatal(err)
	}
	if errs := publish(t, p, rec(3, "orders.a", "k", "3")); errs[0] != nil {
		t.Fatalf("after the reload: %v", errs[0])
	}
	if n := len(natstest.Messages(t, js, "ORDERS")); n != 3 {
		t.Fatalf("the stream holds %d messages, want 3", n)
	}
}

func TestSettingsValidate(t *testing.T) {
	t.Parallel()
	s := &nats.Settings{Servers: []string{"http://x:4222", "nats://"}, Concurrency: -1, AckTimeout: -time.Second,
		Auth: nats.Auth{Username: "u", TokenEnv: "T", CredsFile: "/nonexistent.creds"}}
	err := errors.Join(s.Resolve(func(string) (string, bool) { return "tok", true }), s.Validate())
	for _, want := range []string{`servers: "http://x:4222": use nats:// or tls://`, `servers: "nats://" is not a server URL`,
		"auth: give a username and password, a token or a creds_file, not several", "auth: username and password go together",
		"auth.creds_file:", "ack_timeout is -1s", "concurrency is -1"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v; want it to say %q", err, want)
		}
	}
	if err := (&nats.Settings{}).Validate(); err == nil || !strings.Contains(err.Error(), "servers is required") {
		t.Errorf("no servers: %v", err)
	}
	for subject, ok := range map[string]bool{"orders.created": true, "a": true, "": false, "a..b": false, ".a": false,
		"a.*": false, "a.>": false, "a b": false} {
		if err := nats.ValidateSubject(subject); (err == nil) != ok {
			t.Errorf("ValidateSubject(%q) = %v", subject, err)
		}
	}
}
