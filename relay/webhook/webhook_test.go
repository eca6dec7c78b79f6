package webhook_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/internal/dev/tlstest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/webhook"
)

func record(id int64, key string, payload string, headers map[string]string) sink.Record {
	return sink.Record{ID: id, EventID: uuid.New(), Topic: "t", Key: key, HasKey: key != "",
		Payload: []byte(payload), PayloadSize: len(payload), Headers: headers}
}

// newPublisher returns a publisher for url that may reach loopback.
func newPublisher(t *testing.T, cfg webhook.Config) *webhook.Publisher {
	t.Helper()
	cfg.AllowPrivateNetworks = true
	p, err := webhook.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestStatusClass(t *testing.T) {
	for code, want := range map[int]sink.Class{
		400: sink.ClassPermanent, 404: sink.ClassPermanent, 405: sink.ClassPermanent, 409: sink.ClassPermanent,
		410: sink.ClassPermanent, 413: sink.ClassPermanent, 422: sink.ClassPermanent, 418: sink.ClassPermanent,
		408: sink.ClassTransient, 425: sink.ClassTransient, 429: sink.ClassTransient, 500: sink.ClassTransient,
		502: sink.ClassTransient, 503: sink.ClassTransient, 504: sink.ClassTransient, 599: sink.ClassTransient,
		401: sink.ClassSystemic, 403: sink.ClassSystemic, 407: sink.ClassSystemic,
		301: sink.ClassSystemic, 302: sink.ClassSystemic, 307: sink.ClassSystemic, 308: sink.ClassSystemic,
	} {
		if got := webhook.StatusClass(code); got != want {
			t.Errorf("StatusClass(%d) = %s, want %s", code, got, want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	year := 365 * 24 * time.Hour
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"7", 7 * time.Second},
		{" 12 ", 12 * time.Second},
		{"0", 0},
		{"-5", 0},
		{"1.5", 0},
		{"soon", 0},
		{"7 seconds", 0},
		{"99999999999999999999999", year},
		{"31536001", year},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0},
		{now.Add(3 * year).Format(http.TimeFormat), year},
		{"Sun, 01 Mar 2026 12:00:30 GMT", 30 * time.Second},
		{"Sunday, 01-Mar-26 12:00:30 GMT", 30 * time.Second}, // RFC 850
		{"Sun Mar  1 12:00:30 2026", 30 * time.Second},       // asctime
		{"Sun, 01 Mar 2026 25:00:00 GMT", 0},
	} {
		if got := webhook.ParseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("ParseRetryAfter(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestForbidden(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1": true, "10.1.2.3": true, "172.16.0.1": true, "192.168.1.1": true, "169.254.169.254": true,
		"100.64.0.1": true, "0.0.0.0": true, "::1": true, "fe80::1": true, "fd00::1": true, "::ffff:127.0.0.1": true,
		"::ffff:10.0.0.1": true, "224.0.0.1": true, "::": true,
		"64:ff9b::a00:1": true, "2002:a00:1::1": true, "240.1.2.3": true,
		"8.8.8.8": false, "93.184.216.34": false, "2606:4700:4700::1111": false,
	} {
		if got := webhook.Forbidden(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Forbidden(%s) = %v, want %v", addr, got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	_, err := webhook.New(webhook.Config{
		URL:            "ftp://user:pw@example.com/x?token=abc",
		BearerToken:    "t",
		Username:       "u",
		Headers:        map[string]string{"Bad Header": "x", "Idempotency-Key": "y"},
		SigningSecrets: []string{"nope", "whsec_!!"},
		StatusClasses:  map[int]sink.Class{99: sink.ClassTransient, 204: sink.ClassPermanent},
		Timeout:        -time.Second,
	})
	if err == nil {
		t.Fatal("New accepted a bad configuration")
	}
	for _, want := range []string{"must be http or https", "not both", "basic auth needs both", `"Bad Header"`,
		`"Idempotency-Key" is set by the relay`, "signing secret 1", "signing secret 2", "99: not an HTTP status",
		"204 is a success", "timeout is -1s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "pw") || strings.Contains(err.Error(), "abc") {
		t.Errorf("error shows URL secrets: %v", err)
	}
}

func newSecret(t *testing.T) string {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(key)
}

func TestRequest(t *testing.T) {
	type got struct {
		header http.Header
		body   []byte
	}
	reqs := make(chan got, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			t.Errorf("method %s", r.Method)
		}
		b, _ := io.ReadAll(r.Body)
		reqs <- got{r.Header.Clone(), b}
	}))
	defer srv.Close()
	current, previous := newSecret(t), newSecret(t)
	p := newPublisher(t, webhook.Config{
		URL: srv.URL + "/hooks", BearerToken: "tok-123",
		Headers:        map[string]string{"X-Tenant": "acme"},
		SigningSecrets: []string{current, previous},
		ClientName:     "billing-relay",
	})
	withType := record(1, "", `{"a":1}`, map[string]string{"Content-Type": "application/vnd.acme+json",
		"X-Tenant": "row", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"Authorization": "Bearer stolen", "Idempotency-Key": "forged"})
	plain := record(2, "", "hello", nil)
	for _, rec := range []sink.Record{withType, plain} {
		if errs := p.Publish(context.Background(), []sink.Record{rec}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		r := <-reqs
		h := r.header
		if string(r.body) != string(rec.Payload) {
			t.Errorf("body %q, want %q", r.body, rec.Payload)
		}
		if k := h.Get("Idempotency-Key"); k != rec.EventID.String() {
			t.Errorf("Idempotency-Key %q, want the event id %s", k, rec.EventID)
		}
		if ua := h.Get("User-Agent"); ua != "billing-relay" {
			t.Errorf("User-Agent %q, want the client name", ua)
		}
		if a := h.Get("Authorization"); a != "Bearer tok-123" {
			t.Errorf("Authorization %q", a)
		}
		if v := h.Get("X-Tenant"); v != "acme" {
			t.Errorf("static header X-Tenant = %q; configuration should win over the row", v)
		}
		for _, secret := range []string{current, previous} {
			wh, err := standardwebhooks.NewWebhook(secret)
			if err != nil {
				t.Fatal(err)
			}
			if err := wh.Verify(r.body, h); err != nil {
				t.Errorf("signature does not verify with one of the secrets: %v", err)
			}
		}
		if h.Get("webhook-id") != rec.EventID.String() {
			t.Errorf("webhook-id %q", h.Get("webhook-id"))
		}
		wantType, wantTrace := "application/json", ""
		if rec.ID == withType.ID {
			wantType, wantTrace = "application/vnd.acme+json", withType.Headers["traceparent"]
		}
		if ct := h.Get("Content-Type"); ct != wantType {
			t.Errorf("Content-Type %q, want %q", ct, wantType)
		}
		if tp := h.Get("traceparent"); tp != wantTrace {
			t.Errorf("traceparent %q, want %q", tp, wantTrace)
		}
	}
}

