package stack

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver/xsk"
)

// xskPort is the receive queue's XSKMAP entry: the AF_XDP socket that
// frames the XDP program answers with cpumap.RedirectXSK are copied into.
type xskPort struct {
	sock atomic.Pointer[xsk.Socket]
	// mu is held by the poll loop from loading sock to the end of the
	// socket's receive, and taken by BindXSK after it stored the new
	// socket, so that BindXSK returns only once the poll loop is out of
	// the old socket: as xsk_unbind_dev waits for the NAPI poll
	// (synchronize_net) before the socket may go. Uncontended but for
	// BindXSK: one lock per redirected frame.
	mu sync.Mutex
	// inReceive, if set (by tests, before any frame), is called inside
	// the socket's receive, with mu held.
	inReceive func()
	// redirects counts frames handed to the socket: rx_xdp_redirect_xsk.
	// The socket counts what became of them (rx_xsk_packets, the drops).
	redirects atomic.Uint64
}

// BindXSK binds sock to the stack's receive queue, as an AF_XDP socket
// bound to queue 0 and inserted in the XDP program's XSKMAP: from then on,
// every frame the program (Config.XDP, such as cpumap.ParseProgram's
// "xsk:PORT") answers with cpumap.RedirectXSK is copied, in the poll loop,
// into a UMEM frame from sock's fill ring and posted on its RX ring
// (copy mode, xsk.Socket.ReceiveVec). The poll loop never waits for the
// application: with the fill ring empty or the RX ring full the frame is
// dropped and counted by the socket (rx_xsk_dropped,
// rx_xsk_fill_ring_empty_descs, rx_xsk_ring_full). Frames are copied as
// they came off the wire: one that the sender left to checksum offload
// (rx_csum_partial) carries a partial L4 checksum, as with native XDP on
// a TAP or veth, and a super-frame longer than the socket's
// UMEM.DataRoom (LRO, hardware GRO) is dropped.
//
// BindXSK(nil) unbinds; with no socket bound, RedirectXSK frames pass to
// gVisor (bpf_redirect_map's XDP_PASS fallback). A new socket replaces the
// old one at once. The stack does not own sock: the application keeps
// driving its rings, and once Close or a later BindXSK (nil or another
// socket) has returned, the poll loop no longer touches it: BindXSK waits
// for a receive into the old socket in progress to end. The socket's
// counters appear among EachCounter's, renamed rx_xsk_* and tx_xsk_* as
// mlx5 names its XSK queues' counters.
func (s *Stack) BindXSK(sock *xsk.Socket) error {
	if s.drv == nil {
		return errors.New("stack: BindXSK: no driver (NewWithEndpoint)")
	}
	s.ep.xsk.sock.Store(sock)
	// Wait for the poll loop to leave a receive into the old socket.
	s.ep.xsk.mu.Lock()
	s.ep.xsk.mu.Unlock()
	return nil
}

// toXSK copies a frame the XDP program redirected into the bound socket,
// or reports false when none is bound. It releases f when it takes it.
// Called by the poll loop only.
func (e *linkEndpoint) toXSK(scratch *[][]byte, f bufpool.Frame) bool {
	if e.xsk.sock.Load() == nil {
		return false // none bound: no lock
	}
	e.xsk.mu.Lock()
	defer e.xsk.mu.Unlock()
	sock := e.xsk.sock.Load() // again, under mu: BindXSK may have run
	if sock == nil {
		return false
	}
	e.xsk.redirects.Add(1)
	parts := frameParts(scratch, f)
	if e.xsk.inReceive != nil {
		e.xsk.inReceive()
	}
	sock.ReceiveVec(parts) // drops are the socket's to count
	putParts(scratch, parts)
	f.Release()
	return true
}

// eachXSK yields the bound socket's counters, rx_* and tx_* renamed
// rx_xsk_* and tx_xsk_*, after rx_xdp_redirect_xsk.
func (e *linkEndpoint) eachXSK(fn func(string, uint64)) {
	fn("rx_xdp_redirect_xsk", e.xsk.redirects.Load())
	sock := e.xsk.sock.Load()
	if sock == nil {
		return
	}
	sock.Stats().Each(func(name string, v uint64) {
		if len(name) > 3 && (name[:3] == "rx_" || name[:3] == "tx_") {
			name = name[:3] + "xsk_" + name[3:]
		}
		fn(name, v)
	})
}
