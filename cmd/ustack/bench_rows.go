package main

import (
	"strconv"

	"github.com/ustack/ustack/internal/bench"
	"github.com/ustack/ustack/stack"
)

// The rows ustack bench measures: its policies, built from the switches.

// defaultRows are the bench's configurations: first the service
// configuration (stack.ServiceConfig), then mlx5 as shipped (stack.Config's
// zero value) with {LRO on, off} x {hds auto, 256} with GRO on, and LRO off
// with GRO off.
func defaultRows(mtu int) []bench.Row {
	svc := servicePolicy(mtu)
	rows := []bench.Row{row("service: "+svc.String(), svc)}
	add := func(lro, hds, gro string) {
		p := basePolicy(mtu, "lro="+lro, "hds="+hds, "gro="+gro)
		rows = append(rows, row("mlx5: "+p.String(), p))
	}
	add("on", "auto", "on")
	add("on", "256", "on")
	add("off", "auto", "on")
	add("off", "256", "on")
	add("off", "auto", "off")
	// The service configuration on a TUN device, beside the TAP's first
	// row: the same NIC model on IP packets without an Ethernet header.
	p := servicePolicy(mtu)
	tun := row("TUN: service: "+p.String(), p)
	tun.TUN = true
	rows = append(rows, tun)
	return rows
}

// poolRows are `ustack bench -pool`: mlx4's page-recycling patch's comparison on the cyclic
// RQ (mlx4's kind of ring), page recycling off (mlx4 before the patch: an
// order-0 page per RX slot) and on (the patch: frames packed at the frag
// stride, a quarantine half, allocations at order 3 split into order-0
// units) at 4 KB and 64 KB pages, LRO off and GRO on. Order 3 is
// PAGE_ALLOC_COSTLY_ORDER, mlx4's MLX4_EN_ALLOC_PREFER_ORDER.
func poolRows(mtu int) []bench.Row {
	var rows []bench.Row
	for _, size := range []string{"4k", "64k"} {
		for _, recycle := range []string{"off", "on"} {
			order := "0"
			if recycle == "on" {
				order = "3"
			}
			p := basePolicy(mtu, "rq=cyclic", "lro=off", "page-size="+size, "pool-recycle="+recycle, "page-order="+order)
			rows = append(rows, row("ustack "+p.String(), p))
		}
	}
	return rows
}

// hwGRORows are `ustack bench -hwgro`: the SHAMPO coalescing patch's three-way comparison at
// LRO off: software GRO only, hardware GRO, hardware GRO with coalescing;
// each with payload copied into gVisor and read with Read, and with zero
// copy read in place with ReadViews (tcp_mmap's side of the seed).
func hwGRORows(mtu int) []bench.Row {
	var rows []bench.Row
	for _, zc := range []string{"off", "views"} {
		for _, m := range []string{"off", "on", "coalesce"} {
			p := basePolicy(mtu, "lro=off", "hw-gro="+m, "zero-copy="+zc)
			rows = append(rows, row("ustack "+p.String(), p))
		}
	}
	return rows
}

// servicePolicy is stack.ServiceConfig at this MTU, with the settings
// applied after it.
func servicePolicy(mtu int, settings ...string) policy {
	return basePolicy(mtu, append(serviceSettings(), settings...)...)
}

// basePolicy is the default of every switch at this MTU, with the
// settings (valid ones: the bench's own) applied.
func basePolicy(mtu int, settings ...string) policy {
	p, err := policyFromSettings(append([]string{"mtu=" + strconv.Itoa(mtu)}, settings...))
	if err != nil {
		panic(err) // a bench row of this file with a bad setting
	}
	return p
}

// cpumapPaths are the cpumap GRO patch's receive paths: no cpumap, and every frame
// redirected from the poll loop (NIC and poll loop on CPU 0) to a cpumap
// worker on CPU 1, with its GRO off and on; last, no cpumap with GRO off,
// what cpumap GRO off must carry at least. bench.CPUMap compares with
// paths[1]. Every row runs with LRO off: mlx5 refuses XDP while LRO is on
// (mlx5e_xdp_allowed), and the rows without cpumap are to differ from the
// others only in the redirect.
func cpumapPaths(mtu int) []bench.Row {
	pinned := []string{"lro=off", "nic-cpu=0", "poll-cpu=0"}
	rows := []bench.Row{row("no cpumap", basePolicy(mtu, pinned...))}
	for _, g := range []string{"off", "on"} {
		p := basePolicy(mtu, append(pinned, "xdp=cpu:0", "cpumap=1", "cpumap-gro="+g)...)
		rows = append(rows, row("cpumap gro "+g, p))
	}
	rows = append(rows, row("no cpumap gro off", basePolicy(mtu, append(pinned, "gro=off")...)))
	return rows
}

// rrRows are `ustack bench -rr`'s ustack rows: the service configuration,
// mlx5 as shipped, and the service configuration without delayed ACKs, with
// busy polling, with busy reads, with two goroutines for the NIC model
// and the poll loop, and with TCP on gVisor's processor goroutines
// rather than inline (bench.RR adds the kernel's row).
func rrRows(mtu int) []bench.Row {
	return []bench.Row{row("ustack service", servicePolicy(mtu)),
		row("ustack mlx5", basePolicy(mtu)),
		row("delayed-ack=0", servicePolicy(mtu, "delayed-ack=0")),
		row("busy-poll=50µs", servicePolicy(mtu, "busy-poll=50µs")),
		row("busy-read=50µs", servicePolicy(mtu, "busy-read=50µs")),
		row("run-to-completion=off", servicePolicy(mtu, "run-to-completion=off")),
		row("inline-tcp=off", servicePolicy(mtu, "inline-tcp=off"))}
}

// row is a bench row measuring ustack with policy p.
func row(name string, p policy) bench.Row {
	return bench.Row{Name: name, Policy: benchPolicy{p}, MTU: p.cfg.Driver.MTU}
}

// benchPolicy is a policy as the bench measures it.
type benchPolicy struct{ p policy }

func (b benchPolicy) StackConfig() (stack.Config, error) { return b.p.finish() }
func (b benchPolicy) ReadViews() bool                    { return b.p.views }
func (b benchPolicy) PlainWire() bool                    { return b.p.plain }

// parseBenchPolicy is policyFromSettings for the bench matrix.
func parseBenchPolicy(settings []string) (bench.Policy, error) {
	p, err := policyFromSettings(settings)
	if err != nil {
		return nil, err
	}
	return benchPolicy{p}, nil
}
