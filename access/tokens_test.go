package access_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/access"
)

func tokenSet(roles map[string]access.Role, values map[string]string) map[string]access.Token {
	out := map[string]access.Token{}
	for name, v := range values {
		out[name] = access.Token{Value: v, Role: roles[name]}
	}
	return out
}

func TestTokens(t *testing.T) {
	t.Parallel()
	roles := map[string]access.Role{"ops": access.Operator, "ci": access.Viewer}
	tokens, err := access.NewTokens(tokenSet(roles, map[string]string{"ops": "old-secret-0123", "ci": "ci-secret-0123"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := tokens.Names(); !slices.Equal(got, []string{"ci", "ops"}) {
		t.Errorf("names %q", got)
	}
	if name, role, ok := tokens.Match("old-secret-0123"); !ok || name != "ops" || role != access.Operator {
		t.Errorf("match = %q, %s, %v", name, role, ok)
	}
	if role, ok := tokens.Role("ci"); !ok || role != access.Viewer {
		t.Errorf("ci's role = %s, %v", role, ok)
	}
	for _, wrong := range []string{"", "old-secret-012", "old-secret-01234", "ops"} {
		if name, _, ok := tokens.Match(wrong); ok {
			t.Errorf("%q matched %s", wrong, name)
		}
	}
	before, _ := tokens.Secret("ops")

	// Rotation: the new token is added beside the old one, then the old
	// one goes; a refused set keeps the tokens there were.
	for _, bad := range []struct {
		set  map[string]access.Token
		want string
	}{
		{nil, "no token"},
		{tokenSet(roles, map[string]string{"ops": ""}), "empty name or token"},
		{tokenSet(roles, map[string]string{"ops": "same-0123", "ci": "same-0123"}), "are the same token"},
		{tokenSet(roles, map[string]string{"ops": "new-secret-0123", "oncall": "oncall-0123"}), "token oncall has no role"},
	} {
		if err := tokens.Replace(bad.set); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Replace(%v) = %v, want %q", bad.set, err, bad.want)
		}
	}
	if _, _, ok := tokens.Match("old-secret-0123"); !ok {
		t.Error("a refused Replace dropped the tokens")
	}
	if err := tokens.Replace(tokenSet(map[string]access.Role{"ops": access.Reader}, map[string]string{"ops": "new-secret-0123"})); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := tokens.Match("old-secret-0123"); ok {
		t.Error("the replaced token still matches")
	}
	if role, _ := tokens.Role("ops"); role != access.Reader {
		t.Errorf("ops's role after the change = %s, want reader", role)
	}
	after, ok := tokens.Secret("ops")
	if !ok || bytes.Equal(before, after) {
		t.Error("the session key did not change with the token")
	}
	if _, ok := tokens.Secret("ci"); ok {
		t.Error("a removed token still has a session key")
	}
}

func TestRoles(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		has, needs access.Role
		ok         bool
	}{
		{access.Viewer, access.Viewer, true}, {access.Viewer, access.Reader, false}, {access.Viewer, access.Operator, false},
		{access.Reader, access.Viewer, true}, {access.Reader, access.Operator, false},
		{access.Operator, access.Viewer, true}, {access.Operator, access.Reader, true}, {access.Operator, access.Operator, true},
		{0, access.Viewer, false}, {access.Operator, 0, false}, // a route without a role allows no one
	} {
		if got := c.has.Allows(c.needs); got != c.ok {
			t.Errorf("%s allows %s = %v, want %v", c.has, c.needs, got, c.ok)
		}
	}
	grants, problems := access.ParseGrants("admin.roles", []string{"a=viewer", " b = Operator ", "a=reader", "", "c=root", "d"})
	if grants["a"] != access.Reader || grants["b"] != access.Operator || len(grants) != 2 {
		t.Errorf("grants %v", grants)
	}
	if len(problems) != 2 || !strings.Contains(problems[0], `c: "root" is not a role: use viewer, reader or operator`) ||
		!strings.Contains(problems[1], `"d" is not name=role`) {
		t.Errorf("problems %q", problems)
	}
}
