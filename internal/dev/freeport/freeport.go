// Package freeport finds loopback ports for the test servers that run as
// processes of their own (PostgreSQL, RabbitMQ, Redis, NATS, the SQS
// emulator), which bind the port after it is chosen and again after each
// restart.
//
// The kernel's own choice (listening on port 0) comes from its ephemeral
// range, where every outgoing connection on the machine also takes its
// local port: between the choice and the server's bind, or while a killed
// server starts again, a connection of a test running beside it can take
// the port (RabbitMQ: "could not bind to distribution port"). The ports
// here come from below that range, which connections never take; a bind
// checks that no listener has one.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the smallest port chosen: above the well-known services'.
const lowest = 10000

// Ports returns n distinct ports free on 127.0.0.1 now, below the
// ephemeral range.
func Ports(n int) ([]int, error) {
	return pick(n, lowest, ephemeralStart())
}

// pick returns n distinct ports of [lo, hi) free on 127.0.0.1 now.
func pick(n, lo, hi int) ([]int, error) {
	var out []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for tries := 0; len(out) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("freeport: not %d free ports in [%d, %d)", n, lo, hi)
		}
		p := lo + rand.IntN(hi-lo)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		lns = append(lns, ln)
		out = append(out, p)
	}
	return out, nil
}

// Port returns one port as Ports does.
func Port() (int, error) {
	p, err := Ports(1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// ephemeralStart is the first port of the kernel's ephemeral range
// (Linux's default where it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if p, err := strconv.Atoi(f[0]); err == nil && p > lowest+1000 {
				return p
			}
		}
	}
	return 32768
}
