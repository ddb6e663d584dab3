package driver

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// pkSegSink records the segments a Segmenter emits. It keeps a copy of each
// header, keeps each payload as the sub-slice it was given, and then
// scribbles over hdr, which the Segmenter must not rely on.
type pkSegSink struct {
	hdrs     [][]byte
	payloads [][]byte
}

func (s *pkSegSink) WriteSegment(hdr, payload []byte) {
	s.hdrs = append(s.hdrs, bytes.Clone(hdr))
	s.payloads = append(s.payloads, payload)
	for i := range hdr {
		hdr[i] = 0xee
	}
}

// frame returns segment i as one frame.
func (s *pkSegSink) frame(i int) []byte {
	return append(bytes.Clone(s.hdrs[i]), s.payloads[i]...)
}

// pkUDPChecksumOffset is the offset of the UDP checksum (gVisor does not
// export it).
const pkUDPChecksumOffset = 6

// pkCountSink counts segments and bytes without allocating.
type pkCountSink struct{ segs, bytes int }

func (s *pkCountSink) WriteSegment(hdr, payload []byte) {
	s.segs++
	s.bytes += len(hdr) + len(payload)
}

// pkFailSink fails the test if it is called.
type pkFailSink struct{ t *testing.T }

func (s pkFailSink) WriteSegment(hdr, payload []byte) {
	s.t.Errorf("sink called with %d+%d bytes, want no call", len(hdr), len(payload))
}

// pkSuperFrame builds the super-frame described by spec with the pseudo-header
// checksum a CHECKSUM_PARTIAL packet carries, and the virtio-net header a TAP
// puts before it.
func pkSuperFrame(t testing.TB, spec pkSpec, gsoType uint8, gsoSize uint16) (VirtioNetHdr, []byte, FrameInfo) {
	t.Helper()
	spec.csum = pkCsumPartial
	frame := spec.build()
	var fi FrameInfo
	if d := ParseFrame(frame, &fi); d != DropNone {
		t.Fatalf("ParseFrame(super-frame): got %v, want %v", d, DropNone)
	}
	h := VirtioNetHdr{
		Flags:     VirtioNetHdrFNeedsCsum,
		GSOType:   gsoType,
		HdrLen:    uint16(fi.HeaderLen()),
		GSOSize:   gsoSize,
		CsumStart: uint16(fi.L2Len + fi.L3Len),
	}
	if fi.L4 == L4TCP {
		h.CsumOffset = header.TCPChecksumOffset
	} else {
		h.CsumOffset = pkUDPChecksumOffset
	}
	return h, frame, fi
}

// pkCompleteChecksum does what a receiver does with a CHECKSUM_PARTIAL
// packet: it sums the L4 message, the partial pseudo-header sum in its
// checksum field included, and stores the complement.
func pkCompleteChecksum(frame []byte, fi *FrameInfo) {
	l4 := frame[fi.L2Len+fi.L3Len : fi.L2Len+fi.IPLen]
	off := pkUDPChecksumOffset
	if fi.L4 == L4TCP {
		off = header.TCPChecksumOffset
	}
	c := ^checksum.Checksum(l4, 0)
	if c == 0 && fi.L4 == L4UDP {
		c = 0xffff
	}
	checksum.Put(l4[off:], c)
}

