package driver

import (
	"bytes"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// vnet24Wire is a MemWire whose frames carry the 24-byte virtio-net header
// of a TAP with UDP tunnel GSO (TAPConfig.UDPTunnel).
type vnet24Wire struct{ *MemWire }

func (vnet24Wire) VnetHdrLen() int { return VirtioNetHdrTunnelLen }

// startVXLANDriver starts a driver for cfg on a 24-byte-header wire with
// the VXLAN port 4789 and the outer destination MAC of pkVxSpec's frames.
func startVXLANDriver(t *testing.T, cfg Config, h Handler) (*Driver, *MemWire) {
	t.Helper()
	a, b := NewMemPair(64, VirtioNetHdrTunnelLen+maxLROFrame+maxTunnelOuterLen)
	copy(cfg.MAC[:], pkVxDstMAC)
	pool := testutil.NewPool(t, bufpool.Config{RingSize: 1 << 16, Poison: true})
	cfg.Pool = pool
	cfg.VXLANPorts = []uint16{4789}
	d, err := New(vnet24Wire{a}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.Start(h)
	t.Cleanup(func() {
		closeWithin(t, d)
		b.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("pages in use after Close: got %d, want 0", n)
		}
	})
	return d, b
}

// wireFrame24 is wireFrame for a 24-byte header.
func wireFrame24(h VirtioNetHdrTunnel, frame []byte) []byte {
	b := make([]byte, VirtioNetHdrTunnelLen+len(frame))
	h.Encode(b)
	copy(b[VirtioNetHdrTunnelLen:], frame)
	return b
}

// waitPolled waits for the poll loop's counters of n packets.
func waitPolled(t *testing.T, st *Stats, n uint64) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); st.Packets.Load() < n; {
		if time.Now().After(end) {
			t.Fatalf("rx_packets: %d, want %d", st.Packets.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestVXLANSuperFrame sends a TCP super-frame inside VXLAN over IPv6, as a
// TAP with UDP tunnel GSO reads it from a vxlan device, and checks that the
// NIC model cuts it into the segments the wire would have carried (byte
// for byte those built from scratch), with the header copy estimated from
// the inner headers (hds auto: inner Ethernet, IP and TCP with timestamps)
// and the outer headers pulled for GRO, or a fixed 256-byte copy that takes
// payload too.
func TestVXLANSuperFrame(t *testing.T) {
	for _, tc := range []struct {
		name  string
		inner L3Type
		hds   int
	}{
		{"inner-ipv4/hds-auto", L3IPv4, HDSAuto},
		{"inner-ipv6/hds-auto", L3IPv6, HDSAuto},
		{"inner-ipv4/hds-256", L3IPv4, 256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{keep: true}
			// MTU 4096: the nonlinear RQ, whose header copy is under test.
			d, w := startVXLANDriver(t, Config{MTU: 4096, HDS: tc.hds}, c)
			gt := uint8(VirtioNetHdrGSOTCPv4)
			ipLen := header.IPv4MinimumSize
			if tc.inner == L3IPv6 {
				gt, ipLen = VirtioNetHdrGSOTCPv6, header.IPv6MinimumSize
			}
			gso := 1500 - 70 - ipLen - 32 // the inner MSS at the vxlan device's MTU
			const segs = 7
			spec := pkVxSpec{outer: L3IPv6, csum: true, inner: pkSpec{l3: tc.inner, proto: protoTCP, tcpTS: true,
				tcpFlags: header.TCPFlagAck | header.TCPFlagPsh, seq: 5000, ack: 1, payload: pkPayload(segs*gso - 100)}}
			h, frame := pkVxSuperFrame(t, spec, gt, uint16(gso))
			if err := w.Write(wireFrame24(h, frame)); err != nil {
				t.Fatal(err)
			}
			c.waitFor(t, segs)
			st := d.Stats()
			waitPolled(t, st, segs)
			hdrLen := 14 + 40 + 8 + 8 + 14 + ipLen + 32
			minLen := 14 + ipLen + 32 // mlx5e_cqe_get_min_hdr_len over the inner types
			c.mu.Lock()
			defer c.mu.Unlock()
			for i := range segs {
				if want := pkVxWant(spec, gso, i, segs, false); !bytes.Equal(c.frames[i], want) {
					t.Errorf("segment %d: first difference at byte %d\ngot  %x\nwant %x", i, pkFirstDiff(c.frames[i], want), c.frames[i], want)
				}
				wantLin := hdrLen
				if tc.hds == 256 {
					wantLin = 256
				}
				if c.linears[i] != wantLin {
					t.Errorf("segment %d: linear part %d bytes, want %d (every header, for GRO)", i, c.linears[i], wantLin)
				}
			}
			copied, pulled, payload := uint64(segs*minLen), uint64(segs*(hdrLen-minLen)), uint64(0)
			if tc.hds == 256 {
				copied, pulled, payload = segs*256, 0, uint64(segs*(256-hdrLen))
			}
			for _, cn := range []struct {
				name      string
				got, want uint64
			}{
				{"rx_vxlan_frames", st.VXLANFrames.Load(), segs},
				{"rx_gso_tunnel_frames", st.TunnelGSOFrames.Load(), 1},
				{"rx_gso_segs", st.GSOSegs.Load(), segs},
				{"rx_csum_partial", st.CsumPartial.Load(), 0}, // segments are placed trusted, not counted as wire frames
				{"rx_hds_bytes", st.HDSBytes.Load(), copied},
				{"rx_hds_pull_bytes", st.HDSPull.Load(), pulled},
				{"rx_hds_payload_bytes", st.HDSPayload.Load(), payload},
			} {
				if cn.got != cn.want {
					t.Errorf("%s: got %d, want %d", cn.name, cn.got, cn.want)
				}
			}
		})
	}
}

// TestVXLANFrameChecksum sends single VXLAN frames with every checksum
// filled in and no virtio-net flags: the NIC verifies the outer and the
// inner checksums, and a bad inner one makes the frame CHECKSUM_NONE, as
// a bad outer one does. A frame to another UDP port is plain UDP to it.
func TestVXLANFrameChecksum(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		badInner             bool
		port                 uint16
		wantVX, wantComplete uint64
	}{
		{"good", false, 4789, 1, 1},
		{"bad-inner-tcp", true, 4789, 1, 0},
		{"other-port", false, 8472, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{keep: true}
			d, w := startVXLANDriver(t, Config{MTU: 4096}, c)
			spec := pkVxSpec{outer: L3IPv6, inner: pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true,
				tcpFlags: header.TCPFlagAck, seq: 7, ack: 1, payload: pkPayload(300), csum: pkCsumFull}}
			inner := spec.inner.build()
			if tc.badInner {
				inner[14+20+16] ^= 0x55 // the inner TCP checksum
			}
			frame := spec.wrap(inner, 0, pkCsumFull, 0)
			oth, _ := spec.offsets()
			if tc.port != 4789 {
				header.UDP(frame[oth:]).SetDestinationPort(tc.port)
				header.UDP(frame[oth:]).SetChecksum(0)
				frame = pkSpecRechecksumUDP6(frame, oth)
			}
			if err := w.Write(wireFrame24(VirtioNetHdrTunnel{}, frame)); err != nil {
				t.Fatal(err)
			}
			c.waitFor(t, 1)
			st := d.Stats()
			waitPolled(t, st, 1)
			c.mu.Lock()
			defer c.mu.Unlock()
			if !bytes.Equal(c.frames[0], frame) {
				t.Errorf("frame handed up changed:\ngot  %x\nwant %x", c.frames[0], frame)
			}
			if got := st.VXLANFrames.Load(); got != tc.wantVX {
				t.Errorf("rx_vxlan_frames: got %d, want %d", got, tc.wantVX)
			}
			if got := st.CsumComplete.Load() + st.CsumNone.Load(); got != 1 {
				t.Errorf("rx_csum_complete + rx_csum_none: got %d, want 1", got)
			}
			if tc.wantVX == 1 && c.linears[0] != 14+40+8+8+14+20+32 {
				t.Errorf("linear part: %d bytes, want every header", c.linears[0])
			}
			if got, want := c.verified[0], tc.wantComplete == 1; got != want {
				t.Errorf("CsumVerified: got %v, want %v", got, want)
			}
		})
	}
}

// pkSpecRechecksumUDP6 fills in the outer UDP checksum of frame, an
// Ethernet + IPv6 frame whose UDP header is at oth.
func pkSpecRechecksumUDP6(frame []byte, oth int) []byte {
	ip := header.IPv6(frame[header.EthernetMinimumSize:])
	udp := frame[oth:]
	udp = udp[:header.UDP(udp).Length()]
	header.UDP(udp).SetChecksum(0)
	sum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(udp)))
	c := ^checksum.Checksum(udp, sum)
	if c == 0 {
		c = 0xffff
	}
	header.UDP(udp).SetChecksum(c)
	return frame
}
