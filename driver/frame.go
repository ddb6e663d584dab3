package driver

import (
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/internal/hdr"
)

// L3Type is the network-layer protocol of a frame.
type L3Type uint8

// L3 types.
const (
	L3None L3Type = iota // not parsed (only in a zero FrameInfo)
	L3IPv4
	L3IPv6
	L3ARP
)

// L4Type is the transport-layer protocol of a frame.
type L4Type uint8

// L4 types.
const (
	L4None  L4Type = iota // no L4 header: ARP
	L4TCP                 // TCP
	L4UDP                 // UDP
	L4ICMP                // ICMPv4 over IPv4 or ICMPv6 over IPv6
	L4Other               // any other protocol, or an IP fragment
)

// EtherTypes and IP protocol numbers the NIC model knows (gVisor's
// header.IPv4ProtocolNumber, header.TCPProtocolNumber, ...; untyped here, as
// the frame bytes hold them).
const (
	etherTypeIPv4 = 0x0800
	etherTypeARP  = 0x0806
	etherTypeVLAN = hdr.EtherTypeVLAN // 802.1Q
	etherTypeQinQ = hdr.EtherTypeQinQ // 802.1ad

	protoHopByHop = 0
	protoICMPv4   = 1
	protoTCP      = 6
	protoUDP      = 17
	protoRouting  = 43
	protoFragment = 44
	protoICMPv6   = 58
	protoDestOpts = 60

	etherTypeIPv6 = 0x86dd
)

// Header sizes, gVisor's.
const (
	arpLen          = header.ARPSize // Ethernet/IPv4 ARP
	ipv4MinHdrLen   = header.IPv4MinimumSize
	ipv6HdrLen      = header.IPv6MinimumSize
	ipv6FragHdrLen  = header.IPv6FragmentHeaderSize
	tcpMinHdrLen    = header.TCPMinimumSize
	udpHdrLen       = header.UDPMinimumSize
	icmpv4MinHdrLen = header.ICMPv4MinimumSize
	icmpv6MinHdrLen = header.ICMPv6HeaderSize // type, code, checksum
)

// maxIPv6ExtHdrs bounds the IPv6 extension header chain ParseFrame walks; a
// longer chain is dropped as DropBadIPv6ExtHdr.
const maxIPv6ExtHdrs = hdr.MaxIPv6ExtHdrs

// FrameInfo is what the NIC model learns from a frame's headers (the CQE
// fields of a real NIC). All offsets are from the start of the Ethernet
// frame. ParseFrame fills it; it holds no reference to the frame.
type FrameInfo struct {
	EtherType uint16 // after any VLAN tag
	VLAN      bool   // one 802.1Q (0x8100) or 802.1ad (0x88a8) tag present; a second tag is not parsed
	VLANTCI   uint16 // tag control information of the VLAN tag
	L2Len     int    // 14, or 18 with a VLAN tag
	L3        L3Type
	L3Len     int // IPv4: IHL*4; IPv6: 40 plus extension headers (hop-by-hop, routing, destination options, fragment) up to the L4 header; ARP: 28
	// IPLen is the length of the IP packet by its header: IPv4 total
	// length, IPv6 40+payload length; for ARP, 28. L2Len+IPLen <=
	// len(frame); bytes beyond are Ethernet padding.
	IPLen int
	// Fragment is set for an IPv4 packet with MF set or a fragment offset
	// other than 0, and for an IPv6 packet with a fragment header. L4 is
	// then L4Other and L4Len 0; L4Proto is the fragmented protocol.
	Fragment bool
	L4       L4Type
	L4Proto  uint8 // IP protocol / next header of the L4 header
	L4Len    int   // TCP: data offset*4; UDP: 8; ICMPv4: 8; ICMPv6: 4; L4Other, L4None: 0
}

// HeaderLen returns L2Len+L3Len+L4Len: the exact header length, and the
// offset of the L4 payload in the frame.
func (fi *FrameInfo) HeaderLen() int {
	return fi.L2Len + fi.L3Len + fi.L4Len
}

