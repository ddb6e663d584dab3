package driver

import (
	"encoding/binary"
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/internal/hdr"
)

// Test frames are described by a pkSpec and encoded by pkSpec.build with
// gVisor's header encoders. The pk prefix keeps these helpers apart from
// other tests in the package.

// pkCsum is how pkSpec.build fills the L4 checksum.
type pkCsum uint8

const (
	pkCsumFull    pkCsum = iota // a correct checksum
	pkCsumPartial               // the pseudo-header sum, as in a CHECKSUM_PARTIAL (GSO) frame
	pkCsumZero                  // 0
)

// pkSpec describes a test frame.
type pkSpec struct {
	vlanType  uint16 // 0, or the VLAN tag's TPID (0x8100 or 0x88a8)
	tci       uint16
	etherType uint16 // EtherType after any tag; 0 means the one of l3
	l3        L3Type // L3IPv4, L3IPv6, L3ARP or L3None (no L3 header)
	proto     uint8  // IP protocol of the L4 header
	ipv4Opts  header.IPv4OptionsSerializer
	ipID      uint16
	ipFlags   uint8   // IPv4 flags, or for IPv6 IPv4FlagMoreFragments for a fragment header's M bit
	fragOff   uint16  // fragment offset in bytes
	ext       []uint8 // IPv6 extension headers by identifier: 0, 43, 60 or 44
	extOpts   int     // router alert options in each 0, 43 or 60 header; 0 means 1
	tcpFlags  header.TCPFlags
	tcpTS     bool // add NOP, NOP, timestamps (12 bytes of TCP options)
	seq, ack  uint32
	payload   []byte
	pad       int // Ethernet padding after the IP packet
	csum      pkCsum
}

var (
	pkSrcMAC = pkMAC("02:00:00:00:00:01")
	pkDstMAC = pkMAC("02:00:00:00:00:02")
	pkSrc4   = tcpip.AddrFrom4([4]byte{192, 0, 2, 1})
	pkDst4   = tcpip.AddrFrom4([4]byte{198, 51, 100, 7})
	pkSrc6   = tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 1})
	pkDst6   = tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, 15: 0x42})
)

func pkMAC(s string) tcpip.LinkAddress {
	a, err := tcpip.ParseMACAddress(s)
	if err != nil {
		panic(err)
	}
	return a
}

// pkPayload returns n bytes of a recognisable pattern.
func pkPayload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// l4Len returns the length of the L4 header build writes.
func (s *pkSpec) l4Len() int {
	switch s.proto {
	case protoTCP:
		if s.tcpTS {
			return header.TCPMinimumSize + 12
		}
		return header.TCPMinimumSize
	case protoUDP:
		return header.UDPMinimumSize
	case protoICMPv4:
		if s.l3 == L3IPv4 {
			return header.ICMPv4MinimumSize
		}
	case protoICMPv6:
		if s.l3 == L3IPv6 {
			return header.ICMPv6EchoMinimumSize
		}
	}
	return 0
}

// extSerializer returns the serializer for s.ext. Routing and destination
// options headers are serialized as hop-by-hop headers (same layout) and
// renamed by build.
func (s *pkSpec) extSerializer() header.IPv6ExtHdrSerializer {
	var ser header.IPv6ExtHdrSerializer
	for _, id := range s.ext {
		if id == protoFragment {
			ser = append(ser, &header.IPv6SerializableFragmentExtHdr{
				FragmentOffset: s.fragOff / 8,
				M:              s.ipFlags&header.IPv4FlagMoreFragments != 0,
				Identification: 0x01020304,
			})
			continue
		}
		var hbh header.IPv6SerializableHopByHopExtHdr
		for range max(s.extOpts, 1) {
			hbh = append(hbh, &header.IPv6RouterAlertOption{Value: header.IPv6RouterAlertMLD})
		}
		ser = append(ser, hbh)
	}
	return ser
}

