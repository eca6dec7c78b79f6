package access

import (
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/syncbuf"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

// An address may fail Burst times in a row, then once each Every; other
// addresses are untouched; the failures are logged as they begin and
// then once each LogEvery, counted by address.
func TestThrottle(t *testing.T) {
	t.Parallel()
	var out syncbuf.Buffer
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

// Behind a trusted proxy the client is the address X-Forwarded-For names
// last that is not a trusted proxy's; an address a client writes before
// them is not believed, and without a trusted proxy the header is not
// read at all.
func TestThrottleClient(t *testing.T) {
	t.Parallel()
	th := &Throttle{Proxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")}}
	for _, c := range []struct {
		peer string
		xff  []string
		want string
	}{
		{"203.0.113.9:5000", nil, "203.0.113.9"},
		{"203.0.113.9:5000", []string{"198.51.100.1"}, "203.0.113.9"}, // not through a trusted proxy
		{"10.1.2.3:5000", nil, "10.1.2.3"},
		{"10.1.2.3:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"10.1.2.3:5000", []string{"1.1.1.1, 198.51.100.1, 10.9.9.9"}, "198.51.100.1"}, // a client's own entry is not believed
		{"10.1.2.3:5000", []string{"198.51.100.1", "192.0.2.7"}, "198.51.100.1"},       // two headers, two proxies
		{"10.1.2.3:5000", []string{"10.2.2.2"}, "10.2.2.2"},                            // every hop a proxy: the first
		{"10.1.2.3:5000", []string{"198.51.100.1, not-an-address"}, "10.1.2.3"},
		{"[::ffff:10.1.2.3]:5000", []string{"198.51.100.1"}, "198.51.100.1"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.peer
		for _, h := range c.xff {
			r.Header.Add("X-Forwarded-For", h)
		}
		if got := th.Client(r); got != c.want {
			t.Errorf("peer %s, X-Forwarded-For %q: client %s, want %s", c.peer, c.xff, got, c.want)
		}
	}
	var none *Throttle
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.1.2.3:5000"
	r.Header.Set("X-Forwarded-For", "198.51.100.1")
	if got := none.Client(r); got != "10.1.2.3" {
		t.Errorf("without a throttle: %s", got)
	}
}
