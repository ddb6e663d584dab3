package stack

import (
	"bytes"
	"io"
	"math"
	"net"
	"sync"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/ustack/ustack/bufpool"
)

// TCPConn is a TCP connection of the stack, dialed (DialTCP, Dial) or
// accepted (TCPListener): a net.Conn with the methods of Go's
// *net.TCPConn (CloseRead, CloseWrite, SetLinger, SetKeepAlive,
// SetNoDelay, SetReadBuffer, ...) over a gVisor endpoint, that can also
// read payload without copying it (ReadViews, readviews.go) and poll for
// readability (tcpconn_poll.go).
//
// Its errors are Go's net errors (errors.go): a *net.OpError around the
// errno Linux returns (ECONNRESET, EPIPE, ...), net.ErrClosed for any call
// on the closed connection, os.ErrDeadlineExceeded at a deadline, and
// io.EOF itself, unwrapped, once the peer's FIN was read.
//
// As a *net.TCPConn, its methods are safe for concurrent use: reads are
// serialized with each other (Read, ReadViews, TryRead), writes with each
// other, so that each Write's bytes are contiguous in the stream. Its
// options start as Go's net sets them: Nagle's algorithm off
// (TCP_NODELAY), keep-alive on with probes after 15 s idle, every 15 s, 9
// of them (as net.Dialer and net.ListenConfig with a zero KeepAlive; call
// SetKeepAlive(false) to turn it off), no linger.
type TCPConn struct {
	s     *Stack // +checklocksignore: set by newTCPConn, read-only after
	ep    tcpip.Endpoint
	wq    *waiter.Queue
	net   string       // "tcp", "tcp4" or "tcp6": as dialed, or the listener's
	laddr *net.TCPAddr // fixed once connected
	raddr *net.TCPAddr // fixed once connected

	sockState

	// readMu serializes the reads; it guards their waiting and ReadViews'
	// state.
	readMu sync.Mutex
	// +checklocks:readMu
	rn notifier
	// +checklocks:readMu
	sw tcpip.SliceWriter // Read's
	// +checklocks:readMu
	w viewWriter
	// +checklocks:readMu
	copies *bufpool.Pool
	// +checklocks:readMu
	cur *bufpool.Page // the copy page being filled, one reference
	// +checklocks:readMu
	curOff int
	// +checklocks:readMu
	page int // the RX pool's base page size (PAGE_SIZE), once known

	// writeMu serializes the writes.
	writeMu sync.Mutex
	// +checklocks:writeMu
	wn notifier
	// +checklocks:writeMu
	wr bytes.Reader

	stats ViewStats
}

// readEvents and writeEvents are what wakes a blocked read or write: the
// endpoint became readable (or writable), or failed, or was shut down.
const (
	readEvents  = waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr
	writeEvents = waiter.WritableEvents | waiter.EventHUp | waiter.EventErr
)

// newTCPConn wraps ep, a connected endpoint, as a connection of network
// "tcp" (the caller may set c.net before handing it out).
func newTCPConn(s *Stack, wq *waiter.Queue, ep tcpip.Endpoint) *TCPConn {
	c := &TCPConn{s: s, ep: ep, wq: wq, net: "tcp", sockState: newSockState()}
	if a, e := ep.GetLocalAddress(); e == nil {
		c.laddr = tcpAddr(a, 0)
	}
	if a, e := ep.GetRemoteAddress(); e == nil {
		c.raddr = tcpAddr(a, 0)
	}
	// Go's default keep-alive (net.Dialer, net.ListenConfig: KeepAlive 0
	// is 15 s idle, 15 s interval, 9 probes); gVisor's is off.
	c.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true})
	return c
}

