package main

import (
	"slices"
	"strings"
	"testing"
)

// The policy settings of bench -a, -b and the matrix's every-side switches.

func TestSplitSettings(t *testing.T) {
	tests := map[string][]string{
		"hds=256":                      {"hds=256"},
		"hds=256, gro=off":             {"hds=256", "gro=off"},
		"hds=256 gro=off,lro=on":       {"hds=256", "gro=off", "lro=on"},
		"cpumap=0,1 xdp=cpu:0":         {"cpumap=0,1", "xdp=cpu:0"},
		"xdp=hash,cpumap=0,1,budget=8": {"xdp=hash", "cpumap=0,1", "budget=8"},
		"":                             nil,
	}
	for in, want := range tests {
		if got := splitSettings(in); !slices.Equal(got, want) {
			t.Errorf("splitSettings(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPolicyFromSettings(t *testing.T) {
	p, err := policyFromSettings([]string{"hds=256", "-gro=off", "budget=8", "gro-flush-timeout=1ms", "pool-poison=true", "cpumap=0,1", "hds=128"})
	if err != nil {
		t.Fatal(err)
	}
	if c := p.cfg; c.Driver.HDS != 128 || !c.NoGRO || c.Driver.Budget != 8 || c.GROFlushTimeout.String() != "1ms" || !c.Pool.Poison || !slices.Equal(c.CPUMap, []int{0, 1}) {
		t.Errorf("got %+v", c)
	}
	// Switches not given keep their defaults, as on the command line.
	if def := basePolicy(1500); p.cfg.Driver.LRO != def.cfg.Driver.LRO || p.cfg.Driver.MTU != def.cfg.Driver.MTU || p.cfg.Driver.RingSize != def.cfg.Driver.RingSize || p.cfg.Driver.RQ != def.cfg.Driver.RQ {
		t.Errorf("defaults: got %+v, want those of %+v", p.cfg, def.cfg)
	}
	for _, bad := range []string{"hds", "nosuch=1", "budget=x", "=1"} {
		if _, err := policyFromSettings([]string{bad}); err == nil {
			t.Errorf("policyFromSettings(%q): no error", bad)
		}
	}
}

// TestPolicyStackConfig checks that this session's switches reach the
// stack's and driver's configuration, and that bad values are refused.
func TestPolicyStackConfig(t *testing.T) {
	p, err := policyFromSettings([]string{"wire-read=bounce", "coalesce-bytes=262144", "tcp-rmem-max=67108864", "rq-size=4", "rq-full=drop"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.finish()
	if err != nil {
		t.Fatal(err)
	}
	if !c.Driver.BounceRead || c.Driver.CoalesceBytes != 262144 || c.TCPReceiveBufferMax != 64<<20 {
		t.Errorf("got BounceRead %v, CoalesceBytes %d, TCPReceiveBufferMax %d", c.Driver.BounceRead, c.Driver.CoalesceBytes, c.TCPReceiveBufferMax)
	}
	if c.Driver.RQSize != 4 || !c.Driver.RQDrop {
		t.Errorf("got RQSize %d, RQDrop %v, want 4, true", c.Driver.RQSize, c.Driver.RQDrop)
	}
	if s := p.String(); !strings.Contains(s, "wire-read=bounce") || !strings.Contains(s, "coalesce-bytes=262144") || !strings.Contains(s, "tcp-rmem-max=67108864") ||
		!strings.Contains(s, "rq-size=4") || !strings.Contains(s, "rq-full=drop") {
		t.Errorf("String: %q does not name the switches", s)
	}
	base := basePolicy(1500)
	def, err := base.finish()
	if err != nil {
		t.Fatal(err)
	}
	if def.Driver.BounceRead || def.Driver.CoalesceBytes != 0 || def.TCPReceiveBufferMax != 0 || def.Driver.RQSize != 0 || def.Driver.RQDrop {
		t.Errorf("defaults: BounceRead %v, CoalesceBytes %d, TCPReceiveBufferMax %d, RQSize %d, RQDrop %v, want false, 0, 0, 0, false",
			def.Driver.BounceRead, def.Driver.CoalesceBytes, def.TCPReceiveBufferMax, def.Driver.RQSize, def.Driver.RQDrop)
	}
	for _, bad := range []string{"wire-read=dma", "tcp-rmem-max=-1", "rq-full=maybe"} {
		p, err := policyFromSettings([]string{bad})
		if err == nil {
			_, err = p.finish()
		}
		if err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
