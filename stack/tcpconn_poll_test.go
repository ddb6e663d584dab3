package stack

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
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

// TestTCPConnTryWrite: TryWrite writes what the send buffer takes without
// waiting, (0, nil) once it is full and the peer does not read, never more
// than it was given, and net.ErrClosed after Close; what it wrote arrives
// in order.
func TestTCPConnTryWrite(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	pc, ac := connectPairOn(t, peer, rx, netip.MustParseAddrPort("192.0.2.1:7201"))
	c := ac.(*TCPConn)
	chunk := make([]byte, 64<<10)
	var sent []byte
	full := false
	for i := 0; i < 4096 && !full; i++ {
		for j := range chunk {
			chunk[j] = byte(i + j)
		}
		n, err := c.TryWrite(chunk)
		if err != nil || n < 0 || n > len(chunk) {
			t.Fatalf("TryWrite %d: got %d, %v", i, n, err)
		}
		sent = append(sent, chunk[:n]...)
		full = n == 0
	}
	if !full {
		t.Fatalf("TryWrite took %d bytes the peer does not read and never reported a full buffer", len(sent))
	}
	got := make([]byte, len(sent))
	pc.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(pc, got); err != nil {
		t.Fatalf("reading %d bytes: %v", len(sent), err)
	}
	if !bytes.Equal(got, sent) {
		t.Fatal("what TryWrite wrote arrived changed")
	}
	c.Close()
	if n, err := c.TryWrite(chunk); n != 0 || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("TryWrite after Close: got %d, %v; want 0, net.ErrClosed", n, err)
	}
}
