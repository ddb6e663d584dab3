package driver

import (
	"encoding/binary"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

func TestVirtioNetHdrTunnelRoundTrip(t *testing.T) {
	tests := []VirtioNetHdrTunnel{
		{},
		{
			VirtioNetHdr:  VirtioNetHdr{Flags: VirtioNetHdrFNeedsCsum | VirtioNetHdrFUDPTunnelCsum, GSOType: VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOUDPTunnelIPv6, HdrLen: 124, GSOSize: 1390, CsumStart: 104, CsumOffset: 16},
			OuterTHOffset: 54,
			InnerNHOffset: 84,
		},
		{
			VirtioNetHdr:  VirtioNetHdr{Flags: VirtioNetHdrFNeedsCsum, GSOType: VirtioNetHdrGSOTCPv6 | VirtioNetHdrGSOUDPTunnelIPv4 | VirtioNetHdrGSOECN, HdrLen: 136, GSOSize: 1400, CsumStart: 104, CsumOffset: 16},
			HashValue:     0xdeadbeef,
			HashReport:    2,
			OuterTHOffset: 34,
			InnerNHOffset: 64,
		},
		{
			VirtioNetHdr:  VirtioNetHdr{Flags: 0xff, GSOType: 0xff, HdrLen: 0xfffe, GSOSize: 0xffff, CsumStart: 0x8001, CsumOffset: 0x0102},
			HashValue:     0x01020304,
			HashReport:    0xfffe,
			OuterTHOffset: 0x8070,
			InnerNHOffset: 0xfffd,
		},
	}
	for _, want := range tests {
		var b [VirtioNetHdrTunnelLen]byte
		want.Encode(b[:])
		var got VirtioNetHdrTunnel
		if !got.Decode(b[:]) {
			t.Fatalf("Decode(%x): got false, want true", b)
		}
		if got != want {
			t.Errorf("Decode(Encode(%+v)): got %+v", want, got)
		}
	}
}

// TestVirtioNetHdrTunnelLayout checks the byte layout of struct
// virtio_net_hdr_v1_hash_tunnel: struct virtio_net_hdr as VirtioNetHdr
// encodes it, num_buffers (zero), hash_value_lo, hash_value_hi,
// hash_report, padding (zero), outer_th_offset, inner_nh_offset, the last
// six __le16.
func TestVirtioNetHdrTunnelLayout(t *testing.T) {
	h := VirtioNetHdrTunnel{
		VirtioNetHdr:  VirtioNetHdr{Flags: 0x09, GSOType: 0x41, HdrLen: 0x0203, GSOSize: 0x0405, CsumStart: 0x0607, CsumOffset: 0x0809},
		HashValue:     0x0d0c0b0a,
		HashReport:    0x0e0f,
		OuterTHOffset: 0x1011,
		InnerNHOffset: 0x1213,
	}
	var want [VirtioNetHdrTunnelLen]byte
	h.VirtioNetHdr.Encode(want[:])
	for off, v := range map[int]uint16{12: 0x0b0a, 14: 0x0d0c, 16: 0x0e0f, 20: 0x1011, 22: 0x1213} {
		binary.LittleEndian.PutUint16(want[off:], v)
	}
	// Encode must write exactly VirtioNetHdrTunnelLen bytes, zeroing
	// num_buffers and padding.
	got := make([]byte, VirtioNetHdrTunnelLen+2)
	for i := range got {
		got[i] = 0xaa
	}
	h.Encode(got)
	if string(got[:VirtioNetHdrTunnelLen]) != string(want[:]) {
		t.Errorf("Encode: got %x, want %x", got[:VirtioNetHdrTunnelLen], want)
	}
	if got[VirtioNetHdrTunnelLen] != 0xaa || got[VirtioNetHdrTunnelLen+1] != 0xaa {
		t.Errorf("Encode wrote beyond the header: got %x", got[VirtioNetHdrTunnelLen:])
	}
}

// TestVirtioNetHdrTunnelMeasured decodes the header a TAP under a vxlan device
// over IPv6 put before a TCP super-frame (Linux 6.18, x86-64) and checks it
// against a frame of that layout.
func TestVirtioNetHdrTunnelMeasured(t *testing.T) {
	b := []byte{
		0x09, 0x41, // flags NEEDS_CSUM|UDP_TUNNEL_CSUM, gso_type TCPV4|UDP_TUNNEL_IPV6
		124, 0, // hdr_len
		0x6e, 0x05, // gso_size 1390
		104, 0, // csum_start
		16, 0, // csum_offset
		0, 0, // num_buffers
		0, 0, 0, 0, 0, 0, 0, 0, // hash_value, hash_report, padding
		54, 0, // outer_th_offset
		84, 0, // inner_nh_offset
	}
	var h VirtioNetHdrTunnel
	if !h.Decode(b) {
		t.Fatalf("Decode: got false, want true")
	}
	want := VirtioNetHdrTunnel{
		VirtioNetHdr:  VirtioNetHdr{Flags: 9, GSOType: 0x41, HdrLen: 124, GSOSize: 1390, CsumStart: 104, CsumOffset: 16},
		OuterTHOffset: 54,
		InnerNHOffset: 84,
	}
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the measured bytes are of a little-endian host")
	}
	if h != want {
		t.Fatalf("Decode: got %+v, want %+v", h, want)
	}
	if got := h.Inner(); got != VirtioNetHdrGSOTCPv4 {
		t.Errorf("Inner: got %#x, want %#x", got, VirtioNetHdrGSOTCPv4)
	}
	if !h.Tunnel() || !h.TunnelIPv6() {
		t.Errorf("Tunnel, TunnelIPv6: got %v, %v, want true, true", h.Tunnel(), h.TunnelIPv6())
	}
	spec := pkVxSpec{outer: L3IPv6, csum: true, inner: pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck, payload: pkPayload(3 * 1390)}}
	fh, frame := pkVxSuperFrame(t, spec, VirtioNetHdrGSOTCPv4, 1390)
	fh.HdrLen = h.HdrLen // a hint: the TAP reports the linear part
	if fh != h {
		t.Errorf("pkVxSuperFrame header: got %+v, want the measured %+v", fh, h)
	}
	if d := h.check(frame); d != DropNone {
		t.Errorf("check: got %v, want %v", d, DropNone)
	}
	var s Segmenter
	if n, d := s.SegmentTunnel(&h, frame, &pkCountSink{}); n != 3 || d != DropNone {
		t.Errorf("SegmentTunnel: got (%d, %v), want (3, %v)", n, d, DropNone)
	}
}

