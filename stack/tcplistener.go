package stack

import (
	"net"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/waiter"
)

// listenBacklog is the accept queue of ListenTCP's listeners: Linux's
// default somaxconn, as Go's net uses.
const listenBacklog = 4096

// TCPListener is a TCP listener of the stack (ListenTCP, Listen), as Go's
// *net.TCPListener: Accept returns *TCPConn connections, AcceptTCP the
// same typed. Its errors are *net.OpError as net's (errors.go): Accept on
// a closed listener, or blocked in it when it is closed, fails with
// net.ErrClosed; at the deadline, with os.ErrDeadlineExceeded. Its
// methods are safe for concurrent use.
type TCPListener struct {
	s     *Stack
	ep    tcpip.Endpoint
	wq    *waiter.Queue
	net   string       // "tcp", "tcp4" or "tcp6", as Listen was given
	laddr *net.TCPAddr // the bound address, fixed

	dl     deadline
	closed atomic.Bool
	done   chan struct{} // closed by Close
}

// newTCPListener wraps ep, listening, for network, on proto.
func newTCPListener(s *Stack, network string, wq *waiter.Queue, ep tcpip.Endpoint, proto tcpip.NetworkProtocolNumber) *TCPListener {
	l := &TCPListener{s: s, ep: ep, wq: wq, net: network, done: make(chan struct{})}
	if a, e := ep.GetLocalAddress(); e == nil {
		l.laddr = tcpAddr(a, proto)
	}
	return l
}

// Accept waits for the next connection and returns it, a *TCPConn.
func (l *TCPListener) Accept() (net.Conn, error) {
	c, err := l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptTCP waits for the next connection and returns it.
func (l *TCPListener) AcceptTCP() (*TCPConn, error) {
	if l.closed.Load() {
		return nil, l.opError("accept", net.ErrClosed)
	}
	if l.dl.expired() {
		return nil, l.opError("accept", errDeadline)
	}
	n, wq, e := l.ep.Accept(nil)
	if _, ok := e.(*tcpip.ErrWouldBlock); ok {
		// Concurrent Accepts each wait on an entry of their own.
		entry, ready := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
		l.wq.EventRegister(&entry)
		defer l.wq.EventUnregister(&entry)
		for {
			n, wq, e = l.ep.Accept(nil)
			if _, ok := e.(*tcpip.ErrWouldBlock); !ok {
				break
			}
			select {
			case <-ready:
			case <-l.dl.wait():
				return nil, l.opError("accept", errDeadline)
			case <-l.done:
				return nil, l.opError("accept", net.ErrClosed)
			}
		}
	}
	if e != nil {
		if l.closed.Load() {
			return nil, l.opError("accept", net.ErrClosed)
		}
		// EINVAL once the listener is shut down (Stack.Shutdown), as
		// accept on a socket that no longer listens.
		return nil, l.opError("accept", syscallErr("accept4", e))
	}
	c := newTCPConn(l.s, wq, n)
	c.net = l.net
	return c, nil
}

// Close stops listening: connections not yet accepted are reset, and
// Accept calls blocked fail with net.ErrClosed. Closing it again returns
// an error wrapping net.ErrClosed.
func (l *TCPListener) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return l.opError("close", net.ErrClosed)
	}
	close(l.done)
	l.dl.stop()
	l.ep.Close()
	return nil
}

// Addr returns the listener's address, a *net.TCPAddr: its port is the
// one the stack chose for port 0; its IP the unspecified address of the
// listener's family when it listens on every address.
func (l *TCPListener) Addr() net.Addr { return tcpOpAddr(l.laddr) }

// SetDeadline sets the deadline of Accept (zero: none), as
// net.TCPListener's: past it, Accept fails with an error wrapping
// os.ErrDeadlineExceeded, whose Timeout is true.
func (l *TCPListener) SetDeadline(t time.Time) error {
	if l.closed.Load() {
		return &net.OpError{Op: "set", Net: l.net, Addr: tcpOpAddr(l.laddr), Err: net.ErrClosed}
	}
	l.dl.set(t)
	return nil
}

// opError is an error of l's op, as net's TCPListener reports it: no
// Source, the listener's address as Addr.
func (l *TCPListener) opError(op string, err error) error {
	return opError(op, l.net, nil, tcpOpAddr(l.laddr), err)
}
