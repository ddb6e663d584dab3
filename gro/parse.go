package gro

import (
	"encoding/binary"
	"math/bits"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/hdr"
)

// Header sizes (gVisor's) and field values the parser needs.
const (
	ipv4HdrLen   = header.IPv4MinimumSize // IHL 5: GRO merges no packet with IP options
	ipv6HdrLen   = header.IPv6MinimumSize
	tcpMinHdrLen = header.TCPMinimumSize
	udpHdrLen    = header.UDPMinimumSize

	// ipv4FlagReserved is the reserved ("evil") bit of the IPv4 flags
	// (RFC 791 section 3.1), beside gVisor's header.IPv4FlagDontFragment.
	ipv4FlagReserved = 1 << 2

	protoHopByHop = 0
	protoTCP      = 6
	protoUDP      = 17
	protoRouting  = 43
	protoFragment = 44
	protoDestOpts = 60

	// maxIPv6ExtHdrs bounds the extension header chain walked to find the
	// flow of a packet GRO hands up (the driver's bound too).
	maxIPv6ExtHdrs = hdr.MaxIPv6ExtHdrs
)

// TCP flags (RFC 9293 section 3.1), in byte 13 of the TCP header.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpURG = 0x20
	tcpCWR = 0x80
)

// Masks over the TCP header's 32-bit word at offset 12, the kernel's
// tcp_flag_word:
//
//	 0               1               2               3
//	+-------+-------+---------------+-------------------------------+
//	| doff  |  res  |     flags     |            window             |
//	+-------+-------+---------------+-------------------------------+
const (
	flagWordFlags = 0x0fff0000 // reserved bits (AE) and the eight flags
	// flagWordMergeable are the bits that may differ between merged
	// segments: tcp_gro_receive's "(flags ^ tcp_flag_word(th2)) &
	// ~(TCP_FLAG_FIN | TCP_FLAG_PSH)". CWR is not among them: a CWR in
	// the new segment flushes ("flags & TCP_FLAG_CWR"), and so does a
	// segment without it after a held one with it.
	flagWordMergeable = uint32(tcpFIN|tcpPSH) << 16
)

// verdict is what parse decides about a packet.
type verdict uint8

const (
	// passOther: a packet the kernel's GRO hands up at once, ahead of
	// whatever is held, without looking for its flow: not IP, not TCP or
	// UDP, IPv4 options or a fragment (inet_gro_receive: "*(u8 *)iph !=
	// 0x45", ip_is_fragment), a bad IPv4 header checksum (ip_fast_csum),
	// an IPv6 fragment or an extension header GRO does not walk
	// (ipv6_gro_pull_exthdrs), a bad TCP or UDP checksum
	// (skb_gro_checksum_validate in tcp4_gro_receive, tcp6_gro_receive,
	// udp4_gro_receive, udp6_gro_receive), a TCP header that cannot be
	// pulled (tcp_gro_pull_header), a UDP datagram without a checksum or
	// whose length is not the packet's (udp_gro_receive_segment).
	passOther verdict = iota
	// passFlow: a packet the kernel's GRO looks up but will not merge or
	// hold (NAPI_GRO_CB(skb)->flush set before tcp_gro_receive): the held
	// packet of its flow is flushed first (tcp_gro_receive returns it as
	// pp, skb_gro_receive having refused with -E2BIG). The IP length is
	// not the frame's (padding, inet_gro_receive's "iph->tot_len ^
	// skb_gro_len"), the reserved IPv4 flag is set ("frag_off & ~IP_DF"),
	// a frag_list packet (dev_gro_receive: skb_has_frag_list), a UDP GSO
	// packet (dev_gro_receive: !skb_is_gso_tcp); and, ustack's own, a
	// header copy shorter than the headers or a HdrLen the NIC parsed
	// otherwise.
	passFlow
	// candidate: mergeable in principle; segInfo is complete.
	candidate
)

