package stack

import (
	"net"
	"net/netip"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// UDPConn is a UDP socket of the stack, as Go's *net.UDPConn: bound
// (ListenUDP, ListenPacket), a net.PacketConn whose ReadFrom and WriteTo
// take and give *net.UDPAddr; or connected (Dial "udp"), a net.Conn whose
// Read and Write exchange datagrams with its one peer. A datagram longer
// than the buffer a read is given is cut to it, the rest dropped, as
// recvfrom does without MSG_TRUNC.
//
// Its errors are Go's net errors (errors.go): a *net.OpError around the
// errno Linux returns (ECONNREFUSED on a connected socket once the peer's
// port was unreachable, ENETUNREACH, EMSGSIZE, ...), net.ErrClosed for any
// call on the closed socket, os.ErrDeadlineExceeded at a deadline. As Go's,
// all its methods are safe for concurrent use; reads are serialized with
// each other, and writes.
type UDPConn struct {
	dgramSock
	laddr *net.UDPAddr
	raddr *net.UDPAddr // nil: not connected
}

// newUDPConn wraps ep, bound or connected, as a socket of network on
// proto.
func newUDPConn(s *Stack, network string, wq *waiter.Queue, ep tcpip.Endpoint, proto tcpip.NetworkProtocolNumber) *UDPConn {
	c := &UDPConn{}
	c.init(s, network, wq, ep, proto)
	if a, e := ep.GetLocalAddress(); e == nil {
		c.laddr = udpAddr(a, proto)
	}
	if a, e := ep.GetRemoteAddress(); e == nil {
		c.raddr = udpAddr(a, proto)
	}
	return c
}

// ListenUDPBuffer is ListenUDP with a receive buffer of size bytes, as
// SO_RCVBUF sets it (gVisor caps it at its maximum; 0: gVisor's default).
func (s *Stack) ListenUDPBuffer(addr netip.AddrPort, size int) (net.PacketConn, error) {
	return s.listenUDPBuffer(addr, int64(size))
}

// dialUDPConn returns a UDP socket of network connected to ap, from an
// address and port of the stack's choosing, as net.DialUDP: an invalid
// ap fails with net's "missing address", an unspecified one is the
// loopback address (as the kernel connects it). Its errors are
// *net.OpError with Op "dial".
func (s *Stack) dialUDPConn(network string, ap netip.AddrPort) (*UDPConn, error) {
	if !ap.IsValid() {
		return nil, opError("dial", network, nil, nil, errMissingAddress)
	}
	ra := net.UDPAddrFromAddrPort(ap)
	fa, proto := s.fullAddr(ap)
	wq := new(waiter.Queue)
	ep, e := s.ip.NewEndpoint(udp.ProtocolNumber, proto, wq)
	if e != nil {
		return nil, opError("dial", network, nil, ra, syscallErr("socket", e))
	}
	if e := ep.Connect(fa); e != nil {
		ep.Close()
		return nil, opError("dial", network, nil, ra, syscallErr("connect", e))
	}
	return newUDPConn(s, network, wq, ep, proto), nil
}

// ReadFrom reads a datagram into b and returns its length (at most
// len(b)) and its sender, a *net.UDPAddr.
func (c *UDPConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, fa, err := c.readFrom(b, "recvfrom")
	if err != nil {
		return n, nil, err
	}
	return n, udpAddr(fa, c.proto), nil
}

// ReadFromUDPAddrPort is ReadFrom returning the sender as a
// netip.AddrPort, without allocating: on an IPv6 socket, an IPv4 sender is
// IPv4-mapped, as Go's net reports it.
func (c *UDPConn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	n, fa, err := c.readFrom(b, "recvfrom")
	if err != nil {
		return n, netip.AddrPort{}, err
	}
	ap := addrPort(fa)
	if c.proto == ipv6.ProtocolNumber && ap.Addr().Is4() {
		ap = netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port())
	}
	return n, ap, nil
}

// Read reads a datagram into b, as ReadFrom without the sender: on a
// connected socket, one of its peer's.
func (c *UDPConn) Read(b []byte) (int, error) {
	n, _, err := c.readFrom(b, "read")
	return n, err
}

// readFrom reads one datagram into b; call names the system call for its
// errors.
func (c *UDPConn) readFrom(b []byte, call string) (int, tcpip.FullAddress, error) {
	n, fa, err := c.recv(b, call)
	if err != nil {
		return 0, fa, c.opError("read", nil, err)
	}
	return n, fa, nil
}

// WriteTo sends b as one datagram to addr, which must be a *net.UDPAddr
// (another type fails with EINVAL, a nil one with net's "missing
// address"), on a socket that is not connected (ErrWriteToConnected).
func (c *UDPConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	a, ok := addr.(*net.UDPAddr)
	if !ok {
		return 0, opError("write", c.net, udpOpAddr(c.laddr), addr, syscall.EINVAL)
	}
	if c.raddr != nil {
		return 0, opError("write", c.net, udpOpAddr(c.laddr), udpOpAddr(a), net.ErrWriteToConnected)
	}
	if a == nil {
		return 0, opError("write", c.net, udpOpAddr(c.laddr), nil, errMissingAddress)
	}
	ap, ok := udpAddrPort(a)
	if !ok {
		return 0, opError("write", c.net, udpOpAddr(c.laddr), a, errBadAddr("invalid address", a.String()))
	}
	return c.write(b, ap, true, "sendto", a)
}

