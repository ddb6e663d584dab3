//go:build linux

package testbed

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// VXLANPort is VXLAN's IANA port (RFC 7348), which AddVXLAN sets
// explicitly: iproute2 and the kernel default to Linux's pre-IANA 8472.
const VXLANPort = 4789

// VXLANConfig configures AddVXLAN. The zero value is usable.
type VXLANConfig struct {
	// Name is the vxlan device's name; default "usvx0".
	Name string
	// VNI is the VXLAN network identifier; default 42.
	VNI int
	// StackOuter is the stack's outer IPv6 address, the far end of the
	// tunnel on the TAP; default the third address of the bed's IPv6
	// subnet (::3), beside the kernel's (::1) and the stack's ordinary
	// one (::2).
	StackOuter netip.Addr
	// Subnet4 and Subnet6 are the inner subnets; default 10.79.0.0/24 and
	// fd79::/64. The kernel gets their first address, the stack the second.
	Subnet4, Subnet6 netip.Prefix
	// StaticNeighbours, with StackMAC and StackOuterMAC, makes the
	// kernel's neighbour entries for the stack's inner addresses (on the
	// vxlan device) and its outer address (on the TAP) permanent, so that
	// no ARP or neighbour discovery precedes the traffic: for a peer
	// that does not answer them.
	StaticNeighbours        bool
	StackMAC, StackOuterMAC net.HardwareAddr
}

// VXLAN is a VXLAN tunnel over IPv6 (RFC 7348) from the kernel in a TAPBed's
// namespace to the stack on its TAP: the kernel's vxlan device, with the
// inner Ethernet link the stack is on. What the kernel sends to
// StackInner4 or StackInner6 leaves on the TAP as IPv6/UDP to StackOuter
// port VXLANPort, from KernelOuter and a source port of the inner flow's
// hash, with VNI; what the stack sends to KernelOuter port VXLANPort with
// VNI the kernel decapsulates and delivers to the inner link.
type VXLAN struct {
	// NS is the bed's namespace.
	NS *Netns
	// Name is the vxlan device.
	Name string
	// VNI is the network identifier.
	VNI int
	// KernelOuter and StackOuter are the outer addresses.
	KernelOuter, StackOuter netip.Addr
	// KernelMAC is the vxlan device's (inner) MAC address.
	KernelMAC net.HardwareAddr
	// KernelInner4, StackInner4, KernelInner6 and StackInner6 are the
	// inner addresses with their subnet's prefix length.
	KernelInner4, StackInner4 netip.Prefix
	KernelInner6, StackInner6 netip.Prefix
	// MTU is the inner MTU: the TAP's less the 70 bytes of outer IPv6,
	// UDP, VXLAN and inner Ethernet headers (the vxlan device's own
	// choice).
	MTU int
}

