package layers_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/outbox-relay/outbox-relay/"

// layers lists the production packages from the bottom up; a package
// imports only packages of its own layer or below. The tools (internal/dev:
// tests, the benchmark, the demo; and every package named …test: the
// sinks' conformance suite, each sink's test server beside its sink) are
// above them all, and none of them imports one.
var layers = [][]string{
	// The sink contract and the leaves.
	{"relay/sink", "internal/db/schema", "internal/testsignal", "internal/gctune", "internal/methods",
		"internal/problems"},
	// The sinks, the statements, the retry policy.
	{"relay/retry", "internal/db/outboxdb", "relay/kafka", "relay/nats", "relay/pubsub", "relay/rabbitmq", "relay/redis", "relay/sqs",
		"relay/webhook", "relay/cloudevents", "tracing"},
	// The table: the claim engine, the producer API, the schema; the
	// binary's list of sinks.
	{"relay/store", "outbox", "migrations", "relay/sink/builtin"},
	// Flow control: each destination's breaker, pauses, bulkhead, gates
	// and fleet share; judging and settling a publish's results.
	{"relay/flow", "relay/logsource"},
	// The delivery engine.
	{"relay"},
	// What runs beside it: coordination, dead letters, metrics, history.
	{"fleet", "deadletter", "access", "metrics", "history"},
	// The operators' and the configuration's surfaces.
	{"api", "console", "config"},
	// The programs.
	{"cmd/outbox-relay", "relaycontainer"},
}

// sinks import, of this module, the sink contract alone.
var sinks = []string{"relay/kafka", "relay/nats", "relay/pubsub", "relay/rabbitmq", "relay/redis", "relay/sqs", "relay/webhook"}

func TestPackagesKeepToTheirLayers(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	layerOf := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			layerOf[p] = i
		}
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		if isTool(pkg) || pkg == "internal/layers" {
			continue
		}
		own, ok := layerOf[pkg]
		if !ok {
			t.Errorf("%s has no layer: add it to this test and to ARCHITECTURE.md", pkg)
			continue
		}
		seen++
		for _, imp := range fields[1:] {
			dep, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			switch l, ok := layerOf[dep]; {
			case isTool(dep):
				t.Errorf("%s imports %s: the production tree never imports the tools", pkg, dep)
			case !ok:
			case l > own:
				t.Errorf("%s (layer %d) imports %s (layer %d): nothing imports upward", pkg, own, dep, l)
			}
			for _, s := range sinks {
				if pkg == s && dep != "relay/sink" {
					t.Errorf("the sink %s imports %s: a sink imports the sink contract alone", pkg, dep)
				}
			}
		}
	}
	if seen != len(layerOf) {
		t.Errorf("go list found %d of the %d packages in the layers", seen, len(layerOf))
	}
}

func isTool(pkg string) bool {
	return strings.HasPrefix(pkg, "internal/dev/") || strings.HasSuffix(pkg, "test")
}
