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
// whose headers are all in its linear part, its IP header at l2 (an IPv6
// packet's extension headers between them, as udp6Offset takes them). ok
// is false for anything else: not UDP, an IPv4 fragment
// (hdr.IsIPv4Fragment: only a first fragment has a UDP header, and even it
// holds part of the datagram; gVisor reassembles them, as
// ip_local_deliver's ip_defrag runs before udp_rcv), an IPv6 packet whose
// extension headers udp6Offset does not step over (a Fragment header
// among them), or an IP length that is shorter than the headers or runs
// past the frame (ip_rcv_core's and ipv6_rcv's checks, the driver's too).
// The IP length may be shorter than the frame: the rest is padding, which
// udpPayloadLen leaves out.
func udpHeaders(p *bufpool.Packet, l2 int) (l3, l4 int, ok bool) {
	l := p.Linear
	l3Off := l2
	var ipEnd int // where the IP packet ends in the frame
	switch netProto(l, l2) {
	case header.IPv4ProtocolNumber:
		if len(l) < l3Off+header.IPv4MinimumSize {
			return 0, 0, false
		}
		ip := header.IPv4(l[l3Off:])
		if ip.TransportProtocol() != header.UDPProtocolNumber || hdr.IsIPv4Fragment(ip) {
			return 0, 0, false
		}
		l4 = l3Off + int(ip.HeaderLength())
		ipEnd = l3Off + int(ip.TotalLength())
	case header.IPv6ProtocolNumber:
		if len(l) < l3Off+header.IPv6MinimumSize {
			return 0, 0, false
		}
		if l4, ok = udp6Offset(l, l3Off); !ok {
			return 0, 0, false
		}
		ipEnd = l3Off + header.IPv6MinimumSize + int(header.IPv6(l[l3Off:]).PayloadLength())
	default:
		return 0, 0, false
	}
	if l4 < l3Off+header.IPv4MinimumSize || ipEnd < l4+header.UDPMinimumSize || ipEnd > frameLen(p) {
		return 0, 0, false
	}
	return l3Off, l4, len(l) >= l4+header.UDPMinimumSize
}

// udp6Offset returns where the UDP header of the IPv6 packet at l3 of b
// starts, after the extension headers that need nothing done to reach it,
// which GRO keeps in a train's headers and splitUDP in each datagram's
// (parse6 merges packets whose extension headers are the same bytes): a
// hop-by-hop options header first, destination options, whose options all
// say to skip them if unknown (RFC 8200 section 4.2: the action bits 00,
// as Pad1, PadN and Router Alert), and a routing header with no segment
// left (section 4.4: ignored), at most hdr.MaxIPv6ExtHdrs of them, all in
// b. ok is false for any other chain (a Fragment header, an option that
// asks for a drop, a routing header to go on with, AH): gVisor processes
// that packet, and drops it unless it is a fragment to reassemble.
func udp6Offset(b []byte, l3 int) (l4 int, ok bool) {
	nh := header.IPv6(b[l3:]).NextHeader()
	off := l3 + header.IPv6MinimumSize
	for n := 0; ; n++ {
		if nh == uint8(header.UDPProtocolNumber) {
			return off, true
		}
		if n == hdr.MaxIPv6ExtHdrs || len(b)-off < hdr.IPv6ExtMinLen {
			return 0, false
		}
		ext := hdr.IPv6Ext(b[off:])
		hlen := ext.Len()
		if len(b)-off < hlen {
			return 0, false
		}
		switch header.IPv6ExtensionHeaderIdentifier(nh) {
		case header.IPv6HopByHopOptionsExtHdrIdentifier:
			if n != 0 || !ipv6OptionsSkippable(b[off+2:off+hlen]) {
				return 0, false
			}
		case header.IPv6DestinationOptionsExtHdrIdentifier:
			if !ipv6OptionsSkippable(b[off+2 : off+hlen]) {
				return 0, false
			}
		case header.IPv6RoutingExtHdrIdentifier:
			if b[off+3] != 0 { // Segments Left
				return 0, false
			}
		default:
			return 0, false
		}
		nh = ext.NextHeader()
		off += hlen
	}
}

// ipv6OptionsSkippable reports whether the options of a hop-by-hop or
// destination options header (its bytes after the first two) are all of
// a type whose action bits are 00, "skip over this option" (RFC 8200
// section 4.2), and fill it exactly.
func ipv6OptionsSkippable(opts []byte) bool {
	for len(opts) > 0 {
		typ := opts[0]
		if typ&0xc0 != 0 {
			return false
		}
		if typ == 0 { // Pad1: one byte, no length
			opts = opts[1:]
			continue
		}
		if len(opts) < 2 || len(opts) < 2+int(opts[1]) {
			return false
		}
		opts = opts[2+int(opts[1]):]
	}
	return true
}

// frameLen returns the length of the frame p holds: its bytes and its
// chain's payload (bufpool.Packet.Walk), what a TrainConn or splitUDP
// could read.
func frameLen(p *bufpool.Packet) int { return p.TotalLen() - chainHeaders(p) }

// udpPayloadLen returns the payload length of the UDP packet p, a UDP
// packet or train whose IP and UDP headers are at l3 and l4 (udpHeaders),
// by its headers, never by the frame's length: the IP length ends the
// packet, as ip_rcv_core trims an skb to tot_len (pskb_trim_rcsum) and
// ipv6_rcv to payload_len, the bytes after it being Ethernet padding or
// whatever a sender appended; and the UDP length ends the datagram within
// it, as __udp4_lib_rcv and __udp6_lib_rcv trim to it. ok is false when
// the UDP length is under 8 or past the IP payload: udp_rcv's
// short_packet, a drop (UdpInErrors). A GRO train's and a USO
// super-frame's lengths are the whole train's (udp_gro_complete and
// udp_send_skb write them so), which is what udp_rcv checks of a GSO skb
// too; a UDP length of only the first datagram would trim the train to it.
func udpPayloadLen(p *bufpool.Packet, l3, l4 int) (n int, ok bool) {
	l := p.Linear
	ip := l[l3:]
	var ipLen int
	if isIPv4(ip) {
		ipLen = int(header.IPv4(ip).TotalLength())
	} else {
		ipLen = header.IPv6MinimumSize + int(header.IPv6(ip).PayloadLength())
	}
	ipPayload := ipLen - (l4 - l3) // the UDP header and its payload
	ulen := int(header.UDP(l[l4:]).Length())
	if ulen < header.UDPMinimumSize || ulen > ipPayload {
		return 0, false
	}
	return ulen - header.UDPMinimumSize, true
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