func TestSegment(t *testing.T) {
	allFlags := header.TCPFlagAck | header.TCPFlagPsh | header.TCPFlagFin | header.TCPFlagCwr | header.TCPFlagEce | header.TCPFlagUrg
	tests := []struct {
		name     string
		spec     pkSpec
		gsoType  uint8
		gsoSize  uint16
		wantSegs int
	}{
		{
			name:     "tcpv4 mss 1448 seq and id wrap",
			spec:     pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: allFlags, seq: 0xfffff000, ack: 0x12345678, ipID: 0xfffd, ipFlags: header.IPv4FlagDontFragment, payload: pkPayload(10000)},
			gsoType:  VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOECN,
			gsoSize:  1448,
			wantSegs: 7,
		},
		{
			name:     "tcpv4 64k",
			spec:     pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh, seq: 1, payload: pkPayload(65483)},
			gsoType:  VirtioNetHdrGSOTCPv4,
			gsoSize:  1448,
			wantSegs: 46,
		},
		{
			name:     "tcpv4 exact multiple",
			spec:     pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagAck | header.TCPFlagFin, payload: pkPayload(4000)},
			gsoType:  VirtioNetHdrGSOTCPv4,
			gsoSize:  1000,
			wantSegs: 4,
		},
		{
			name:     "tcpv4 odd gso size",
			spec:     pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagAck, payload: pkPayload(5000)},
			gsoType:  VirtioNetHdrGSOTCPv4,
			gsoSize:  999,
			wantSegs: 6,
		},
		{
			name:     "tcpv4 payload below gso size",
			spec:     pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh | header.TCPFlagCwr, payload: pkPayload(500)},
			gsoType:  VirtioNetHdrGSOTCPv4,
			gsoSize:  540, // at most len(frame)
			wantSegs: 1,
		},
		{
			name:     "tcpv4 empty payload",
			spec:     pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: allFlags},
			gsoType:  VirtioNetHdrGSOTCPv4,
			gsoSize:  54,
			wantSegs: 1,
		},
		{
			name:     "tcpv4 ip options",
			spec:     pkSpec{l3: L3IPv4, ipv4Opts: header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}, proto: protoTCP, tcpFlags: header.TCPFlagAck, payload: pkPayload(3000)},
			gsoType:  VirtioNetHdrGSOTCPv4,
			gsoSize:  1400,
			wantSegs: 3,
		},
		{
			name:     "tcpv4 ethernet padding",
			spec:     pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagAck, payload: pkPayload(3000), pad: 20},
			gsoType:  VirtioNetHdrGSOTCPv4,
			gsoSize:  1448,
			wantSegs: 3,
		},
		{
			name:     "tcpv4 gso size 1 limit",
			spec:     pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagAck, payload: pkPayload(maxGSOSegments)},
			gsoType:  VirtioNetHdrGSOTCPv4,
			gsoSize:  1,
			wantSegs: maxGSOSegments,
		},
		{
			name:     "vlan tcpv4",
			spec:     pkSpec{vlanType: etherTypeVLAN, tci: 0x6123, l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh, payload: pkPayload(6000)},
			gsoType:  VirtioNetHdrGSOTCPv4,
			gsoSize:  1448,
			wantSegs: 5,
		},
		{
			name:     "tcpv6",
			spec:     pkSpec{l3: L3IPv6, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh | header.TCPFlagCwr, seq: 0x7fffffff, payload: pkPayload(5000)},
			gsoType:  VirtioNetHdrGSOTCPv6,
			gsoSize:  1428,
			wantSegs: 4,
		},
		{
			name:     "tcpv6 hop-by-hop destination options",
			spec:     pkSpec{l3: L3IPv6, ext: []uint8{protoHopByHop, protoDestOpts}, proto: protoTCP, tcpFlags: header.TCPFlagAck | header.TCPFlagFin, payload: pkPayload(5001)},
			gsoType:  VirtioNetHdrGSOTCPv6,
			gsoSize:  1412,
			wantSegs: 4,
		},
		{
			name:     "qinq tcpv6 routing",
			spec:     pkSpec{vlanType: etherTypeQinQ, tci: 7, l3: L3IPv6, ext: []uint8{protoRouting}, proto: protoTCP, tcpFlags: header.TCPFlagAck, payload: pkPayload(3333)},
			gsoType:  VirtioNetHdrGSOTCPv6 | VirtioNetHdrGSOECN,
			gsoSize:  1000,
			wantSegs: 4,
		},
		{
			name:     "udpv4 uso",
			spec:     pkSpec{l3: L3IPv4, proto: protoUDP, ipID: 100, payload: pkPayload(3000)},
			gsoType:  VirtioNetHdrGSOUDPL4,
			gsoSize:  1200,
			wantSegs: 3,
		},
		{
			name:     "udpv4 uso one segment",
			spec:     pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(1200)},
			gsoType:  VirtioNetHdrGSOUDPL4,
			gsoSize:  1200,
			wantSegs: 1,
		},
		{
			name:     "udpv6 uso",
			spec:     pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(3001)},
			gsoType:  VirtioNetHdrGSOUDPL4,
			gsoSize:  1000,
			wantSegs: 4,
		},
		{
			name:     "vlan udpv6 uso destination options",
			spec:     pkSpec{vlanType: etherTypeVLAN, tci: 42, l3: L3IPv6, ext: []uint8{protoDestOpts}, proto: protoUDP, payload: pkPayload(4500)},
			gsoType:  VirtioNetHdrGSOUDPL4,
			gsoSize:  1452,
			wantSegs: 4,
		},
	}
	for _, tt := range tests {
		for _, fill := range []bool{false, true} {
			name := tt.name + "/partial"
			if fill {
				name = tt.name + "/full"
			}
			t.Run(name, func(t *testing.T) {
				h, frame, fi := pkSuperFrame(t, tt.spec, tt.gsoType, tt.gsoSize)
				orig := bytes.Clone(frame)
				s := Segmenter{FillChecksum: fill}
				var sink pkSegSink
				n, d := s.Segment(&h, frame, &fi, &sink)
				if d != DropNone {
					t.Fatalf("Segment: got drop %v, want %v", d, DropNone)
				}
				if n != tt.wantSegs {
					t.Errorf("Segment: got %d segments, want %d", n, tt.wantSegs)
				}
				if len(sink.hdrs) != n {
					t.Fatalf("sink calls: got %d, want %d", len(sink.hdrs), n)
				}
				if !bytes.Equal(frame, orig) {
					t.Errorf("Segment changed the super-frame")
				}
				pkCheckSegments(t, &h, frame, &fi, &sink, fill)
			})
		}
	}
}

