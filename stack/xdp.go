package stack

import (
	"fmt"
	"sync/atomic"
	"time"

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

// XDP runs the XDP program on a frame in the poll loop, before any packet
// is built for it on the linear RQ (driver.XDPHandler; Deliver's stage 1),
// and reports whether the frame was consumed: dropped, sent back out,
// redirected to a cpumap entry as the frame itself (the worker builds its
// packet, as cpu_map_kthread_run builds skbs from xdp_frames) or copied
// into the bound AF_XDP socket. A frame that passes goes back to the
// driver, which builds its packet and delivers it to GRO and gVisor.
func (e *linkEndpoint) XDP(f bufpool.Frame) bool { return e.runXDP(&e.xdpParts, e.cpuProd, true, f) }

// runXDP is XDP for one queue's poll loop: parts is its scratch, prod its
// cpumap producer (nil: no cpumap); xsk says the queue has the XSKMAP's
// socket (queue 0's: bpf_redirect_map(&xsks, rx_queue_index) finds none on
// the others, whose RedirectXSK frames pass).
func (e *linkEndpoint) runXDP(parts *[][]byte, prod *cpumap.Producer, xsk bool, f bufpool.Frame) bool {
	act, entry := e.xdp.Run(f.Data())
	switch act {
	case cpumap.Drop:
		e.xdpStats.drop.Add(1)
		f.Release()
		return true
	case cpumap.TX:
		e.xdpStats.tx.Add(1)
		e.xdpTX(parts, f)
		return true
	case cpumap.Redirect:
		e.xdpStats.redirect.Add(1)
		if prod == nil {
			// No cpumap to redirect to: the kernel drops (and traces) it.
			e.xdpStats.drop.Add(1)
			f.Release()
			return true
		}
		prod.EnqueueFrame(entry, f)
		return true
	case cpumap.RedirectXSK:
		if xsk && e.toXSK(parts, f) {
			return true
		}
		// No socket bound: XDP_PASS, bpf_redirect_map's fallback.
	}
	e.xdpStats.pass.Add(1)
	return false
}

// frameParts returns f's bytes as the parts of *scratch, in order; the
// caller hands them back with putParts.
func frameParts(scratch *[][]byte, f bufpool.Frame) [][]byte {
	parts := (*scratch)[:0]
	if f.Pkt == nil {
		return append(parts, f.Head.Bytes())
	}
	for w := f.Pkt.Walk(0); w.Next(); {
		parts = append(parts, w.Bytes())
	}
	return parts
}

func putParts(scratch *[][]byte, parts [][]byte) {
	clear(parts)
	*scratch = parts[:0]
}

// xdpTX sends a frame back out of the wire as it is (XDP_TX) and releases it.
func (e *linkEndpoint) xdpTX(scratch *[][]byte, f bufpool.Frame) {
	defer f.Release()
	parts := frameParts(scratch, f)
	var h driver.VirtioNetHdr
	if err := e.drv.Transmit(&h, parts); err != nil {
		e.xdpStats.txErrors.Add(1)
	}
	putParts(scratch, parts)
}

// cpumapRx is one cpumap worker's receiver (cpu_map_kthread_run's side of
// the map). The worker hands it each round's frames as one list; for each
// it builds the packet as __xdp_build_skb_from_frame does, with no checksum
// status (CHECKSUM_NONE, csumNone), and hands it to the worker's own GRO
// engine (gro_receive_skb) or, with cpumap GRO off, to gVisor
// (netif_receive_skb_list: Deliver's stages 3 to 10 for each, in order).
// Its methods are called from its worker's goroutine only.
type cpumapRx struct {
	e   *linkEndpoint
	gro *gro.Engine // nil: cpumap GRO off; else the receiver is a cpumapGRORx
	st  *cpumapCsumStats

	buf []byte // a frame's bytes, for the software check; grown to the largest
	fi  driver.FrameInfo
	// inl is the worker's inline batch (Config.InlineTCP), run at the
	// end of each round (EndBatch, FlushOlderThan, Flush).
	inl inlineBatch
}

// cpumapCsumStats count the workers' software checksum checks.
type cpumapCsumStats struct {
	sw, trusted atomic.Uint64
}

// csumNone gives p what a CHECKSUM_NONE skb built from an xdp_frame gets.
// A packet the worker built around a frame (HdrLen 0: nobody parsed its
// headers yet, as after __xdp_build_skb_from_frame's eth_type_trans) has
// them parsed here, for GRO. The checksums the NIC verified are verified
// again in software (as GRO's skb_gro_checksum_validate, or udp_rcv and
// tcp_v4_rcv without GRO, do for such an skb), counted in
// cpumap_rx_csum_sw. A frame the NIC did not verify goes on unverified: GRO
// or csumCheck checks it and drops it if bad. A frame the NIC vouched for
// whose bytes hold no checksum to verify (CHECKSUM_PARTIAL: the sender
// behind the TAP left it to offload, which a wire never carries) stays
// trusted, counted in cpumap_rx_csum_trusted. It borrows p.
func (r *cpumapRx) csumNone(p *bufpool.Packet) {
	if !p.CsumVerified && p.HdrLen != 0 {
		return
	}
	frame := r.frame(p)
	parse := driver.ParseFrame
	if r.e.l3 {
		parse = driver.ParseL3Frame // a TUN's packet
	}
	parsed := parse(frame, &r.fi) == driver.DropNone
	if parsed && p.HdrLen == 0 {
		p.HdrLen = r.fi.HeaderLen()
	}
	if !p.CsumVerified {
		return
	}
	if parsed && driver.VerifyChecksums(frame, &r.fi, true) == driver.DropNone {
		r.st.sw.Add(1)
		return
	}
	r.st.trusted.Add(1)
}

// frame returns p's bytes in one slice: its linear part when that is all,
// else a copy in r.buf (valid until the next call). It borrows p.
func (r *cpumapRx) frame(p *bufpool.Packet) []byte {
	if p.Next == nil && len(p.Frags) == 0 {
		return p.Linear
	}
	n := p.TotalLen()
	if cap(r.buf) < n {
		r.buf = make([]byte, n)
	}
	if p.Next != nil {
		return r.buf[:p.CopyTo(r.buf[:n])]
	}
	m := copy(r.buf[:n], p.Linear)
	for _, f := range p.Frags {
		m += copy(r.buf[m:n], f.Bytes())
	}
	return r.buf[:m]
}

// Receive takes p.
func (r *cpumapRx) Receive(p *bufpool.Packet, now int64) {
	r.csumNone(p)
	if r.gro != nil {
		r.gro.Receive(p, now)
		return
	}
	r.e.toGVisor(p, &r.inl)
}

// ReceiveList takes every packet of ps, in order (cpumap.ListReceiver).
func (r *cpumapRx) ReceiveList(ps []*bufpool.Packet, now int64) {
	for _, p := range ps {
		r.Receive(p, now)
	}
}

// EndBatch implements cpumap.Receiver: nothing is held with GRO off; the
// TCP connections the round reached are processed.
func (r *cpumapRx) EndBatch(int64) { runInline(&r.inl) }

// cpumapGRORx is a cpumapRx with a GRO engine: cpu_map_gro_flush on it
// (cpumap.Flusher in full on an empty ring, cpumap.OldFlusher under load).
type cpumapGRORx struct{ cpumapRx }

func (r *cpumapGRORx) EndBatch(now int64) { r.gro.EndBatch(now); runInline(&r.inl) }
func (r *cpumapGRORx) Flush()             { r.gro.Flush(); runInline(&r.inl) }
func (r *cpumapGRORx) FlushOlderThan(age time.Duration, now int64) {
	r.gro.FlushOlderThan(age, now)
	runInline(&r.inl)
}

var (
	_ cpumap.ListReceiver = (*cpumapRx)(nil)
	_ cpumap.ListReceiver = (*cpumapGRORx)(nil)
	_ cpumap.Flusher      = (*cpumapGRORx)(nil)
	_ cpumap.OldFlusher   = (*cpumapGRORx)(nil)
)

// startCPUMap builds the cpumap whose workers deliver to gVisor, each with
// its own GRO engine unless cfg.NoCPUMapGRO.
func (e *linkEndpoint) startCPUMap(cfg *Config) error {
	var engines []*gro.Engine
	m, err := cpumap.New(cpumap.Config{
		CPUs:      cfg.CPUMap,
		QueueSize: cfg.CPUMapQueue,
		Pin:       driver.PinThread,
		NewReceiver: func(int) cpumap.Receiver {
			if cfg.NoCPUMapGRO {
				return &cpumapRx{e: e, st: &e.cpuCsum}
			}
			rx := &cpumapGRORx{cpumapRx{e: e, st: &e.cpuCsum}}
			rx.gro = gro.New(groConfig(cfg, e.l3), &groSink{e: e, inl: &rx.inl})
			engines = append(engines, rx.gro)
			return rx
		},
	})
	if err != nil {
		return fmt.Errorf("stack: cpumap: %w", err)
	}
	e.cpumap, e.cpuProd, e.cpuGRO = m, m.NewProducer(), engines
	return nil
}

// eachCPUMapGRO yields the cpumap workers' checksum counters
// (cpumap_rx_csum_*) and their GRO counters' totals (KindOf: sums, the
// largest worker's rx_gro_held_max), named cpumap_rx_gro_*.
func (e *linkEndpoint) eachCPUMapGRO(fn func(string, uint64)) {
	if e.cpumap == nil {
		return
	}
	fn("cpumap_rx_csum_sw", e.cpuCsum.sw.Load())
	fn("cpumap_rx_csum_trusted", e.cpuCsum.trusted.Load())
	if len(e.cpuGRO) == 0 {
		return
	}
	var tot counterTotals
	for _, g := range e.cpuGRO {
		g.Stats().Each(tot.add)
	}
	tot.each("cpumap_", fn)
}
