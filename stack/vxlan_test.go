package stack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// The VXLAN tests' outer addresses and VNI: rx (the stack under test) at
// 2001:db8::21, the peer at 2001:db8::22.
var (
	vxOuterRX   = netip.MustParseAddr("2001:db8::21")
	vxOuterPeer = netip.MustParseAddr("2001:db8::22")
)

const vxTestVNI = 77

// vxlanPair builds two stacks on an in-memory wire, each with a VXLAN device
// to the other: rx (driver config dc) with inner 10.79.0.2 and fd79::2, the
// peer with 10.79.0.1 and fd79::1. Every inner packet, both ways, is
// encapsulated by one stack's VXLAN device, merged by the other's GRO inside
// the tunnel and decapsulated by its VXLAN device; ARP and neighbour
// discovery run inside the tunnel and outside.
func vxlanPair(t *testing.T, dc driver.Config) (rx, peer *Stack) {
	t.Helper()
	return newPair(t, Config{
		Addrs:  []netip.Prefix{netip.MustParsePrefix("2001:db8::1/64")},
		Driver: dc,
		VXLAN: &VXLANConfig{Local: vxOuterRX, Remote: vxOuterPeer, VNI: vxTestVNI, Addrs: []netip.Prefix{
			netip.MustParsePrefix("10.79.0.2/24"), netip.MustParsePrefix("fd79::2/64")}},
	}, Config{
		Addrs: []netip.Prefix{netip.MustParsePrefix("2001:db8::2/64")},
		MAC:   [6]byte{0x02, 0, 0, 0, 0x22, 0x01},
		VXLAN: &VXLANConfig{Local: vxOuterPeer, Remote: vxOuterRX, VNI: vxTestVNI, Addrs: []netip.Prefix{
			netip.MustParsePrefix("10.79.0.1/24"), netip.MustParsePrefix("fd79::1/64")}},
	})
}

// TestVXLANBulkMem sends a TCP stream through the VXLAN tunnel, IPv4 and
// IPv6 inside, and checks every byte, that GRO merged inside the tunnel,
// that the VXLAN devices took and sent the packets both ways, and that hds
// auto left no payload in the linear parts.
func TestVXLANBulkMem(t *testing.T) {
	const size = 8 << 20
	for _, tc := range []struct {
		dst string
		dc  driver.Config
	}{
		{"10.79.0.2:9", driver.Config{LRO: true}},
		{"[fd79::2]:9", driver.Config{LRO: true}},
		{"10.79.0.2:9", driver.Config{}},
	} {
		t.Run(tc.dst, func(t *testing.T) {
			rx, peer := vxlanPair(t, tc.dc)
			bulkTo(t, rx, peer, netip.MustParseAddrPort(tc.dst), size)
			c, p := counterMap(rx), counterMap(peer)
			if c["rx_vxlan_frames"] == 0 || c["vxlan_rx_packets"] == 0 {
				t.Errorf("rx_vxlan_frames %d, vxlan_rx_packets %d: want both > 0", c["rx_vxlan_frames"], c["vxlan_rx_packets"])
			}
			if c["rx_gro_tunnel_skbs"] == 0 || c["rx_gro_tunnel_packets"] <= c["rx_gro_tunnel_skbs"] {
				t.Errorf("rx_gro_tunnel_packets %d into rx_gro_tunnel_skbs %d: want merges inside the tunnel", c["rx_gro_tunnel_packets"], c["rx_gro_tunnel_skbs"])
			}
			if c["vxlan_tx_packets"] == 0 || p["vxlan_rx_packets"] == 0 {
				t.Errorf("replies: rx vxlan_tx_packets %d, peer vxlan_rx_packets %d: want both > 0", c["vxlan_tx_packets"], p["vxlan_rx_packets"])
			}
			if tc.dc.LRO && c["rx_hds_payload_bytes"] != 0 {
				t.Errorf("rx_hds_payload_bytes with hds auto: got %d, want 0", c["rx_hds_payload_bytes"])
			}
			for _, name := range []string{"rx_dropped", "vxlan_rx_dropped", "vxlan_rx_other_host", "vxlan_tx_errors"} {
				if c[name] != 0 || p[name] != 0 {
					t.Errorf("%s: got %d (rx) and %d (peer), want 0", name, c[name], p[name])
				}
			}
		})
	}
}