func TestSameIdempotencyKeyOnEveryAttempt(t *testing.T) {
	var calls atomic.Int32
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"), r.Header.Get("webhook-id"))
		mu.Unlock()
		if calls.Add(1) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	p := newPublisher(t, webhook.Config{URL: srv.URL, SigningSecrets: []string{newSecret(t)}})
	rec := record(1, "k", "x", nil)
	for i := 0; i < 3; i++ {
		err := p.Publish(context.Background(), []sink.Record{rec})[0]
		if (err == nil) != (i == 2) {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	for _, k := range keys {
		if k != rec.EventID.String() {
			t.Fatalf("keys over the attempts: %q, want the event id each time", keys)
		}
	}
}

func TestStatuses(t *testing.T) {
	long := strings.Repeat("x", 5000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/503":
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(503)
			_, _ = io.WriteString(w, "maintenance")
		case "/429":
			w.Header().Set("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT") // past
			w.WriteHeader(429)
		case "/500":
			w.Header().Set("Retry-After", "60") // not honoured on a 500
			w.WriteHeader(500)
			_, _ = io.WriteString(w, long)
		case "/422":
			w.WriteHeader(422)
			_, _ = io.WriteString(w, `{"error":"amount missing"}`)
		case "/401":
			w.WriteHeader(401)
		case "/409":
			w.WriteHeader(409)
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		path      string
		class     sink.Class
		scope     sink.Scope
		hint      time.Duration
		inError   string
		overrides map[int]sink.Class
	}{
		{"/503", sink.ClassTransient, sink.ScopeRecord, 7 * time.Second, `503 Service Unavailable: "maintenance"`, nil},
		{"/429", sink.ClassTransient, sink.ScopeRecord, 0, "429 Too Many Requests", nil},
		{"/500", sink.ClassTransient, sink.ScopeRecord, 0, "(truncated)", nil},
		{"/422", sink.ClassPermanent, sink.ScopeRecord, 0, `422 Unprocessable Entity: "{\"error\":\"amount missing\"}"`, nil},
		{"/401", sink.ClassSystemic, sink.ScopeDestination, 0, "401 Unauthorized", nil},
		{"/409", sink.ClassPermanent, sink.ScopeRecord, 0, "409 Conflict", nil},
		{"/409", sink.ClassTransient, sink.ScopeRecord, 0, "409 Conflict", map[int]sink.Class{409: sink.ClassTransient}},
		{"/409", sink.ClassSystemic, sink.ScopeDestination, 0, "409 Conflict", map[int]sink.Class{409: sink.ClassSystemic}},
	} {
		p := newPublisher(t, webhook.Config{URL: srv.URL + tc.path + "?token=secret", StatusClasses: tc.overrides})
		err := p.Publish(context.Background(), []sink.Record{record(1, "", "{}", nil)})[0]
		if err == nil {
			t.Fatalf("%s: no error", tc.path)
		}
		e := sink.Classify(err)
		if e.Class != tc.class || e.Scope != tc.scope || e.RetryAfter != tc.hint {
			t.Errorf("%s: class %s, scope %s, hint %s; want %s, %s, %s", tc.path, e.Class, e.Scope, e.RetryAfter, tc.class, tc.scope, tc.hint)
		}
		if !strings.Contains(err.Error(), tc.inError) {
			t.Errorf("%s: error %q lacks %q", tc.path, err, tc.inError)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: error shows the URL's query: %v", tc.path, err)
		}
		if len(err.Error()) > 2*webhook.DefaultMaxResponseBytes {
			t.Errorf("%s: error of %d bytes: the body should be capped", tc.path, len(err.Error()))
		}
	}
}

func TestRedirectNotFollowed(t *testing.T) {
	var followed atomic.Bool
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { followed.Store(true) }))
	defer target.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	p := newPublisher(t, webhook.Config{URL: srv.URL})
	err := p.Publish(context.Background(), []sink.Record{record(1, "", "{}", nil)})[0]
	if err == nil || sink.Classify(err).Class != sink.ClassSystemic || !strings.Contains(err.Error(), "307") {
		t.Fatalf("redirect: %v (want a systemic 307 error)", err)
	}
	if followed.Load() {
		t.Fatal("the redirect was followed")
	}
}