// segInfo is what parse learns from a packet's headers. It holds no
// reference to the packet.
type segInfo struct {
	l2    int // offset of the IP header: the Ethernet header's length, or 0 (Config.L3)
	key   flowKey
	proto uint8 // protoTCP, protoUDP
	v6    bool
	// csum is what GRO's software check of a CHECKSUM_NONE packet found:
	// csumNone if it did not check.
	csum    csumResult
	l4      int    // offset of the L4 header in the frame
	hlen    int    // offset of the L4 payload: Ethernet, IP and L4 headers
	payload int    // L4 payload bytes
	seq     uint32 // TCP sequence number
	flags   uint8  // TCP flags
	id      uint16 // IPv4 identification
	// gsoSize and segs describe a GSO (LRO) packet: the payload of each
	// of its segs segments; gsoSize is 0 for a single frame.
	gsoSize int
	segs    int

	// vx is the engine's VXLAN state, nil without Config.VXLANPorts.
	vx *vxState
	// t is the outer layer of a UDP datagram to one of vx's ports, which
	// the kernel hands to the vxlan socket's gro_receive
	// (udp_gro_receive); nil for any other packet. It points at vx's
	// scratch, so that a plain packet's segInfo carries no tunnel state
	// to clear or copy. Once parseVXLAN has gone past the VXLAN header,
	// key, v6, proto, id, l4, hlen and payload are the inner packet's.
	t *tunSeg
}

// csumResult is the outcome of GRO's software checksum check.
type csumResult uint8

const (
	csumNone csumResult = iota
	csumGood
	csumBad
)

func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }
func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }
func be64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// parse reads p's headers from its linear part into s and decides what GRO
// may do with p, in the order of the kernel's checks (dev_gro_receive,
// inet_gro_receive or ipv6_gro_receive, then tcp4_gro_receive,
// tcp6_gro_receive, udp4_gro_receive or udp6_gro_receive). It borrows p,
// never panics and never allocates; it reads p.Linear, p's metadata and,
// for a packet whose checksum is not verified, the payload in its frags,
// which it checksums (skb_gro_checksum_validate): a good checksum sets
// p.CsumVerified, as the kernel's CHECKSUM_UNNECESSARY after GRO verified it.
func parse(p *bufpool.Packet, s *segInfo) verdict {
	b := p.Linear
	if s.l2 == 0 {
		// A TUN's packet (Config.L3): the IP version says which.
		if len(b) == 0 {
			return passOther
		}
		switch b[0] >> 4 {
		case header.IPv4Version:
			return parse4(p, b, s, 0, false)
		case header.IPv6Version:
			return parse6(p, b, s, 0, false)
		}
		return passOther
	}
	if p.HeadersSet {
		// The driver parsed the frame (skb->network_header): GRO starts
		// at the IP header, as dev_gro_receive starts at
		// skb_gro_offset without parsing the Ethernet header again. The
		// IP version says which, and parse4 or parse6 checks it.
		if int(p.NetworkHeader) != s.l2 || len(b) <= s.l2 {
			// A link header of another length (a VLAN tag) is not
			// Ethernet's: not for GRO, as below.
			return passOther
		}
		switch b[s.l2] >> 4 {
		case header.IPv4Version:
			return parse4(p, b, s, s.l2, false)
		case header.IPv6Version:
			return parse6(p, b, s, s.l2, false)
		}
		return passOther
	}
	// No VLAN tag: the driver drops VLAN-tagged frames.
	if len(b) < header.EthernetMinimumSize {
		return passOther
	}
	switch header.Ethernet(b).Type() {
	case header.IPv4ProtocolNumber:
		return parse4(p, b, s, s.l2, false)
	case header.IPv6ProtocolNumber:
		return parse6(p, b, s, s.l2, false)
	}
	return passOther
}

// macKey returns the Ethernet addresses of the frame b before the IP
// header at ip, for a flow key's f and g (the upper half), or zeros for a
// TUN's packet (ip 0), which has none. For the inner packet of a VXLAN
// packet they are the inner Ethernet header's (eth_gro_receive:
// compare_ether_header), which ends where the inner IP header starts, as
// an Ethernet frame's own ends at its IP header.
func macKey(b []byte, ip int) (f, g uint64) {
	if ip == 0 {
		return 0, 0
	}
	m := b[ip-header.EthernetMinimumSize:]
	return be64(m), uint64(be32(m[8:])) << 32
}

