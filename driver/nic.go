package driver

import (
	"errors"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/hdr"
	"github.com/ustack/ustack/internal/rrtrace"
)

// nicState is the NIC model's private state: the wire read buffer, the WQE
// it is filling, and the CQEs written but not yet published.
type nicState struct {
	d        *Driver
	rbuf     []byte
	seg      Segmenter
	maxFrame int // largest frame the RX queue takes (a whole super-frame with LRO)
	wireMax  int // largest frame the wire may carry: the MTU, an Ethernet header and a VLAN tag
	wqeBytes int // bytes a WQE spans (a striding MPWQE, or one frame's buffer)
	oneFrame bool
	linear   int // the linear RQ's stride (Config.LinearStride), 0 for the nonlinear one
	linearHR int // the headroom before a frame in it (Config.LinearHeadroom)
	// cyc places the cyclic RQ's frames as mlx4 does (cyclic.go), nil
	// for the other RQs; slotCost is what each of its frames is charged.
	cyc      *bufpool.RXFrags
	slotCost uint64

	// The WQE being filled: its pages (one reference each, the NIC's; their
	// sizes may differ when the pool's allocation order changes), the byte
	// offset of the next free stride, and its counter.
	wqe    pageSet
	off    int
	wqeSeq uint32
	posted bool

	sess session // hardware GRO
	now  int64   // arrival time of the current read (hardware GRO only)

	// The RQ's accounting. ringUsed counts the ring bytes the NIC has
	// charged to completions: a frame's strides (or a SHAMPO payload) to
	// its CQE, and the page-rounded unused end of a WQE or reservation,
	// when it is retired, to the last CQE written (at or after the last
	// one using its pages). ends[i&endMask] is ringUsed as of CQE i, kept
	// by the NIC alone: the bytes still outstanding are those charged to
	// the CQEs the poll loop has not consumed (d.cons on), and they may
	// reach rqBytes. Every byte charged is carried by a CQE, so when the
	// poll loop has consumed them all nothing is outstanding and the NIC
	// never waits: no tail can hold the RQ full with nothing to free it.
	ringUsed uint64
	rqBytes  uint64
	ends     []uint64 // two entries per CQE slot: ends[cons-1] outlives its slot's reuse
	endMask  uint32

	prod    uint32 // next CQE to write; exposed to d.prod after each wire read
	exposed uint32 // the last prod stored to d.prod
	// strides counts rx_strides until expose adds them to the stats, once
	// per wire read: an atomic add per frame would wait, as a full
	// barrier does, for the frame's writes into the ring to complete.
	strides uint64
	// Interrupt moderation: the CQEs written since the last interrupt
	// (publish) that a running poll loop did not take (due), their bytes,
	// the moderation timer's start (when the last of them was exposed to a
	// sleeping poll loop, clock ns; 0: none), and whether the timer ran out
	// (the interrupt publish raises is then the timer's).
	pending    int
	pendBytes  int
	lastCQE    int64
	timerFired bool

	fi   FrameInfo // the current frame's, as ParseFrame fills it
	segs segPlacer // places the segments receiveGSO cuts a super-frame into

	tunLocal [][16]byte // local tunnel addresses (Config.Tunnel)
	l3       bool       // frames start at the IP header (Config.L3: a TUN)
	// hdrLen is the virtio-net header's length on the wire (wireVnetHdrLen):
	// 24 bytes on a TAP that carries UDP tunnel GSO, else 10.
	hdrLen  int
	vxPorts []uint16   // Config.VXLANPorts
	vx      vxlanFrame // the current frame's VXLAN layout, when parseVXLAN found one

	// Direct reads (Config.BounceRead off): vr reads a frame's virtio-net
	// header and first directHead bytes into rbuf and the rest straight
	// into the WQE, from off+directHead on (then, past the WQE's end, into
	// rbuf where the bytes belong).
	vr      VecReader // nil: every read goes to rbuf
	iov     [][]byte
	lastLen int // the previous frame's length: a WQE with less room is retired before a read
}