func TestVirtioNetHdrTunnelDecodeShort(t *testing.T) {
	want := VirtioNetHdrTunnel{VirtioNetHdr: VirtioNetHdr{Flags: 7, GSOSize: 9}, InnerNHOffset: 3}
	for n := 0; n < VirtioNetHdrTunnelLen; n++ {
		got := want
		if got.Decode(make([]byte, n)) {
			t.Errorf("Decode(%d bytes): got true, want false", n)
		}
		if got != want {
			t.Errorf("Decode(%d bytes) changed the header: got %+v, want %+v", n, got, want)
		}
	}
	var h VirtioNetHdrTunnel
	if !h.Decode(make([]byte, VirtioNetHdrTunnelLen+100)) {
		t.Errorf("Decode(%d bytes): got false, want true", VirtioNetHdrTunnelLen+100)
	}
}

func TestVirtioNetHdrTunnelEncodeShortPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Errorf("Encode(%d bytes): got no panic, want one", VirtioNetHdrTunnelLen-1)
		}
	}()
	var h VirtioNetHdrTunnel
	h.Encode(make([]byte, VirtioNetHdrTunnelLen-1))
}

func TestVirtioNetHdrTunnelGSOType(t *testing.T) {
	tests := []struct {
		gsoType      uint8
		inner        uint8
		tunnel, ipv6 bool
	}{
		{0, 0, false, false},
		{VirtioNetHdrGSOTCPv4, VirtioNetHdrGSOTCPv4, false, false},
		{VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOUDPTunnelIPv4, VirtioNetHdrGSOTCPv4, true, false},
		{VirtioNetHdrGSOTCPv6 | VirtioNetHdrGSOUDPTunnelIPv6 | VirtioNetHdrGSOECN, VirtioNetHdrGSOTCPv6 | VirtioNetHdrGSOECN, true, true},
		{VirtioNetHdrGSOUDPL4 | VirtioNetHdrGSOUDPTunnelIPv6, VirtioNetHdrGSOUDPL4, true, true},
		{0xff, 0x9f, true, true},
	}
	for _, tt := range tests {
		h := VirtioNetHdrTunnel{VirtioNetHdr: VirtioNetHdr{GSOType: tt.gsoType}}
		if got := h.Inner(); got != tt.inner {
			t.Errorf("GSOType %#x: Inner: got %#x, want %#x", tt.gsoType, got, tt.inner)
		}
		if got := h.Tunnel(); got != tt.tunnel {
			t.Errorf("GSOType %#x: Tunnel: got %v, want %v", tt.gsoType, got, tt.tunnel)
		}
		if got := h.TunnelIPv6(); got != tt.ipv6 {
			t.Errorf("GSOType %#x: TunnelIPv6: got %v, want %v", tt.gsoType, got, tt.ipv6)
		}
	}
}

