package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The binary never links the test, benchmark and demo infrastructure:
// internal/dev, and the packages named …test beside the sinks (their test
// servers, the conformance suite).
func TestBinaryLeavesOutTheDevTools(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/outbox-relay/outbox-relay/"
	for _, p := range strings.Fields(string(out)) {
		if strings.Contains(p, "/internal/dev/") || strings.HasPrefix(p, module) && strings.HasSuffix(p, "test") {
			t.Errorf("the binary links %s", p)
		}
	}
}
