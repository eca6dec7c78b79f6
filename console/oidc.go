package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/oauth2"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// OIDC signs operators in to the console through an OpenID Connect
// provider: the authorization code flow with PKCE, a nonce, and the ID
// token's signature checked against the provider's published keys. The
// groups the provider names map to roles; whoever has no mapped group is
// not let in.
type OIDC struct {
	// Issuer is the provider's issuer URL, whose discovery document
	// (/.well-known/openid-configuration) names its endpoints and keys.
	Issuer string
	// ClientID and ClientSecret are the console's client at the provider.
	// ClientSecret is called at each sign-in, so that a rotated secret
	// applies at once.
	ClientID     string
	ClientSecret func() (string, error)
	// RedirectURL is the console's callback as the provider knows it:
	// https://host/console/oidc/callback.
	RedirectURL string
	// Scopes are asked for; openid is always among them. Default openid,
	// profile and email.
	Scopes []string
	// GroupsClaim is the claim, of the ID token or else of the userinfo
	// endpoint, that lists the person's groups. Default groups.
	GroupsClaim string
	// GroupRoles grants roles to groups; a person has the greatest role of
	// their groups.
	GroupRoles map[string]access.Role
	// Name is how the login page names the provider. Default "single
	// sign-on".
	Name string
	// Sessions keeps the sessions. Required.
	Sessions *Sessions
	// Client talks to the provider; nil uses one with a 10-second timeout.
	Client *http.Client

	mu       sync.Mutex
	provider *oidc.Provider
	failedAt time.Time // the last failed discovery, and why
	failed   error
	log      *slog.Logger
}

func (o *OIDC) logger() *slog.Logger {
	if o.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.log
}

// role is the greatest role of groups.
func (o *OIDC) role(groups []string) access.Role {
	var r access.Role
	for _, g := range groups {
		r = max(r, o.GroupRoles[g])
	}
	return r
}

// secure says the cookies go over HTTPS only: the listener serves TLS, or
// the console is reached over HTTPS (through a proxy that ends TLS), as the
// redirect URL says.
func (c *console) secure() bool {
	return c.cfg.Secure || (c.cfg.OIDC != nil && strings.HasPrefix(c.cfg.OIDC.RedirectURL, "https://"))
}

// DefaultGroupsClaim is the claim that lists groups unless told otherwise.
const DefaultGroupsClaim = "groups"

// oidcCookie holds a sign-in under way: its state, nonce, PKCE verifier
// and the page to go to after.
const oidcCookie = "outbox_console_oidc"

// oidcWait is how long a sign-in may take at the provider.
const oidcWait = 10 * time.Minute

func (o *OIDC) check() error {
	var p []string
	if o.Issuer == "" {
		p = append(p, "no issuer")
	}
	if o.ClientID == "" {
		p = append(p, "no client id")
	}
	if o.ClientSecret == nil {
		p = append(p, "no client secret")
	}
	if o.RedirectURL == "" {
		p = append(p, "no redirect URL")
	}
	if len(o.GroupRoles) == 0 {
		p = append(p, "no group is given a role")
	}
	if o.Sessions == nil {
		p = append(p, "no session store")
	}
	if len(p) > 0 {
		return errors.New("console: single sign-on: " + strings.Join(p, "; "))
	}
	if o.GroupsClaim == "" {
		o.GroupsClaim = DefaultGroupsClaim
	}
	if len(o.Scopes) == 0 {
		o.Scopes = []string{oidc.ScopeOpenID, "profile", "email"}
	}
	if !slices.Contains(o.Scopes, oidc.ScopeOpenID) {
		o.Scopes = append([]string{oidc.ScopeOpenID}, o.Scopes...)
	}
	if o.Name == "" {
		o.Name = "single sign-on"
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 10 * time.Second}
	}
	return nil
}

