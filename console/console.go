// Package console is the relay's operator console: web pages, served by
// the admin listener beside the dead-letter API and behind the same
// tokens, that show the relay's state and act on dead letters: failure
// groups replayed or discarded in bulk after a dry run, a row's payload
// edited with a diff preview, parked keys released, the audit trail read.
//
// A token is given once, in a login form; the console answers with a
// session cookie (HttpOnly, SameSite=Lax, Secure over HTTPS) signed
// with a key derived from that token, so any replica with the same tokens
// accepts it and removing the token ends its sessions (logging out drops
// the cookie; a copy of it lasts until then, or its 12 hours). People
// may sign in through an OpenID Connect provider instead (OIDC): those
// sessions are kept in the database, so that signing out ends them on
// every replica. Lax rather
// than Strict, so that a link to a page, from an alert or a chat, opens it
// in the session: the cookie then goes with top-level GETs from other
// sites, which change no row's state. Every change is a POST from a page of
// the console: it carries a CSRF token derived from the session, and a
// browser's Origin (or Sec-Fetch-Site) must say it is the console's own.
// Nothing puts a token in a URL.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/internal/methods"
)

// Prefix is the path the console is served under.
const Prefix = "/console/"

// SessionLength is how long a login lasts.
const SessionLength = 12 * time.Hour

const (
	sessionCookie = "outbox_console"
	loginCookie   = "outbox_console_login"
)

// Config configures the console.
type Config struct {
	// Outboxes are the relay's outboxes, in order; the first is shown
	// unless a page names another. Required.
	Outboxes []Outbox
	// Tokens are the admin tokens a login may give. The console needs
	// them or OIDC.
	Tokens *access.Tokens
	// OIDC signs people in through an identity provider; nil does not.
	OIDC *OIDC
	// NoTokenLogin refuses tokens at the login form: people sign in
	// through OIDC, and tokens serve the API alone.
	NoTokenLogin bool
	// Throttle slows down guessing tokens, by client address; nil does
	// not.
	Throttle *access.Throttle
	// Status reports the relay's live state for the overview; nil shows
	// none.
	Status func(context.Context) Status
	// Route names the destination a topic's rows go to and the topic they
	// are published as, for a message's page; nil shows none.
	Route func(topic string) (destination, published string, ok bool)
	// HistoryInterval is how often the replicas write the history: under
	// a minute, the trends show the minute under way. Default a minute.
	HistoryInterval time.Duration
	// Shares reads the fleet's shares of a destination's in-flight limit;
	// nil outside a fleet.
	Shares func(ctx context.Context, destination string) ([]FleetShare, error)
	// Secure marks the session cookie for HTTPS only: set it when the
	// listener serves TLS.
	Secure bool
	// Redact takes secrets, such as database passwords, out of an error
	// before a page shows it; nil leaves it as it is.
	Redact func(string) string
	Logger *slog.Logger
	// now is the clock, for tests.
	now func() time.Time
}

// Outbox is one outbox the console shows.
type Outbox struct {
	Name string
	Dead *deadletter.Store
	// History is the outbox's per-minute history, for the overview's
	// trends; nil shows none.
	History *history.Store
}

// Status is the relay's state, as the overview shows it.
type Status struct {
	Outboxes     []OutboxStatus
	Destinations []DestinationStatus
}

// OutboxStatus is one outbox's backlog and what the relay did with it.
type OutboxStatus struct {
	Name string
	// Pending counts the rows waiting; OldestPending is the age of the
	// oldest. BacklogError says why they are unknown, if they are.
	Pending       int64
	OldestPending time.Duration
	BacklogError  string
	// Delivered, Retried and DeadLettered count rows since the relay
	// started.
	Delivered, Retried, DeadLettered int64
	// Capture is the replication slot of an outbox captured from the
	// write-ahead log; nil for the table.
	Capture *CaptureStatus
}

// CaptureStatus is an outbox's replication slot, as the overview shows it.
type CaptureStatus struct {
	Slot string
	// Streaming says this replica streams from the slot.
	Streaming bool
	// WALStatus is the server's (reserved, extended, unreserved, lost),
	// or missing; Confirmed the slot's confirmed position, LagBytes the
	// log past it. Error says why they are unknown, Problem why no
	// replica can stream.
	WALStatus, Confirmed string
	LagBytes             int64
	Error, Problem       string
}

