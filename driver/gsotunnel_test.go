package driver

import (
	"bytes"
	"encoding/binary"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// UDP tunnel test frames: an outer Ethernet, IPv4 or IPv6 and UDP header, a
// tunnel header (VXLAN by default) and an inner frame built by pkSpec.build,
// encoded from scratch with gVisor's encoders by pkVxSpec.wrap.

var (
	pkVxSrcMAC = pkMAC("02:00:00:00:01:01")
	pkVxDstMAC = pkMAC("02:00:00:00:01:02")
	pkVxSrc4   = tcpip.AddrFrom4([4]byte{203, 0, 113, 1})
	pkVxDst4   = tcpip.AddrFrom4([4]byte{203, 0, 113, 2})
	pkVxSrc6   = tcpip.AddrFrom16([16]byte{0xfd, 0x77, 15: 1})
	pkVxDst6   = tcpip.AddrFrom16([16]byte{0xfd, 0x77, 15: 3})
)

// pkVXLANHdr is the VXLAN header pkVxSpec uses by default: flags I, VNI 42.
var pkVXLANHdr = []byte{0x08, 0, 0, 0, 0, 0, 42, 0}

// pkVxSpec describes a UDP tunnel frame.
type pkVxSpec struct {
	outer      L3Type // L3IPv4 or L3IPv6
	outerExt   bool   // outer IPv6: an 8-byte destination options header
	outerID    uint16 // outer IPv4 ID
	csum       bool   // UDP_TUNNEL_CSUM: the outer UDP header has a checksum
	encap      []byte // tunnel header after the outer UDP header; nil: pkVXLANHdr
	noInnerEth bool   // the inner IP packet follows the tunnel header directly (VXLAN-GPE)
	pad        int    // Ethernet padding after the outer IP packet (super-frame only)
	inner      pkSpec // the inner frame
}

// offsets returns the offsets of the outer UDP header and the inner IP header
// in the frames s wraps.
func (s *pkVxSpec) offsets() (oth, nh int) {
	oth = header.EthernetMinimumSize + header.IPv4MinimumSize
	if s.outer == L3IPv6 {
		oth = header.EthernetMinimumSize + header.IPv6MinimumSize
		if s.outerExt {
			oth += 8
		}
	}
	encap := s.encap
	if encap == nil {
		encap = pkVXLANHdr
	}
	nh = oth + header.UDPMinimumSize + len(encap)
	if !s.noInnerEth {
		nh += header.EthernetMinimumSize
	}
	return oth, nh
}

// wrap encodes the tunnel frame around the inner Ethernet frame innerFrame,
// with outer IPv4 ID id, the outer UDP checksum per ocsum and pad bytes of
// Ethernet padding.
func (s *pkVxSpec) wrap(innerFrame []byte, id uint16, ocsum pkCsum, pad int) []byte {
	inner := innerFrame
	if s.noInnerEth {
		inner = innerFrame[header.EthernetMinimumSize:]
	}
	encap := s.encap
	if encap == nil {
		encap = pkVXLANHdr
	}
	oth, _ := s.offsets()
	udpLen := header.UDPMinimumSize + len(encap) + len(inner)
	b := make([]byte, oth+udpLen+pad)
	et := tcpip.NetworkProtocolNumber(etherTypeIPv4)
	src, dst := pkVxSrc4, pkVxDst4
	if s.outer == L3IPv6 {
		et = etherTypeIPv6
		src, dst = pkVxSrc6, pkVxDst6
	}
	header.Ethernet(b).Encode(&header.EthernetFields{SrcAddr: pkVxSrcMAC, DstAddr: pkVxDstMAC, Type: et})
	ip := b[header.EthernetMinimumSize:]
	if s.outer == L3IPv4 {
		h := header.IPv4(ip)
		h.Encode(&header.IPv4Fields{
			TotalLength: uint16(header.IPv4MinimumSize + udpLen),
			ID:          id,
			Flags:       header.IPv4FlagDontFragment,
			TTL:         64,
			Protocol:    protoUDP,
			SrcAddr:     src,
			DstAddr:     dst,
		})
		h.SetChecksum(^h.CalculateChecksum())
	} else {
		var ser header.IPv6ExtHdrSerializer
		if s.outerExt {
			ser = header.IPv6ExtHdrSerializer{header.IPv6SerializableHopByHopExtHdr{&header.IPv6RouterAlertOption{}}}
		}
		header.IPv6(ip).Encode(&header.IPv6Fields{
			PayloadLength:     uint16(oth - header.EthernetMinimumSize - header.IPv6MinimumSize + udpLen),
			TransportProtocol: protoUDP,
			HopLimit:          64,
			SrcAddr:           src,
			DstAddr:           dst,
			ExtensionHeaders:  ser,
		})
		if s.outerExt {
			ip[6] = protoDestOpts // same layout as the hop-by-hop header
		}
	}
	udp := b[oth : oth+udpLen]
	header.UDP(udp).Encode(&header.UDPFields{SrcPort: 51234, DstPort: 4789, Length: uint16(udpLen)})
	copy(udp[header.UDPMinimumSize:], encap)
	copy(udp[header.UDPMinimumSize+len(encap):], inner)
	pseudo := header.PseudoHeaderChecksum(header.UDPProtocolNumber, src, dst, uint16(udpLen))
	switch ocsum {
	case pkCsumFull:
		c := ^checksum.Checksum(udp, pseudo)
		if c == 0 {
			c = 0xffff
		}
		header.UDP(udp).SetChecksum(c)
	case pkCsumPartial:
		header.UDP(udp).SetChecksum(pseudo)
	}
	return b
}

// gsoType returns the virtio-net GSO type of s's super-frame with inner GSO
// type inner.
func (s *pkVxSpec) gsoType(inner uint8) uint8 {
	if s.outer == L3IPv6 {
		return inner | VirtioNetHdrGSOUDPTunnelIPv6
	}
	return inner | VirtioNetHdrGSOUDPTunnelIPv4
}

// pkVxSuperFrame builds the super-frame s describes as a TAP delivers it (the
// inner TCP checksum and, with s.csum, the outer UDP checksum holding their
// pseudo-header partial sums) and its virtio-net header.
func pkVxSuperFrame(t testing.TB, s pkVxSpec, inner uint8, gsoSize uint16) (VirtioNetHdrTunnel, []byte) {
	t.Helper()
	spec := s.inner
	spec.csum = pkCsumPartial
	innerFrame := spec.build()
	var ifi FrameInfo
	if d := ParseFrame(innerFrame, &ifi); d != DropNone {
		t.Fatalf("ParseFrame(inner frame): got %v, want %v", d, DropNone)
	}
	ocsum := pkCsumZero
	flags := uint8(VirtioNetHdrFNeedsCsum)
	if s.csum {
		ocsum = pkCsumPartial
		flags |= VirtioNetHdrFUDPTunnelCsum
	}
	frame := s.wrap(innerFrame, s.outerID, ocsum, s.pad)
	oth, nh := s.offsets()
	ith := nh + ifi.L3Len
	csumOff := uint16(header.TCPChecksumOffset)
	if spec.proto == protoUDP {
		csumOff = pkUDPChecksumOffset
	}
	return VirtioNetHdrTunnel{
		VirtioNetHdr: VirtioNetHdr{
			Flags:      flags,
			GSOType:    s.gsoType(inner),
			HdrLen:     uint16(ith + ifi.L4Len),
			GSOSize:    gsoSize,
			CsumStart:  uint16(ith),
			CsumOffset: csumOff,
		},
		OuterTHOffset: uint16(oth),
		InnerNHOffset: uint16(nh),
	}, frame
}

// pkVxWant builds segment i of n of s's super-frame cut at gso payload bytes
// from scratch: the inner frame by pkSpec.build with its own sequence
// number, flags, ID and payload, wrapped with its own outer ID, with full
// checksums when fill and partial ones (as SegmentTunnel writes them)
// otherwise.
func pkVxWant(s pkVxSpec, gso, i, n int, fill bool) []byte {
	spec := s.inner
	spec.seq += uint32(i * gso)
	spec.ipID += uint16(i)
	if i > 0 {
		spec.tcpFlags &^= header.TCPFlagCwr
	}
	if i < n-1 {
		spec.tcpFlags &^= header.TCPFlagFin | header.TCPFlagPsh
	}
	spec.payload = s.inner.payload[i*gso : min((i+1)*gso, len(s.inner.payload))]
	spec.pad = 0
	spec.csum = pkCsumPartial
	if fill {
		spec.csum = pkCsumFull
	}
	ocsum := pkCsumZero
	if s.csum {
		ocsum = spec.csum
	}
	return s.wrap(spec.build(), s.outerID+uint16(i), ocsum, 0)
}

// pkFirstDiff returns the first offset at which a and b differ, or -1.
func pkFirstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

func TestSegmentTunnel(t *testing.T) {
	tcp4 := func(n int) pkSpec {
		return pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh, seq: 1000, ack: 77, ipID: 0x1234, ipFlags: header.IPv4FlagDontFragment, payload: pkPayload(n)}
	}
	tcp6 := func(n int) pkSpec {
		return pkSpec{l3: L3IPv6, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh, seq: 0x7fffffff, ack: 5, payload: pkPayload(n)}
	}
	with := func(s pkSpec, f func(*pkSpec)) pkSpec { f(&s); return s }
	allFlags := header.TCPFlagAck | header.TCPFlagPsh | header.TCPFlagFin | header.TCPFlagCwr | header.TCPFlagEce | header.TCPFlagUrg
	tests := []struct {
		name     string
		spec     pkVxSpec
		inner    uint8 // inner GSO type
		gsoSize  uint16
		wantSegs int
	}{
		{
			// The layout measured on a TAP under a vxlan device over
			// IPv6: flags 0x9, gso_type 0x41, gso_size 1390.
			name:     "vxlan6 tcpv4 measured, even, seq and id wrap",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, inner: with(tcp4(45*1390), func(s *pkSpec) { s.seq, s.ipID = 0xfffff000, 0xfff0 })},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  1390,
			wantSegs: 45,
		},
		{
			name:     "vxlan6 tcpv4 64k uneven",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, inner: tcp4(64001)},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  1390,
			wantSegs: 47,
		},
		{
			name:     "vxlan4 tcpv4 no outer csum, id wrap",
			spec:     pkVxSpec{outer: L3IPv4, outerID: 0xfffe, inner: with(tcp4(5000), func(s *pkSpec) { s.ipID = 0xffff })},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  1448,
			wantSegs: 4,
		},
		{
			name:     "vxlan4 tcpv4 outer csum",
			spec:     pkVxSpec{outer: L3IPv4, outerID: 7, csum: true, inner: tcp4(4500)},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  1400,
			wantSegs: 4,
		},
		{
			name:     "vxlan4 tcpv6 outer csum, even",
			spec:     pkVxSpec{outer: L3IPv4, outerID: 300, csum: true, inner: tcp6(4000)},
			inner:    VirtioNetHdrGSOTCPv6,
			gsoSize:  1000,
			wantSegs: 4,
		},
		{
			name:     "vxlan6 tcpv6 zero outer csum (udp6zerocsumtx)",
			spec:     pkVxSpec{outer: L3IPv6, inner: tcp6(3001)},
			inner:    VirtioNetHdrGSOTCPv6,
			gsoSize:  1000,
			wantSegs: 4,
		},
		{
			name:     "vxlan6 tcpv6 outer csum",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, inner: tcp6(7777)},
			inner:    VirtioNetHdrGSOTCPv6,
			gsoSize:  1370,
			wantSegs: 6,
		},
		{
			name:     "one segment",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, inner: with(tcp4(500), func(s *pkSpec) { s.tcpFlags = allFlags })},
			inner:    VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOECN,
			gsoSize:  600, // at most len(frame)
			wantSegs: 1,
		},
		{
			name:     "payload exactly gso size",
			spec:     pkVxSpec{outer: L3IPv4, csum: true, inner: tcp4(1390)},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  1390,
			wantSegs: 1,
		},
		{
			name:     "empty payload",
			spec:     pkVxSpec{outer: L3IPv4, inner: with(tcp4(0), func(s *pkSpec) { s.tcpFlags = header.TCPFlagAck | header.TCPFlagFin })},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  100,
			wantSegs: 1,
		},
		{
			name:     "ecn cwr on the first only",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, inner: with(tcp4(3000), func(s *pkSpec) { s.tcpFlags = header.TCPFlagAck | header.TCPFlagCwr | header.TCPFlagEce })},
			inner:    VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOECN,
			gsoSize:  1000,
			wantSegs: 3,
		},
		{
			name:     "fin psh on the last only",
			spec:     pkVxSpec{outer: L3IPv4, csum: true, inner: with(tcp6(2500), func(s *pkSpec) { s.tcpFlags = allFlags })},
			inner:    VirtioNetHdrGSOTCPv6 | VirtioNetHdrGSOECN,
			gsoSize:  1000,
			wantSegs: 3,
		},
		{
			name: "outer ipv6 destination options, inner ipv4 options",
			spec: pkVxSpec{outer: L3IPv6, outerExt: true, csum: true, inner: with(tcp4(4000), func(s *pkSpec) {
				s.ipv4Opts = header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}
			})},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  1300,
			wantSegs: 4,
		},
		{
			name:     "inner ipv6 hop-by-hop",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, inner: with(tcp6(3000), func(s *pkSpec) { s.ext = []uint8{protoHopByHop} })},
			inner:    VirtioNetHdrGSOTCPv6,
			gsoSize:  1300,
			wantSegs: 3,
		},
		{
			name:     "no inner ethernet (vxlan-gpe)",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, encap: []byte{0x0c, 0, 0, 1, 0, 0, 9, 0}, noInnerEth: true, inner: tcp4(3500)},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  1200,
			wantSegs: 3,
		},
		{
			// 8+9+14 bytes from the outer UDP header to the inner IP
			// header: the payload sits at an odd offset in the outer
			// UDP message.
			name:     "odd tunnel header",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, encap: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, inner: tcp4(4001)},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  1000,
			wantSegs: 5,
		},
		{
			name:     "odd tunnel header ipv4",
			spec:     pkVxSpec{outer: L3IPv4, csum: true, encap: []byte{0xaa, 0xbb, 0xcc}, inner: tcp6(2999)},
			inner:    VirtioNetHdrGSOTCPv6,
			gsoSize:  999,
			wantSegs: 4,
		},
		{
			name:     "ethernet padding",
			spec:     pkVxSpec{outer: L3IPv4, csum: true, pad: 20, inner: tcp4(3000)},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  1448,
			wantSegs: 3,
		},
		{
			// A UDP_SEGMENT datagram through a vxlan device over IPv6,
			// as measured on this kernel's TAP: gso_type 0x45.
			name:     "vxlan6 udp4",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, inner: pkSpec{l3: L3IPv4, proto: protoUDP, ipID: 0xfffe, payload: pkPayload(30 * 1000)}},
			inner:    VirtioNetHdrGSOUDPL4,
			gsoSize:  1000,
			wantSegs: 30,
		},
		{
			name:     "vxlan6 udp6 uneven",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, inner: pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(5*1350 + 7)}},
			inner:    VirtioNetHdrGSOUDPL4,
			gsoSize:  1350,
			wantSegs: 6,
		},
		{
			name:     "gso size 1 limit",
			spec:     pkVxSpec{outer: L3IPv6, csum: true, inner: tcp4(maxGSOSegments)},
			inner:    VirtioNetHdrGSOTCPv4,
			gsoSize:  1,
			wantSegs: maxGSOSegments,
		},
	}
	for _, tt := range tests {
		for _, fill := range []bool{false, true} {
			name := tt.name + "/partial"
			if fill {
				name = tt.name + "/full"
			}
			t.Run(name, func(t *testing.T) {
				h, frame := pkVxSuperFrame(t, tt.spec, tt.inner, tt.gsoSize)
				orig := bytes.Clone(frame)
				s := Segmenter{FillChecksum: fill}
				var sink pkSegSink
				n, d := s.SegmentTunnel(&h, frame, &sink)
				if d != DropNone {
					t.Fatalf("SegmentTunnel: got drop %v, want %v", d, DropNone)
				}
				if n != tt.wantSegs {
					t.Errorf("SegmentTunnel: got %d segments, want %d", n, tt.wantSegs)
				}
				if len(sink.hdrs) != n {
					t.Fatalf("sink calls: got %d, want %d", len(sink.hdrs), n)
				}
				if !bytes.Equal(frame, orig) {
					t.Errorf("SegmentTunnel changed the super-frame")
				}
				pkVxCheckSegments(t, &tt.spec, &h, frame, &sink, fill)
			})
		}
	}
}

