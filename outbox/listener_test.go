package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testwait"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// An insert wakes the listener; its own probe does not.
func TestListenerWakesOnInsert(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := pgtest.NewSchema(t)
	// The default probe interval (a minute): after the first probe, no
	// other notification than the insert's can come during the test.
	l, err := outbox.NewListener(s.Pool, outbox.ListenerConfig{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
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
