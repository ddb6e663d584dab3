package stack

import (
	"errors"
	"io"

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
// nothing is, io.EOF once the peer closed and everything was read. Like
// Read, it lets receive-buffer auto-tuning see what the application took.
func (c *TCPConn) TryRead(b []byte) (int, error) {
	w := tcpip.SliceWriter(b)
	res, err := c.ep.Read(&w, tcpip.ReadOptions{})
	if res.Count > 0 {
		c.ep.ModerateRecvBuf(res.Count)
	}
	switch err.(type) {
	case nil:
		return res.Count, nil
	case *tcpip.ErrWouldBlock:
		return 0, nil
	case *tcpip.ErrClosedForReceive:
		return 0, io.EOF
	default:
		return 0, c.opError(errors.New(err.String()))
	}
}