// vxFrame builds the linear part of a VXLAN packet to rx's device as GRO
// lets it go: outer Ethernet, IPv6, UDP (checksum filled in) and VXLAN
// headers, then an inner Ethernet frame to dstMAC carrying an IPv4 header
// to 10.79.0.2 and 20 bytes of TCP header.
func vxFrame(vxc *VXLANConfig, dstMAC [6]byte) []byte {
	const inner = 14 + 20 + 20
	b := make([]byte, vxlanOuterLen+inner)
	binary.BigEndian.PutUint16(b[12:], uint16(header.IPv6ProtocolNumber))
	ip := header.IPv6(b[14:])
	ip.Encode(&header.IPv6Fields{PayloadLength: uint16(8 + 8 + inner), TransportProtocol: header.UDPProtocolNumber, HopLimit: 64,
		SrcAddr: addrOf(vxOuterPeer), DstAddr: addrOf(vxc.Local)})
	udp := header.UDP(b[54:])
	udp.Encode(&header.UDPFields{SrcPort: 40000, DstPort: vxc.Port, Length: uint16(8 + 8 + inner)})
	binary.BigEndian.PutUint32(b[62:], vxlanFlagI)
	binary.BigEndian.PutUint32(b[66:], vxc.VNI<<8)
	copy(b[70:], dstMAC[:])
	binary.BigEndian.PutUint16(b[70+12:], uint16(header.IPv4ProtocolNumber))
	in := b[84:]
	in[0] = 0x45
	binary.BigEndian.PutUint16(in[2:], 40)
	in[9] = 6
	copy(in[16:], []byte{10, 79, 0, 2})
	sum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), udp.Length())
	udp.SetChecksum(^checksum.Checksum(b[54:], sum))
	return b
}

func addrOf(a netip.Addr) tcpip.Address { return tcpip.AddrFromSlice(a.AsSlice()) }

// TestVXLANDecap checks what the VXLAN device takes, refuses (and counts)
// and leaves to the wire's NIC, and what a taken packet looks like after
// decap.
func TestVXLANDecap(t *testing.T) {
	vxc := VXLANConfig{Local: vxOuterRX, Remote: vxOuterPeer, VNI: vxTestVNI, Addrs: []netip.Prefix{netip.MustParsePrefix("10.79.0.2/24")}}
	if err := vxc.validate(DefaultMAC); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		mut     func(b []byte)
		want    vxlanVerdict
		counter string
	}{
		{"ours", func([]byte) {}, vxlanInner, "vxlan_rx_packets"},
		{"broadcast inside", func(b []byte) { copy(b[70:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) }, vxlanInner, "vxlan_rx_packets"},
		{"other vni", func(b []byte) { b[68]++ }, vxlanDrop, "vxlan_rx_dropped"},
		{"reserved vni bits", func(b []byte) { b[69] = 1 }, vxlanDrop, "vxlan_rx_dropped"},
		{"no I flag", func(b []byte) { b[62] = 0 }, vxlanDrop, "vxlan_rx_dropped"},
		{"other flag", func(b []byte) { b[63] = 0x80 }, vxlanDrop, "vxlan_rx_dropped"},
		{"zero udp checksum", func(b []byte) { b[60], b[61] = 0, 0 }, vxlanDrop, "vxlan_rx_dropped"},
		{"udp length", func(b []byte) { b[59]-- }, vxlanDrop, "vxlan_rx_dropped"},
		{"other host inside", func(b []byte) { b[75] ^= 0x40 }, vxlanDrop, "vxlan_rx_other_host"},
		{"other port", func(b []byte) { b[57]++ }, vxlanNotOurs, ""},
		{"other destination", func(b []byte) { b[14+39]++ }, vxlanNotOurs, ""},
		{"outer ipv4", func(b []byte) { b[12], b[13] = 0x08, 0x00 }, vxlanNotOurs, ""},
		{"outer extension header", func(b []byte) { b[14+6] = 60 }, vxlanNotOurs, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newVXLANEndpoint(&vxc, 1500)
			b := vxFrame(&vxc, vxc.MAC)
			tc.mut(b)
			p := bufpool.NewPacket()
			defer p.Release()
			p.Linear = append(p.Linear, b...)
			p.Len, p.HdrLen = len(b), len(b)
			if got := v.decap(p); got != tc.want {
				t.Fatalf("decap: got %v, want %v", got, tc.want)
			}
			c := map[string]uint64{}
			v.stats.each(func(n string, x uint64) { c[n] = x })
			for n, x := range c {
				if want := uint64(0); n == tc.counter {
					if x != 1 {
						t.Errorf("%s: got %d, want 1", n, x)
					}
				} else if x != want {
					t.Errorf("%s: got %d, want 0", n, x)
				}
			}
			if tc.want == vxlanInner {
				if len(p.Linear) != len(b)-vxlanOuterLen || p.Len != len(b)-vxlanOuterLen || &p.Linear[0] == &b[0] ||
					p.Linear[12] != 0x08 || p.HeadersSet {
					t.Errorf("after decap: linear %d bytes (want %d), len %d, ethertype %#x, headers set %v",
						len(p.Linear), len(b)-vxlanOuterLen, p.Len, p.Linear[12], p.HeadersSet)
				}
			} else if len(p.Linear) != len(b) {
				t.Errorf("a packet decap did not take lost bytes: %d of %d", len(p.Linear), len(b))
			}
		})
	}
}

