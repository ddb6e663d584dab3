package cpumap

import (
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/internal/hdr"
)

// Ethernet and IP constants the built-in programs parse with (sizes are
// gVisor's).
const (
	maxVLANTags = 2 // 802.1ad outer tag, 802.1Q inner tag

	etherTypeIPv4  = 0x0800
	etherTypeIPv6  = 0x86dd
	ipv4MinHdrLen  = header.IPv4MinimumSize
	ipv6HdrLen     = header.IPv6MinimumSize
	ipv6FragHdrLen = header.IPv6FragmentHeaderSize

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
	maxExtHdrs = hdr.MaxIPv6ExtHdrs
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
func parseFlow(b []byte, f *flow) bool { return parseFlowLink(b, f, false) }

// parseFlowLink is parseFlow, or with l3 for a frame that starts at its IP
// header (a TUN's: generic XDP on an ARPHRD_NONE device sees the network
// header first), the IP version telling IPv4 from IPv6.
func parseFlowLink(b []byte, f *flow, l3 bool) bool {
	var et uint16
	off := 0
	if l3 {
		if len(b) == 0 {
			return false
		}
		switch header.IPVersion(b) {
		case header.IPv4Version:
			et = etherTypeIPv4
		case header.IPv6Version:
			et = etherTypeIPv6
		}
	} else {
		if len(b) < header.EthernetMinimumSize {
			return false
		}
		et = uint16(header.Ethernet(b).Type())
		off = header.EthernetMinimumSize
		for i := 0; i < maxVLANTags && (et == hdr.EtherTypeVLAN || et == hdr.EtherTypeQinQ); i++ {
			if len(b) < off+hdr.VLANTagLen {
				return false
			}
			et = hdr.VLANTag(b[off:]).EtherType()
			off += hdr.VLANTagLen
		}
	}
	*f = flow{l3: off, l4: -1}
	switch et {
	case etherTypeIPv4:
		if len(b) < off+ipv4MinHdrLen {
			return false
		}
		ip := header.IPv4(b[off : off+ipv4MinHdrLen]) // the fixed header is all that is read
		if header.IPVersion(ip) != header.IPv4Version {
			return false
		}
		ihl := int(ip.HeaderLength())
		if ihl < ipv4MinHdrLen {
			return false
		}
		// RFC 791 section 3.1: MF and the 13-bit fragment offset.
		f.later = ip.FragmentOffset() != 0
		f.frag = hdr.IsIPv4Fragment(ip)
		f.proto = ip.Protocol()
		f.l4 = off + ihl
		return true
	case etherTypeIPv6:
		if len(b) < off+ipv6HdrLen {
			return false
		}
		ip := header.IPv6(b[off : off+ipv6HdrLen]) // the fixed header
		if header.IPVersion(ip) != header.IPv6Version {
			return false
		}
		f.v6 = true
		parseIPv6Ext(b, off+ipv6HdrLen, ip.NextHeader(), f)
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
			ext := hdr.IPv6Ext(b[off : off+2])
			nh, off = ext.NextHeader(), off+ext.Len()
		case protoAH:
			// RFC 4302 section 2.2: Payload Len in 4-octet units,
			// minus 2.
			if len(b) < off+2 {
				return
			}
			ext := hdr.IPv6Ext(b[off : off+2])
			nh, off = ext.NextHeader(), off+ext.AHLen()
		case protoFragment:
			//	next(1) res(1) offset(13 bits) res(2) M(1) id(4)
			if len(b) < off+ipv6FragHdrLen {
				return
			}
			fh := header.IPv6Fragment(b[off : off+ipv6FragHdrLen])
			if fh.FragmentOffset() != 0 || fh.More() { // an atomic fragment is whole
				f.frag = true
				f.later = fh.FragmentOffset() != 0
			}
			nh, off = fh.NextHeader(), off+ipv6FragHdrLen
		default:
			f.proto, f.l4 = nh, off
			return
		}
	}
}
