package redis_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/internal/dev/tlstest"
	"github.com/outbox-relay/outbox-relay/relay/redis"
	"github.com/outbox-relay/outbox-relay/relay/redis/redistest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func newPublisher(t *testing.T, c redis.Config) *redis.Publisher {
	t.Helper()
	if c.Name == "" {
		c.Name = "test"
	}
	p, err := redis.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func rec(id int64, stream, key, payload string) sink.Record {
	return sink.Record{ID: id, EventID: uuid.New(), Topic: stream, Key: key, HasKey: key != "",
		Payload: []byte(payload), PayloadSize: len(payload), Headers: map[string]string{"content-type": "text/plain"}}
}

func publish(t *testing.T, p *redis.Publisher, recs ...sink.Record) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return p.Publish(ctx, recs)
}

// An entry holds the row's ids, key, headers and payload; max_len trims
// the stream as it grows.
func TestEntriesAndTrimming(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := srv.Client(nil)
	p := newPublisher(t, redis.Config{Addresses: []string{srv.Addr}, ClientName: "relay-a"})
	r := rec(7, "orders", "c-1", `{"id":1}`)
	if errs := publish(t, p, r, rec(8, "orders", "", "x")); errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	got := redistest.Entries(t, c, "orders")
	if len(got) != 2 {
		t.Fatalf("%d entries", len(got))
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(got[0][redis.FieldHeaders].(string)), &h); err != nil || h["content-type"] != "text/plain" {
		t.Errorf("headers %v: %v", got[0][redis.FieldHeaders], err)
	}
	if got[0][redis.FieldEventID] != r.EventID.String() || got[0][redis.FieldID] != "7" || got[0][redis.FieldKey] != "c-1" || got[0][redis.FieldPayload] != `{"id":1}` {
		t.Errorf("entry %v", got[0])
	}
	// The old names, for one release more.
	if got[0]["outbox-event-id"] != got[0]["event_id"] || got[0]["outbox-id"] != got[0]["outbox_id"] || got[0]["outbox-key"] != got[0]["key"] {
		t.Errorf("entry %v: want the event id, row id and key under their old names too", got[0])
	}
	if _, ok := got[1][redis.FieldKey]; ok {
		t.Errorf("a row without a key has a key field: %v", got[1])
	}
	if _, ok := got[1][redis.OldFieldKey]; ok {
		t.Errorf("a row without a key has a key field: %v", got[1])
	}
	if list := c.ClientList(context.Background()).Val(); !strings.Contains(list, "name=relay-a ") {
		t.Errorf("no connection named relay-a among the server's clients:\n%s", list)
	}

	trimmed := newPublisher(t, redis.Config{Addresses: []string{srv.Addr}, MaxLen: 100})
	var many []sink.Record
	for i := range 1000 {
		many = append(many, rec(int64(100+i), "clicks", "", "c"))
	}
	for _, err := range publish(t, trimmed, many...) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := c.XLen(context.Background(), "clicks").Val(); n >= 1000 || n < 100 {
		t.Errorf("max_len 100 left %d entries of 1000", n)
	}
}

// A key that holds another type than a stream is its topic's systemic
// failure: the topic pauses, the other topics of the batch go on.
func TestKeyOfAnotherType(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := srv.Client(nil)
	if err := c.Set(context.Background(), "payments", "a string", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, redis.Config{Addresses: []string{srv.Addr}})
	errs := publish(t, p, rec(1, "payments", "k", "1"), rec(2, "orders", "j", "2"), rec(3, "orders", "k", "3"))
	ce := sink.Classify(errs[0])
	if errs[0] == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeTopic || !strings.Contains(errs[0].Error(), "holds another type") {
		t.Errorf("a key of another type: %v (%s, %s)", errs[0], ce.Class, ce.Scope)
	}
	if errs[1] != nil || !errors.Is(errs[2], sink.ErrNotSent) {
		t.Errorf("beside it: %v, %v; want the other key sent and this key's later row not sent", errs[1], errs[2])
	}
}

// A server that stops is the destination's systemic failure; once it is
// back the publisher goes on by itself.
func TestServerStopsAndComesBack(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	p := newPublisher(t, redis.Config{Addresses: []string{srv.Addr}})
	if errs := publish(t, p, rec(1, "orders", "k", "1")); errs[0] != nil {
		t.Fatal(errs[0])
	}
	srv.Stop()
	for _, err := range publish(t, p, rec(2, "orders", "k", "2"), rec(3, "orders", "", "3")) {
		ce := sink.Classify(err)
		if err == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeDestination {
			t.Errorf("while the server is down: %v (%s, %s), want a systemic failure of the destination", err, ce.Class, ce.Scope)
		}
	}
	srv.Restart()
	testwait.For(t, "a publish after the restart", func() bool { return publish(t, p, rec(4, "orders", "k", "4"))[0] == nil })
	got := redistest.Entries(t, srv.Client(nil), "orders")
	if len(got) != 2 || got[0][redis.FieldPayload] != "1" || got[1][redis.FieldPayload] != "4" {
		t.Errorf("entries after the restart: %v", got)
	}
}