// TestVXLANDeliverNoAllocs pins the link endpoint's hand-off of a VXLAN
// packet to the VXLAN device (decap, then the copy into gVisor) at zero heap
// allocations per packet, and checks that it reaches the VXLAN NIC, not the
// wire's.
func TestVXLANDeliverNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	pool := testutil.NewPool(t, bufpool.Config{Memory: newViewMemory(), RingSize: 64})
	defer pool.Close()
	vxc := VXLANConfig{Local: vxOuterRX, Remote: vxOuterPeer, VNI: vxTestVNI, Addrs: []netip.Prefix{netip.MustParsePrefix("10.79.0.2/24")}}
	if err := vxc.validate(DefaultMAC); err != nil {
		t.Fatal(err)
	}
	var wire, vx nullDispatcher
	ep := &linkEndpoint{lend: new(lendStats), vxlan: newVXLANEndpoint(&vxc, 1500)}
	ep.Attach(&wire)
	ep.vxlan.Attach(&vx)
	hdr := vxFrame(&vxc, vxc.MAC)
	deliver := func() {
		pkt := bufpool.NewPacket()
		pkt.Linear = append(pkt.Linear, hdr...)
		pkt.HdrLen, pkt.Len, pkt.CsumVerified = len(hdr), len(hdr), true
		pg, err := pool.Get()
		if err != nil {
			t.Fatal(err)
		}
		pkt.Frags = append(pkt.Frags, bufpool.Frag{Page: pg, Len: 1400})
		pkt.Len += 1400
		pg.IncRef()
		pool.Recycle(pg)
		ep.Deliver(pkt)
	}
	for range 100 {
		deliver()
	}
	if allocs := testing.AllocsPerRun(500, deliver); allocs != 0 {
		t.Errorf("allocations per packet to the VXLAN device: got %v, want 0", allocs)
	}
	if vx.n != 601 || wire.n != 0 {
		t.Errorf("packets dispatched: got %d to the VXLAN NIC and %d to the wire, want 601 and 0", vx.n, wire.n)
	}
}

// FuzzVXLANDecap feeds decap arbitrary linear parts: it never panics, and a
// packet it takes loses exactly the outer headers.
func FuzzVXLANDecap(f *testing.F) {
	vxc := VXLANConfig{Local: vxOuterRX, Remote: vxOuterPeer, VNI: vxTestVNI, Addrs: []netip.Prefix{netip.MustParsePrefix("10.79.0.2/24")}}
	if err := vxc.validate(DefaultMAC); err != nil {
		f.Fatal(err)
	}
	good := vxFrame(&vxc, vxc.MAC)
	f.Add(good, 0)
	f.Add(good[:vxlanOuterLen+6], 0)
	f.Add(good, 1000)
	f.Fuzz(func(t *testing.T, b []byte, extra int) {
		if len(b) > bufpool.MaxLinear {
			b = b[:bufpool.MaxLinear]
		}
		v := newVXLANEndpoint(&vxc, 1500)
		p := bufpool.NewPacket()
		defer p.Release()
		p.Linear = append(p.Linear, b...)
		p.Len, p.HdrLen = len(b)+max(extra, 0)%65536, len(b)
		before := len(p.Linear)
		switch v.decap(p) {
		case vxlanInner:
			if len(p.Linear) != before-vxlanOuterLen {
				t.Fatalf("decap took %d bytes, want %d", before-len(p.Linear), vxlanOuterLen)
			}
		default:
			if len(p.Linear) != before {
				t.Fatalf("decap changed a packet it did not take")
			}
		}
	})
}

// TestVXLANConfigErrors checks the configurations New rejects.
func TestVXLANConfigErrors(t *testing.T) {
	inner := []netip.Prefix{netip.MustParsePrefix("10.79.0.2/24")}
	for _, tc := range []struct {
		name string
		vc   VXLANConfig
	}{
		{"ipv4 local", VXLANConfig{Local: netip.MustParseAddr("10.0.0.1"), Remote: vxOuterPeer, VNI: 1, Addrs: inner}},
		{"no remote", VXLANConfig{Local: vxOuterRX, VNI: 1, Addrs: inner}},
		{"multicast remote", VXLANConfig{Local: vxOuterRX, Remote: netip.MustParseAddr("ff02::1"), VNI: 1, Addrs: inner}},
		{"vni 0", VXLANConfig{Local: vxOuterRX, Remote: vxOuterPeer, Addrs: inner}},
		{"vni too big", VXLANConfig{Local: vxOuterRX, Remote: vxOuterPeer, VNI: 1 << 24, Addrs: inner}},
		{"no inner address", VXLANConfig{Local: vxOuterRX, Remote: vxOuterPeer, VNI: 1}},
		{"multicast mac", VXLANConfig{Local: vxOuterRX, Remote: vxOuterPeer, VNI: 1, Addrs: inner, MAC: [6]byte{1, 0, 0, 0, 0, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := driver.NewMemPair(4, 2048)
			_, err := New(Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("2001:db8::1/64")}, VXLAN: &tc.vc})
			if err == nil {
				t.Fatal("New: got nil error, want one")
			}
		})
	}
}
