package stack

import (
	"fmt"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// Route is a route of Config.Routes: packets to Dst leave on the wire for
// Gateway, a neighbour on one of the stack's subnets (Config.Addrs), or
// for the destination itself when Gateway is the zero Addr (on link).
// Dst 0.0.0.0/0 or ::/0 makes a default route.
type Route struct {
	Dst     netip.Prefix
	Gateway netip.Addr
}

// String returns the route as `ip route` prints it: "198.51.100.0/24 via
// 192.0.2.2", or "198.51.100.0/24" on link.
func (r Route) String() string {
	if !r.Gateway.IsValid() {
		return r.Dst.String()
	}
	return r.Dst.String() + " via " + r.Gateway.String()
}

// checkAddrs refuses the stack addresses that no interface can own: an
// invalid prefix, an unspecified, multicast, IPv4-mapped or loopback
// address (the loopback interface owns 127.0.0.1/8 and ::1).
func checkAddrs(addrs []netip.Prefix) error {
	for _, p := range addrs {
		a := p.Addr()
		switch {
		case !p.IsValid():
			return fmt.Errorf("stack: address %s: not a valid prefix", p)
		case a.Is4In6():
			return fmt.Errorf("stack: address %s: an IPv4-mapped address; give the IPv4 address", p)
		case a.IsUnspecified():
			return fmt.Errorf("stack: address %s: unspecified", p)
		case a.IsMulticast():
			return fmt.Errorf("stack: address %s: a multicast address", p)
		case a.IsLoopback():
			return fmt.Errorf("stack: address %s: a loopback address (the stack's loopback interface has 127.0.0.1/8 and ::1)", p)
		}
	}
	return nil
}

// checkRoutes refuses the routes Linux's `ip route add` refuses: an invalid
// or unmasked destination ("Invalid prefix for given prefix length"), a
// gateway of the other family, an unspecified, multicast or loopback one,
// and one that is not a neighbour, off every subnet of addrs or one of the
// stack's own addresses or a subnet's broadcast address (fib_check_nh:
// "Nexthop has invalid gateway").
func checkRoutes(routes []Route, addrs []netip.Prefix) error {
	for _, r := range routes {
		d, g := r.Dst, r.Gateway
		switch {
		case !d.IsValid():
			return fmt.Errorf("stack: route %s: destination is not a valid prefix", r)
		case d.Addr().Is4In6():
			return fmt.Errorf("stack: route %s: an IPv4-mapped destination; give the IPv4 prefix", r)
		case d.Masked() != d:
			return fmt.Errorf("stack: route %s: destination has host bits set (want %s)", r, d.Masked())
		case !g.IsValid():
			continue // on link
		case g.Is4() != d.Addr().Is4() || g.Is4In6():
			return fmt.Errorf("stack: route %s: gateway and destination are of different families", r)
		case g.IsUnspecified() || g.IsMulticast() || g.IsLoopback():
			return fmt.Errorf("stack: route %s: gateway must be a unicast address", r)
		}
		if !isNeighbour(g, addrs) {
			return fmt.Errorf("stack: route %s: invalid gateway: not a neighbour on any of the stack's subnets", r)
		}
	}
	return nil
}

// isNeighbour reports whether g lies on one of the subnets of addrs and is
// neither one of the stack's own addresses nor an IPv4 subnet's broadcast
// address.
func isNeighbour(g netip.Addr, addrs []netip.Prefix) bool {
	on := false
	for _, p := range addrs {
		if p.Addr() == g {
			return false
		}
		if !p.Contains(g) {
			continue
		}
		if g.Is4() && p.Bits() < 31 && g == lastAddr(p) {
			return false
		}
		on = true
	}
	return on
}

// lastAddr returns p's last address (an IPv4 subnet's broadcast address).
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(a)
}

// gvisorRoutes converts routes for gVisor's table, on the wire's NIC.
// gVisor takes the first matching route and keeps its table sorted by
// prefix length, longest first (Stack.addRouteLocked), as Linux's longest
// prefix match; among routes of one length the first added wins, so the
// caller adds the subnets' routes first.
func gvisorRoutes(routes []Route) []tcpip.Route {
	out := make([]tcpip.Route, 0, len(routes))
	for _, r := range routes {
		dst := protocolAddress(r.Dst).AddressWithPrefix.Subnet()
		var gw tcpip.Address
		if r.Gateway.IsValid() {
			gw = tcpip.AddrFromSlice(r.Gateway.AsSlice())
		}
		out = append(out, tcpip.Route{Destination: dst, Gateway: gw, NIC: nicID})
	}
	return out
}
