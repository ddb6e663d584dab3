package driver

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// The test tunnel's outer addresses: the driver's local one and the peer's.
var (
	pkTunLocal  = netip.MustParseAddr("fd77::3")
	pkTunRemote = netip.MustParseAddr("fd77::1")
)

// pkTunnel wraps the Ethernet frame inner into an outer IPv6 header from
// pkTunRemote to dst with next header nh (4 or 41 for a tunnel), keeping
// inner's Ethernet addresses. ext adds a destination options header of 8
// bytes (a tunnel encapsulation limit option's size) between the two.
func pkTunnel(inner []byte, dst netip.Addr, nh uint8, ext bool) []byte {
	ip := inner[header.EthernetMinimumSize:]
	var ser header.IPv6ExtHdrSerializer
	if ext {
		ser = header.IPv6ExtHdrSerializer{header.IPv6SerializableHopByHopExtHdr{&header.IPv6RouterAlertOption{}}}
	}
	outer := header.IPv6MinimumSize + ser.Length()
	b := make([]byte, header.EthernetMinimumSize+outer+len(ip))
	copy(b, inner[:12])
	binary.BigEndian.PutUint16(b[12:], etherTypeIPv6)
	header.IPv6(b[14:]).Encode(&header.IPv6Fields{
		PayloadLength:     uint16(outer - header.IPv6MinimumSize + len(ip)),
		TransportProtocol: tcpip.TransportProtocolNumber(nh),
		HopLimit:          64,
		SrcAddr:           tcpip.AddrFrom16(pkTunRemote.As16()),
		DstAddr:           tcpip.AddrFrom16(dst.As16()),
		ExtensionHeaders:  ser,
	})
	if ext {
		b[14+6] = protoDestOpts // same layout as the hop-by-hop header
		b[14+header.IPv6MinimumSize] = nh
	}
	copy(b[14+outer:], ip)
	return b
}

// pkInner returns a TCP segment with timestamps to put in a tunnel.
func pkInner(l3 L3Type, payload int) *pkSpec {
	return &pkSpec{l3: l3, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck, seq: 7, ack: 9, payload: pkPayload(payload)}
}

func tunnelConfig(cfg Config) Config {
	cfg.Tunnel = TunnelConfig{Local: []netip.Addr{pkTunLocal}}
	return cfg
}

