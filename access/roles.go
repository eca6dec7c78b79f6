package access

import (
	"fmt"
	"strings"
)

// Role is what an operator may do on the API and the console. Roles are
// ordered: each allows what the ones before it do.
//
//   - Viewer: the overview, trends, lists, find, failure groups and the
//     audit trail, with payloads hidden.
//   - Reader: the same, with payloads.
//   - Operator: also replay, release, edit, reroute and discard, and the
//     dry runs of bulk actions.
type Role int

// The roles, least first. The zero Role allows nothing.
const (
	Viewer Role = iota + 1
	Reader
	Operator
)

// Roles are the roles by name, least first.
var Roles = []Role{Viewer, Reader, Operator}

func (r Role) String() string {
	switch r {
	case Viewer:
		return "viewer"
	case Reader:
		return "reader"
	case Operator:
		return "operator"
	}
	return "none"
}

// Allows reports whether a holder of r may do what needs.
func (r Role) Allows(needs Role) bool { return needs > 0 && r >= needs }

// ParseRole returns the role named s.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if strings.EqualFold(strings.TrimSpace(s), r.String()) {
			return r, nil
		}
	}
	return 0, fmt.Errorf("%q is not a role: use %s", s, RoleNames())
}

// RoleNames lists the roles' names for messages: "viewer, reader or
// operator".
func RoleNames() string {
	names := make([]string, len(Roles))
	for i, r := range Roles {
		names[i] = r.String()
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// ParseGrants reads grants written name=role (such as "oncall=viewer"),
// the form of admin.roles and of the single sign-on's group mapping.
// setting names the setting in problems. A name given twice keeps the
// greater role.
func ParseGrants(setting string, grants []string) (map[string]Role, []string) {
	out := map[string]Role{}
	var problems []string
	for _, g := range grants {
		g = strings.TrimSpace(g)
		if g == "" {
			continue
		}
		name, role, ok := strings.Cut(g, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			problems = append(problems, fmt.Sprintf("%s: %q is not name=role, such as oncall=viewer", setting, g))
			continue
		}
		r, err := ParseRole(role)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %s: %v", setting, name, err))
			continue
		}
		out[name] = max(out[name], r)
	}
	return out, problems
}

// Principal is who a request comes from: a name the audit trail records,
// how they signed in, and their role.
type Principal struct {
	// Name is the token's name, or the signed-in person's.
	Name string
	// Source is how they came: api (a bearer token), console (a token
	// signed in to the console) or sso (single sign-on).
	Source string
	// Credential is what proves it: the token's name, or the identity
	// provider's subject (issuer and sub).
	Credential string
	Role       Role
}

// Denied is the message of a request whose principal lacks needs.
func (p Principal) Denied(needs Role) string {
	if p.Role == 0 {
		return fmt.Sprintf("this needs the %s role; %s has none", needs, p.Name)
	}
	return fmt.Sprintf("this needs the %s role; %s has %s", needs, p.Name, p.Role)
}
