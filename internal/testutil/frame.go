package testutil

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// udpChecksumOffset is where the checksum sits in a UDP header (RFC 768);
// gVisor's header package does not export it.
const udpChecksumOffset = 6

// Csum is how Frame.Build fills the L4 checksum.
type Csum uint8

const (
	CsumFull    Csum = iota // the correct checksum (0xffff for a UDP sum of 0, RFC 768)
	CsumPartial             // the folded pseudo-header sum, as in a CHECKSUM_PARTIAL (GSO) frame
	CsumZero                // 0 (for UDP over IPv4: no checksum)
)

// Frame describes an Ethernet frame carrying a TCP or UDP packet over IPv4
// or IPv6, which Build encodes with gVisor's header encoders
// (header.Ethernet.Encode, header.IPv4.Encode or header.IPv6.Encode,
// header.TCP.Encode or header.UDP.Encode):
//
//	Headroom | Ethernet | IPv4 (+options) or IPv6 (+extension headers) | TCP (+options) or UDP | Payload | Pad
//
// With another Proto (ICMP, say), or NoL4Header, the payload follows the
// IP header directly: a test writes such an L4 header into Payload itself.
// The zero value of a field is its zero on the wire, but for TTL (64) and
// Proto (TCP). The IPv4 header checksum is always correct.
type Frame struct {
	// Headroom is zero bytes before the Ethernet header, such as the room
	// of a virtio-net header.
	Headroom int

	SrcMAC, DstMAC tcpip.LinkAddress

	// Src and Dst are both IPv4 or both IPv6 addresses, which selects
	// the IP version.
	Src, Dst    tcpip.Address
	TTL         uint8  // TTL or hop limit; 0: 64
	TOS         uint8  // TOS or traffic class
	FlowLabel   uint32 // IPv6
	ID          uint16
	IPFlags     uint8  // IPv4 flags (header.IPv4FlagDontFragment ...)
	FragOff     uint16 // IPv4 fragment offset in bytes
	IPv4Options header.IPv4OptionsSerializer
	IPv6Ext     header.IPv6ExtHdrSerializer

	Proto            tcpip.TransportProtocolNumber // header.TCPProtocolNumber (0) or header.UDPProtocolNumber
	SrcPort, DstPort uint16
	Seq, Ack         uint32          // TCP
	Flags            header.TCPFlags // TCP
	Window           uint16          // TCP
	TCPOptions       []byte          // TCP, a multiple of 4 bytes
	// NoL4Header leaves out the TCP or UDP header, as in an IP fragment
	// after the first.
	NoL4Header bool
	Payload    []byte
	// Pad is zero bytes after the IP packet (Ethernet padding).
	Pad  int
	Csum Csum
}

func (f *Frame) v6() bool { return f.Src.Len() == header.IPv6AddressSize }

func (f *Frame) udp() bool { return f.Proto == header.UDPProtocolNumber }

// hasL4 reports whether Build writes a TCP or UDP header.
func (f *Frame) hasL4() bool {
	return !f.NoL4Header && (f.Proto == 0 || f.Proto == header.TCPProtocolNumber || f.udp())
}

// L3Off is the offset of the IP header in the built frame.
func (f *Frame) L3Off() int { return f.Headroom + header.EthernetMinimumSize }

// L4Off is the offset of the TCP or UDP header in the built frame.
func (f *Frame) L4Off() int {
	if f.v6() {
		return f.L3Off() + header.IPv6MinimumSize + f.IPv6Ext.Length()
	}
	return f.L3Off() + header.IPv4MinimumSize + int(f.IPv4Options.Length())
}

// L4HeaderLen is the length of the TCP header (with options) or UDP
// header Build writes, 0 for none.
func (f *Frame) L4HeaderLen() int {
	if !f.hasL4() {
		return 0
	}
	if f.udp() {
		return header.UDPMinimumSize
	}
	return header.TCPMinimumSize + len(f.TCPOptions)
}

// CsumOffset is the offset of the L4 checksum field within the L4 header
// (a virtio-net header's csum_offset).
func (f *Frame) CsumOffset() int {
	if f.udp() {
		return udpChecksumOffset
	}
	return header.TCPChecksumOffset
}

// Build encodes f into a new frame.
func (f Frame) Build() []byte {
	if f.TTL == 0 {
		f.TTL = 64
	}
	if f.Proto == 0 {
		f.Proto = header.TCPProtocolNumber
	}
	l3, l4 := f.L3Off(), f.L4Off()
	l4Len := f.L4HeaderLen() + len(f.Payload)
	b := make([]byte, l4+l4Len+f.Pad)
	copy(b[l4+f.L4HeaderLen():], f.Payload)

	eth := header.EthernetFields{SrcAddr: f.SrcMAC, DstAddr: f.DstMAC, Type: header.IPv4ProtocolNumber}
	if f.v6() {
		eth.Type = header.IPv6ProtocolNumber
		header.IPv6(b[l3:]).Encode(&header.IPv6Fields{
			TrafficClass:      f.TOS,
			FlowLabel:         f.FlowLabel,
			PayloadLength:     uint16(l4 - l3 - header.IPv6MinimumSize + l4Len),
			TransportProtocol: f.Proto,
			HopLimit:          f.TTL,
			SrcAddr:           f.Src,
			DstAddr:           f.Dst,
			ExtensionHeaders:  f.IPv6Ext,
		})
	} else {
		ip := header.IPv4(b[l3:])
		ip.Encode(&header.IPv4Fields{
			TOS:            f.TOS,
			TotalLength:    uint16(l4 - l3 + l4Len),
			ID:             f.ID,
			Flags:          f.IPFlags,
			FragmentOffset: f.FragOff,
			TTL:            f.TTL,
			Protocol:       uint8(f.Proto),
			SrcAddr:        f.Src,
			DstAddr:        f.Dst,
			Options:        f.IPv4Options,
		})
		ip.SetChecksum(^ip.CalculateChecksum())
	}

	header.Ethernet(b[f.Headroom:]).Encode(&eth)
	if !f.hasL4() {
		return b
	}
	seg := b[l4 : l4+l4Len]
	if f.udp() {
		header.UDP(seg).Encode(&header.UDPFields{SrcPort: f.SrcPort, DstPort: f.DstPort, Length: uint16(l4Len)})
	} else {
		t := header.TCP(seg)
		t.Encode(&header.TCPFields{
			SrcPort: f.SrcPort, DstPort: f.DstPort, SeqNum: f.Seq, AckNum: f.Ack,
			DataOffset: uint8(f.L4HeaderLen()), Flags: f.Flags, WindowSize: f.Window,
		})
		copy(t[header.TCPMinimumSize:], f.TCPOptions)
	}
	pseudo := header.PseudoHeaderChecksum(f.Proto, f.Src, f.Dst, uint16(l4Len))
	var sum uint16
	switch f.Csum {
	case CsumFull:
		sum = ^checksum.Checksum(seg, pseudo)
		if sum == 0 && f.udp() {
			sum = 0xffff
		}
	case CsumPartial:
		sum = pseudo
	}
	checksum.Put(seg[f.CsumOffset():], sum)
	return b
}
