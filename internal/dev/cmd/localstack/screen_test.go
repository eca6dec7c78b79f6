package main

import (
	"bytes"
	"strings"
	"testing"
)

// On a terminal a log line clears the status line, and the status line is
// drawn again under it; a line that comes in pieces is printed whole.
func TestLogLinesDoNotJoinTheStatusLine(t *testing.T) {
	var tty bytes.Buffer
	s := &screen{out: &tty, tty: true}
	s.Status("produced 10 | delivered 8")
	w := s.Lines(&tty)
	w.Write([]byte("time=12:00 level=WARN msg=\"row dead"))
	w.Write([]byte("-lettered\" id=7\nlevel=INFO msg=next"))
	s.Status("produced 20 | delivered 18")
	w.Write([]byte(" line\n"))
	s.Done()
	want := clearLine + "produced 10 | delivered 8" +
		clearLine + "time=12:00 level=WARN msg=\"row dead-lettered\" id=7\n" + "produced 10 | delivered 8" +
		clearLine + "produced 20 | delivered 18" +
		clearLine + "level=INFO msg=next line\n" + "produced 20 | delivered 18" + "\n"
	if got := tty.String(); got != want {
		t.Errorf("the terminal got\n%q\nwant\n%q", got, want)
	}
	// What a reader sees: every log line on a line of its own.
	for _, l := range strings.Split(strings.ReplaceAll(tty.String(), clearLine, "\n"), "\n") {
		if strings.Contains(l, "msg=") && strings.Contains(l, "produced") {
			t.Errorf("a log line shares its line with the status: %q", l)
		}
	}
}

// Off a terminal the status is a line of its own, now and then.
func TestStatusOffATerminal(t *testing.T) {
	var file bytes.Buffer
	s := &screen{out: &file}
	s.Status("produced 10")
	s.Status("produced 11") // within statusEvery: not printed
	s.Lines(&file).Write([]byte("a log line\n"))
	if got, want := file.String(), "produced 10\na log line\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
