package driver

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/internal/hdr"
)

// pkFuzzSeeds returns well-formed frames of every kind ParseFrame knows.
func pkFuzzSeeds() [][]byte {
	specs := []pkSpec{
		{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck, payload: pkPayload(100)},
		{l3: L3IPv4, proto: protoUDP, payload: pkPayload(30), pad: 6},
		{l3: L3IPv4, proto: protoICMPv4, payload: pkPayload(56)},
		{l3: L3IPv4, proto: protoUDP, ipFlags: header.IPv4FlagMoreFragments, payload: pkPayload(64)},
		{l3: L3IPv4, ipv4Opts: header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}, proto: protoTCP},
		{l3: L3IPv6, proto: protoTCP, payload: pkPayload(64)},
		{l3: L3IPv6, proto: protoUDP, payload: pkPayload(64)},
		{l3: L3IPv6, proto: protoICMPv6, payload: pkPayload(8)},
		{l3: L3IPv6, ext: []uint8{protoHopByHop, protoRouting, protoDestOpts}, proto: protoTCP, payload: pkPayload(10)},
		{l3: L3IPv6, ext: []uint8{protoDestOpts, protoFragment}, proto: protoUDP, payload: pkPayload(10)},
		{l3: L3IPv6, proto: 59},
		{vlanType: etherTypeVLAN, tci: 100, l3: L3IPv4, proto: protoTCP},
		{vlanType: etherTypeQinQ, tci: 100, l3: L3IPv6, proto: protoUDP},
		{l3: L3ARP, pad: 18},
	}
	var seeds [][]byte
	for _, s := range specs {
		seeds = append(seeds, s.build())
	}
	return seeds
}

func FuzzParseFrame(f *testing.F) {
	for _, s := range pkFuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		var fi FrameInfo
		d := ParseFrame(frame, &fi)
		if d > DropBadUDPLen {
			t.Fatalf("ParseFrame: got %v, want a reason from %v to %v", d, DropNone, DropBadUDPLen)
		}
		if d != DropNone {
			return
		}
		if hl, end := fi.HeaderLen(), fi.L2Len+fi.IPLen; hl > end || end > len(frame) {
			t.Fatalf("offsets: got HeaderLen %d, L2Len+IPLen %d, frame %d bytes, want HeaderLen <= L2Len+IPLen <= len(frame)", hl, end, len(frame))
		}
		if fi.L2Len != header.EthernetMinimumSize && fi.L2Len != header.EthernetMinimumSize+hdr.VLANTagLen {
			t.Errorf("L2Len: got %d, want 14 or 18", fi.L2Len)
		}
		if fi.Fragment && (fi.L4 != L4Other || fi.L4Len != 0) {
			t.Errorf("fragment: got L4 %d, L4Len %d, want L4Other and 0", fi.L4, fi.L4Len)
		}
		// VerifyChecksums must accept what ParseFrame accepted.
		switch d := VerifyChecksums(frame, &fi, true); d {
		case DropNone, DropBadIPCsum, DropBadL4Csum:
		default:
			t.Errorf("VerifyChecksums: got %v, want none, bad IP or L4 checksum", d)
		}
		// The IP packet after the Ethernet header, as a TUN hands it up,
		// parses to the same layout at offset 0 (ParseL3Frame).
		if fi.VLAN || fi.L3 == L3ARP {
			return
		}
		var li FrameInfo
		if d := ParseL3Frame(frame[fi.L2Len:], &li); d != DropNone || li.L2Len != 0 || li.L3 != fi.L3 || li.L4 != fi.L4 ||
			li.L3Len != fi.L3Len || li.L4Len != fi.L4Len || li.IPLen != fi.IPLen || li.EtherType != fi.EtherType {
			t.Errorf("ParseL3Frame of the IP packet: %v, %+v; want the Ethernet frame's layout %+v at offset 0", d, li, fi)
		}
	})
}

// FuzzParseL3Frame: ParseL3Frame never panics, names a drop reason or
// returns offsets within the packet, with no link header.
func FuzzParseL3Frame(f *testing.F) {
	for _, s := range pkFuzzSeeds() {
		if len(s) > header.EthernetMinimumSize {
			f.Add(s[header.EthernetMinimumSize:])
		}
	}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		var fi FrameInfo
		d := ParseL3Frame(pkt, &fi)
		if d > DropBadUDPLen {
			t.Fatalf("ParseL3Frame: got %v, want a reason from %v to %v", d, DropNone, DropBadUDPLen)
		}
		if d != DropNone {
			return
		}
		if hl := fi.HeaderLen(); fi.L2Len != 0 || hl > fi.IPLen || fi.IPLen > len(pkt) {
			t.Fatalf("offsets: L2Len %d, HeaderLen %d, IPLen %d, packet %d bytes", fi.L2Len, hl, fi.IPLen, len(pkt))
		}
		switch d := VerifyChecksums(pkt, &fi, true); d {
		case DropNone, DropBadIPCsum, DropBadL4Csum:
		default:
			t.Errorf("VerifyChecksums: got %v, want none, bad IP or L4 checksum", d)
		}
	})
}

