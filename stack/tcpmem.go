package stack

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// tcpRcvQueued returns the bytes waiting in the receive queues of the
// stack's TCP connections, in order and not yet read: the sum of what
// Linux shows as Recv-Q (tcp_inq). It walks every endpoint, taking each
// one's user lock in turn: it is for counters, not for a hot path.
//
// Out-of-order segments are not in it: gVisor keeps their size private
// (receiver.PendingBufUsed, Endpoint.rcvMemUsed). It bounds them per
// connection, at three quarters of its receive buffer (rcv.go
// handleRcvdSegment).
func (s *Stack) tcpRcvQueued() uint64 {
	var n uint64
	for _, ep := range s.ip.RegisteredEndpoints() {
		t, ok := ep.(*tcp.Endpoint)
		if !ok {
			continue
		}
		if v, err := t.GetSockOptInt(tcpip.ReceiveQueueSizeOption); err == nil && v > 0 {
			n += uint64(v)
		}
	}
	return n
}