// build encodes s into a new frame.
func (s *pkSpec) build() []byte {
	l2 := header.EthernetMinimumSize
	if s.vlanType != 0 {
		l2 += hdr.VLANTagLen
	}
	var l3 int
	var ext header.IPv6ExtHdrSerializer
	switch s.l3 {
	case L3IPv4:
		l3 = header.IPv4MinimumSize + int(s.ipv4Opts.Length())
	case L3IPv6:
		ext = s.extSerializer()
		l3 = header.IPv6MinimumSize + ext.Length()
	case L3ARP:
		l3 = header.ARPSize
	}
	l4 := 0
	if s.l3 == L3IPv4 || s.l3 == L3IPv6 {
		l4 = s.l4Len()
	}
	ipLen := l3 + l4 + len(s.payload)
	b := make([]byte, l2+ipLen+s.pad)

	et := s.etherType
	if et == 0 {
		et = map[L3Type]uint16{L3IPv4: etherTypeIPv4, L3IPv6: etherTypeIPv6, L3ARP: etherTypeARP}[s.l3]
	}
	eth := &header.EthernetFields{SrcAddr: pkSrcMAC, DstAddr: pkDstMAC, Type: tcpip.NetworkProtocolNumber(et)}
	if s.vlanType != 0 {
		// gVisor has no VLAN encoder: encode the outer EtherType as the
		// TPID, then the tag.
		eth.Type = tcpip.NetworkProtocolNumber(s.vlanType)
		binary.BigEndian.PutUint16(b[14:], s.tci)
		binary.BigEndian.PutUint16(b[16:], et)
	}
	header.Ethernet(b).Encode(eth)

	ip := b[l2 : l2+ipLen]
	seg := ip[l3:]
	copy(seg[l4:], s.payload)
	var src, dst tcpip.Address
	switch s.l3 {
	case L3ARP:
		a := header.ARP(ip)
		a.SetIPv4OverEthernet()
		a.SetOp(header.ARPRequest)
		copy(a.HardwareAddressSender(), pkSrcMAC)
		copy(a.ProtocolAddressSender(), pkSrc4.AsSlice())
		copy(a.ProtocolAddressTarget(), pkDst4.AsSlice())
		return b
	case L3IPv4:
		src, dst = pkSrc4, pkDst4
		header.IPv4(ip).Encode(&header.IPv4Fields{
			TotalLength:    uint16(ipLen),
			ID:             s.ipID,
			Flags:          s.ipFlags,
			FragmentOffset: s.fragOff,
			TTL:            64,
			Protocol:       s.proto,
			SrcAddr:        src,
			DstAddr:        dst,
			Options:        s.ipv4Opts,
		})
	case L3IPv6:
		src, dst = pkSrc6, pkDst6
		header.IPv6(ip).Encode(&header.IPv6Fields{
			PayloadLength:     uint16(ipLen - header.IPv6MinimumSize),
			TransportProtocol: tcpip.TransportProtocolNumber(s.proto),
			HopLimit:          64,
			SrcAddr:           src,
			DstAddr:           dst,
			ExtensionHeaders:  ext,
		})
		// Rename the extension headers to s.ext, keeping their layout.
		if len(s.ext) > 0 {
			header.IPv6(ip).SetNextHeader(s.ext[0])
		}
		off := header.IPv6MinimumSize
		for i := range s.ext {
			next := s.proto
			if i+1 < len(s.ext) {
				next = s.ext[i+1]
			}
			ip[off] = next
			if s.ext[i] == protoFragment {
				off += header.IPv6FragmentHeaderSize
			} else {
				off += (int(ip[off+1]) + 1) * 8
			}
		}
	default:
		copy(b[l2:], s.payload)
		return b
	}

	pseudo := header.PseudoHeaderChecksum(tcpip.TransportProtocolNumber(s.proto), src, dst, uint16(len(seg)))
	full := func(initial uint16) uint16 { return ^checksum.Checksum(seg, initial) }
	switch {
	case s.proto == protoTCP:
		opts := seg[header.TCPMinimumSize:l4]
		if s.tcpTS {
			n := header.EncodeNOP(opts)
			n += header.EncodeNOP(opts[n:])
			header.EncodeTSOption(0x11223344, 0x55667788, opts[n:])
		}
		t := header.TCP(seg)
		t.Encode(&header.TCPFields{
			SrcPort:    40000,
			DstPort:    80,
			SeqNum:     s.seq,
			AckNum:     s.ack,
			DataOffset: uint8(l4),
			Flags:      s.tcpFlags,
			WindowSize: 501,
		})
		switch s.csum {
		case pkCsumFull:
			t.SetChecksum(full(pseudo))
		case pkCsumPartial:
			t.SetChecksum(pseudo)
		}
	case s.proto == protoUDP:
		u := header.UDP(seg)
		u.Encode(&header.UDPFields{SrcPort: 5353, DstPort: 4789, Length: uint16(len(seg))})
		switch s.csum {
		case pkCsumFull:
			c := full(pseudo)
			if c == 0 {
				c = 0xffff
			}
			u.SetChecksum(c)
		case pkCsumPartial:
			u.SetChecksum(pseudo)
		}
	case s.proto == protoICMPv4 && s.l3 == L3IPv4:
		m := header.ICMPv4(seg)
		m.SetType(header.ICMPv4Echo)
		m.SetIdent(0x1234)
		m.SetSequence(7)
		if s.csum == pkCsumFull {
			m.SetChecksum(full(0))
		}
	case s.proto == protoICMPv6 && s.l3 == L3IPv6:
		m := header.ICMPv6(seg)
		m.SetType(header.ICMPv6EchoRequest)
		m.SetIdent(0x1234)
		m.SetSequence(7)
		if s.csum == pkCsumFull {
			m.SetChecksum(full(pseudo))
		}
	}
	if s.l3 == L3IPv4 {
		h := header.IPv4(ip)
		h.SetChecksum(^h.CalculateChecksum())
	}
	return b
}

