package stack

import (
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
)

// sockIP returns a as the IP Go's net reports for a socket address (from
// getsockname or getpeername): an empty address, that of a socket bound
// to every address, is the unspecified address of the socket's protocol
// proto (0.0.0.0 or ::).
func sockIP(a tcpip.Address, proto tcpip.NetworkProtocolNumber) net.IP {
	if a.Len() == 0 {
		if proto == ipv4.ProtocolNumber {
			return net.IPv4zero
		}
		return net.IPv6unspecified
	}
	return net.IP(a.AsSlice())
}

// tcpAddr returns fa as a *net.TCPAddr of a socket on proto.
func tcpAddr(fa tcpip.FullAddress, proto tcpip.NetworkProtocolNumber) *net.TCPAddr {
	return &net.TCPAddr{IP: sockIP(fa.Addr, proto), Port: int(fa.Port)}
}

// udpAddr returns fa as a *net.UDPAddr of a socket on proto.
func udpAddr(fa tcpip.FullAddress, proto tcpip.NetworkProtocolNumber) *net.UDPAddr {
	return &net.UDPAddr{IP: sockIP(fa.Addr, proto), Port: int(fa.Port)}
}

// addrPort returns fa as a netip.AddrPort, an IPv4-mapped address
// unmapped, without allocating.
func addrPort(fa tcpip.FullAddress) netip.AddrPort {
	var a netip.Addr
	switch fa.Addr.Len() {
	case 4:
		a = netip.AddrFrom4(fa.Addr.As4())
	case 16:
		a = netip.AddrFrom16(fa.Addr.As16()).Unmap()
	}
	return netip.AddrPortFrom(a, fa.Port)
}

// destAddr converts a destination for gVisor: an IPv4 or IPv4-mapped
// address as 4 bytes (gVisor sends it from a dual-stack IPv6 socket as
// IPv4, as the kernel does), IPv6 as 16, the zone dropped, without
// allocating. An invalid address is not converted (ok false).
func destAddr(ap netip.AddrPort) (fa tcpip.FullAddress, ok bool) {
	a := ap.Addr()
	if !a.IsValid() {
		return tcpip.FullAddress{}, false
	}
	if a = a.Unmap(); a.Is4() {
		return tcpip.FullAddress{Addr: tcpip.AddrFrom4(a.As4()), Port: ap.Port()}, true
	}
	return tcpip.FullAddress{Addr: tcpip.AddrFrom16(a.As16()), Port: ap.Port()}, true
}

// udpAddrPort converts a *net.UDPAddr as net's UDPAddr.AddrPort does,
// refusing an IP of neither 4 nor 16 bytes and a port out of range.
func udpAddrPort(a *net.UDPAddr) (netip.AddrPort, bool) {
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok || a.Port < 0 || a.Port > 0xffff {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ip, uint16(a.Port)), true
}