// Read reads what the peer sent into b, waiting until there is some; it
// returns io.EOF once the peer closed its side and everything was read.
// An empty b returns (0, nil) at once, as net's.
func (c *TCPConn) Read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if c.closed.Load() {
		return 0, c.opError("read", net.ErrClosed)
	}
	if len(b) == 0 {
		return 0, nil
	}
	c.sw = tcpip.SliceWriter(b)
	res, err := c.read(&c.sw)
	c.sw = nil
	if err != nil {
		return 0, err
	}
	if res.Count > 0 {
		c.ep.ModerateRecvBuf(res.Count)
	}
	return res.Count, nil
}

// read reads from the endpoint into w for Read and ReadViews, waiting
// while there is nothing to read, until the read deadline or Close. Its
// errors are Read's.
//
// +checklocks:c.readMu
func (c *TCPConn) read(w io.Writer) (tcpip.ReadResult, error) {
	if c.rd.expired() {
		return tcpip.ReadResult{}, c.opError("read", errDeadline)
	}
	res, e := c.ep.Read(w, tcpip.ReadOptions{})
	if _, ok := e.(*tcpip.ErrWouldBlock); ok && c.s.cfg.BusyRead > 0 {
		res, e = c.busyRead(w)
	}
	if _, ok := e.(*tcpip.ErrWouldBlock); ok {
		ready := c.rn.register(c.wq, readEvents)
		defer c.rn.unregister(c.wq)
		for {
			res, e = c.ep.Read(w, tcpip.ReadOptions{})
			if _, ok := e.(*tcpip.ErrWouldBlock); !ok {
				break
			}
			select {
			case <-ready:
			case <-c.rd.wait():
				return tcpip.ReadResult{}, c.opError("read", errDeadline)
			case <-c.done:
				return tcpip.ReadResult{}, c.opError("read", net.ErrClosed)
			}
		}
	}
	if e != nil {
		return res, c.readErr(e)
	}
	return res, nil
}

// busyRead spins on the endpoint for up to Config.BusyRead before read
// parks (busyread.go), as tcp_recvmsg calls sk_busy_loop with its receive
// queue empty; it returns the first read that would not block, or
// ErrWouldBlock when the spin ends without one (its time or the read
// deadline passed, or Close), and the wait that follows says which.
//
// +checklocks:c.readMu
func (c *TCPConn) busyRead(w io.Writer) (tcpip.ReadResult, tcpip.Error) {
	sp := c.s.busySpin()
	for sp.next(c.done, &c.rd, time.Time{}) {
		res, e := c.ep.Read(w, tcpip.ReadOptions{})
		if _, ok := e.(*tcpip.ErrWouldBlock); !ok {
			sp.end(e == nil)
			return res, e
		}
	}
	sp.end(false)
	return tcpip.ReadResult{}, &tcpip.ErrWouldBlock{}
}

// readErr returns a failed read's error: net.ErrClosed after Close,
// io.EOF at the end of the stream (the peer's FIN, or CloseRead), else the
// errno (ECONNRESET once, as the kernel reports a reset once; then
// io.EOF).
func (c *TCPConn) readErr(e tcpip.Error) error {
	if c.closed.Load() {
		return c.opError("read", net.ErrClosed)
	}
	if _, ok := e.(*tcpip.ErrClosedForReceive); ok {
		return io.EOF
	}
	return c.opError("read", syscallErr("read", e))
}

// Write writes b to the connection, waiting while the send buffer is full,
// until all of b is written, the write deadline passes or the connection
// fails. After the peer reset the connection it fails with ECONNRESET
// (the first call to see the reset) or EPIPE, as the kernel's; after
// CloseWrite with EPIPE.
func (c *TCPConn) Write(b []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.closed.Load() {
		return 0, c.opError("write", net.ErrClosed)
	}
	if c.wd.expired() {
		return 0, c.opError("write", errDeadline)
	}
	defer c.wr.Reset(nil)
	n := 0
	var ready <-chan struct{}
	defer c.wn.unregister(c.wq)
	for n < len(b) {
		c.wr.Reset(b[n:])
		m, e := c.ep.Write(&c.wr, tcpip.WriteOptions{})
		n += int(m)
		switch e.(type) {
		case nil:
		case *tcpip.ErrWouldBlock:
			if ready == nil {
				// Try again once registered: the buffer may have
				// drained in between.
				ready = c.wn.register(c.wq, writeEvents)
				continue
			}
			select {
			case <-ready:
			case <-c.wd.wait():
				return n, c.opError("write", errDeadline)
			case <-c.done:
				return n, c.opError("write", net.ErrClosed)
			}
		default:
			return n, c.writeErr(e)
		}
	}
	return n, nil
}

