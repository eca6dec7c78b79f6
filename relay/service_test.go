package relay

import (
	"context"
	"errors"
	"testing"
)

func TestServiceStartsStopsAndReportsItsFailure(t *testing.T) {
	t.Parallel()
	ctx, fails := withFailures(context.Background())
	defer fails.stop()

	// A service that runs until stopped ends with stop, and stop waits.
	ran, ended := make(chan struct{}), false
	loop := newService("loop", func(ctx context.Context) error {
		close(ran)
		<-ctx.Done()
		ended = true
		return ctx.Err()
	})
	loop.start(ctx, fails)
	<-ran
	loop.stop()
	if !ended {
		t.Fatal("stop returned before the service ended")
	}
	loop.stop() // twice is fine
	newService("never started", nil).stop()
	if err := fails.first(); err != nil || ctx.Err() != nil {
		t.Fatalf("a service stopped by stop failed the relay: %v", err)
	}

	// One that fails stops the relay with its error; a second failure is
	// not the first.
	boom := errors.New("boom")
	failing := newService("listener", func(context.Context) error { return boom })
	failing.start(ctx, fails)
	<-ctx.Done()
	failing.stop()
	again := newService("cleaner", func(context.Context) error { return errors.New("later") })
	again.start(context.Background(), fails)
	again.stop()
	if err := fails.first(); !errors.Is(err, boom) || err.Error() != "listener: boom" {
		t.Fatalf("the relay's failure is %v, want the listener's", err)
	}
}