// pkVxCheckSegments checks the segments in sink, cut from the super-frame
// frame of spec with header h, byte by byte against segments built from
// scratch, and their checksums.
func pkVxCheckSegments(t *testing.T, spec *pkVxSpec, h *VirtioNetHdrTunnel, frame []byte, sink *pkSegSink, fill bool) {
	t.Helper()
	gso := int(h.GSOSize)
	n := len(sink.hdrs)
	nh := int(h.InnerNHOffset)
	hl := int(h.HdrLen)
	var joined []byte
	for i := range n {
		got := sink.frame(i)
		pl := sink.payloads[i]
		joined = append(joined, pl...)
		if len(sink.hdrs[i]) != hl {
			t.Errorf("segment %d: got %d header bytes, want %d", i, len(sink.hdrs[i]), hl)
		}
		if len(pl) > 0 && &pl[0] != &frame[hl+i*gso] {
			t.Errorf("segment %d: payload is not the super-frame's bytes at %d", i, hl+i*gso)
		}
		want := pkVxWant(*spec, gso, i, n, fill)
		if off := pkFirstDiff(got, want); off >= 0 {
			t.Errorf("segment %d of %d bytes: first difference at byte %d:\ngot  %x\nwant %x", i, len(got), off,
				got[max(off-8, 0):min(off+8, len(got))], want[max(off-8, 0):min(off+8, len(want))])
		}

		// The checksums, independently of the expected frame: with
		// partial ones, adding the sums a receiver adds (the inner
		// TCP message, then the outer UDP one over the completed inner
		// checksum) must give valid full ones.
		var ofi, ifi FrameInfo
		if d := ParseFrame(got, &ofi); d != DropNone {
			t.Fatalf("segment %d: ParseFrame: got %v, want %v", i, d, DropNone)
		}
		wantL4 := L4TCP
		if spec.inner.proto == protoUDP {
			wantL4 = L4UDP
		}
		if d := ParseL3Frame(got[nh:], &ifi); d != DropNone || ifi.L4 != wantL4 {
			t.Fatalf("segment %d: ParseL3Frame(inner): got %v, L4 %v, want %v, %v", i, d, ifi.L4, DropNone, wantL4)
		}
		if !fill {
			pkCompleteChecksum(got[nh:], &ifi)
			if spec.csum {
				pkCompleteChecksum(got, &ofi)
			}
		}
		if d := VerifyChecksums(got[nh:], &ifi, true); d != DropNone {
			t.Errorf("segment %d: inner VerifyChecksums: got %v, want %v", i, d, DropNone)
		}
		if d := VerifyChecksums(got, &ofi, spec.csum); d != DropNone {
			t.Errorf("segment %d: outer VerifyChecksums(l4 %v): got %v, want %v", i, spec.csum, d, DropNone)
		}
		if c := header.UDP(got[h.OuterTHOffset:]).Checksum(); !spec.csum && c != 0 {
			t.Errorf("segment %d: outer UDP checksum without UDP_TUNNEL_CSUM: got %#x, want 0", i, c)
		}
	}
	if want := spec.inner.payload; !bytes.Equal(joined, want) {
		t.Errorf("joined payloads: got %d bytes, want the super-frame's %d payload bytes", len(joined), len(want))
	}
}

