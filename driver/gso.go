package driver

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

const (
	// maxGSOSegments bounds the segments one super-frame may be cut into;
	// more is DropBadGSO. A 64 KB super-frame at an MSS of 64 bytes stays
	// within it; a tiny GSO size meant to multiply work does not.
	maxGSOSegments = 1024

	// maxGSOHeaderLen bounds the Ethernet+IP+L4 header of a super-frame:
	// room for a VLAN tag, IPv4 with 40 bytes of options or IPv6 with up
	// to 138 bytes of extension headers, and TCP with 40 bytes of options.
	// A longer header is DropBadGSO.
	maxGSOHeaderLen = 256
)

// UDPMaxSegments is UDP_MAX_SEGMENTS: the most datagrams one UDP GSO
// super-frame (VIRTIO_NET_HDR_GSO_UDP_L4) may hold. virtio_net_hdr_to_skb
// refuses a header whose payload passes gso_size times it (-EINVAL), so
// that __udp_gso_segment never cuts a received super-frame into more, and
// udp_send_skb refuses a UDP_SEGMENT send of more. 128 since Linux 6.11
// ("net: change maximum number of UDP segments to 128"), 64 before.
const UDPMaxSegments = 128

// udpGSOTooMany reports whether a UDP super-frame parsed into fi holds
// more datagrams of gsoSize bytes than UDPMaxSegments, as
// virtio_net_hdr_to_skb checks a VIRTIO_NET_HDR_GSO_UDP_L4 header: the
// payload past gso_size * UDP_MAX_SEGMENTS. That is also the least
// gso_size a payload may come in: a tiny one meant to multiply the work a
// frame costs is refused. The payload is counted by the IP length:
// Ethernet padding after it makes no datagram.
func udpGSOTooMany(gsoSize uint16, fi *FrameInfo) bool {
	payload := fi.IPLen - fi.L3Len - fi.L4Len
	return payload > int(gsoSize)*UDPMaxSegments
}

// TCP flag bits in byte 13 of the TCP header.
const (
	tcpFlagFIN = 0x01
	tcpFlagPSH = 0x08
	tcpFlagCWR = 0x80
)

// SegmentSink receives the frames a Segmenter cuts a super-frame into.
type SegmentSink interface {
	// WriteSegment is called once per segment, in order. hdr holds the
	// rebuilt Ethernet+IP+L4 headers of the segment and is valid only
	// during the call (it lives in the Segmenter's scratch); payload is a
	// sub-slice of the super-frame passed to Segmenter.Segment. The
	// segment's frame is hdr followed by payload.
	WriteSegment(hdr, payload []byte)
}

// Segmenter cuts GSO super-frames (as a TAP with IFF_VNET_HDR and TSO/USO
// offloads delivers them) into the frames the wire would have carried, as
// the sender's NIC would with TSO/USO. Not safe for concurrent use; reuse one
// per reader. The zero value is ready to use.
type Segmenter struct {
	// FillChecksum: when true, compute each segment's full TCP/UDP
	// checksum; when false write the pseudo-header partial sum (the form
	// the kernel leaves in a CHECKSUM_PARTIAL packet, which a receiver
	// that trusts the virtio-net NEEDS_CSUM flag never checks).
	FillChecksum bool

	// hdr is the scratch in which each segment's headers are rebuilt.
	hdr [maxGSOHeaderLen]byte
}

