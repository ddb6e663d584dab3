package cpumap

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Ethernet and IP constants the built-in programs parse with.
const (
	vlanHdrLen  = 4
	maxVLANTags = 2 // 802.1ad outer tag, 802.1Q inner tag

	etherTypeIPv4  = 0x0800
	etherTypeIPv6  = 0x86dd
	etherTypeVLAN  = 0x8100
	etherTypeQinQ  = 0x88a8
	ipv4MinHdrLen  = 20
	ipv6HdrLen     = 40
	ipv6FragHdrLen = 8

	protoTCP      = 6
	protoUDP      = 17
	protoHopByHop = 0
	protoRouting  = 43
	protoFragment = 44
	protoESP      = 50
	protoAH       = 51
	protoDestOpts = 60

	// maxExtHdrs bounds the IPv6 extension headers walked before giving
	// up on finding the transport header (the kernel's flow dissector
	// stops at MAX_FLOW_DISSECT_HDRS, 15; real packets carry few).
	maxExtHdrs = 8
)

// flow is what the built-in programs read from a frame's headers. It is
// filled by parseFlow from the linear part alone.
type flow struct {
	l3    int   // offset of the IP header
	l4    int   // offset of the transport header; -1 when not known
	proto uint8 // transport protocol; meaningful when l4 >= 0
	v6    bool
	frag  bool // a fragment: IPv4 MF or offset, IPv6 fragment header with M or offset
	later bool // a fragment other than the first: it has no transport header
}

// ports reports whether the frame's TCP or UDP ports lie within b.
func (f *flow) ports(b []byte) bool {
	return f.l4 >= 0 && !f.later && (f.proto == protoTCP || f.proto == protoUDP) && f.l4+4 <= len(b)
}

// parseFlow parses the Ethernet header (with up to two VLAN tags) and the
// IPv4 or IPv6 header at the start of b into f. It returns false when b is
// not an IP frame, or is too short to hold the IP header's addresses. It
// never reads outside b.
//
//	Ethernet  dst(6) src(6) [0x8100|0x88a8 tci(2)]... type(2)
//	IPv4      ver/ihl tos len(2) id(2) flags/off(2) ttl proto csum(2) src(4) dst(4) [opts]
//	IPv6      ver/tc/label(4) len(2) next hop src(16) dst(16) [ext hdrs]
func parseFlow(b []byte, f *flow) bool {
	if len(b) < header.EthernetMinimumSize {
		return false
	}
	et := binary.BigEndian.Uint16(b[12:])
	off := header.EthernetMinimumSize
	for i := 0; i < maxVLANTags && (et == etherTypeVLAN || et == etherTypeQinQ); i++ {
		if len(b) < off+vlanHdrLen {
			return false
		}
		et = binary.BigEndian.Uint16(b[off+2:])
		off += vlanHdrLen
	}
	*f = flow{l3: off, l4: -1}
	switch et {
	case etherTypeIPv4:
		if len(b) < off+ipv4MinHdrLen || b[off]>>4 != 4 {
			return false
		}
		ihl := int(b[off]&0xf) * 4
		if ihl < ipv4MinHdrLen {
			return false
		}
		// RFC 791 section 3.1: flags (reserved, DF, MF) and the 13-bit
		// fragment offset.
		fo := binary.BigEndian.Uint16(b[off+6:])
		f.frag = fo&0x3fff != 0
		f.later = fo&0x1fff != 0
		f.proto = b[off+9]
		f.l4 = off + ihl
		return true
	case etherTypeIPv6:
		if len(b) < off+ipv6HdrLen || b[off]>>4 != 6 {
			return false
		}
		f.v6 = true
		parseIPv6Ext(b, off+ipv6HdrLen, b[off+6], f)
		return true
	}
	return false
}

// parseIPv6Ext walks the IPv6 extension headers from off, where the header
// of type nh starts, and sets f's transport header (RFC 8200 section 4).
// It leaves f.l4 at -1 when the chain runs past b or is too long.
func parseIPv6Ext(b []byte, off int, nh uint8, f *flow) {
	for range maxExtHdrs {
		switch nh {
		case protoHopByHop, protoRouting, protoDestOpts:
			// Next Header, Hdr Ext Len in 8-octet units, not
			// including the first 8.
			if len(b) < off+2 {
				return
			}
			nh, off = b[off], off+(int(b[off+1])+1)*8
		case protoAH:
			// RFC 4302 section 2.2: Payload Len in 4-octet units,
			// minus 2.
			if len(b) < off+2 {
				return
			}
			nh, off = b[off], off+(int(b[off+1])+2)*4
		case protoFragment:
			//	next(1) res(1) offset(13 bits) res(2) M(1) id(4)
			if len(b) < off+ipv6FragHdrLen {
				return
			}
			fo := binary.BigEndian.Uint16(b[off+2:])
			if fo&0xfff9 != 0 { // offset or M; an atomic fragment is whole
				f.frag = true
				f.later = fo&0xfff8 != 0
			}
			nh, off = b[off], off+ipv6FragHdrLen
		default:
			f.proto, f.l4 = nh, off
			return
		}
	}
}
