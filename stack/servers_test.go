package stack

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
)

// TestServeConnLimit: a server at its connection limit closes the next
// connection at once and counts it; once a connection ends, it accepts
// again.
func TestServeConnLimit(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	ap := netip.MustParseAddrPort("192.0.2.1:7100")
	l, err := rx.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := 0
	serveInBackground(t, l, func() error {
		return serve(l, 2, func(c net.Conn) {
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
	if got := counterMap(rx)["server_conns_refused"]; got != 1 {
		t.Errorf("server_conns_refused: got %d, want 1", got)
	}
	a.Close()
	waitFor(t, "the closed connection ends", func() bool { return counterMap(rx)["tcp_established"] < 4 })
	d := dial()
	defer d.Close()
	handlers(3)
	if got := counterMap(rx)["server_conns_refused"]; got != 1 {
		t.Errorf("server_conns_refused after a slot freed: got %d, want 1", got)
	}
}

// TestEchoBudget echoes two connections through a server whose shared
// budget is far smaller than what they send before reading: every byte
// comes back, the budget is never exceeded, and an idle connection gives
// its spare buffers back.
func TestEchoBudget(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	ap := netip.MustParseAddrPort("192.0.2.1:7101")
	l, err := rx.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	const budget = 6 // buffers beyond each connection's first, for both
	e := newEchoServer(budget * echoBufSize)
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
