package access_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/access"
)

func TestTokens(t *testing.T) {
	t.Parallel()
	tokens, err := access.NewTokens(map[string]string{"ops": "old-secret-0123", "ci": "ci-secret-0123"})
	if err != nil {
		t.Fatal(err)
	}
	if got := tokens.Names(); !slices.Equal(got, []string{"ci", "ops"}) {
		t.Errorf("names %q", got)
	}
	if name, ok := tokens.Match("old-secret-0123"); !ok || name != "ops" {
		t.Errorf("match = %q, %v", name, ok)
	}
	for _, wrong := range []string{"", "old-secret-012", "old-secret-01234", "ops"} {
		if name, ok := tokens.Match(wrong); ok {
			t.Errorf("%q matched %s", wrong, name)
		}
	}
	before, _ := tokens.Secret("ops")

	// Rotation: the new token is added beside the old one, then the old
	// one goes; a refused set keeps the tokens there were.
	for _, bad := range []struct {
		set  map[string]string
		want string
	}{
		{nil, "no token"},
		{map[string]string{"ops": ""}, "empty name or token"},
		{map[string]string{"ops": "same-0123", "ci": "same-0123"}, "are the same token"},
	} {
		if err := tokens.Replace(bad.set); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Replace(%v) = %v, want %q", bad.set, err, bad.want)
		}
	}
	if _, ok := tokens.Match("old-secret-0123"); !ok {
		t.Error("a refused Replace dropped the tokens")
	}
	if err := tokens.Replace(map[string]string{"ops": "new-secret-0123"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := tokens.Match("old-secret-0123"); ok {
		t.Error("the replaced token still matches")
	}
	after, ok := tokens.Secret("ops")
	if !ok || bytes.Equal(before, after) {
		t.Error("the session key did not change with the token")
	}
	if _, ok := tokens.Secret("ci"); ok {
		t.Error("a removed token still has a session key")
	}
}