func TestNoResponseHeadersTimesOut(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var open atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // then the server notices the client leave
		<-r.Context().Done()      // never answers; returns when the client gives up
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	defer srv.Close()
	p, err := webhook.New(webhook.Config{URL: srv.URL, AllowPrivateNetworks: true, ResponseHeaderTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	recs := []sink.Record{record(1, "", "a", nil), record(2, "", "b", nil), record(3, "k", "c", nil)}
	errs := p.Publish(context.Background(), recs)
	for i, err := range errs {
		var ne net.Error
		e := sink.Classify(err)
		if err == nil || e.Class != sink.ClassTransient || e.Scope != sink.ScopeDestination || !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("record %d: %v (want a transient timeout of the endpoint)", i, err)
		}
	}
	_ = p.Close()
	testwait.State(t, 10*time.Second, func() (bool, string) {
		n := open.Load()
		return n == 0, fmt.Sprintf("%d connections still open on the server", n)
	})
}

func TestSSRFGuard(t *testing.T) {
	var reached atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached.Store(true) }))
	defer srv.Close()
	for _, u := range []string{srv.URL, strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)} {
		p, err := webhook.New(webhook.Config{URL: u})
		if err != nil {
			t.Fatal(err)
		}
		err = p.Publish(context.Background(), []sink.Record{record(1, "", "{}", nil)})[0]
		if err == nil || sink.Classify(err).Class != sink.ClassSystemic || !strings.Contains(err.Error(), "SSRF guard") {
			t.Errorf("%s: %v (want a systemic SSRF refusal)", u, err)
		}
		_ = p.Close()
	}
	if reached.Load() {
		t.Fatal("a request reached a loopback server through the guard")
	}
}

func TestConnectionRefusedIsSystemic(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	p := newPublisher(t, webhook.Config{URL: "http://" + addr})
	err = p.Publish(context.Background(), []sink.Record{record(1, "", "{}", nil)})[0]
	if err == nil || sink.Classify(err).Class != sink.ClassSystemic {
		t.Fatalf("refused connection: %v (want systemic)", err)
	}
}