// DestinationStatus is one destination's flow control.
type DestinationStatus struct {
	Name string
	// Breaker is closed, open or half_open; OpenUntil is when an open
	// breaker lets a probe through.
	Breaker   string
	OpenUntil time.Time
	LastError string
	// Paused names the paused topics and partitions; Pauses are the
	// same, each with its state.
	Paused   []string
	Pauses   []Pause
	InFlight int
	// MaxInFlight is this replica's limit now (its share in a fleet),
	// FleetMaxInFlight the fleet's; 0 for none. RateLimit is in rows per
	// second, 0 for none.
	MaxInFlight, FleetMaxInFlight int
	RateLimit                     float64
}

// Pause is a destination's paused topic, or partition of one.
type Pause struct {
	// Topic is the topic as published; Partition is -1 when the whole
	// topic is paused.
	Topic     string
	Partition int
	// State is open while it waits, half_open while rows probe it;
	// OpenUntil is when an open pause lets a probe through.
	State     string
	OpenUntil time.Time
	LastError string
}

//go:embed templates/*.html static/*
var assets embed.FS

// New returns the console's handler; mount it at Prefix.
func New(cfg Config) (http.Handler, error) {
	if len(cfg.Outboxes) == 0 {
		return nil, errors.New("console: no outbox")
	}
	if cfg.Tokens == nil && cfg.OIDC == nil {
		return nil, errors.New("console: no token and no single sign-on; the console is off without one")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OIDC != nil {
		if err := cfg.OIDC.check(); err != nil {
			return nil, err
		}
		cfg.OIDC.log = cfg.Logger
	}
	if cfg.Tokens == nil {
		cfg.NoTokenLogin = true
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	if cfg.HistoryInterval <= 0 {
		cfg.HistoryInterval = time.Minute
	}
	if cfg.Redact == nil {
		cfg.Redact = func(s string) string { return s }
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	c := &console{cfg: cfg, pages: pages, origins: http.NewCrossOriginProtection()}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	p := strings.TrimSuffix(Prefix, "/")
	mux.Handle("GET "+p+"/static/", http.StripPrefix(p+"/static/", cacheFor(time.Hour, http.FileServerFS(static))))
	for _, rt := range c.routes() {
		switch {
		case rt.Public:
			mux.HandleFunc(rt.Method+" "+p+rt.Path, rt.handler)
		case rt.Method == http.MethodGet:
			mux.HandleFunc(rt.Method+" "+p+rt.Path, c.view(rt.Role, rt.handler))
		default:
			mux.HandleFunc(rt.Method+" "+p+rt.Path, c.change(rt.Role, rt.handler))
		}
	}
	mux.HandleFunc(p+"/", func(w http.ResponseWriter, r *http.Request) {
		// Every pattern but this one names its method, so a page asked for
		// with another method lands here too: that is a 405, not a 404.
		if allow := methods.Allowed(mux, r, p+"/"); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			c.fail(w, r, http.StatusMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path+"; it takes "+methods.List(allow)+".")
			return
		}
		c.fail(w, r, http.StatusNotFound, "No such page: "+r.Method+" "+r.URL.Path)
	})
	return securityHeaders(mux), nil
}

// Route is one of the console's pages or forms, below Prefix, and the
// role it needs: pages (GET) are shown in a session, forms (POST) are
// taken from the console's own pages in a session. Public routes are the
// way in.
type Route struct {
	Method, Path string
	Role         access.Role
	Public       bool
	handler      http.HandlerFunc
}

// Routes are the console's pages and forms, each with the role it needs;
// its static files need none.
func Routes() []Route { return (&console{}).routes() }

// routes is the console's table of pages and forms: every one names the
// role it needs, or is public. Pages need a viewer (a reader to see
// payloads); what changes rows, and the pages that prepare a change (a
// group's dry run, an edit's preview), need an operator.
func (c *console) routes() []Route {
	var table []Route
	add := func(route string, role access.Role, h http.HandlerFunc) {
		method, path, _ := strings.Cut(route, " ")
		table = append(table, Route{Method: method, Path: path, Role: role, handler: h})
	}
	public := func(route string, h http.HandlerFunc) {
		method, path, _ := strings.Cut(route, " ")
		table = append(table, Route{Method: method, Path: path, Public: true, handler: h})
	}
	public("GET /login", c.loginPage)
	public("POST /login", c.sameOrigin(c.login))
	public("GET /oidc/start", c.withOIDC(c.oidcStart))
	public("GET /oidc/callback", c.withOIDC(c.oidcCallback))
	add("POST /logout", access.Viewer, c.logout)
	add("GET /{$}", access.Viewer, c.overview)
	add("GET /live", access.Viewer, c.live)
	add("GET /groups", access.Viewer, c.groups)
	add("GET /groups/{group}/{action}", access.Operator, c.confirmGroup)
	add("POST /groups/{group}/{action}", access.Operator, c.actOnGroup)
	add("GET /dead-letters", access.Viewer, c.letters)
	add("GET /dead-letters/{ref}", access.Viewer, c.letter)
	add("POST /dead-letters/{ref}/preview", access.Operator, c.preview)
	add("POST /dead-letters/{ref}/edit", access.Operator, c.edit)
	add("POST /dead-letters/{ref}/{action}", access.Operator, c.actOnRow)
	add("GET /parked-keys", access.Viewer, c.keys)
	add("POST /parked-keys/release", access.Operator, c.release)
	add("GET /audit", access.Viewer, c.audit)
	add("GET /find", access.Viewer, c.find)
	add("GET /messages/{ref}", access.Viewer, c.message)
	add("GET /key", access.Viewer, c.key)
	add("GET /destinations/{name}", access.Viewer, c.destination)
	return table
}

type console struct {
	cfg     Config
	pages   map[string]*template.Template
	origins *http.CrossOriginProtection
	rates   rates
	// stats are each outbox's dead-letter counts for the overview, kept a
	// few seconds: every open overview asks every two.
	statsMu sync.Mutex
	stats   map[string]countedStats
}

type countedStats struct {
	at  time.Time
	st  *deadletter.Stats
	err error
}

// statsCache is how long the overview's dead-letter counts are shown
// again before they are counted anew.
const statsCache = 3 * time.Second

// deadStats are o's dead-letter counts, at most statsCache old.
func (c *console) deadStats(ctx context.Context, o Outbox) (*deadletter.Stats, error) {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	now := c.cfg.now()
	if got, ok := c.stats[o.Name]; ok && now.Sub(got.at) < statsCache {
		return got.st, got.err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	st, err := o.Dead.Stats(cctx)
	if c.stats == nil {
		c.stats = map[string]countedStats{}
	}
	c.stats[o.Name] = countedStats{at: now, st: st, err: err}
	return st, err
}

// session is a logged-in request's: who, and its CSRF token.
type session struct {
	access.Principal
	CSRF string
}

// In says the request has a session.
func (s session) In() bool { return s.Name != "" }

// Operator says the session may act on rows.
func (s session) Operator() bool { return s.Role.Allows(access.Operator) }

// Payloads says the session may see payloads.
func (s session) Payloads() bool { return s.Role.Allows(access.Reader) }

type sessionKey struct{}

func sessionOf(r *http.Request) session {
	s, _ := r.Context().Value(sessionKey{}).(session)
	return s
}

// view serves a page to a logged-in browser whose role allows needs,
// sends others to log in, and answers 403 to a session without the role.
func (c *console) view(needs access.Role, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok, err := c.session(r)
		if err != nil {
			c.sessionFailed(w, r, err)
			return
		}
		if !ok {
			http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), sessionKey{}, s))
		if !s.Role.Allows(needs) {
			c.fail(w, r, http.StatusForbidden, "Not allowed: "+s.Denied(needs)+".")
			return
		}
		next(w, r)
	}
}

