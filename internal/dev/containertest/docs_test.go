package containertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The example test in docs/producers.md is the one make test runs.
func TestDocsShowTheExampleTestAsItRuns(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "producers.md"))
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(filepath.Join(root, "relaycontainer", "example_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "## Testing with the relay in a container")
	if !ok {
		t.Fatal("docs/producers.md has no section on testing with the relay in a container")
	}
	_, block, ok := strings.Cut(section, "```go\n")
	if ok {
		block, _, ok = strings.Cut(block, "```")
	}
	if !ok {
		t.Fatal("the section has no Go code block")
	}
	if block != string(example) {
		t.Error("the example in docs/producers.md differs from relaycontainer/example_test.go: copy the file into the doc")
	}
}