// pkIPv4 returns the IPv4 header of a frame without a VLAN tag.
func pkIPv4(b []byte) header.IPv4 { return header.IPv4(b[header.EthernetMinimumSize:]) }

// pkIPv6 returns the IPv6 header of a frame without a VLAN tag.
func pkIPv6(b []byte) header.IPv6 { return header.IPv6(b[header.EthernetMinimumSize:]) }

// pkFixIPv4Csum recomputes the IPv4 header checksum of a frame without a
// VLAN tag after a test changed the header.
func pkFixIPv4Csum(b []byte) {
	h := pkIPv4(b)
	h.SetChecksum(0)
	h.SetChecksum(^h.CalculateChecksum())
}

func TestParseFrameGood(t *testing.T) {
	const (
		v4  = header.IPv4MinimumSize
		v6  = header.IPv6MinimumSize
		tcp = header.TCPMinimumSize
		udp = header.UDPMinimumSize
	)
	tests := []struct {
		name string
		spec pkSpec
		want FrameInfo
	}{
		{
			name: "ipv4 tcp",
			spec: pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagAck, payload: pkPayload(100)},
			want: FrameInfo{EtherType: etherTypeIPv4, L2Len: 14, L3: L3IPv4, L3Len: v4, IPLen: v4 + tcp + 100, L4: L4TCP, L4Proto: protoTCP, L4Len: tcp},
		},
		{
			name: "ipv4 tcp options",
			spec: pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, payload: pkPayload(1)},
			want: FrameInfo{EtherType: etherTypeIPv4, L2Len: 14, L3: L3IPv4, L3Len: v4, IPLen: v4 + tcp + 12 + 1, L4: L4TCP, L4Proto: protoTCP, L4Len: tcp + 12},
		},
		{
			name: "ipv4 options udp",
			spec: pkSpec{l3: L3IPv4, proto: protoUDP, ipv4Opts: header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}, payload: pkPayload(33)},
			want: FrameInfo{EtherType: etherTypeIPv4, L2Len: 14, L3: L3IPv4, L3Len: v4 + 4, IPLen: v4 + 4 + udp + 33, L4: L4UDP, L4Proto: protoUDP, L4Len: udp},
		},
		{
			name: "ipv4 udp with ethernet padding",
			spec: pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(2), pad: 16},
			want: FrameInfo{EtherType: etherTypeIPv4, L2Len: 14, L3: L3IPv4, L3Len: v4, IPLen: v4 + udp + 2, L4: L4UDP, L4Proto: protoUDP, L4Len: udp},
		},
		{
			name: "ipv4 icmp",
			spec: pkSpec{l3: L3IPv4, proto: protoICMPv4, payload: pkPayload(56)},
			want: FrameInfo{EtherType: etherTypeIPv4, L2Len: 14, L3: L3IPv4, L3Len: v4, IPLen: v4 + 8 + 56, L4: L4ICMP, L4Proto: protoICMPv4, L4Len: 8},
		},
		{
			name: "ipv4 gre is other",
			spec: pkSpec{l3: L3IPv4, proto: 47, payload: pkPayload(24)},
			want: FrameInfo{EtherType: etherTypeIPv4, L2Len: 14, L3: L3IPv4, L3Len: v4, IPLen: v4 + 24, L4: L4Other, L4Proto: 47},
		},
		{
			name: "ipv4 first fragment",
			spec: pkSpec{l3: L3IPv4, proto: protoUDP, ipFlags: header.IPv4FlagMoreFragments, payload: pkPayload(64)},
			want: FrameInfo{EtherType: etherTypeIPv4, L2Len: 14, L3: L3IPv4, L3Len: v4, IPLen: v4 + udp + 64, Fragment: true, L4: L4Other, L4Proto: protoUDP},
		},
		{
			name: "ipv4 last fragment",
			spec: pkSpec{l3: L3IPv4, proto: 47, fragOff: 1480, payload: pkPayload(64)},
			want: FrameInfo{EtherType: etherTypeIPv4, L2Len: 14, L3: L3IPv4, L3Len: v4, IPLen: v4 + 64, Fragment: true, L4: L4Other, L4Proto: 47},
		},
		{
			name: "ipv4 dont fragment is no fragment",
			spec: pkSpec{l3: L3IPv4, proto: protoTCP, ipFlags: header.IPv4FlagDontFragment},
			want: FrameInfo{EtherType: etherTypeIPv4, L2Len: 14, L3: L3IPv4, L3Len: v4, IPLen: v4 + tcp, L4: L4TCP, L4Proto: protoTCP, L4Len: tcp},
		},
		{
			name: "ipv6 tcp",
			spec: pkSpec{l3: L3IPv6, proto: protoTCP, tcpTS: true, payload: pkPayload(1000)},
			want: FrameInfo{EtherType: etherTypeIPv6, L2Len: 14, L3: L3IPv6, L3Len: v6, IPLen: v6 + tcp + 12 + 1000, L4: L4TCP, L4Proto: protoTCP, L4Len: tcp + 12},
		},
		{
			name: "ipv6 udp",
			spec: pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(9)},
			want: FrameInfo{EtherType: etherTypeIPv6, L2Len: 14, L3: L3IPv6, L3Len: v6, IPLen: v6 + udp + 9, L4: L4UDP, L4Proto: protoUDP, L4Len: udp},
		},
		{
			name: "ipv6 icmpv6",
			spec: pkSpec{l3: L3IPv6, proto: protoICMPv6, payload: pkPayload(8)},
			want: FrameInfo{EtherType: etherTypeIPv6, L2Len: 14, L3: L3IPv6, L3Len: v6, IPLen: v6 + 8 + 8, L4: L4ICMP, L4Proto: protoICMPv6, L4Len: 4},
		},
		{
			name: "ipv6 icmpv4 is other",
			spec: pkSpec{l3: L3IPv6, proto: protoICMPv4, payload: pkPayload(8)},
			want: FrameInfo{EtherType: etherTypeIPv6, L2Len: 14, L3: L3IPv6, L3Len: v6, IPLen: v6 + 8, L4: L4Other, L4Proto: protoICMPv4},
		},
		{
			name: "ipv4 icmpv6 is other",
			spec: pkSpec{l3: L3IPv4, proto: protoICMPv6, payload: pkPayload(8)},
			want: FrameInfo{EtherType: etherTypeIPv4, L2Len: 14, L3: L3IPv4, L3Len: v4, IPLen: v4 + 8, L4: L4Other, L4Proto: protoICMPv6},
		},
		{
			name: "ipv6 hop-by-hop routing destination options tcp",
			spec: pkSpec{l3: L3IPv6, ext: []uint8{protoHopByHop, protoRouting, protoDestOpts}, proto: protoTCP, payload: pkPayload(10)},
			want: FrameInfo{EtherType: etherTypeIPv6, L2Len: 14, L3: L3IPv6, L3Len: v6 + 24, IPLen: v6 + 24 + tcp + 10, L4: L4TCP, L4Proto: protoTCP, L4Len: tcp},
		},
		{
			name: "ipv6 destination options udp",
			spec: pkSpec{l3: L3IPv6, ext: []uint8{protoDestOpts}, proto: protoUDP},
			want: FrameInfo{EtherType: etherTypeIPv6, L2Len: 14, L3: L3IPv6, L3Len: v6 + 8, IPLen: v6 + 8 + udp, L4: L4UDP, L4Proto: protoUDP, L4Len: udp},
		},
		{
			name: "ipv6 eight extension headers",
			spec: pkSpec{l3: L3IPv6, ext: []uint8{0, 60, 60, 60, 43, 60, 60, 60}, proto: protoUDP},
			want: FrameInfo{EtherType: etherTypeIPv6, L2Len: 14, L3: L3IPv6, L3Len: v6 + 64, IPLen: v6 + 64 + udp, L4: L4UDP, L4Proto: protoUDP, L4Len: udp},
		},
		{
			name: "ipv6 fragment",
			spec: pkSpec{l3: L3IPv6, ext: []uint8{protoHopByHop, protoFragment}, ipFlags: header.IPv4FlagMoreFragments, proto: protoTCP, payload: pkPayload(40)},
			want: FrameInfo{EtherType: etherTypeIPv6, L2Len: 14, L3: L3IPv6, L3Len: v6 + 16, IPLen: v6 + 16 + tcp + 40, Fragment: true, L4: L4Other, L4Proto: protoTCP},
		},
		{
			name: "ipv6 atomic fragment",
			spec: pkSpec{l3: L3IPv6, ext: []uint8{protoFragment}, proto: protoUDP, payload: pkPayload(4)},
			want: FrameInfo{EtherType: etherTypeIPv6, L2Len: 14, L3: L3IPv6, L3Len: v6 + 8, IPLen: v6 + 8 + udp + 4, Fragment: true, L4: L4Other, L4Proto: protoUDP},
		},
		{
			name: "ipv6 no next header with payload length 0",
			spec: pkSpec{l3: L3IPv6, proto: 59, pad: 6},
			want: FrameInfo{EtherType: etherTypeIPv6, L2Len: 14, L3: L3IPv6, L3Len: v6, IPLen: v6, L4: L4Other, L4Proto: 59},
		},
		{
			name: "vlan ipv4 tcp",
			spec: pkSpec{vlanType: etherTypeVLAN, tci: 0x2064, l3: L3IPv4, proto: protoTCP, payload: pkPayload(3)},
			want: FrameInfo{EtherType: etherTypeIPv4, VLAN: true, VLANTCI: 0x2064, L2Len: 18, L3: L3IPv4, L3Len: v4, IPLen: v4 + tcp + 3, L4: L4TCP, L4Proto: protoTCP, L4Len: tcp},
		},
		{
			name: "qinq outer tag ipv6 udp",
			spec: pkSpec{vlanType: etherTypeQinQ, tci: 0x0fff, l3: L3IPv6, proto: protoUDP},
			want: FrameInfo{EtherType: etherTypeIPv6, VLAN: true, VLANTCI: 0x0fff, L2Len: 18, L3: L3IPv6, L3Len: v6, IPLen: v6 + udp, L4: L4UDP, L4Proto: protoUDP, L4Len: udp},
		},
		{
			name: "arp",
			spec: pkSpec{l3: L3ARP, pad: 18},
			want: FrameInfo{EtherType: etherTypeARP, L2Len: 14, L3: L3ARP, L3Len: 28, IPLen: 28},
		},
		{
			name: "vlan arp",
			spec: pkSpec{vlanType: etherTypeVLAN, tci: 5, l3: L3ARP},
			want: FrameInfo{EtherType: etherTypeARP, VLAN: true, VLANTCI: 5, L2Len: 18, L3: L3ARP, L3Len: 28, IPLen: 28},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame := tt.spec.build()
			fi := FrameInfo{L4Len: 99, Fragment: true} // stale values must be cleared
			if got := ParseFrame(frame, &fi); got != DropNone {
				t.Fatalf("ParseFrame: got %v, want %v", got, DropNone)
			}
			if fi != tt.want {
				t.Errorf("FrameInfo:\ngot  %+v\nwant %+v", fi, tt.want)
			}
			if got, want := fi.HeaderLen(), tt.want.L2Len+tt.want.L3Len+tt.want.L4Len; got != want {
				t.Errorf("HeaderLen: got %d, want %d", got, want)
			}
		})
	}
}

