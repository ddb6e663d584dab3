package stack

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// Shutdown polls gVisor's endpoints from shutdownPollMin, doubling to
// shutdownPollMax. gVisor has no notification for a TCP state change (its
// setEndpointState wakes no one, and an endpoint's waiter queue belongs
// to the application's socket), so Shutdown looks: the ACK of a FIN takes
// a round trip (well under a millisecond on a TAP, tens of milliseconds
// across a WAN), which the first ticks catch at once, and a slow peer
// costs one walk of gVisor's endpoint table every 50 ms.
const (
	shutdownPollMin = time.Millisecond
	shutdownPollMax = 50 * time.Millisecond
)

// shutdownState is what Close and Shutdown share.
type shutdownState struct {
	closed atomic.Bool // Close has begun
}

// Shutdown closes the stack gracefully, as a server process that closes
// its sockets and then exits: every TCP listener stops accepting (a SYN
// then gets RST, as at a closed listener's port, and connections not yet
// accepted are reset, as closing a listener resets its queue); every
// established TCP connection sends what the application wrote before
// Shutdown, then its FIN, as shutdown(SHUT_WR) does, while the wire is
// still up. The receive side stays open: a peer that sends more is
// still acknowledged, and the application may still read, so that unread
// data cannot turn the FIN into a RST (tcp_close resets a socket closed
// with unread data). Shutdown waits until the peers have acknowledged all
// of it: every TCP endpoint is in FIN-WAIT-2, TIME-WAIT or CLOSED, or gone;
// a peer that half-closed and keeps its side open does not hold it up, nor
// does TIME-WAIT. Then it closes the stack as Close does (what is left is
// reset) and returns Close's error.
//
// If ctx is done first, the connections still sending are reset (RST) as
// Close resets them, the stack is closed, and Shutdown returns ctx.Err():
// a peer that stopped reading (zero window) gets its RST then.
//
// Shutdown may be called concurrently with Close and with itself. After
// Close, or once a Shutdown has closed the stack, it returns net.ErrClosed,
// as a net.Conn's second Close does (http.Server's Serve says
// ErrServerClosed); Close after Shutdown returns nil. It finds the endpoints through gVisor, so it
// covers every TCP socket of the stack, whatever wraps it.
func (s *Stack) Shutdown(ctx context.Context) error {
	if s.shut.closed.Load() {
		s.Close() // waits for a Close under way
		return net.ErrClosed
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	shut := make(map[*tcp.Endpoint]bool) // the listeners shut down
	for delay := shutdownPollMin; !s.finishTCP(shut); delay = min(2*delay, shutdownPollMax) {
		if s.shut.closed.Load() { // a Close came in
			s.Close()
			return net.ErrClosed
		}
		if timer == nil {
			timer = time.NewTimer(delay)
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			if err := s.Close(); err != nil {
				return errors.Join(ctx.Err(), err)
			}
			return ctx.Err()
		case <-timer.C:
		}
	}
	if s.shut.closed.Load() {
		s.Close()
		return net.ErrClosed
	}
	return s.Close()
}

// finishTCP takes every TCP endpoint of the stack one step toward its
// close and reports whether all are done: a listener not in shut is shut
// down for reading (new SYNs get RST, its queue is reset) and added to
// shut; an established connection (ESTABLISHED, CLOSE-WAIT) queues its FIN
// behind the data it has (gVisor's shutdownLocked: FIN-WAIT-1 or
// LAST-ACK). The listeners go first, so that the connections their queues
// held are reset rather than finished. A connection is done once its FIN
// was acknowledged; one still connecting has nothing to deliver and is
// done too (Close aborts it).
func (s *Stack) finishTCP(shut map[*tcp.Endpoint]bool) bool {
	eps := s.tcpEndpoints()
	listeners := false
	for _, e := range eps {
		if e.EndpointState() == tcp.StateListen && !shut[e] {
			e.Shutdown(tcpip.ShutdownRead)
			shut[e] = true
			listeners = true
		}
	}
	if listeners {
		eps = s.tcpEndpoints() // without the connections their queues held
	}
	done := true
	for _, e := range eps {
		switch e.EndpointState() {
		case tcp.StateEstablished, tcp.StateCloseWait:
			// Idempotent: an endpoint whose send side is closed (by the
			// application's CloseWrite, or a Shutdown before) keeps it.
			e.Shutdown(tcpip.ShutdownWrite)
			done = false
		case tcp.StateFinWait1, tcp.StateClosing, tcp.StateLastAck:
			done = false // our FIN is not acknowledged yet
		}
	}
	return done
}

// abortTCP resets every TCP endpoint of the stack, listeners first, as
// gVisor's Stack.Close does and as the kernel resets a socket closed with
// unread data (tcp_close) or SO_LINGER 0: gVisor's Abort sends the RST
// inline, so it has left through the driver when abortTCP returns, while
// the driver still runs. An endpoint in TIME-WAIT is left to gVisor's
// Close after the driver stopped, which drops it without a segment, as
// the kernel lets a timewait socket expire: its peer has closed.
func (s *Stack) abortTCP() {
	for _, listeners := range []bool{true, false} {
		for _, e := range s.tcpEndpoints() {
			switch st := e.EndpointState(); {
			case (st == tcp.StateListen) != listeners:
			case st == tcp.StateTimeWait, st == tcp.StateClose, st == tcp.StateError:
			default:
				e.Abort()
			}
		}
	}
}

// tcpEndpoints returns the TCP endpoints registered with gVisor's
// demultiplexer: listeners, and connections from their handshake until
// they are closed (those in TIME-WAIT included). A dual-stack endpoint
// may be listed twice.
func (s *Stack) tcpEndpoints() []*tcp.Endpoint {
	var out []*tcp.Endpoint
	for _, te := range s.ip.RegisteredEndpoints() {
		if e, ok := te.(*tcp.Endpoint); ok {
			out = append(out, e)
		}
	}
	return out
}
