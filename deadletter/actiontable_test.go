package deadletter_test

import (
	"context"
	"regexp"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
)

// The audit table accepts exactly the actions of the table: an action
// added without the migration that widens the CHECK would fail to record
// itself, and one removed from the table would still be accepted.
func TestAuditCheckAllowsExactlyTheActions(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	var def string
	if err := s.Pool.QueryRow(context.Background(), `SELECT pg_get_constraintdef(oid) FROM pg_constraint
WHERE conname = 'outbox_audit_action_check' AND conrelid = 'outbox_audit'::regclass`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	var allowed []string
	for _, m := range regexp.MustCompile(`'([a-z_]+)'::text`).FindAllStringSubmatch(def, -1) {
		allowed = append(allowed, m[1])
	}
	names := deadletter.ActionNames()
	slices.Sort(allowed)
	slices.Sort(names)
	if !slices.Equal(allowed, names) {
		t.Fatalf("the audit CHECK allows %q (%s); the actions are %q: add a migration that changes the CHECK", allowed, def, names)
	}
}

// Every action has a past tense and a unique name (and its API endpoint:
// see the api package's tests).
func TestActionTableIsComplete(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, a := range deadletter.Actions {
		if a.Name == "" || a.Past == "" || seen[a.Name] {
			t.Errorf("action %+v: a unique name and a past tense are required", a)
		}
		seen[a.Name] = true
		if got, ok := deadletter.LookupAction(a.Name); !ok || got.Name != a.Name || got.Route != a.Route {
			t.Errorf("LookupAction(%q) = %+v, %v", a.Name, got, ok)
		}
	}
	if _, ok := deadletter.LookupAction("erase"); ok {
		t.Error("LookupAction found an action that does not exist")
	}
}