func TestParseFrameDrop(t *testing.T) {
	var (
		tcp4 = pkSpec{l3: L3IPv4, proto: protoTCP, payload: pkPayload(20)}
		udp4 = pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(20)}
		tcp6 = pkSpec{l3: L3IPv6, proto: protoTCP, payload: pkPayload(20)}
		udp6 = pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(20)}
	)
	// cut truncates the frame to n bytes.
	cut := func(n int) func([]byte) []byte {
		return func(b []byte) []byte { return b[:n] }
	}
	// ipv4Len sets the IPv4 total length (and fixes the header checksum).
	ipv4Len := func(n uint16) func([]byte) []byte {
		return func(b []byte) []byte {
			pkIPv4(b).SetTotalLength(n)
			pkFixIPv4Csum(b)
			return b
		}
	}
	// ipv6Len sets the IPv6 payload length.
	ipv6Len := func(n uint16) func([]byte) []byte {
		return func(b []byte) []byte {
			pkIPv6(b).SetPayloadLength(n)
			return b
		}
	}
	tests := []struct {
		name string
		spec pkSpec
		mut  func([]byte) []byte
		want Drop
	}{
		{name: "empty", spec: tcp4, mut: cut(0), want: DropShortEther},
		{name: "short ethernet", spec: tcp4, mut: cut(13), want: DropShortEther},
		{name: "short vlan tag", spec: pkSpec{vlanType: etherTypeVLAN, l3: L3IPv4, proto: protoTCP}, mut: cut(17), want: DropShortEther},
		{name: "lldp", spec: pkSpec{etherType: 0x88cc, payload: pkPayload(46)}, want: DropUnknownEtherType},
		{name: "802.3 length field", spec: pkSpec{etherType: 46, payload: pkPayload(46)}, want: DropUnknownEtherType},
		{name: "second vlan tag", spec: pkSpec{vlanType: etherTypeQinQ, etherType: etherTypeVLAN, payload: pkPayload(46)}, want: DropUnknownEtherType},
		{name: "short arp", spec: pkSpec{l3: L3ARP}, mut: cut(14 + 27), want: DropShortARP},
		{name: "short vlan arp", spec: pkSpec{vlanType: etherTypeVLAN, l3: L3ARP}, mut: cut(18 + 27), want: DropShortARP},
		{name: "short ipv4", spec: tcp4, mut: cut(14 + 19), want: DropShortIP},
		{name: "short ipv6", spec: tcp6, mut: cut(14 + 39), want: DropShortIP},
		{name: "ipv6 in ipv4 ethertype", spec: pkSpec{l3: L3IPv6, etherType: etherTypeIPv4, proto: protoTCP}, want: DropBadIPVersion},
		{name: "ipv4 in ipv6 ethertype", spec: pkSpec{l3: L3IPv4, etherType: etherTypeIPv6, proto: protoTCP, payload: pkPayload(20)}, want: DropBadIPVersion},
		{name: "ipv4 ihl 4", spec: tcp4, mut: func(b []byte) []byte { pkIPv4(b).SetHeaderLength(16); return b }, want: DropBadIHL},
		{name: "ipv4 ihl 0", spec: tcp4, mut: func(b []byte) []byte { pkIPv4(b).SetHeaderLength(0); return b }, want: DropBadIHL},
		{name: "ipv4 ihl beyond frame", spec: pkSpec{l3: L3IPv4, proto: protoTCP}, mut: func(b []byte) []byte { pkIPv4(b).SetHeaderLength(60); return b }, want: DropBadIHL},
		{name: "ipv4 total length below ihl", spec: tcp4, mut: ipv4Len(19), want: DropBadIPLen},
		{name: "ipv4 total length beyond frame", spec: tcp4, mut: ipv4Len(20 + 20 + 21), want: DropBadIPLen},
		{name: "ipv4 truncated frame", spec: tcp4, mut: cut(14 + 20 + 20 + 19), want: DropBadIPLen},
		{name: "ipv6 payload length beyond frame", spec: tcp6, mut: ipv6Len(20 + 21), want: DropBadIPLen},
		{name: "ipv6 jumbogram", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoHopByHop}, proto: protoTCP, payload: pkPayload(20)}, mut: ipv6Len(0), want: DropBadIPLen},
		{name: "ipv6 extension header beyond payload length", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoDestOpts}, proto: 59}, mut: ipv6Len(7), want: DropBadIPv6ExtHdr},
		{name: "ipv6 extension header length beyond payload", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoRouting}, proto: 59, payload: pkPayload(8)}, mut: func(b []byte) []byte { b[14+40+1] = 2; return b }, want: DropBadIPv6ExtHdr},
		{name: "ipv6 fragment header truncated", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoDestOpts, protoFragment}, proto: protoUDP}, mut: ipv6Len(8 + 7), want: DropBadIPv6ExtHdr},
		{name: "ipv6 nine extension headers", spec: pkSpec{l3: L3IPv6, ext: []uint8{0, 60, 60, 60, 43, 60, 60, 60, 60}, proto: protoUDP}, want: DropBadIPv6ExtHdr},
		{name: "ipv6 fragment after eight headers", spec: pkSpec{l3: L3IPv6, ext: []uint8{0, 60, 60, 60, 43, 60, 60, 60, 44}, proto: protoUDP}, want: DropBadIPv6ExtHdr},
		{name: "ipv6 hop-by-hop not first", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoDestOpts, protoHopByHop}, proto: protoUDP}, want: DropBadIPv6ExtHdr},
		{name: "ipv4 short tcp", spec: tcp4, mut: ipv4Len(20 + 19), want: DropShortL4},
		{name: "ipv6 short tcp", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoHopByHop}, proto: protoTCP}, mut: ipv6Len(8 + 19), want: DropShortL4},
		{name: "ipv4 short udp", spec: udp4, mut: ipv4Len(20 + 7), want: DropShortL4},
		{name: "ipv6 short udp", spec: udp6, mut: ipv6Len(7), want: DropShortL4},
		{name: "short icmpv4", spec: pkSpec{l3: L3IPv4, proto: protoICMPv4}, mut: ipv4Len(20 + 7), want: DropShortL4},
		{name: "short icmpv6", spec: pkSpec{l3: L3IPv6, proto: protoICMPv6}, mut: ipv6Len(3), want: DropShortL4},
		{name: "tcp data offset 4", spec: tcp4, mut: func(b []byte) []byte { header.TCP(b[14+20:]).SetDataOffset(16); return b }, want: DropBadTCPOff},
		{name: "tcp data offset 0", spec: tcp6, mut: func(b []byte) []byte { header.TCP(b[14+40:]).SetDataOffset(0); return b }, want: DropBadTCPOff},
		{name: "tcp data offset beyond ip packet", spec: pkSpec{l3: L3IPv4, proto: protoTCP, payload: pkPayload(39), pad: 10}, mut: func(b []byte) []byte { header.TCP(b[14+20:]).SetDataOffset(60); return b }, want: DropBadTCPOff},
		{name: "udp length 7", spec: udp4, mut: func(b []byte) []byte { header.UDP(b[14+20:]).SetLength(7); return b }, want: DropBadUDPLen},
		{name: "udp length short of ip payload", spec: udp6, mut: func(b []byte) []byte { header.UDP(b[14+40:]).SetLength(8 + 19); return b }, want: DropBadUDPLen},
		{name: "udp length beyond ip payload", spec: pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(20), pad: 10}, mut: func(b []byte) []byte { header.UDP(b[14+20:]).SetLength(8 + 21); return b }, want: DropBadUDPLen},
	}
	seen := make(map[Drop]bool)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame := tt.spec.build()
			if tt.mut != nil {
				frame = tt.mut(frame)
			}
			var fi FrameInfo
			if got := ParseFrame(frame, &fi); got != tt.want {
				t.Errorf("ParseFrame: got %v, want %v (%+v)", got, tt.want, fi)
			}
		})
		seen[tt.want] = true
	}
	for d := DropShortEther; d <= DropBadUDPLen; d++ {
		if !seen[d] {
			t.Errorf("no case for %v", d)
		}
	}
}

