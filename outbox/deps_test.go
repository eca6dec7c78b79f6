package outbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Applications import this package: it must not pull in the relay's own
// tooling (goose, the Kafka and HTTP sinks, the CLI). Only these modules
// may appear among its dependencies, besides the standard library.
func TestProducerAPIDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{with .Module}}{{.Path}}{{end}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string]bool{
		"github.com/outbox-relay/outbox-relay": true,
		"github.com/jackc/pgx/v5":              true, // and what pgx needs:
		"github.com/jackc/pgpassfile":          true,
		"github.com/jackc/pgservicefile":       true,
		"github.com/jackc/puddle/v2":           true,
		"golang.org/x/text":                    true,
		"golang.org/x/sync":                    true,
		"github.com/google/uuid":               true, // event ids
		"go.opentelemetry.io/otel":             true, // trace context in headers
		"go.opentelemetry.io/otel/trace":       true,
		"github.com/cespare/xxhash/v2":         true, // needed by otel's attributes
	}
	seen := map[string]bool{}
	for _, m := range strings.Fields(string(out)) {
		if !allowed[m] && !seen[m] {
			t.Errorf("the producer API depends on %s", m)
		}
		seen[m] = true
	}
	if !seen["github.com/jackc/pgx/v5"] {
		t.Fatalf("go list found no pgx among the dependencies: %q", out)
	}
}

// The producer API is apart from the relay's engine: of this module it
// needs only the statements, the schema names and the sink contract (a
// leaf, for the header names the relay sets).
func TestProducerAPIStaysApartFromTheRelay(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/outbox-relay/outbox-relay/"
	allowed := map[string]bool{
		module + "outbox":               true,
		module + "internal/db/outboxdb": true,
		module + "internal/db/schema":   true,
		module + "relay/sink":           true,
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, module) && !allowed[p] {
			t.Errorf("the producer API imports %s", p)
		}
	}
}
