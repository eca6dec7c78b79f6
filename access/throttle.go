package access

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Throttle slows down guessing: each client address may fail to sign in
// (a wrong API token, console token or single sign-on) a few times in a
// row, then once every few seconds; until then its further attempts are
// refused unchecked, the right token included. Other addresses are not
// touched. Failures are logged at most once a minute, as one line that
// counts them by address.
type Throttle struct {
	// Burst failures in a row, then one each Every.
	Burst int
	Every time.Duration
	// LogEvery is how often failures are logged at most. Default a
	// minute.
	LogEvery time.Duration
	Logger   *slog.Logger
	// Proxies are the addresses of the proxies in front of the
	// listeners (an ingress, a load balancer) whose X-Forwarded-For is
	// believed: a request through one is the client's that header names.
	Proxies []netip.Prefix

	mu      sync.Mutex
	clients map[string]*rate.Limiter
	failed  map[string]int // since the last line
	flush   *time.Timer    // the next line, while failures wait for it
	now     func() time.Time
}

// DefaultThrottle allows ten failures from an address, then one every
// six seconds.
func DefaultThrottle(log *slog.Logger) *Throttle {
	return &Throttle{Burst: 10, Every: 6 * time.Second, LogEvery: time.Minute, Logger: log}
}

// maxClients bounds the addresses remembered; past it, those that have
// not failed lately are forgotten first.
const maxClients = 100_000

// Client is the address a request comes from: its connection's peer,
// or, when that is one of Proxies, the address X-Forwarded-For names
// last that is not one of them (each proxy appends the address it was
// reached from; a client can write anything before them).
func (t *Throttle) Client(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if t == nil || !t.proxy(host) {
		return host
	}
	var hops []string
	for _, h := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(h, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		hop := strings.TrimSpace(hops[i])
		if _, err := netip.ParseAddr(hop); err != nil {
			break // not an address: trust nothing before it
		}
		if !t.proxy(hop) {
			return hop
		}
		host = hop
	}
	return host
}

// proxy says addr is one of Proxies.
func (t *Throttle) proxy(addr string) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range t.Proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Wait reports how long client must wait before its next attempt is
// checked; zero when it may try now.
func (t *Throttle) Wait(client string) time.Duration {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.clients[client]
	if l == nil {
		return 0
	}
	if tokens := l.TokensAt(t.clock()); tokens < 1 {
		return time.Duration((1 - tokens) * float64(t.Every))
	}
	return 0
}

// Failed records a failed attempt from client, with what failed.
func (t *Throttle) Failed(client, what string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.clients == nil {
		t.clients, t.failed = map[string]*rate.Limiter{}, map[string]int{}
	}
	l := t.clients[client]
	if l == nil {
		if len(t.clients) >= maxClients {
			t.forget()
		}
		l = rate.NewLimiter(rate.Every(t.Every), max(t.Burst, 1))
		t.clients[client] = l
	}
	l.AllowN(t.clock(), 1)
	t.failed[client+" ("+what+")"]++
	if t.flush == nil {
		// The first failure since the last line is logged at once; those
		// that follow within LogEvery wait for one line after it.
		t.log()
		t.flush = time.AfterFunc(cmp.Or(t.LogEvery, time.Minute), func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			t.flush = nil
			if len(t.failed) > 0 {
				t.log()
			}
		})
	}
}

// log writes one line of the failures counted, and starts counting anew.
// t.mu is held.
func (t *Throttle) log() {
	if t.Logger == nil {
		clear(t.failed)
		return
	}
	total := 0
	var by []string
	for _, c := range slices.Sorted(maps.Keys(t.failed)) {
		total += t.failed[c]
		by = append(by, fmt.Sprintf("%s ×%d", c, t.failed[c]))
	}
	t.Logger.Warn("failed sign-ins", slog.Int("failures", total), slog.String("by_client", strings.Join(by, ", ")),
		slog.String("throttle", fmt.Sprintf("%d in a row, then one every %s", max(t.Burst, 1), t.Every)))
	clear(t.failed)
}

// forget drops the addresses whose failures have worn off; t.mu is held.
func (t *Throttle) forget() {
	now := t.clock()
	for c, l := range t.clients {
		if l.TokensAt(now) >= float64(l.Burst()) {
			delete(t.clients, c)
		}
	}
	if len(t.clients) >= maxClients {
		clear(t.clients)
	}
}

func (t *Throttle) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}
