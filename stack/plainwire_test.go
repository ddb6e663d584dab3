//go:build linux

package stack

import (
	"net/netip"
	"testing"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// plainPair returns two PlainWires over the ends of a SOCK_SEQPACKET
// socket pair: devices that move bare frames, one per read, as a TAP
// opened without IFF_VNET_HDR does.
func plainPair(t *testing.T) (a, b *driver.PlainWire) {
	t.Helper()
	fa, fb := testutil.SeqpacketPair(t, 4<<20) // room for a burst of frames in flight
	return driver.NewPlainWire(fa, 1518), driver.NewPlainWire(fb, 1518)
}

// TestPlainWireTCP: over wires without offloads, gVisor segments and
// checksums what it sends itself (nothing is left for the wire to complete:
// tx_sw_csum and tx_sw_segments stay 0), the NIC model verifies every
// checksum it receives (rx_csum_complete, never rx_csum_partial), and a
// bulk transfer arrives byte for byte.
func TestPlainWireTCP(t *testing.T) {
	a, b := plainPair(t)
	rx, peer := newPairOn(t, a, b,
		Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}},
		Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
	bulkTo(t, rx, peer, netip.MustParseAddrPort("192.0.2.1:5001"), 8<<20)
	c := counterMap(rx)
	// Every IP frame verified by the NIC; rx_csum_none is the ARP frames'.
	if c["rx_csum_complete"] < 1000 || c["rx_csum_partial"] != 0 || c["rx_csum_none"] > 2 {
		t.Errorf("rx_csum_complete %d, rx_csum_partial %d, rx_csum_none %d: want every IP frame verified by the NIC", c["rx_csum_complete"], c["rx_csum_partial"], c["rx_csum_none"])
	}
	for _, w := range []*driver.PlainWire{a, b} {
		if cs, sg := w.TxSWCsum.Load(), w.TxSWSegments.Load(); cs != 0 || sg != 0 {
			t.Errorf("tx_sw_csum %d, tx_sw_segments %d: want 0, the stack does both", cs, sg)
		}
	}
	if v, ok := counterMap(peer)["tx_sw_segments"]; !ok || v != 0 {
		t.Errorf("the peer's counters: tx_sw_segments %d (reported %v), want 0 and reported", v, ok)
	}
	if c["rx_gso_frames"] != 0 {
		t.Errorf("rx_gso_frames %d: want 0, a plain wire carries no super-frames", c["rx_gso_frames"])
	}
}