// discover returns the provider, read from its discovery document the
// first time a sign-in needs it: the relay starts, and delivers, while
// the provider is away. The lock is not held over the network: a sign-in
// does not queue behind another's discovery; and a failure is answered
// again for discoveryRetry, rather than asked anew at every attempt.
func (o *OIDC) discover(ctx context.Context) (*oidc.Provider, error) {
	o.mu.Lock()
	p, failedAt, failed := o.provider, o.failedAt, o.failed
	o.mu.Unlock()
	if p != nil {
		return p, nil
	}
	if failed != nil && time.Since(failedAt) < discoveryRetry {
		return nil, failed
	}
	p, err := oidc.NewProvider(oidc.ClientContext(ctx, o.Client), o.Issuer)
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.failedAt, o.failed = time.Now(), err
		return nil, err
	}
	if o.provider == nil {
		o.provider = p
	}
	return o.provider, nil
}

// discoveryRetry is how long a failed discovery stands before the provider
// is asked again.
const discoveryRetry = 5 * time.Second

func (o *OIDC) oauth2(p *oidc.Provider, secret string) *oauth2.Config {
	return &oauth2.Config{ClientID: o.ClientID, ClientSecret: secret, Endpoint: p.Endpoint(),
		RedirectURL: o.RedirectURL, Scopes: o.Scopes}
}

// randomText is n random bytes, base64url.
func randomText(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// oidcStart sends the browser to the provider, keeping the sign-in's
// secrets in a short-lived cookie that comes back with its callback.
func (c *console) oidcStart(w http.ResponseWriter, r *http.Request) {
	o := c.cfg.OIDC
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	p, err := o.discover(ctx)
	if err != nil {
		c.cfg.Logger.Warn("console: the identity provider cannot be reached", slog.String("issuer", o.Issuer), slog.Any("error", err))
		c.showLogin(w, r, http.StatusBadGateway, fmt.Sprintf("The identity provider at %s cannot be reached: %v", o.Issuer, err))
		return
	}
	state, nonce, verifier := randomText(24), randomText(24), oauth2.GenerateVerifier()
	next := safeNext(r.URL.Query().Get("next"))
	http.SetCookie(w, &http.Cookie{Name: oidcCookie, Path: Prefix + "oidc/", HttpOnly: true, Secure: c.secure(),
		// Lax: the provider's redirect back is a top-level GET from its
		// site, which a Strict cookie would not go with.
		SameSite: http.SameSiteLaxMode, MaxAge: int(oidcWait.Seconds()),
		Value: strings.Join([]string{state, nonce, verifier, base64.RawURLEncoding.EncodeToString([]byte(next))}, ".")})
	// The secret is not needed to build the URL.
	http.Redirect(w, r, o.oauth2(p, "").AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier)), http.StatusSeeOther)
}

// signIn is who the provider said signed in.
type signIn struct {
	name, subject string
	groups        []string
}

