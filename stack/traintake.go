package stack

import (
	"errors"
	"net/netip"
	"time"

	"github.com/ustack/ustack/bufpool"
)

// A Train is a train of datagrams handed to the application without a
// copy (TrainConn.TakeTrain): its payload stays in the RX pages the NIC
// model placed it in, and the Train holds them until Release. ReadTrain
// copies the same payload out; a kernel's UDP_GRO socket copies it too
// (udp_recvmsg's skb_copy_datagram_msg), which a userspace stack that reads
// its frames from a TAP pays on top of the TAP read's own copy: taking the
// train leaves ustack with that one copy, the kernel's.
//
// A Train is the caller's: TakeTrain fills one that is empty (zero, or
// released), so one Train can serve every read without allocating.
type Train struct {
	c      *TrainConn
	p      *bufpool.Packet
	wk     bufpool.Walker // where the payload starts in p's walk
	ws     []byte         // the rest of the walk's current slice, read first
	n, seg int
	from   netip.AddrPort
	charge int64 // what it counts against the receive buffer until Release
}

// Len returns the payload's length: the datagrams back to back.
func (t *Train) Len() int { return t.n }

// SegSize returns the size of each datagram in the payload (the last may
// be shorter), as ReadTrain's segSize.
func (t *Train) SegSize() int { return t.seg }

// From returns the sender.
func (t *Train) From() netip.AddrPort { return t.from }

// Slices appends the payload to dst as slices of the RX pages, in order,
// and returns the extended slice. The slices are valid until Release and
// must not be written to (the page holds other frames too).
func (t *Train) Slices(dst [][]byte) [][]byte {
	left := t.n
	if len(t.ws) > 0 && left > 0 {
		s := t.ws[:min(len(t.ws), left)]
		dst, left = append(dst, s), left-len(s)
	}
	for w := t.wk; left > 0 && w.Next(); {
		s := w.Bytes()
		s = s[:min(len(s), left)]
		dst, left = append(dst, s), left-len(s)
	}
	return dst
}

// Release gives the train's pages back and takes its charge off the
// socket's receive buffer. The slices Slices returned must not be used
// after it; the Train may be filled again. Releasing an empty Train does
// nothing.
func (t *Train) Release() {
	if t.p == nil {
		return
	}
	t.c.rmem.Add(-t.charge)
	t.p.Release()
	*t = Train{}
}

// errTrainHeld is TakeTrain's error for a Train not released.
var errTrainHeld = errors.New("take train: the Train holds a train: Release it first")

// TakeTrain waits for the next train, as ReadTrain does, and hands it over
// in t without copying its payload (or, after a ReadBatch that read a
// train in part, the rest of that train). A taken train still counts
// against the receive buffer (SetReadBuffer) until its Release, as if it
// were queued: an application that holds trains makes the socket drop new
// ones, so what a peer's datagrams pin stays bounded by the buffer
// whatever the reader does with them. After Close it returns
// net.ErrClosed; past a deadline, os.ErrDeadlineExceeded.
func (c *TrainConn) TakeTrain(t *Train, deadline time.Time) error {
	if t.p != nil {
		return errTrainHeld
	}
	if err := c.lockRead(deadline); err != nil {
		return err
	}
	defer c.unlockRead()
	c.busyWait(deadline)
	if err := c.next(deadline, true); err != nil {
		return err
	}
	b := &c.b
	left := b.total - b.off
	*t = Train{c: c, p: b.cur, wk: b.wk, ws: b.ws, n: left, from: b.from,
		seg: min(b.segLen, max(left, 1)), charge: c.s.ep.trains.charge(b.cur)}
	if left == 0 {
		t.seg = 0
	}
	c.rmem.Add(t.charge)
	b.cur, b.wk, b.ws = nil, bufpool.Walker{}, nil
	return nil
}