// rxMeta is what the NIC model hands place about a frame beside its
// bytes: what its CQE reports, and how much of it a direct read left in
// the WQE. Passed by value: it lives for one place call.
type rxMeta struct {
	info     *FrameInfo  // the frame's layout (a tunnel frame's inner one)
	vx       *vxlanFrame // a VXLAN frame's tunnel layout (Config.VXLANPorts), nil if none
	csum     CsumState
	gsoSize  uint16 // an LRO super-frame's MSS, 0 for a frame the wire carried
	outerLen int    // the outer tunnel header, 0 if none
	// inRing is the bytes of the frame that a direct read put into the
	// WQE where place would write them: the tail of a, whose own bytes
	// there are stale. place claims them instead of copying.
	inRing int
}

// segPlacer is the SegmentSink the NIC model cuts a super-frame into: it
// places each segment with the layout of the super-frame, set before each
// Segmenter.Segment call. No segment has an outer tunnel header:
// decapsulate refuses GSO super-frames (DropBadTunnel).
type segPlacer struct {
	n    *nicState
	fi   *FrameInfo  // the super-frame's layout
	vx   *vxlanFrame // a VXLAN super-frame's tunnel layout, the same for each segment but its lengths; nil if none
	info FrameInfo   // the current segment's layout
}

// directHead is the part of a frame a direct read puts into the NIC's own
// buffer, where the NIC model looks at it: room for the headers of any
// TCP super-frame it hands up without copying.
const directHead = 256

func (n *nicState) init(d *Driver) {
	n.d = d
	n.segs.n = n
	n.hdrLen = wireVnetHdrLen(d.wire)
	n.vxPorts = d.cfg.VXLANPorts
	n.rbuf = make([]byte, n.hdrLen+maxLROFrame)
	if n.hdrLen == VirtioNetHdrTunnelLen {
		// A tunnel super-frame: a 64 KB inner packet behind the outer
		// headers.
		n.rbuf = make([]byte, n.hdrLen+maxLROFrame+maxTunnelOuterLen)
	}
	n.seg.FillChecksum = d.cfg.FillChecksum
	n.maxFrame = d.cfg.maxFrame()
	n.tunLocal = d.cfg.Tunnel.locals()
	n.wireMax = d.cfg.MTU + header.EthernetMinimumSize + hdr.VLANTagLen
	if n.l3 = d.cfg.L3; n.l3 {
		n.wireMax = d.cfg.MTU
	}
	n.wqeBytes = d.cfg.WQEBytes
	n.linear, n.linearHR = d.cfg.LinearStride(), d.cfg.LinearHeadroom()
	if n.oneFrame = d.cfg.RQ == RQCyclic || d.cfg.PagePerFrame; n.oneFrame {
		// One buffer per frame, sized for the largest frame, starting on
		// a fresh page.
		n.wqeBytes = n.maxFrame
	}
	// The RQ holds wqes WQEs as the pool's pages really hold them: a
	// WQE takes whole pages (a cyclic RQ's 1518-byte buffer a 4 KB page,
	// or a 64 KB one), and the NIC charges whole pages (retire).
	wqes, wqeBytes := d.cfg.RQDepth()
	n.rqBytes = uint64(wqes) * uint64(pageRound(wqeBytes, d.pool.PageBytes()))
	n.initCyclic(wqes, n.rqBytes/uint64(wqes))
	n.ends = make([]uint64, 2*len(d.cq))
	n.endMask = uint32(len(n.ends) - 1)
	maxPages := n.wqeBytes/bufpool.PageSize4K + 2
	n.wqe.pages = make([]*bufpool.Page, 0, maxPages)
	n.wqe.start = make([]int, 0, maxPages)
	// Direct reads serve the super-frames placed whole into a striding
	// WQE (LRO's, RxUSO's); hardware GRO and the wire tap want every frame
	// in rbuf.
	if vr, ok := d.wire.(VecReader); ok && !d.cfg.BounceRead && d.cfg.WholeSuperFrames() && d.cfg.HWGRO == HWGROOff && !n.oneFrame && d.cfg.WireTap == nil {
		n.vr = vr
		n.iov = make([][]byte, 0, maxReadIov)
	}
}

