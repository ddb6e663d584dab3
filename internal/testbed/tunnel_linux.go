//go:build linux

package testbed

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ErrNoIP6Tunnel is returned (wrapped) by AddIP6Tunnel and Add when the
// kernel can make neither an ip6tnl device nor a seg6 encapsulation route
// (a kernel built without CONFIG_IPV6_TUNNEL and CONFIG_IPV6_SEG6_LWTUNNEL).
// It matches errors.ErrUnsupported too.
var ErrNoIP6Tunnel = fmt.Errorf("kernel has neither ip6tnl nor seg6 encapsulation: %w", errors.ErrUnsupported)

// IP6TunnelConfig configures AddIP6Tunnel. The zero value is usable.
type IP6TunnelConfig struct {
	// Kind is the kernel mechanism: "ip6tnl" (an ip6tnl device), "seg6"
	// (SRv6 reduced encapsulation out, seg6local End.DX4/End.DT6 in: the
	// same packets on the wire, for kernels built without ip6tnl), or ""
	// (default): ip6tnl if the kernel has it, else seg6.
	Kind string
	// Name is the ip6tnl device's name; default "ustnl0".
	Name string
	// Mode is "any" (default: IPv4 and IPv6 inside), "ipip6" (IPv4
	// inside only) or "ip6ip6" (IPv6 inside only), as ip -6 tunnel names
	// them.
	Mode string
	// StackOuter is the stack's outer address, the tunnel's far end;
	// default the third address of the bed's IPv6 subnet (::3), next to
	// the kernel's (::1) and the stack's ordinary one (::2).
	StackOuter netip.Addr
	// Subnet4 and Subnet6 are the inner subnets; default 10.78.0.0/24 and
	// fd78::/64. The kernel gets their first address (.1, ::1), the stack
	// the second (.2, ::2).
	Subnet4, Subnet6 netip.Prefix
}

// IP6Tunnel is an IPv6 tunnel (IPv4-in-IPv6 and IPv6-in-IPv6, RFC 2473)
// between the kernel in a TAPBed's namespace and the userspace stack on its
// TAP. What the kernel sends to StackInner4 or StackInner6 leaves on the TAP
// as an IPv6 packet from KernelOuter to StackOuter, next header 4 or 41, no
// extension headers; what the stack sends to KernelDecap4 (an IPv4 packet
// inside) or KernelDecap6 (IPv6 inside) the kernel decapsulates and
// delivers to its inner address.
//
// The stack is expected at StackOuter (for neighbour discovery on the TAP)
// and at StackInner4 and StackInner6 on its tunnel. The kernel's inner
// addresses are routed to nothing else; no default route is added.
type IP6Tunnel struct {
	// NS is the bed's namespace.
	NS *Netns
	// Kind is the mechanism used: "ip6tnl" or "seg6".
	Kind string
	// Name is the ip6tnl device (ip6tnl only).
	Name string
	// Mode is "any", "ipip6" or "ip6ip6".
	Mode string
	// KernelOuter is the kernel's outer address (the bed's KernelAddr6),
	// the source of what it sends into the tunnel.
	KernelOuter netip.Addr
	// StackOuter is the stack's outer address.
	StackOuter netip.Addr
	// KernelDecap4 and KernelDecap6 are where the stack sends IPv4-in-IPv6
	// and IPv6-in-IPv6 for the kernel to decapsulate: KernelOuter with
	// ip6tnl; with seg6, an End.DX4 and an End.DT6 segment on the TAP's
	// subnet (::1:4 and ::1:6), which the kernel answers neighbour
	// solicitations for (proxy NDP).
	KernelDecap4, KernelDecap6 netip.Addr
	// KernelInner4, StackInner4, KernelInner6 and StackInner6 are the
	// inner addresses with their subnet's prefix length; those of a family
	// the mode does not carry are invalid.
	KernelInner4, StackInner4 netip.Prefix
	KernelInner6, StackInner6 netip.Prefix
	// MTU is the inner MTU: the TAP's less the 40-byte outer header.
	MTU int

	tap  string
	undo []func() error // what removes what Add made, last first
}

// AddIP6Tunnel sets up an IPv6 tunnel from the kernel in b's namespace to
// the stack on b's TAP (see IP6Tunnel), over netlink: for ip6tnl, what
// `ip -6 tunnel add NAME mode MODE local KERNEL_OUTER remote STACK_OUTER
// encaplimit none` makes, its MTU, the kernel's inner addresses on it
// (their subnets routed through it) and the device up. On error it removes
// what it made. Releasing the namespace (b.Close) removes the tunnel too;
// Close removes it earlier.
func (b *TAPBed) AddIP6Tunnel(cfg IP6TunnelConfig) (*IP6Tunnel, error) {
	t, err := b.PlanIP6Tunnel(cfg)
	if err != nil {
		return nil, err
	}
	if err := t.add(); err != nil {
		t.Close()
		return nil, fmt.Errorf("ip6 tunnel: %w", err)
	}
	return t, nil
}

