package access

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// An address may fail Burst times in a row, then once each Every; other
// addresses are untouched; the failures are logged as they begin and
// then once each LogEvery, counted by address.
func TestThrottle(t *testing.T) {
	t.Parallel()
	var out lockedBuffer
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	th := &Throttle{Burst: 3, Every: 10 * time.Second, LogEvery: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&out, nil)), now: func() time.Time { return now }}
	var nilThrottle *Throttle
	if nilThrottle.Wait("a") != 0 {
		t.Error("a nil throttle holds back")
	}
	nilThrottle.Failed("a", "API token")
	for i := range 3 {
		if w := th.Wait("a"); w != 0 {
			t.Fatalf("attempt %d waits %s", i+1, w)
		}
		th.Failed("a", "API token")
	}
	if w := th.Wait("a"); w != 10*time.Second {
		t.Errorf("after 3 failures: wait %s, want 10s", w)
	}
	if w := th.Wait("b"); w != 0 {
		t.Errorf("another address waits %s", w)
	}
	now = now.Add(4 * time.Second)
	if w := th.Wait("a"); w != 6*time.Second {
		t.Errorf("4s later: wait %s, want 6s", w)
	}
	now = now.Add(6 * time.Second)
	if w := th.Wait("a"); w != 0 {
		t.Errorf("10s later: wait %s, want none", w)
	}
	th.Failed("a", "console token")
	if w := th.Wait("a"); w != 10*time.Second {
		t.Errorf("a failure after the wait: wait %s, want 10s again", w)
	}
	// The first failure was logged at once; the four after it, in one
	// line a LogEvery later.
	testwait.Within(t, 10*time.Second, "the second line", func() bool {
		return strings.Count(out.String(), "failed sign-ins") >= 2
	})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "failures=1") || !strings.Contains(lines[1], "failures=3") ||
		!strings.Contains(lines[1], "a (API token) ×2, a (console token) ×1") {
		t.Errorf("log:\n%s", out.String())
	}
	// Addresses whose failures wore off are forgotten when the map is
	// full.
	now = now.Add(time.Hour)
	th.mu.Lock()
	th.forget()
	left := len(th.clients)
	th.mu.Unlock()
	if left != 0 {
		t.Errorf("%d addresses remembered an hour later", left)
	}
}
