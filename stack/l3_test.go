package stack

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
)

// TestL3Pair: two stacks on a TUN-like wire (driver.Config.L3: frames are
// IP packets, no Ethernet header) talk with no ARP or NDP and no link
// address: bulk TCP over IPv4 and IPv6 arrives byte for byte, through GRO
// (rx_gro_skbs), LRO (the peer's TSO super-frames, rx_lro_packets) and the
// UDP split path, and no frame is dropped as not IP.
func TestL3Pair(t *testing.T) {
	a, b := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535)
	l3 := Config{Driver: driver.Config{L3: true, LRO: true}}
	rxCfg, peerCfg := l3, l3
	rxCfg.Addrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64")}
	peerCfg.Addrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24"), netip.MustParsePrefix("2001:db8::2/64")}
	rx, peer := newPairOn(t, a, b, rxCfg, peerCfg)
	if got := rx.ep.LinkAddress(); got != "" {
		t.Errorf("link address %q: want none on a TUN", got)
	}
	bulkTo(t, rx, peer, netip.MustParseAddrPort("192.0.2.1:5001"), 8<<20)
	bulkTo(t, rx, peer, netip.MustParseAddrPort("[2001:db8::1]:5002"), 8<<20)
	c := counterMap(rx)
	if c["rx_lro_packets"] == 0 || c["rx_gro_skbs"] == 0 {
		t.Errorf("rx_lro_packets %d, rx_gro_skbs %d: want both > 0", c["rx_lro_packets"], c["rx_gro_skbs"])
	}
	for _, name := range []string{"rx_drop_bad_ip_version", "rx_drop_short_ip", "arp_packets_received"} {
		if c[name] != 0 {
			t.Errorf("%s: %d, want 0", name, c[name])
		}
	}
	// UDP: GRO merges the burst into trains, split again for a gVisor
	// socket (udpHeaders at offset 0).
	dst := netip.MustParseAddrPort("192.0.2.1:6000")
	u, err := rx.ListenUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	skbs := counterMap(rx)["rx_gro_skbs"]
	sent := udpBurst(t, peer, dst, 100, 600)
	buf := make([]byte, 2048)
	for i := range sent {
		u.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _, err := u.ReadFrom(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], sent[i]) {
			t.Fatalf("datagram %d: got %d bytes, want %d as sent", i, n, len(sent[i]))
		}
	}
	if counterMap(rx)["rx_gro_skbs"] == skbs {
		t.Errorf("rx_gro_skbs did not move with the UDP burst")
	}
}
