// Package syncbuf is a buffer that a writer (a logger, a process's
// output) and a test can use at once.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