func (d *Driver) nicLoop() {
	defer close(d.nicDone)
	cpu, err := PinThread(d.cfg.NICCPUs)
	if err != nil {
		d.nicErr = err
		return
	}
	d.nicCPU.Store(int32(cpu))
	n := &d.nic
	start := ThreadCPUTime()
	defer func() {
		n.publish()
		d.stats.NICCPUNanos.Store(ThreadCPUTime() - start)
	}()
	block := false
	for {
		got, err := n.step(block)
		if err != nil {
			d.wireFailed(err)
			return
		}
		if !got {
			// The wire is empty: publish what we have and sleep on it.
			n.publish()
			d.stats.NICCPUNanos.Store(ThreadCPUTime() - start)
			block = true
			continue
		}
		block = false
		if n.due() {
			n.publish()
			d.stats.NICCPUNanos.Store(ThreadCPUTime() - start)
		}
	}
}

// step reads one frame from the wire, waiting for one if block is set, and
// writes it into the ring (its CQEs exposed to the poll loop). It reports
// false, with no error, when block is false and the wire has no frame. An
// error is the wire's: it is closed or failed.
func (n *nicState) step(block bool) (bool, error) {
	var m, inRing int
	var err error
	if n.vr != nil {
		m, inRing, err = n.readDirect(block)
	} else {
		m, err = n.d.wire.Read(n.rbuf, block)
	}
	if errors.Is(err, ErrNoFrame) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	rrtrace.Mark(rrtrace.FrameRead)
	if inRing > 0 && !n.directOK(n.rbuf[:m], inRing) {
		n.gather(inRing)
		inRing = 0
	}
	n.receive(n.rbuf[:m], inRing)
	rrtrace.Mark(rrtrace.Received)
	n.expose()
	return true, nil
}

// readDirect reads a frame as Wire.Read does into rbuf, but with the part
// after its first directHead bytes going straight into the WQE (where the
// frame goes if it is placed whole) as far as the WQE reaches. It returns
// the read's length m and inRing, the bytes that went into the WQE. A WQE
// with less room left than the last frame took is retired first, so that
// a stream of super-frames goes into the ring whole.
func (n *nicState) readDirect(block bool) (m, inRing int, err error) {
	if n.posted && n.wqe.size-n.off < directHead+n.lastLen {
		n.retire()
	}
	if !n.posted && !n.post() {
		m, err = n.d.wire.Read(n.rbuf, block) // no buffer: place drops it
		return m, 0, err
	}
	head := n.hdrLen + directHead
	iov := append(n.iov[:0], n.rbuf[:head])
	covered := 0
	if room := min(n.wqe.size-n.off-directHead, len(n.rbuf)-head); room > 0 {
		iov, covered = n.wqe.slices(iov, n.off+directHead, room, maxReadIov-2)
	}
	if head+covered < len(n.rbuf) {
		iov = append(iov, n.rbuf[head+covered:])
	}
	m, err = n.vr.ReadVec(iov, block)
	if err != nil {
		return 0, 0, err
	}
	n.lastLen = m - n.hdrLen
	return m, min(max(m-head, 0), covered), nil
}

// directOK reports whether the frame of a direct read (b: the virtio-net
// header and the frame, whose inRing bytes past directHead are in the
// WQE, not in b) can stay where it is: a TCP super-frame that LRO hands up
// whole (receive then looks at nothing but its headers), whose headers lie
// in the first directHead bytes and whose rest all went into the WQE.
// Anything else is gathered into rbuf first. The parse reads b's stale
// tail only for a header that would end past directHead, which it
// rejects.
func (n *nicState) directOK(b []byte, inRing int) bool {
	var h VirtioNetHdr
	if !h.Decode(b) {
		return false
	}
	gt := h.GSOType &^ VirtioNetHdrGSOECN
	l4 := L4TCP // what receiveGSO places whole: LRO's TCP, RxUSO's UDP
	switch {
	case (gt == VirtioNetHdrGSOTCPv4 || gt == VirtioNetHdrGSOTCPv6) && n.d.cfg.LRO:
	case gt == VirtioNetHdrGSOUDPL4 && n.d.cfg.RxUSO:
		l4 = L4UDP
	default:
		return false
	}
	if h.GSOSize == 0 || h.Flags&VirtioNetHdrFNeedsCsum == 0 {
		return false
	}
	frame := b[n.hdrLen:]
	if len(frame) != directHead+inRing || len(frame) > n.maxFrame {
		return false
	}
	fi := &n.fi
	if n.parse(frame, fi) != DropNone || fi.VLAN || fi.L4 != l4 || fi.HeaderLen() > directHead {
		return false
	}
	if len(n.tunLocal) > 0 {
		if outer, drop := decapsulate(&h, frame, fi, n.tunLocal); outer != 0 || drop != DropNone {
			return false
		}
	}
	return true
}

