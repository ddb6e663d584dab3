package stack

import (
	"net"
	"net/netip"
	"sync/atomic"
)

// ListenUDPBuffer is ListenUDP with a receive buffer of size bytes, as
// SO_RCVBUF sets it (gVisor caps it at its maximum; 0: gVisor's default).
func (s *Stack) ListenUDPBuffer(addr netip.AddrPort, size int) (net.PacketConn, error) {
	return s.listenUDPBuffer(addr, int64(size))
}

// packetConn wraps gVisor's gonet UDP socket so that its reads and writes
// on the closed socket report net.ErrClosed, as the standard library's do
// (gonet reports gVisor's "endpoint is in invalid state").
type packetConn struct {
	net.PacketConn
	closed atomic.Bool
}

func (c *packetConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := c.PacketConn.ReadFrom(b)
	if err != nil && c.closed.Load() {
		return n, a, &net.OpError{Op: "read", Net: "udp", Addr: c.LocalAddr(), Err: net.ErrClosed}
	}
	return n, a, err
}

func (c *packetConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	n, err := c.PacketConn.WriteTo(b, addr)
	if err != nil && c.closed.Load() {
		return n, &net.OpError{Op: "write", Net: "udp", Addr: c.LocalAddr(), Err: net.ErrClosed}
	}
	return n, err
}

func (c *packetConn) Close() error {
	c.closed.Store(true)
	return c.PacketConn.Close()
}
