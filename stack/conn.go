package stack

import (
	"net"
	"sync/atomic"
)

// listener wraps gVisor's gonet listener so that Accept on a closed
// listener reports net.ErrClosed, as the standard library's do (gonet
// reports gVisor's "endpoint is in invalid state").
type listener struct {
	net.Listener
	closed atomic.Bool
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && l.closed.Load() {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: net.ErrClosed}
	}
	return c, err
}

func (l *listener) Close() error {
	l.closed.Store(true)
	return l.Listener.Close()
}

// packetConn does the same for a UDP socket's reads and writes.
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