// gather copies the inRing bytes of the frame a direct read put into the
// WQE back into rbuf, after the frame's first directHead bytes, so that
// the frame lies whole in rbuf, as after Wire.Read.
func (n *nicState) gather(inRing int) {
	start := n.hdrLen + directHead
	n.wqe.read(n.rbuf[start:start+inRing], n.off+directHead)
}

// receive handles one read from the wire: a virtio-net header and a frame
// or a GSO super-frame, whose last inRing bytes a direct read put into the
// WQE (directOK) rather than b.
func (n *nicState) receive(b []byte, inRing int) {
	d := n.d
	st := &d.stats
	st.WireReads.Add(1)
	var h VirtioNetHdr
	if len(b) < n.hdrLen || !h.Decode(b) {
		n.dropped(DropBadVnetHdr)
		return
	}
	frame := b[n.hdrLen:]
	st.WireBytes.Add(uint64(len(frame)))
	if d.cfg.HWGRO != HWGROOff {
		n.now = d.clock() // one arrival time for every frame of this read
	}
	if t := d.cfg.WireTap; t != nil {
		t.WriteFrame(time.Now(), frame)
	}
	if !n.l3 {
		if len(frame) < header.EthernetMinimumSize {
			n.dropped(DropShortEther)
			return
		}
		if drop := n.filterMAC(frame); drop != DropNone {
			n.dropped(drop)
			return
		}
	}
	fi := &n.fi
	if drop := n.parse(frame, fi); drop != DropNone {
		n.dropped(drop)
		return
	}
	if fi.VLAN {
		st.DroppedVLAN.Add(1)
		return
	}
	// A tunnel frame continues as the frame it carries (fi, h and the
	// checksum below see the decapsulated frame, frame[outer:]); the ring
	// still gets the whole frame, as a NIC's DMA writes it.
	outer, drop := decapsulate(&h, frame, fi, n.tunLocal)
	if drop != DropNone {
		n.dropped(drop)
		return
	}
	if outer > 0 {
		st.TunnelDecap.Add(1)
	}
	if n.hdrLen == VirtioNetHdrTunnelLen {
		var th VirtioNetHdrTunnel
		th.Decode(b)
		if drop := th.check(frame); drop != DropNone {
			n.dropped(drop)
			return
		}
		if th.Tunnel() {
			st.GSOFrames.Add(1)
			n.receiveTunnelGSO(&th, frame, fi)
			return
		}
	}
	if h.GSOType != VirtioNetHdrGSONone {
		st.GSOFrames.Add(1)
		n.receiveGSO(&h, frame, rxMeta{info: fi, outerLen: outer, inRing: inRing})
		return
	}
	// A frame that is not a super-frame is held to the MTU, LRO or not:
	// the NIC's MAC drops oversize frames before LRO sees them.
	if len(frame) > n.wireMax {
		n.dropped(DropTooBig)
		return
	}
	cs, drop := n.checksum(&h, frame[outer:], fi)
	if drop != DropNone {
		n.dropped(drop)
		return
	}
	m := rxMeta{info: fi, csum: cs, outerLen: outer, inRing: inRing}
	if parseVXLAN(frame, fi, n.vxPorts, &n.vx) {
		m.vx = &n.vx
		m.csum = tunnelChecksum(frame, &n.vx, cs)
		st.VXLANFrames.Add(1)
	}
	n.place(frame, nil, m)
}

