// Copyright 2026 The ustack Authors.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

package tcp

import (
	"container/heap"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// The receive memory by truesize (a ustack patch). A link endpoint that
// sets stack.PacketBuffer.Truesize on the packets it delivers makes a
// connection's receive side account as Linux 6.18's does: each segment is
// charged its truesize (segment.segMemSize), the advertised window is the
// buffer space times a scaling ratio measured from the segments received
// (tcp_measure_rcv_mss, tcp_win_from_space), auto-tuning sizes the buffer
// from that ratio (tcp_rcvbuf_grow), and in-order data that arrives with
// the receive memory past the buffer first grows the buffer up to its
// maximum (tcp_clamp_window), then makes the queue compact (tcp_collapse),
// then drops out-of-order data (tcp_prune_ofo_queue), and is dropped last
// (tcp_prune_queue, tcp_data_queue). Packets without a truesize leave all
// of it as gVisor has it.

const (
	// tcpRmemToWinScale is Linux's TCP_RMEM_TO_WIN_SCALE: the scaling
	// ratio is in 1/256ths.
	tcpRmemToWinScale = 8

	// tcpDefaultScalingRatio is TCP_DEFAULT_SCALING_RATIO, 50%.
	tcpDefaultScalingRatio = 1 << (tcpRmemToWinScale - 1)

	// tcpMSSDefault is TCP_MSS_DEFAULT, where tcp_initialize_rcv_mss
	// starts icsk_ack.rcv_mss.
	tcpMSSDefault = 536

	// collapseMax is the payload of one segment tcp_collapse makes:
	// SKB_MAX_ORDER(0, 0), a 4 KiB page less the skb_shared_info
	// (SKB_DATA_ALIGN(320) on x86-64).
	collapseMax = 4096 - skbSharedInfoSize

	// skbStructSize and skbSharedInfoSize are SKB_DATA_ALIGN(sizeof(struct
	// sk_buff)) and SKB_DATA_ALIGN(sizeof(struct skb_shared_info)) on
	// x86-64, the overhead SKB_TRUESIZE adds to a buffer.
	skbStructSize     = 256
	skbSharedInfoSize = 320
)

// spaceFromWin is Linux's tcp_space_from_win: the buffer space whose
// window, at the current scaling ratio, is win.
func (e *Endpoint) spaceFromWin(win int64) int64 {
	return (win << tcpRmemToWinScale) / int64(e.ScalingRatio())
}

// ScalingRatio returns the endpoint's window scaling ratio, the window per
// byte of buffer space in 1/256ths (Linux's tp->scaling_ratio): 128 until
// a segment with a truesize is measured.
func (e *Endpoint) ScalingRatio() int {
	if r := e.scalingRatio.Load(); r != 0 {
		return int(r)
	}
	return tcpDefaultScalingRatio
}

// ReceiveMemory returns the memory charged for the segments the endpoint
// holds in order and out of order (Linux's sk_rmem_alloc; with truesizes,
// the sum of theirs), and its receive buffer's size (sk_rcvbuf).
func (e *Endpoint) ReceiveMemory() (rmem, rcvbuf int) {
	e.LockUser()
	defer e.UnlockUser()
	e.rcvQueueMu.Lock()
	defer e.rcvQueueMu.Unlock()
	return e.rmemAllocLocked(), int(e.ops.GetReceiveBufferSize())
}

// rmemAllocLocked is sk_rmem_alloc: the memory of the in-order queue and
// of the out-of-order segments (the segment queue is Linux's backlog,
// which sk_rmem_alloc does not count).
//
// +checklocks:e.mu
// +checklocks:e.rcvQueueMu
func (e *Endpoint) rmemAllocLocked() int {
	n := e.rcvQueueMem
	if e.rcv != nil {
		n += e.rcv.PendingBufUsed
	}
	return n
}

// measureRcvMSS is Linux's tcp_measure_rcv_mss for a data segment s that
// carries a truesize, received in order: a segment at least as large as
// rcv_mss that differs from it sets the scaling ratio to its length over
// its truesize. The length is the segment size of an aggregate
// (skb_shinfo(skb)->gso_size), the ratio's numerator the whole payload
// (skb->len). (Linux then also moves window_clamp, which gVisor does not
// keep, and caps rcvq_space.space by it.)
//
// +checklocks:e.mu
func (e *Endpoint) measureRcvMSS(s *segment) {
	e.rcvTruesize = true
	n := s.pkt.RXGSOSize
	if n == 0 {
		n = s.payloadSize()
	}
	mss := e.rcvMSS
	if mss == 0 {
		mss = min(tcpMSSDefault, max(int(e.amss), 1))
	}
	if n < mss {
		return
	}
	if n != mss && s.dataMemSize > 0 {
		r := (int64(s.payloadSize()) << tcpRmemToWinScale) / int64(s.dataMemSize)
		r = min(max(r, 1), 255) // a u8
		if old := e.scalingRatio.Swap(uint32(r)); old != uint32(r) {
			e.rcvQueueMu.Lock()
			if c := e.winFromSpace(int(e.ops.GetReceiveBufferSize())); e.RcvAutoParams.PrevCopiedBytes > c {
				e.RcvAutoParams.PrevCopiedBytes = c
			}
			e.rcvQueueMu.Unlock()
		}
	}
	e.rcvMSS = min(n, max(int(e.amss), 1))
}

// rcvbufGrowLocked is ModerateRecvBuf as Linux 6.18's tcp_rcv_space_adjust
// and tcp_rcvbuf_grow, once per RTT: copied, the bytes the application
// read in the last RTT less those still queued, past the last measure
// (rcvq_space.space, gVisor's PrevCopiedBytes) makes the buffer room for
// twice it and the growth since (rcvwin = 2*copied, plus twice
// rcvwin*(copied-last)/last for slow start, plus the out-of-order span),
// as buffer space at the scaling ratio (tcp_space_from_win), at most the
// stack's maximum (tcp_rmem[2]). It never shrinks the buffer. It returns
// whether the window grew past the threshold that calls for an update.
//
// +checklocks:e.mu
// +checklocks:e.rcvQueueMu
func (e *Endpoint) rcvbufGrowLocked(copied int) bool {
	copied -= e.RcvBufUsed // inq
	old := e.RcvAutoParams.PrevCopiedBytes
	if copied <= old {
		return false
	}
	e.RcvAutoParams.PrevCopiedBytes = copied
	rcvwin := int64(copied) << 1
	if old > 0 {
		rcvwin += (rcvwin * int64(copied-old) / int64(old)) << 1
	}
	if e.rcv != nil {
		var end seqnum.Value
		for _, s := range e.rcv.pendingRcvdSegments {
			if t := s.sequenceNumber.Add(seqnum.Size(s.payloadSize())); end == 0 || end.LessThan(t) {
				end = t
			}
		}
		if end != 0 && e.rcv.RcvNxt.LessThan(end) {
			rcvwin += int64(e.rcv.RcvNxt.Size(end))
		}
	}
	rcvbuf := int64(e.maxReceiveBufferSize())
	if space := e.spaceFromWin(rcvwin); space < rcvbuf {
		rcvbuf = space
	}
	cur := int(e.ops.GetReceiveBufferSize())
	if int(rcvbuf) <= cur {
		return false
	}
	availBefore := e.winFromSpace(e.receiveBufferAvailableLocked(cur))
	e.ops.SetReceiveBufferSize(rcvbuf, false /* notify */)
	availAfter := e.winFromSpace(e.receiveBufferAvailableLocked(int(rcvbuf)))
	crossed, above := e.windowCrossedACKThresholdLocked(availAfter-availBefore, cur)
	return crossed && above
}

// rmemSchedule is Linux's tcp_try_rmem_schedule and the drop after it in
// tcp_data_queue, for in-order data s with a truesize: if the receive
// memory is past the buffer (tcp_can_ingest: sk_rmem_alloc <= sk_rcvbuf,
// s not counted), prune; if that does not help and the in-order queue
// holds data, s is dropped (TCPRcvQDrop) and an ACK sent at once
// (ICSK_ACK_NOMEM | ICSK_ACK_NOW); with the queue empty it is taken
// anyway (sk_forced_mem_schedule). It returns false to drop s.
//
// +checklocks:e.mu
func (e *Endpoint) rmemSchedule() bool {
	e.rcvQueueMu.Lock()
	ok := e.canIngestLocked() || e.pruneQueueLocked()
	empty := e.rcvQueue.Front() == nil
	e.rcvQueueMu.Unlock()
	if ok || empty {
		return true
	}
	e.stack.Stats().TCP.RcvQDrop.Increment()
	e.snd.sendAck()
	return false
}

// canIngestLocked is tcp_can_ingest as Linux 6.18 has it: the receive
// memory, before the arriving segment, is within the buffer.
//
// +checklocks:e.mu
// +checklocks:e.rcvQueueMu
func (e *Endpoint) canIngestLocked() bool {
	return e.rmemAllocLocked() <= int(e.ops.GetReceiveBufferSize())
}

// pruneQueueLocked is tcp_prune_queue: it reports whether the receive
// memory is within the buffer after, in turn, growing the buffer to the
// memory where auto-tuning may (tcp_clamp_window: below the maximum and
// not set by the application), making the in-order queue compact
// (tcp_collapse) and dropping out-of-order segments from the highest
// (tcp_prune_ofo_queue). Counted: PruneCalled, RcvCollapsed, OFOPruned,
// RcvPruned. (tcp_collapse_ofo_queue and the memory-pressure clamp of
// rcv_ssthresh are not modelled.)
//
// +checklocks:e.mu
// +checklocks:e.rcvQueueMu
func (e *Endpoint) pruneQueueLocked() bool {
	if e.rmemAllocLocked() == 0 {
		return false
	}
	st := e.stack.Stats().TCP
	st.PruneCalled.Increment()
	if max := e.maxReceiveBufferSize(); !e.RcvAutoParams.Disabled && int(e.ops.GetReceiveBufferSize()) < max {
		e.ops.SetReceiveBufferSize(int64(min(e.rmemAllocLocked(), max)), false /* notify */)
	}
	if e.canIngestLocked() {
		return true
	}
	e.collapseLocked()
	if e.canIngestLocked() {
		return true
	}
	e.pruneOFOLocked()
	if e.canIngestLocked() {
		return true
	}
	st.RcvPruned.Increment()
	return false
}

// collapsedTruesize is the truesize of a segment tcp_collapse makes for n
// bytes: alloc_skb(n)'s SKB_TRUESIZE of its kmalloc'd head, a power of two
// holding n and the skb_shared_info.
func collapsedTruesize(n int) int {
	head := 512
	for head < (n+63)&^63+skbSharedInfoSize {
		head <<= 1
	}
	return skbStructSize + head
}

// collapseLocked is tcp_collapse over the in-order queue: from the first
// segment whose window at the scaling ratio is more than its payload (a
// "bloated" one, tcp_win_from_space(skb->truesize) > skb->len) to the
// end, the unread payload is copied into new segments of collapseMax
// bytes, each charged collapsedTruesize, and the old ones are freed, each
// counted in RcvCollapsed. The payload and its order do not change.
//
// +checklocks:e.mu
// +checklocks:e.rcvQueueMu
func (e *Endpoint) collapseLocked() {
	first := e.rcvQueue.Front()
	for ; first != nil; first = first.Next() {
		if e.winFromSpace(first.segMemSize()) > first.payloadSize() {
			break
		}
	}
	if first == nil {
		return
	}
	var data buffer.Buffer
	var old []*segment
	for s := first; s != nil; s = s.Next() {
		old = append(old, s)
		data.Append(s.pkt.Data().AsRange().ToView())
	}
	seq := first.sequenceNumber
	id, ep := first.id, first.ep
	for _, s := range old {
		e.rcvQueue.Remove(s)
		e.rcvQueueMem -= s.segMemSize()
		s.DecRef()
	}
	e.stack.Stats().TCP.RcvCollapsed.IncrementBy(uint64(len(old)))
	for data.Size() > 0 {
		n := min(int(data.Size()), collapseMax)
		var part buffer.Buffer
		v := buffer.NewView(n)
		data.ReadToWriter(v, int64(n))
		data.TrimFront(int64(n))
		part.Append(v)
		s := newSegment()
		s.id = id
		s.sequenceNumber = seq
		s.flags = header.TCPFlagAck
		s.pkt = stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: part})
		s.dataMemSize = collapsedTruesize(n)
		s.truesize = true
		s.setOwner(ep, recvQ)
		seq = seq.Add(seqnum.Size(n))
		e.rcvQueue.PushBack(s)
		e.rcvQueueMem += s.segMemSize()
	}
	data.Release()
}

// pruneOFOLocked is tcp_prune_ofo_queue: it drops out-of-order segments,
// the highest first, until the receive memory is within the buffer, and
// forgets the SACK blocks (tcp_sack_reset). Counted in OFOPruned.
//
// +checklocks:e.mu
// +checklocks:e.rcvQueueMu
func (e *Endpoint) pruneOFOLocked() {
	if e.rcv == nil || len(e.rcv.pendingRcvdSegments) == 0 {
		return
	}
	e.stack.Stats().TCP.OFOPruned.Increment()
	h := &e.rcv.pendingRcvdSegments
	for len(*h) > 0 && !e.canIngestLocked() {
		last := 0
		for i, s := range *h {
			if (*h)[last].sequenceNumber.LessThan(s.sequenceNumber) {
				last = i
			}
		}
		s := heap.Remove(h, last).(*segment)
		e.rcv.PendingBufUsed -= s.segMemSize()
		s.DecRef()
	}
	e.sack.NumBlocks = 0
}
