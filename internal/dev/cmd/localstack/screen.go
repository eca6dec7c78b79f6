package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	xterm "golang.org/x/term"
)

// screen is the demo's terminal: a status line that redraws itself in
// place at the bottom, and whole lines of output (the relay's log, the
// demo's own messages) above it. On a terminal, each line first clears the
// status line, and the status line is drawn again under it; elsewhere (a
// pipe, a file) the status is printed as a line of its own every
// statusEvery.
type screen struct {
	mu     sync.Mutex
	out    io.Writer // where the status line is drawn
	tty    bool
	status string
	last   time.Time // when a status line was last printed, off a terminal
}

// statusEvery is how often the status is printed where it cannot redraw.
const statusEvery = 10 * time.Second

func newScreen(out *os.File) *screen {
	return &screen{out: out, tty: xterm.IsTerminal(int(out.Fd()))}
}

// clearLine is a carriage return and ANSI "erase the line".
const clearLine = "\r\x1b[2K"

// Status shows line as the status.
func (s *screen) Status(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = line
	switch {
	case s.tty:
		io.WriteString(s.out, clearLine+line)
	case time.Since(s.last) >= statusEvery:
		s.last = time.Now()
		io.WriteString(s.out, line+"\n")
	}
}

// print writes whole lines to w above the status line.
func (s *screen) print(w io.Writer, lines []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tty && s.status != "" {
		io.WriteString(s.out, clearLine)
	}
	w.Write(lines)
	if s.tty && s.status != "" {
		io.WriteString(s.out, s.status)
	}
}

// Printf writes a line to standard output above the status line.
func (s *screen) Printf(format string, args ...any) {
	s.print(os.Stdout, []byte(fmt.Sprintf(format, args...)+"\n"))
}

// Errorf writes a line to standard error above the status line.
func (s *screen) Errorf(format string, args ...any) {
	s.print(os.Stderr, []byte(fmt.Sprintf(format, args...)+"\n"))
}

// Done ends the status line, leaving it on the screen.
func (s *screen) Done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tty && s.status != "" {
		io.WriteString(s.out, "\n")
	}
	s.status = ""
}

// Lines returns a writer of a process's output to w: it passes on whole
// lines, above the status line, and keeps a line's start until its end
// comes.
func (s *screen) Lines(w io.Writer) io.Writer { return &lineWriter{s: s, w: w} }

type lineWriter struct {
	s       *screen
	w       io.Writer
	partial []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.partial = append(l.partial, p...)
	if i := bytes.LastIndexByte(l.partial, '\n'); i >= 0 {
		l.s.print(l.w, l.partial[:i+1])
		l.partial = append([]byte(nil), l.partial[i+1:]...)
	}
	return len(p), nil
}
