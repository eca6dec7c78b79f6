package testwait_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

func TestPoll(t *testing.T) {
	t.Parallel()
	n := 0
	ok, saw := testwait.Poll(time.Minute, func() (bool, string) {
		n++
		return n == 3, strconv.Itoa(n)
	})
	if !ok || saw != "3" {
		t.Fatalf("Poll = %v, %q; want true after the third look", ok, saw)
	}
	start := time.Now()
	ok, saw = testwait.Poll(50*time.Millisecond, func() (bool, string) { return false, "never" })
	if ok || saw != "never" || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("Poll of a condition that never holds = %v, %q after %v; want false, what it saw, after the timeout",
			ok, saw, time.Since(start))
	}
}
