package stack

import (
	"context"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
)

// TestTCPConnPoll: NotifyReadable wakes when data or the peer's close
// arrives, Readable tells, and TryRead takes what is queued without
// blocking, then io.EOF.
func TestTCPConnPoll(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	ap := netip.MustParseAddrPort("192.0.2.1:7200")
	l, err := rx.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pc, err := peer.DialTCP(ctx, ap)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ac, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	c := ac.(*TCPConn)
	ready, stop := c.NotifyReadable()
	defer stop()
	wait := func(what string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for !c.Readable() {
			select {
			case <-ready:
			case <-timeout:
				t.Fatalf("%s: not readable within 30s", what)
			}
		}
	}
	buf := make([]byte, 16)
	if n, err := c.TryRead(buf); n != 0 || err != nil {
		t.Fatalf("TryRead with nothing queued: got %d, %v; want 0, nil", n, err)
	}
	if _, err := pc.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	wait("data")
	if n, err := c.TryRead(buf); n != 3 || err != nil || string(buf[:n]) != "abc" {
		t.Fatalf("TryRead: got %q, %v; want \"abc\", nil", buf[:n], err)
	}
	if n, err := c.TryRead(buf); n != 0 || err != nil {
		t.Fatalf("TryRead after the data: got %d, %v; want 0, nil", n, err)
	}
	pc.Close()
	wait("the peer's close")
	if n, err := c.TryRead(buf); n != 0 || err != io.EOF {
		t.Fatalf("TryRead after the peer closed: got %d, %v; want 0, EOF", n, err)
	}
	if got := c.Retransmits(); got != 0 {
		t.Errorf("Retransmits on a lossless wire: got %d, want 0", got)
	}
}
