package outboxdb

import (
	"strings"
	"testing"
)

// Every statement renders, for a schema that needs quoting in no way but
// is not the default, with the tables named by schema.
func TestStatementsRender(t *testing.T) {
	q, err := New("billing", Options{KeepSent: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"claim", "delete_sent", "delete_expired_dead", "replay", "reroute", "edit", "leased_fail", "insert_audit"} {
		sql, err := q.Statement(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !strings.Contains(sql, `"billing"."outbox`) || strings.Contains(sql, "{{") || strings.Contains(sql, "<no value>") {
			t.Errorf("%s rendered as:\n%s", name, sql)
		}
	}
	if _, err := New("bad-name", Options{}); err == nil {
		t.Error("a schema that is not a plain identifier was accepted")
	}
}
