package stack

import (
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/hdr"
)

// The link endpoint's header reads: where a received frame's IP and L4
// headers are, on gVisor's header views (and internal/hdr for what they
// lack). The frames here are the NIC model's: the Ethernet header first,
// without a VLAN tag (a tagged frame reads as another EtherType, so none
// of these parsers take it), or on a TUN's wire (l2 0) the IP header
// first; and the headers in the linear part, checked
// by the NIC model (driver.ParseFrame) or rebuilt by GRO. udpHeaders and
// tcpHeaders still check every length they read, so that a frame nobody
// checked costs a false ok, not a panic; the readers given their offsets
// (udpDest, udpSource, ipAddrs) check none. None allocates.

// ethLen is where the IP header of the NIC model's Ethernet frames starts;
// the frames of a TUN's wire start with it (l2 0).
const ethLen = header.EthernetMinimumSize

// netProto returns the network protocol of the frame b whose IP header
// starts at l2: the Ethernet header's EtherType, or with l2 0 (a TUN's
// frame) the IP version's; 0 when b is too short to tell.
func netProto(b []byte, l2 int) tcpip.NetworkProtocolNumber {
	if l2 == 0 {
		if len(b) == 0 {
			return 0
		}
		switch header.IPVersion(b) {
		case header.IPv4Version:
			return header.IPv4ProtocolNumber
		case header.IPv6Version:
			return header.IPv6ProtocolNumber
		}
		return 0
	}
	if len(b) < header.EthernetMinimumSize {
		return 0
	}
	return header.Ethernet(b).Type()
}

// udpHeaders returns the offsets of the IP and UDP headers of a UDP packet
// whose headers are all in its linear part, its IP header at l2. An IPv6 packet with extension
// headers is not taken.
func udpHeaders(p *bufpool.Packet, l2 int) (l3, l4 int, ok bool) {
	l := p.Linear
	l3Off := l2
	switch netProto(l, l2) {
	case header.IPv4ProtocolNumber:
		if len(l) < l3Off+header.IPv4MinimumSize {
			return 0, 0, false
		}
		ip := header.IPv4(l[l3Off:])
		if ip.TransportProtocol() != header.UDPProtocolNumber {
			return 0, 0, false
		}
		l4 = l3Off + int(ip.HeaderLength())
	case header.IPv6ProtocolNumber:
		if len(l) < l3Off+header.IPv6MinimumSize || header.IPv6(l[l3Off:]).TransportProtocol() != header.UDPProtocolNumber {
			return 0, 0, false
		}
		l4 = l3Off + header.IPv6MinimumSize
	default:
		return 0, 0, false
	}
	return l3Off, l4, len(l) >= l4+header.UDPMinimumSize
}

// udpDest returns the destination address of the IP header at l3.
func udpDest(l []byte, l3 int) netip.Addr {
	_, dst := ipAddrs(l[l3:])
	a, _ := netip.AddrFromSlice(dst)
	return a
}

// udpSource returns the source address and port of a UDP packet, its IP
// header at l3 and its UDP header at l4.
func udpSource(l []byte, l3, l4 int) netip.AddrPort {
	src, _ := ipAddrs(l[l3:])
	a, _ := netip.AddrFromSlice(src)
	return netip.AddrPortFrom(a, header.UDP(l[l4:]).SourcePort())
}

// tcpHeaders locates the TCP segment in a frame's first bytes, its IP
// header at l2:
// the offsets of its IP and TCP headers, the TCP header's length, and its
// sequence length (payload, plus one for a FIN). ok is false for anything
// but an unfragmented IPv4 or IPv6 TCP segment whose headers are all in b
// (an IPv6 packet with extension headers is not taken).
func tcpHeaders(b []byte, l2 int) (ip, tcp, tcpLen, segLen int, ok bool) {
	ip = l2
	var total int
	switch netProto(b, l2) {
	case header.IPv4ProtocolNumber:
		if len(b) < ip+header.IPv4MinimumSize {
			return
		}
		h := header.IPv4(b[ip:])
		if h.TransportProtocol() != header.TCPProtocolNumber || hdr.IsIPv4Fragment(h) {
			return
		}
		tcp = ip + int(h.HeaderLength())
		total = int(h.TotalLength())
	case header.IPv6ProtocolNumber:
		if len(b) < ip+header.IPv6MinimumSize {
			return
		}
		h := header.IPv6(b[ip:])
		if h.TransportProtocol() != header.TCPProtocolNumber {
			return
		}
		tcp = ip + header.IPv6MinimumSize
		total = header.IPv6MinimumSize + int(h.PayloadLength())
	default:
		return
	}
	if len(b) < tcp+header.TCPMinimumSize {
		return
	}
	t := header.TCP(b[tcp:])
	tcpLen = int(t.DataOffset())
	payload := total - (tcp - ip) - tcpLen
	if tcpLen < header.TCPMinimumSize || len(b) < tcp+tcpLen || payload < 0 {
		return
	}
	segLen = payload
	if t.Flags().Contains(header.TCPFlagFin) {
		segLen++
	}
	return ip, tcp, tcpLen, segLen, true
}

// isIPv4 reports whether the IP header ip, at least one byte long, is an
// IPv4 header (else the parsers above took it as IPv6).
func isIPv4(ip []byte) bool { return header.IPVersion(ip) == header.IPv4Version }

// ipAddrs returns an IP header's source and destination addresses: 4
// bytes each for IPv4, 16 for IPv6. ip must hold the whole fixed header.
func ipAddrs(ip []byte) (src, dst []byte) {
	if isIPv4(ip) {
		h := header.IPv4(ip)
		return h.SourceAddressSlice(), h.DestinationAddressSlice()
	}
	h := header.IPv6(ip)
	return h.SourceAddressSlice(), h.DestinationAddressSlice()
}
