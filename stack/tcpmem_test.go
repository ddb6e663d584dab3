package stack

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
)

// counterValue returns the stack's counter name (0 if it has none).
func counterValue(s *Stack, name string) uint64 {
	var v uint64
	s.EachCounter(func(n string, x uint64) {
		if n == name {
			v = x
		}
	})
	return v
}

// TestTCPRcvQueued checks tcp_rcv_queued_bytes_current: the bytes that
// connections whose application does not read hold in their receive
// queues, summed over connections, and back to zero once they are read.
func TestTCPRcvQueued(t *testing.T) {
	const (
		conns = 4
		n     = 100 << 10 // within gVisor's default receive buffer (1 MiB)
	)
	rx, peer := pair(t, driver.Config{})
	l, err := rx.ListenTCP(netip.MustParseAddrPort("192.0.2.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var accepted []net.Conn
	for i := range conns {
		c, err := peer.DialTCP(ctx, netip.MustParseAddrPort("192.0.2.1:9"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := sendAndHash(c, n, 16<<10, uint64(i)); err != nil {
			t.Fatal(err)
		}
		a, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		accepted = append(accepted, a)
	}
	waitCounter := func(want uint64) {
		t.Helper()
		var got uint64
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if got = counterValue(rx, "tcp_rcv_queued_bytes_current"); got == want {
				return
			}
		}
		t.Fatalf("tcp_rcv_queued_bytes_current: got %d, want %d", got, want)
	}
	waitCounter(conns * n)
	buf := make([]byte, n)
	for _, a := range accepted {
		a.SetReadDeadline(time.Now().Add(30 * time.Second))
		for got := 0; got < n; {
			m, err := a.Read(buf[got:])
			if err != nil {
				t.Fatal(err)
			}
			got += m
		}
	}
	waitCounter(0)
}
