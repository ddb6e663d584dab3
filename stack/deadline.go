package stack

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/waiter"
)

// deadline is one deadline of a socket (its reads', its writes' or a
// listener's accepts'), as net.Conn's SetReadDeadline sets it: a channel
// that is closed when the deadline passes, which the calls blocked on the
// socket select on, so that a deadline set in the past, or one that
// passes, wakes them at once. Its methods are safe for concurrent use;
// set may race with the calls waiting, as in Go's net.
//
// It allocates nothing in steady state: one timer for its life, re-armed
// by set, and a new channel only after the old one was closed (a deadline
// passed and a later one was set).
type deadline struct {
	mu sync.Mutex
	// at is the deadline (zero: none).
	// +checklocks:mu
	at time.Time
	// ch is closed once at has passed; nil until first needed.
	// +checklocks:mu
	ch chan struct{}
	// timer calls fire at at; nil until a deadline in the future is set.
	// +checklocks:mu
	timer *time.Timer
}

// set sets the deadline to t (zero: none). A deadline in the past closes
// the channel; a later deadline after that opens a new one.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = t
	if d.timer != nil {
		d.timer.Stop()
	}
	expired := d.ch != nil && isClosed(d.ch)
	if t.IsZero() {
		if expired {
			d.ch = nil
		}
		return
	}
	wait := time.Until(t)
	if wait <= 0 {
		if d.ch == nil {
			d.ch = make(chan struct{})
		}
		if !expired {
			close(d.ch)
		}
		return
	}
	if expired {
		d.ch = nil
	}
	if d.timer == nil {
		d.timer = time.AfterFunc(wait, d.fire)
	} else {
		d.timer.Reset(wait)
	}
}

// fire is the timer's: it closes the channel if the deadline has passed.
// A call left over from a deadline set again since finds the new one not
// passed (or none) and, for a clock that stepped back, re-arms the timer.
func (d *deadline) fire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at.IsZero() {
		return
	}
	if wait := time.Until(d.at); wait > 0 {
		d.timer.Reset(wait)
		return
	}
	if d.ch == nil {
		d.ch = make(chan struct{})
	}
	if !isClosed(d.ch) {
		close(d.ch)
	}
}

// wait returns the channel that is closed when the deadline passes.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ch == nil {
		d.ch = make(chan struct{})
	}
	return d.ch
}

// expired reports whether the deadline has passed.
func (d *deadline) expired() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch != nil && isClosed(d.ch)
}

// stop stops the timer, for the socket's Close: a deadline far ahead then
// keeps nothing alive.
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
	}
}

// isClosed reports whether ch is closed (nothing is ever sent on it).
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// notifier is a socket's waiter entry for one kind of call (its reads or
// its writes), made once and kept, so that a call that blocks registers it
// without allocating. The calls it serves are serialized by their mutex,
// which guards it.
type notifier struct {
	entry      waiter.Entry
	ch         chan struct{}
	registered bool
}

// register registers the entry on wq for mask (the same mask every time)
// and returns the channel it wakes.
func (n *notifier) register(wq *waiter.Queue, mask waiter.EventMask) <-chan struct{} {
	if n.ch == nil {
		n.entry, n.ch = waiter.NewChannelEntry(mask)
	}
	wq.EventRegister(&n.entry)
	n.registered = true
	return n.ch
}

// unregister undoes register, if it was called: a call deferred once
// before a loop that may register.
func (n *notifier) unregister(wq *waiter.Queue) {
	if n.registered {
		wq.EventUnregister(&n.entry)
		n.registered = false
	}
}

// sockState is what each socket type of the package (TCPConn, UDPConn,
// PingConn) keeps for net.Conn's Close and deadlines: whether it is
// closed, a channel closed with it that blocked calls select on, and the
// read and write deadlines.
type sockState struct {
	rd     deadline // the reads'
	wd     deadline // the writes'
	closed atomic.Bool
	done   chan struct{} // closed by markClosed
}

func newSockState() sockState { return sockState{done: make(chan struct{})} }

// Which deadlines setDeadlines sets.
const (
	readDeadline = 1 << iota
	writeDeadline
)

// setDeadlines sets the deadlines which selects to t, as net.Conn's
// SetDeadline, SetReadDeadline and SetWriteDeadline; once the socket is
// closed it fails with net.ErrClosed.
func (s *sockState) setDeadlines(t time.Time, which int) error {
	if s.closed.Load() {
		return net.ErrClosed
	}
	if which&readDeadline != 0 {
		s.rd.set(t)
	}
	if which&writeDeadline != 0 {
		s.wd.set(t)
	}
	return nil
}

// markClosed marks the socket closed and wakes the calls blocked on it;
// it reports false if the socket was closed already.
func (s *sockState) markClosed() bool {
	if !s.closed.CompareAndSwap(false, true) {
		return false
	}
	close(s.done)
	s.rd.stop()
	s.wd.stop()
	return true
}