// TestTunnelRx sends IPv4-in-IPv6 and IPv6-in-IPv6 frames and checks that
// each is handed up decapsulated, byte for byte the inner frame, with the
// header copy taken over the outer and inner headers (hds auto: the inner
// headers only once the outer header is dropped) and the checksum state of
// the inner packet.
func TestTunnelRx(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		l3       L3Type
		ext      bool
		vnet     VirtioNetHdr
		csum     pkCsum
		wantLin  int // 0: MinHeaderLen of the inner frame; -1: the whole inner frame, nothing copied (linear)
		wantCsum func(*Stats) uint64
	}{
		// MTU 1500 with LRO off is mlx5's linear RQ: the frame is the
		// linear part, decapsulated in place, nothing copied.
		{name: "ipip6/linear", l3: L3IPv4, wantLin: -1, wantCsum: func(s *Stats) uint64 { return s.CsumComplete.Load() }},
		{name: "ip6ip6/linear", l3: L3IPv6, wantLin: -1, wantCsum: func(s *Stats) uint64 { return s.CsumComplete.Load() }},
		// MTU 4096: the nonlinear RQ, whose header copy is under test.
		{name: "ipip6/hds-auto/csum-complete", cfg: Config{MTU: 4096}, l3: L3IPv4, wantCsum: func(s *Stats) uint64 { return s.CsumComplete.Load() }},
		{name: "ip6ip6/hds-auto/csum-complete", cfg: Config{MTU: 4096}, l3: L3IPv6, wantCsum: func(s *Stats) uint64 { return s.CsumComplete.Load() }},
		{name: "ipip6/lro/cyclic/needs-csum", cfg: Config{LRO: true, RQ: RQCyclic}, l3: L3IPv4, csum: pkCsumPartial,
			vnet:     VirtioNetHdr{Flags: VirtioNetHdrFNeedsCsum, CsumStart: 14 + 40 + 20, CsumOffset: 16},
			wantCsum: func(s *Stats) uint64 { return s.CsumPartial.Load() }},
		{name: "ip6ip6/data-valid", cfg: Config{MTU: 4096}, l3: L3IPv6, csum: pkCsumZero, vnet: VirtioNetHdr{Flags: VirtioNetHdrFDataValid},
			wantCsum: func(s *Stats) uint64 { return s.CsumUnneeded.Load() }},
		{name: "ipip6/hds-256", cfg: Config{HDS: 256, MTU: 4096}, l3: L3IPv4, wantLin: 256 - 40,
			wantCsum: func(s *Stats) uint64 { return s.CsumComplete.Load() }},
		// Outer extension headers are left out of the estimate: the copy
		// falls short of the inner headers by their length, which the
		// driver pulls from the frags (rx_hds_pull_bytes).
		{name: "ip6ip6/outer-dest-opts", cfg: Config{MTU: 4096}, l3: L3IPv6, ext: true, wantLin: 14 + 40 + 32 - 8,
			wantCsum: func(s *Stats) uint64 { return s.CsumComplete.Load() }},
		{name: "ipip6/hw-gro", cfg: Config{HWGRO: HWGROOn}, l3: L3IPv4,
			wantCsum: func(s *Stats) uint64 { return s.CsumComplete.Load() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{keep: true}
			d, w := newTestDriver(t, tunnelConfig(tc.cfg), c)
			spec := pkInner(tc.l3, 1000)
			spec.csum = tc.csum
			inner := spec.build()
			nh := uint8(protoIPIP)
			if tc.l3 == L3IPv6 {
				nh = protoIPv6
			}
			frame := pkTunnel(inner, pkTunLocal, nh, tc.ext)
			if tc.ext && tc.vnet.Flags&VirtioNetHdrFNeedsCsum != 0 {
				tc.vnet.CsumStart += 8
			}
			if err := w.Write(wireFrame(tc.vnet, frame)); err != nil {
				t.Fatal(err)
			}
			c.waitFor(t, 1)
			c.mu.Lock()
			defer c.mu.Unlock()
			if !bytes.Equal(c.frames[0], inner) {
				t.Errorf("packet handed up:\ngot  %x\nwant %x (the inner frame)", c.frames[0], inner)
			}
			var fi FrameInfo
			if d := ParseFrame(inner, &fi); d != DropNone {
				t.Fatal(d)
			}
			want, wantLinear := tc.wantLin, uint64(0)
			switch want {
			case 0:
				want = MinHeaderLen(&fi)
			case -1:
				want, wantLinear = len(inner), 1
			}
			if wantPart := max(want, fi.HeaderLen()); c.linears[0] != wantPart {
				t.Errorf("linear part: got %d bytes, want %d", c.linears[0], wantPart)
			}
			st := d.Stats()
			// The poll loop adds its counters after it handed the
			// batch up: wait for them.
			for end := time.Now().Add(5 * time.Second); st.SKBLinear.Load()+st.SKBNonlinear.Load() == 0 && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			if got := st.SKBLinear.Load(); got != wantLinear {
				t.Errorf("rx_skb_linear: got %d, want %d", got, wantLinear)
			}
			if wantLinear == 1 {
				want = 0 // nothing copied
			}
			if got := st.TunnelDecap.Load(); got != 1 {
				t.Errorf("rx_tunnel_decap: got %d, want 1", got)
			}
			if got := tc.wantCsum(st); got != 1 {
				t.Errorf("checksum state counter: got %d, want 1", got)
			}
			if tc.cfg.HDS == HDSAuto && !tc.ext && st.HDSPayload.Load() != 0 {
				t.Errorf("rx_hds_payload_bytes: got %d, want 0", st.HDSPayload.Load())
			}
			if got, want := st.HDSBytes.Load(), uint64(want); got != want {
				t.Errorf("rx_hds_bytes: got %d, want %d", got, want)
			}
			if got, want := st.HDSPull.Load(), uint64(max(fi.HeaderLen()-want, 0)); wantLinear == 0 && got != want {
				t.Errorf("rx_hds_pull_bytes: got %d, want %d", got, want)
			}
		})
	}
}