// pkCheckSegments checks the segments in sink against the super-frame they
// were cut from.
func pkCheckSegments(t *testing.T, h *VirtioNetHdr, frame []byte, fi *FrameInfo, sink *pkSegSink, fill bool) {
	t.Helper()
	hl := fi.HeaderLen()
	l2, l3, l4 := 0, fi.L2Len, fi.L2Len+fi.L3Len
	payload := frame[hl : fi.L2Len+fi.IPLen]
	gso := int(h.GSOSize)
	n := len(sink.hdrs)
	var joined []byte
	for i := range n {
		seg := sink.frame(i)
		pl := sink.payloads[i]
		joined = append(joined, pl...)

		if len(pl) > gso {
			t.Errorf("segment %d: got %d payload bytes, want at most %d", i, len(pl), gso)
		}
		if i < n-1 && len(pl) != gso {
			t.Errorf("segment %d: got %d payload bytes, want %d", i, len(pl), gso)
		}
		if i == n-1 && len(payload)%gso != 0 && len(pl) >= gso {
			t.Errorf("last segment: got %d payload bytes, want fewer than %d", len(pl), gso)
		}
		if len(pl) > 0 && &pl[0] != &frame[hl+i*gso] {
			t.Errorf("segment %d: payload is not the super-frame's bytes at %d", i, hl+i*gso)
		}
		if len(sink.hdrs[i]) != hl {
			t.Fatalf("segment %d: got %d header bytes, want %d", i, len(sink.hdrs[i]), hl)
		}

		var sfi FrameInfo
		if d := ParseFrame(seg, &sfi); d != DropNone {
			t.Fatalf("segment %d: ParseFrame: got %v, want %v", i, d, DropNone)
		}
		want := *fi
		want.IPLen = fi.L3Len + fi.L4Len + len(pl)
		if sfi != want {
			t.Errorf("segment %d: FrameInfo:\ngot  %+v\nwant %+v", i, sfi, want)
		}

		// L2 header: unchanged.
		if !bytes.Equal(seg[l2:l3], frame[l2:l3]) {
			t.Errorf("segment %d: L2 header: got %x, want %x", i, seg[l2:l3], frame[l2:l3])
		}
		// L3 header: only lengths, ID and checksum change.
		sameExcept := func(what string, got, want []byte, skip ...int) {
			t.Helper()
			for off := range want {
				changed := false
				for j := 0; j+1 < len(skip); j += 2 {
					changed = changed || (off >= skip[j] && off < skip[j+1])
				}
				if !changed && got[off] != want[off] {
					t.Errorf("segment %d: %s byte %d: got %#x, want %#x", i, what, off, got[off], want[off])
				}
			}
		}
		if fi.L3 == L3IPv4 {
			ip, oip := header.IPv4(seg[l3:]), header.IPv4(frame[l3:])
			if got, want := ip.TotalLength(), uint16(want.IPLen); got != want {
				t.Errorf("segment %d: IPv4 total length: got %d, want %d", i, got, want)
			}
			if got, want := ip.ID(), oip.ID()+uint16(i); got != want {
				t.Errorf("segment %d: IPv4 ID: got %#x, want %#x", i, got, want)
			}
			sameExcept("IPv4 header", seg[l3:l4], frame[l3:l4], 2, 6, 10, 12)
		} else {
			ip := header.IPv6(seg[l3:])
			if got, want := int(ip.PayloadLength()), want.IPLen-header.IPv6MinimumSize; got != want {
				t.Errorf("segment %d: IPv6 payload length: got %d, want %d", i, got, want)
			}
			sameExcept("IPv6 header", seg[l3:l4], frame[l3:l4], 4, 6)
		}
		// L4 header.
		if fi.L4 == L4TCP {
			tcp, otcp := header.TCP(seg[l4:]), header.TCP(frame[l4:])
			if got, want := tcp.SequenceNumber(), otcp.SequenceNumber()+uint32(i*gso); got != want {
				t.Errorf("segment %d: TCP sequence number: got %#x, want %#x", i, got, want)
			}
			wantFlags := otcp.Flags()
			if i > 0 {
				wantFlags &^= header.TCPFlagCwr
			}
			if i < n-1 {
				wantFlags &^= header.TCPFlagFin | header.TCPFlagPsh
			}
			if got := tcp.Flags(); got != wantFlags {
				t.Errorf("segment %d: TCP flags: got %v, want %v", i, got, wantFlags)
			}
			sameExcept("TCP header", seg[l4:hl], frame[l4:hl], 4, 8, 13, 14, 16, 18)
		} else {
			udp := header.UDP(seg[l4:])
			if got, want := int(udp.Length()), header.UDPMinimumSize+len(pl); got != want {
				t.Errorf("segment %d: UDP length: got %d, want %d", i, got, want)
			}
			sameExcept("UDP header", seg[l4:hl], frame[l4:hl], 4, 8)
		}
		// Checksums.
		if d := VerifyChecksums(seg, &sfi, false); d != DropNone {
			t.Errorf("segment %d: VerifyChecksums(l4 false): got %v, want %v", i, d, DropNone)
		}
		if !fill {
			// The partial sum must complete to a valid checksum.
			pkCompleteChecksum(seg, &sfi)
		}
		if d := VerifyChecksums(seg, &sfi, true); d != DropNone {
			t.Errorf("segment %d: VerifyChecksums(l4 true): got %v, want %v", i, d, DropNone)
		}
	}
	if !bytes.Equal(joined, payload) {
		t.Errorf("joined payloads: got %d bytes, want the super-frame's %d payload bytes", len(joined), len(payload))
	}
}