// receiveTunnelGSO handles a super-frame inside a UDP tunnel (a TAP with
// UDP tunnel GSO: what a vxlan device sends through it): cut into the
// frames the wire would have carried, each with its outer headers, as
// __skb_udp_tunnel_segment cuts it. LRO does not apply: a NIC's LRO leaves
// tunnelled TCP alone (the header-copy patch's own tunnel figures are the
// same with LRO on and off), so GRO merges the inner flow in software.
func (n *nicState) receiveTunnelGSO(h *VirtioNetHdrTunnel, frame []byte, fi *FrameInfo) {
	st := &n.d.stats
	if drop := VerifyChecksums(frame, fi, false); drop != DropNone {
		n.dropped(drop)
		return
	}
	vx := parseVXLAN(frame, fi, n.vxPorts, &n.vx)
	n.segs.fi, n.segs.vx = fi, nil
	if vx {
		n.segs.vx = &n.vx
	}
	segs, drop := n.seg.SegmentTunnel(h, frame, &n.segs)
	n.segs.vx = nil
	if drop != DropNone {
		n.dropped(drop)
		return
	}
	st.TunnelGSOFrames.Add(1)
	st.GSOSegs.Add(uint64(segs))
	if vx {
		st.VXLANFrames.Add(uint64(segs))
	}
}

// receiveGSO handles a super-frame: whole with LRO (TCP only, as hardware
// LRO) or RxUSO (UDP), else cut into the frames the wire would have carried. m is the
// super-frame's layout, outer tunnel header and bytes in the WQE (receive).
func (n *nicState) receiveGSO(h *VirtioNetHdr, frame []byte, m rxMeta) {
	st := &n.d.stats
	fi := m.info
	if h.Flags&VirtioNetHdrFNeedsCsum == 0 {
		n.dropped(DropBadVnetHdr)
		return
	}
	gt := h.GSOType &^ VirtioNetHdrGSOECN
	if gt == VirtioNetHdrGSOUDPL4 && fi.L4 == L4UDP && udpGSOTooMany(h.GSOSize, fi) {
		// virtio_net_hdr_to_skb: more than UDP_MAX_SEGMENTS datagrams,
		// whether placed whole (RxUSO) or cut here.
		n.dropped(DropBadGSO)
		return
	}
	if drop := VerifyChecksums(frame, fi, false); drop != DropNone {
		n.dropped(drop)
		return
	}
	lro := n.d.cfg.LRO && fi.L4 == L4TCP && (gt == VirtioNetHdrGSOTCPv4 || gt == VirtioNetHdrGSOTCPv6)
	uso := n.d.cfg.RxUSO && fi.L4 == L4UDP && gt == VirtioNetHdrGSOUDPL4
	if (lro || uso) && h.GSOSize > 0 {
		if len(frame) > n.maxFrame {
			n.dropped(DropTooBig)
			return
		}
		m.csum, m.gsoSize = CsumPartial, h.GSOSize
		if n.place(frame, nil, m) {
			frames, bytes := &st.LROFrames, &st.LROBytes
			if uso {
				frames, bytes = &st.USOFrames, &st.USOBytes
			}
			frames.Add(1)
			bytes.Add(uint64(len(frame)))
		}
		return
	}
	// A direct read leaves no bytes in the WQE here: directOK takes only
	// super-frames that LRO or RxUSO places whole.
	n.segs.fi, n.segs.vx = fi, nil
	segs, drop := n.seg.Segment(h, frame, fi, &n.segs)
	if drop != DropNone {
		n.dropped(drop)
		return
	}
	st.GSOSegs.Add(uint64(segs))
}

// WriteSegment places one frame cut from a super-frame (SegmentSink),
// with a partial checksum, as the wire would have carried it.
func (s *segPlacer) WriteSegment(hdr, payload []byte) {
	n := s.n
	if len(hdr)+len(payload) > n.wireMax {
		n.dropped(DropTooBig)
		return
	}
	// The segment has the super-frame's header layout with its own lengths.
	s.info = *s.fi
	s.info.IPLen = len(hdr) + len(payload) - s.fi.L2Len
	n.place(hdr, payload, rxMeta{info: &s.info, csum: CsumPartial, vx: s.vx})
}

