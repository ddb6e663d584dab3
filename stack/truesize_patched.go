//go:build !stockgvisor

package stack

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// truesizeAvailable: this build's gVisor charges a packet's truesize
// (PacketBuffer.Truesize, internal/gvisor's patch 0004).
const truesizeAvailable = true

// setTruesize sets pb's truesize and received segment size.
func setTruesize(pb *gstack.PacketBuffer, truesize, gsoSize int) {
	pb.Truesize = truesize
	pb.RXGSOSize = gsoSize
}

// eachTCPRmemCounter calls fn for the counters of the receive memory by
// truesize, Linux's TcpExt names (docs/counters.md).
func eachTCPRmemCounter(st *tcpip.Stats, fn func(string, uint64)) {
	fn("tcp_prune_called", st.TCP.PruneCalled.Value())
	fn("tcp_rcv_collapsed", st.TCP.RcvCollapsed.Value())
	fn("tcp_ofo_pruned", st.TCP.OFOPruned.Value())
	fn("tcp_rcv_pruned", st.TCP.RcvPruned.Value())
	fn("tcp_rcv_q_drop", st.TCP.RcvQDrop.Value())
}