// change runs a change: a POST from the console's own page (same origin),
// in a session whose role allows needs, with the session's CSRF token.
// Anything else changes nothing.
func (c *console) change(needs access.Role, next http.HandlerFunc) http.HandlerFunc {
	return c.sameOrigin(func(w http.ResponseWriter, r *http.Request) {
		s, ok, err := c.session(r)
		if err != nil {
			c.sessionFailed(w, r, err)
			return
		}
		if !ok {
			c.fail(w, r, http.StatusUnauthorized, "Your session has ended: log in again.")
			return
		}
		if !s.Role.Allows(needs) {
			c.fail(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)), http.StatusForbidden, "Not allowed: "+s.Denied(needs)+".")
			return
		}
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
			return
		}
		if !hmac.Equal([]byte(r.PostForm.Get("csrf")), []byte(s.CSRF)) {
			c.fail(w, r, http.StatusForbidden, "This form is not from this session (CSRF check failed): reload the page and try again.")
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	})
}

// sameOrigin refuses a request that a browser says comes from another
// origin, by the standard library's check: Sec-Fetch-Site, or without it
// the Origin header against Host. Browsers send Sec-Fetch-Site to HTTPS
// (and localhost) origins only; there it says same-origin for the
// console's own forms even behind a proxy that rewrites Host.
func (c *console) sameOrigin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := c.origins.Check(r); err != nil {
			c.fail(w, r, http.StatusForbidden, "Cross-site request refused.")
			return
		}
		next(w, r)
	}
}