// writeErr returns a failed write's error: net.ErrClosed after Close, else
// the errno.
func (c *TCPConn) writeErr(e tcpip.Error) error {
	if c.closed.Load() {
		return c.opError("write", net.ErrClosed)
	}
	return c.opError("write", syscallErr("write", e))
}

// Close closes the connection: what was written is still sent, then the
// FIN (or, after SetLinger(0), a RST at once; or a RST if data the
// application did not read is queued, as tcp_close). Calls blocked on the
// connection return net.ErrClosed, as does every later call, Close
// included. Views ReadViews handed out stay valid until released.
func (c *TCPConn) Close() error {
	if !c.markClosed() {
		return c.opError("close", net.ErrClosed)
	}
	linger := c.ep.SocketOptions().GetLinger()
	c.ep.Close()
	if linger.Enabled && linger.Timeout > 0 {
		c.lingerWait(linger.Timeout)
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if c.cur != nil {
		c.copies.Recycle(c.cur)
		c.cur = nil
	}
	if c.copies != nil {
		c.copies.Close()
	}
	return nil
}

// CloseRead shuts the reading side down (shutdown(SHUT_RD)): reads return
// io.EOF once what is queued was read.
func (c *TCPConn) CloseRead() error { return c.shutdown(tcpip.ShutdownRead) }

// CloseWrite shuts the writing side down (shutdown(SHUT_WR)): the peer
// reads io.EOF once it read what was written, while this side can still
// read; a later Write fails with EPIPE.
func (c *TCPConn) CloseWrite() error { return c.shutdown(tcpip.ShutdownWrite) }

func (c *TCPConn) shutdown(how tcpip.ShutdownFlags) error {
	if c.closed.Load() {
		return c.opError("close", net.ErrClosed)
	}
	if e := c.ep.Shutdown(how); e != nil {
		return c.opError("close", syscallErr("shutdown", e))
	}
	return nil
}

// LocalAddr returns the connection's local address, a *net.TCPAddr.
func (c *TCPConn) LocalAddr() net.Addr { return tcpOpAddr(c.laddr) }

// RemoteAddr returns the peer's address, a *net.TCPAddr.
func (c *TCPConn) RemoteAddr() net.Addr { return tcpOpAddr(c.raddr) }

// SetDeadline sets the read and the write deadline, as SetReadDeadline
// and SetWriteDeadline.
func (c *TCPConn) SetDeadline(t time.Time) error {
	return c.setError(c.setDeadlines(t, readDeadline|writeDeadline))
}

// SetReadDeadline sets the deadline of Read, ReadViews and TryRead (zero:
// none): past it, and for calls blocked when it passes, they fail with an
// error wrapping os.ErrDeadlineExceeded, whose Timeout is true, until a
// later deadline is set. Safe while reads are blocked.
func (c *TCPConn) SetReadDeadline(t time.Time) error {
	return c.setError(c.setDeadlines(t, readDeadline))
}

// SetWriteDeadline sets the deadline of Write, as SetReadDeadline. A Write
// that times out may have written part of its bytes (its count says how
// many).
func (c *TCPConn) SetWriteDeadline(t time.Time) error {
	return c.setError(c.setDeadlines(t, writeDeadline))
}

// SetNoDelay turns Nagle's algorithm off (true, the default: a write's
// data is sent at once) or on (TCP_NODELAY).
func (c *TCPConn) SetNoDelay(noDelay bool) error {
	if c.closed.Load() {
		return c.optError(net.ErrClosed)
	}
	c.ep.SocketOptions().SetDelayOption(!noDelay)
	return nil
}

// SetKeepAlive turns keep-alive probes on or off (SO_KEEPALIVE), sent
// after the idle time SetKeepAlivePeriod sets (gVisor's default: 2 h).
func (c *TCPConn) SetKeepAlive(keepalive bool) error {
	if c.closed.Load() {
		return c.optError(net.ErrClosed)
	}
	c.ep.SocketOptions().SetKeepAlive(keepalive)
	return nil
}

// Keep-alive defaults and bounds, as Go's net (tcpsock.go) and Linux's
// do_tcp_setsockopt (MAX_TCP_KEEPIDLE, MAX_TCP_KEEPINTVL,
// MAX_TCP_KEEPCNT).
const (
	defaultKeepAliveIdle     = 15 * time.Second
	defaultKeepAliveInterval = 15 * time.Second
	defaultKeepAliveCount    = 9
	maxKeepAliveSecs         = 32767
	maxKeepAliveCount        = 127
)

// SetKeepAlivePeriod sets the idle time before the first keep-alive probe
// (TCP_KEEPIDLE), rounded up to whole seconds, as Go's: 0 is Go's
// default, 15 s; a negative d changes nothing; more than 32767 s fails
// with EINVAL, as the kernel refuses it.
func (c *TCPConn) SetKeepAlivePeriod(d time.Duration) error {
	if c.closed.Load() {
		return c.optError(net.ErrClosed)
	}
	if err := c.setKeepAliveTime(d, defaultKeepAliveIdle, true); err != nil {
		return c.optError(err)
	}
	return nil
}

// SetKeepAliveConfig sets keep-alive on or off and its idle time, probe
// interval and probe count, as net.TCPConn.SetKeepAliveConfig: a zero
// field takes Go's default (15 s, 15 s, 9), a negative one changes
// nothing; out of the kernel's range (above 32767 s, above 127 probes) is
// EINVAL.
func (c *TCPConn) SetKeepAliveConfig(cfg net.KeepAliveConfig) error {
	if c.closed.Load() {
		return c.optError(net.ErrClosed)
	}
	c.ep.SocketOptions().SetKeepAlive(cfg.Enable)
	if err := c.setKeepAliveTime(cfg.Idle, defaultKeepAliveIdle, true); err != nil {
		return c.optError(err)
	}
	if err := c.setKeepAliveTime(cfg.Interval, defaultKeepAliveInterval, false); err != nil {
		return c.optError(err)
	}
	n := cfg.Count
	switch {
	case n < 0:
		return nil
	case n == 0:
		n = defaultKeepAliveCount
	case n > maxKeepAliveCount:
		return c.optError(errnoErr("setsockopt", syscall.EINVAL))
	}
	if e := c.ep.SetSockOptInt(tcpip.KeepaliveCountOption, n); e != nil {
		return c.optError(syscallErr("setsockopt", e))
	}
	return nil
}

// setKeepAliveTime sets the keep-alive idle time (idle) or interval to d
// rounded up to seconds, def if d is 0, nothing if d is negative.
func (c *TCPConn) setKeepAliveTime(d, def time.Duration, idle bool) error {
	switch {
	case d < 0:
		return nil
	case d == 0:
		d = def
	}
	secs := (d + time.Second - 1) / time.Second
	if d > maxKeepAliveSecs*time.Second {
		return errnoErr("setsockopt", syscall.EINVAL)
	}
	var e tcpip.Error
	if idle {
		opt := tcpip.KeepaliveIdleOption(secs * time.Second)
		e = c.ep.SetSockOpt(&opt)
	} else {
		opt := tcpip.KeepaliveIntervalOption(secs * time.Second)
		e = c.ep.SetSockOpt(&opt)
	}
	if e != nil {
		return syscallErr("setsockopt", e)
	}
	return nil
}

// SetLinger sets what Close does with data not yet sent (SO_LINGER), as
// net.TCPConn.SetLinger on Linux: sec < 0 (the default) sends it in the
// background, then the FIN; sec == 0 discards it and resets the
// connection (RST), so that the peer's reads fail with ECONNRESET; sec >
// 0 sends it and the FIN as sec < 0, and Close blocks until the peer has
// acknowledged them or sec seconds passed (tcp_close's
// sk_stream_wait_close); what is still unsent then goes on in the
// background.
func (c *TCPConn) SetLinger(sec int) error {
	if c.closed.Load() {
		return c.optError(net.ErrClosed)
	}
	opt := tcpip.LingerOption{Enabled: sec >= 0}
	if sec > 0 {
		opt.Timeout = time.Duration(min(sec, math.MaxInt32)) * time.Second
	}
	c.ep.SocketOptions().SetLinger(opt)
	return nil
}

// lingerWait blocks Close, which queued the FIN, until the peer
// acknowledged it (and so every byte before it) or d passed, or the stack
// closes, as sk_stream_wait_close waits while the socket is in
// FIN-WAIT-1, CLOSING or LAST-ACK. gVisor has no notification for a state
// change, so it polls as Stack.Shutdown does.
func (c *TCPConn) lingerWait(d time.Duration) {
	te, ok := c.ep.(*tcp.Endpoint)
	if !ok {
		return
	}
	deadline := time.Now().Add(d)
	for delay := shutdownPollMin; ; delay = min(2*delay, shutdownPollMax) {
		switch te.EndpointState() {
		case tcp.StateFinWait1, tcp.StateClosing, tcp.StateLastAck:
		default:
			return
		}
		left := time.Until(deadline)
		if left <= 0 || c.s != nil && c.s.shut.closed.Load() {
			return
		}
		time.Sleep(min(delay, left))
	}
}

// SetReadBuffer sets the receive buffer (SO_RCVBUF), which also turns its
// auto-tuning off, as the kernel's; gVisor bounds it. A negative size
// fails with EINVAL (the kernel would take it as its maximum).
func (c *TCPConn) SetReadBuffer(bytes int) error {
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
func (c *TCPConn) SetWriteBuffer(bytes int) error {
	if c.closed.Load() {
		return c.setError(net.ErrClosed)
	}
	if bytes < 0 {
		return c.setError(errnoErr("setsockopt", syscall.EINVAL))
	}
	c.ep.SocketOptions().SetSendBufferSize(int64(bytes), true)
	return nil
}

// Retransmits returns the number of segments the connection retransmitted
// (its gVisor endpoint's SendErrors.Retransmits; Linux's tcpi_total_retrans).
// It is safe from any goroutine, also after Close.
func (c *TCPConn) Retransmits() uint64 {
	if st, ok := c.ep.Stats().(*tcp.Stats); ok {
		return st.SendErrors.Retransmits.Value()
	}
	return 0
}

// opError is an error of c's op as net's conn reports it: the local
// address as Source, the peer's as Addr.
func (c *TCPConn) opError(op string, err error) error {
	return opError(op, c.net, tcpOpAddr(c.laddr), tcpOpAddr(c.raddr), err)
}

// optError is a failed option's (SetLinger, SetKeepAlive, SetNoDelay),
// as net.TCPConn's.
func (c *TCPConn) optError(err error) error { return c.opError("set", err) }

// setError is a failed deadline's or buffer size's, as net's conn reports
// it: no Source, the local address as Addr.
func (c *TCPConn) setError(err error) error {
	if err == nil {
		return nil
	}
	return opError("set", c.net, nil, tcpOpAddr(c.laddr), err)
}
