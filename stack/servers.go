package stack

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
)

// serverBufSize is the read size of the built-in servers: large enough that
// one Read drains several 64 KB segments from a gVisor receive queue.
const serverBufSize = 256 << 10

// ServeDiscard accepts connections on l and reads and discards everything
// they send (RFC 863), adding the byte count to n if n is not nil. It returns
// when l is closed, after every connection handler has finished.
func ServeDiscard(l net.Listener, n *atomic.Uint64) error {
	return serve(l, func(c net.Conn) { discard(c, n) })
}

// discard reads c until an error, counting into n.
func discard(c net.Conn, n *atomic.Uint64) {
	buf := make([]byte, serverBufSize)
	for {
		m, err := c.Read(buf)
		if n != nil && m > 0 {
			n.Add(uint64(m))
		}
		if err != nil {
			return
		}
	}
}

// ServeDiscardViews is ServeDiscard reading with TCPConn.ReadViews: the
// payload is looked at in place (each view's first byte is touched) and
// released, never copied when the stack runs with zero copy.
func ServeDiscardViews(l net.Listener, n *atomic.Uint64) error {
	return serve(l, func(c net.Conn) {
		tc, ok := c.(*TCPConn)
		if !ok {
			discard(c, n)
			return
		}
		vs := make([]View, 0, 256)
		var sink byte
		for {
			var m int
			var err error
			vs, m, err = tc.ReadViews(vs[:0], serverBufSize)
			for i := range vs {
				sink ^= vs[i].Bytes()[0]
				vs[i].Release()
			}
			if n != nil && m > 0 {
				n.Add(uint64(m))
			}
			if err != nil {
				discardSink.Store(uint32(sink))
				return
			}
		}
	})
}

// discardSink keeps the touched bytes alive for the compiler.
var discardSink atomic.Uint32

// ServeEcho accepts connections on l and writes back everything they send
// (RFC 862). It returns when l is closed, after every handler has finished.
//
// Each connection reads and writes concurrently through up to echoBacklog
// bytes of buffers, so that a peer which sends more than the socket buffers
// hold before it reads still gets its echo. (gVisor, like RFC 793, does not
// take the acknowledgement from a data segment that falls outside a zero
// receive window; an echo that stops reading while its own send waits for
// that acknowledgement would wait forever.)
func ServeEcho(l net.Listener) error {
	return serve(l, echo)
}

const (
	echoBufSize = 64 << 10
	echoBacklog = 8 << 20
)

func echo(c net.Conn) {
	free := make(chan []byte, echoBacklog/echoBufSize)
	for range cap(free) {
		free <- make([]byte, echoBufSize)
	}
	full := make(chan []byte, cap(free))
	go func() {
		defer close(full)
		for buf := range free {
			m, err := c.Read(buf[:cap(buf)])
			if m > 0 {
				full <- buf[:m]
			} else {
				free <- buf
			}
			if err != nil {
				return
			}
		}
	}()
	failed := false
	for buf := range full {
		if !failed {
			if _, err := c.Write(buf); err != nil {
				failed = true
				c.Close() // stops the reader
			}
		}
		free <- buf
	}
}

func serve(l net.Listener, handle func(net.Conn)) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	defer func() {
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			handle(c)
			c.Close()
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		}()
	}
}

// ServeUDPDiscard reads datagrams from c until it is closed, counting
// datagrams and bytes if the counters are not nil.
func ServeUDPDiscard(c net.PacketConn, datagrams, bytes *atomic.Uint64) error {
	buf := make([]byte, 65536)
	for {
		m, _, err := c.ReadFrom(buf)
		if err != nil {
			return ignoreClosed(err)
		}
		if datagrams != nil {
			datagrams.Add(1)
			bytes.Add(uint64(m))
		}
	}
}

// ServeUDPEcho sends every datagram read from c back to where it came from,
// until c is closed.
func ServeUDPEcho(c net.PacketConn) error {
	buf := make([]byte, 65536)
	for {
		m, from, err := c.ReadFrom(buf)
		if err != nil {
			return ignoreClosed(err)
		}
		if _, err := c.WriteTo(buf[:m], from); err != nil && errors.Is(err, net.ErrClosed) {
			return nil
		}
	}
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