// TestSegmentTunnelUDPZeroChecksum checks that a full outer UDP checksum that
// computes to 0 is sent as 0xffff.
func TestSegmentTunnelUDPZeroChecksum(t *testing.T) {
	for _, outer := range []L3Type{L3IPv4, L3IPv6} {
		t.Run(map[L3Type]string{L3IPv4: "ipv4", L3IPv6: "ipv6"}[outer], func(t *testing.T) {
			spec := pkVxSpec{outer: outer, csum: true, inner: pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagAck, payload: pkPayload(100)}}
			h, frame := pkVxSuperFrame(t, spec, VirtioNetHdrGSOTCPv4, 120)
			s := Segmenter{FillChecksum: true}
			var sink pkSegSink
			if _, d := s.SegmentTunnel(&h, frame, &sink); d != DropNone {
				t.Fatalf("SegmentTunnel: got %v, want %v", d, DropNone)
			}
			// Add the outer checksum to the VXLAN header's reserved
			// bytes 2-3, which no inner checksum covers: the UDP
			// message then sums to 0xffff and its checksum computes
			// to 0.
			oth := int(h.OuterTHOffset)
			c := header.UDP(sink.hdrs[0][oth:]).Checksum()
			binary.BigEndian.PutUint16(frame[oth+header.UDPMinimumSize+2:], c)

			sink = pkSegSink{}
			if _, d := s.SegmentTunnel(&h, frame, &sink); d != DropNone {
				t.Fatalf("SegmentTunnel: got %v, want %v", d, DropNone)
			}
			seg := sink.frame(0)
			if got := header.UDP(seg[oth:]).Checksum(); got != 0xffff {
				t.Errorf("outer UDP checksum: got %#x, want 0xffff", got)
			}
			var fi FrameInfo
			if d := ParseFrame(seg, &fi); d != DropNone {
				t.Fatalf("ParseFrame: got %v, want %v", d, DropNone)
			}
			if d := VerifyChecksums(seg, &fi, true); d != DropNone {
				t.Errorf("VerifyChecksums: got %v, want %v", d, DropNone)
			}
		})
	}
}

