package driver

import (
	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/hdr"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// The cyclic RQ as mlx4 fills it (mlx4's page-recycling patch): every descriptor takes one
// frame, placed by bufpool.RXFrags: before the patch (the pool's
// NoRecycle) one order-0 page per RX slot, the frame at its start; with
// it, frames packed into pages at mlx4's frag stride from a pool array
// with a quarantine half. A frame that does not fit one order-0 page (LRO,
// or an MTU past the page) takes the WQE path of the other RQs instead.

// mlx4FrameSize is the largest frame of a cyclic RQ descriptor at mtu:
// mlx4's MLX4_EN_EFF_MTU, the MTU, an Ethernet header and two VLAN tags.
func mlx4FrameSize(mtu int) int { return mtu + header.EthernetMinimumSize + 2*hdr.VLANTagLen }

// initCyclic sets up the cyclic RQ's frame placement if every frame fits
// one order-0 page (a whole super-frame does not): slots is the RQ's depth
// in descriptors, slotCost the bytes each frame is charged (the RQ's bytes
// over its descriptors).
func (n *nicState) initCyclic(slots int, slotCost uint64) {
	c := &n.d.cfg
	frame := mlx4FrameSize(c.MTU)
	if c.RQ != RQCyclic || n.maxFrame > frame || frame > n.d.pool.PageSize() {
		// Whole super-frames (LRO, RxUSO) or a frame past a page.
		return
	}
	r, err := bufpool.NewRXFrags(n.d.pool, slots, frame)
	if err != nil {
		return // the WQE path places it
	}
	n.cyc, n.slotCost = r, slotCost
}

// placeCyclic writes one frame (a, then b) into the next RX descriptor's
// frag and posts its CQE, which reports m: place for the cyclic RQ. It
// reports false if the frame was dropped for want of a buffer.
func (n *nicState) placeCyclic(a, b []byte, m rxMeta) bool {
	d := n.d
	size := len(a) + len(b)
	if !n.waitRoom(int(n.slotCost)) {
		n.dropped(DropOutOfBuffer)
		return false
	}
	f, err := n.cyc.Next()
	if err != nil {
		n.dropped(DropNoBuffer)
		return false
	}
	buf := f.Bytes()
	copy(buf[copy(buf, a):], b)
	f.Len = uint32(size)
	n.wqeSeq++
	cqe := &d.cq[n.prod&d.mask]
	cqe.ByteCount = uint32(size)
	cqe.WQE = n.wqeSeq
	cqe.Stride = 0
	m.fill(cqe, a)
	cqe.Frags[0] = f // Next's reference becomes the CQE's
	cqe.NFrags = 1
	n.charge(int(n.slotCost))
	n.prod++
	n.pending++
	n.pendBytes += size
	d.stats.WQEs.Add(1)
	return true
}

// closeCyclic drops the cyclic RQ's hold on its pages once the NIC model
// has stopped: pages still in packets go when those are released.
func (n *nicState) closeCyclic() {
	if n.cyc != nil {
		n.cyc.Close()
	}
}
