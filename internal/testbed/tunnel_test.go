//go:build linux

package testbed

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func newTAPBed(t *testing.T) *TAPBed {
	t.Helper()
	b, err := NewTAPBed(TAPConfig{Prefix: "tbtnl"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

func TestIP6TunnelPlan(t *testing.T) {
	needRoot(t)
	b := newTAPBed(t)
	tun, err := b.PlanIP6Tunnel(IP6TunnelConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"StackOuter", tun.StackOuter, netip.MustParseAddr("fd77::3")},
		{"KernelOuter", tun.KernelOuter, netip.MustParseAddr("fd77::1")},
		{"KernelInner4", tun.KernelInner4, netip.MustParsePrefix("10.78.0.1/24")},
		{"StackInner4", tun.StackInner4, netip.MustParsePrefix("10.78.0.2/24")},
		{"KernelInner6", tun.KernelInner6, netip.MustParsePrefix("fd78::1/64")},
		{"StackInner6", tun.StackInner6, netip.MustParsePrefix("fd78::2/64")},
		{"MTU", tun.MTU, 1460},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	switch tun.Kind {
	case "ip6tnl":
		if tun.KernelDecap4 != tun.KernelOuter || tun.KernelDecap6 != tun.KernelOuter {
			t.Errorf("ip6tnl decapsulation addresses: got %s and %s, want %s", tun.KernelDecap4, tun.KernelDecap6, tun.KernelOuter)
		}
	case "seg6":
		if tun.KernelDecap4 != netip.MustParseAddr("fd77::1:4") || tun.KernelDecap6 != netip.MustParseAddr("fd77::1:6") {
			t.Errorf("seg6 decapsulation addresses: got %s and %s, want fd77::1:4 and fd77::1:6", tun.KernelDecap4, tun.KernelDecap6)
		}
	default:
		t.Errorf("Kind: got %q, want ip6tnl or seg6", tun.Kind)
	}
	v4only, err := b.PlanIP6Tunnel(IP6TunnelConfig{Mode: "ipip6"})
	if err != nil {
		t.Fatal(err)
	}
	if v4only.StackInner6.IsValid() || !v4only.StackInner4.IsValid() {
		t.Errorf("mode ipip6: got inner %v and %v, want IPv4 only", v4only.StackInner4, v4only.StackInner6)
	}
	for _, bad := range []IP6TunnelConfig{
		{Mode: "gre"},
		{Kind: "vxlan"},
		{StackOuter: netip.MustParseAddr("fd99::3")},
		{Subnet4: netip.MustParsePrefix("fd78::/64")},
	} {
		if _, err := b.PlanIP6Tunnel(bad); err == nil {
			t.Errorf("PlanIP6Tunnel(%+v): got nil error, want one", bad)
		}
	}
}

// TestIP6TunnelAddClose checks that the kernel routes the stack's inner
// addresses into the tunnel once it is added, and no more after Close, and
// that it can be added again.
func TestIP6TunnelAddClose(t *testing.T) {
	needRoot(t)
	b := newTAPBed(t)
	for round := range 2 {
		tun, err := b.AddIP6Tunnel(IP6TunnelConfig{})
		if errors.Is(err, ErrNoIP6Tunnel) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, dst := range []netip.Addr{tun.StackInner4.Addr(), tun.StackInner6.Addr()} {
			out, err := b.NS.Output("route", "get", dst.String())
			if err != nil {
				t.Fatal(err)
			}
			if want := map[string]string{"ip6tnl": "dev " + tun.Name, "seg6": "encap seg6"}[tun.Kind]; !strings.Contains(out, want) {
				t.Errorf("round %d: route to %s: got %q, want %q in it", round, dst, out, want)
			}
		}
		if err := tun.Close(); err != nil {
			t.Fatal(err)
		}
		if out, err := b.NS.Output("route", "get", tun.StackInner4.Addr().String()); err == nil {
			t.Errorf("round %d: route to %s after Close: got %q, want none", round, tun.StackInner4.Addr(), out)
		}
		if err := tun.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
}
