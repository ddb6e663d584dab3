package gro

import (
	"encoding/binary"

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
	// segments (tcp_gro_receive masks out CWR, FIN and PSH; CWR in the new
	// segment flushes on its own).
	flagWordMergeable = uint32(tcpCWR|tcpFIN|tcpPSH) << 16
)

// verdict is what parse decides about a packet.
type verdict uint8

const (
	// passOther: not a TCP or UDP flow GRO can name (not IP, ICMP, other
	// L4, malformed). Hand it up and touch nothing held.
	passOther verdict = iota
	// passAddrs: an IP packet of TCP or UDP, or of an unknown protocol
	// behind IPv6 extension headers, whose ports are not at hand
	// (fragments, headers beyond the linear part). Flush the held packets
	// of its address pair (and protocol, if known), then hand it up.
	passAddrs
	// passFlow: a packet of a known flow that GRO must not merge (IP
	// options, extension headers, unverified checksum, padding, short
	// header copy, LRO super-frame, ...). Flush its flow, then hand it up.
	passFlow
	// candidate: mergeable in principle; segInfo is complete.
	candidate
)

// segInfo is what parse learns from a packet's headers. It holds no
// reference to the packet.
type segInfo struct {
	key     flowKey
	proto   uint8 // protoTCP, protoUDP; 0 when unknown (passAddrs only)
	v6      bool
	l4      int    // offset of the L4 header in the frame
	hlen    int    // offset of the L4 payload: Ethernet, IP and L4 headers
	payload int    // L4 payload bytes
	seq     uint32 // TCP sequence number
	flags   uint8  // TCP flags
	id      uint16 // IPv4 identification
}

func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }
func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }
func be64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// parse reads p's headers from its linear part into s and decides what GRO
// may do with p. It borrows p, never panics and never allocates; it reads
// only p.Linear and p's metadata (and the frags' lengths).
func parse(p *bufpool.Packet, s *segInfo) verdict {
	b := p.Linear
	// No VLAN tag: the driver drops VLAN-tagged frames.
	if len(b) < header.EthernetMinimumSize {
		return passOther
	}
	switch header.Ethernet(b).Type() {
	case header.IPv4ProtocolNumber:
		return parse4(p, b, s)
	case header.IPv6ProtocolNumber:
		return parse6(p, b, s)
	}
	return passOther
}

// parse4 parses an IPv4 packet (RFC 791 section 3.1).
func parse4(p *bufpool.Packet, b []byte, s *segInfo) verdict {
	if len(b) < header.EthernetMinimumSize+ipv4HdrLen {
		return passOther
	}
	// The fixed header only: the one GRO merges (one with options is
	// handed up), and a view of known length needs no further bounds check.
	ip := header.IPv4(b[header.EthernetMinimumSize : header.EthernetMinimumSize+ipv4HdrLen])
	if header.IPVersion(ip) != header.IPv4Version {
		return passOther
	}
	proto := ip.Protocol()
	if proto != protoTCP && proto != protoUDP {
		return passOther
	}
	s.v6, s.proto = false, proto
	s.key = flowKey{a: uint64(be32(ip.SourceAddressSlice()))<<32 | uint64(be32(ip.DestinationAddressSlice()))}
	s.key.setProto(4, proto)
	ihl := int(ip.HeaderLength())
	s.l4 = header.EthernetMinimumSize + ihl
	if hdr.IsIPv4Fragment(ip) || ihl < ipv4HdrLen || len(b) < s.l4+4 {
		// A fragment (MF or an offset), or ports out of reach.
		return passAddrs
	}
	s.key.setPorts(be32(b[s.l4:]))
	if ihl != ipv4HdrLen || ip.Flags()&ipv4FlagReserved != 0 || !plain(p) || hdr.IPv4HeaderSum(ip) != 0xffff {
		// IP options, the reserved flag, a bad header checksum, or a
		// packet GRO must not touch.
		return passFlow
	}
	s.id = ip.ID()
	tot := int(ip.TotalLength())
	if tot < ihl {
		return passFlow
	}
	return parseL4(p, b, s, tot-ihl)
}

