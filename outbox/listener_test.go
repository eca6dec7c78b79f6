package outbox_test

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testwait"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// newListener returns a listener on s with the default probe interval.
func newListener(t *testing.T, s *pgtest.Schema) *outbox.Listener {
	t.Helper()
	l, err := outbox.NewListener(s.Pool, outbox.ListenerConfig{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// An insert wakes the listener; its own probe does not.
func TestListenerWakesOnInsert(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := pgtest.NewSchema(t)
	// The default probe interval (a minute): after the first probe, no
	// other notification than the insert's can come during the test.
	l := newListener(t, s)
	wakes := make(chan struct{}, 100)
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, func() { wakes <- struct{}{} }) }()

	testwait.For(t, "the listener to see its own probe", l.Healthy)
	// One wake-up, right after LISTEN (rows may have arrived unheard);
	// the probe, answered by now, added none.
	if n := len(wakes); n != 1 {
		t.Fatalf("%d wake-ups before any insert, want 1 (after LISTEN)", n)
	}
	<-wakes
	s.Exec(t, `INSERT INTO outbox (topic, payload) VALUES ('t', 'x')`)
	select {
	case <-wakes:
	case <-time.After(30 * time.Second):
		t.Fatal("no wake-up for an insert")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Status says whether notifications arrive and, when the listening
// connection is lost, why, until listening works again.
func TestListenerStatus(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := pgtest.NewSchema(t)
	l := newListener(t, s)
	if state, cause := l.Status(); state != outbox.ListenerStarting || cause != "" {
		t.Fatalf("Status before Run = %q, %q", state, cause)
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, func() {}) }()
	testwait.For(t, "notifications arriving", func() bool { state, _ := l.Status(); return state == outbox.ListenerArriving })

	// The server ends the listening session (this schema's only: tests
	// run in parallel).
	s.Exec(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN "`+l.Channel()+`"'`)
	testwait.For(t, "notifications reported lost", func() bool { state, _ := l.Status(); return state == outbox.ListenerNotArriving })
	if _, cause := l.Status(); cause == "" {
		t.Error("no cause for the lost notifications")
	}
	testwait.For(t, "notifications arriving again", func() bool { state, _ := l.Status(); return state == outbox.ListenerArriving })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A listening connection that stops answering without closing (a network
// black hole, a frozen server process) is given up when the listener's
// own probe does not arrive: it listens on a fresh connection, and
// notifications arrive again, instead of waiting on the dead one.
func TestListenerReplacesAConnectionThatMissedItsProbe(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := pgtest.NewSchema(t)
	l, err := outbox.NewListener(s.Pool, outbox.ListenerConfig{Schema: s.Name, ProbeInterval: 200 * time.Millisecond, ProbeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, func() {}) }()
	testwait.For(t, "notifications arriving", func() bool { state, _ := l.Status(); return state == outbox.ListenerArriving })

	// Freeze the listening server process: its socket stays open, and
	// nothing it is sent is read.
	var pid int
	if err := s.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN "`+l.Channel()+`"'`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("freezing the listening backend %d: %v (the tests run as root or as the server's user)", pid, err)
	}
	defer func() { _ = proc.Signal(syscall.SIGCONT) }()
	testwait.For(t, "the missed probe reported", func() bool { state, _ := l.Status(); return state == outbox.ListenerNotArriving })
	if _, cause := l.Status(); !strings.Contains(cause, "did not arrive within 1s") {
		t.Errorf("cause %q, want the missed probe", cause)
	}
	testwait.For(t, "notifications arriving on a fresh connection", func() bool { state, _ := l.Status(); return state == outbox.ListenerArriving })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
