package driver

import (
	"encoding/binary"
	"runtime"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/rrtrace"
)

// pollLoop is the driver's NAPI context. Pinned (Config.PollCPUs), it is
// locked to its own thread, as threaded NAPI's kthread; unpinned, it is an
// ordinary goroutine: a locked goroutine that parks hands its P to another
// thread and must be woken on its own, which costs a thread wake-up per
// interrupt and per hand-off to gVisor's processor goroutine (bench -rr:
// about a third more transactions per second unlocked). Its CPU time
// (poll_cpu_ns) is then summed per run between parks, on whichever
// thread it ran: close, not exact, if the runtime moves it mid-run.
//
// It holds the ring (napiOwner) while it runs and gives it up only while
// it sleeps, when a busy reader may process it (busyread.go); a reader's
// batches are not in its counts of CPU time.
func (d *Driver) pollLoop() {
	defer close(d.pollDone)
	cpu := CurrentCPU()
	if len(d.cfg.PollCPUs) > 0 {
		c, err := PinThread(d.cfg.PollCPUs)
		if err == nil {
			cpu = c
		} // else: pinning is a request, not a requirement: run unpinned
	}
	d.pollCPU.Store(int32(cpu))
	var cpuNanos int64     // summed over the runs between parks
	run := ThreadCPUTime() // this run's start on its thread
	usedCPU := func() int64 { return cpuNanos + max(0, ThreadCPUTime()-run) }
	d.napi.state.Store(napiLoop) // from napiOff: nobody else takes it before this
	cons := d.cons.Load()
	polls := 0
	// The handler's flush timer: armed when a Flush asks to be called
	// again, so that packets it holds leave even if the wire goes quiet.
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var again time.Duration
	more := false // the last batch ended with completions still waiting
	for {
		prod := d.prod.Load()
		if prod == cons {
			if more {
				// The ring is drained: a full flush, as
				// napi_complete_done does before interrupts are
				// re-enabled.
				more = false
				again = d.handler.Flush(false)
				continue
			}
			if d.cfg.BusyPoll > 0 {
				hit, spun := d.busyPoll(cons, again)
				if hit {
					continue // a completion came while spinning
				}
				if again > 0 {
					// The flush timer's time passed while spinning.
					if again -= spun; again <= 0 {
						again = d.handler.Flush(false)
						continue
					}
				}
			}
			cpuNanos = usedCPU()
			d.stats.PollCPUNanos.Store(cpuNanos)
			// Sleep until the NIC raises an interrupt (napiSleep
			// re-checks the ring after announcing it, so that no
			// completion is missed), giving the ring to busy readers
			// meanwhile; take it back with what they left.
			var ok bool
			if cons, more, again, ok = d.napiSleep(timer, again); !ok {
				return
			}
			rrtrace.Mark(rrtrace.PollWoke)
			run = ThreadCPUTime()
			continue
		}
		cons, more, again = d.poll(cons, prod)
		rrtrace.Mark(rrtrace.PollDone)
		if polls++; polls%16 == 0 {
			d.stats.PollCPUNanos.Store(usedCPU())
		}
	}
}

// busyPoll spins on the completion queue, the ring at cons drained, for
// up to Config.BusyPoll (and no longer than again, the handler's flush
// timer, when it is armed), yielding to other goroutines between looks,
// and reports whether a completion arrived and how long it spun: busy
// polling's napi_busy_loop, which polls the NAPI until its budget of time
// runs out instead of waiting for the IRQ. The NIC model raises no
// interrupt meanwhile: the loop does not sleep.
func (d *Driver) busyPoll(cons uint32, again time.Duration) (bool, time.Duration) {
	d.stats.BusyPolls.Add(1)
	spin := d.cfg.BusyPoll
	if again > 0 {
		spin = min(spin, again)
	}
	start := time.Now()
	for i := 0; ; i++ {
		if d.prod.Load() != cons {
			d.stats.BusyPollHits.Add(1)
			return true, time.Since(start)
		}
		if i%16 == 15 {
			if spun := time.Since(start); spun >= spin {
				return false, spun
			}
			select {
			case <-d.stop:
				return false, time.Since(start) // the sleep's select sees it too
			default:
			}
		}
		runtime.Gosched()
	}
}

