package bench

// The tunnel dimension of ustack bench (tunnel off|on|ip6tnl). A row with
// the tunnel on has its kernel sender reach ustack through a VXLAN tunnel
// over IPv6 (setupVXLAN); with ip6tnl, through an IPv6 tunnel
// (IPv4-in-IPv6 or IPv6-in-IPv6, as Linux ip6tnl mode any sends it) that
// ustack terminates itself: the driver decapsulates before GRO, and the
// header split is computed over the outer and inner headers as the mlx5 header-copy patch's
// CQE does (driver.TunnelConfig, stack.TunnelConfig).
//
// Contract of setupTunnel, for the bench matrix:
//
//   - Call it once per run of a tunnel row, after building the row's
//     stack.Config (Policy.StackConfig: -tunnel ip6tnl gives a Tunnel
//     without addresses; nil is fine too) and setting cfg.Addrs, and
//     before stack.New. bed is the bench's TAPBed; no descriptor needs to
//     be open on its TAP yet.
//   - It adds the tunnel in the bed's namespace (testbed.AddIP6Tunnel, mode
//     any: an ip6tnl device, or SRv6 reduced encapsulation on a kernel
//     without ip6tnl; same packets on the wire) and fills cfg.Tunnel with
//     its outer and inner addresses. cfg.Addrs must not hold the tunnel's
//     outer address (the bed's Subnet6 ::3; the bed's StackAddr4/6 are
//     fine).
//   - dst is the stack's inner address: IPv4 (IPv4-in-IPv6) when v6 is
//     false, IPv6 (IPv6-in-IPv6) when true. Listen on dst (or the
//     unspecified address) and point the kernel sender (`ustack send -addr`)
//     at dst:port. The kernel's inner MTU is the bed's MTU less 40.
//   - cleanup removes the tunnel; call it after the stack is closed. The
//     bed's Close removes it as well. On error nothing is left behind.
//   - Counters to report for the row: rx_tunnel_decap (frames the driver
//     decapsulated), tunnel_rx_packets and tunnel_tx_packets (the tunnel
//     NIC's), rx_drop_tunnel_proto and rx_drop_bad_tunnel, and the usual
//     rx_hds_bytes / rx_hds_payload_bytes (0 with hds auto: header-only
//     linear parts).

import (
	"net/netip"

	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// setupTunnel adds an IPv6 tunnel from bed's kernel to the stack and
// configures cfg for it; see the contract above.
func setupTunnel(bed *testbed.TAPBed, cfg *stack.Config, v6 bool) (dst netip.Addr, cleanup func(), err error) {
	tun, err := bed.AddIP6Tunnel(testbed.IP6TunnelConfig{})
	if err != nil {
		return netip.Addr{}, nil, err
	}
	cfg.Tunnel = &stack.TunnelConfig{
		Local:   tun.StackOuter,
		Remote:  tun.KernelDecap6,
		Remote4: tun.KernelDecap4,
		Addrs:   []netip.Prefix{tun.StackInner4, tun.StackInner6},
	}
	dst = tun.StackInner4.Addr()
	if v6 {
		dst = tun.StackInner6.Addr()
	}
	return dst, func() { tun.Close() }, nil
}

// setupVXLAN adds a VXLAN tunnel over IPv6 from bed's kernel (its vxlan
// device, port 4789, neighbours resolved inside the tunnel) to the stack
// and configures cfg for it (stack.VXLANConfig), with the contract of
// setupTunnel. The TAP is to be opened with UDP tunnel GSO (openWire does
// when cfg.VXLAN is set), so that the kernel's tunnel super-frames reach
// the NIC model whole. The kernel's inner MTU is the bed's MTU less 70.
// Counters for the row: rx_gso_tunnel_frames, rx_vxlan_frames,
// rx_gro_tunnel_*, vxlan_rx_packets and vxlan_tx_packets.
func setupVXLAN(bed *testbed.TAPBed, cfg *stack.Config, v6 bool) (dst netip.Addr, cleanup func(), err error) {
	vx, err := bed.AddVXLAN(testbed.VXLANConfig{})
	if err != nil {
		return netip.Addr{}, nil, err
	}
	cfg.VXLAN = &stack.VXLANConfig{
		Local:  vx.StackOuter,
		Remote: vx.KernelOuter,
		VNI:    uint32(vx.VNI),
		Addrs:  []netip.Prefix{vx.StackInner4, vx.StackInner6},
	}
	dst = vx.StackInner4.Addr()
	if v6 {
		dst = vx.StackInner6.Addr()
	}
	return dst, func() { vx.Close() }, nil
}
