// Package oidctest runs an OpenID Connect provider for tests: zitadel's
// provider (github.com/zitadel/oidc/v3/pkg/op) with its example storage and
// login page, holding the users a test gives, each with their groups in a
// groups claim. Its ID tokens are signed with a key of its own and
// checked against its published keys like any provider's.
package oidctest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// GroupsClaim is the claim that lists a user's groups.
const GroupsClaim = "groups"

// User is a person who can sign in at the provider.
type User struct {
	// ID is the subject (sub) of their tokens.
	ID, Username, Password string
	Groups                 []string
}

// Provider is a provider bound to a local address, started by Start.
type Provider struct {
	// Issuer is the provider's URL.
	Issuer string
	ln     net.Listener
	down   atomic.Bool
}

// Down makes the provider answer every request 503 until Up.
func (p *Provider) Down() { p.down.Store(true) }

// Up makes it answer again.
func (p *Provider) Up() { p.down.Store(false) }

// Listen binds the provider's address, so that its issuer is known
// before the client it will serve.
func Listen(t testing.TB) *Provider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &Provider{Issuer: "http://" + ln.Addr().String(), ln: ln}
}

// Options vary what the provider tells.
type Options struct {
	// GroupsAtUserinfo leaves the groups and the user's name out of the
	// ID token: the userinfo endpoint alone tells them, as some providers
	// do. Without it the ID token has both, as a provider configured to
	// put them there does.
	GroupsAtUserinfo bool
	// UserinfoDown makes the userinfo endpoint fail.
	UserinfoDown bool
}

// Start serves the provider until the test ends, with one confidential
// client (authorization code, client secret by HTTP Basic) whose only
// redirect is redirectURL.
func (p *Provider) Start(t testing.TB, clientID, secret, redirectURL string, opts Options, users ...User) {
	t.Helper()
	us := userStore{byID: map[string]*storage.User{}, groups: map[string][]string{}}
	for _, u := range users {
		su := &storage.User{ID: u.ID, Username: u.Username, Password: u.Password, FirstName: u.Username,
			Email: u.Username + "@example.com", EmailVerified: true}
		us.byID[u.ID] = su
		us.groups[u.ID] = u.Groups
	}
	st := &groupStorage{Storage: storage.NewStorageWithClients(us,
		map[string]*storage.Client{clientID: storage.WebClient(clientID, secret, redirectURL)}), users: us, opts: opts}
	op := exampleop.SetupServer(p.Issuer, st, nil, false)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.down.Load() {
			http.Error(w, "down (on purpose)", http.StatusServiceUnavailable)
			return
		}
		op.ServeHTTP(w, r)
	})}
	go srv.Serve(p.ln)
	t.Cleanup(func() { srv.Close() })
}

type userStore struct {
	byID   map[string]*storage.User
	groups map[string][]string
}

func (u userStore) GetUserByID(id string) *storage.User { return u.byID[id] }

func (u userStore) GetUserByUsername(name string) *storage.User {
	for _, x := range u.byID {
		if x.Username == name {
			return x
		}
	}
	return nil
}

func (u userStore) ExampleClientID() string { return storage.ServiceUserID }

// groupStorage adds the groups claim: to the ID token, or to the
// userinfo endpoint's answer.
type groupStorage struct {
	*storage.Storage
	users userStore
	opts  Options
}

func (s *groupStorage) SetUserinfoFromRequest(ctx context.Context, info *oidc.UserInfo, req op.IDTokenRequest, scopes []string) error {
	if err := s.Storage.SetUserinfoFromRequest(ctx, info, req, scopes); err != nil {
		return err
	}
	if !s.opts.GroupsAtUserinfo {
		info.AppendClaims(GroupsClaim, s.users.groups[req.GetSubject()])
		if u := s.users.byID[req.GetSubject()]; u != nil {
			info.AppendClaims("preferred_username", u.Username)
		}
	}
	return nil
}

func (s *groupStorage) SetUserinfoFromToken(ctx context.Context, info *oidc.UserInfo, tokenID, subject, origin string) error {
	if s.opts.UserinfoDown {
		return errors.New("the userinfo endpoint is down (on purpose)")
	}
	if err := s.Storage.SetUserinfoFromToken(ctx, info, tokenID, subject, origin); err != nil {
		return err
	}
	if s.opts.GroupsAtUserinfo {
		info.AppendClaims(GroupsClaim, s.users.groups[info.Subject])
	}
	return nil
}