func TestParseFrameAllocs(t *testing.T) {
	frames := [][]byte{
		(&pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, payload: pkPayload(1448)}).build(),
		(&pkSpec{vlanType: etherTypeVLAN, l3: L3IPv6, ext: []uint8{protoHopByHop, protoDestOpts}, proto: protoUDP, payload: pkPayload(100)}).build(),
		(&pkSpec{l3: L3ARP}).build(),
	}
	var fi FrameInfo
	for _, f := range frames {
		if got := testing.AllocsPerRun(100, func() { ParseFrame(f, &fi) }); got != 0 {
			t.Errorf("ParseFrame allocations: got %v, want 0", got)
		}
	}
}

func TestDropString(t *testing.T) {
	tests := []struct {
		d    Drop
		want string
	}{
		{DropNone, "none"},
		{DropShortEther, "rx_drop_short_ether"},
		{DropUnknownEtherType, "rx_drop_unknown_ethertype"},
		{DropShortARP, "rx_drop_short_arp"},
		{DropShortIP, "rx_drop_short_ip"},
		{DropBadIPVersion, "rx_drop_bad_ip_version"},
		{DropBadIHL, "rx_drop_bad_ihl"},
		{DropBadIPLen, "rx_drop_bad_ip_len"},
		{DropBadIPv6ExtHdr, "rx_drop_bad_ipv6_exthdr"},
		{DropShortL4, "rx_drop_short_l4"},
		{DropBadTCPOff, "rx_drop_bad_tcp_off"},
		{DropBadUDPLen, "rx_drop_bad_udp_len"},
		{DropBadIPCsum, "rx_drop_bad_ip_csum"},
		{DropBadL4Csum, "rx_drop_bad_l4_csum"},
		{DropBadVnetHdr, "rx_drop_bad_vnet_hdr"},
		{DropBadGSO, "rx_drop_bad_gso"},
		{DropOtherHost, "rx_drop_other_host"},
		{DropMulticast, "rx_drop_multicast"},
		{DropNoBuffer, "rx_drop_no_buffer"},
		{DropTooBig, "rx_drop_too_big"},
		{DropTunnelProto, "rx_drop_tunnel_proto"},
		{DropBadTunnel, "rx_drop_bad_tunnel"},
		{DropOutOfBuffer, "rx_drop_out_of_buffer"},
		{NumDrops, "rx_drop_unknown_23"},
		{255, "rx_drop_unknown_255"},
	}
	for _, tt := range tests {
		if got := tt.d.String(); got != tt.want {
			t.Errorf("Drop(%d).String(): got %q, want %q", uint8(tt.d), got, tt.want)
		}
	}
	if int(NumDrops) != len(tests)-2 {
		t.Errorf("NumDrops: got %d, want %d", NumDrops, len(tests)-2)
	}
	names := make(map[string]Drop)
	for d := DropShortEther; d < NumDrops; d++ {
		s := d.String()
		if !strings.HasPrefix(s, "rx_drop_") {
			t.Errorf("Drop(%d).String(): got %q, want prefix rx_drop_", uint8(d), s)
		}
		if prev, ok := names[s]; ok {
			t.Errorf("Drop(%d) and Drop(%d) share name %q", uint8(prev), uint8(d), s)
		}
		names[s] = d
	}
}

// BenchmarkParseFrame parses each kind of frame ParseFrame knows (the fuzz
// seeds: TCP, UDP, ICMP over IPv4 and IPv6, options, extension headers,
// fragments, VLAN tags, ARP); ns/op is per frame.
func BenchmarkParseFrame(b *testing.B) {
	seeds := pkFuzzSeeds()
	b.ReportAllocs()
	var fi FrameInfo
	i := 0
	for b.Loop() {
		if ParseFrame(seeds[i], &fi) != DropNone {
			b.Fatal("seed dropped")
		}
		i++
		if i == len(seeds) {
			i = 0
		}
	}
}