// TestSegmentUDPZeroChecksum checks that a full UDP checksum that computes to
// 0 is sent as 0xffff.
func TestSegmentUDPZeroChecksum(t *testing.T) {
	for _, l3 := range []L3Type{L3IPv4, L3IPv6} {
		t.Run(map[L3Type]string{L3IPv4: "ipv4", L3IPv6: "ipv6"}[l3], func(t *testing.T) {
			spec := pkSpec{l3: l3, proto: protoUDP, payload: pkPayload(100)}
			h, frame, fi := pkSuperFrame(t, spec, VirtioNetHdrGSOUDPL4, 120)
			s := Segmenter{FillChecksum: true}
			var sink pkSegSink
			if _, d := s.Segment(&h, frame, &fi, &sink); d != DropNone {
				t.Fatalf("Segment: got %v, want %v", d, DropNone)
			}
			// Add the checksum to the first payload word: the message then
			// sums to 0xffff and its checksum computes to 0.
			c := header.UDP(sink.hdrs[0][fi.L2Len+fi.L3Len:]).Checksum()
			p := frame[fi.HeaderLen():]
			binary.BigEndian.PutUint16(p, checksum.Combine(binary.BigEndian.Uint16(p), c))

			sink = pkSegSink{}
			if _, d := s.Segment(&h, frame, &fi, &sink); d != DropNone {
				t.Fatalf("Segment: got %v, want %v", d, DropNone)
			}
			seg := sink.frame(0)
			if got := header.UDP(seg[fi.L2Len+fi.L3Len:]).Checksum(); got != 0xffff {
				t.Errorf("UDP checksum: got %#x, want 0xffff", got)
			}
			var sfi FrameInfo
			if d := ParseFrame(seg, &sfi); d != DropNone {
				t.Fatalf("ParseFrame: got %v, want %v", d, DropNone)
			}
			if d := VerifyChecksums(seg, &sfi, true); d != DropNone {
				t.Errorf("VerifyChecksums: got %v, want %v", d, DropNone)
			}
		})
	}
}

