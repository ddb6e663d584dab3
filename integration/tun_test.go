//go:build linux

package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// TestTUNBulk runs the byte-exact bulk checks over a TUN device: the
// kernel's TCP to ustack (LRO on and off: TSO super-frames handed up whole
// or cut by the NIC model, GRO on IP packets) and ustack's TCP to the
// kernel (TSO super-frames written to the TUN), IPv4 and IPv6, with no ARP
// or NDP on the link.
func TestTUNBulk(t *testing.T) {
	needRoot(t)
	const n = 64 << 20
	i := 0
	for _, v6 := range []bool{false, true} {
		for _, lro := range []bool{true, false} {
			i++
			t.Run(fmt.Sprintf("%s/lro-%v", family(v6), map[bool]string{true: "on", false: "off"}[lro]), func(t *testing.T) {
				r := newTUNRig(t, fmt.Sprintf("usit-tun%d", i), 1500, stack.Config{Driver: driver.Config{LRO: lro}})
				logRate(t, "kernel -> ustack", n, kernelToStack(t, r, v6, 9, n, uint64(600+i)))
				var tl tally
				stackToKernel(t, r, v6, n/4, uint64(610+i), time.Now().Add(transferTimeout(n/4)), &tl)
				if tl.lost.Load() != 0 || tl.checked.Load() != n/4 {
					t.Errorf("ustack -> kernel: %d bytes checked, %d lost; want %d and 0", tl.checked.Load(), tl.lost.Load(), n/4)
				}
				c := counters(r.st)
				if lro && c["rx_lro_packets"] == 0 || !lro && c["rx_gso_segs"] == 0 {
					t.Errorf("rx_lro_packets %d, rx_gso_segs %d with LRO %v", c["rx_lro_packets"], c["rx_gso_segs"], lro)
				}
				// With LRO each TSO frame comes up whole and GRO has
				// nothing to merge (as on a TAP); without, GRO merges.
				if !lro && c["rx_gro_skbs"] == 0 || c["tx_gso_packets"] == 0 {
					t.Errorf("rx_gro_skbs %d (LRO %v), tx_gso_packets %d: want GRO and TSO on the TUN", c["rx_gro_skbs"], lro, c["tx_gso_packets"])
				}
				for _, name := range []string{"rx_drop_bad_ip_version", "arp_packets_received", "ndp_neighbor_solicits"} {
					if c[name] != 0 {
						t.Errorf("%s: %d, want 0 on a TUN", name, c[name])
					}
				}
				checkFlowDrops(t, r.st)
				r.close(t)
			})
		}
	}
}

// TestTUNEcho runs the TCP echo (both of ustack's paths at once) and the
// UDP echo over a TUN device, IPv4 and IPv6.
func TestTUNEcho(t *testing.T) {
	needRoot(t)
	for i, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			r := newTUNRig(t, fmt.Sprintf("usit-tune%d", i), 1500, stack.Config{Driver: driver.Config{LRO: true}})
			tcpEcho(t, r, v6, 16<<20, uint64(620+i))
			udpEchoServer(t, r, v6, 7, 50, 3)
		})
	}
}

// TestTUNZeroCopy runs the zero-copy bulk check over a TUN device: the
// payload lent to gVisor as views of the RX pages, every byte checked.
func TestTUNZeroCopy(t *testing.T) {
	needRoot(t)
	const n = 64 << 20
	for i, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			r := newTUNRig(t, fmt.Sprintf("usit-tunzc%d", i), 1500, stack.Config{ZeroCopy: true})
			r.views = true
			kernelToStack(t, r, v6, 5002, n, uint64(630+i))
			c := counters(r.st)
			if got := c["zc_read_mapped_bytes"] + c["zc_read_copied_bytes"]; c["zc_views_lent"] == 0 || got != n {
				t.Errorf("zc_views_lent %d, read mapped+copied %d: want views lent and %d bytes", c["zc_views_lent"], got, n)
			}
		})
	}
}

// TestTUNIPerf3 runs iperf3's TCP and UDP clients against ustack's iperf3
// server over a TUN device.
func TestTUNIPerf3(t *testing.T) {
	needRoot(t)
	needIPerf3(t)
	iperf3Stack(t, newTUNRig(t, "usit-tuniperf", 1500, stack.Config{}))
}

