package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// errGuard marks a connection the SSRF guard refused.
var errGuard = errors.New("refused by the SSRF guard")

// blocked are special-purpose ranges beside those netip classifies:
// "this network", carrier-grade NAT, IETF protocol assignments,
// benchmarking, reserved, and IPv6 ranges that embed IPv4 addresses
// (NAT64, 6to4), which could reach private IPv4 hosts.
var blocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2002::/16"),
}

// Forbidden reports whether the SSRF guard refuses addr: loopback,
// private, link-local, unspecified, multicast and other special-purpose
// addresses.
func Forbidden(addr netip.Addr) bool {
	addr = addr.Unmap()
	if addr.IsLoopback() || addr.IsPrivate() || addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast() ||
		addr.IsInterfaceLocalMulticast() || addr.IsMulticast() || addr.IsUnspecified() {
		return true
	}
	for _, p := range blocked {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// guard is a net.Dialer Control function: it runs after name resolution,
// on the address about to be connected, so DNS tricks cannot get past it.
func guard(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%w: %v", errGuard, err)
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("%w: %q is not an IP address", errGuard, host)
	}
	if Forbidden(addr) {
		return fmt.Errorf("%w: %s is a loopback, private or link-local address (allow_private_networks turns the guard off)", errGuard, addr)
	}
	return nil
}