// PlanIP6Tunnel returns the tunnel AddIP6Tunnel(cfg) would make, with every
// address filled in, without making it: for configuring the stack before
// the tunnel exists. Kind "" is resolved by probing the kernel. Call Add
// on the result to make it.
func (b *TAPBed) PlanIP6Tunnel(cfg IP6TunnelConfig) (*IP6Tunnel, error) {
	if cfg.Name == "" {
		cfg.Name = "ustnl0"
	}
	if cfg.Mode == "" {
		cfg.Mode = "any"
	}
	if cfg.Mode != "any" && cfg.Mode != "ipip6" && cfg.Mode != "ip6ip6" {
		return nil, fmt.Errorf("ip6 tunnel: mode %q: want any, ipip6 or ip6ip6", cfg.Mode)
	}
	if !cfg.StackOuter.IsValid() {
		cfg.StackOuter = b.StackAddr6.Addr().Next()
	}
	if !cfg.Subnet4.IsValid() {
		cfg.Subnet4 = netip.MustParsePrefix("10.78.0.0/24")
	}
	if !cfg.Subnet6.IsValid() {
		cfg.Subnet6 = netip.MustParsePrefix("fd78::/64")
	}
	if !cfg.StackOuter.Is6() || !b.StackAddr6.Contains(cfg.StackOuter) {
		return nil, fmt.Errorf("ip6 tunnel: stack outer address %s: want an address of %s", cfg.StackOuter, b.StackAddr6.Masked())
	}
	if !cfg.Subnet4.Addr().Is4() || cfg.Subnet4.Bits() > 30 || !cfg.Subnet6.Addr().Is6() || cfg.Subnet6.Bits() > 126 {
		return nil, fmt.Errorf("ip6 tunnel: inner subnets %s, %s: want IPv4 of at most /30 and IPv6 of at most /126", cfg.Subnet4, cfg.Subnet6)
	}
	switch cfg.Kind {
	case "":
		cfg.Kind = "seg6"
		if b.hasIP6Tnl() {
			cfg.Kind = "ip6tnl"
		}
	case "ip6tnl", "seg6":
	default:
		return nil, fmt.Errorf("ip6 tunnel: kind %q: want ip6tnl or seg6", cfg.Kind)
	}
	t := &IP6Tunnel{
		NS:          b.NS,
		Kind:        cfg.Kind,
		Mode:        cfg.Mode,
		KernelOuter: b.KernelAddr6.Addr(),
		StackOuter:  cfg.StackOuter,
		MTU:         b.MTU - 40,
		tap:         b.TAPName,
	}
	if cfg.Kind == "ip6tnl" {
		t.Name = cfg.Name
		t.KernelDecap4, t.KernelDecap6 = t.KernelOuter, t.KernelOuter
	} else {
		base := b.KernelAddr6.Masked().Addr().As16()
		base[13], base[15] = 1, 4
		t.KernelDecap4 = netip.AddrFrom16(base)
		base[15] = 6
		t.KernelDecap6 = netip.AddrFrom16(base)
	}
	if cfg.Mode != "ip6ip6" {
		t.KernelInner4, t.StackInner4 = firstTwo(cfg.Subnet4)
	}
	if cfg.Mode != "ipip6" {
		t.KernelInner6, t.StackInner6 = firstTwo(cfg.Subnet6)
	}
	return t, nil
}

// hasIP6Tnl reports whether the kernel can make ip6tnl devices: ip6_tunnel
// makes a fallback device ip6tnl0 in every namespace.
func (b *TAPBed) hasIP6Tnl() bool {
	_, err := b.NS.link("ip6tnl0")
	return err == nil
}

// Add makes the tunnel PlanIP6Tunnel described. On error it removes what it
// made.
func (t *IP6Tunnel) Add() error {
	if err := t.add(); err != nil {
		t.Close()
		return fmt.Errorf("ip6 tunnel: %w", err)
	}
	return nil
}

// ip6tnlProto is the inner protocol an ip6tnl device of each mode carries
// (IFLA_IPTUN_PROTO): 0 for any.
var ip6tnlProto = map[string]uint8{"any": 0, "ipip6": unix.IPPROTO_IPIP, "ip6ip6": unix.IPPROTO_IPV6}

