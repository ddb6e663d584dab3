// Package hdr is what ustack's packet parsers (the NIC model's ParseFrame,
// GRO's parse, cpumap's flow dissector) need beyond gVisor's header views
// (gvisor.dev/gvisor/pkg/tcpip/header), which they use for everything else:
// the Ethernet header length (header.EthernetMinimumSize), the IPv4, IPv6,
// fragment, TCP and UDP header fields and the IPv4 header checksum.
//
// What it adds:
//
//   - the 802.1Q/802.1ad VLAN tag (gVisor's Ethernet view knows no tag);
//   - a view of one IPv6 extension header (hop-by-hop, routing,
//     destination options, AH) and the bound on the extension header chain
//     the parsers walk. gVisor's IPv6PayloadIterator walks the chain over a
//     buffer.Buffer and allocates; the parsers walk a []byte without
//     allocating, each with its own acceptance rules (see their docs), and
//     use these views for the field reads;
//   - IPv6SkipExtHdrs: the chain walk of the kernel's ipv6_skip_exthdr,
//     for readers that only need where it ends (a Fragment header behind
//     others, say);
//   - IsIPv4Fragment: MF or a fragment offset, in one load;
//   - IPv4HeaderSum: the checksum of the fixed 20-byte IPv4 header,
//     unrolled (gVisor's is generic over any length).
//
// Everything here is a pure function of its arguments: safe for
// concurrent use, OS-neutral, never allocates. Like gVisor's views, the
// views here do not check bounds: the caller checks the length first.
package hdr

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// VLAN tags (IEEE 802.1Q), between the source address and the EtherType:
//
//	+-------------+-------------+-----------------+-----------+-----------+
//	| dst (6)     | src (6)     | TPID (2)        | TCI (2)   | type (2)  |
//	+-------------+-------------+-----------------+-----------+-----------+
//
// TPID is EtherTypeVLAN (802.1Q) or EtherTypeQinQ (802.1ad, the outer tag
// of a double-tagged frame).
const (
	VLANTagLen    = 4      // TPID and TCI: the kernel's VLAN_HLEN
	EtherTypeVLAN = 0x8100 // ETH_P_8021Q
	EtherTypeQinQ = 0x88a8 // ETH_P_8021AD
)

// VLANTag is a view of a VLAN tag after its TPID, which is the EtherType
// field it follows (the frame's, at offset 12, or the outer tag's): TCI
// then the next EtherType. It must hold at least VLANTagLen bytes.
type VLANTag []byte

// TCI returns the tag control information: priority, DEI and VLAN ID.
func (b VLANTag) TCI() uint16 { return binary.BigEndian.Uint16(b[0:]) }

// EtherType returns the EtherType after the tag (the TPID of the next tag,
// if any).
func (b VLANTag) EtherType() uint16 { return binary.BigEndian.Uint16(b[2:]) }

// IPv6ExtMinLen is the shortest IPv6 extension header (RFC 8200 section 4:
// every extension header is a multiple of 8 octets long).
const IPv6ExtMinLen = 8

// MaxIPv6ExtHdrs bounds the IPv6 extension header chain the parsers walk
// (the kernel's flow dissector stops at MAX_FLOW_DISSECT_HDRS, 15). Real
// traffic carries one or two; the bound keeps the work per frame small.
const MaxIPv6ExtHdrs = 8

// IPv6Ext is a view of an IPv6 extension header that begins with Next
// Header and Hdr Ext Len (RFC 8200 sections 4.3 to 4.6, RFC 4302 section
// 2). It must hold at least 2 bytes.
//
//	+-------------+-------------+-----------------------------------------+
//	| next hdr(1) | ext len (1) | options, addresses, ...                 |
//	+-------------+-------------+-----------------------------------------+
type IPv6Ext []byte

// NextHeader returns the type of the header that follows.
func (b IPv6Ext) NextHeader() uint8 { return b[0] }

