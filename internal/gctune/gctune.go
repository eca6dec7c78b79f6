// Package gctune sets the garbage collection target the relay runs with.
// The relay's binary and the benchmark both apply it, so that the
// benchmark measures the relay as it ships.
package gctune

import (
	"os"
	"runtime/debug"
)

// Percent is the GOGC the relay runs with when the environment does not
// set GOGC. The relay's heap is small and bounded by design (each worker
// holds at most two batches of its byte limit), and its garbage is
// mostly whole batches: with Go's default of 100 it collects whenever
// the heap has doubled, dozens of times a second while a backlog drains.
// At 200 it collects half as often, for a heap target of 3× the live
// heap instead of 2×: draining 1M rows, 0% of the CPU in collection, the
// same rate as at 400, and a peak resident memory of 83 MB rather than
// 142 MB. GOMEMLIMIT, where set, still bounds it.
const Percent = 200

// Apply sets the garbage collection target to Percent, unless GOGC is set
// in the environment, which then decides as usual.
func Apply() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(Percent)
	}
}
