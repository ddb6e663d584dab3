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
	return serve(l, func(c net.Conn) {
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
	})
}

// ServeEcho accepts connections on l and writes back everything they send
// (RFC 862). It returns when l is closed, after every handler has finished.
func ServeEcho(l net.Listener) error {
	return serve(l, func(c net.Conn) {
		buf := make([]byte, serverBufSize)
		for {
			m, err := c.Read(buf)
			if m > 0 {
				if _, werr := c.Write(buf[:m]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
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
