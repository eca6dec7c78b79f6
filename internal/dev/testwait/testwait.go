// Package testwait waits, in tests, for conditions that no event
// announces: the state of another process, of PostgreSQL's sessions, of a
// connection pool, or a reading the code exposes only as a number. Where
// the code under test can say what happened (a channel, a callback), tests
// wait on that instead; every poll that remains goes through here.
package testwait

import (
	"testing"
	"time"
)

// DefaultTimeout bounds For.
const DefaultTimeout = 30 * time.Second

// For polls cond until it holds, failing tb with what after DefaultTimeout.
func For(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	Within(tb, DefaultTimeout, what, cond)
}

// Within polls cond until it holds, failing tb with what after timeout.
func Within(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	State(tb, timeout, func() (bool, string) { return cond(), "timed out waiting for " + what })
}

// State polls cond until it holds, failing tb after timeout with what cond
// last said it saw.
func State(tb testing.TB, timeout time.Duration, cond func() (ok bool, saw string)) {
	tb.Helper()
	if ok, saw := Poll(timeout, cond); !ok {
		tb.Fatal(saw)
	}
}

// Poll polls cond until it holds or timeout passes, and returns whether it
// held and what cond last said. It does not fail the test, so it may run
// off the test's goroutine.
func Poll(timeout time.Duration, cond func() (ok bool, saw string)) (bool, string) {
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		ok, saw := cond()
		if ok || time.Now().After(deadline) {
			return ok, saw
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// SkipShort skips tb in -short runs, the inner loop: for tests that take
// long by design (a fault held for seconds, servers crashed and restarted,
// kill checkers, image builds, a RabbitMQ node's boot) or take more than
// a few seconds of work. make test runs them.
func SkipShort(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("long by design: skipped in -short runs; make test runs it")
	}
}