// ParseFrame parses frame's Ethernet, VLAN, IP and L4 headers into fi and
// returns DropNone, or why the frame must be dropped, in which case fi is
// only partly filled and must not be used. It checks lengths and header
// consistency, not checksums (see VerifyChecksums). It never panics and never
// allocates, and fi holds no reference to frame.
//
// An IPv6 jumbogram (payload length 0 followed by a hop-by-hop header, RFC
// 2675) is not supported: DropBadIPLen. An IPv6 packet with payload length 0
// and no extension header is fine (IPLen 40). A hop-by-hop header anywhere
// but first, or more than 8 extension headers, is DropBadIPv6ExtHdr.
func ParseFrame(frame []byte, fi *FrameInfo) Drop {
	*fi = FrameInfo{}
	if len(frame) < header.EthernetMinimumSize {
		return DropShortEther
	}
	l2 := header.EthernetMinimumSize
	et := uint16(header.Ethernet(frame).Type())
	if et == etherTypeVLAN || et == etherTypeQinQ {
		if len(frame) < l2+hdr.VLANTagLen {
			return DropShortEther
		}
		tag := hdr.VLANTag(frame[l2:])
		fi.VLAN = true
		fi.VLANTCI = tag.TCI()
		et = tag.EtherType()
		l2 += hdr.VLANTagLen
	}
	fi.EtherType = et
	fi.L2Len = l2
	switch et {
	case etherTypeIPv4:
		return parseIPv4(frame, fi)
	case etherTypeIPv6:
		return parseIPv6(frame, fi)
	case etherTypeARP:
		if len(frame)-l2 < arpLen {
			return DropShortARP
		}
		fi.L3 = L3ARP
		fi.L3Len = arpLen
		fi.IPLen = arpLen
		return DropNone
	default:
		return DropUnknownEtherType
	}
}

// ParseL3Frame is ParseFrame for a frame that starts at its IP header, as
// a TUN device's frames do (IFF_TUN|IFF_NO_PI): L2Len is 0 and EtherType is
// the one of the IP version in the first nibble (as tun_get_user takes
// skb->protocol from it without IFF_NO_PI's header). A frame that is
// neither IPv4 nor IPv6 is DropBadIPVersion.
func ParseL3Frame(frame []byte, fi *FrameInfo) Drop {
	*fi = FrameInfo{}
	if len(frame) == 0 {
		return DropShortIP
	}
	switch frame[0] >> 4 {
	case header.IPv4Version:
		fi.EtherType = etherTypeIPv4
		return parseIPv4(frame, fi)
	case header.IPv6Version:
		fi.EtherType = etherTypeIPv6
		return parseIPv6(frame, fi)
	}
	return DropBadIPVersion
}

// parseIPv4 parses the IPv4 header at fi.L2Len and what follows it.
func parseIPv4(frame []byte, fi *FrameInfo) Drop {
	ip := header.IPv4(frame[fi.L2Len:])
	if len(ip) < ipv4MinHdrLen {
		return DropShortIP
	}
	if header.IPVersion(ip) != header.IPv4Version {
		return DropBadIPVersion
	}
	ihl := int(ip.HeaderLength())
	if ihl < ipv4MinHdrLen || ihl > len(ip) {
		return DropBadIHL
	}
	tot := int(ip.TotalLength())
	if tot < ihl || tot > len(ip) {
		return DropBadIPLen
	}
	fi.L3 = L3IPv4
	fi.L3Len = ihl
	fi.IPLen = tot
	fi.L4Proto = ip.Protocol()
	if hdr.IsIPv4Fragment(ip) {
		fi.Fragment = true
		fi.L4 = L4Other
		return DropNone
	}
	return parseL4(frame, fi)
}

