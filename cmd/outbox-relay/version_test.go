package main

import (
	"encoding/json"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// version names the build: its version, commit, build date and Go
// version, as text and as JSON; /livez tells the same (observe_test.go).
func TestVersion(t *testing.T) {
	t.Parallel()
	r := runBinary(t, nil, "version", "--json")
	if r.code != 0 {
		t.Fatalf("version --json: exit %d: %s", r.code, r.stderr)
	}
	var b build
	if err := json.Unmarshal([]byte(r.stdout), &b); err != nil {
		t.Fatalf("version --json: %v\n%s", err, r.stdout)
	}
	if b.Version == "" || b.Go != runtime.Version() || b.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("version --json: %+v", b)
	}
	// Built from this work tree (by make, or by the tests): its commit,
	// and that commit's time.
	if head, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		if b.Revision != strings.TrimSpace(string(head)) {
			t.Errorf("revision %q, want HEAD %s", b.Revision, head)
		}
		if _, err := time.Parse(time.RFC3339, b.Date); err != nil {
			t.Errorf("build date %q: %v", b.Date, err)
		}
	}
	text := runBinary(t, nil, "version")
	for _, want := range []string{"outbox-relay " + b.Version, "commit:  " + b.Revision, "built:   ", "go:      " + b.Go} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("version does not say %q:\n%s", want, text.stdout)
		}
	}
}
