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
