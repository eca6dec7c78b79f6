// Package memdir gives tests throwaway directories in memory for servers
// that sync every write to disk (an emulator's SQLite database, Redis's
// append-only file with appendfsync always, RabbitMQ's queues before a
// publisher confirm). What such a server writes
// survives a kill of its process on a tmpfs as on a disk, so the crash
// tests prove the same thing; the syncs cost nothing there, where beside
// other tests on a busy disk each one took milliseconds.
package memdir

import (
	"os"
	"testing"
)

// shm is where Linux mounts a tmpfs every user may write to.
const shm = "/dev/shm"

// Temp returns a new directory in memory, removed when the test ends, or
// the test's own temporary directory where the machine has no tmpfs.
func Temp(tb testing.TB) string {
	tb.Helper()
	d, err := os.MkdirTemp(shm, "outbox-test-")
	if err != nil {
		return tb.TempDir()
	}
	tb.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}
