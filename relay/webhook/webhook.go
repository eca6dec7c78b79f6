// Package webhook delivers outbox rows to an HTTP endpoint: one POST per
// row, body = payload, with an Idempotency-Key that is the row's event id
// on every attempt and, when secrets are configured, Standard Webhooks
// signatures. The URL comes from configuration only, never from a row.
//
// Responses and network errors are classified for the retry policy: 2xx is
// delivered; 400, 404, 405, 409, 410, 413 and 422 are permanent; 408, 425,
// 429 and 5xx are transient (429 and 503 with their Retry-After hint);
// 401, 403, redirects, refused connections, DNS and certificate failures
// are systemic (the destination as a whole is unusable). The mapping of
// status codes can be overridden per destination.
package webhook

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	"golang.org/x/net/http/httpguts"
)

// Defaults of Config.
const (
	DefaultContentType           = "application/json"
	DefaultConnectTimeout        = 5 * time.Second
	DefaultTLSHandshakeTimeout   = 5 * time.Second
	DefaultResponseHeaderTimeout = 10 * time.Second
	DefaultTimeout               = 30 * time.Second
	DefaultMaxResponseBytes      = 1024
	DefaultConcurrency           = 8
	DefaultClientName            = "outbox-relay"
)

// Config configures a Publisher. Zero values take the defaults.
type Config struct {
	// Name is the destination's name, used in errors.
	Name string
	// URL is the endpoint every row is POSTed to: http or https.
	URL string
	// ContentType is sent when a row has no content-type header. Default
	// application/json.
	ContentType string
	// Headers are added to every request; they override row headers.
	Headers map[string]string
	// ClientName is the requests' User-Agent. Default outbox-relay.
	ClientName string
	// BearerToken, or Username and Password, authenticate the relay.
	BearerToken        string
	Username, Password string
	// SigningSecrets sign each request with Standard Webhooks signatures
	// (whsec_<base64>), one signature per secret: give the new and the old
	// secret while rotating.
	SigningSecrets []string
	// TLS configures https: roots, client certificate (mTLS). Default the
	// system roots.
	TLS *tls.Config
	// ConnectTimeout, TLSHandshakeTimeout and ResponseHeaderTimeout bound
	// the phases of a request; Timeout bounds the whole of it, body
	// included. Defaults 5s, 5s, 10s and 30s.
	ConnectTimeout, TLSHandshakeTimeout, ResponseHeaderTimeout, Timeout time.Duration
	// MaxResponseBytes is how much of a response body is read and quoted
	// in errors. Default 1024.
	MaxResponseBytes int
	// Concurrency is the most requests one Publish call makes at once;
	// rows of one key always go one after the other. Default 8.
	Concurrency int
	// AllowPrivateNetworks turns off the SSRF guard, which refuses to
	// connect to loopback, private and link-local addresses. Only for
	// endpoints inside the network, such as a sidecar.
	AllowPrivateNetworks bool
	// StatusClasses overrides the class of response status codes.
	StatusClasses map[int]sink.Class
	// Now is the clock for signature timestamps. Default time.Now.
	Now func() time.Time
}

// Validate reports every problem of c at once, or nil.
func (c *Config) Validate() error {
	var errs []error
	u, err := url.Parse(c.URL)
	switch {
	case c.URL == "":
		errs = append(errs, errors.New("url is required"))
	case err != nil:
		// Not the URL itself: it may carry credentials or tokens.
		errs = append(errs, fmt.Errorf("url is not a valid URL: %v", unwrapURLError(err)))
	case u.Scheme != "http" && u.Scheme != "https":
		errs = append(errs, fmt.Errorf("url %q must be http or https", RedactURL(c.URL)))
	case u.Host == "":
		errs = append(errs, fmt.Errorf("url %q has no host", RedactURL(c.URL)))
	case u.User != nil:
		errs = append(errs, errors.New("url must not carry credentials; use username and password"))
	}
	if c.BearerToken != "" && (c.Username != "" || c.Password != "") {
		errs = append(errs, errors.New("use a bearer token or basic auth, not both"))
	}
	if (c.Username == "") != (c.Password == "") {
		errs = append(errs, errors.New("basic auth needs both username and password"))
	}
	for k, v := range c.Headers {
		if !httpguts.ValidHeaderFieldName(k) || !httpguts.ValidHeaderFieldValue(v) {
			errs = append(errs, fmt.Errorf("header %q is not a valid HTTP header", k))
		} else if reserved(k) {
			errs = append(errs, fmt.Errorf("header %q is set by the relay itself", k))
		}
	}
	for i, s := range c.SigningSecrets {
		if _, err := decodeSecret(s); err != nil {
			errs = append(errs, fmt.Errorf("signing secret %d: %v", i+1, err))
		}
	}
	for code := range c.StatusClasses {
		if code < 100 || code > 599 {
			errs = append(errs, fmt.Errorf("status class override for %d: not an HTTP status", code))
		}
		if code >= 200 && code < 300 {
			errs = append(errs, fmt.Errorf("status %d is a success and cannot be reclassified", code))
		}
	}
	for name, d := range map[string]time.Duration{"connect_timeout": c.ConnectTimeout, "tls_handshake_timeout": c.TLSHandshakeTimeout,
		"response_header_timeout": c.ResponseHeaderTimeout, "timeout": c.Timeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s is %s; it must not be negative", name, d))
		}
	}
	if c.MaxResponseBytes < 0 || c.Concurrency < 0 {
		errs = append(errs, errors.New("max_response_bytes and concurrency must not be negative"))
	}
	return errors.Join(errs...)
}

