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
		n += uint64(tcpQueued(t))
	}
	return n
}

// tcpCommitted returns the stack's committed TCP receive memory: the sum
// of the receive buffer sizes of its connections that can still receive
// (tcpCanReceive). gVisor holds at most that much of each one's segments,
// in order and out of order (segment_queue.go enqueue drops a segment
// with payload once the endpoint's segment memory passes its buffer), so
// the sum bounds the stack's TCP receive memory, but for the overshoot of
// one segment per connection and data a connection already held when its
// buffer was shrunk.
func (s *Stack) tcpCommitted() uint64 {
	var n uint64
	for _, ep := range s.ip.RegisteredEndpoints() {
		if t, ok := ep.(*tcp.Endpoint); ok && tcpCanReceive(t.EndpointState()) {
			n += uint64(max(0, t.SocketOptions().GetReceiveBufferSize()))
		}
	}
	return n
}

// tcpQueued returns t's in-order unread bytes (its Recv-Q), 0 for a
// listener. It takes t's user lock.
func tcpQueued(t *tcp.Endpoint) int {
	if v, err := t.GetSockOptInt(tcpip.ReceiveQueueSizeOption); err == nil && v > 0 {
		return v
	}
	return 0
}

// tcpCanReceive reports whether a connection in state st may still take
// data from its peer, and so use its receive buffer: from SYN-RECEIVED
// until the peer's FIN.
func tcpCanReceive(st tcp.EndpointState) bool {
	switch st {
	case tcp.StateSynRecv, tcp.StateEstablished, tcp.StateFinWait1, tcp.StateFinWait2:
		return true
	}
	return false
}
