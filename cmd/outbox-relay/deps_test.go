package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The binary never links the test, benchmark and demo infrastructure.
func TestBinaryLeavesOutTheDevTools(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.Contains(p, "/internal/dev/") {
			t.Errorf("the binary links %s", p)
		}
	}
}
