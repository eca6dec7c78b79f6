package testsignal

import (
	"fmt"
	"testing"
)

// fatalTB records a Fatalf instead of ending the test.
type fatalTB struct{ failed string }

func (*fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(f)
}

func TestSignal(t *testing.T) {
	var s Signal[int]
	s.Send(1) // not initialised: dropped
	var nilSignal *Signal[int]
	nilSignal.Send(1)
	s.Init()
	for i := range 5 {
		s.Send(i)
	}
	if got := s.Wait(t, "the first event"); got != 0 {
		t.Fatalf("Wait returned %d, want 0: events before Init are dropped", got)
	}
	if got := s.WaitFor(t, "an event above 2", func(v int) bool { return v > 2 }); got != 3 {
		t.Fatalf("WaitFor returned %d, want 3", got)
	}
	if got := s.Wait(t, "the next event"); got != 4 {
		t.Fatalf("Wait returned %d, want 4: WaitFor consumes what it skips", got)
	}
}

func TestWaitOnAnUninitialisedSignalFails(t *testing.T) {
	var s Signal[int]
	tb := &fatalTB{}
	func() {
		defer func() { _ = recover() }()
		s.Wait(tb, "anything")
	}()
	if tb.failed == "" {
		t.Fatal("waiting on a signal no code can send to did not fail")
	}
}