func TestSegmentDrop(t *testing.T) {
	var (
		tcp4 = pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagAck, payload: pkPayload(3000)}
		tcp6 = pkSpec{l3: L3IPv6, proto: protoTCP, tcpFlags: header.TCPFlagAck, payload: pkPayload(3000)}
		udp4 = pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(3000)}
		udp6 = pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(3000)}
	)
	tests := []struct {
		name    string
		spec    pkSpec
		gsoType uint8
		gsoSize uint16
		mutH    func(h *VirtioNetHdr, frameLen int)
		mutFI   func(fi *FrameInfo)
		want    Drop
	}{
		{name: "gso size 0", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 0, want: DropBadGSO},
		{name: "gso size beyond frame", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv4, mutH: func(h *VirtioNetHdr, n int) { h.GSOSize = uint16(n + 1) }, want: DropBadGSO},
		{name: "too many segments", spec: pkSpec{l3: L3IPv4, proto: protoTCP, payload: pkPayload(maxGSOSegments + 1)}, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1, want: DropBadGSO},
		{name: "gso none", spec: tcp4, gsoType: VirtioNetHdrGSONone, gsoSize: 1448, want: DropBadGSO},
		{name: "ecn alone", spec: tcp4, gsoType: VirtioNetHdrGSOECN, gsoSize: 1448, want: DropBadGSO},
		{name: "unknown gso type", spec: tcp4, gsoType: 2, gsoSize: 1448, want: DropBadGSO},
		{name: "ufo", spec: udp4, gsoType: VirtioNetHdrGSOUDP, gsoSize: 1448, want: DropBadGSO},
		{name: "tcpv4 on ipv6", spec: tcp6, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1448, want: DropBadGSO},
		{name: "tcpv6 on ipv4", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv6, gsoSize: 1448, want: DropBadGSO},
		{name: "tcpv4 on udp", spec: udp4, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1448, want: DropBadGSO},
		{name: "tcpv6 on udp", spec: udp6, gsoType: VirtioNetHdrGSOTCPv6, gsoSize: 1448, want: DropBadGSO},
		{name: "udp l4 on tcp", spec: tcp6, gsoType: VirtioNetHdrGSOUDPL4, gsoSize: 1448, want: DropBadGSO},
		{name: "udp l4 on icmp", spec: pkSpec{l3: L3IPv4, proto: protoICMPv4, payload: pkPayload(3000)}, gsoType: VirtioNetHdrGSOUDPL4, gsoSize: 1448, want: DropBadGSO},
		{name: "tcpv4 on arp", spec: pkSpec{l3: L3ARP}, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 10, want: DropBadGSO},
		{name: "udp l4 on arp", spec: pkSpec{l3: L3ARP}, gsoType: VirtioNetHdrGSOUDPL4, gsoSize: 10, want: DropBadGSO},
		{name: "ipv4 fragment", spec: pkSpec{l3: L3IPv4, proto: protoUDP, ipFlags: header.IPv4FlagMoreFragments, payload: pkPayload(3000)}, gsoType: VirtioNetHdrGSOUDPL4, gsoSize: 1448,
			mutFI: func(fi *FrameInfo) { fi.L4, fi.L4Len = L4UDP, udpHdrLen }, want: DropBadGSO},
		{name: "ipv6 fragment", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoFragment}, proto: protoTCP, payload: pkPayload(3000)}, gsoType: VirtioNetHdrGSOTCPv6, gsoSize: 1448,
			mutFI: func(fi *FrameInfo) { fi.L4, fi.L4Len = L4TCP, tcpMinHdrLen }, want: DropBadGSO},
		{name: "no needs csum", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1448, mutH: func(h *VirtioNetHdr, _ int) { h.Flags = 0 }, want: DropBadVnetHdr},
		{name: "data valid without needs csum", spec: udp6, gsoType: VirtioNetHdrGSOUDPL4, gsoSize: 1448, mutH: func(h *VirtioNetHdr, _ int) { h.Flags = VirtioNetHdrFDataValid }, want: DropBadVnetHdr},
		{name: "unknown flag", spec: tcp6, gsoType: VirtioNetHdrGSOTCPv6, gsoSize: 1448, mutH: func(h *VirtioNetHdr, _ int) { h.Flags |= 4 }, want: DropBadVnetHdr},
		{name: "csum start beyond frame", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1448, mutH: func(h *VirtioNetHdr, n int) { h.CsumStart = uint16(n) }, want: DropBadVnetHdr},
		{name: "csum offset beyond frame", spec: udp4, gsoType: VirtioNetHdrGSOUDPL4, gsoSize: 1448, mutH: func(h *VirtioNetHdr, n int) { h.CsumOffset = uint16(n - int(h.CsumStart) - 1) }, want: DropBadVnetHdr},
		{name: "headers beyond scratch", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoHopByHop, protoDestOpts}, extOpts: 20, proto: protoTCP, tcpTS: true, payload: pkPayload(3000)},
			gsoType: VirtioNetHdrGSOTCPv6, gsoSize: 1448, want: DropBadGSO},
		{name: "info ip length beyond frame", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1448, mutFI: func(fi *FrameInfo) { fi.IPLen += 100 }, want: DropBadGSO},
		{name: "info headers beyond ip packet", spec: pkSpec{l3: L3IPv4, proto: protoTCP}, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 10, mutFI: func(fi *FrameInfo) { fi.L4Len = 60 }, want: DropBadGSO},
		{name: "info tcp header short", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1448, mutFI: func(fi *FrameInfo) { fi.L4Len = 8 }, want: DropBadGSO},
		{name: "info l3 short", spec: tcp6, gsoType: VirtioNetHdrGSOTCPv6, gsoSize: 1448, mutFI: func(fi *FrameInfo) { fi.L3Len = 20 }, want: DropBadGSO},
		{name: "info no l2", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1448, mutFI: func(fi *FrameInfo) { fi.L2Len = 0 }, want: DropBadGSO},
		{name: "info huge l2", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1448, mutFI: func(fi *FrameInfo) { fi.L2Len = math.MaxInt - 30 }, want: DropBadGSO},
		{name: "info huge l3 and l4", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1448, mutFI: func(fi *FrameInfo) { fi.L3Len, fi.L4Len = math.MaxInt-10, math.MaxInt-10 }, want: DropBadGSO},
		{name: "info negative ip length", spec: tcp4, gsoType: VirtioNetHdrGSOTCPv4, gsoSize: 1448, mutFI: func(fi *FrameInfo) { fi.IPLen = -math.MaxInt }, want: DropBadGSO},
		{name: "info odd udp header", spec: udp4, gsoType: VirtioNetHdrGSOUDPL4, gsoSize: 1448, mutFI: func(fi *FrameInfo) { fi.L4Len = 9 }, want: DropBadGSO},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame := tt.spec.build()
			var fi FrameInfo
			if d := ParseFrame(frame, &fi); d != DropNone {
				t.Fatalf("ParseFrame: got %v, want %v", d, DropNone)
			}
			h := VirtioNetHdr{
				Flags:      VirtioNetHdrFNeedsCsum,
				GSOType:    tt.gsoType,
				HdrLen:     uint16(fi.HeaderLen()),
				GSOSize:    tt.gsoSize,
				CsumStart:  uint16(fi.L2Len + fi.L3Len),
				CsumOffset: pkUDPChecksumOffset,
			}
			if tt.mutH != nil {
				tt.mutH(&h, len(frame))
			}
			if tt.mutFI != nil {
				tt.mutFI(&fi)
			}
			var s Segmenter
			n, d := s.Segment(&h, frame, &fi, pkFailSink{t})
			if n != 0 || d != tt.want {
				t.Errorf("Segment: got (%d, %v), want (0, %v)", n, d, tt.want)
			}
		})
	}
}