// pkVxBase is the super-frame TestSegmentTunnelDrop mutates.
func pkVxBase(outer, inner L3Type) pkVxSpec {
	return pkVxSpec{outer: outer, csum: true, inner: pkSpec{l3: inner, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck, payload: pkPayload(3000)}}
}

func TestSegmentTunnelDrop(t *testing.T) {
	var (
		v6v4 = pkVxBase(L3IPv6, L3IPv4)
		v6v6 = pkVxBase(L3IPv6, L3IPv6)
		v4v4 = pkVxBase(L3IPv4, L3IPv4)
	)
	innerIPv4 := func(f func(ip header.IPv4)) func(*VirtioNetHdrTunnel, []byte) []byte {
		return func(h *VirtioNetHdrTunnel, b []byte) []byte { f(header.IPv4(b[h.InnerNHOffset:])); return b }
	}
	tests := []struct {
		name  string
		spec  pkVxSpec
		inner uint8
		gso   uint16
		mutH  func(h *VirtioNetHdrTunnel, frameLen int)
		mutF  func(h *VirtioNetHdrTunnel, frame []byte) []byte
		want  Drop
	}{
		{name: "not a tunnel header", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) {
			h.GSOType, h.Flags = VirtioNetHdrGSOTCPv4, VirtioNetHdrFNeedsCsum
		}, want: DropBadGSO},
		{name: "no gso", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType, h.Flags = 0, 0 }, want: DropBadGSO},
		{name: "tunnel csum without tunnel", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType = VirtioNetHdrGSOTCPv4 }, want: DropBadVnetHdr},
		{name: "udp l4 in tunnel over a tcp packet", spec: v6v4, inner: VirtioNetHdrGSOUDPL4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.CsumOffset = pkUDPChecksumOffset }, want: DropBadGSO},
		{name: "ipv4 tunnel bit on ipv6 outer", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) {
			h.GSOType = VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOUDPTunnelIPv4
		}, want: DropBadGSO},
		{name: "ipv6 tunnel bit on ipv4 outer", spec: v4v4, mutH: func(h *VirtioNetHdrTunnel, _ int) {
			h.GSOType = VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOUDPTunnelIPv6
		}, want: DropBadVnetHdr},
		{name: "ipv6 tunnel bit on ipv4 outer with ipv6 offsets", spec: v4v4, mutH: func(h *VirtioNetHdrTunnel, _ int) {
			h.GSOType = VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOUDPTunnelIPv6
			h.OuterTHOffset += 20
		}, want: DropBadGSO},
		{name: "tcpv4 on inner ipv6", spec: v6v6, inner: VirtioNetHdrGSOTCPv4, want: DropBadGSO},
		{name: "tcpv6 on inner ipv4", spec: v6v4, inner: VirtioNetHdrGSOTCPv6, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.CsumStart += 20 }, want: DropBadGSO},
		{name: "outer_th not the udp header", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.OuterTHOffset += 2 }, want: DropBadGSO},
		{name: "outer_th before", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.OuterTHOffset -= 2 }, want: DropBadVnetHdr},
		{name: "inner_nh 2 early", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.InnerNHOffset -= 2 }, want: DropBadGSO},
		{name: "inner_nh 2 late", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.InnerNHOffset += 2 }, want: DropBadVnetHdr}, // csum_start < inner_nh+20
		{name: "inner_nh at inner ethernet", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.InnerNHOffset -= 14 }, want: DropBadGSO},
		{name: "inner_nh beyond outer packet", spec: v4v4, mutH: func(h *VirtioNetHdrTunnel, n int) {
			h.InnerNHOffset, h.CsumStart = uint16(n-90), uint16(n-70) // padding from n-100
		}, mutF: func(_ *VirtioNetHdrTunnel, b []byte) []byte { return append(b, make([]byte, 100)...) }, want: DropBadGSO},
		{name: "csum_start not the tcp header", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.CsumStart += 4 }, want: DropBadGSO},
		{name: "csum_offset not tcp's", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.CsumOffset = pkUDPChecksumOffset }, want: DropBadVnetHdr},
		{name: "data valid", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.Flags |= VirtioNetHdrFDataValid }, want: DropBadVnetHdr},
		{name: "outer not udp", spec: v6v4, mutF: func(_ *VirtioNetHdrTunnel, b []byte) []byte { b[14+6] = protoTCP; return b }, want: DropBadGSO},
		{name: "outer udp length wrong", spec: v6v4, mutF: func(h *VirtioNetHdrTunnel, b []byte) []byte {
			u := header.UDP(b[h.OuterTHOffset:])
			u.SetLength(u.Length() - 1)
			return b
		}, want: DropBadGSO},
		{name: "outer ipv4 fragment", spec: v4v4, mutF: func(_ *VirtioNetHdrTunnel, b []byte) []byte { b[14+6] |= 0x20; return b }, want: DropBadGSO},
		{name: "inner ipv4 fragment", spec: v6v4, mutF: innerIPv4(func(ip header.IPv4) { ip[6] |= 0x20 }), want: DropBadGSO},
		{name: "inner ipv4 shorter than outer payload", spec: v6v4, mutF: innerIPv4(func(ip header.IPv4) { ip.SetTotalLength(ip.TotalLength() - 1) }), want: DropBadGSO},
		{name: "inner ipv4 longer than outer payload", spec: v6v4, mutF: innerIPv4(func(ip header.IPv4) { ip.SetTotalLength(ip.TotalLength() + 1) }), want: DropBadGSO},
		{name: "inner not tcp", spec: v6v4, mutF: innerIPv4(func(ip header.IPv4) { ip[9] = protoUDP }), want: DropBadGSO},
		{name: "inner bad ihl", spec: v6v4, mutF: innerIPv4(func(ip header.IPv4) { ip[0] = 0x44 }), want: DropBadGSO},
		{name: "gso size 0", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, _ int) { h.GSOSize = 0 }, want: DropBadGSO},
		{name: "gso size beyond frame", spec: v6v4, mutH: func(h *VirtioNetHdrTunnel, n int) { h.GSOSize = uint16(n + 1) }, want: DropBadGSO},
		{name: "too many segments", spec: pkVxSpec{outer: L3IPv6, inner: pkSpec{l3: L3IPv4, proto: protoTCP, payload: pkPayload(maxGSOSegments + 1)}}, gso: 1, want: DropBadGSO},
		{name: "headers beyond scratch", spec: pkVxSpec{outer: L3IPv6, outerExt: true, inner: pkSpec{l3: L3IPv6, ext: []uint8{protoHopByHop}, extOpts: 25, proto: protoTCP, tcpTS: true, payload: pkPayload(3000)}},
			inner: VirtioNetHdrGSOTCPv6, want: DropBadGSO},
		{name: "truncated", spec: v6v4, mutF: func(_ *VirtioNetHdrTunnel, b []byte) []byte { return b[:200] }, want: DropBadGSO},
		{name: "shorter than the headers", spec: v6v4, mutF: func(_ *VirtioNetHdrTunnel, b []byte) []byte { return b[:110] }, want: DropBadVnetHdr},
		{name: "empty frame", spec: v6v4, mutF: func(_ *VirtioNetHdrTunnel, b []byte) []byte { return nil }, want: DropBadVnetHdr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inner, gso := tt.inner, tt.gso
			if inner == 0 {
				inner = VirtioNetHdrGSOTCPv4
			}
			if gso == 0 {
				gso = 1000 // "gso size 0" sets 0 in mutH
			}
			h, frame := pkVxSuperFrame(t, tt.spec, inner, gso)
			if tt.mutF != nil {
				frame = tt.mutF(&h, frame)
			}
			if tt.mutH != nil {
				tt.mutH(&h, len(frame))
			}
			var s Segmenter
			n, d := s.SegmentTunnel(&h, frame, pkFailSink{t})
			if n != 0 || d != tt.want {
				t.Errorf("SegmentTunnel: got (%d, %v), want (0, %v)", n, d, tt.want)
			}
		})
	}
}

