//go:build linux

package integration

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// newVXLANRig is newRig with a VXLAN tunnel over IPv6 from the kernel's
// vxlan device in the bed's namespace to ustack (testbed.AddVXLAN, port
// 4789), which ustack terminates itself (stack.VXLANConfig), on a TAP
// that carries UDP tunnel GSO (driver.TAPConfig.UDPTunnel). The rig's
// addresses (r.bed's StackAddr and KernelAddr) are the inner ones, so
// that kernelToStack and stackToKernel go through the tunnel. Neighbours
// are resolved by ARP and neighbour discovery, outside the tunnel and in
// it. Cleanup removes the tunnel with the bed. It skips where the kernel
// has no vxlan device or its TAP no UDP tunnel GSO.
func newVXLANRig(t *testing.T, prefix string, mtu int, dc driver.Config) *rig {
	t.Helper()
	bed := newBed(t, prefix, mtu)
	vx, err := bed.AddVXLAN(testbed.VXLANConfig{})
	if err != nil {
		if strings.Contains(err.Error(), "operation not supported") {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	var w driver.Wire
	err = bed.Open(func() error {
		tap, err := driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true, UDPTunnel: true})
		if err == nil {
			w = tap
		}
		return err
	})
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("this kernel's TAP has no UDP tunnel GSO: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	r := newBedRigOn(t, bed, mtu, stack.Config{
		Driver: dc,
		VXLAN: &stack.VXLANConfig{
			Local:  vx.StackOuter,
			Remote: vx.KernelOuter,
			VNI:    uint32(vx.VNI),
			Addrs:  []netip.Prefix{vx.StackInner4, vx.StackInner6},
		},
	}, w)
	view := *bed
	view.StackAddr4, view.StackAddr6 = vx.StackInner4, vx.StackInner6
	view.KernelAddr4, view.KernelAddr6 = vx.KernelInner4, vx.KernelInner6
	r.bed = &view
	t.Logf("vxlan: %s id %d, kernel %s -> stack %s, inner MTU %d", vx.Name, vx.VNI, vx.KernelOuter, vx.StackOuter, vx.MTU)
	return r
}

// TestVXLANTCP sends a bulk stream from a kernel socket in the namespace
// through the kernel's vxlan device to ustack, IPv4 and IPv6 inside, and
// one back, and checks every byte (SHA-256), that the tunnel's TCP
// super-frames came through the TAP whole and were cut by the NIC model,
// that GRO merged the inner flow inside the tunnel before ustack's VXLAN
// device terminated it, that the header copy took the inner headers'
// estimate and no payload with hds auto (payload with hds 256: the
// frag_list path), and that ustack's replies went back encapsulated.
func TestVXLANTCP(t *testing.T) {
	needRoot(t)
	const n = 32 << 20
	for i, tc := range []struct {
		v6  bool
		mtu int
		lro bool
		hds int
	}{
		{false, 1500, true, driver.HDSAuto},
		{true, 1500, true, driver.HDSAuto},
		{false, 9000, false, driver.HDSAuto},
		{false, 1500, true, 256},
	} {
		lro := map[bool]string{true: "on", false: "off"}[tc.lro]
		name := fmt.Sprintf("%s-in-vxlan6/mtu-%d/lro-%s/hds-%s", family(tc.v6), tc.mtu, lro, driver.FormatHDS(tc.hds))
		t.Run(name, func(t *testing.T) {
			r := newVXLANRig(t, fmt.Sprintf("usit-vx%d", i), tc.mtu, driver.Config{LRO: tc.lro, HDS: tc.hds})
			elapsed := kernelToStack(t, r, tc.v6, 9, n, uint64(400+i))
			logRate(t, "kernel -> vxlan -> ustack", n, elapsed)
			c := counters(r.st)
			t.Logf("rx_wire_reads %d rx_gso_tunnel_frames %d rx_gso_segs %d rx_vxlan_frames %d rx_packets %d rx_hds_bytes %d rx_hds_pull_bytes %d rx_hds_payload_bytes %d rx_gro_tunnel_packets %d rx_gro_tunnel_skbs %d rx_gro_frag_list %d vxlan_rx_packets %d vxlan_tx_packets %d",
				c["rx_wire_reads"], c["rx_gso_tunnel_frames"], c["rx_gso_segs"], c["rx_vxlan_frames"], c["rx_packets"],
				c["rx_hds_bytes"], c["rx_hds_pull_bytes"], c["rx_hds_payload_bytes"], c["rx_gro_tunnel_packets"], c["rx_gro_tunnel_skbs"],
				c["rx_gro_frag_list"], c["vxlan_rx_packets"], c["vxlan_tx_packets"])
			if c["rx_gso_tunnel_frames"] == 0 {
				t.Errorf("rx_gso_tunnel_frames: got 0, want the tunnel's super-frames whole through the TAP")
			}
			if got, want := c["rx_vxlan_frames"], uint64(n/tc.mtu); got < want {
				t.Errorf("rx_vxlan_frames: got %d, want at least %d (the stream's frames)", got, want)
			}
			if c["rx_gro_tunnel_skbs"] == 0 || c["rx_gro_tunnel_packets"] <= c["rx_gro_tunnel_skbs"] {
				t.Errorf("rx_gro_tunnel_packets %d, rx_gro_tunnel_skbs %d: want GRO to merge inside the tunnel", c["rx_gro_tunnel_packets"], c["rx_gro_tunnel_skbs"])
			}
			if c["vxlan_rx_packets"] == 0 || c["vxlan_tx_packets"] == 0 {
				t.Errorf("vxlan_rx_packets %d, vxlan_tx_packets %d: want both", c["vxlan_rx_packets"], c["vxlan_tx_packets"])
			}
			for _, k := range []string{"vxlan_tx_errors", "vxlan_rx_dropped", "vxlan_rx_other_host"} {
				if c[k] != 0 {
					t.Errorf("%s: got %d, want 0", k, c[k])
				}
			}
			// The nonlinear RQ (LRO on, or MTU 9000): the header copy
			// applies. hds auto copies the inner headers' estimate and
			// pulls the outer ones: no payload in the linear part.
			if tc.hds == driver.HDSAuto {
				if c["rx_hds_payload_bytes"] != 0 {
					t.Errorf("rx_hds_payload_bytes: got %d, want 0 (hds auto copies headers only)", c["rx_hds_payload_bytes"])
				}
				if c["rx_hds_pull_bytes"] == 0 {
					t.Errorf("rx_hds_pull_bytes: got 0, want the outer headers pulled for GRO")
				}
			} else if c["rx_hds_payload_bytes"] == 0 || c["rx_gro_frag_list"] == 0 {
				t.Errorf("hds 256: rx_hds_payload_bytes %d, rx_gro_frag_list %d: want payload in the copy, merged by frag_list", c["rx_hds_payload_bytes"], c["rx_gro_frag_list"])
			}
			var tl tally
			stackToKernel(t, r, tc.v6, 8<<20, uint64(500+i), time.Now().Add(60*time.Second), &tl)
		})
	}
}