// Segment splits frame (the Ethernet frame after the virtio-net header h,
// parsed into fi by ParseFrame with DropNone) into segments of at most
// h.GSOSize payload bytes each and calls sink.WriteSegment for each. It returns
// the number of segments, or 0 and a Drop reason; sink is not called when
// Segment drops the frame.
//
//   - h.GSOType&^VirtioNetHdrGSOECN must be TCPv4 (IPv4 and TCP), TCPv6
//     (IPv6 and TCP) or UDPL4 (IPv4 or IPv6, and UDP), and the frame not an
//     IP fragment; otherwise DropBadGSO (UFO included).
//   - h.Flags must have NEEDS_CSUM and no bits but NEEDS_CSUM and
//     DATA_VALID, and CsumStart+CsumOffset must leave room for the checksum
//     in frame; otherwise DropBadVnetHdr. CsumStart and HdrLen are not
//     otherwise trusted: offsets come from fi.
//   - h.GSOSize 0 or larger than len(frame), more than 1024 segments or
//     headers longer than 256 bytes: DropBadGSO. A payload of at most
//     GSOSize bytes, empty included, makes exactly one segment.
//   - TCP: segment i gets sequence number seq+i*GSOSize; FIN and PSH only on
//     the last segment, CWR only on the first; ack, window, other flags and
//     options are kept.
//   - UDP: each segment gets its own UDP header with length 8+payload.
//   - IPv4: total length set per segment, ID = ID+i, header checksum
//     recomputed. IPv6: payload length set per segment, extension headers
//     kept.
//   - L4 checksum: full or pseudo-header partial per s.FillChecksum; a full
//     UDP checksum that computes to 0 is written as 0xffff.
//   - The L2 header, VLAN tag included, is copied unchanged; Ethernet
//     padding beyond fi.IPLen is not payload.
//
// Segment never allocates, and never panics whatever frame and h hold; an
// fi that does not describe frame is DropBadGSO.
func (s *Segmenter) Segment(h *VirtioNetHdr, frame []byte, fi *FrameInfo, sink SegmentSink) (int, Drop) {
	var minL3 int
	switch h.GSOType &^ VirtioNetHdrGSOECN {
	case VirtioNetHdrGSOTCPv4:
		if fi.L3 != L3IPv4 || fi.L4 != L4TCP {
			return 0, DropBadGSO
		}
		minL3 = ipv4MinHdrLen
	case VirtioNetHdrGSOTCPv6:
		if fi.L3 != L3IPv6 || fi.L4 != L4TCP {
			return 0, DropBadGSO
		}
		minL3 = ipv6HdrLen
	case VirtioNetHdrGSOUDPL4:
		switch {
		case fi.L4 != L4UDP:
			return 0, DropBadGSO
		case fi.L3 == L3IPv4:
			minL3 = ipv4MinHdrLen
		case fi.L3 == L3IPv6:
			minL3 = ipv6HdrLen
		default:
			return 0, DropBadGSO
		}
	default:
		return 0, DropBadGSO
	}
	if fi.Fragment {
		return 0, DropBadGSO
	}
	if h.Flags&VirtioNetHdrFNeedsCsum == 0 ||
		h.Flags&^(VirtioNetHdrFNeedsCsum|VirtioNetHdrFDataValid) != 0 ||
		int(h.CsumStart)+int(h.CsumOffset)+2 > len(frame) {
		return 0, DropBadVnetHdr
	}

	// Do not trust fi beyond what ParseFrame guarantees: every offset used
	// below must lie inside frame and the scratch.
	minL4 := udpHdrLen
	if fi.L4 == L4TCP {
		minL4 = tcpMinHdrLen
	}
	l2, l3Len, l4Len := fi.L2Len, fi.L3Len, fi.L4Len
	if l2 < 0 || l2 > maxGSOHeaderLen ||
		l3Len < minL3 || l3Len > maxGSOHeaderLen ||
		l4Len < minL4 || l4Len > maxGSOHeaderLen || l4Len%2 != 0 ||
		fi.IPLen < 0 || fi.IPLen > len(frame) {
		return 0, DropBadGSO
	}
	hl := l2 + l3Len + l4Len
	end := l2 + fi.IPLen
	if hl > end || end > len(frame) || hl > len(s.hdr) {
		return 0, DropBadGSO
	}
	// The IP header at l2 is of fi's version: L2Len 0 is a TUN's frame
	// (ParseL3Frame), not an Ethernet frame read from its start.
	if v := frame[l2] >> 4; (fi.L3 == L3IPv4) != (v == 4) || (fi.L3 == L3IPv6) != (v == 6) {
		return 0, DropBadGSO
	}

	gso := int(h.GSOSize)
	if gso == 0 || gso > len(frame) {
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

	l4 := l2 + l3Len // offset of the L4 header
	isTCP := fi.L4 == L4TCP
	isIPv4 := fi.L3 == L3IPv4
	var (
		ipID  uint16
		seq   uint32
		flags uint8
		proto uint8 = protoUDP
		csOff       = l4 + 6 // offset of the L4 checksum
	)
	if isIPv4 {
		ipID = binary.BigEndian.Uint16(frame[l2+4:])
	}
	if isTCP {
		seq = binary.BigEndian.Uint32(frame[l4+4:])
		flags = frame[l4+13]
		proto = protoTCP
		csOff = l4 + 16
	}
	// The pseudo-header without its length, the same for every segment.
	pseudo := pseudoHeaderChecksum(frame[l2:], fi.L3, proto, 0)

	hdr := s.hdr[:hl]
	for i := 0; i < n; i++ {
		off := i * gso // <= len(payload) as n is the ceiling of len(payload)/gso
		seg := payload[off:min(off+gso, len(payload))]
		l4Total := l4Len + len(seg)

		// Start from the super-frame's headers each time: the sink may
		// have written to the previous segment's.
		copy(hdr, frame[:hl])

		ip := hdr[l2:l4]
		if isIPv4 {
			binary.BigEndian.PutUint16(ip[2:], uint16(l3Len+l4Total))
			binary.BigEndian.PutUint16(ip[4:], ipID+uint16(i))
			ip[10], ip[11] = 0, 0
			checksum.Put(ip[10:], ^checksum.Checksum(ip, 0))
		} else {
			binary.BigEndian.PutUint16(ip[4:], uint16(l3Len-ipv6HdrLen+l4Total))
		}

		if isTCP {
			binary.BigEndian.PutUint32(hdr[l4+4:], seq+uint32(i)*uint32(gso))
			f := flags
			if i > 0 {
				f &^= tcpFlagCWR
			}
			if i < n-1 {
				f &^= tcpFlagFIN | tcpFlagPSH
			}
			hdr[l4+13] = f
		} else {
			binary.BigEndian.PutUint16(hdr[l4+4:], uint16(l4Total))
		}

		sum := checksum.Combine(pseudo, uint16(l4Total))
		if s.FillChecksum {
			hdr[csOff], hdr[csOff+1] = 0, 0
			sum = ^checksum.Checksum(seg, checksum.Checksum(hdr[l4:], sum))
			if sum == 0 && !isTCP {
				sum = 0xffff // RFC 768: 0 would mean no checksum
			}
		}
		checksum.Put(hdr[csOff:], sum)

		sink.WriteSegment(hdr, seg)
	}
	return n, DropNone
}