// The ip6tnl parameters `ip -6 tunnel add` gives a tunnel by default
// (DEFAULT_TNL_HOP_LIMIT and IPV6_DEFAULT_TNL_ENCAP_LIMIT in iproute2 and
// the kernel), and IP6_TNL_F_IGN_ENCAP_LIMIT (<linux/ip6_tunnel.h>), which
// `encaplimit none` sets: no tunnel encapsulation limit option is added,
// so that the outer header has no extension headers.
const (
	ip6tnlHopLimit         = 64
	ip6tnlEncapLimit       = 4
	ip6tnlIgnoreEncapLimit = 0x1
)

func (t *IP6Tunnel) add() error {
	// do runs one netlink step and records how to undo it.
	do := func(undo func(h *netlink.Handle) error, step func(h *netlink.Handle) error) error {
		if err := t.NS.netlink(step); err != nil {
			return err
		}
		if undo != nil {
			t.undo = append(t.undo, func() error { return t.NS.netlink(undo) })
		}
		return nil
	}
	tap, err := t.NS.link(t.tap)
	if err != nil {
		return err
	}
	if t.Kind == "ip6tnl" {
		attrs := netlink.NewLinkAttrs() // no IFLA_TXQLEN
		attrs.Name = t.Name
		tnl := &netlink.Ip6tnl{
			LinkAttrs:  attrs,
			Local:      t.KernelOuter.AsSlice(),
			Remote:     t.StackOuter.AsSlice(),
			Ttl:        ip6tnlHopLimit,
			EncapLimit: ip6tnlEncapLimit,
			Flags:      ip6tnlIgnoreEncapLimit,
			Proto:      ip6tnlProto[t.Mode],
		}
		if err := do(func(h *netlink.Handle) error { return h.LinkDel(tnl) },
			func(h *netlink.Handle) error { return h.LinkAdd(tnl) }); err != nil {
			return fmt.Errorf("add ip6tnl %s: %w", t.Name, err)
		}
		if err := t.NS.SetLinkMTU(t.Name, t.MTU); err != nil {
			return err
		}
		for _, p := range []netip.Prefix{t.KernelInner4, t.KernelInner6} {
			if p.IsValid() {
				if err := t.NS.AddAddr(t.Name, p); err != nil {
					return err
				}
			}
		}
		return t.NS.SetLinkUp(t.Name)
	}

	// seg6: the inner addresses on lo; a route per stack inner address
	// that encapsulates (reduced: with one segment, no routing header) to
	// StackOuter; a segment per inner family that decapsulates and
	// delivers the inner packet locally.
	if err := t.setTunsrc(t.KernelOuter); err != nil {
		return err
	}
	t.undo = append(t.undo, func() error { return t.setTunsrc(netip.IPv6Unspecified()) })
	idx := tap.Attrs().Index
	// addLocal puts k (a host prefix) on lo, routes s (a host prefix)
	// into the seg6 encapsulation from k, and makes decap a seg6local
	// segment with action, answered for by proxy NDP.
	addLocal := func(k, s netip.Prefix, decap netip.Addr, action *netlink.SEG6LocalEncap) error {
		lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo"}}
		if err := do(func(h *netlink.Handle) error { return h.AddrDel(lo, nlAddr(k)) },
			func(h *netlink.Handle) error { return h.AddrAdd(lo, nlAddr(k)) }); err != nil {
			return fmt.Errorf("add %s to lo: %w", k, err)
		}
		encap := &netlink.Route{
			Dst:       prefixNet(s),
			LinkIndex: idx,
			Src:       k.Addr().AsSlice(),
			Encap:     &netlink.SEG6Encap{Mode: seg6ModeEncapRed, Segments: []net.IP{t.StackOuter.AsSlice()}},
		}
		if err := do(func(h *netlink.Handle) error { return h.RouteDel(&netlink.Route{Dst: encap.Dst, LinkIndex: idx}) },
			func(h *netlink.Handle) error { return h.RouteAdd(encap) }); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				// lwtunnel_build_state: no seg6 encapsulation built in.
				return fmt.Errorf("add seg6 route to %s: %v: %w", s, err, ErrNoIP6Tunnel)
			}
			return fmt.Errorf("add seg6 route to %s: %w", s, err)
		}
		seg := &netlink.Route{Dst: prefixNet(netip.PrefixFrom(decap, 128)), LinkIndex: idx, Encap: action}
		if err := do(func(h *netlink.Handle) error { return h.RouteDel(&netlink.Route{Dst: seg.Dst, LinkIndex: idx}) },
			func(h *netlink.Handle) error { return h.RouteAdd(seg) }); err != nil {
			return fmt.Errorf("add seg6local segment %s: %w", decap, err)
		}
		proxy := &netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V6, Flags: netlink.NTF_PROXY, State: netlink.NUD_PERMANENT, IP: decap.AsSlice()}
		if err := do(func(h *netlink.Handle) error { return h.NeighDel(proxy) },
			func(h *netlink.Handle) error { return h.NeighAdd(proxy) }); err != nil {
			return fmt.Errorf("add proxy neighbour %s: %w", decap, err)
		}
		return nil
	}
	if t.KernelInner4.IsValid() {
		dx4 := &netlink.SEG6LocalEncap{Action: nl.SEG6_LOCAL_ACTION_END_DX4, InAddr: t.KernelInner4.Addr().AsSlice()}
		dx4.Flags[nl.SEG6_LOCAL_NH4] = true
		if err := addLocal(netip.PrefixFrom(t.KernelInner4.Addr(), 32), netip.PrefixFrom(t.StackInner4.Addr(), 32), t.KernelDecap4, dx4); err != nil {
			return err
		}
	}
	if t.KernelInner6.IsValid() {
		// End.DX6 refuses to deliver locally (it forwards the inner
		// packet to a neighbour); End.DT6 looks the inner destination
		// up in a table, here the local one, and delivers.
		dt6 := &netlink.SEG6LocalEncap{Action: nl.SEG6_LOCAL_ACTION_END_DT6, Table: unix.RT_TABLE_LOCAL}
		dt6.Flags[nl.SEG6_LOCAL_TABLE] = true
		if err := addLocal(netip.PrefixFrom(t.KernelInner6.Addr(), 128), netip.PrefixFrom(t.StackInner6.Addr(), 128), t.KernelDecap6, dt6); err != nil {
			return err
		}
	}
	// The kernel answers neighbour solicitations for proxied addresses
	// only on a forwarding interface. The namespace has no other link
	// and no default route: nothing can be forwarded anywhere.
	return t.NS.Do(func() error {
		for _, f := range []string{"/proc/sys/net/ipv6/conf/" + t.tap + "/forwarding", "/proc/sys/net/ipv6/conf/" + t.tap + "/proxy_ndp"} {
			if err := os.WriteFile(f, []byte("1\n"), 0); err != nil {
				return fmt.Errorf("seg6 tunnel: %w", err)
			}
		}
		return nil
	})
}

