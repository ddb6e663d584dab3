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
	return serve(l, maxServerConns, func(c net.Conn) { discard(c, n) })
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
	return serve(l, maxServerConns, func(c net.Conn) {
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
// hold before it reads still gets its echo. (gVisor, unlike Linux, does not
// take the acknowledgement from a data segment that meets a zero receive
// window; an echo that stops reading while its own send waits for that
// acknowledgement would wait forever.) A connection holds two buffers
// while idle; the ones beyond its first come from a budget of echoServerMemory
// bytes shared by the server's connections and go back to it as soon as
// the backlog drains, so a peer that sends without reading cannot make the
// server hold more than that.
func ServeEcho(l net.Listener) error {
	return newEchoServer(echoServerMemory).serve(l)
}

const (
	echoBufSize      = 64 << 10
	echoBacklog      = 8 << 20
	echoServerMemory = 256 << 20
)

// echoServer is ServeEcho's state: budget holds a token for each buffer
// its connections hold beyond their first.
type echoServer struct {
	budget chan struct{}
}

func newEchoServer(memory int) *echoServer {
	return &echoServer{budget: make(chan struct{}, memory/echoBufSize)}
}

func (e *echoServer) serve(l net.Listener) error {
	return serve(l, maxServerConns, e.echo)
}

// echo copies c to itself: a reader goroutine fills buffers, this one
// writes them back in order and returns them to free. Only the reader
// allocates; the connection holds 1+extra buffers, each beyond the first
// with a budget token. When nothing waits to be written this goroutine
// drops free ones down to two (trim) before returning the one it wrote, so
// an idle connection holds two buffers and the reader is never left
// without.
func (e *echoServer) echo(c net.Conn) {
	free := make(chan []byte, echoBacklog/echoBufSize)
	full := make(chan []byte, cap(free))
	var extra atomic.Int32
	free <- make([]byte, echoBufSize)
	go func() {
		defer close(full)
		for {
			buf := e.take(free, &extra)
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
		if len(full) == 0 {
			// Drained: give back the spare buffers, keeping buf so that
			// the reader always finds one.
			e.trim(free, &extra)
		}
		free <- buf
	}
	// The reader has finished: give back what the connection still holds.
	for range extra.Load() {
		<-e.budget
	}
}

// trim drops free buffers of the connection, with their budget tokens,
// until it holds two (the reader's and the writer's: a reader and a writer
// that keep pace pass two buffers back and forth without allocating). The
// reader may take from free meanwhile: trim never waits.
func (e *echoServer) trim(free chan []byte, extra *atomic.Int32) {
	for extra.Load() > 1 {
		select {
		case <-free:
			extra.Add(-1)
			<-e.budget
		default:
			return
		}
	}
}

// take returns a free buffer of the connection, a new one if the
// connection holds fewer than its backlog and the server's budget has
// room, or else waits for the writer to free one.
func (e *echoServer) take(free chan []byte, extra *atomic.Int32) []byte {
	select {
	case buf := <-free:
		return buf
	default:
	}
	if int(extra.Load())+1 < cap(free) {
		select {
		case e.budget <- struct{}{}:
			extra.Add(1)
			return make([]byte, echoBufSize)
		default:
		}
	}
	return <-free
}

// maxServerConns bounds the connections a built-in server handles at
// once; one more is closed as soon as it is accepted (counted in
// server_conns_refused when l is a Stack's). With it, what a server holds
// in buffers is bounded whatever a peer opens: serverBufSize per
// connection for discard, echoBufSize per connection plus
// echoServerMemory for echo.
const maxServerConns = 4096

func serve(l net.Listener, maxConns int, handle func(net.Conn)) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	refused := func() {}
	if tl, ok := l.(*tcpListener); ok {
		refused = func() { tl.s.connsRefused.Add(1) }
	}
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
		full := len(conns) >= maxConns
		if !full {
			conns[c] = struct{}{}
		}
		mu.Unlock()
		if full {
			c.Close()
			refused()
			continue
		}
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