// oidcCallback takes the provider's answer: the code is exchanged for
// tokens, the ID token checked (signature, issuer, audience, expiry,
// nonce), and the groups mapped to a role.
func (c *console) oidcCallback(w http.ResponseWriter, r *http.Request) {
	o := c.cfg.OIDC
	ck, err := r.Cookie(oidcCookie)
	http.SetCookie(w, &http.Cookie{Name: oidcCookie, Path: Prefix + "oidc/", MaxAge: -1, HttpOnly: true, Secure: c.secure(), SameSite: http.SameSiteLaxMode})
	var parts []string
	if err == nil {
		parts = strings.Split(ck.Value, ".")
	}
	q := r.URL.Query()
	if len(parts) != 4 || !hmac.Equal([]byte(parts[0]), []byte(q.Get("state"))) {
		c.showLogin(w, r, http.StatusBadRequest, "This sign-in was not started here, or took over "+oidcWait.String()+": sign in again.")
		return
	}
	nonce, verifier := parts[1], parts[2]
	nextBytes, _ := base64.RawURLEncoding.DecodeString(parts[3])
	if e := q.Get("error"); e != "" {
		msg := "The identity provider did not sign you in: " + e
		if d := q.Get("error_description"); d != "" {
			msg += ": " + d
		}
		c.showLogin(w, r, http.StatusForbidden, msg)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	who, err := o.exchange(ctx, q.Get("code"), nonce, verifier)
	if err != nil {
		c.cfg.Logger.Warn("console: single sign-on failed", slog.String("issuer", o.Issuer), slog.Any("error", err))
		c.showLogin(w, r, http.StatusBadGateway, "The sign-in could not be completed: "+err.Error())
		return
	}
	role := o.role(who.groups)
	if role == 0 {
		c.cfg.Logger.Warn("console: signed in at the identity provider, but no group of theirs has a role",
			slog.String("name", who.name), slog.String("subject", who.subject), slog.Any("groups", who.groups))
		groups := "none"
		if len(who.groups) > 0 {
			groups = strings.Join(who.groups, ", ")
		}
		c.showLogin(w, r, http.StatusForbidden, fmt.Sprintf("%s signed in, but none of their groups is given a role in this console "+
			"(groups in the %q claim: %s). Ask for a group that admin.oidc.group_roles maps.", who.name, o.GroupsClaim, groups))
		return
	}
	// A new id at every sign-in; the browser's session before, if any,
	// ends.
	if old, err := r.Cookie(sessionCookie); err == nil {
		if oldID, ok := strings.CutPrefix(old.Value, ssoPrefix); ok && oldID != "" {
			if err := o.Sessions.end(ctx, oldID); err != nil {
				c.cfg.Logger.Warn("console: the session before a sign-in cannot be ended", slog.Any("error", err))
			}
		}
	}
	id := randomText(32)
	expires := c.cfg.now().Add(SessionLength)
	if err := o.Sessions.create(ctx, id, who.name, o.Issuer+"|"+who.subject, who.groups, expires); err != nil {
		c.cfg.Logger.Error("console: a session cannot be stored", slog.Any("error", err))
		c.showLogin(w, r, http.StatusServiceUnavailable, "The session cannot be stored: "+c.cfg.Redact(err.Error()))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: ssoPrefix + id, Path: Prefix,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: c.secure(), Expires: expires})
	c.cfg.Logger.Info("console sign-in", slog.String("name", who.name), slog.String("subject", who.subject),
		slog.String("role", role.String()), slog.String("remote", r.RemoteAddr))
	http.Redirect(w, r, safeNext(string(nextBytes)), http.StatusSeeOther)
}