// session checks the request's session cookie. A session signed in
// through the identity provider must be in the session store. A token's
// session names the token, which must still be accepted, and is signed
// with that token's key, and not expired. err says the store could not
// tell.
func (c *console) session(r *http.Request) (session, bool, error) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, false, nil
	}
	if id, ok := strings.CutPrefix(ck.Value, ssoPrefix); ok {
		if c.cfg.OIDC == nil || id == "" {
			return session{}, false, nil
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		p, ok, err := c.cfg.OIDC.session(ctx, id)
		if !ok || err != nil {
			return session{}, false, err
		}
		return session{Principal: p, CSRF: sign([]byte(id), "csrf", ck.Value)}, true, nil
	}
	parts := strings.Split(ck.Value, ".")
	if c.cfg.NoTokenLogin || len(parts) != 3 {
		return session{}, false, nil
	}
	nameBytes, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return session{}, false, nil
	}
	expires, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || c.cfg.now().Unix() >= expires {
		return session{}, false, nil
	}
	name := string(nameBytes)
	key, ok := c.cfg.Tokens.Secret(name)
	if !ok {
		return session{}, false, nil
	}
	want := sign(key, "session", parts[0]+"."+parts[1])
	if !hmac.Equal([]byte(parts[2]), []byte(want)) {
		return session{}, false, nil
	}
	// The token's role now: a change of role applies to its sessions.
	role, _ := c.cfg.Tokens.Role(name)
	return session{Principal: access.Principal{Name: name, Source: "console", Credential: name, Role: role},
		CSRF: sign(key, "csrf", ck.Value)}, true, nil
}

// sessionFailed answers a request whose session could not be checked.
func (c *console) sessionFailed(w http.ResponseWriter, r *http.Request, err error) {
	c.cfg.Logger.Warn("console: a session cannot be checked", slog.Any("error", err))
	c.fail(w, r, http.StatusServiceUnavailable, "Your session cannot be checked now: "+c.cfg.Redact(err.Error()))
}

// withOIDC serves next when single sign-on is configured.
func (c *console) withOIDC(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.OIDC == nil {
			c.fail(w, r, http.StatusNotFound, "Single sign-on is not configured (admin.oidc).")
			return
		}
		next(w, r)
	}
}

// sign is the hex HMAC-SHA256 of purpose and msg under key.
func sign(key []byte, purpose, msg string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(purpose + "\x00" + msg))
	return hex.EncodeToString(m.Sum(nil))
}

func (c *console) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, ok, _ := c.session(r); ok {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	c.showLogin(w, r, http.StatusOK, "")
}

// showLogin renders the login form with a fresh login nonce: a cookie
// and a hidden field that must match, so that no other site can log a
// browser in.
func (c *console) showLogin(w http.ResponseWriter, r *http.Request, status int, problem string) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	nonce := hex.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: nonce, Path: Prefix, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: c.secure(), MaxAge: 3600})
	data := map[string]any{"Nonce": nonce, "Next": safeNext(r.FormValue("next")), "Problem": problem, "Tokens": !c.cfg.NoTokenLogin}
	if c.cfg.OIDC != nil {
		data["SSO"] = c.cfg.OIDC.Name
	}
	c.render(w, r, status, "login", data)
}

