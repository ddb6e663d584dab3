package stack

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// tunnelPair builds two stacks on an in-memory wire, each terminating an
// IPv6 tunnel to the other: rx (the stack under test, driver config dc) at
// outer 2001:db8::11 with inner 10.78.0.2 and fd78::2, the peer at outer
// 2001:db8::12 with inner 10.78.0.1 and fd78::1. Every inner packet, both
// ways, is encapsulated by one stack's tunnel NIC and decapsulated by the
// other's driver.
func tunnelPair(t *testing.T, dc driver.Config, zeroCopy bool) (rx, peer *Stack) {
	t.Helper()
	outerRX, outerPeer := netip.MustParseAddr("2001:db8::11"), netip.MustParseAddr("2001:db8::12")
	return newPair(t, Config{
		Addrs:    []netip.Prefix{netip.MustParsePrefix("2001:db8::1/64")},
		Driver:   dc,
		ZeroCopy: zeroCopy,
		Tunnel: &TunnelConfig{Local: outerRX, Remote: outerPeer, Addrs: []netip.Prefix{
			netip.MustParsePrefix("10.78.0.2/24"), netip.MustParsePrefix("fd78::2/64")}},
	}, Config{
		Addrs: []netip.Prefix{netip.MustParsePrefix("2001:db8::2/64")},
		Tunnel: &TunnelConfig{Local: outerPeer, Remote: outerRX, Addrs: []netip.Prefix{
			netip.MustParsePrefix("10.78.0.1/24"), netip.MustParsePrefix("fd78::1/64")}},
	})
}

// TestTunnelBulkMem sends a TCP stream through the tunnel, IPv4-in-IPv6 and
// IPv6-in-IPv6, and checks every byte, that the driver decapsulated, that
// hds auto left no payload in the linear parts, that GRO merged the
// decapsulated segments, and that the replies went back through the peer's
// tunnel.
func TestTunnelBulkMem(t *testing.T) {
	const size = 8 << 20
	for _, tc := range []struct {
		dst string
		dc  driver.Config
		zc  bool
	}{
		{"10.78.0.2:9", driver.Config{}, false},
		{"[fd78::2]:9", driver.Config{}, false},
		{"10.78.0.2:9", driver.Config{LRO: true, HDS: 256}, false},
		{"[fd78::2]:9", driver.Config{HWGRO: driver.HWGROOn}, false},
		{"10.78.0.2:9", driver.Config{}, true},
	} {
		name := fmt.Sprintf("%s/lro-%v/hds-%s/hw-gro-%s/zero-copy-%v", tc.dst, tc.dc.LRO, driver.FormatHDS(tc.dc.HDS), tc.dc.HWGRO, tc.zc)
		t.Run(name, func(t *testing.T) {
			rx, peer := tunnelPair(t, tc.dc, tc.zc)
			bulkTo(t, rx, peer, netip.MustParseAddrPort(tc.dst), size)
			c, p := counterMap(rx), counterMap(peer)
			if c["rx_tunnel_decap"] == 0 || c["tunnel_rx_packets"] == 0 {
				t.Errorf("rx_tunnel_decap %d, tunnel_rx_packets %d: want both > 0", c["rx_tunnel_decap"], c["tunnel_rx_packets"])
			}
			if c["tunnel_tx_packets"] == 0 || p["rx_tunnel_decap"] == 0 {
				t.Errorf("replies: rx tunnel_tx_packets %d, peer rx_tunnel_decap %d: want both > 0", c["tunnel_tx_packets"], p["rx_tunnel_decap"])
			}
			if tc.dc.HDS == driver.HDSAuto && c["rx_hds_payload_bytes"] != 0 {
				t.Errorf("rx_hds_payload_bytes with hds auto: got %d, want 0", c["rx_hds_payload_bytes"])
			}
			if tc.dc.HDS == 256 && c["rx_hds_payload_bytes"] == 0 {
				t.Errorf("rx_hds_payload_bytes with hds 256: got 0, want > 0")
			}
			if c["rx_gro_skbs"] == 0 || c["rx_gro_packets"] <= c["rx_gro_skbs"] {
				t.Errorf("GRO: rx_gro_packets %d into rx_gro_skbs %d, want merges", c["rx_gro_packets"], c["rx_gro_skbs"])
			}
			if tc.zc && c["zc_views_lent"] == 0 {
				t.Errorf("zc_views_lent with zero copy: got 0, want the decapsulated payload lent")
			}
			for _, name := range []string{"rx_dropped", "tunnel_tx_errors"} {
				if c[name] != 0 || p[name] != 0 {
					t.Errorf("%s: got %d (rx) and %d (peer), want 0", name, c[name], p[name])
				}
			}
		})
	}
}

