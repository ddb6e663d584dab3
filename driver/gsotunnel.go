package driver

import (
	"encoding/binary"
	"math/bits"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

// SegmentTunnel splits frame, a TCP or UDP GSO super-frame inside a UDP tunnel
// (the Ethernet frame after the virtio-net header h, as a TAP with
// TUN_F_UDP_TUNNEL_GSO delivers what a vxlan or geneve device sends
// through it), into segments of at most h.GSOSize inner payload bytes each,
// as __skb_udp_tunnel_segment and then tcp_gso_segment cut it
// (net/ipv4/udp_offload.c, net/ipv4/tcp_offload.c), and calls
// sink.WriteSegment for each. It returns the number of segments, or 0 and
// DropBadVnetHdr or DropBadGSO; sink is not called when SegmentTunnel drops
// the frame.
//
//	+----------+------------+-----+-------------------------+-----------------+-----+---------+
//	| Ethernet | outer IPv4 | UDP | tunnel header (VXLAN 8, | inner IPv4/IPv6 | TCP | payload |
//	|          | or IPv6    |     | inner Ethernet 14)      |                 |     |         |
//	+----------+------------+-----+-------------------------+-----------------+-----+---------+
//	           ^ outer L3   ^ OuterTHOffset                 ^ InnerNHOffset   ^ CsumStart
//
// The rules:
//
//   - h must pass h.check (virtio_net_hdr_tnl_to_skb's rules) and have a
//     tunnel bit; the inner GSO type must be TCPv4, TCPv6 or UDP_L4 (a
//     UDP_SEGMENT datagram sent through the tunnel: the inner IP version
//     says IPv4 or IPv6, and more than UDP_MAX_SEGMENTS datagrams is
//     DropBadGSO, as virtio_net_hdr_to_skb refuses them). An inner UDP
//     datagram is cut as __udp_gso_segment cuts it: each with its own UDP
//     length and checksum (0 written as 0xffff when full), the inner IPv4
//     ID incremented per datagram.
//   - The offsets must match the bytes, else DropBadGSO: frame parses
//     with ParseFrame as an IPv4 (tunnel bit IPv4) or IPv6 (IPv6) packet,
//     not a fragment, carrying UDP whose header is at OuterTHOffset (any
//     port: the tunnel type is not checked); at InnerNHOffset an inner
//     IPv4 (TCPv4) or IPv6 (TCPv6) packet, not a fragment, ends where the
//     outer packet ends and carries TCP (UDP for UDP_L4) whose header is at CsumStart. The
//     bytes between the outer UDP header and InnerNHOffset are the tunnel
//     header, copied unchanged into every segment, as
//     virtio_net_hdr_tnl_to_skb puts the inner MAC header at inner_nh, so
//     that __skb_udp_tunnel_segment copies them with the outer headers
//     (tnl_hlen). HdrLen is not used.
//   - GSOSize larger than len(frame), more than 1024 segments or all
//     headers together longer than 256 bytes: DropBadGSO.
//   - Every segment: outer Ethernet copied; outer IPv4 with its total
//     length, ID+i and its header checksum recomputed, or outer IPv6 with
//     its payload length (inet_gso_segment, ipv6_gso_segment); outer UDP
//     with its length (__skb_udp_tunnel_segment's uh->len); tunnel header
//     copied; inner IP and TCP as Segment cuts a plain super-frame (IPv4
//     total length, ID+i, header checksum; IPv6 payload length; sequence
//     number seq+i*GSOSize; FIN and PSH on the last segment only, CWR on
//     the first only; the TCP checksum full or partial per s.FillChecksum).
//   - Outer UDP checksum: with VirtioNetHdrFUDPTunnelCsum, full when
//     s.FillChecksum (over the segment's UDP message, the inner TCP
//     checksum filled in; 0 is written as 0xffff, CSUM_MANGLED_0) and
//     else the pseudo-header partial sum with the segment's UDP length,
//     as the inner TCP's. __skb_udp_tunnel_segment derives that sum from
//     the super-frame's field (the partial sum minus the super-frame's
//     length plus the segment's); SegmentTunnel computes it from the
//     outer addresses as Segment computes the inner one, the same value
//     for any super-frame a kernel sent. Without the flag the checksum is
//     0: "no checksum" over IPv4 (vxlan's default, udp_set_csum with
//     nocheck); over IPv6 a zero UDP checksum (what the sender chose with
//     udp6zerocsumtx, udp6_set_csum with nocheck: RFC 6935 allows it for
//     tunnels, but VerifyChecksums and a receiver without
//     udp6zerocsumrx refuse it). The kernel leaves the super-frame's field
//     unchanged there (__skb_udp_tunnel_segment: "if (!need_csum)
//     continue"), which such a sender left 0.
//   - The segment's frame is the rebuilt headers and its payload only:
//     Ethernet padding beyond the outer IP packet is not payload.
//
// SegmentTunnel never allocates, never panics whatever frame and h hold,
// and does not write to frame.
func (s *Segmenter) SegmentTunnel(h *VirtioNetHdrTunnel, frame []byte, sink SegmentSink) (int, Drop) {
	if d := h.check(frame); d != DropNone {
		return 0, d
	}
	if !h.Tunnel() {
		return 0, DropBadGSO
	}
	var innerV6, innerUDP bool
	switch h.Inner() &^ VirtioNetHdrGSOECN {
	case VirtioNetHdrGSOTCPv4:
	case VirtioNetHdrGSOTCPv6:
		innerV6 = true
	case VirtioNetHdrGSOUDPL4:
		innerUDP = true // the version at inner_nh says which IP (check)
	default:
		return 0, DropBadGSO
	}

	// The outer headers: Ethernet, IP, UDP at outer_th_offset.
	var ofi FrameInfo
	if ParseFrame(frame, &ofi) != DropNone || ofi.Fragment || ofi.L4 != L4UDP ||
		(ofi.L3 == L3IPv6) != h.TunnelIPv6() {
		return 0, DropBadGSO
	}
	l2 := ofi.L2Len                              // offset of the outer IP header
	oth := l2 + ofi.L3Len                        // offset of the outer UDP header
	end := l2 + ofi.IPLen                        // end of the outer IP packet
	nh := int(h.InnerNHOffset)                   // offset of the inner IP header
	if oth != int(h.OuterTHOffset) || nh > end { // nh >= oth+8 by check
		return 0, DropBadGSO
	}

	// The inner IP packet at inner_nh, bounded by the outer one: the
	// parsers take its offset from L2Len and check its version.
	ifi := FrameInfo{L2Len: nh}
	var d Drop
	if innerUDP {
		innerV6 = nh < end && frame[nh]>>4 == 6
	}
	if innerV6 {
		d = parseIPv6(frame[:end], &ifi)
	} else {
		d = parseIPv4(frame[:end], &ifi)
	}
	innerL4, innerProto, csumOff := L4TCP, uint8(protoTCP), 16
	if innerUDP {
		innerL4, innerProto, csumOff = L4UDP, protoUDP, 6
	}
	if d != DropNone || ifi.Fragment || ifi.L4 != innerL4 || ifi.IPLen != end-nh {
		return 0, DropBadGSO
	}
	if innerUDP && udpGSOTooMany(h.GSOSize, &ifi) {
		return 0, DropBadGSO // virtio_net_hdr_to_skb: more than UDP_MAX_SEGMENTS
	}
	ith := nh + ifi.L3Len // offset of the inner TCP or UDP header
	hl := ith + ifi.L4Len // all headers; <= end by the parse
	if ith != int(h.CsumStart) || hl > len(s.hdr) {
		return 0, DropBadGSO
	}

	gso := int(h.GSOSize)
	if gso > len(frame) { // gso > 0 by check
		return 0, DropBadGSO
	}
	payload := frame[hl:end]
	n := (len(payload) + gso - 1) / gso
	if n == 0 {
		n = 1
	}
	if n > maxGSOSegments {
		return 0, DropBadGSO
	}

	outerV4 := ofi.L3 == L3IPv4
	var outerID, innerID uint16
	if outerV4 {
		outerID = binary.BigEndian.Uint16(frame[l2+4:])
	}
	if !innerV6 {
		innerID = binary.BigEndian.Uint16(frame[nh+4:])
	}
	var seq uint32
	var flags uint8
	if !innerUDP {
		seq = binary.BigEndian.Uint32(frame[ith+4:])
		flags = frame[ith+13]
	}
	innerL3 := L3IPv4
	if innerV6 {
		innerL3 = L3IPv6
	}
	// The pseudo-headers without their lengths, the same for every
	// segment.
	innerPseudo := pseudoHeaderChecksum(frame[nh:], innerL3, innerProto, 0)
	outerPseudo := pseudoHeaderChecksum(frame[l2:], ofi.L3, protoUDP, 0)
	outerCsum := h.Flags&VirtioNetHdrFUDPTunnelCsum != 0
	// The payload starts an odd number of bytes into the outer UDP
	// message when the tunnel header has an odd length: its sum then
	// counts byte-swapped there (RFC 1071 section 2 (B)).
	swap := (hl-oth)%2 != 0

	hdr := s.hdr[:hl]
	for i := 0; i < n; i++ {
		off := i * gso // <= len(payload) as n is the ceiling of len(payload)/gso
		seg := payload[off:min(off+gso, len(payload))]
		segLen := hl + len(seg) // the segment's frame length

		// Start from the super-frame's headers each time: the sink may
		// have written to the previous segment's.
		copy(hdr, frame[:hl])

		gsoSetIP(hdr[l2:oth], outerV4, segLen-l2, outerID+uint16(i))
		binary.BigEndian.PutUint16(hdr[oth+4:], uint16(segLen-oth))
		gsoSetIP(hdr[nh:ith], !innerV6, segLen-nh, innerID+uint16(i))
		if innerUDP {
			// __udp_gso_segment: each datagram's own UDP length.
			binary.BigEndian.PutUint16(hdr[ith+4:], uint16(segLen-ith))
		} else {
			gsoSetTCP(hdr[ith:hl], seq+uint32(i)*uint32(gso), flags, i, n)
		}

		var psum uint16 // the payload's sum, for full checksums
		if s.FillChecksum {
			psum = checksum.Checksum(seg, 0)
		}
		// Inner TCP or UDP checksum, as Segment computes it.
		sum := checksum.Combine(innerPseudo, uint16(segLen-ith))
		if s.FillChecksum {
			hdr[ith+csumOff], hdr[ith+csumOff+1] = 0, 0
			sum = ^checksum.Combine(checksum.Checksum(hdr[ith:], sum), psum)
			if innerUDP && sum == 0 {
				sum = 0xffff // CSUM_MANGLED_0
			}
		}
		checksum.Put(hdr[ith+csumOff:], sum)

		// Outer UDP checksum, over the inner packet as just completed.
		var osum uint16
		if outerCsum {
			osum = checksum.Combine(outerPseudo, uint16(segLen-oth))
			if s.FillChecksum {
				hdr[oth+6], hdr[oth+7] = 0, 0
				p := psum
				if swap {
					p = bits.ReverseBytes16(p)
				}
				osum = ^checksum.Combine(checksum.Checksum(hdr[oth:], osum), p)
				if osum == 0 {
					osum = 0xffff // CSUM_MANGLED_0: 0 would mean no checksum
				}
			}
		}
		checksum.Put(hdr[oth+6:], osum)

		sink.WriteSegment(hdr, seg)
	}
	return n, DropNone
}

// gsoSetIP writes the length of an IP packet of ipLen bytes into its header
// ip (the whole IPv4 header with options, or the IPv6 header with its
// extension headers), and for IPv4 the ID id and the recomputed header
// checksum, as inet_gso_segment and ipv6_gso_segment do for each segment.
func gsoSetIP(ip []byte, v4 bool, ipLen int, id uint16) {
	if !v4 {
		binary.BigEndian.PutUint16(ip[4:], uint16(ipLen-ipv6HdrLen))
		return
	}
	binary.BigEndian.PutUint16(ip[2:], uint16(ipLen))
	binary.BigEndian.PutUint16(ip[4:], id)
	ip[10], ip[11] = 0, 0
	checksum.Put(ip[10:], ^checksum.Checksum(ip, 0))
}

// gsoSetTCP writes segment i of n's sequence number seq and flags into its
// TCP header tcp, as tcp_gso_segment does: the super-frame's flags, FIN and
// PSH only on the last segment, CWR only on the first.
func gsoSetTCP(tcp []byte, seq uint32, flags uint8, i, n int) {
	binary.BigEndian.PutUint32(tcp[4:], seq)
	if i > 0 {
		flags &^= tcpFlagCWR
	}
	if i < n-1 {
		flags &^= tcpFlagFIN | tcpFlagPSH
	}
	tcp[13] = flags
}