// checksum decides a single frame's checksum state: trusted from the
// virtio-net header, or verified here as a NIC verifies on receive.
func (n *nicState) checksum(h *VirtioNetHdr, frame []byte, fi *FrameInfo) (CsumState, Drop) {
	st := &n.d.stats
	switch {
	case h.Flags&VirtioNetHdrFNeedsCsum != 0:
		if int(h.CsumStart)+int(h.CsumOffset)+2 > len(frame) {
			return 0, DropBadVnetHdr
		}
		if d := VerifyChecksums(frame, fi, false); d != DropNone {
			return 0, d
		}
		st.CsumPartial.Add(1)
		return CsumPartial, DropNone
	case h.Flags&VirtioNetHdrFDataValid != 0:
		if d := VerifyChecksums(frame, fi, false); d != DropNone {
			return 0, d
		}
		st.CsumUnneeded.Add(1)
		return CsumUnnecessary, DropNone
	case fi.L3 == L3IPv4 || fi.L3 == L3IPv6:
		switch d := VerifyChecksums(frame, fi, true); d {
		case DropNone:
			st.CsumComplete.Add(1)
			return CsumComplete, DropNone
		case DropBadIPCsum, DropBadL4Csum:
			// mlx5e_handle_csum: a checksum the NIC finds bad is no
			// drop; the frame goes up as CHECKSUM_NONE (csum_none),
			// for GRO (skb_gro_checksum_validate) and the stack to
			// check again, drop and count.
			st.CsumNone.Add(1)
			return CsumNone, DropNone
		default:
			return 0, d
		}
	}
	st.CsumNone.Add(1)
	return CsumNone, DropNone
}

// parse is ParseFrame, or ParseL3Frame on a TUN's wire (Config.L3).
func (n *nicState) parse(frame []byte, fi *FrameInfo) Drop {
	if n.l3 {
		return ParseL3Frame(frame, fi)
	}
	return ParseFrame(frame, fi)
}

// filterMAC is the NIC's address filter: our unicast address, broadcast,
// and the multicast groups the stack joined.
func (n *nicState) filterMAC(frame []byte) Drop {
	var dst [6]byte
	copy(dst[:], frame[:6])
	if dst == n.d.cfg.MAC || dst == [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} {
		return DropNone
	}
	if dst[0]&1 == 0 {
		return DropOtherHost
	}
	for _, m := range n.d.cfg.Multicast {
		if dst == m {
			return DropNone
		}
	}
	return DropMulticast
}

func (n *nicState) dropped(d Drop) { n.d.stats.Dropped[d].Add(1) }

// place writes one frame (a, then b; b is nil if m.inRing > 0) into the
// RX ring, as the NIC's DMA would, and posts its CQE, which reports m. It
// reports false if the frame was dropped for want of a buffer.
func (n *nicState) place(a, b []byte, m rxMeta) bool {
	d := n.d
	if d.cfg.HWGRO != HWGROOff && m.info.L4 == L4TCP && m.gsoSize == 0 && m.outerLen == 0 {
		hdr, payload := a, b
		if b == nil {
			h := m.info.HeaderLen()
			hdr, payload = a[:h], a[h:m.info.L2Len+m.info.IPLen]
		}
		if n.placeSHAMPO(hdr, payload, m.info, m.csum) {
			return true
		}
	} else if n.sess.open {
		n.closeSession() // another kind of frame ends the session
	}
	if n.cyc != nil {
		return n.placeCyclic(a, b, m)
	}
	size := len(a) + len(b)
	// The linear RQ (mlx5e_rx_mpwqe_is_linear_skb) gives every frame one
	// stride of n.linear bytes: n.linearHR of headroom, the frame, room for
	// skb_shared_info, so that the driver builds the packet over it
	// (mlx5e_skb_from_cqe_mpwrq_linear). Strides are a power of two no
	// larger than a page, and pages start at multiples of 4 KB in the
	// WQE: a stride never spans two pages.
	hr, strideSize := 0, d.cfg.StrideSize
	if n.linear > 0 {
		hr, strideSize = n.linearHR, n.linear
	}
	if n.posted && n.off+hr+size > n.wqe.size {
		n.retire() // the rest of the WQE is skipped, as mlx5's filler CQE does
	}
	if !n.posted && !n.post() {
		n.dropped(DropNoBuffer)
		return false
	}
	strides := (hr + size + strideSize - 1) / strideSize
	cost := strides * strideSize
	if !n.waitRoom(cost) {
		n.dropped(DropOutOfBuffer)
		return false
	}
	cqe := &d.cq[n.prod&d.mask]
	cqe.ByteCount = uint32(size)
	cqe.WQE = n.wqeSeq
	cqe.Stride = uint32(n.off / strideSize)
	m.fill(cqe, a)
	cqe.NFrags = 0
	off := n.off + hr
	if k := m.inRing; k > 0 {
		// A direct read (b is nil): the frame's tail is in place.
		n.wqe.write(cqe, off, a[:len(a)-k])
		n.wqe.claim(cqe, off+len(a)-k, k)
		d.stats.DirectReads.Add(1)
		d.stats.DirectBytes.Add(uint64(k))
	} else {
		n.wqe.write(cqe, off, a)
		n.wqe.write(cqe, off+len(a), b)
	}
	n.charge(cost)
	n.prod++
	n.pending++
	n.pendBytes += size
	n.strides += uint64(strides)
	n.off += cost
	if n.oneFrame || n.off >= n.wqe.size {
		n.retire()
	}
	return true
}

