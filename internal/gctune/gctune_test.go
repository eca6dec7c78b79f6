package gctune

import (
	"os"
	"runtime/debug"
	"testing"
)

func TestApplyUnlessGOGCIsSet(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))

	t.Setenv("GOGC", "150") // restored after the test
	debug.SetGCPercent(150)
	Apply()
	if got := debug.SetGCPercent(100); got != 150 {
		t.Errorf("with GOGC set, Apply changed the target to %d", got)
	}

	os.Unsetenv("GOGC")
	Apply()
	if got := debug.SetGCPercent(100); got != Percent {
		t.Errorf("without GOGC, the target is %d after Apply, want %d", got, Percent)
	}
}
