//go:build linux

package testbed

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

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
	undo [][]string // ip commands that remove what Add made, last first
}

// AddIP6Tunnel sets up an IPv6 tunnel from the kernel in b's namespace to
// the stack on b's TAP (see IP6Tunnel): for ip6tnl, `ip -6 tunnel add NAME
// mode MODE local KERNEL_OUTER remote STACK_OUTER encaplimit none`, its MTU,
// the kernel's inner addresses on it (their subnets routed through it) and
// the device up. On error it removes what it made. Deleting the namespace
// (b.Close) removes the tunnel too; Close removes it earlier.
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
	return b.NS.IP("link", "show", "dev", "ip6tnl0") == nil
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

func (t *IP6Tunnel) add() error {
	// do runs an ip command and records how to undo it.
	do := func(undo []string, args ...string) error {
		if err := t.NS.IP(args...); err != nil {
			return err
		}
		if undo != nil {
			t.undo = append(t.undo, undo)
		}
		return nil
	}
	ko, so := t.KernelOuter.String(), t.StackOuter.String()
	if t.Kind == "ip6tnl" {
		mode := t.Mode
		steps := []struct{ undo, args []string }{
			{[]string{"link", "del", "dev", t.Name}, []string{"-6", "tunnel", "add", t.Name, "mode", mode, "local", ko, "remote", so, "encaplimit", "none"}},
			{nil, []string{"link", "set", "dev", t.Name, "mtu", strconv.Itoa(t.MTU)}},
		}
		if t.KernelInner4.IsValid() {
			steps = append(steps, struct{ undo, args []string }{nil, []string{"addr", "add", t.KernelInner4.String(), "dev", t.Name}})
		}
		if t.KernelInner6.IsValid() {
			steps = append(steps, struct{ undo, args []string }{nil, []string{"addr", "add", t.KernelInner6.String(), "dev", t.Name, "nodad"}})
		}
		steps = append(steps, struct{ undo, args []string }{nil, []string{"link", "set", "dev", t.Name, "up"}})
		for _, s := range steps {
			if err := do(s.undo, s.args...); err != nil {
				return err
			}
		}
		return nil
	}

	// seg6: the inner addresses on lo; a route per stack inner address
	// that encapsulates (reduced: with one segment, no routing header) to
	// StackOuter, its MTU the TAP's less the encapsulation's headroom; a segment per inner family that decapsulates and
	// delivers the inner packet locally.
	if err := do([]string{"sr", "tunsrc", "set", "::"}, "sr", "tunsrc", "set", ko); err != nil {
		return err
	}
	if t.KernelInner4.IsValid() {
		k4 := netip.PrefixFrom(t.KernelInner4.Addr(), 32).String()
		s4 := netip.PrefixFrom(t.StackInner4.Addr(), 32).String()
		if err := do([]string{"addr", "del", k4, "dev", "lo"}, "addr", "add", k4, "dev", "lo"); err != nil {
			return err
		}
		if err := do([]string{"route", "del", s4}, "route", "add", s4, "encap", "seg6", "mode", "encap.red", "segs", so,
			"dev", t.tap, "src", t.KernelInner4.Addr().String()); err != nil {
			return err
		}
		d4 := netip.PrefixFrom(t.KernelDecap4, 128).String()
		if err := do([]string{"-6", "route", "del", d4}, "-6", "route", "add", d4, "encap", "seg6local", "action", "End.DX4",
			"nh4", t.KernelInner4.Addr().String(), "dev", t.tap); err != nil {
			return err
		}
		if err := do([]string{"-6", "neigh", "del", "proxy", t.KernelDecap4.String(), "dev", t.tap}, "-6", "neigh", "add", "proxy", t.KernelDecap4.String(), "dev", t.tap); err != nil {
			return err
		}
	}
	if t.KernelInner6.IsValid() {
		k6 := netip.PrefixFrom(t.KernelInner6.Addr(), 128).String()
		s6 := netip.PrefixFrom(t.StackInner6.Addr(), 128).String()
		if err := do([]string{"addr", "del", k6, "dev", "lo"}, "addr", "add", k6, "dev", "lo", "nodad"); err != nil {
			return err
		}
		if err := do([]string{"-6", "route", "del", s6}, "-6", "route", "add", s6, "encap", "seg6", "mode", "encap.red", "segs", so,
			"dev", t.tap, "src", t.KernelInner6.Addr().String()); err != nil {
			return err
		}
		d6 := netip.PrefixFrom(t.KernelDecap6, 128).String()
		// End.DX6 refuses to deliver locally (it forwards the inner
		// packet to a neighbour); End.DT6 looks the inner destination
		// up in a table, here the local one, and delivers.
		if err := do([]string{"-6", "route", "del", d6}, "-6", "route", "add", d6, "encap", "seg6local", "action", "End.DT6",
			"table", "local", "dev", t.tap); err != nil {
			return err
		}
		if err := do([]string{"-6", "neigh", "del", "proxy", t.KernelDecap6.String(), "dev", t.tap}, "-6", "neigh", "add", "proxy", t.KernelDecap6.String(), "dev", t.tap); err != nil {
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

// Close removes the tunnel: the device, or the seg6 routes and addresses.
// Parts already gone (the namespace deleted) are not an error. Close is
// idempotent.
func (t *IP6Tunnel) Close() error {
	var errs []error
	for i := len(t.undo) - 1; i >= 0; i-- {
		if err := t.NS.IP(t.undo[i]...); err != nil && !gone(err) {
			errs = append(errs, err)
		}
	}
	t.undo = nil
	return errors.Join(errs...)
}

// gone reports whether an ip error says the object or namespace no longer
// exists.
func gone(err error) bool {
	s := err.Error()
	return strings.Contains(s, "No such") || strings.Contains(s, "Cannot find") || strings.Contains(s, "does not exist")
}