// TestTUNPolicies runs the kernel -> ustack bulk check over a TUN device
// with the receive-path policies that change how the NIC model lays out an
// IP packet: hardware GRO (on and coalesce), the cyclic RQ, a fixed header
// copy, MTU 9000 (the nonlinear RQ), no page recycling, and XDP (generic
// XDP's view: programs read the IP header first) redirecting to a cpumap
// or passing what it does not drop. Every byte is checked; each policy's
// counter moves.
func TestTUNPolicies(t *testing.T) {
	needRoot(t)
	const n = 32 << 20
	for i, tc := range []struct {
		name    string
		mtu     int
		cfg     stack.Config
		counter string
	}{
		{"hw-gro-on", 1500, stack.Config{Driver: driver.Config{HWGRO: driver.HWGROOn}}, "rx_gro_hw_sessions"},
		{"hw-gro-coalesce", 1500, stack.Config{Driver: driver.Config{HWGRO: driver.HWGROCoalesce}}, "rx_gro_hw_sessions"},
		{"rq-cyclic", 1500, stack.Config{Driver: driver.Config{RQ: driver.RQCyclic, LRO: true}}, "rx_lro_packets"},
		{"hds-256/mtu-9000", 9000, stack.Config{Driver: driver.Config{HDS: 256}}, "rx_hds_payload_bytes"},
		{"no-recycle", 1500, stack.Config{Driver: driver.Config{LRO: true}, Pool: bufpool.Config{NoRecycle: true}}, "rx_pp_alloc_slow"},
		{"xdp-cpumap", 1500, stack.Config{XDP: tunProgram(t, "hash", 2), CPUMap: []int{0, 1}}, "cpumap_worker_built"},
		{"xdp-drop-port", 1500, stack.Config{XDP: tunProgram(t, "drop-port:7", 1)}, "rx_xdp_pass"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTUNRig(t, fmt.Sprintf("usit-tunp%d", i), tc.mtu, tc.cfg)
			kernelToStack(t, r, i%2 == 1, 9, n, uint64(640+i))
			if got := counters(r.st)[tc.counter]; got == 0 {
				t.Errorf("%s: 0, want > 0 with %s", tc.counter, tc.name)
			}
			checkFlowDrops(t, r.st)
			r.close(t)
		})
	}
}

// tunProgram is a built-in XDP program for a TUN's IP packets.
func tunProgram(t *testing.T, name string, ncpu int) cpumap.Program {
	t.Helper()
	p, err := cpumap.ParseProgramLink(name, ncpu, true)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTUNTunnel runs the kernel -> ustack bulk check through an IPv6
// tunnel over a TUN device (IPv4-in-IPv6 with LRO off, IPv6-in-IPv6 with
// LRO on): ustack's driver strips the outer IPv6 header of IP packets that
// have no Ethernet header, GRO merges the inner ones, and ustack's
// acknowledgements go back through the tunnel.
func TestTUNTunnel(t *testing.T) {
	needRoot(t)
	const n = 32 << 20
	for i, tc := range []struct{ v6, lro bool }{{false, false}, {true, true}} {
		t.Run(fmt.Sprintf("%s-in-ipv6/lro-%v", family(tc.v6), tc.lro), func(t *testing.T) {
			bed := newBedConfig(t, testbed.TAPConfig{Prefix: fmt.Sprintf("usit-tuntnl%d", i), TUN: true})
			r := newTunnelRigOn(t, bed, 1500, driver.Config{LRO: tc.lro})
			kernelToStack(t, r, tc.v6, 9, n, uint64(650+i))
			c := counters(r.st)
			if got, want := c["rx_tunnel_decap"], uint64(n/1500); got < want {
				t.Errorf("rx_tunnel_decap: got %d, want at least %d", got, want)
			}
			if c["tunnel_tx_packets"] == 0 || c["tunnel_tx_errors"] != 0 || c["rx_gro_skbs"] == 0 {
				t.Errorf("tunnel_tx_packets %d, tunnel_tx_errors %d, rx_gro_skbs %d: want ACKs through the tunnel, no errors, GRO merging", c["tunnel_tx_packets"], c["tunnel_tx_errors"], c["rx_gro_skbs"])
			}
			checkFlowDrops(t, r.st)
		})
	}
}