// poll processes one batch of at most Budget completions and returns the
// new consumer index, whether completions are still waiting, and what the
// handler's Flush returned.
func (d *Driver) poll(cons, prod uint32) (uint32, bool, time.Duration) {
	n := prod - cons
	if n > uint32(d.cfg.Budget) {
		n = uint32(d.cfg.Budget)
	}
	var bytes, hds, hdsPull, hdsPayload, linearOnly, frags, linear, hwgro uint64
	for i := uint32(0); i < n; i++ {
		cqe := &d.cq[(cons+i)&d.mask]
		if cqe.HWGRO {
			hwgro++
			bytes += uint64(cqe.ByteCount)
			done, flushed := d.shampoAdd(cqe)
			if done != nil {
				d.handler.Deliver(done)
			}
			if flushed != nil {
				d.handler.Deliver(flushed)
			}
			continue
		}
		if done := d.shampoFlush(); done != nil {
			d.shampo.flushMismatch.Add(1) // another kind of frame
			d.handler.Deliver(done)
		}
		var pkt *Packet
		if d.nic.linear > 0 && cqe.NFrags == 1 {
			linear++
			linearOnly++
			f := d.takeLinear(cqe)
			bytes += uint64(f.Len)
			if d.xdp != nil && d.xdp.XDP(bufpool.Frame{Head: f, CsumVerified: cqe.Csum != CsumNone, RxMeta: cqeMeta(cqe)}) {
				continue // consumed before any packet was built
			}
			pkt = d.buildLinear(cqe, f)
		} else {
			var pulled int
			pkt, pulled = d.build(cqe)
			hds += uint64(len(pkt.Linear) - pulled)
			hdsPull += uint64(pulled)
			if h := cqe.hdrLen(); len(pkt.Linear) > h {
				hdsPayload += uint64(len(pkt.Linear) - h)
			}
			bytes += uint64(pkt.Len)
			if len(pkt.Frags) == 0 {
				linearOnly++
			}
			frags += uint64(len(pkt.Frags))
			if d.xdp != nil && d.xdp.XDP(bufpool.Frame{Pkt: pkt}) {
				continue
			}
		}
		d.handler.Deliver(pkt)
	}
	// A session still open at the end of the poll goes up now, as mlx5
	// flushes its SHAMPO skb at the end of each NAPI poll.
	if done := d.shampoFlush(); done != nil {
		d.shampo.flushPoll.Add(1)
		d.handler.Deliver(done)
	}
	cons += n
	d.cons.Store(cons)
	if d.nicWaiting.Load() {
		select {
		case d.space <- struct{}{}:
		default:
		}
	}
	more := d.prod.Load() != cons
	again := d.handler.Flush(more)
	st := &d.stats
	st.Polls.Add(1)
	st.Packets.Add(uint64(n))
	st.Bytes.Add(bytes)
	st.HDSBytes.Add(hds)
	st.HDSPayload.Add(hdsPayload)
	st.HDSPull.Add(hdsPull)
	st.LinearOnly.Add(linearOnly)
	st.SKBLinear.Add(linear)
	st.SKBNonlinear.Add(uint64(n) - linear - hwgro)
	st.PacketFrags.Add(frags)
	return cons, more, again
}

// headerCopyLen is the header copy's length for a frame as the NIC wrote it
// (a tunnel frame's outer header included): the mlx5 header-copy patch's
// estimate from the CQE's L3/L4 types (TCP timestamps assumed), or the
// fixed copy size.
//
// For an ip6tnl frame (OuterLen) the estimate counts the outer header as
// the patch counts an IP header, by its fixed size (sizeof(struct
// ipv6hdr)), and the inner headers by the CQE's inner L3/L4 types; outer
// extension headers are left out, as the patch leaves IPv6 extension
// headers out. build then drops the outer header's bytes from the copy.
//
// For a VXLAN frame (TunHdrLen) the CQE's types are the inner packet's,
// and mlx5e_cqe_get_min_hdr_len knows nothing of tunnels: the estimate is
// the inner Ethernet, IP and L4 headers' (TunMinLen), short of the 70 to
// 90 bytes of outer headers, which build then pulls, as GRO's
// skb_gro_header_slow pulls them from the frags in the kernel.
func (d *Driver) headerCopyLen(cqe *CQE) int {
	n := d.cfg.HDS
	if n == HDSAuto {
		switch {
		case cqe.TunHdrLen > 0:
			n = int(cqe.TunMinLen)
		default:
			n = MinHeaderLen(&cqe.Info)
			if cqe.OuterLen > 0 {
				n += ipv6HdrLen // sizeof(struct ipv6hdr): the outer header
			}
		}
	}
	return min(n, int(cqe.ByteCount))
}