// Wrong credentials fail as the destination's systemic failure; a user
// whose ACL denies a stream's key pauses that topic alone.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{ACL: []string{
		"user default off",
		"user relay on >s3cret ~* +@all",
		"user narrow on >pw ~orders* +@all",
	}})
	good := newPublisher(t, redis.Config{Addresses: []string{srv.Addr}, Username: "relay", Password: "s3cret"})
	if errs := publish(t, good, rec(1, "orders", "k", "1")); errs[0] != nil {
		t.Fatal(errs[0])
	}
	bad := newPublisher(t, redis.Config{Addresses: []string{srv.Addr}, Username: "relay", Password: "wrong"})
	err := publish(t, bad, rec(2, "orders", "k", "2"))[0]
	if ce := sink.Classify(err); err == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeDestination {
		t.Errorf("wrong password: %v (%s, %s), want a systemic failure of the destination", err, ce.Class, ce.Scope)
	}
	narrow := newPublisher(t, redis.Config{Addresses: []string{srv.Addr}, Username: "narrow", Password: "pw"})
	errs := publish(t, narrow, rec(3, "payments", "k", "3"), rec(4, "orders", "j", "4"))
	if ce := sink.Classify(errs[0]); errs[0] == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeTopic {
		t.Errorf("a denied key: %v (%s, %s), want a systemic failure of its topic", errs[0], ce.Class, ce.Scope)
	}
	if errs[1] != nil {
		t.Errorf("an allowed key beside it: %v", errs[1])
	}
}

// TLS with the sink's settings: roots from a file; without them the
// server's certificate is refused, systemic for the destination.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "redis test CA")
	certPEM, keyPEM := tlstest.PEM(t, ca.Server(t, "localhost"))
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	caFile := write("ca.pem", ca.PEM())
	srv := redistest.Start(t, redistest.Options{TLSCert: write("cert.pem", certPEM), TLSKey: write("key.pem", keyPEM), TLSCA: caFile})
	s := &redis.Settings{Addresses: []string{srv.Addr}}
	s.TLS.Enabled, s.TLS.CAFile, s.TLS.ServerName = true, caFile, "localhost"
	if err := errors.Join(s.Resolve(nil), s.Validate()); err != nil {
		t.Fatal(err)
	}
	c, err := s.Config("tls", 0)
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, c)
	if errs := publish(t, p, rec(1, "orders", "k", "1")); errs[0] != nil {
		t.Fatalf("over TLS: %v", errs[0])
	}
	untrusted := newPublisher(t, redis.Config{Addresses: []string{srv.Addr}, TLS: &tls.Config{ServerName: "localhost", RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12}})
	err = publish(t, untrusted, rec(2, "orders", "k", "2"))[0]
	if ce := sink.Classify(err); err == nil || ce.Class != sink.ClassSystemic || ce.Scope != sink.ScopeDestination {
		t.Errorf("an untrusted certificate: %v (%s, %s), want a systemic failure of the destination", err, ce.Class, ce.Scope)
	}
}

// A rotated password reaches a running publisher; a wrong one leaves it
// as it was.
func TestReloadTakesTheNewPassword(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Password: "first"})
	pwFile := filepath.Join(t.TempDir(), "password")
	settings := func(pw string) *redis.Settings {
		t.Helper()
		if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s := &redis.Settings{Addresses: []string{srv.Addr}, PasswordFile: pwFile}
		if err := errors.Join(s.Resolve(nil), s.Validate()); err != nil {
			t.Fatal(err)
		}
		return s
	}
	c, err := settings("first").Config("reload", 0)
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, c)
	if errs := publish(t, p, rec(1, "orders", "k", "1")); errs[0] != nil {
		t.Fatal(errs[0])
	}
	admin := srv.Client(&goredis.Options{Password: "first"})
	if err := admin.ConfigSet(context.Background(), "requirepass", "second").Err(); err != nil {
		t.Fatal(err)
	}
	if err := settings("wrong").Reload(p); err == nil {
		t.Fatal("a reload with a wrong password succeeded")
	}
	if err := settings("second").Reload(p); err != nil {
		t.Fatal(err)
	}
	if errs := publish(t, p, rec(2, "orders", "k", "2")); errs[0] != nil {
		t.Fatalf("after the reload: %v", errs[0])
	}
}

func TestSettingsValidate(t *testing.T) {
	t.Parallel()
	s := &redis.Settings{Addresses: []string{"nohost", "a:1", "b:2"}, Username: "u", DB: 2, MaxLen: -1, Timeout: -time.Second}
	s.TLS.CAFile = "/nonexistent.pem"
	err := errors.Join(s.Resolve(nil), s.Validate())
	for _, want := range []string{`addresses: "nohost" is not host:port`, "username needs a password", "db: a cluster has only database 0",
		"max_len and max_entry_bytes must not be negative", "timeout is -1s", "tls settings are given but tls.enabled is false"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v; want it to say %q", err, want)
		}
	}
	if err := (&redis.Settings{}).Validate(); err == nil || !strings.Contains(err.Error(), "addresses is required") {
		t.Errorf("no addresses: %v", err)
	}
}
