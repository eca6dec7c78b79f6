// Package natstest runs a real NATS server with JetStream in the test's
// process, its streams on disk in a throwaway directory, for the NATS
// sink's tests: start, stop and start again on the same port and data,
// add streams, and read back what they stored.
package natstest

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options change the server a test starts.
type Options struct {
	// Users, when set, are the only ones allowed in; Token, when set, is
	// the one token that is.
	Users []*server.User
	Token string
	// TLS, when set, makes the server speak TLS only.
	TLS *tls.Config
	// MaxPayload bounds a message; default the server's (1 MiB).
	MaxPayload int32
}

// Server is a NATS server with JetStream.
type Server struct {
	tb   testing.TB
	opts server.Options
	srv  *server.Server
	// URL is the server's client URL, the same across restarts.
	URL string
}

// Start starts a server on a free port with its streams in a directory of
// the test's, stopped when the test ends.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	s := &Server{tb: tb, opts: server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: tb.TempDir(), Users: o.Users, Authorization: o.Token,
		MaxPayload: o.MaxPayload,
	}}
	if o.TLS != nil {
		s.opts.TLS, s.opts.TLSConfig, s.opts.TLSTimeout = true, o.TLS, 5
	}
	s.start()
	s.opts.Port = s.srv.Addr().(*net.TCPAddr).Port
	s.URL = s.srv.ClientURL()
	if o.TLS != nil {
		s.URL = "tls://" + s.srv.Addr().String()
	}
	tb.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.tb.Helper()
	opts := s.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		s.tb.Fatalf("natstest: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		s.tb.Fatal("natstest: the server did not start")
	}
	s.srv = srv
}

// Stop stops the server; its streams stay on disk.
func (s *Server) Stop() {
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		s.srv = nil
	}
}

// Restart starts the server again, on the same port with the same
// streams.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	s.start()
}

// Connect returns a JetStream client of the server, closed when the test
// ends, with opts (credentials, TLS) added.
func (s *Server) Connect(opts ...natsgo.Option) jetstream.JetStream {
	s.tb.Helper()
	nc, err := natsgo.Connect(s.URL, opts...)
	if err != nil {
		s.tb.Fatalf("natstest: connect: %v", err)
	}
	s.tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		s.tb.Fatal(err)
	}
	return js
}

// AddStream adds a file-backed stream named name that takes subjects,
// through js (Connect's, or one with credentials).
func AddStream(tb testing.TB, js jetstream.JetStream, name string, subjects ...string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage,
		Duplicates: 10 * time.Minute}); err != nil {
		tb.Fatalf("natstest: add stream %s: %v", name, err)
	}
}

// Message is one message a stream stored.
type Message struct {
	Subject string
	Data    []byte
	Header  natsgo.Header
}

// Messages returns the messages stream holds, in the order it stored
// them.
func Messages(tb testing.TB, js jetstream.JetStream, stream string) []Message {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		tb.Fatalf("natstest: stream %s: %v", stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var out []Message
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			tb.Fatalf("natstest: stream %s message %d: %v", stream, seq, err)
		}
		out = append(out, Message{Subject: m.Subject, Data: m.Data, Header: m.Header})
	}
	return out
}