// exchange trades the code for tokens and reads who signed in from the
// verified ID token, and from the userinfo endpoint what it leaves out.
func (o *OIDC) exchange(ctx context.Context, code, nonce, verifier string) (signIn, error) {
	p, err := o.discover(ctx)
	if err != nil {
		return signIn{}, fmt.Errorf("the identity provider cannot be reached: %w", err)
	}
	secret, err := o.ClientSecret()
	if err != nil || secret == "" {
		// The detail (a file's path) is the log's, not the page's.
		o.logger().Error("console: the single sign-on's client secret cannot be read", slog.Any("error", cmpErr(err, errors.New("it is empty"))))
		return signIn{}, errors.New("the client secret cannot be read (the relay's log says why)")
	}
	ctx = oidc.ClientContext(ctx, o.Client)
	tok, err := o.oauth2(p, secret).Exchange(ctx, code, oauth2.VerifierOption(verifier))
	if err != nil {
		return signIn{}, fmt.Errorf("the code was not exchanged: %w", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return signIn{}, errors.New("the provider gave no ID token")
	}
	idt, err := p.Verifier(&oidc.Config{ClientID: o.ClientID}).Verify(ctx, raw)
	if err != nil {
		return signIn{}, fmt.Errorf("the ID token is not valid: %w", err)
	}
	if !hmac.Equal([]byte(idt.Nonce), []byte(nonce)) {
		return signIn{}, errors.New("the ID token is not this sign-in's (nonce mismatch)")
	}
	claims := map[string]any{}
	if err := idt.Claims(&claims); err != nil {
		return signIn{}, fmt.Errorf("the ID token's claims: %w", err)
	}
	if _, hasGroups := claims[o.GroupsClaim]; !hasGroups || displayName(claims) == "" {
		// Many providers keep groups, or names, to the userinfo endpoint;
		// it is needed for the groups, and welcome for a name.
		more, err := o.userinfo(ctx, p, tok, idt.Subject)
		switch {
		case err != nil && !hasGroups:
			return signIn{}, fmt.Errorf("the ID token has no %q claim, and the userinfo endpoint failed: %w", o.GroupsClaim, err)
		case err != nil:
			o.logger().Warn("console: the userinfo endpoint failed; the ID token's claims are used", slog.Any("error", err))
		}
		for k, v := range more {
			if _, ok := claims[k]; !ok {
				claims[k] = v
			}
		}
	}
	who := signIn{name: displayName(claims), subject: idt.Subject, groups: stringsOf(claims[o.GroupsClaim])}
	if who.name == "" {
		who.name = idt.Subject
	}
	return who, nil
}

// userinfo reads the claims of the userinfo endpoint, which must be about
// subject.
func (o *OIDC) userinfo(ctx context.Context, p *oidc.Provider, tok *oauth2.Token, subject string) (map[string]any, error) {
	info, err := p.UserInfo(ctx, oauth2.StaticTokenSource(tok))
	if err != nil {
		return nil, err
	}
	if info.Subject != subject {
		return nil, errors.New("it names another subject than the ID token")
	}
	claims := map[string]any{}
	if err := info.Claims(&claims); err != nil {
		return nil, err
	}
	return claims, nil
}

func cmpErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// displayName is the name the audit trail records for a person.
func displayName(claims map[string]any) string {
	for _, k := range []string{"preferred_username", "email", "name"} {
		if s, ok := claims[k].(string); ok && strings.TrimSpace(s) != "" {
			return s
		}
	}
	return ""
}

// stringsOf reads a claim that lists strings: an array, or one string.
func stringsOf(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, x := range v {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// ssoPrefix starts the cookie of a session signed in through the
// provider; the rest is its random id.
const ssoPrefix = "sso."

// Sessions keeps the sessions signed in through the identity provider in
// the database (table outbox_console_sessions of the schema), by the
// SHA-256 of their random id, with the person's groups: every replica
// accepts them and maps the groups to a role on each request, and signing
// out ends one on all.
type Sessions struct {
	pool *pgxpool.Pool
	q    outboxdb.Sessions
}

// NewSessions returns the sessions of schemaName on pool.
func NewSessions(pool *pgxpool.Pool, schemaName string) (*Sessions, error) {
	q, err := outboxdb.NewSessions(schemaName)
	if err != nil {
		return nil, err
	}
	return &Sessions{pool: pool, q: q}, nil
}

func sessionDigest(id string) []byte {
	sum := sha256.Sum256([]byte(id))
	return sum[:]
}

func (s *Sessions) create(ctx context.Context, id, name, credential string, groups []string, expires time.Time) error {
	if groups == nil {
		groups = []string{}
	}
	return s.q.Create(ctx, s.pool, sessionDigest(id), outboxdb.Session{Name: name, Source: "sso",
		Credential: credential, Groups: groups, Expires: expires})
}

// get returns the session of id, with the role its groups have now; ok is
// false when there is none, it expired, or its groups no longer have a
// role.
func (o *OIDC) session(ctx context.Context, id string) (p access.Principal, ok bool, err error) {
	got, ok, err := o.Sessions.q.Get(ctx, o.Sessions.pool, sessionDigest(id))
	if !ok || err != nil {
		return p, false, err
	}
	p = access.Principal{Name: got.Name, Source: got.Source, Credential: got.Credential, Role: o.role(got.Groups)}
	return p, p.Role != 0, nil
}

func (s *Sessions) end(ctx context.Context, id string) error {
	return s.q.Delete(ctx, s.pool, sessionDigest(id))
}