// parseIPv6 parses the IPv6 header at fi.L2Len, its extension headers and
// what follows them.
func parseIPv6(frame []byte, fi *FrameInfo) Drop {
	ip := header.IPv6(frame[fi.L2Len:])
	if len(ip) < ipv6HdrLen {
		return DropShortIP
	}
	if header.IPVersion(ip) != header.IPv6Version {
		return DropBadIPVersion
	}
	plen := int(ip.PayloadLength())
	nh := ip.NextHeader()
	if plen == 0 && nh == protoHopByHop {
		return DropBadIPLen // jumbogram
	}
	if ipv6HdrLen+plen > len(ip) {
		return DropBadIPLen
	}
	fi.L3 = L3IPv6
	fi.IPLen = ipv6HdrLen + plen
	ip = ip[:fi.IPLen]
	off := ipv6HdrLen
	for n := 0; isIPv6ExtHdr(nh); n++ {
		if n == maxIPv6ExtHdrs {
			return DropBadIPv6ExtHdr
		}
		if nh == protoFragment {
			if len(ip)-off < ipv6FragHdrLen {
				return DropBadIPv6ExtHdr
			}
			fi.L3Len = off + ipv6FragHdrLen
			fi.L4Proto = header.IPv6Fragment(ip[off:fi.L3Len]).NextHeader()
			fi.Fragment = true
			fi.L4 = L4Other
			return DropNone
		}
		// RFC 8200 section 4.1: hop-by-hop options only right after the
		// IPv6 header.
		if nh == protoHopByHop && n != 0 {
			return DropBadIPv6ExtHdr
		}
		if len(ip)-off < hdr.IPv6ExtMinLen {
			return DropBadIPv6ExtHdr
		}
		ext := hdr.IPv6Ext(ip[off : off+hdr.IPv6ExtMinLen])
		hlen := ext.Len()
		if len(ip)-off < hlen {
			return DropBadIPv6ExtHdr
		}
		nh = ext.NextHeader()
		off += hlen
	}
	fi.L3Len = off
	fi.L4Proto = nh
	return parseL4(frame, fi)
}

// isIPv6ExtHdr reports whether nh is an IPv6 extension header ParseFrame
// walks: hop-by-hop options, routing, fragment or destination options.
func isIPv6ExtHdr(nh uint8) bool {
	return nh == protoHopByHop || nh == protoRouting || nh == protoFragment || nh == protoDestOpts
}

// parseL4 parses the L4 header of a non-fragment IP packet whose L2Len,
// L3, L3Len, IPLen and L4Proto are set in fi.
func parseL4(frame []byte, fi *FrameInfo) Drop {
	start := fi.L2Len + fi.L3Len
	l4 := frame[start : fi.L2Len+fi.IPLen]
	switch {
	case fi.L4Proto == protoTCP:
		if len(l4) < tcpMinHdrLen {
			return DropShortL4
		}
		doff := int(header.TCP(l4).DataOffset())
		if doff < tcpMinHdrLen || doff > len(l4) {
			return DropBadTCPOff
		}
		fi.L4 = L4TCP
		fi.L4Len = doff
	case fi.L4Proto == protoUDP:
		if len(l4) < udpHdrLen {
			return DropShortL4
		}
		ulen := int(header.UDP(l4).Length())
		if ulen < udpHdrLen || ulen != len(l4) {
			return DropBadUDPLen
		}
		fi.L4 = L4UDP
		fi.L4Len = udpHdrLen
	case fi.L4Proto == protoICMPv4 && fi.L3 == L3IPv4:
		if len(l4) < icmpv4MinHdrLen {
			return DropShortL4
		}
		fi.L4 = L4ICMP
		fi.L4Len = icmpv4MinHdrLen
	case fi.L4Proto == protoICMPv6 && fi.L3 == L3IPv6:
		if len(l4) < icmpv6MinHdrLen {
			return DropShortL4
		}
		fi.L4 = L4ICMP
		fi.L4Len = icmpv6MinHdrLen
	default:
		fi.L4 = L4Other
	}
	return DropNone
}