// pkVxSeedSpecs are small super-frames of every layout, for the fuzz
// test's seeds and the allocation test.
func pkVxSeedSpecs() []struct {
	spec  pkVxSpec
	inner uint8
	gso   uint16
} {
	tcp := func(l3 L3Type, n int) pkSpec {
		return pkSpec{l3: l3, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh | header.TCPFlagCwr, seq: 9, ipID: 3, payload: pkPayload(n)}
	}
	return []struct {
		spec  pkVxSpec
		inner uint8
		gso   uint16
	}{
		{pkVxSpec{outer: L3IPv6, csum: true, inner: tcp(L3IPv4, 3000)}, VirtioNetHdrGSOTCPv4, 1390},
		{pkVxSpec{outer: L3IPv4, inner: tcp(L3IPv4, 2000)}, VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOECN, 700},
		{pkVxSpec{outer: L3IPv4, csum: true, outerID: 0xffff, inner: tcp(L3IPv6, 1500)}, VirtioNetHdrGSOTCPv6, 512},
		{pkVxSpec{outer: L3IPv6, outerExt: true, inner: tcp(L3IPv6, 999)}, VirtioNetHdrGSOTCPv6, 333},
		{pkVxSpec{outer: L3IPv6, csum: true, encap: []byte{1, 2, 3}, noInnerEth: true, pad: 3, inner: tcp(L3IPv4, 1001)}, VirtioNetHdrGSOTCPv4, 100},
	}
}

