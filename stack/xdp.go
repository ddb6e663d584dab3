package stack

import (
	"fmt"
	"sync/atomic"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/gro"
)

// xdpStats count the XDP program's verdicts.
type xdpStats struct {
	pass, drop, tx, redirect, txErrors atomic.Uint64
}

func (s *xdpStats) each(fn func(string, uint64)) {
	fn("rx_xdp_pass", s.pass.Load())
	fn("rx_xdp_drop", s.drop.Load())
	fn("rx_xdp_tx", s.tx.Load())
	fn("rx_xdp_redirect", s.redirect.Load())
	fn("rx_xdp_tx_errors", s.txErrors.Load())
}

// runXDP runs the XDP program on a frame in the poll loop and reports
// whether the frame was consumed (dropped, sent back out, redirected to a
// cpumap entry or copied into the bound AF_XDP socket); a frame that
// passes goes on to GRO and gVisor.
func (e *linkEndpoint) runXDP(p *bufpool.Packet) bool {
	act, entry := e.xdp.Run(p)
	switch act {
	case cpumap.Drop:
		e.xdpStats.drop.Add(1)
		p.Release()
		return true
	case cpumap.TX:
		e.xdpStats.tx.Add(1)
		e.xdpTX(p)
		return true
	case cpumap.Redirect:
		e.xdpStats.redirect.Add(1)
		if e.cpuProd == nil {
			// No cpumap to redirect to: the kernel drops (and traces) it.
			e.xdpStats.drop.Add(1)
			p.Release()
			return true
		}
		e.cpuProd.Enqueue(entry, p)
		return true
	case cpumap.RedirectXSK:
		if e.toXSK(p) {
			return true
		}
		// No socket bound: XDP_PASS, bpf_redirect_map's fallback.
	}
	e.xdpStats.pass.Add(1)
	return false
}

// xdpTX sends a frame back out of the wire as it is (XDP_TX) and releases it.
func (e *linkEndpoint) xdpTX(p *bufpool.Packet) {
	defer p.Release()
	parts := e.xdpParts[:0]
	for w := p.Walk(0); w.Next(); {
		parts = append(parts, w.Bytes())
	}
	var h driver.VirtioNetHdr
	if err := e.drv.Transmit(&h, parts); err != nil {
		e.xdpStats.txErrors.Add(1)
	}
	for i := range parts {
		parts[i] = nil
	}
	e.xdpParts = parts[:0]
}

// directReceiver is a cpumap worker's receiver with cpumap GRO off: every
// frame goes to gVisor on its own, as the kthread did before seed 004.
type directReceiver struct{ e *linkEndpoint }

func (r directReceiver) Receive(p *bufpool.Packet, _ int64) { r.e.toGVisor(p) }
func (r directReceiver) EndBatch(int64)                     {}

// startCPUMap builds the cpumap whose workers deliver to gVisor, each with
// its own GRO engine when groOn.
func (e *linkEndpoint) startCPUMap(cfg *Config) error {
	var engines []*gro.Engine
	m, err := cpumap.New(cpumap.Config{
		CPUs:      cfg.CPUMap,
		QueueSize: cfg.CPUMapQueue,
		Pin:       driver.PinThread,
		NewReceiver: func(int) cpumap.Receiver {
			if cfg.NoCPUMapGRO {
				return directReceiver{e}
			}
			g := gro.New(gro.Config{FlushTimeout: cfg.GROFlushTimeout}, (*groSink)(e))
			engines = append(engines, g)
			return g
		},
	})
	if err != nil {
		return fmt.Errorf("stack: cpumap: %w", err)
	}
	e.cpumap, e.cpuProd, e.cpuGRO = m, m.NewProducer(), engines
	return nil
}

// eachCPUMapGRO yields the cpumap workers' GRO counters summed, named
// cpumap_rx_gro_*.
func (e *linkEndpoint) eachCPUMapGRO(fn func(string, uint64)) {
	if len(e.cpuGRO) == 0 {
		return
	}
	var names []string
	sums := map[string]uint64{}
	for _, g := range e.cpuGRO {
		g.Stats().Each(func(name string, v uint64) {
			if _, ok := sums[name]; !ok {
				names = append(names, name)
			}
			sums[name] += v
		})
	}
	for _, n := range names {
		fn("cpumap_"+n, sums[n])
	}
}
