package stack

import (
	"net"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/waiter"
)

// A server of many connections waits for data before it takes a buffer,
// so that a connection whose peer sends nothing holds none: NotifyReadable
// and Readable tell when data is there, TryRead reads it without blocking
// (as epoll_wait and a read on an O_NONBLOCK socket do).

// Readable reports whether a read would not block: payload is queued, the
// peer closed, or the connection failed.
func (c *TCPConn) Readable() bool {
	return c.ep.Readiness(waiter.ReadableEvents) != 0
}

// NotifyReadable returns a channel that gets a value when the connection
// becomes readable (values coalesce: the channel holds one), until stop is
// called. Check Readable after registering, before waiting: the channel
// only tells of changes.
func (c *TCPConn) NotifyReadable() (ready <-chan struct{}, stop func()) {
	e, ch := waiter.NewChannelEntry(waiter.ReadableEvents)
	entry := &e
	c.wq.EventRegister(entry)
	return ch, func() { c.wq.EventUnregister(entry) }
}

// TryRead reads what is queued into b without blocking: (0, nil) if
// nothing is, io.EOF once the peer closed and everything was read; its
// other errors are Read's. Like Read, it lets receive-buffer auto-tuning
// see what the application took. It does not wait for a Read or ReadViews
// blocked on another goroutine: it reads beside it.
func (c *TCPConn) TryRead(b []byte) (int, error) {
	if c.closed.Load() {
		return 0, c.opError("read", net.ErrClosed)
	}
	if c.rd.expired() {
		return 0, c.opError("read", errDeadline)
	}
	if len(b) == 0 {
		return 0, nil
	}
	res, err := c.tryRead(b)
	if res.Count > 0 {
		c.ep.ModerateRecvBuf(res.Count)
	}
	switch err.(type) {
	case nil:
		return res.Count, nil
	case *tcpip.ErrWouldBlock:
		return 0, nil
	default:
		return 0, c.readErr(err)
	}
}

// tryRead is TryRead's read: into the connection's own writer (no
// allocation) if no other read holds readMu, else into one of its own.
//
// +checklocksignore: readMu is taken with TryLock.
func (c *TCPConn) tryRead(b []byte) (tcpip.ReadResult, tcpip.Error) {
	if !c.readMu.TryLock() {
		w := tcpip.SliceWriter(b)
		return c.ep.Read(&w, tcpip.ReadOptions{})
	}
	defer c.readMu.Unlock()
	c.sw = tcpip.SliceWriter(b)
	res, err := c.ep.Read(&c.sw, tcpip.ReadOptions{})
	c.sw = nil
	return res, err
}

// TryWrite writes what of b the send buffer takes now, without waiting:
// (0, nil) if it is full or another Write holds the connection (as a write
// on an O_NONBLOCK socket returns EAGAIN). Its errors are Write's.
//
// +checklocksignore: writeMu is taken with TryLock.
func (c *TCPConn) TryWrite(b []byte) (int, error) {
	if c.closed.Load() {
		return 0, c.opError("write", net.ErrClosed)
	}
	if c.wd.expired() {
		return 0, c.opError("write", errDeadline)
	}
	if len(b) == 0 || !c.writeMu.TryLock() {
		return 0, nil
	}
	defer c.writeMu.Unlock()
	c.wr.Reset(b)
	m, e := c.ep.Write(&c.wr, tcpip.WriteOptions{})
	c.wr.Reset(nil)
	switch e.(type) {
	case nil, *tcpip.ErrWouldBlock:
		return int(m), nil
	}
	return int(m), c.writeErr(e)
}

// BusyPoll spins as a read that would block does with Config.BusyRead,
// until the connection is readable, the spin's time or the read deadline
// has passed, or Close; it reports whether the connection is readable (a
// read would not block: true after Close, whose reads fail at once).
// Without BusyRead it only looks. It is for servers that wait for
// readability (NotifyReadable) before they read, as epoll_wait busy polls
// before it sleeps (ep_busy_loop, with SO_BUSY_POLL or
// net.core.busy_poll).
func (c *TCPConn) BusyPoll() bool {
	if r := c.Readable(); r || c.s.cfg.BusyRead <= 0 {
		return r
	}
	sp := c.s.busySpin()
	ok := false
	for !ok && sp.next(c.done, &c.rd, time.Time{}) {
		ok = c.Readable()
	}
	sp.end(ok)
	return ok
}