func TestSegmentTunnelAllocs(t *testing.T) {
	for _, sp := range pkVxSeedSpecs() {
		h, frame := pkVxSuperFrame(t, sp.spec, sp.inner, sp.gso)
		for _, fill := range []bool{false, true} {
			s := &Segmenter{FillChecksum: fill}
			sink := &pkCountSink{}
			var ss SegmentSink = sink
			var d Drop
			if got := testing.AllocsPerRun(50, func() { _, d = s.SegmentTunnel(&h, frame, ss) }); got != 0 {
				t.Errorf("SegmentTunnel(fill %v) allocations: got %v, want 0", fill, got)
			}
			if d != DropNone || sink.segs == 0 {
				t.Errorf("SegmentTunnel(fill %v): got %v after %d segments, want %v", fill, d, sink.segs, DropNone)
			}
		}
	}
	// A dropped frame allocates nothing either.
	h, frame := pkVxSuperFrame(t, pkVxSeedSpecs()[0].spec, VirtioNetHdrGSOTCPv4, 1390)
	h.InnerNHOffset -= 2
	var s Segmenter
	var ss SegmentSink = &pkCountSink{}
	if got := testing.AllocsPerRun(50, func() { s.SegmentTunnel(&h, frame, ss) }); got != 0 {
		t.Errorf("SegmentTunnel(drop) allocations: got %v, want 0", got)
	}
}