// TestTunnelConfigErrors checks the configurations New rejects.
func TestTunnelConfigErrors(t *testing.T) {
	inner := []netip.Prefix{netip.MustParsePrefix("10.78.0.2/24")}
	for _, tc := range []struct {
		name string
		tc   TunnelConfig
	}{
		{"ipv4 local", TunnelConfig{Local: netip.MustParseAddr("10.0.0.1"), Remote: netip.MustParseAddr("2001:db8::12"), Addrs: inner}},
		{"no remote", TunnelConfig{Local: netip.MustParseAddr("2001:db8::11"), Addrs: inner}},
		{"no inner address", TunnelConfig{Local: netip.MustParseAddr("2001:db8::11"), Remote: netip.MustParseAddr("2001:db8::12")}},
		{"local is a stack address", TunnelConfig{Local: netip.MustParseAddr("2001:db8::1"), Remote: netip.MustParseAddr("2001:db8::12"), Addrs: inner}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := driver.NewMemPair(4, 2048)
			_, err := New(Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("2001:db8::1/64")}, Tunnel: &tc.tc})
			if err == nil {
				t.Fatal("New: got nil error, want one")
			}
		})
	}
}

// TestTunnelDeliverNoAllocs pins the link endpoint's hand-off of a
// decapsulated packet to the tunnel NIC at zero heap allocations per packet
// (zero copy, as TestLendNoAllocs), and checks that a packet for an inner
// address goes to the tunnel NIC and one for another address to the wire's.
func TestTunnelDeliverNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	pool := testutil.NewPool(t, bufpool.Config{Memory: newViewMemory(), RingSize: 64})
	defer pool.Close()
	var wire, tunnel nullDispatcher
	tc := TunnelConfig{Local: netip.MustParseAddr("2001:db8::11"), Remote: netip.MustParseAddr("2001:db8::12"),
		Addrs: []netip.Prefix{netip.MustParsePrefix("10.78.0.2/24")}}
	ep := &linkEndpoint{lend: new(lendStats), tunnel: newTunnelEndpoint(&tc, 1500)}
	ep.Attach(&wire)
	ep.tunnel.Attach(&tunnel)
	hdr := make([]byte, 66)
	hdr[12], hdr[13] = 0x08, 0x00
	hdr[14] = 0x45
	copy(hdr[14+16:], []byte{10, 78, 0, 2})
	other := append([]byte(nil), hdr...)
	copy(other[14+16:], []byte{10, 78, 0, 3})
	deliver := func(h []byte) {
		pkt := bufpool.NewPacket()
		pkt.Linear = append(pkt.Linear, h...)
		pkt.HdrLen = len(h)
		pkt.Len = len(h)
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
		deliver(hdr)
	}
	if allocs := testing.AllocsPerRun(500, func() { deliver(hdr) }); allocs != 0 {
		t.Errorf("allocations per packet to the tunnel: got %v, want 0", allocs)
	}
	deliver(other)
	if tunnel.n != 601 || wire.n != 1 {
		t.Errorf("packets dispatched: got %d to the tunnel and %d to the wire, want 601 and 1", tunnel.n, wire.n)
	}
}