// hdrLen is the length of the frame's headers as the NIC parsed them: a
// VXLAN frame's outer and inner ones, any other frame's Info.HeaderLen.
func (cqe *CQE) hdrLen() int {
	if cqe.TunHdrLen > 0 {
		return int(cqe.TunHdrLen)
	}
	return cqe.Info.HeaderLen()
}

// MinHeaderLen is mlx5e_cqe_get_min_hdr_len: Ethernet, a VLAN tag if
// present, the fixed IPv4 or IPv6 header, and UDP or TCP with the timestamp
// option. It errs on the side of copying too little: IP options and IPv6
// extension headers are left in the payload.
func MinHeaderLen(fi *FrameInfo) int {
	n := fi.L2Len // sizeof(struct ethhdr), with VLAN_HLEN if tagged; 0 on a TUN's wire
	switch fi.L3 {
	case L3IPv4:
		n += 20 // sizeof(struct iphdr)
	case L3IPv6:
		n += 40 // sizeof(struct ipv6hdr)
	}
	switch fi.L4 {
	case L4UDP:
		n += 8 // sizeof(struct udphdr)
	case L4TCP:
		n += 20 + 12 // sizeof(struct tcphdr) + TCPOLEN_TSTAMP_ALIGNED
	}
	return n
}

// build turns a completion into a Packet: the header copy into the linear
// part, the rest of the frame left in place as frags. The CQE's page
// references move to the packet.
//
// A header copy shorter than the headers the NIC parsed (Packet.HdrLen: a
// fixed copy under them, or the estimate's, which leaves IP options and
// IPv6 extension headers out) is completed from the frags, as
// pskb_may_pull does for the kernel's readers (eth_type_trans, GRO's
// skb_gro_header_slow, ip_rcv_core, tcp_v4_rcv, udp_rcv): every stage
// after the driver (XDP, GRO, cpumap, the stack) finds the headers in the
// linear part. build returns the packet and the bytes so pulled
// (rx_hds_pull_bytes), which the copy (rx_hds_bytes) does not count.
//
// A tunnel frame is decapsulated here, as a tunnel driver pulls the outer
// header off a received skb: of the header copy, the Ethernet header goes to
// the linear part with the inner EtherType, the outer IPv6 header's bytes are
// skipped, and the inner headers follow; the packet's length leaves the
// outer header out.
func (d *Driver) build(cqe *CQE) (*Packet, int) {
	pkt := bufpool.NewPacket()
	pkt.CsumVerified = cqe.Csum != CsumNone
	pkt.GSOSize = cqe.GSOSize
	pkt.Len = int(cqe.ByteCount)
	pkt.HdrLen = cqe.hdrLen()
	pkt.RxMeta = cqeMeta(cqe)
	want := d.headerCopyLen(cqe)
	// The frame's bytes in order: copy1 to the linear part, skip (the
	// outer header), copy2 to the linear part, the rest as frags.
	copy1, skip, copy2 := want, 0, 0
	if outer := int(cqe.OuterLen); outer > 0 {
		l2 := cqe.Info.L2Len
		copy1, skip, copy2 = l2, outer, max(want-l2-outer, 0)
		pkt.Len -= outer
	}
	lin := pkt.Linear[:0]
	for i := 0; i < int(cqe.NFrags); i++ {
		f := cqe.Frags[i]
		cqe.Frags[i] = bufpool.Frag{}
		if c := min(copy1, int(f.Len)); c > 0 {
			lin = append(lin, f.Page.Bytes()[f.Off:f.Off+uint32(c)]...)
			f.Off += uint32(c)
			f.Len -= uint32(c)
			copy1 -= c
		}
		if c := min(skip, int(f.Len)); copy1 == 0 && c > 0 {
			f.Off += uint32(c)
			f.Len -= uint32(c)
			skip -= c
		}
		if c := min(copy2, int(f.Len)); copy1 == 0 && skip == 0 && c > 0 {
			lin = append(lin, f.Page.Bytes()[f.Off:f.Off+uint32(c)]...)
			f.Off += uint32(c)
			f.Len -= uint32(c)
			copy2 -= c
		}
		if f.Len == 0 {
			f.Page.DecRef()
			continue
		}
		pkt.Frags = append(pkt.Frags, f)
	}
	cqe.NFrags = 0
	if l2 := cqe.Info.L2Len; cqe.OuterLen > 0 && l2 > 0 && len(lin) >= l2 {
		binary.BigEndian.PutUint16(lin[l2-2:], cqe.Info.EtherType)
	}
	pkt.Linear = lin
	pulled := 0
	if short := pkt.HdrLen - len(lin); short > 0 {
		// At most the linear part's room (bufpool.MaxLinear): longer
		// headers (IPv6 extension headers of a jumbo frame) stay partly
		// in the frags, and the readers that need them pass the packet on
		// unread, as they do any packet whose headers they cannot find.
		pulled = pkt.PullTail(short)
	}
	if cqe.GSOSize > 0 && cqe.Info.L4 == L4UDP && pkt.Len > pkt.HdrLen {
		// A UDP super-frame (Config.RxUSO) counts its datagrams, as
		// dev_gro_receive takes gso_segs for NAPI_GRO_CB(skb)->count.
		pkt.Segs = uint16((pkt.Len - pkt.HdrLen + int(cqe.GSOSize) - 1) / int(cqe.GSOSize))
	}
	return pkt, pulled
}

