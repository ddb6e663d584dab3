package stack

import (
	"bytes"
	"net"
	"net/netip"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/waiter"
)

// dgramSock is what the datagram sockets (UDPConn, PingConn) share: a
// gVisor endpoint with its waiter queue, the socket's state and
// deadlines, and the blocking receive and send that Go's net has on a
// datagram socket. Its recv and send return the cause of a failure bare
// (net.ErrClosed, errDeadline, or the errno as syscallErr makes it); each
// socket type wraps it in the *net.OpError of its own addresses.
type dgramSock struct {
	s     *Stack // for Config.BusyRead
	ep    tcpip.Endpoint
	wq    *waiter.Queue
	net   string                      // Go's network name: "udp4", "ping6", ...
	proto tcpip.NetworkProtocolNumber // the socket's family

	sockState

	readMu sync.Mutex
	// +checklocks:readMu
	rn notifier
	// +checklocks:readMu
	rw truncWriter

	writeMu sync.Mutex
	// +checklocks:writeMu
	wn notifier
	// +checklocks:writeMu
	wr bytes.Reader
	// +checklocks:writeMu
	to tcpip.FullAddress // the destination of the send under way
}

// init sets d up on ep, bound or connected, as a socket of s's of network
// on proto.
func (d *dgramSock) init(s *Stack, network string, wq *waiter.Queue, ep tcpip.Endpoint, proto tcpip.NetworkProtocolNumber) {
	d.s, d.ep, d.wq, d.net, d.proto = s, ep, wq, network, proto
	d.sockState = newSockState()
}

// recv reads one datagram into b, cut to it (recvfrom without
// MSG_TRUNC), waiting for one until the read deadline or Close; call
// names the system call for its errors.
func (d *dgramSock) recv(b []byte, call string) (int, tcpip.FullAddress, error) {
	d.readMu.Lock()
	defer d.readMu.Unlock()
	d.rw = truncWriter{b: b}
	n, fa, err := d.recvLocked(call)
	d.rw = truncWriter{}
	return n, fa, err
}

// recvLocked is recv's, into d.rw.
//
// +checklocks:d.readMu
func (d *dgramSock) recvLocked(call string) (int, tcpip.FullAddress, error) {
	if d.closed.Load() {
		return 0, tcpip.FullAddress{}, net.ErrClosed
	}
	if d.rd.expired() {
		return 0, tcpip.FullAddress{}, errDeadline
	}
	opts := tcpip.ReadOptions{NeedRemoteAddr: true}
	res, e := d.ep.Read(&d.rw, opts)
	if _, ok := e.(*tcpip.ErrWouldBlock); ok && d.s != nil && d.s.cfg.BusyRead > 0 {
		// Spin before parking, as __skb_recv_udp calls sk_busy_loop
		// (busyread.go).
		sp := d.s.busySpin()
		hit := false
		for !hit && sp.next(d.done, &d.rd, time.Time{}) {
			res, e = d.ep.Read(&d.rw, opts)
			_, wb := e.(*tcpip.ErrWouldBlock)
			hit = !wb
		}
		sp.end(hit && e == nil)
	}
	if _, ok := e.(*tcpip.ErrWouldBlock); ok {
		ready := d.rn.register(d.wq, readEvents)
		defer d.rn.unregister(d.wq)
		for {
			res, e = d.ep.Read(&d.rw, opts)
			if _, ok := e.(*tcpip.ErrWouldBlock); !ok {
				break
			}
			select {
			case <-ready:
			case <-d.rd.wait():
				return 0, tcpip.FullAddress{}, errDeadline
			case <-d.done:
				return 0, tcpip.FullAddress{}, net.ErrClosed
			}
		}
	}
	switch e.(type) {
	case nil:
		return d.rw.n, res.RemoteAddr, nil
	case *tcpip.ErrClosedForReceive:
		// The endpoint was closed under the socket: by the stack's Close.
		return 0, tcpip.FullAddress{}, net.ErrClosed
	}
	if d.closed.Load() {
		return 0, tcpip.FullAddress{}, net.ErrClosed
	}
	return 0, tcpip.FullAddress{}, syscallErr(call, e)
}

// send sends b as one datagram to ap (if to) or to the connected peer,
// waiting while the send buffer is full, until the write deadline or
// Close; call names the system call for its errors.
func (d *dgramSock) send(b []byte, ap netip.AddrPort, to bool, call string) (int, error) {
	d.writeMu.Lock()
	defer d.writeMu.Unlock()
	if d.closed.Load() {
		return 0, net.ErrClosed
	}
	if d.wd.expired() {
		return 0, errDeadline
	}
	defer d.wr.Reset(nil)
	var opts tcpip.WriteOptions
	if to {
		d.to, _ = destAddr(ap)
		opts.To = &d.to
	}
	var ready <-chan struct{}
	defer d.wn.unregister(d.wq)
	for {
		d.wr.Reset(b)
		n, e := d.ep.Write(&d.wr, opts)
		switch e.(type) {
		case nil:
			return int(n), nil
		case *tcpip.ErrWouldBlock:
			if ready == nil {
				ready = d.wn.register(d.wq, writeEvents)
				continue
			}
			select {
			case <-ready:
			case <-d.wd.wait():
				return 0, errDeadline
			case <-d.done:
				return 0, net.ErrClosed
			}
		default:
			if d.closed.Load() {
				return 0, net.ErrClosed
			}
			return 0, syscallErr(call, e)
		}
	}
}

// closeSock closes the socket; it reports false if it was closed already.
func (d *dgramSock) closeSock() bool {
	if !d.markClosed() {
		return false
	}
	d.ep.Close()
	return true
}
