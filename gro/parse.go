package gro

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
)

// Header sizes and field values the parser needs.
const (
	ethTypeIPv4  = 0x0800
	ethTypeIPv6  = 0x86dd
	ipv4HdrLen   = 20 // IHL 5: GRO merges no packet with IP options
	ipv6HdrLen   = 40
	tcpMinHdrLen = 20
	udpHdrLen    = 8

	protoHopByHop = 0
	protoTCP      = 6
	protoUDP      = 17
	protoRouting  = 43
	protoFragment = 44
	protoDestOpts = 60

	// maxIPv6ExtHdrs bounds the extension header chain walked to find the
	// flow of a packet GRO hands up (the driver's bound too).
	maxIPv6ExtHdrs = 8
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
	switch be16(b[12:]) {
	case ethTypeIPv4:
		return parse4(p, b, s)
	case ethTypeIPv6:
		return parse6(p, b, s)
	}
	return passOther
}

// parse4 parses an IPv4 packet (RFC 791 section 3.1).
func parse4(p *bufpool.Packet, b []byte, s *segInfo) verdict {
	if len(b) < header.EthernetMinimumSize+ipv4HdrLen {
		return passOther
	}
	ip := b[header.EthernetMinimumSize:]
	if ip[0]>>4 != 4 {
		return passOther
	}
	proto := ip[9]
	if proto != protoTCP && proto != protoUDP {
		return passOther
	}
	s.v6, s.proto = false, proto
	s.key = flowKey{a: uint64(be32(ip[12:]))<<32 | uint64(be32(ip[16:]))}
	s.key.setProto(4, proto)
	ihl := int(ip[0]&0x0f) * 4
	frag := be16(ip[6:])
	s.l4 = header.EthernetMinimumSize + ihl
	if frag&0x3fff != 0 || ihl < ipv4HdrLen || len(b) < s.l4+4 {
		// A fragment (MF or an offset), or ports out of reach.
		return passAddrs
	}
	s.key.setPorts(be32(b[s.l4:]))
	if ihl != ipv4HdrLen || frag&0x8000 != 0 || !plain(p) || ipSum(ip[:ihl]) != 0xffff {
		// IP options, the reserved flag, a bad header checksum, or a
		// packet GRO must not touch.
		return passFlow
	}
	s.id = be16(ip[4:])
	tot := int(be16(ip[2:]))
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
	ip := b[header.EthernetMinimumSize:]
	if ip[0]>>4 != 6 {
		return passOther
	}
	s.v6 = true
	s.key = flowKey{a: be64(ip[8:]), b: be64(ip[16:]), c: be64(ip[24:]), d: be64(ip[32:])}
	nh := ip[6]
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
			return parseL4(p, b, s, int(be16(ip[4:]))-(l4-header.EthernetMinimumSize-ipv6HdrLen))
		case protoHopByHop, protoRouting, protoDestOpts:
			if len(b) < l4+2 {
				s.key.setProto(6, 0)
				return passAddrs
			}
			nh = b[l4]
			l4 += (int(b[l4+1]) + 1) * 8
		case protoFragment:
			if len(b) < l4+1 {
				s.key.setProto(6, 0)
				return passAddrs
			}
			nh = b[l4]
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
		doff := int(b[s.l4+12]>>4) * 4
		if doff < tcpMinHdrLen || doff > ipPayload {
			return passFlow
		}
		s.hlen = s.l4 + doff
		s.payload = ipPayload - doff
		s.seq = be32(b[s.l4+4:])
		s.flags = b[s.l4+13]
	} else {
		if len(b) < s.l4+udpHdrLen {
			return passFlow
		}
		ulen := int(be16(b[s.l4+4:]))
		if ulen != ipPayload || ulen <= udpHdrLen || (s.v6 && be16(b[s.l4+6:]) == 0) {
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

// ipSum returns the folded 16-bit one's complement sum of b (RFC 1071); a
// valid IPv4 header sums to 0xffff.
func ipSum(b []byte) uint16 {
	// Summing 32-bit words and folding gives the 16-bit sum (RFC 1071
	// section 2 (B), byte order independence and parallel summation).
	var sum uint64
	for ; len(b) >= 4; b = b[4:] {
		sum += uint64(be32(b))
	}
	if len(b) >= 2 {
		sum += uint64(be16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint64(b[0]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}
