//go:build stockgvisor

package stack

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// truesizeAvailable: stock gVisor charges a packet's bytes.
const truesizeAvailable = false

// setTruesize does nothing: stock gVisor has no PacketBuffer.Truesize.
func setTruesize(*gstack.PacketBuffer, int, int) {}

// eachTCPRmemCounter reports the receive memory's counters as 0: stock
// gVisor neither prunes nor collapses.
func eachTCPRmemCounter(_ *tcpip.Stats, fn func(string, uint64)) {
	for _, n := range []string{"tcp_prune_called", "tcp_rcv_collapsed", "tcp_ofo_pruned", "tcp_rcv_pruned", "tcp_rcv_q_drop"} {
		fn(n, 0)
	}
}