// takeLinear takes a linear-RQ completion's frame (NFrags 1) as the frag
// of its stride, with the CQE's page reference. A tunnel frame is
// decapsulated in place, as build does it by copying: the Ethernet header
// moves forward over the outer IPv6 header, in the frame's own stride, and
// takes the inner EtherType. The frame lies in one page (place: a stride
// never spans two).
func (d *Driver) takeLinear(cqe *CQE) bufpool.Frag {
	f := cqe.Frags[0]
	cqe.Frags[0] = bufpool.Frag{}
	cqe.NFrags = 0
	if outer := uint32(cqe.OuterLen); outer > 0 {
		if l2 := cqe.Info.L2Len; l2 > 0 { // a TUN's frame has no Ethernet header to move
			b := f.Page.Bytes()[f.Off : f.Off+f.Len]
			copy(b[outer:int(outer)+l2], b[:l2])
			binary.BigEndian.PutUint16(b[int(outer)+l2-2:], cqe.Info.EtherType)
		}
		f.Off += outer
		f.Len -= outer
	}
	return f
}

// buildLinear is mlx5e_skb_from_cqe_mpwrq_linear: the packet is built over
// the frame f (takeLinear's) in its stride, without a copy
// (mlx5e_build_linear_skb's napi_build_skb): its linear part is the frame,
// a head frag holding f's page reference (Packet.SetHead), and it has no
// frags. GRO later moves the payload after the headers into a frag, as
// skb_gro_receive does with a head_frag skb.
func (d *Driver) buildLinear(cqe *CQE, f bufpool.Frag) *Packet {
	pkt := bufpool.NewPacket()
	pkt.CsumVerified = cqe.Csum != CsumNone
	pkt.GSOSize = cqe.GSOSize
	pkt.HdrLen = cqe.hdrLen()
	pkt.RxMeta = cqeMeta(cqe)
	pkt.SetHead(f)
	pkt.Len = len(pkt.Linear)
	return pkt
}

// drain drops the completions left when the driver stops.
func (d *Driver) drain(cons uint32) {
	if p := d.shampoFlush(); p != nil {
		p.Release()
	}
	prod := d.prod.Load()
	for ; cons != prod; cons++ {
		cqe := &d.cq[cons&d.mask]
		for i := 0; i < int(cqe.NFrags); i++ {
			cqe.Frags[i].Page.DecRef()
			cqe.Frags[i] = bufpool.Frag{}
		}
		cqe.NFrags = 0
	}
	d.cons.Store(cons)
}
