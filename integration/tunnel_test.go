//go:build linux

package integration

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// newTunnelRig is newRig with an IPv6 tunnel from the kernel in the bed's
// namespace to ustack (testbed.AddIP6Tunnel, mode any), which ustack
// terminates itself (stack.TunnelConfig). The rig's stack addresses
// (r.bed.StackAddr4 and StackAddr6, r.stackAP) are the tunnel's inner ones,
// so that kernelToStack sends through the tunnel. Cleanup removes the
// tunnel with the bed.
func newTunnelRig(t *testing.T, prefix string, mtu int, dc driver.Config) *rig {
	t.Helper()
	return newTunnelRigOn(t, newBed(t, prefix, mtu), mtu, dc)
}

// newTunnelRigOn is newTunnelRig on a bed of the caller's (a TUN's).
func newTunnelRigOn(t *testing.T, bed *testbed.TAPBed, mtu int, dc driver.Config) *rig {
	t.Helper()
	tun, err := bed.PlanIP6Tunnel(testbed.IP6TunnelConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r := newBedRig(t, bed, mtu, stack.Config{
		Driver: dc,
		Tunnel: &stack.TunnelConfig{
			Local:   tun.StackOuter,
			Remote:  tun.KernelDecap6,
			Remote4: tun.KernelDecap4,
			Addrs:   []netip.Prefix{tun.StackInner4, tun.StackInner6},
		},
	})
	view := *bed
	view.StackAddr4, view.StackAddr6 = tun.StackInner4, tun.StackInner6
	r.bed = &view
	if err := tun.Add(); errors.Is(err, testbed.ErrNoIP6Tunnel) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	t.Logf("tunnel: %s mode %s, kernel %s -> stack %s, kernel decapsulates at %s and %s", tun.Kind, tun.Mode,
		tun.KernelOuter, tun.StackOuter, tun.KernelDecap4, tun.KernelDecap6)
	return r
}

// TestTunnelTCP sends a bulk stream from a kernel socket in the namespace
// through an IPv6 tunnel (IPv4-in-IPv6 and IPv6-in-IPv6) to ustack, which
// decapsulates in its driver before GRO, and checks every byte, that the
// driver decapsulated, that hds auto copied headers only (computed over
// the outer and inner headers, the outer dropped) where the header copy
// applies (LRO on; LRO off at MTU 1500 is the linear RQ, which copies
// nothing), and that ustack's
// acknowledgements went back through the tunnel.
func TestTunnelTCP(t *testing.T) {
	needRoot(t)
	const n = 64 << 20
	for i, tc := range []struct {
		v6  bool
		lro bool
		hds int
	}{
		{false, false, driver.HDSAuto},
		{true, false, driver.HDSAuto},
		{false, true, 256},
		{true, true, driver.HDSAuto},
	} {
		lro := map[bool]string{true: "on", false: "off"}[tc.lro]
		name := fmt.Sprintf("%s-in-ipv6/lro-%s/hds-%s", family(tc.v6), lro, driver.FormatHDS(tc.hds))
		t.Run(name, func(t *testing.T) {
			r := newTunnelRig(t, fmt.Sprintf("usit-tnl%d", i), 1500, driver.Config{LRO: tc.lro, HDS: tc.hds})
			elapsed := kernelToStack(t, r, tc.v6, 9, n, uint64(300+i))
			logRate(t, "kernel -> tunnel -> ustack", n, elapsed)

			c := counters(r.st)
			t.Logf("rx_wire_reads %d rx_wire_bytes %d rx_tunnel_decap %d rx_packets %d rx_hds_bytes %d rx_hds_payload_bytes %d rx_csum_partial %d rx_csum_unnecessary %d rx_csum_complete %d rx_gro_packets %d rx_gro_skbs %d tunnel_rx_packets %d tunnel_tx_packets %d",
				c["rx_wire_reads"], c["rx_wire_bytes"], c["rx_tunnel_decap"], c["rx_packets"], c["rx_hds_bytes"], c["rx_hds_payload_bytes"],
				c["rx_csum_partial"], c["rx_csum_unnecessary"], c["rx_csum_complete"], c["rx_gro_packets"], c["rx_gro_skbs"],
				c["tunnel_rx_packets"], c["tunnel_tx_packets"])
			// Every data frame came through the tunnel.
			if got, want := counter(t, r.st, "rx_tunnel_decap"), uint64(n/1500); got < want {
				t.Errorf("rx_tunnel_decap: got %d, want at least %d (the stream's frames)", got, want)
			}
			if counter(t, r.st, "tunnel_tx_packets") == 0 {
				t.Errorf("tunnel_tx_packets: got 0, want the acknowledgements")
			}
			if counter(t, r.st, "tunnel_tx_errors") != 0 {
				t.Errorf("tunnel_tx_errors: got %d, want 0", c["tunnel_tx_errors"])
			}
			// The kernel cannot hand a TAP tunnelled GSO: frames arrive cut.
			if got := counter(t, r.st, "rx_lro_packets"); got != 0 {
				t.Errorf("rx_lro_packets: got %d, want 0 (tunnelled frames are not super-frames)", got)
			}
			if counter(t, r.st, "rx_gro_skbs") == 0 {
				t.Errorf("rx_gro_skbs: got 0, want GRO to merge the decapsulated frames")
			}
			// hds auto: Ethernet + inner IP + TCP with timestamps per
			// packet, not a byte of payload (and not a byte of the outer
			// header: it was dropped from the copy).
			inner := 14 + 20 + 32
			if tc.v6 {
				inner = 14 + 40 + 32
			}
			hds, pkts := counter(t, r.st, "rx_hds_bytes"), counter(t, r.st, "rx_packets")
			if !tc.lro {
				// MTU 1500, LRO off: mlx5's linear RQ, every frame
				// handed up over its stride (decapsulated in place),
				// nothing copied.
				// (Read as none nonlinear: a late ACK's batch may
				// land between two counter reads.)
				lin, nonlin := counter(t, r.st, "rx_skb_linear"), counter(t, r.st, "rx_skb_nonlinear")
				if lin == 0 || nonlin != 0 || hds != 0 {
					t.Errorf("rx_skb_linear %d, rx_skb_nonlinear %d, rx_hds_bytes %d (of %d packets): want every packet linear, nothing copied", lin, nonlin, hds, pkts)
				}
			} else if tc.hds == driver.HDSAuto {
				if got := counter(t, r.st, "rx_hds_payload_bytes"); got != 0 {
					t.Errorf("rx_hds_payload_bytes with hds auto: got %d, want 0", got)
				}
				if hds > pkts*uint64(inner) || hds < (pkts-pkts/100)*uint64(inner) {
					t.Errorf("rx_hds_bytes: got %d for %d packets, want about %d per packet (headers only)", hds, pkts, inner)
				}
			} else if counter(t, r.st, "rx_hds_payload_bytes") == 0 {
				t.Errorf("rx_hds_payload_bytes with hds %d: got 0, want > 0", tc.hds)
			}
			checkFlowDrops(t, r.st)
			r.close(t) // checks that every page is back in the pool
		})
	}
}