// seg6ModeEncapRed is SEG6_IPTUN_MODE_ENCAP_RED (<linux/seg6_iptunnel.h>),
// `encap.red`: an outer IPv6 header whose destination is the first
// segment, and no routing header when there is only one (the netlink
// package names only the inline and encap modes).
const seg6ModeEncapRed = 3

// The SEG6 generic netlink family's command and attribute that set the
// namespace's source address for seg6 encapsulation (<linux/seg6_genl.h>;
// the kernel's seg6_genl_set_tunsrc), as `ip sr tunsrc set` does.
const (
	seg6GenlVersion  = 1
	seg6CmdSetTunsrc = 3
	seg6AttrDst      = 1
)

// setTunsrc sets the seg6 encapsulation's source address (`ip sr tunsrc
// set ADDR`; :: lets the kernel pick one per route), from a generic
// netlink socket opened inside the namespace.
func (t *IP6Tunnel) setTunsrc(a netip.Addr) error {
	err := t.NS.Do(func() error {
		// Package-level netlink calls open their socket on the calling
		// thread, which Do has switched into the namespace.
		fam, err := netlink.GenlFamilyGet("SEG6")
		if err != nil {
			return err
		}
		req := nl.NewNetlinkRequest(int(fam.ID), unix.NLM_F_ACK)
		req.AddData(&nl.Genlmsg{Command: seg6CmdSetTunsrc, Version: seg6GenlVersion})
		a16 := a.As16()
		req.AddData(nl.NewRtAttr(seg6AttrDst, a16[:]))
		_, err = req.Execute(unix.NETLINK_GENERIC, 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("set seg6 tunsrc %s: %w", a, err)
	}
	return nil
}

// Close removes the tunnel: the device, or the seg6 routes and addresses.
// Parts already gone (the namespace released) are not an error. Close is
// idempotent.
func (t *IP6Tunnel) Close() error {
	var errs []error
	for i := len(t.undo) - 1; i >= 0; i-- {
		if err := t.undo[i](); err != nil && !gone(err) {
			errs = append(errs, fmt.Errorf("ip6 tunnel: %w", err))
		}
	}
	t.undo = nil
	return errors.Join(errs...)
}

// gone reports whether err says the object or the namespace no longer
// exists.
func gone(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.Is(err, os.ErrClosed) || errors.As(err, &nf) ||
		errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) ||
		errors.Is(err, unix.EADDRNOTAVAIL)
}