// fuzzWireFrame splits what a TAP read returns into its virtio-net header
// and frame, and parses the frame; ok is false if either does not decode.
func fuzzWireFrame(b []byte) (h VirtioNetHdr, frame []byte, fi FrameInfo, ok bool) {
	if !h.Decode(b) {
		return h, nil, fi, false
	}
	frame = b[VirtioNetHdrLen:]
	return h, frame, fi, ParseFrame(frame, &fi) == DropNone
}

// FuzzSegment feeds what a TAP read returns: a virtio-net header followed by
// an Ethernet frame.
func FuzzSegment(f *testing.F) {
	for _, s := range pkFuzzSeeds() {
		var h [VirtioNetHdrLen]byte
		(&VirtioNetHdr{}).Encode(h[:])
		f.Add(append(h[:], s...), false)
	}
	supers := []struct {
		spec    pkSpec
		gsoType uint8
		gsoSize uint16
	}{
		{pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh | header.TCPFlagCwr, payload: pkPayload(3000)}, VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOECN, 1448},
		{pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagFin, seq: 0xffffff00, payload: pkPayload(301)}, VirtioNetHdrGSOTCPv4, 100},
		{pkSpec{vlanType: etherTypeVLAN, l3: L3IPv6, ext: []uint8{protoHopByHop, protoDestOpts}, proto: protoTCP, payload: pkPayload(2000)}, VirtioNetHdrGSOTCPv6, 999},
		{pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(2500)}, VirtioNetHdrGSOUDPL4, 1200},
		{pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(1000), pad: 4}, VirtioNetHdrGSOUDPL4, 333},
		{pkSpec{l3: L3IPv4, proto: protoTCP, payload: nil}, VirtioNetHdrGSOTCPv4, 54},
	}
	for _, sf := range supers {
		h, frame, _ := pkSuperFrame(f, sf.spec, sf.gsoType, sf.gsoSize)
		b := make([]byte, VirtioNetHdrLen, VirtioNetHdrLen+len(frame))
		h.Encode(b)
		f.Add(append(b, frame...), false)
		f.Add(append(b, frame...), true)
	}
	f.Fuzz(func(t *testing.T, b []byte, fill bool) {
		h, frame, fi, ok := fuzzWireFrame(b)
		if !ok {
			return
		}
		orig := bytes.Clone(frame)
		s := Segmenter{FillChecksum: fill}
		var sink pkSegSink
		n, d := s.Segment(&h, frame, &fi, &sink)
		if !bytes.Equal(frame, orig) {
			t.Fatalf("Segment changed the super-frame")
		}
		if d != DropNone {
			if n != 0 || len(sink.hdrs) != 0 {
				t.Fatalf("Segment: got %d segments (%d sink calls) with drop %v, want 0", n, len(sink.hdrs), d)
			}
			if d != DropBadGSO && d != DropBadVnetHdr {
				t.Fatalf("Segment: got %v, want %v or %v", d, DropBadGSO, DropBadVnetHdr)
			}
			return
		}
		if n < 1 || n > maxGSOSegments || n != len(sink.hdrs) {
			t.Fatalf("Segment: got %d segments and %d sink calls, want as many, 1 to %d", n, len(sink.hdrs), maxGSOSegments)
		}
		var joined []byte
		for i := range n {
			pl := sink.payloads[i]
			if len(pl) > int(h.GSOSize) {
				t.Fatalf("segment %d: got %d payload bytes, want at most %d", i, len(pl), h.GSOSize)
			}
			joined = append(joined, pl...)
			seg := sink.frame(i)
			var sfi FrameInfo
			if d := ParseFrame(seg, &sfi); d != DropNone {
				t.Fatalf("segment %d: ParseFrame: got %v, want %v", i, d, DropNone)
			}
			want := fi
			want.IPLen = fi.L3Len + fi.L4Len + len(pl)
			if sfi != want {
				t.Fatalf("segment %d: FrameInfo:\ngot  %+v\nwant %+v", i, sfi, want)
			}
			if d := VerifyChecksums(seg, &sfi, fill); d != DropNone {
				t.Fatalf("segment %d: VerifyChecksums(l4 %v): got %v, want %v", i, fill, d, DropNone)
			}
		}
		if want := frame[fi.HeaderLen() : fi.L2Len+fi.IPLen]; !bytes.Equal(joined, want) {
			t.Fatalf("joined payloads: got %d bytes, want the super-frame's %d payload bytes", len(joined), len(want))
		}
	})
}
