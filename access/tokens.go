// Package access holds who may use the operators' surfaces, and what they
// may do there: the named bearer tokens of the HTTP API and the console,
// and the roles that tokens and signed-in people hold.
package access

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
)

// Tokens are the bearer tokens the API accepts, each with a name that the
// audit trail records. Several are accepted at once so that a token can be
// rotated without a moment when neither works: add the new one, move the
// clients, remove the old one. Replace swaps the whole set while requests
// are served.
type Tokens struct {
	set atomic.Pointer[[]namedToken]
}

type namedToken struct {
	name string
	sum  [32]byte
	role Role
}

// Token is an accepted token and the role it grants.
type Token struct {
	Value string
	Role  Role
}

// NewTokens returns the set of byName (name → token).
func NewTokens(byName map[string]Token) (*Tokens, error) {
	t := &Tokens{}
	if err := t.Replace(byName); err != nil {
		return nil, err
	}
	return t, nil
}

// Replace makes byName the accepted tokens. It refuses an empty set, an
// empty name or token, a token without a role, and one token under two
// names (the audit could not tell who used it), and then keeps the tokens
// it had.
func (t *Tokens) Replace(byName map[string]Token) error {
	if len(byName) == 0 {
		return errors.New("no token; the API is off without one")
	}
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	sort.Strings(names)
	set := make([]namedToken, 0, len(names))
	seen := map[[32]byte]string{}
	for _, name := range names {
		tok := byName[name]
		if name == "" || tok.Value == "" {
			return fmt.Errorf("token %q: empty name or token", name)
		}
		if tok.Role == 0 {
			return fmt.Errorf("token %s has no role: grant it one of %s (admin.roles: %s=viewer)", name, RoleNames(), name)
		}
		sum := sha256.Sum256([]byte(tok.Value))
		if other, dup := seen[sum]; dup {
			return fmt.Errorf("tokens %s and %s are the same token; give each holder its own", other, name)
		}
		seen[sum] = name
		set = append(set, namedToken{name: name, sum: sum, role: tok.Role})
	}
	t.set.Store(&set)
	return nil
}

// Names are the names of the accepted tokens, sorted; none when t is
// nil.
func (t *Tokens) Names() []string {
	if t == nil {
		return nil
	}
	set := *t.set.Load()
	out := make([]string, len(set))
	for i, nt := range set {
		out[i] = nt.name
	}
	return out
}

// Match returns the name and role of the accepted token given, comparing
// it with every accepted token in constant time: how long it takes says
// nothing about which token, or how much of one, matched.
func (t *Tokens) Match(given string) (name string, role Role, ok bool) {
	sum := sha256.Sum256([]byte(given))
	for _, nt := range *t.set.Load() {
		if subtle.ConstantTimeCompare(sum[:], nt.sum[:]) == 1 {
			name, role, ok = nt.name, nt.role, true
		}
	}
	return name, role, ok
}

// Role returns the role of the accepted token named name: its role now,
// for a session begun with it.
func (t *Tokens) Role(name string) (Role, bool) {
	for _, nt := range *t.set.Load() {
		if nt.name == name {
			return nt.role, true
		}
	}
	return 0, false
}

// Secret returns a key derived from the accepted token named name, for
// signing what its holder was handed (the console's sessions): it changes
// when the token does, and goes with it.
func (t *Tokens) Secret(name string) ([]byte, bool) {
	for _, nt := range *t.set.Load() {
		if nt.name == name {
			key := sha256.Sum256(append([]byte("outbox-relay session key\x00"), nt.sum[:]...))
			return key[:], true
		}
	}
	return nil, false
}