// post takes the pages of a new WQE from the pool.
func (n *nicState) post() bool {
	if !n.wqe.fill(n.d.pool, n.wqeBytes) {
		return false
	}
	n.off = 0
	n.wqeSeq++
	n.posted = true
	n.d.stats.WQEs.Add(1)
	return true
}

// retire hands the current WQE's pages back to the pool: they wait in its
// quarantine ring until the last packet using them is released (mlx4's
// recycling, mlx4's page-recycling patch). The WQE's unused end is skipped (mlx5's filler
// CQE) but its pages stay held by the frames in them: it is charged to the
// last CQE written. A WQE no frame went into holds nothing.
func (n *nicState) retire() {
	if n.posted && n.off > 0 && n.off < n.wqe.size {
		n.chargeTail(n.wqe.size - n.off)
	}
	n.wqe.release(n.d.pool)
	n.posted = false
}

// charge charges cost bytes to the CQE being written (at n.prod).
func (n *nicState) charge(cost int) {
	n.ringUsed += uint64(cost)
	n.ends[n.prod&n.endMask] = n.ringUsed
}

// chargeTail charges the unused end of a retired WQE or reservation to the
// last CQE written: the bytes are free again once the poll loop has
// consumed it, and at once if it already has. The caller has written a
// CQE into the buffer, so there is one.
func (n *nicState) chargeTail(tail int) {
	n.ringUsed += uint64(tail)
	n.ends[(n.prod-1)&n.endMask] = n.ringUsed
}

// outstanding returns the ring bytes charged to CQEs the poll loop has not
// consumed yet.
func (n *nicState) outstanding() uint64 {
	c := n.d.cons.Load()
	if c == n.prod {
		return 0
	}
	// CQE c-1's entry is still there: the NIC is at most len(cq) CQEs
	// ahead of c, and ends has two entries per slot. Before the first
	// CQE is consumed (c == 0) it is the zero the ring started with.
	return n.ringUsed - n.ends[(c-1)&n.endMask]
}

// pageRound rounds b up to a whole number of pages of pageBytes.
func pageRound(b, pageBytes int) int {
	return (b + pageBytes - 1) / pageBytes * pageBytes
}

// due reports, after a wire read, whether the CQEs written since the last
// interrupt are to raise one now: Budget of them, CoalesceBytes of frames
// in them, or the moderation timer (Config.CoalesceUsecs) run out between
// the CQEs of the read before and this one's, as mlx5's CQE-mode timer,
// which each new CQE restarts, fires in a gap of the traffic. CQEs that
// came while the poll loop ran need no interrupt (NAPI polls with the CQ's
// interrupt disarmed until napi_complete_done): they are not counted.
func (n *nicState) due() bool {
	d := n.d
	c := &d.cfg
	if n.pending == 0 {
		return false
	}
	if !d.pollSleeping.Load() {
		// Running, it sees them (expose came first: if it goes to
		// sleep after this load, its re-check of d.prod finds them).
		n.pending, n.pendBytes, n.lastCQE = 0, 0, 0
		return false
	}
	if n.pending >= c.Budget || c.CoalesceBytes > 0 && n.pendBytes >= c.CoalesceBytes {
		return true
	}
	if c.CoalesceUsecs == 0 {
		return false
	}
	now, last := d.clock(), n.lastCQE
	n.lastCQE = now
	n.timerFired = last != 0 && now-last >= int64(c.CoalesceUsecs)*1000
	return n.timerFired
}