func TestKeyOrderAndConcurrency(t *testing.T) {
	var mu sync.Mutex
	var order []string
	var now, peak atomic.Int32
	// The two unkeyed rows wait for each other at the server: they can
	// only both arrive if they are sent in parallel.
	var arrived atomic.Int32
	both := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := now.Add(1)
		defer now.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		b, _ := io.ReadAll(r.Body)
		if strings.HasPrefix(string(b), "u") {
			if arrived.Add(1) == 2 {
				close(both)
			}
			select {
			case <-both:
			case <-time.After(10 * time.Second):
				t.Errorf("%s: the other unkeyed row never came: rows are not sent in parallel", b)
			}
		}
		mu.Lock()
		order = append(order, string(b))
		mu.Unlock()
		if string(b) == "k2" {
			w.WriteHeader(500)
		}
	}))
	defer srv.Close()
	p := newPublisher(t, webhook.Config{URL: srv.URL, Concurrency: 3})
	recs := []sink.Record{record(1, "k", "k1", nil), record(2, "", "u1", nil), record(3, "k", "k2", nil),
		record(4, "", "u2", nil), record(5, "k", "k3", nil), record(6, "j", "j1", nil)}
	errs := p.Publish(context.Background(), recs)
	if errs[0] != nil || errs[1] != nil || errs[3] != nil || errs[5] != nil {
		t.Errorf("errors %v", errs)
	}
	if errs[2] == nil || !errors.Is(errs[4], sink.ErrNotSent) {
		t.Errorf("k2: %v, k3: %v; want a failure and then not sent", errs[2], errs[4])
	}
	mu.Lock()
	defer mu.Unlock()
	k1, k2 := -1, -1
	for i, b := range order {
		switch b {
		case "k1":
			k1 = i
		case "k2":
			k2 = i
		case "k3":
			t.Error("k3 was sent after k2 failed")
		}
	}
	if k1 < 0 || k2 < k1 {
		t.Errorf("order %v: k1 must precede k2", order)
	}
	if peak.Load() > 3 {
		t.Errorf("%d requests at once, above the concurrency of 3", peak.Load())
	}
}

func TestMutualTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "test CA")
	clientCert := ca.Client(t, "relay")
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != "relay" {
			w.WriteHeader(401)
		}
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.StartTLS()
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())

	p := newPublisher(t, webhook.Config{URL: srv.URL, TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}}})
	if err := p.Publish(context.Background(), []sink.Record{record(1, "", "{}", nil)})[0]; err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}
	without := newPublisher(t, webhook.Config{URL: srv.URL, TLS: &tls.Config{RootCAs: roots}})
	if err := without.Publish(context.Background(), []sink.Record{record(1, "", "{}", nil)})[0]; err == nil {
		t.Fatal("without a client certificate: delivered")
	}
	untrusted := newPublisher(t, webhook.Config{URL: srv.URL})
	err := untrusted.Publish(context.Background(), []sink.Record{record(1, "", "{}", nil)})[0]
	if err == nil || sink.Classify(err).Class != sink.ClassSystemic {
		t.Fatalf("server certificate from an unknown authority: %v (want systemic)", err)
	}
}

func TestRowsNotStartedByTheDeadlineAreNotSent(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-time.After(200 * time.Millisecond):
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	p := newPublisher(t, webhook.Config{URL: srv.URL, Concurrency: 1})
	var recs []sink.Record
	for i := range 6 {
		recs = append(recs, record(int64(i+1), "", "x", nil))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	errs := p.Publish(ctx, recs)
	notSent := 0
	for _, err := range errs {
		if errors.Is(err, sink.ErrNotSent) {
			notSent++
		}
	}
	if sent := int(requests.Load()); sent+notSent != len(recs) {
		t.Fatalf("%d requests made and %d rows reported not sent, of %d: rows never sent must be ErrNotSent (errors %v)",
			sent, notSent, len(recs), errs)
	}
}

// Without a client name, requests say they come from outbox-relay.
func TestDefaultUserAgent(t *testing.T) {
	t.Parallel()
	agents := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { agents <- r.UserAgent() }))
	defer srv.Close()
	p := newPublisher(t, webhook.Config{URL: srv.URL})
	if errs := p.Publish(context.Background(), []sink.Record{record(1, "", "x", nil)}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if ua := <-agents; ua != webhook.DefaultClientName {
		t.Errorf("User-Agent %q, want %q", ua, webhook.DefaultClientName)
	}
}