// FuzzSegmentTunnel: SegmentTunnel never panics, drops with DropBadVnetHdr or
// DropBadGSO, never writes to the super-frame, and cuts what it accepts into
// at most maxGSOSegments segments whose payloads joined are the super-frame's
// payload and which each parse as consistent outer and inner packets.
func FuzzSegmentTunnel(f *testing.F) {
	for _, sp := range pkVxSeedSpecs() {
		h, frame := pkVxSuperFrame(f, sp.spec, sp.inner, sp.gso)
		var hb [VirtioNetHdrTunnelLen]byte
		h.Encode(hb[:])
		f.Add(hb[:], frame, false)
		f.Add(hb[:], frame, true)
	}
	f.Fuzz(func(t *testing.T, hb, frame []byte, fill bool) {
		var h VirtioNetHdrTunnel
		if !h.Decode(hb) {
			return
		}
		orig := bytes.Clone(frame)
		s := Segmenter{FillChecksum: fill}
		var sink pkSegSink
		n, d := s.SegmentTunnel(&h, frame, &sink)
		if !bytes.Equal(frame, orig) {
			t.Fatalf("SegmentTunnel changed the super-frame")
		}
		switch d {
		case DropNone:
		case DropBadVnetHdr, DropBadGSO:
			if n != 0 || len(sink.hdrs) != 0 {
				t.Fatalf("SegmentTunnel: got %d segments and %d sink calls with %v, want none", n, len(sink.hdrs), d)
			}
			return
		default:
			t.Fatalf("SegmentTunnel: got %v, want none, %v or %v", d, DropBadVnetHdr, DropBadGSO)
		}
		if n < 1 || n > maxGSOSegments || len(sink.hdrs) != n {
			t.Fatalf("SegmentTunnel: got %d segments, %d sink calls, want 1 to %d of each", n, len(sink.hdrs), maxGSOSegments)
		}
		var fi FrameInfo
		if d := ParseFrame(frame, &fi); d != DropNone {
			t.Fatalf("ParseFrame(super-frame): got %v, want %v", d, DropNone)
		}
		hl := len(sink.hdrs[0])
		var joined []byte
		for i := range n {
			pl := sink.payloads[i]
			joined = append(joined, pl...)
			if len(sink.hdrs[i]) != hl || len(pl) > int(h.GSOSize) || (i < n-1 && len(pl) != int(h.GSOSize)) {
				t.Fatalf("segment %d: got %d header and %d payload bytes, want %d and at most %d (exactly, but the last)", i, len(sink.hdrs[i]), len(pl), hl, h.GSOSize)
			}
			seg := sink.frame(i)
			var ofi FrameInfo
			if d := ParseFrame(seg, &ofi); d != DropNone {
				t.Fatalf("segment %d: ParseFrame: got %v, want %v", i, d, DropNone)
			}
			oth := int(h.OuterTHOffset)
			if ofi.L4 != L4UDP || ofi.L2Len+ofi.L3Len != oth || ofi.L2Len+ofi.IPLen != len(seg) ||
				int(header.UDP(seg[oth:]).Length()) != len(seg)-oth || (ofi.L3 == L3IPv6) != h.TunnelIPv6() {
				t.Fatalf("segment %d of %d bytes: outer %+v, UDP length %d, want UDP at %d up to the end", i, len(seg), ofi, header.UDP(seg[oth:]).Length(), oth)
			}
			if d := VerifyChecksums(seg, &ofi, fill && h.Flags&VirtioNetHdrFUDPTunnelCsum != 0); d != DropNone {
				t.Errorf("segment %d: outer VerifyChecksums: got %v, want %v", i, d, DropNone)
			}
			var ifi FrameInfo
			if d := ParseL3Frame(seg[h.InnerNHOffset:], &ifi); d != DropNone || ifi.L4 != L4TCP ||
				int(h.InnerNHOffset)+ifi.IPLen != len(seg) || int(h.InnerNHOffset)+ifi.HeaderLen() != hl {
				t.Fatalf("segment %d: inner packet: %v, %+v, want TCP up to the end, %d header bytes", i, d, ifi, hl)
			}
			if d := VerifyChecksums(seg[h.InnerNHOffset:], &ifi, fill); d != DropNone {
				t.Errorf("segment %d: inner VerifyChecksums: got %v, want %v", i, d, DropNone)
			}
		}
		if want := frame[hl : fi.L2Len+fi.IPLen]; !bytes.Equal(joined, want) {
			t.Errorf("joined payloads: got %d bytes, want the super-frame's %d payload bytes", len(joined), len(want))
		}
	})
}

func BenchmarkSegmentTunnel(b *testing.B) {
	const mss = 1390
	spec := pkVxSpec{outer: L3IPv6, csum: true, inner: pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh, payload: pkPayload(45 * mss)}}
	h, frame := pkVxSuperFrame(b, spec, VirtioNetHdrGSOTCPv4, mss)
	for _, fill := range []bool{false, true} {
		name := "partial"
		if fill {
			name = "full"
		}
		b.Run(name, func(b *testing.B) {
			s := &Segmenter{FillChecksum: fill}
			var sink SegmentSink = &pkCountSink{}
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				if _, d := s.SegmentTunnel(&h, frame, sink); d != DropNone {
					b.Fatalf("SegmentTunnel: got %v, want %v", d, DropNone)
				}
			}
		})
	}
}