// parse6 parses an IPv6 packet (RFC 8200 section 3); only one without
// extension headers may be merged.
func parse6(p *bufpool.Packet, b []byte, s *segInfo) verdict {
	if len(b) < header.EthernetMinimumSize+ipv6HdrLen {
		return passOther
	}
	ip := header.IPv6(b[header.EthernetMinimumSize : header.EthernetMinimumSize+ipv6HdrLen]) // the fixed header
	if header.IPVersion(ip) != header.IPv6Version {
		return passOther
	}
	s.v6 = true
	src, dst := ip.SourceAddressSlice(), ip.DestinationAddressSlice()
	s.key = flowKey{a: be64(src), b: be64(src[8:]), c: be64(dst), d: be64(dst[8:])}
	nh := ip.NextHeader()
	l4 := header.EthernetMinimumSize + ipv6HdrLen
	for range maxIPv6ExtHdrs {
		switch nh {
		case protoTCP, protoUDP:
			s.proto, s.l4 = nh, l4
			s.key.setProto(6, nh)
			if len(b) < l4+4 {
				return passAddrs
			}
			s.key.setPorts(be32(b[l4:]))
			if l4 != header.EthernetMinimumSize+ipv6HdrLen || !plain(p) {
				return passFlow
			}
			return parseL4(p, b, s, int(ip.PayloadLength())-(l4-header.EthernetMinimumSize-ipv6HdrLen))
		case protoHopByHop, protoRouting, protoDestOpts:
			if len(b) < l4+2 {
				s.key.setProto(6, 0)
				return passAddrs
			}
			ext := hdr.IPv6Ext(b[l4 : l4+2])
			nh = ext.NextHeader()
			l4 += ext.Len()
		case protoFragment:
			if len(b) < l4+1 {
				s.key.setProto(6, 0)
				return passAddrs
			}
			nh = b[l4] // Next Header, the only byte needed of the fragment header
			if nh != protoTCP && nh != protoUDP {
				return passOther
			}
			s.proto = nh
			s.key.setProto(6, nh)
			return passAddrs
		default:
			return passOther
		}
	}
	s.key.setProto(6, 0)
	return passAddrs
}

// plain reports whether p is a single frame GRO may merge: checksums
// verified, not already an aggregate or a chain.
func plain(p *bufpool.Packet) bool {
	return p.CsumVerified && p.Next == nil && p.Segs <= 1
}

// parseL4 checks the TCP (RFC 9293 section 3.1) or UDP (RFC 768) header at
// s.l4, ipPayload bytes long by the IP header, and fills the rest of s.
func parseL4(p *bufpool.Packet, b []byte, s *segInfo, ipPayload int) verdict {
	n := frameLen(p)
	if n != p.Len || n != s.l4+ipPayload {
		// Ethernet padding (the kernel flushes when the IP length is not
		// the GRO length), truncation, or a Len that does not add up.
		return passFlow
	}
	if s.proto == protoTCP {
		if len(b) < s.l4+tcpMinHdrLen {
			return passFlow
		}
		tcp := header.TCP(b[s.l4 : s.l4+tcpMinHdrLen]) // the fixed header: options are not read
		doff := int(tcp.DataOffset())
		if doff < tcpMinHdrLen || doff > ipPayload {
			return passFlow
		}
		s.hlen = s.l4 + doff
		s.payload = ipPayload - doff
		s.seq = tcp.SequenceNumber()
		s.flags = uint8(tcp.Flags())
	} else {
		if len(b) < s.l4+udpHdrLen {
			return passFlow
		}
		udp := header.UDP(b[s.l4 : s.l4+udpHdrLen])
		ulen := int(udp.Length())
		if ulen != ipPayload || ulen <= udpHdrLen || (s.v6 && udp.Checksum() == 0) {
			// Padded or malicious, empty, or a zero checksum over IPv6
			// (RFC 8200 section 8.1: the stack drops it).
			return passFlow
		}
		s.hlen = s.l4 + udpHdrLen
		s.payload = ulen - udpHdrLen
	}
	if s.hlen > len(b) || s.hlen != p.HdrLen {
		// The header copy is shorter than the headers, or the NIC parsed
		// them otherwise: the payload offset is not known for sure.
		return passFlow
	}
	if p.GSOSize > 0 && s.payload > int(p.GSOSize) {
		// An LRO super-frame: already aggregated.
		return passFlow
	}
	return candidate
}

// frameLen returns the bytes in p's linear part and frags.
func frameLen(p *bufpool.Packet) int {
	n := len(p.Linear)
	for i := range p.Frags {
		n += int(p.Frags[i].Len)
	}
	return n
}