// parse4 parses an IPv4 packet (RFC 791 section 3.1) at offset at of b as
// inet_gro_receive does: the packet's own, or a VXLAN packet's inner one
// (s.t set; parseVXLAN marks its key). flush is NAPI_GRO_CB(skb)->flush as
// the outer layers left it.
func parse4(p *bufpool.Packet, b []byte, s *segInfo, at int, flush bool) verdict {
	if len(b) < at+ipv4HdrLen {
		return passOther
	}
	// The fixed header only: the one GRO merges (one with options is
	// handed up), and a view of known length needs no further bounds check.
	ip := header.IPv4(b[at : at+ipv4HdrLen])
	proto := ip.Protocol()
	if proto != protoTCP && proto != protoUDP {
		// inet_offloads[proto] has no gro_receive (ustack merges no
		// tunnel but VXLAN, and none of an inner packet: ipip_gro_receive
		// and gre_gro_receive flush one that carries encap_mark).
		return passOther
	}
	if b[at] != 0x45 || hdr.IsIPv4Fragment(ip) || hdr.IPv4HeaderSum(ip) != 0xffff {
		// inet_gro_receive: "*(u8 *)iph != 0x45" (IP options, or not
		// version 4), ip_is_fragment, ip_fast_csum.
		return passOther
	}
	s.v6, s.proto = false, proto
	// The Ethernet header is part of the flow (gro_list_prepare:
	// compare_ether_header): destination and source in f and g.
	f, g := macKey(b, at)
	s.key = flowKey{a: uint64(be32(ip.SourceAddressSlice()))<<32 | uint64(be32(ip.DestinationAddressSlice())),
		f: f, g: g}
	s.key.setProto(4, proto)
	s.l4 = at + ipv4HdrLen
	s.id = ip.ID()
	tot := int(ip.TotalLength())
	// inet_gro_receive's flush: "(ntohl(*(__be32 *)iph) ^
	// skb_gro_len(skb)) | (ntohl(*(__be32 *)&iph->id) & ~IP_DF)": the IP
	// length is not the frame's (padding), or the reserved flag is set
	// (MF and the offset were handed up above).
	n := frameLen(p)
	ipFlush := flush || tot != n-at || ip.Flags()&ipv4FlagReserved != 0
	return parseL4(p, b, s, ip.SourceAddressSlice(), ip.DestinationAddressSlice(), n, ipFlush)
}

// parse6 parses an IPv6 packet (RFC 8200 section 3) at offset at of b as
// ipv6_gro_receive does: the extension headers ipv6_gro_pull_exthdrs walks
// (hop-by-hop, routing, destination options: INET6_PROTO_GSO_EXTHDR) are
// part of the flow, byte for byte; any other (a fragment header) is handed
// up. The packet is the frame's own or a VXLAN packet's inner one
// (s.t set; parseVXLAN marks its key); flush is as for parse4.
func parse6(p *bufpool.Packet, b []byte, s *segInfo, at int, flush bool) verdict {
	if len(b) < at+ipv6HdrLen {
		return passOther
	}
	ip := header.IPv6(b[at : at+ipv6HdrLen]) // the fixed header
	if header.IPVersion(ip) != header.IPv6Version {
		return passOther
	}
	first := ip.NextHeader()
	nh, l4 := ipv6Walk(b, at)
	if nh != protoTCP && nh != protoUDP {
		// A fragment header, a header past the copy, or a protocol GRO
		// has no handler for.
		return passOther
	}
	s.v6, s.proto, s.l4 = true, nh, l4
	src, dst := ip.SourceAddressSlice(), ip.DestinationAddressSlice()
	// ipv6_gro_receive's same flow: "first_word & htonl(0xF00FFFFF)"
	// (version and flow label), the addresses, the first next header and
	// the extension headers' bytes (here by hash).
	f, g := macKey(b, at)
	s.key = flowKey{a: be64(src), b: be64(src[8:]), c: be64(dst), d: be64(dst[8:]), f: f,
		g: g | uint64(be32(ip)&0xfffff)<<8 | uint64(first)}
	if ext := b[at+ipv6HdrLen : l4]; len(ext) > 0 {
		s.key.h = extHash(ext)
	}
	s.key.setProto(6, nh)
	plen := int(ip.PayloadLength())
	// ipv6_gro_receive's flush: "ntohs(iph->payload_len) !=
	// skb_gro_len(skb)".
	n := frameLen(p)
	ipFlush := flush || plen != n-at-ipv6HdrLen
	return parseL4(p, b, s, src, dst, n, ipFlush)
}

// extHash hashes IPv6 extension headers for the flow key (FNV-1a, 64 bits).
func extHash(b []byte) uint64 {
	h := uint64(0xcbf29ce484222325)
	for _, c := range b {
		h = (h ^ uint64(c)) * 0x100000001b3
	}
	return h | 1 // never 0, which stands for none
}

