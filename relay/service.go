package relay

import (
	"context"
	"fmt"
	"sync"
)

// service is the life of one of the relay's background loops beside the
// workers: the fleet's sync, and per outbox the renewal of its partitions,
// its listener, its cleaner and its releaser. Every one is started and
// stopped the same way: start runs it in its own goroutine until stop, or
// until the context it was started with ends; stop cancels it and waits
// for it to end, and may be called whether or not it started. An error it
// returns while not stopping stops the relay (see failures).
//
// Run starts them and stops them in one order: the fleet's sync first and
// last, an outbox's partitions before its first claim and after its last
// write-back, its listener and cleaner with its workers.
type service struct {
	name string
	run  func(ctx context.Context) error

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

func newService(name string, run func(ctx context.Context) error) *service {
	return &service{name: name, run: run}
}

// start runs the service until stop or the end of ctx; a failure goes to
// fail.
func (s *service) start(ctx context.Context, fail *failures) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	s.mu.Lock()
	s.cancel, s.done = cancel, done
	s.mu.Unlock()
	go func() {
		defer close(done)
		if err := s.run(ctx); err != nil && ctx.Err() == nil {
			fail.report(fmt.Errorf("%s: %w", s.name, err))
		}
	}()
}

// stop ends the service and waits until it has.
func (s *service) stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.mu.Unlock()
	if done == nil {
		return // never started
	}
	cancel()
	<-done
}

// failures stops the relay on the first failure of a service, and keeps it
// for Run to return.
type failures struct {
	once sync.Once
	err  error
	stop context.CancelFunc
}

// withFailures returns a context that ends when a service fails.
func withFailures(ctx context.Context) (context.Context, *failures) {
	ctx, cancel := context.WithCancel(ctx)
	return ctx, &failures{stop: cancel}
}

func (f *failures) report(err error) {
	f.once.Do(func() {
		f.err = err
		f.stop()
	})
}

// first returns the first failure, if any; call it once every service
// has stopped.
func (f *failures) first() error { return f.err }
