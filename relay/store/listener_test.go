package store_test

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// newListener returns a listener on s with the default probe interval.
func newListener(t *testing.T, s *pgtest.Schema) *store.Listener {
	t.Helper()
	l, err := store.NewListener(s.Pool, store.ListenerConfig{Schema: s.Name})
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
	go func() { done <- l.Run(ctx, func() { wakes <- struct{}{} }, func() {}) }()

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
	if state, cause := l.Status(); state != store.ListenerStarting || cause != "" {
		t.Fatalf("Status before Run = %q, %q", state, cause)
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, func() {}, func() {}) }()
	testwait.For(t, "notifications arriving", func() bool { state, _ := l.Status(); return state == store.ListenerArriving })

	// The server ends the listening session (this schema's only: tests
	// run in parallel).
	s.Exec(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN "`+l.Channel()+`"'`)
	testwait.For(t, "notifications reported lost", func() bool { state, _ := l.Status(); return state == store.ListenerNotArriving })
	if _, cause := l.Status(); cause == "" {
		t.Error("no cause for the lost notifications")
	}
	testwait.For(t, "notifications arriving again", func() bool { state, _ := l.Status(); return state == store.ListenerArriving })
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
	l, err := store.NewListener(s.Pool, store.ListenerConfig{Schema: s.Name, ProbeInterval: 200 * time.Millisecond, ProbeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, func() {}, func() {}) }()
	testwait.For(t, "notifications arriving", func() bool { state, _ := l.Status(); return state == store.ListenerArriving })

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
	testwait.For(t, "the missed probe reported", func() bool { state, _ := l.Status(); return state == store.ListenerNotArriving })
	if _, cause := l.Status(); !strings.Contains(cause, "did not arrive within 1s") {
		t.Errorf("cause %q, want the missed probe", cause)
	}
	testwait.For(t, "notifications arriving on a fresh connection", func() bool { state, _ := l.Status(); return state == store.ListenerArriving })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A process that joins the claimers, one that gives partitions up and one
// that leaves tell the others at once, on the outbox's channel: they sync
// then, not at their next tick. A renewal that changes nothing is quiet.
func TestPartitionChangesAreAnnounced(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := pgtest.NewSchema(t)
	l := newListener(t, s)
	wakes := make(chan struct{}, 100)
	resyncs := make(chan struct{}, 100)
	done := make(chan error, 1)
	go func() {
		done <- l.Run(ctx, func() { wakes <- struct{}{} }, func() { resyncs <- struct{}{} })
	}()
	testwait.For(t, "the listener to see its own probe", l.Healthy)
	<-wakes // right after LISTEN
	// announced waits for the notice of what was just done; quiet shows
	// there was none: the listener reads notifications in the order their
	// transactions committed, so one would come before the wake-up of an
	// insert made after.
	announced := func(what string) {
		t.Helper()
		select {
		case <-resyncs:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no partitions notice", what)
		}
	}
	quiet := func(what string) {
		t.Helper()
		s.Exec(t, `INSERT INTO outbox (topic, payload) VALUES ('t', 'x')`)
		select {
		case <-wakes:
		case <-time.After(30 * time.Second):
			t.Fatal("no wake-up for an insert")
		}
		if n := len(resyncs); n != 0 {
			t.Fatalf("%s: %d partitions notices, want none", what, n)
		}
	}
	sync := func(st *store.Store) {
		t.Helper()
		if err := st.SyncPartitions(ctx); err != nil {
			t.Fatal(err)
		}
	}

	a := leasedStore(t, s, "a")
	announced("a joins")
	sync(a)
	quiet("a renews")
	b := leasedStore(t, s, "b")
	announced("b joins")
	if got := b.Share(); got.Lo <= got.Hi {
		t.Fatalf("b claims partitions %d–%d while a holds them all", got.Lo, got.Hi)
	}
	sync(a)
	announced("a gives partitions up")
	half := store.Partitions / 2
	if got := a.Share(); got.Lo != 0 || got.Hi != half-1 || got.Giving != 0 || got.Claimers != 2 {
		t.Fatalf("a's share %+v, want partitions 0–%d of 2 claimers, none to give up", got, half-1)
	}
	sync(b)
	quiet("b takes what a gave up")
	if got := b.Share(); got.Lo != half || got.Hi != store.Partitions-1 {
		t.Fatalf("b's share %+v, want partitions %d–%d", got, half, store.Partitions-1)
	}
	if err := b.LeavePartitions(ctx); err != nil {
		t.Fatal(err)
	}
	announced("b leaves")
	sync(a)
	announced("a sees b gone")
	if got := a.Share(); got.Lo != 0 || got.Hi != store.Partitions-1 {
		t.Fatalf("a's share %+v after b left, want every partition", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
