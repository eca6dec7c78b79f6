package freeport

import (
	"fmt"
	"net"
	"testing"
)

func TestPortsAreFreeDistinctAndBelowTheEphemeralRange(t *testing.T) {
	ports, err := Ports(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p < lowest || p >= ephemeralStart() {
			t.Errorf("port %d outside [%d, %d)", p, lowest, ephemeralStart())
		}
		if seen[p] {
			t.Errorf("port %d twice", p)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Errorf("port %d is not free: %v", p, err)
			continue
		}
		_ = ln.Close()
	}
}

// Of a range of three ports with two listened on, the third is the one
// returned, every time; asking for two of them fails.
func TestTakenPortsAreSkipped(t *testing.T) {
	ports, err := Ports(1)
	if err != nil {
		t.Fatal(err)
	}
	lo := ports[0]
	var free int
	for p := lo; p < lo+3; p++ {
		if p == lo+1 {
			free = p
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Skipf("port %d is taken by another process", p)
		}
		defer ln.Close()
	}
	for range 20 {
		got, err := pick(1, lo, lo+3)
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != free {
			t.Fatalf("got port %d, want %d, the only one not listened on", got[0], free)
		}
	}
	if got, err := pick(2, lo, lo+3); err == nil {
		t.Fatalf("got ports %v of a range with one free", got)
	}
}
