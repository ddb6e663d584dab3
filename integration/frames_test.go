//go:build linux

package integration

import (
	"encoding/binary"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Frame builders for the hostile-frame and exhaustion tests: whole Ethernet
// frames, correct unless the caller breaks them afterwards, built with
// gVisor's header encoders.

// etherFrame returns an Ethernet frame with payload.
func etherFrame(dst, src [6]byte, etherType uint16, payload []byte) []byte {
	b := make([]byte, header.EthernetMinimumSize+len(payload))
	header.Ethernet(b).Encode(&header.EthernetFields{
		SrcAddr: tcpip.LinkAddress(src[:]), DstAddr: tcpip.LinkAddress(dst[:]),
		Type: tcpip.NetworkProtocolNumber(etherType),
	})
	copy(b[header.EthernetMinimumSize:], payload)
	return b
}

// ipv4Fields are what ipv4Packet varies.
type ipv4Fields struct {
	id       uint16
	flags    uint8  // header.IPv4FlagMoreFragments, ...
	fragOff  uint16 // in bytes, a multiple of 8
	options  header.IPv4OptionsSerializer
	protocol uint8
}

// ipv4Packet returns an IPv4 packet from src to dst carrying payload, with
// a correct header checksum.
func ipv4Packet(src, dst netip.Addr, f ipv4Fields, payload []byte) []byte {
	hl := header.IPv4MinimumSize
	if f.options != nil {
		hl += int(f.options.Length())
	}
	b := make([]byte, hl+len(payload))
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(b)), ID: f.id, Flags: f.flags, FragmentOffset: f.fragOff,
		TTL: 64, Protocol: f.protocol,
		SrcAddr: tcpip.AddrFrom4(src.As4()), DstAddr: tcpip.AddrFrom4(dst.As4()),
		Options: f.options,
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	copy(b[hl:], payload)
	return b
}

// ipv6Packet returns an IPv6 packet from src to dst: the fixed header with
// next header nh, then payload (extension headers included).
func ipv6Packet(src, dst netip.Addr, nh uint8, payload []byte) []byte {
	b := make([]byte, header.IPv6MinimumSize+len(payload))
	header.IPv6(b).Encode(&header.IPv6Fields{
		PayloadLength: uint16(len(payload)), TransportProtocol: tcpip.TransportProtocolNumber(nh),
		HopLimit: 64, SrcAddr: tcpip.AddrFrom16(src.As16()), DstAddr: tcpip.AddrFrom16(dst.As16()),
	})
	copy(b[header.IPv6MinimumSize:], payload)
	return b
}

// ipPacket is ipv4Packet (no options, not a fragment) or ipv6Packet by
// src's family.
func ipPacket(src, dst netip.Addr, proto uint8, payload []byte) []byte {
	if src.Is4() {
		return ipv4Packet(src, dst, ipv4Fields{protocol: proto, id: 1}, payload)
	}
	return ipv6Packet(src, dst, proto, payload)
}

func tcpipAddr(a netip.Addr) tcpip.Address {
	if a.Is4() {
		return tcpip.AddrFrom4(a.As4())
	}
	return tcpip.AddrFrom16(a.As16())
}

// l4Checksum returns the checksum field value of the TCP or UDP message seg
// (its checksum field zero) between src and dst.
func l4Checksum(proto uint8, src, dst netip.Addr, seg []byte) uint16 {
	ph := header.PseudoHeaderChecksum(tcpip.TransportProtocolNumber(proto), tcpipAddr(src), tcpipAddr(dst), uint16(len(seg)))
	return ^checksum.Checksum(seg, ph)
}

// udpMessage returns a UDP header and payload with a correct checksum.
func udpMessage(src, dst netip.AddrPort, payload []byte) []byte {
	b := make([]byte, header.UDPMinimumSize+len(payload))
	u := header.UDP(b)
	u.Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(len(b))})
	copy(b[header.UDPMinimumSize:], payload)
	u.SetChecksum(l4Checksum(uint8(header.UDPProtocolNumber), src.Addr(), dst.Addr(), b))
	return b
}

// tcpSegment returns a TCP header (no options) and payload with a correct
// checksum.
func tcpSegment(src, dst netip.AddrPort, seq, ack uint32, flags header.TCPFlags, win uint16, payload []byte) []byte {
	b := make([]byte, header.TCPMinimumSize+len(payload))
	t := header.TCP(b)
	t.Encode(&header.TCPFields{
		SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: seq, AckNum: ack,
		DataOffset: header.TCPMinimumSize, Flags: flags, WindowSize: win,
	})
	copy(b[header.TCPMinimumSize:], payload)
	t.SetChecksum(l4Checksum(uint8(header.TCPProtocolNumber), src.Addr(), dst.Addr(), b))
	return b
}

// etherTypeOf is the EtherType of an IP packet from a.
func etherTypeOf(a netip.Addr) uint16 {
	if a.Is4() {
		return uint16(header.IPv4ProtocolNumber)
	}
	return uint16(header.IPv6ProtocolNumber)
}

// udpFrame returns a whole Ethernet frame carrying a UDP datagram.
func udpFrame(dstMAC, srcMAC [6]byte, src, dst netip.AddrPort, payload []byte) []byte {
	ip := ipPacket(src.Addr(), dst.Addr(), uint8(header.UDPProtocolNumber), udpMessage(src, dst, payload))
	return etherFrame(dstMAC, srcMAC, etherTypeOf(src.Addr()), ip)
}

// tcpFrame returns a whole Ethernet frame carrying a TCP segment.
func tcpFrame(dstMAC, srcMAC [6]byte, src, dst netip.AddrPort, seq, ack uint32, flags header.TCPFlags, win uint16, payload []byte) []byte {
	ip := ipPacket(src.Addr(), dst.Addr(), uint8(header.TCPProtocolNumber), tcpSegment(src, dst, seq, ack, flags, win, payload))
	return etherFrame(dstMAC, srcMAC, etherTypeOf(src.Addr()), ip)
}

// ipv6FragmentHeader returns an IPv6 fragment extension header (RFC 8200
// section 4.5) for the fragment at off (a multiple of 8) of datagram id.
//
//	+--------+--------+-----------------+--+-+
//	|next hdr|reserved| fragment offset |Rs|M|
//	+--------+--------+-----------------+--+-+
//	|          identification                |
//	+----------------------------------------+
func ipv6FragmentHeader(nh uint8, off int, more bool, id uint32) []byte {
	b := make([]byte, 8)
	b[0] = nh
	v := uint16(off)
	if more {
		v |= 1
	}
	binary.BigEndian.PutUint16(b[2:], v)
	binary.BigEndian.PutUint32(b[4:], id)
	return b
}