// Len returns the length in bytes of a hop-by-hop options, routing or
// destination options header: Hdr Ext Len counts 8-octet units, not
// including the first 8 (RFC 8200 section 4.3).
func (b IPv6Ext) Len() int { return (int(b[1]) + 1) * 8 }

// AHLen returns the length in bytes of an authentication header: its
// Payload Len counts 4-octet units, minus 2 (RFC 4302 section 2.2).
func (b IPv6Ext) AHLen() int { return (int(b[1]) + 2) * 4 }

// IPv6SkipExtHdrs walks the extension header chain of the IPv6 packet ip
// (from its fixed header on) as the kernel's ipv6_skip_exthdr does: past
// hop-by-hop options, routing, destination options and authentication
// headers, in any order, to the first header of another type. It returns
// that header's type and its offset in ip. Unlike ipv6_skip_exthdr it
// stops at a Fragment header (44), which it returns as such, so that a
// fragment behind other extension headers is seen. ok is false when ip is
// shorter than the fixed header, when a header of the chain runs past ip,
// or when the chain holds more than MaxIPv6ExtHdrs headers: then what
// follows is unknown. It checks every bound and reads no more than the
// chain.
func IPv6SkipExtHdrs(ip []byte) (nh uint8, off int, ok bool) {
	if len(ip) < header.IPv6MinimumSize {
		return 0, 0, false
	}
	nh, off = header.IPv6(ip).NextHeader(), header.IPv6MinimumSize
	for n := 0; ; n++ {
		var hlen int
		switch header.IPv6ExtensionHeaderIdentifier(nh) {
		case header.IPv6HopByHopOptionsExtHdrIdentifier, header.IPv6RoutingExtHdrIdentifier,
			header.IPv6DestinationOptionsExtHdrIdentifier:
			if len(ip)-off < 2 {
				return 0, 0, false
			}
			hlen = IPv6Ext(ip[off:]).Len()
		case header.IPv6AuthenticationExtHdrIdentifier:
			if len(ip)-off < 2 {
				return 0, 0, false
			}
			hlen = IPv6Ext(ip[off:]).AHLen()
		default:
			// The upper-layer header, a Fragment header, or one
			// ipv6_skip_exthdr does not step over (ESP, no next header).
			return nh, off, true
		}
		if n == MaxIPv6ExtHdrs || len(ip)-off < hlen {
			return 0, 0, false
		}
		nh = IPv6Ext(ip[off:]).NextHeader()
		off += hlen
	}
}

// IsIPv4Fragment reports whether the IPv4 header ip (at least 8 bytes long)
// is a fragment's: MF set or a fragment offset other than 0 (RFC 791
// section 3.1). It tests both with one load; gVisor's view reads MF
// (header.IPv4.More) and the offset (FragmentOffset) apart.
func IsIPv4Fragment(ip []byte) bool {
	const mfAndOffset = 0x3fff // MF 0x2000, the offset the low 13 bits
	return binary.BigEndian.Uint16(ip[6:])&mfAndOffset != 0
}

// IPv4HeaderSum returns the folded 16-bit one's complement sum (RFC 1071)
// of the fixed 20-byte IPv4 header at the start of ip, options excluded; ip
// must hold at least 20 bytes. A valid header without options sums to
// 0xffff. gVisor's checksum.Checksum (behind header.IPv4.IsChecksumValid)
// gives the same for any length, through alignment and length cases that
// cost about twice the instructions for 20 bytes; GRO checks every IPv4
// packet's header and rebuilds it for every merged one.
func IPv4HeaderSum(ip []byte) uint16 {
	_ = ip[19] // one bounds check for the loads below
	// Summing 32-bit words and folding gives the 16-bit sum (RFC 1071
	// section 2 (B), byte order independence and parallel summation).
	sum := uint64(binary.BigEndian.Uint32(ip[0:])) + uint64(binary.BigEndian.Uint32(ip[4:])) +
		uint64(binary.BigEndian.Uint32(ip[8:])) + uint64(binary.BigEndian.Uint32(ip[12:])) +
		uint64(binary.BigEndian.Uint32(ip[16:]))
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}