// AddVXLAN makes what `ip link add NAME type vxlan id VNI local
// KERNEL_OUTER remote STACK_OUTER dstport 4789 dev TAP` makes, the
// kernel's inner addresses on it, the device up, and with
// StaticNeighbours the permanent neighbour entries. Releasing the
// namespace (b.Close) removes it. On error it removes what it made.
func (b *TAPBed) AddVXLAN(cfg VXLANConfig) (*VXLAN, error) {
	if cfg.Name == "" {
		cfg.Name = "usvx0"
	}
	if cfg.VNI == 0 {
		cfg.VNI = 42
	}
	if !cfg.StackOuter.IsValid() {
		cfg.StackOuter = b.StackAddr6.Addr().Next()
	}
	if !cfg.Subnet4.IsValid() {
		cfg.Subnet4 = netip.MustParsePrefix("10.79.0.0/24")
	}
	if !cfg.Subnet6.IsValid() {
		cfg.Subnet6 = netip.MustParsePrefix("fd79::/64")
	}
	if b.TUN {
		return nil, fmt.Errorf("vxlan: the bed's device is a TUN: VXLAN needs an Ethernet underlay")
	}
	if !cfg.StackOuter.Is6() || !b.StackAddr6.Contains(cfg.StackOuter) {
		return nil, fmt.Errorf("vxlan: stack outer address %s: want an address of %s", cfg.StackOuter, b.StackAddr6.Masked())
	}
	if cfg.VNI < 1 || cfg.VNI >= 1<<24 {
		return nil, fmt.Errorf("vxlan: VNI %d: want 1..%d", cfg.VNI, 1<<24-1)
	}
	if cfg.StaticNeighbours && (len(cfg.StackMAC) != 6 || len(cfg.StackOuterMAC) != 6) {
		return nil, fmt.Errorf("vxlan: static neighbours need StackMAC and StackOuterMAC")
	}
	k4, s4 := firstTwo(cfg.Subnet4)
	k6, s6 := firstTwo(cfg.Subnet6)
	v := &VXLAN{
		NS: b.NS, Name: cfg.Name, VNI: cfg.VNI,
		KernelOuter: b.KernelAddr6.Addr(), StackOuter: cfg.StackOuter,
		KernelInner4: k4, StackInner4: s4, KernelInner6: k6, StackInner6: s6,
	}
	err := b.NS.netlink(func(h *netlink.Handle) error {
		tap, err := h.LinkByName(b.TAPName)
		if err != nil {
			return err
		}
		vx := &netlink.Vxlan{
			LinkAttrs:    netlink.LinkAttrs{Name: cfg.Name},
			VxlanId:      cfg.VNI,
			VtepDevIndex: tap.Attrs().Index,
			SrcAddr:      net.IP(v.KernelOuter.AsSlice()),
			Group:        net.IP(v.StackOuter.AsSlice()),
			Port:         VXLANPort,
			Learning:     false,
		}
		if err := h.LinkAdd(vx); err != nil {
			return fmt.Errorf("add %s: %w", cfg.Name, err)
		}
		l, err := h.LinkByName(cfg.Name)
		if err != nil {
			return err
		}
		v.KernelMAC, v.MTU = l.Attrs().HardwareAddr, l.Attrs().MTU
		for _, p := range []netip.Prefix{k4, k6} {
			if err := h.AddrAdd(l, nlAddr(p)); err != nil {
				return fmt.Errorf("add address %s: %w", p, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			return err
		}
		if !cfg.StaticNeighbours {
			return nil
		}
		neigh := func(link netlink.Link, ip netip.Addr, mac net.HardwareAddr) error {
			fam := netlink.FAMILY_V4
			if ip.Is6() {
				fam = netlink.FAMILY_V6
			}
			return h.NeighSet(&netlink.Neigh{
				LinkIndex: link.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT,
				IP: net.IP(ip.AsSlice()), HardwareAddr: mac,
			})
		}
		if err := neigh(tap, v.StackOuter, cfg.StackOuterMAC); err != nil {
			return fmt.Errorf("neighbour %s: %w", v.StackOuter, err)
		}
		for _, p := range []netip.Prefix{s4, s6} {
			if err := neigh(l, p.Addr(), cfg.StackMAC); err != nil {
				return fmt.Errorf("neighbour %s: %w", p.Addr(), err)
			}
		}
		return nil
	})
	if err != nil {
		b.NS.netlink(func(h *netlink.Handle) error {
			if l, err := h.LinkByName(cfg.Name); err == nil {
				return h.LinkDel(l)
			}
			return nil
		})
		return nil, fmt.Errorf("vxlan: %w", err)
	}
	return v, nil
}

// Close removes the vxlan device (and with it its addresses and
// neighbours). Removing one already gone is not an error.
func (v *VXLAN) Close() error {
	return v.NS.netlink(func(h *netlink.Handle) error {
		l, err := h.LinkByName(v.Name)
		if err != nil {
			return nil // gone with the namespace, or never made
		}
		return h.LinkDel(l)
	})
}