// Publisher POSTs rows to one endpoint. It is safe for concurrent use.
type Publisher struct {
	cfg   Config
	url   string // redacted, for errors
	creds atomic.Pointer[credentials]
}

// credentials are what a request authenticates and signs with, and the
// transport holding the TLS client configuration: all that Reload
// replaces.
type credentials struct {
	bearerToken, username, password string
	secrets                         [][]byte
	client                          *http.Client
	tr                              *http.Transport
}

// New returns a Publisher for cfg.
func New(cfg Config) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("webhook %s: %w", cfg.Name, err)
	}
	cfg.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, DefaultConnectTimeout)
	cfg.TLSHandshakeTimeout = cmp.Or(cfg.TLSHandshakeTimeout, DefaultTLSHandshakeTimeout)
	cfg.ResponseHeaderTimeout = cmp.Or(cfg.ResponseHeaderTimeout, DefaultResponseHeaderTimeout)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.ContentType = cmp.Or(cfg.ContentType, DefaultContentType)
	cfg.MaxResponseBytes = cmp.Or(cfg.MaxResponseBytes, DefaultMaxResponseBytes)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.ClientName = cmp.Or(cfg.ClientName, DefaultClientName)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Publisher{cfg: cfg, url: RedactURL(cfg.URL)}
	p.creds.Store(p.credentials(cfg))
	return p, nil
}

