package serve

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/stacktest"
)

// TestServeConnLimit: a server at its connection limit closes the next
// connection at once and counts it; once a connection ends, it accepts
// again.
func TestServeConnLimit(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	ap := netip.MustParseAddrPort("192.0.2.1:7100")
	l, err := rx.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := 0
	st := new(Stats)
	serveInBackground(t, l, func() error {
		return serve(l, &Config{MaxConns: 2}, st, func(c net.Conn, _ <-chan struct{}) {
			mu.Lock()
			handled++
			mu.Unlock()
			io.Copy(io.Discard, c) // until the peer closes
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func() net.Conn {
		t.Helper()
		c, err := peer.DialTCP(ctx, ap)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	handlers := func(want int) {
		t.Helper()
		waitFor(t, fmt.Sprintf("%d handlers started", want), func() bool { mu.Lock(); defer mu.Unlock(); return handled == want })
	}
	a, b := dial(), dial()
	defer b.Close()
	handlers(2)
	over := dial()
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := over.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("third connection over a limit of 2: read %d bytes, %v; want it closed by the server", n, err)
	}
	if got := counterMap(rx, st)["server_conns_refused"]; got != 1 {
		t.Errorf("server_conns_refused: got %d, want 1", got)
	}
	// Half-close a and wait for the server's close: serve frees the slot
	// before it closes the connection, so d then finds it free. (Waiting
	// for the server's end to leave ESTABLISHED raced with the handler:
	// that happens at the FIN, before the handler returns.)
	a.(interface{ CloseWrite() error }).CloseWrite()
	a.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, a); err != nil {
		t.Fatalf("waiting for the server to close the first connection: %v", err)
	}
	a.Close()
	d := dial()
	defer d.Close()
	handlers(3)
	if got := counterMap(rx, st)["server_conns_refused"]; got != 1 {
		t.Errorf("server_conns_refused after a slot freed: got %d, want 1", got)
	}
}

// TestEchoBudget echoes two connections through a server whose shared
// budget is far smaller than what they send before reading: every byte
// comes back, the budget is never exceeded, and an idle connection gives
// its spare buffers back.
func TestEchoBudget(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	ap := netip.MustParseAddrPort("192.0.2.1:7101")
	l, err := rx.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	const budget = 6 // buffers beyond each connection's first, for both
	e := newEchoServer(&Config{EchoMemory: budget * echoBufSize}, new(Stats))
	t.Cleanup(func() { // after the server returned
		if n := len(e.budget); n != 0 {
			t.Errorf("budget tokens held after the server returned: %d, want 0", n)
		}
	})
	serveInBackground(t, l, func() error { return e.serve(l) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 6 << 20
	var conns []net.Conn
	var wg sync.WaitGroup
	for i := range 2 {
		c, err := peer.DialTCP(ctx, ap)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
		c.SetDeadline(time.Now().Add(60 * time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := make(chan [32]byte, 1)
			go func() {
				// Start reading late: the echo's backlog fills first.
				time.Sleep(200 * time.Millisecond)
				h := sha256.New()
				io.CopyN(h, c, n)
				var sum [32]byte
				h.Sum(sum[:0])
				got <- sum
			}()
			want, err := sendAndHash(c, n, 48<<10, uint64(10+i))
			if err != nil {
				t.Errorf("conn %d: %v", i, err)
				return
			}
			if sum := <-got; sum != want {
				t.Errorf("conn %d: echoed sha256 %x, want %x", i, sum, want)
			}
		}()
	}
	peak := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-time.After(time.Millisecond):
		}
		peak = max(peak, len(e.budget))
	}
	if peak > budget {
		t.Errorf("budget tokens: peak %d, want at most %d", peak, budget)
	}
	if peak == 0 {
		t.Errorf("budget tokens: peak 0, want > 0 (the echo never needed more than one buffer: the test tests nothing)")
	}
	// Both connections idle and open: each keeps at most one token.
	waitFor(t, "two idle connections hold at most a token each", func() bool { return len(e.budget) <= 2 })
	for _, c := range conns {
		c.Close()
	}
	waitFor(t, "no token held once both connections closed", func() bool { return len(e.budget) == 0 })
}

// serveInBackground runs serve, a server on l, until the test ends, then
// closes l and checks that serve returned nil.
func serveInBackground(t *testing.T, l net.Listener, serve func() error) {
	served := make(chan error, 1)
	go func() { served <- serve() }()
	t.Cleanup(func() {
		l.Close()
		if err := <-served; err != nil {
			t.Errorf("server on %v: %v", l.Addr(), err)
		}
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// dialN connects n TCP connections from peer to ap, closed at cleanup.
func dialN(t *testing.T, peer *stack.Stack, ap netip.AddrPort, n int) []net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conns []net.Conn
	for range n {
		c, err := peer.DialTCP(ctx, ap)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(60 * time.Second))
		conns = append(conns, c)
	}
	return conns
}

// echoOnce writes msg on c and fails the test unless it comes back.
func echoOnce(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
		t.Fatalf("echo: got %q, %v; want %q", got, err, msg)
	}
}

// TestServeIdleTimeout fills an echo server's connection slots with
// connections that send nothing: the server closes them once the idle
// timeout passed, counts them, and then serves a new client.
func TestServeIdleTimeout(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	ap := netip.MustParseAddrPort("192.0.2.1:7102")
	l, err := rx.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	// Long enough that the new client below, which writes at once, is
	// not idle on a loaded machine.
	st := new(Stats)
	cfg := Config{MaxConns: 3, IdleTimeout: 3 * time.Second, Stats: st}
	serveInBackground(t, l, func() error { return cfg.Echo(l) })
	idle := dialN(t, peer, ap, 3)
	echoOnce(t, idle[0], "served, then idle")
	for i, c := range idle {
		// Blocks until the server closes c (or the 60 s deadline).
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("idle connection %d: read %d bytes, %v; want EOF from the server's close", i, n, err)
		}
	}
	if got := counterMap(rx, st)["server_idle_timeouts"]; got != 3 {
		t.Errorf("server_idle_timeouts: got %d, want 3", got)
	}
	c := dialN(t, peer, ap, 1)[0]
	echoOnce(t, c, "a new client after the idle ones")
	if got := counterMap(rx, st)["server_conns_refused"]; got != 0 {
		t.Errorf("server_conns_refused: got %d, want 0", got)
	}
}

// TestServeConnsPerSource: a source at its connection limit gets the next
// connection closed at once, counted; another source is still served.
func TestServeConnsPerSource(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	l, err := rx.ListenTCP(netip.MustParseAddrPort("[::]:7103"))
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Uint64
	st := new(Stats)
	cfg := Config{MaxConnsPerSource: 2, Stats: st}
	serveInBackground(t, l, func() error { return cfg.Discard(l, &n) })
	v4 := netip.MustParseAddrPort("192.0.2.1:7103")
	v6 := netip.MustParseAddrPort("[2001:db8::1]:7103")
	ok := dialN(t, peer, v4, 2)
	for _, c := range ok {
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both connections of the source served", func() bool { return n.Load() == 2 })
	over := dialN(t, peer, v4, 1)[0]
	over.SetReadDeadline(time.Now().Add(10 * time.Second))
	if m, err := over.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("third connection of a source over a limit of 2: read %d bytes, %v; want it closed by the server", m, err)
	}
	if got := counterMap(rx, st)["server_conns_source_refused"]; got != 1 {
		t.Errorf("server_conns_source_refused: got %d, want 1", got)
	}
	other := dialN(t, peer, v6, 1)[0]
	if _, err := other.Write([]byte("yz")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "another source served", func() bool { return n.Load() == 4 })
	if got := counterMap(rx, st)["server_conns_refused"]; got != 0 {
		t.Errorf("server_conns_refused: got %d, want 0", got)
	}
}

// TestServeIdleHoldsNoBuffer: connections that sent and now wait hold no
// read buffer, in discard and in echo (server_buf_bytes_current).
func TestServeIdleHoldsNoBuffer(t *testing.T) {
	for _, echo := range []bool{false, true} {
		name := map[bool]string{false: "discard", true: "echo"}[echo]
		t.Run(name, func(t *testing.T) {
			rx, peer := stacktest.Pair(t, driver.Config{})
			ap := netip.MustParseAddrPort("192.0.2.1:7104")
			l, err := rx.ListenTCP(ap)
			if err != nil {
				t.Fatal(err)
			}
			var n atomic.Uint64
			st := new(Stats)
			if echo {
				serveInBackground(t, l, func() error { return Config{Stats: st}.Echo(l) })
			} else {
				serveInBackground(t, l, func() error { return Config{Stats: st}.Discard(l, &n) })
			}
			const conns, size = 8, 100 << 10
			cs := dialN(t, peer, ap, conns)
			for _, c := range cs {
				if _, err := c.Write(make([]byte, size)); err != nil {
					t.Fatal(err)
				}
			}
			if echo {
				for _, c := range cs {
					if _, err := io.ReadFull(c, make([]byte, size)); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				waitFor(t, "every byte discarded", func() bool { return n.Load() == conns*size })
			}
			waitFor(t, "idle connections hold no buffer", func() bool { return counterMap(rx, st)["server_buf_bytes_current"] == 0 })
			if got := counterMap(rx, st)["tcp_established"]; got < conns {
				t.Errorf("tcp_established: got %d, want the %d connections still open", got, conns)
			}
		})
	}
}

// sendNoRead writes to c without ever reading, until a write fails (the
// server reset c, cleanup closed it, or its deadline passed), at most 256
// MB: far more than the socket buffers of both ends and the echo's
// buffers hold, so that its writes block and so do the server's.
func sendNoRead(c net.Conn, written *atomic.Uint64) {
	buf := make([]byte, 64<<10)
	for range 4096 {
		n, err := c.Write(buf)
		written.Add(uint64(n))
		if err != nil {
			return
		}
	}
}

// TestEchoShare: connections that send and never read hold at most their
// share of the echo budget, so another connection still gets its buffers
// and its echo intact.
func TestEchoShare(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	ap := netip.MustParseAddrPort("192.0.2.1:7105")
	l, err := rx.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	const budget, share, abusers = 6, 3, 2 // tokens; buffers per connection
	cfg := Config{EchoMemory: budget * echoBufSize, EchoConnMemory: share * echoBufSize, WriteTimeout: -1}
	e := newEchoServer(&cfg, new(Stats))
	serveInBackground(t, l, func() error { return e.serve(l) })
	stuck := abusers * (share - 1) // each holds its first buffer and share-1 with tokens
	var written atomic.Uint64
	for _, c := range dialN(t, peer, ap, abusers) {
		go sendNoRead(c, &written)
	}
	// The budget never holds more than the abusers' shares, from the
	// start until they are stuck: their writes blocked, as the server's
	// (a pause in the polling below tells it; it only waits, it asserts
	// nothing).
	peak := 0
	waitFor(t, fmt.Sprintf("the abusers stuck, holding %d tokens", stuck), func() bool {
		before := written.Load()
		for range 100 {
			peak = max(peak, len(e.budget))
			time.Sleep(time.Millisecond)
		}
		return written.Load() == before && len(e.budget) == stuck
	})
	if peak > stuck {
		t.Fatalf("budget tokens held by %d abusers: peak %d, want at most their shares' %d", abusers, peak, stuck)
	}

	c := dialN(t, peer, ap, 1)[0]
	const n = 2 << 20
	got := make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		io.CopyN(h, c, n)
		var sum [32]byte
		h.Sum(sum[:0])
		got <- sum
	}()
	want, err := sendAndHash(c, n, 48<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	if sum := <-got; sum != want {
		t.Errorf("echo next to the abusers: sha256 %x, want %x", sum, want)
	}
	// The honest connection is idle again: only the abusers' shares are
	// taken (more would mean an abuser took beyond its share).
	waitFor(t, fmt.Sprintf("tokens back to the abusers' %d", stuck), func() bool { return len(e.budget) == stuck })
}

// TestEchoWriteTimeout: an echo connection whose peer sends and never
// reads is closed once a write waited for the write timeout, and its
// budget tokens come back.
func TestEchoWriteTimeout(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	ap := netip.MustParseAddrPort("192.0.2.1:7106")
	l, err := rx.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	st := new(Stats)
	cfg := Config{EchoMemory: 4 * echoBufSize, WriteTimeout: time.Second}
	e := newEchoServer(&cfg, st)
	serveInBackground(t, l, func() error { return e.serve(l) })
	c := dialN(t, peer, ap, 1)[0]
	go sendNoRead(c, new(atomic.Uint64))
	waitFor(t, "server_write_timeouts counts the connection", func() bool { return counterMap(rx, st)["server_write_timeouts"] == 1 })
	waitFor(t, "its budget tokens back", func() bool { return len(e.budget) == 0 })
	waitFor(t, "its buffers back", func() bool { return counterMap(rx, st)["server_buf_bytes_current"] == 0 })
}