// TestVirtioNetHdrTunnelCheck checks check's rules (virtio_net_hdr_tnl_to_skb's)
// on headers derived from a good one for a good frame.
func TestVirtioNetHdrTunnelCheck(t *testing.T) {
	var (
		v6v4 = pkVxBase(L3IPv6, L3IPv4)
		v6v6 = pkVxBase(L3IPv6, L3IPv6)
		v4v4 = pkVxBase(L3IPv4, L3IPv4)
	)
	const (
		tun4 = VirtioNetHdrGSOUDPTunnelIPv4
		tun6 = VirtioNetHdrGSOUDPTunnelIPv6
	)
	tests := []struct {
		name  string
		spec  pkVxSpec
		inner uint8 // 0: TCPv4, or TCPv6 for an IPv6 inner packet
		mut   func(h *VirtioNetHdrTunnel, frameLen int)
		want  Drop
	}{
		// Accepted.
		{name: "vxlan6 tcpv4", spec: v6v4, want: DropNone},
		{name: "vxlan6 tcpv6", spec: v6v6, want: DropNone},
		{name: "vxlan4 tcpv4", spec: v4v4, want: DropNone},
		{name: "no outer csum", spec: pkVxSpec{outer: L3IPv6, inner: v6v4.inner}, want: DropNone},
		{name: "ecn", spec: v6v4, inner: VirtioNetHdrGSOTCPv4 | VirtioNetHdrGSOECN, want: DropNone},
		{name: "udp l4 inside", spec: v6v4, inner: VirtioNetHdrGSOUDPL4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.CsumOffset = pkUDPChecksumOffset }, want: DropNone},
		{name: "udp l4 inside ipv6", spec: v6v6, inner: VirtioNetHdrGSOUDPL4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.CsumOffset = pkUDPChecksumOffset }, want: DropNone},
		{name: "plain tcpv4", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType, h.Flags = VirtioNetHdrGSOTCPv4, VirtioNetHdrFNeedsCsum }, want: DropNone},
		{name: "plain none", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { *h = VirtioNetHdrTunnel{} }, want: DropNone},
		{name: "offsets at their minimum", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.OuterTHOffset, h.InnerNHOffset, h.CsumStart = 54, 62, 82 }, want: DropNone},
		{name: "tcp header ends the frame", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, n int) { h.CsumStart = uint16(n - tcpMinHdrLen) }, want: DropNone},

		// Refused as virtio_net_hdr_tnl_to_skb refuses them.
		{name: "tunnel csum without tunnel", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType = VirtioNetHdrGSOTCPv4 }, want: DropBadVnetHdr},
		{name: "tunnel csum without gso", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType = 0 }, want: DropBadVnetHdr},
		{name: "both tunnel bits", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType |= tun4 }, want: DropBadGSO},
		{name: "tunnel without inner gso", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType = tun6 }, want: DropBadGSO},
		{name: "tunnel with ecn only", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType = tun6 | VirtioNetHdrGSOECN }, want: DropBadGSO},
		{name: "tunnel with ufo", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType = tun6 | VirtioNetHdrGSOUDP }, want: DropBadGSO},
		{name: "tunnel with unknown inner", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType = tun6 | 2 }, want: DropBadGSO},
		{name: "tunnel with unknown bit", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType |= 0x10 }, want: DropBadGSO},
		{name: "no needs csum", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.Flags = VirtioNetHdrFUDPTunnelCsum }, want: DropBadVnetHdr},
		{name: "no flags", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.Flags = 0 }, want: DropBadVnetHdr},
		{name: "data valid", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.Flags |= VirtioNetHdrFDataValid }, want: DropBadVnetHdr},
		{name: "unknown flag", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.Flags |= 4 }, want: DropBadVnetHdr},
		{name: "gso size 0", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOSize = 0 }, want: DropBadGSO},
		{name: "outer_th inside outer ipv6", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.OuterTHOffset = 53 }, want: DropBadVnetHdr},
		{name: "outer_th inside outer ipv4", spec: v4v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.OuterTHOffset = 33 }, want: DropBadVnetHdr},
		{name: "outer_th ipv4-sized on ipv6", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.OuterTHOffset = 34 }, want: DropBadVnetHdr},
		{name: "outer_th 0", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.OuterTHOffset = 0 }, want: DropBadVnetHdr},
		{name: "inner_nh inside outer udp", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.InnerNHOffset = 61 }, want: DropBadVnetHdr},
		{name: "inner_nh before outer_th", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.InnerNHOffset = 20 }, want: DropBadVnetHdr},
		{name: "csum_start inside inner ipv4", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.CsumStart = 103 }, want: DropBadVnetHdr},
		{name: "csum_start inside inner ipv6", spec: v6v6, mut: func(h *VirtioNetHdrTunnel, _ int) { h.CsumStart -= 1 }, want: DropBadVnetHdr},
		{name: "tcpv6 on inner ipv4 offsets", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.GSOType = VirtioNetHdrGSOTCPv6 | tun6 }, want: DropBadVnetHdr},
		{name: "udp l4 inside ipv6 short", spec: v6v6, inner: VirtioNetHdrGSOUDPL4, mut: func(h *VirtioNetHdrTunnel, _ int) {
			h.CsumOffset, h.CsumStart = pkUDPChecksumOffset, h.InnerNHOffset+20
		}, want: DropBadVnetHdr},
		{name: "csum_offset udp's on tcp", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) { h.CsumOffset = pkUDPChecksumOffset }, want: DropBadVnetHdr},
		{name: "csum_offset tcp's on udp", spec: v6v4, inner: VirtioNetHdrGSOUDPL4, want: DropBadVnetHdr},
		{name: "csum_offset beyond frame", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, n int) { h.CsumOffset = uint16(n) }, want: DropBadVnetHdr},
		{name: "tcp header beyond frame", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, n int) { h.CsumStart = uint16(n - tcpMinHdrLen + 1) }, want: DropBadVnetHdr},
		{name: "offsets at 0xffff", spec: v6v4, mut: func(h *VirtioNetHdrTunnel, _ int) {
			h.OuterTHOffset, h.InnerNHOffset, h.CsumStart = 0xffff, 0xffff, 0xffff
		}, want: DropBadVnetHdr},
		{name: "udp l4 inner_nh beyond frame", spec: v6v4, inner: VirtioNetHdrGSOUDPL4, mut: func(h *VirtioNetHdrTunnel, n int) {
			h.CsumOffset, h.InnerNHOffset, h.CsumStart = pkUDPChecksumOffset, uint16(n), uint16(n+20)
		}, want: DropBadVnetHdr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inner := tt.inner
			if inner == 0 {
				inner = VirtioNetHdrGSOTCPv4
				if tt.spec.inner.l3 == L3IPv6 {
					inner = VirtioNetHdrGSOTCPv6
				}
			}
			h, frame := pkVxSuperFrame(t, tt.spec, inner, 1000)
			if tt.mut != nil {
				tt.mut(&h, len(frame))
			}
			if got := h.check(frame); got != tt.want {
				t.Errorf("check(%+v): got %v, want %v", h, got, tt.want)
			}
			// check never reads beyond the frame, whatever the
			// offsets: on the headers alone it must not panic either.
			h.check(frame[:min(len(frame), int(h.CsumStart))])
		})
	}
}