// credentials builds what requests authenticate, sign and connect with
// from the secrets and TLS configuration of c.
func (p *Publisher) credentials(c Config) *credentials {
	cr := &credentials{bearerToken: c.BearerToken, username: c.Username, password: c.Password}
	for _, s := range c.SigningSecrets {
		key, _ := decodeSecret(s)
		cr.secrets = append(cr.secrets, key)
	}
	dialer := &net.Dialer{Timeout: p.cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	if !p.cfg.AllowPrivateNetworks {
		dialer.Control = guard
	}
	cr.tr = &http.Transport{
		// No proxy: the SSRF guard checks the address actually dialled.
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		TLSClientConfig:       c.TLS,
		TLSHandshakeTimeout:   p.cfg.TLSHandshakeTimeout,
		ResponseHeaderTimeout: p.cfg.ResponseHeaderTimeout,
		MaxIdleConns:          p.cfg.Concurrency * 2,
		MaxIdleConnsPerHost:   p.cfg.Concurrency * 2,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	cr.client = &http.Client{
		Transport: cr.tr,
		// A redirect is answered as it is: following it could leave the
		// configured endpoint.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return cr
}

// Reload replaces the bearer token, basic-auth credentials, signing
// secrets and TLS client configuration with those of c (other settings
// stay as they were opened). It refuses a c that does not validate and
// keeps the old ones. Requests under way finish with the old ones; new
// requests, on new connections, use the new ones.
func (p *Publisher) Reload(c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	old := p.creds.Swap(p.credentials(c))
	old.tr.CloseIdleConnections()
	return nil
}

// Close releases idle connections.
func (p *Publisher) Close() error {
	p.creds.Load().tr.CloseIdleConnections()
	return nil
}

// Publish POSTs each record. Rows of one key go one after the other, in
// order; after one fails, the key's later rows are not sent
// (sink.ErrNotSent). Other rows go in parallel, up to Concurrency.
func (p *Publisher) Publish(ctx context.Context, recs []sink.Record) []error {
	errs := make([]error, len(recs))
	// Lanes: one per key, in id order, and one per unkeyed row.
	var lanes [][]int
	byKey := map[string]int{}
	for i, r := range recs {
		if !r.HasKey {
			lanes = append(lanes, []int{i})
			continue
		}
		l, ok := byKey[r.Key]
		if !ok {
			l = len(lanes)
			byKey[r.Key] = l
			lanes = append(lanes, nil)
		}
		lanes[l] = append(lanes[l], i)
	}
	// Rows not yet sent when ctx ends were never attempted: ErrNotSent.
	notSent := func(lane []int) {
		for _, j := range lane {
			errs[j] = sink.ErrNotSent
		}
	}
	sem := make(chan struct{}, p.cfg.Concurrency)
	var wg sync.WaitGroup
	for l, lane := range lanes {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			for _, rest := range lanes[l:] {
				notSent(rest)
			}
			wg.Wait()
			return errs
		}
		wg.Go(func() {
			defer func() { <-sem }()
			for n, i := range lane {
				if ctx.Err() != nil {
					notSent(lane[n:])
					return
				}
				errs[i] = p.send(ctx, recs[i])
				if errs[i] != nil {
					notSent(lane[n+1:])
					return
				}
			}
		})
	}
	wg.Wait()
	return errs
}

// send delivers one record.
func (p *Publisher) send(parent context.Context, rec sink.Record) error {
	ctx, cancel := context.WithTimeout(parent, p.cfg.Timeout)
	defer cancel()
	creds := p.creds.Load()
	req, err := p.request(ctx, rec, creds)
	if err != nil {
		return err
	}
	resp, err := creds.client.Do(req)
	if err != nil {
		return p.classifyTransport(ctx, parent, err)
	}
	defer resp.Body.Close()
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, int64(p.cfg.MaxResponseBytes)))
	// Drain a little more so the connection can be reused, not forever.
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	msg := fmt.Sprintf("POST %s: %s", p.url, resp.Status)
	if len(body) > 0 {
		msg += fmt.Sprintf(": %q", body)
		if len(body) == p.cfg.MaxResponseBytes {
			msg += " (truncated)"
		}
	} else if readErr != nil {
		msg += fmt.Sprintf(" (reading the body: %v)", readErr)
	}
	return p.classifyStatus(resp, errors.New(msg))
}

// request builds the POST for rec.
func (p *Publisher) request(ctx context.Context, rec sink.Record, creds *credentials) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.URL, bytes.NewReader(rec.Payload))
	if err != nil {
		return nil, fmt.Errorf("build request to %s: %w", p.url, err)
	}
	contentType := p.cfg.ContentType
	var bad []string
	for k, v := range rec.Headers {
		if !httpguts.ValidHeaderFieldName(k) || !httpguts.ValidHeaderFieldValue(v) {
			bad = append(bad, k)
			continue
		}
		if strings.EqualFold(k, "content-type") {
			contentType = v
			continue
		}
		if reserved(k) || strings.EqualFold(k, "authorization") || strings.EqualFold(k, "cookie") {
			continue
		}
		req.Header.Set(k, v)
	}
	if len(bad) > 0 {
		return nil, sink.Permanent(fmt.Errorf("headers %q cannot be sent over HTTP", bad), sink.ReasonInvalidMessage)
	}
	req.Header.Set("Content-Type", contentType)
	for k, v := range p.cfg.Headers {
		req.Header.Set(k, v)
	}
	id := rec.EventID.String()
	req.Header.Set("User-Agent", p.cfg.ClientName)
	req.Header.Set("Idempotency-Key", id)
	switch {
	case creds.bearerToken != "":
		req.Header.Set("Authorization", "Bearer "+creds.bearerToken)
	case creds.username != "":
		req.SetBasicAuth(creds.username, creds.password)
	}
	if len(creds.secrets) > 0 {
		ts := p.cfg.Now().Unix()
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", fmt.Sprint(ts))
		req.Header.Set("webhook-signature", Sign(creds.secrets, id, ts, rec.Payload))
	}
	return req, nil
}

// reserved reports whether the relay sets header k itself, or HTTP
// forbids setting it.
func reserved(k string) bool {
	switch strings.ToLower(k) {
	case "idempotency-key", "webhook-id", "webhook-timestamp", "webhook-signature",
		"host", "content-length", "transfer-encoding", "connection", "keep-alive",
		"te", "trailer", "upgrade", "proxy-authorization", "proxy-connection":
		return true
	}
	return false
}

// RedactURL returns u without credentials, query or fragment, which may
// carry secrets, for errors and logs.
func RedactURL(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	pu.User, pu.RawQuery, pu.Fragment = nil, "", ""
	return pu.String()
}