func TestSegmentAllocs(t *testing.T) {
	specs := []struct {
		spec    pkSpec
		gsoType uint8
		gsoSize uint16
	}{
		{pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck, payload: pkPayload(65160)}, VirtioNetHdrGSOTCPv4, 1448},
		{pkSpec{vlanType: etherTypeVLAN, l3: L3IPv6, ext: []uint8{protoHopByHop}, proto: protoTCP, payload: pkPayload(30000)}, VirtioNetHdrGSOTCPv6, 1420},
		{pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(20000)}, VirtioNetHdrGSOUDPL4, 1232},
	}
	for _, sp := range specs {
		h, frame, fi := pkSuperFrame(t, sp.spec, sp.gsoType, sp.gsoSize)
		for _, fill := range []bool{false, true} {
			s := &Segmenter{FillChecksum: fill}
			sink := &pkCountSink{}
			var ss SegmentSink = sink
			var d Drop
			if got := testing.AllocsPerRun(50, func() { _, d = s.Segment(&h, frame, &fi, ss) }); got != 0 {
				t.Errorf("Segment(fill %v) allocations: got %v, want 0", fill, got)
			}
			if d != DropNone || sink.segs == 0 {
				t.Errorf("Segment(fill %v): got %v after %d segments, want %v", fill, d, sink.segs, DropNone)
			}
		}
	}
}

func BenchmarkSegmentTCPv4(b *testing.B) {
	const mss = 1448
	spec := pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh, payload: pkPayload(45 * mss)}
	h, frame, fi := pkSuperFrame(b, spec, VirtioNetHdrGSOTCPv4, mss)
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
				if _, d := s.Segment(&h, frame, &fi, sink); d != DropNone {
					b.Fatalf("Segment: got %v, want %v", d, DropNone)
				}
			}
		})
	}
}