// ipv6Walk returns the protocol after the IPv6 header at off of b and the
// extension headers GRO walks (ipv6_gro_pull_exthdrs), and its offset; 0, 0
// if the header or a walked extension header is not in b, or another
// extension header (a fragment header) comes first.
func ipv6Walk(b []byte, off int) (proto uint8, l4 int) {
	if len(b) < off+ipv6HdrLen || b[off]>>4 != header.IPv6Version {
		return 0, 0
	}
	nh := b[off+6]
	l4 = off + ipv6HdrLen
	for i := 0; nh == protoHopByHop || nh == protoRouting || nh == protoDestOpts; i++ {
		if i == maxIPv6ExtHdrs || len(b) < l4+2 {
			return 0, 0
		}
		ext := hdr.IPv6Ext(b[l4 : l4+2])
		nh = ext.NextHeader()
		l4 += ext.Len()
	}
	if nh == protoFragment || len(b) < l4 {
		return 0, 0
	}
	return nh, l4
}

// parseL4 checks the TCP (RFC 9293 section 3.1) or UDP (RFC 768) header at
// s.l4 and fills the rest of s. n is frameLen(p); ipFlush is the IP
// layer's NAPI_GRO_CB(skb)->flush. src and dst are the IP addresses, for the
// pseudo-header. UDP goes on in parseVXLAN (to a VXLAN port) or parseUDP,
// so that the TCP path holds no call but l4Valid's, and no value of it
// lives across one.
func parseL4(p *bufpool.Packet, b []byte, s *segInfo, src, dst []byte, n int, ipFlush bool) verdict {
	if n != p.Len {
		// A Len that does not add up: nothing to trust.
		return passOther
	}
	if len(b) < s.l4+4 {
		// The ports are out of the header copy's reach.
		return passOther
	}
	s.key.setPorts(be32(b[s.l4:]))
	if s.proto == protoUDP {
		if s.vx != nil && s.t == nil && isVXLANPort(s.vx.ports, be16(b[s.l4+2:])) {
			return parseVXLAN(p, b, s, src, dst, n, ipFlush)
		}
		return parseUDP(p, b, s, src, dst, n, ipFlush)
	}
	if p.Next != nil {
		// dev_gro_receive: "flush = skb_has_frag_list(skb)".
		return passFlow
	}
	s.segs, s.gsoSize = 1, 0
	if len(b) < s.l4+tcpMinHdrLen {
		return passFlow
	}
	groLen := n - s.l4                             // skb_gro_len at the L4 header
	tcp := header.TCP(b[s.l4 : s.l4+tcpMinHdrLen]) // the fixed header: options are not read
	doff := int(tcp.DataOffset())
	if !ipFlush && !p.CsumVerified && !l4Valid(p, s, src, dst, groLen) {
		// tcp4_gro_receive, tcp6_gro_receive: "Don't bother
		// verifying checksum if we're going to flush anyway."
		return passOther
	}
	if doff < tcpMinHdrLen || doff > groLen {
		// tcp_gro_pull_header.
		return passOther
	}
	s.hlen = s.l4 + doff
	s.payload = groLen - doff
	s.seq = tcp.SequenceNumber()
	s.flags = uint8(tcp.Flags())
	if p.GSOSize > 0 && s.payload > int(p.GSOSize) {
		// A GSO (LRO) packet: dev_gro_receive counts its
		// gso_segs, tcp_gro_receive requires its gso_size.
		s.gsoSize = int(p.GSOSize)
		s.segs = (s.payload + s.gsoSize - 1) / s.gsoSize
	}
	return finalL4(p, b, s, ipFlush)
}