// expose makes the CQEs written so far visible to the poll loop, as a
// NIC's completion is in the driver's view once its DMA has written the
// CQE and flipped its ownership bit: mlx5e_poll_rx_cq takes every CQE it
// finds (mlx5_cqwq_get_cqe), whatever interrupt moderation does. A poll
// loop that is running sees them at its next look; one that sleeps waits
// for the interrupt (publish). The NIC model exposes after each wire read,
// when every CQE of the read is complete (a SHAMPO CQE's flush bit is set
// after its slot is counted).
func (n *nicState) expose() {
	if n.strides > 0 {
		n.d.stats.Strides.Add(n.strides)
		n.strides = 0
	}
	if n.exposed != n.prod {
		n.exposed = n.prod
		n.d.prod.Store(n.prod)
		rrtrace.Mark(rrtrace.Published)
	}
}

// publish exposes the CQEs written so far and raises the interrupt: it
// wakes the poll loop if it sleeps.
func (n *nicState) publish() {
	if n.pending == 0 {
		return
	}
	d := n.d
	n.expose()
	timer := n.timerFired
	n.pending, n.pendBytes, n.lastCQE, n.timerFired = 0, 0, 0, false
	if d.pollSleeping.Load() && (d.waiter == nil || d.split.on.Load()) {
		select {
		case d.irq <- struct{}{}:
			d.stats.NICWakeups.Add(1)
			if timer {
				d.stats.TimerIRQs.Add(1)
			}
		default:
		}
	}
}

// waitRoom waits until the ring has room for a frame of cost bytes: a free
// CQE, and the RQ not full (unless nothing is outstanding: a frame larger
// than the RQ goes in alone). The hardware stalls (flow control) rather
// than overwrite completions the driver has not read; the NIC model stalls,
// too, rather than fill more of the ring than the RQ's depth, unless
// Config.RQDrop has it drop the frame: then waitRoom reports false. It
// waits only while the poll loop has completions to consume (and so will
// signal d.space), and it reports false when Close begins.
func (n *nicState) waitRoom(cost int) bool {
	for {
		cqFull := n.cqFull()
		if !cqFull && !n.rqFull(cost) {
			return true
		}
		d := n.d
		if cqFull {
			d.stats.CQEStalls.Add(1)
		} else if d.cfg.RQDrop {
			// What the ring holds goes to the poll loop now, as a NIC's
			// completions reach the driver without waiting for the
			// wire to go quiet: else the RQ stays full while frames
			// keep coming, and every one of them is dropped.
			n.publish()
			return false
		} else {
			d.stats.RQStalls.Add(1)
		}
		if d.waiter != nil && !d.split.on.Load() {
			// Run to completion: the poll loop is this goroutine (or
			// the busy reader holding the ring), which polls a batch
			// to make room rather than wait for itself.
			n.expose()
			t := ThreadCPUTime()
			d.pollHeld(d.cfg.Budget)
			d.roomPollNanos += max(0, ThreadCPUTime()-t)
			continue
		}
		// Publish, then wait for the poll loop to consume: it signals
		// space after each batch while nicWaiting is set.
		n.publish()
		d.nicWaiting.Store(true)
		if n.cqFull() || n.rqFull(cost) {
			select {
			case <-d.space:
			case <-d.closing:
				d.nicWaiting.Store(false)
				return false
			}
		}
		d.nicWaiting.Store(false)
	}
}

func (n *nicState) cqFull() bool { return n.prod-n.d.cons.Load() == uint32(len(n.d.cq)) }

func (n *nicState) rqFull(cost int) bool {
	out := n.outstanding()
	return out > 0 && out+uint64(cost) > n.rqBytes
}

// fill writes what m reports into cqe, for a frame whose bytes start with a.
func (m *rxMeta) fill(cqe *CQE, a []byte) {
	cqe.Info = *m.info
	setRSS(cqe, a[m.outerLen:])
	cqe.Csum = m.csum
	cqe.GSOSize = m.gsoSize
	cqe.OuterLen = uint16(m.outerLen)
	cqe.TunHdrLen, cqe.TunMinLen = 0, 0
	if v := m.vx; v != nil {
		cqe.TunHdrLen = uint16(v.hdrLen())
		cqe.TunMinLen = uint16(MinHeaderLen(&v.inner))
	}
	cqe.HWGRO, cqe.Match = false, false
}