func (c *console) login(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.showLogin(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	nonce, err := r.Cookie(loginCookie)
	if err != nil || nonce.Value == "" || !hmac.Equal([]byte(nonce.Value), []byte(r.PostForm.Get("nonce"))) {
		c.showLogin(w, r, http.StatusForbidden, "The login form expired: try again.")
		return
	}
	if c.cfg.NoTokenLogin {
		c.showLogin(w, r, http.StatusForbidden, "Tokens do not sign in to this console: use single sign-on.")
		return
	}
	client := c.cfg.Throttle.Client(r)
	if wait := c.cfg.Throttle.Wait(client); wait > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		c.showLogin(w, r, http.StatusTooManyRequests, fmt.Sprintf("Too many failed logins from your address: try again in %s.", wait.Round(time.Second)))
		return
	}
	name, _, ok := c.cfg.Tokens.Match(r.PostForm.Get("token"))
	if !ok {
		c.cfg.Throttle.Failed(client, "console token")
		c.showLogin(w, r, http.StatusUnauthorized, "That token is not accepted.")
		return
	}
	key, _ := c.cfg.Tokens.Secret(name)
	expires := c.cfg.now().Add(SessionLength)
	payload := base64.RawURLEncoding.EncodeToString([]byte(name)) + "." + strconv.FormatInt(expires.Unix(), 10)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: payload + "." + sign(key, "session", payload), Path: Prefix,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: c.secure(), Expires: expires})
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Path: Prefix, MaxAge: -1})
	c.cfg.Logger.Info("console login", slog.String("token", name), slog.String("remote", r.RemoteAddr))
	http.Redirect(w, r, safeNext(r.PostForm.Get("next")), http.StatusSeeOther)
}

func (c *console) logout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(sessionCookie); err == nil && c.cfg.OIDC != nil {
		if id, ok := strings.CutPrefix(ck.Value, ssoPrefix); ok {
			if err := c.cfg.OIDC.Sessions.end(r.Context(), id); err != nil {
				c.sessionFailed(w, r, err)
				return
			}
		}
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Path: Prefix, MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteLaxMode, Secure: c.secure()})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// safeNext is where to go after logging in: a page of the console, or
// its overview.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || strings.Contains(next, `\`) ||
		!strings.HasPrefix(path.Clean(u.Path)+"/", Prefix) {
		return Prefix
	}
	return next
}

// outbox is the outbox a request names (form or query field "outbox"),
// or the first.
func (c *console) outbox(r *http.Request) (Outbox, error) {
	name := r.FormValue("outbox")
	if name == "" {
		return c.cfg.Outboxes[0], nil
	}
	for _, o := range c.cfg.Outboxes {
		if o.Name == name {
			return o, nil
		}
	}
	return Outbox{}, fmt.Errorf("no outbox %q", name)
}

// actor is who acts through the console: who signed in, how, and their
// role.
func actor(r *http.Request) deadletter.Actor {
	s := sessionOf(r)
	return deadletter.Actor{Name: s.Name, Source: s.Source, Credential: s.Credential, Role: s.Role.String()}
}

// securityHeaders keeps the console's pages to themselves: no framing, no
// scripts or styles but its own, no caching of rows.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("X-Frame-Options", "DENY")
		if h.Get("Cache-Control") == "" {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

func cacheFor(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", fmt.Sprintf("private, max-age=%d", int(d.Seconds())))
		next.ServeHTTP(w, r)
	})
}

// rates turns the relay's counters into rows per second, against the
// sample of a few seconds before.
type rates struct {
	mu      sync.Mutex
	samples []rateSample
}

type rateSample struct {
	at     time.Time
	counts map[string][2]int64 // outbox → delivered, failed (retried or dead-lettered)
}

// per returns, for each outbox, rows delivered and rows that failed
// (retried or dead-lettered) per second since the oldest sample of the
// last ten seconds.
func (rt *rates) per(now time.Time, st []OutboxStatus) map[string][2]float64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	cur := rateSample{at: now, counts: map[string][2]int64{}}
	for _, o := range st {
		cur.counts[o.Name] = [2]int64{o.Delivered, o.Retried + o.DeadLettered}
	}
	keep := rt.samples[:0]
	for _, s := range rt.samples {
		if now.Sub(s.at) <= 10*time.Second {
			keep = append(keep, s)
		}
	}
	rt.samples = append(keep, cur)
	out := map[string][2]float64{}
	base := rt.samples[0]
	dt := now.Sub(base.at).Seconds()
	if dt < 0.5 {
		return out
	}
	for name, c := range cur.counts {
		b := base.counts[name]
		out[name] = [2]float64{float64(c[0]-b[0]) / dt, float64(c[1]-b[1]) / dt}
	}
	return out
}