// parseUDP is parseL4 for a UDP datagram (s.proto protoUDP, the ports in
// s.key) that does not go to a VXLAN port: UDP GRO's
// (udp_gro_receive_segment).
func parseUDP(p *bufpool.Packet, b []byte, s *segInfo, src, dst []byte, n int, ipFlush bool) verdict {
	if s.t != nil {
		// A VXLAN packet's inner UDP datagram: udp4_gro_receive or
		// udp6_gro_receive, then udp_gro_receive with encap_mark set
		// (another tunnel) or with no socket that asks for UDP GRO
		// ("no GRO, be sure flush the current packet"): up at once,
		// unmerged. (Its checksum is left to the stack; the kernel's
		// udp4_gro_receive would check it first, which changes
		// nothing but rx_gro_csum_bad.)
		return passOther
	}
	if p.Next != nil {
		// dev_gro_receive: "flush = skb_has_frag_list(skb)".
		return passFlow
	}
	s.segs, s.gsoSize = 1, 0
	if len(b) < s.l4+udpHdrLen {
		return passFlow
	}
	groLen := n - s.l4 // skb_gro_len at the L4 header
	udp := header.UDP(b[s.l4 : s.l4+udpHdrLen])
	if !ipFlush && !p.CsumVerified && udp.Checksum() != 0 && !l4Valid(p, s, src, dst, groLen) {
		// udp4_gro_receive, udp6_gro_receive:
		// skb_gro_checksum_validate_zero_check.
		return passOther
	}
	ulen := int(udp.Length())
	if udp.Checksum() == 0 || ulen <= udpHdrLen || ulen != groLen {
		// udp_gro_receive_segment: "requires non zero csum, for
		// symmetry with GSO"; "Do not deal with padded or
		// malicious packets, sorry !"
		return passOther
	}
	if p.GSOSize > 0 && ulen-udpHdrLen > int(p.GSOSize) {
		// dev_gro_receive: GSO other than TCP flushes.
		return passFlow
	}
	s.hlen = s.l4 + udpHdrLen
	s.payload = ulen - udpHdrLen
	return finalL4(p, b, s, ipFlush)
}

// finalL4 is parseL4's last word on a TCP segment or UDP datagram whose
// header checked out.
func finalL4(p *bufpool.Packet, b []byte, s *segInfo, ipFlush bool) verdict {
	if ipFlush {
		return passFlow
	}
	if s.hlen > len(b) || s.hlen != p.HdrLen {
		// The header copy is shorter than the headers, or the NIC parsed
		// them otherwise: the payload offset is not known for sure.
		return passFlow
	}
	return candidate
}

// l4Valid reports whether the TCP or UDP checksum over the l4Len bytes at
// s.l4 (header and payload, in the linear part and the frags) and the
// pseudo-header is right (RFC 9293 section 3.1, RFC 768, RFC 8200 section
// 8.1), and if so sets p.CsumVerified: __skb_gro_checksum_validate for a
// CHECKSUM_NONE packet, which then counts as CHECKSUM_UNNECESSARY. For the
// inner segment of a VXLAN packet whose outer UDP checksum was checked
// (s.t.osumOK) the sum of its bytes is the outer one's less the headers
// between: __skb_gro_checksum_validate_complete with the csum_valid
// NAPI_GRO_CB(skb)->csum that skb_gro_postpull_rcsum kept past each header
// pulled, instead of a second pass over the payload.
func l4Valid(p *bufpool.Packet, s *segInfo, src, dst []byte, l4Len int) bool {
	var sum uint16
	if t := s.t; t != nil && t.osumOK {
		// The headers are in the linear part, and an even number of
		// bytes long (16 for UDP and VXLAN, 14 for Ethernet, 20 or a
		// multiple of 8 for IP), so the bytes keep their parity.
		sum = checksum.Combine(t.osum, ^checksum.Checksum(p.Linear[t.ol4:s.l4], 0))
	} else {
		sum = rawSum(p, s.l4)
	}
	if !pseudoValid(sum, src, dst, s.proto, l4Len) {
		s.csum = csumBad
		return false
	}
	s.csum = csumGood
	p.CsumVerified = true
	return true
}

// pseudoValid reports whether sum, the one's complement sum of a TCP or UDP
// header and payload of l4Len bytes, with the pseudo-header of src, dst
// and proto, makes a good checksum.
func pseudoValid(sum uint16, src, dst []byte, proto uint8, l4Len int) bool {
	sum = checksum.Checksum(src, sum)
	sum = checksum.Checksum(dst, sum)
	sum = checksum.Combine(sum, uint16(proto))
	sum = checksum.Combine(sum, uint16(l4Len))
	return sum == 0xffff
}

// rawSum returns the one's complement sum of p's bytes from offset off of
// its linear part to its end (the linear part's rest, then the frags).
func rawSum(p *bufpool.Packet, off int) uint16 {
	var sum uint16
	odd := false
	add := func(c []byte) {
		v := checksum.Checksum(c, 0)
		if odd {
			v = bits.ReverseBytes16(v)
		}
		sum = checksum.Combine(sum, v)
		odd = odd != (len(c)%2 == 1)
	}
	add(p.Linear[off:])
	for i := range p.Frags {
		add(p.Frags[i].Bytes())
	}
	return sum
}

// frameLen returns the bytes in p's linear part and frags.
func frameLen(p *bufpool.Packet) int {
	n := len(p.Linear)
	for i := range p.Frags {
		n += int(p.Frags[i].Len)
	}
	return n
}