// WriteToUDPAddrPort is WriteTo with a netip.AddrPort, without
// allocating.
func (c *UDPConn) WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	if c.raddr != nil {
		return 0, opError("write", c.net, udpOpAddr(c.laddr), net.UDPAddrFromAddrPort(addr), net.ErrWriteToConnected)
	}
	if !addr.IsValid() {
		return 0, opError("write", c.net, udpOpAddr(c.laddr), nil, errMissingAddress)
	}
	return c.write(b, addr, true, "sendto", nil)
}

// Write sends b as one datagram to the connected socket's peer; on a
// socket that is not connected it fails with EDESTADDRREQ.
func (c *UDPConn) Write(b []byte) (int, error) {
	return c.write(b, netip.AddrPort{}, false, "write", nil)
}

// write sends b to ap (if to) or to the connected peer; call and dst
// (nil: ap, or the peer) are for its errors.
func (c *UDPConn) write(b []byte, ap netip.AddrPort, to bool, call string, dst net.Addr) (int, error) {
	n, err := c.send(b, ap, to, call)
	if err != nil {
		return 0, c.writeError(dst, to, ap, err)
	}
	return n, nil
}

// writeError is write's error: dst nil is ap if to, else the connected
// peer (the address made only for an error, so that a write allocates
// none).
func (c *UDPConn) writeError(dst net.Addr, to bool, ap netip.AddrPort, err error) error {
	if dst == nil && to {
		dst = net.UDPAddrFromAddrPort(ap)
	}
	return c.opError("write", dst, err)
}

// Close closes the socket. Calls blocked on it return net.ErrClosed, as
// does every later call, Close included.
func (c *UDPConn) Close() error {
	if !c.closeSock() {
		return c.opError("close", udpOpAddr(c.raddr), net.ErrClosed)
	}
	return nil
}

// LocalAddr returns the socket's address, a *net.UDPAddr.
func (c *UDPConn) LocalAddr() net.Addr { return udpOpAddr(c.laddr) }

// RemoteAddr returns the connected socket's peer, a *net.UDPAddr, or nil.
func (c *UDPConn) RemoteAddr() net.Addr { return udpOpAddr(c.raddr) }

// SetDeadline sets the read and the write deadline.
func (c *UDPConn) SetDeadline(t time.Time) error {
	return c.setError(c.setDeadlines(t, readDeadline|writeDeadline))
}

// SetReadDeadline sets the deadline of the reads (zero: none): past it,
// and for reads blocked when it passes, they fail with an error wrapping
// os.ErrDeadlineExceeded, whose Timeout is true.
func (c *UDPConn) SetReadDeadline(t time.Time) error {
	return c.setError(c.setDeadlines(t, readDeadline))
}

// SetWriteDeadline sets the deadline of the writes, as SetReadDeadline.
func (c *UDPConn) SetWriteDeadline(t time.Time) error {
	return c.setError(c.setDeadlines(t, writeDeadline))
}

// SetReadBuffer sets the receive buffer (SO_RCVBUF; gVisor bounds it). A
// negative size fails with EINVAL.
func (c *UDPConn) SetReadBuffer(bytes int) error {
	if c.closed.Load() {
		return c.setError(net.ErrClosed)
	}
	if bytes < 0 {
		return c.setError(errnoErr("setsockopt", syscall.EINVAL))
	}
	c.ep.SocketOptions().SetReceiveBufferSize(int64(bytes), true)
	return nil
}

// SetWriteBuffer sets the send buffer (SO_SNDBUF), as SetReadBuffer.
func (c *UDPConn) SetWriteBuffer(bytes int) error {
	if c.closed.Load() {
		return c.setError(net.ErrClosed)
	}
	if bytes < 0 {
		return c.setError(errnoErr("setsockopt", syscall.EINVAL))
	}
	c.ep.SocketOptions().SetSendBufferSize(int64(bytes), true)
	return nil
}

// opError is an error of c's op with the peer dst, as net's UDPConn
// reports it: the local address as Source; dst nil is the connected
// peer, if any.
func (c *UDPConn) opError(op string, dst net.Addr, err error) error {
	if dst == nil {
		dst = udpOpAddr(c.raddr)
	}
	return opError(op, c.net, udpOpAddr(c.laddr), dst, err)
}

// setError is a failed deadline's or buffer size's: no Source, the local
// address as Addr.
func (c *UDPConn) setError(err error) error {
	if err == nil {
		return nil
	}
	return opError("set", c.net, nil, udpOpAddr(c.laddr), err)
}

// truncWriter is the io.Writer a datagram is read into: what fits in b,
// the rest dropped (recvfrom's truncation).
type truncWriter struct {
	b []byte
	n int
}

func (w *truncWriter) Write(p []byte) (int, error) {
	w.n += copy(w.b[w.n:], p)
	return len(p), nil
}
