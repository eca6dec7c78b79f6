// Package testsignal lets code tell its tests what it has just done, so
// that they wait for the event itself rather than polling for its traces.
// A Signal does nothing until a test initialises it: code that runs in
// production pays one nil check per event.
package testsignal

import "time"

// TB is the part of testing.TB a Signal uses; the package does not import
// testing, so that it can be built into the code it watches.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// bufferSize bounds the events a Signal holds for a test that is not
// reading them yet; later ones are dropped, which can only make a test
// that waits for them time out, never pass.
const bufferSize = 1024

// DefaultTimeout is how long Wait and WaitFor wait.
const DefaultTimeout = 30 * time.Second

// Signal carries events of type T from the code to a test.
type Signal[T any] struct {
	ch chan T
}

// Init makes s record events. Call it before the code under test starts.
func (s *Signal[T]) Init() { s.ch = make(chan T, bufferSize) }

// Send records v for a test, without blocking; it does nothing unless s
// is initialised (or nil).
func (s *Signal[T]) Send(v T) {
	if s == nil || s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
	}
}

// Wait returns the next event, failing tb when none comes within
// DefaultTimeout. what says what the test waits for.
func (s *Signal[T]) Wait(tb TB, what string) T {
	tb.Helper()
	return s.WaitFor(tb, what, func(T) bool { return true })
}

// WaitFor returns the next event that match accepts, skipping the others,
// failing tb when none comes within DefaultTimeout.
func (s *Signal[T]) WaitFor(tb TB, what string, match func(T) bool) T {
	tb.Helper()
	if s.ch == nil {
		tb.Fatalf("waiting for %s: the signal was not initialised", what)
	}
	timeout := time.NewTimer(DefaultTimeout)
	defer timeout.Stop()
	for {
		select {
		case v := <-s.ch:
			if match(v) {
				return v
			}
		case <-timeout.C:
			tb.Fatalf("waited %s for %s", DefaultTimeout, what)
		}
	}
}
