package serve

import (
	"context"
	"crypto/sha256"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack/stacktest"
)

func TestEchoAndUDPMem(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	l, err := rx.ListenTCP(netip.MustParseAddrPort("0.0.0.0:7"))
	if err != nil {
		t.Fatal(err)
	}
	// Echo, not io.Copy(c, c): an echo that stops reading while its
	// write waits for an acknowledgement deadlocks against gVisor, which
	// drops the ACK of a data segment that meets a zero receive window.
	serveInBackground(t, l, func() error { return Echo(l) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := peer.DialTCP(ctx, netip.MustParseAddrPort("192.0.2.1:7"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	const n = 4 << 20
	got := make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		io.CopyN(h, c, n)
		var sum [32]byte
		h.Sum(sum[:0])
		got <- sum
	}()
	want, err := sendAndHash(c, n, 10000, 2)
	if err != nil {
		t.Fatal(err)
	}
	if sum := <-got; sum != want {
		t.Fatalf("echoed sha256: got %x, want %x", sum, want)
	}

	u, err := rx.ListenUDP(netip.MustParseAddrPort("192.0.2.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	pu, err := peer.ListenUDP(netip.MustParseAddrPort("192.0.2.2:5555"))
	if err != nil {
		t.Fatal(err)
	}
	defer pu.Close()
	dst := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 9}
	buf := make([]byte, 2000)
	for _, size := range []int{64, 1400} {
		msg := make([]byte, size)
		for i := range msg {
			msg[i] = byte(i + size)
		}
		if _, err := pu.WriteTo(msg, dst); err != nil {
			t.Fatal(err)
		}
		u.SetReadDeadline(time.Now().Add(10 * time.Second))
		m, _, err := u.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		if string(buf[:m]) != string(msg) {
			t.Fatalf("udp %d bytes: got %d bytes %x..., want %x...", size, m, buf[:min(m, 8)], msg[:8])
		}
	}
}

func TestClosedSocketsReportErrClosed(t *testing.T) {
	rx, _ := stacktest.Pair(t, driver.Config{})
	l, err := rx.ListenTCP(netip.MustParseAddrPort("192.0.2.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Discard(l, nil) }()
	l.Close()
	if err := <-done; err != nil {
		t.Errorf("Discard after Close: got %v, want nil", err)
	}
	u, err := rx.ListenUDP(netip.MustParseAddrPort("192.0.2.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- UDPEcho(u) }()
	time.Sleep(10 * time.Millisecond)
	u.Close()
	if err := <-done; err != nil {
		t.Errorf("UDPEcho after Close: got %v, want nil", err)
	}
}

// TestEchoReaderWrites: in request/response each request is echoed by
// the goroutine that read it (echo_reader_writes, no hand-off to the
// writer); a peer that sends without reading fills the send buffer, and
// the rest goes through the writer (echo_writer_writes), every byte in
// order.
func TestEchoReaderWrites(t *testing.T) {
	st := &Stats{}
	c := dialEcho(t, Config{Stats: st})
	const exchanges = 200
	req, resp := make([]byte, 64), make([]byte, 64)
	for i := range exchanges {
		req[0] = byte(i)
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, resp); err != nil || resp[0] != byte(i) {
			t.Fatalf("exchange %d: %x, %v", i, resp[0], err)
		}
	}
	ctr := stacktest.Counters(st.EachCounter)
	if ctr["echo_reader_writes"] != exchanges || ctr["echo_writer_writes"] != 0 {
		t.Errorf("request/response: echo_reader_writes %d, echo_writer_writes %d; want %d and 0", ctr["echo_reader_writes"], ctr["echo_writer_writes"], exchanges)
	}
	// 8 MiB, read only once the echo had to hand some to its writer
	// (or all of it was sent).
	const n = 8 << 20
	sent := make(chan struct{})
	got := make(chan []byte, 1)
	go func() {
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if stacktest.Counters(st.EachCounter)["echo_writer_writes"] > 0 || isDone(sent) {
				break
			}
		}
		h := sha256.New()
		io.CopyN(h, c, n)
		got <- h.Sum(nil)
	}()
	want, err := sendAndHash(c, n, 65536, 3)
	close(sent)
	if err != nil {
		t.Fatal(err)
	}
	if sum := <-got; string(sum) != string(want[:]) {
		t.Fatalf("echoed sha256: got %x, want %x", sum, want)
	}
	if ctr := stacktest.Counters(st.EachCounter); ctr["echo_writer_writes"] == 0 {
		t.Errorf("bulk without reading: echo_writer_writes 0, want the writer to take what the send buffer did not")
	}
}

func isDone(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// dialEcho serves cfg's Echo on a stack pair's receiver, port 7, and
// returns a connection to it from the peer, with a 30 s deadline.
func dialEcho(t *testing.T, cfg Config) net.Conn {
	t.Helper()
	rx, peer := stacktest.Pair(t, driver.Config{})
	l, err := rx.ListenTCP(netip.MustParseAddrPort("0.0.0.0:7"))
	if err != nil {
		t.Fatal(err)
	}
	serveInBackground(t, l, func() error { return cfg.Echo(l) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := peer.DialTCP(ctx, netip.MustParseAddrPort("192.0.2.1:7"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}