// TestTunnelDrops checks the frames the tunnel drops, each by its reason,
// and those it leaves alone.
func TestTunnelDrops(t *testing.T) {
	inner4 := pkInner(L3IPv4, 100).build()
	inner6 := pkInner(L3IPv6, 100).build()
	icmp := pkSpec{l3: L3IPv6, proto: protoICMPv6, payload: pkPayload(8)}
	icmpFrame := icmp.build()
	// The ICMPv6 frame, sent to the tunnel address.
	copy(icmpFrame[14+24:], pkTunLocal.AsSlice())
	icmpFrame = pkSpecRechecksum(icmpFrame)
	gso, _, _ := tcpSuper(t, L3IPv4, 3000)
	for _, tc := range []struct {
		name string
		h    VirtioNetHdr
		b    []byte
		want Drop // DropNone: handed up as sent
	}{
		{"tcp to tunnel address", VirtioNetHdr{}, pkTunnel(inner4, pkTunLocal, protoTCP, false), DropTunnelProto},
		{"ipv6 inside next header 4", VirtioNetHdr{}, pkTunnel(inner6, pkTunLocal, protoIPIP, false), DropBadIPVersion},
		{"truncated inner", VirtioNetHdr{}, pkTunnel(inner4[:14+10], pkTunLocal, protoIPIP, false), DropShortIP},
		{"gso", gso, pkTunnel(inner4, pkTunLocal, protoIPIP, false), DropBadTunnel},
		{"csum_start in outer header", VirtioNetHdr{Flags: VirtioNetHdrFNeedsCsum, CsumStart: 14, CsumOffset: 16}, pkTunnel(inner4, pkTunLocal, protoIPIP, false), DropBadVnetHdr},
		{"icmpv6 to tunnel address", VirtioNetHdr{}, icmpFrame, DropNone},
		{"ipip6 to another address", VirtioNetHdr{}, pkTunnel(inner4, pkTunRemote, protoIPIP, false), DropNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{keep: true}
			d, w := newTestDriver(t, tunnelConfig(Config{}), c)
			if err := w.Write(wireFrame(tc.h, tc.b)); err != nil {
				t.Fatal(err)
			}
			good := pkTunnel(inner4, pkTunLocal, protoIPIP, false)
			if err := w.Write(wireFrame(VirtioNetHdr{}, good)); err != nil {
				t.Fatal(err)
			}
			if tc.want != DropNone {
				c.waitFor(t, 1)
				if got := d.Stats().Dropped[tc.want].Load(); got != 1 {
					t.Errorf("%v: got %d, want 1 (drops: %v)", tc.want, got, dropList(d.Stats()))
				}
				c.mu.Lock()
				defer c.mu.Unlock()
				if !bytes.Equal(c.frames[0], inner4) {
					t.Errorf("the good frame after the dropped one: got %x, want %x", c.frames[0], inner4)
				}
				return
			}
			c.waitFor(t, 2)
			c.mu.Lock()
			defer c.mu.Unlock()
			if !bytes.Equal(c.frames[0], tc.b) {
				t.Errorf("frame handed up: got %x, want it unchanged %x", c.frames[0], tc.b)
			}
			if got := d.Stats().TunnelDecap.Load(); got != 1 {
				t.Errorf("rx_tunnel_decap: got %d, want 1 (the good frame only)", got)
			}
		})
	}
}

// pkSpecRechecksum recomputes the ICMPv6 checksum of an IPv6 frame whose
// addresses were changed.
func pkSpecRechecksum(b []byte) []byte {
	ip := header.IPv6(b[14:])
	m := header.ICMPv6(ip.Payload())
	m.SetChecksum(0)
	m.SetChecksum(header.ICMPv6Checksum(header.ICMPv6ChecksumParams{Header: m, Src: ip.SourceAddress(), Dst: ip.DestinationAddress()}))
	return b
}

func dropList(s *Stats) []string {
	var out []string
	for i := Drop(1); i < NumDrops; i++ {
		if v := s.Dropped[i].Load(); v != 0 {
			out = append(out, i.String())
		}
	}
	return out
}

// TestTunnelConfigValidate rejects IPv4 local addresses.
func TestTunnelConfigValidate(t *testing.T) {
	a, _ := NewMemPair(4, 2048)
	defer a.Close()
	_, err := New(a, Config{Tunnel: TunnelConfig{Local: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}})
	if err == nil {
		t.Fatal("New with an IPv4 tunnel address: got nil error, want one")
	}
}

// FuzzDecapsulate feeds a virtio-net header and a frame to the tunnel
// decapsulation and checks that what it accepts is a frame ParseFrame
// accepts the same way once the outer header is removed.
func FuzzDecapsulate(f *testing.F) {
	for _, s := range pkFuzzSeeds() {
		var h [VirtioNetHdrLen]byte
		(&VirtioNetHdr{}).Encode(h[:])
		for _, nh := range []uint8{protoIPIP, protoIPv6} {
			f.Add(append(h[:], pkTunnel(s, pkTunLocal, nh, false)...))
			f.Add(append(h[:], pkTunnel(s, pkTunLocal, nh, true)...))
		}
	}
	var h [VirtioNetHdrLen]byte
	(&VirtioNetHdr{Flags: VirtioNetHdrFNeedsCsum, CsumStart: 14 + 40 + 20, CsumOffset: 16}).Encode(h[:])
	f.Add(append(h[:], pkTunnel(pkInner(L3IPv4, 100).build(), pkTunLocal, protoIPIP, false)...))
	tc := TunnelConfig{Local: []netip.Addr{pkTunLocal}}
	locals := tc.locals()
	f.Fuzz(func(t *testing.T, b []byte) {
		h, frame, fi, ok := fuzzWireFrame(b)
		if !ok {
			return
		}
		orig := bytes.Clone(frame)
		h0 := h
		outer, d := decapsulate(&h, frame, &fi, locals)
		if !bytes.Equal(frame, orig) {
			t.Fatal("decapsulate changed the frame")
		}
		switch {
		case d == DropTunnelProto || d == DropBadTunnel || d == DropBadVnetHdr || (d > DropNone && d <= DropBadUDPLen):
			if outer != 0 {
				t.Fatalf("drop %v with outer length %d, want 0", d, outer)
			}
			return
		case d != DropNone:
			t.Fatalf("decapsulate: got %v, want a parse, tunnel or vnet header reason", d)
		}
		if outer == 0 {
			if h != h0 {
				t.Fatalf("not a tunnel frame, but the header changed: %+v -> %+v", h0, h)
			}
			return
		}
		if outer < ipv6HdrLen || outer > maxTunnelOuterLen {
			t.Fatalf("outer length %d, want 40..%d", outer, maxTunnelOuterLen)
		}
		// The decapsulated frame must parse to what decapsulate reported.
		dec := append(bytes.Clone(frame[:fi.L2Len]), frame[fi.L2Len+outer:]...)
		binary.BigEndian.PutUint16(dec[fi.L2Len-2:], fi.EtherType)
		var want FrameInfo
		if d := ParseFrame(dec, &want); d != DropNone {
			t.Fatalf("decapsulated frame: ParseFrame %v, want none", d)
		}
		if fi != want {
			t.Fatalf("FrameInfo:\ngot  %+v\nwant %+v", fi, want)
		}
		if h.Flags&VirtioNetHdrFNeedsCsum != 0 && (int(h.CsumStart) < fi.L2Len || int(h.CsumStart)+outer != int(h0.CsumStart)) {
			t.Fatalf("csum_start: got %d from %d with outer %d, want it moved by the outer length into the inner packet", h.CsumStart, h0.CsumStart, outer)
		}
		switch d := VerifyChecksums(frame[outer:], &fi, true); d {
		case DropNone, DropBadIPCsum, DropBadL4Csum:
		default:
			t.Errorf("VerifyChecksums: got %v, want none, bad IP or L4 checksum", d)
		}
	})
}
