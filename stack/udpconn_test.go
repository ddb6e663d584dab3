package stack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"

	"github.com/ustack/ustack/internal/testutil"
)

// udpPair binds a UDP socket on rx at port and one on peer, closed at
// cleanup.
func udpPair(t *testing.T, rx, peer *Stack, port uint16) (r, p *UDPConn) {
	t.Helper()
	rc, err := rx.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), port))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := peer.ListenUDP(netip.MustParseAddrPort("192.0.2.2:0"))
	if err != nil {
		rc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close(); pc.Close() })
	r, p = rc.(*UDPConn), pc.(*UDPConn)
	r.SetDeadline(time.Now().Add(30 * time.Second))
	p.SetDeadline(time.Now().Add(30 * time.Second))
	return r, p
}

// TestUDPConnDatagrams: WriteTo and ReadFrom (and their AddrPort forms)
// carry datagrams with their sender; a datagram longer than the buffer is
// cut to it and the next one is whole.
func TestUDPConnDatagrams(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	r, p := udpPair(t, rx, peer, 7400)
	to := netip.MustParseAddrPort("192.0.2.1:7400")
	if _, err := p.WriteTo([]byte("hello"), net.UDPAddrFromAddrPort(to)); err != nil {
		t.Fatal(err)
	}
	// An IPv4 address in net.ParseIP's 16-byte form, as Go's net takes it.
	if _, err := p.WriteTo(make([]byte, 100), &net.UDPAddr{IP: net.ParseIP("192.0.2.1"), Port: 7400}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteToUDPAddrPort([]byte("third"), to); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	n, from, err := r.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "hello" || from.String() != p.LocalAddr().String() {
		t.Errorf("ReadFrom: %q from %v, %v; want \"hello\" from %v", buf[:n], from, err, p.LocalAddr())
	}
	if n, _, err := r.ReadFrom(buf); err != nil || n != len(buf) {
		t.Errorf("ReadFrom of 100 bytes into 10: %d, %v; want 10, nil", n, err)
	}
	n, ap, err := r.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "third" || ap.Addr() != netip.MustParseAddr("192.0.2.2") {
		t.Errorf("ReadFromUDPAddrPort: %q from %v, %v; want \"third\" from 192.0.2.2", buf[:n], ap, err)
	}
	if r.RemoteAddr() != nil {
		t.Errorf("RemoteAddr of a socket not connected: %v, want nil", r.RemoteAddr())
	}
}

// TestUDPConnConnected: Dial "udp" returns a connected *UDPConn; Write and
// Read exchange datagrams with the peer, WriteTo is refused, and a peer's
// port unreachable fails the next read with ECONNREFUSED.
func TestUDPConnConnected(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	r, _ := udpPair(t, rx, peer, 7401)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := peer.DialContext(ctx, "udp", "192.0.2.1:7401")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, ok := nc.(*UDPConn)
	if !ok {
		t.Fatalf("Dial udp: %T, want *UDPConn", nc)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, from, err := r.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("ReadFrom: %q, %v", buf[:n], err)
	}
	r.WriteTo([]byte("pong"), from)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "pong" {
		t.Errorf("Read: %q, %v; want \"pong\"", buf[:n], err)
	}
	_, err = c.WriteTo([]byte("x"), from)
	wantOpErr(t, "WriteTo on a connected socket", err, "write", net.ErrWriteToConnected)
	_, err = c.WriteToUDPAddrPort([]byte("x"), netip.MustParseAddrPort("192.0.2.1:7401"))
	wantOpErr(t, "WriteToUDPAddrPort on a connected socket", err, "write", net.ErrWriteToConnected)

	refused, err := peer.DialContext(ctx, "udp", "192.0.2.1:9")
	if err != nil {
		t.Fatal(err)
	}
	defer refused.Close()
	refused.SetDeadline(time.Now().Add(30 * time.Second))
	refused.Write([]byte("x"))
	_, err = refused.Read(buf)
	wantOpErr(t, "Read after the port unreachable", err, "read", syscall.ECONNREFUSED)
}

// TestUDPConnBadArguments: wrong address types, nil addresses, addresses
// of a bad length and negative sizes are answered with an error, as Go's
// net answers them, never a panic.
func TestUDPConnBadArguments(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	r, _ := udpPair(t, rx, peer, 7402)
	for _, tc := range []struct {
		name   string
		addr   net.Addr
		target error
	}{
		{"tcp-addr", &net.TCPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 9}, syscall.EINVAL},
		{"nil", nil, syscall.EINVAL},
		{"nil-udp-addr", (*net.UDPAddr)(nil), errMissingAddress},
	} {
		_, err := r.WriteTo([]byte("x"), tc.addr)
		wantOpErr(t, "WriteTo "+tc.name, err, "write", tc.target)
	}
	for _, a := range []*net.UDPAddr{{IP: net.IP{1, 2, 3}, Port: 9}, {IP: net.IPv4(192, 0, 2, 2), Port: 70000}, {IP: net.IPv4(192, 0, 2, 2), Port: -1}} {
		_, err := r.WriteTo([]byte("x"), a)
		var ae *net.AddrError
		if !errors.As(err, &ae) {
			t.Errorf("WriteTo %#v: %v, want a *net.AddrError", a, err)
		}
	}
	_, err := r.WriteToUDPAddrPort([]byte("x"), netip.AddrPort{})
	wantOpErr(t, "WriteToUDPAddrPort(zero)", err, "write", errMissingAddress)
	_, err = r.Write([]byte("x"))
	wantOpErr(t, "Write on a socket not connected", err, "write", syscall.EDESTADDRREQ)
	_, err = r.WriteTo(make([]byte, 70000), net.UDPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.2:9")))
	wantOpErr(t, "WriteTo of 70000 bytes", err, "write", syscall.EMSGSIZE)
	wantOpErr(t, "SetReadBuffer(-1)", r.SetReadBuffer(-1), "set", syscall.EINVAL)
	wantOpErr(t, "SetWriteBuffer(-1)", r.SetWriteBuffer(-1), "set", syscall.EINVAL)
	if err := r.SetReadBuffer(1 << 20); err != nil {
		t.Errorf("SetReadBuffer(1 MiB): %v", err)
	}
	pr, err := peer.ListenUDP(netip.MustParseAddrPort("192.0.2.2:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	pr.WriteTo([]byte("datagram"), r.LocalAddr())
	if n, err := r.Read(nil); n != 0 || err != nil {
		t.Errorf("Read(nil) of a datagram: %d, %v; want 0, nil (the datagram dropped)", n, err)
	}
	_, err = peer.DialContext(context.Background(), "udp", "")
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "dial" {
		t.Errorf("Dial udp \"\": %v, want an OpError of dial", err)
	}
	_, err = rx.dialUDPConn("udp", netip.AddrPort{})
	wantOpErr(t, "dialUDPConn(zero)", err, "dial", errMissingAddress)
	_, err = rx.ListenUDP(netip.MustParseAddrPort("192.0.2.77:0"))
	wantOpErr(t, "ListenUDP on an address not the stack's", err, "listen", syscall.EADDRNOTAVAIL)
}

// TestUDPConnDeadlineAndClose: a read deadline fails the read with
// os.ErrDeadlineExceeded; a read blocked at Close and every call after it
// fail with net.ErrClosed.
func TestUDPConnDeadlineAndClose(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	r, _ := udpPair(t, rx, peer, 7403)
	buf := make([]byte, 8)
	r.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, _, err := r.ReadFrom(buf)
	wantOpErr(t, "ReadFrom as the deadline passes", err, "read", os.ErrDeadlineExceeded)
	r.SetWriteDeadline(time.Now().Add(-time.Second))
	_, err = r.WriteToUDPAddrPort(buf, netip.MustParseAddrPort("192.0.2.2:9"))
	wantOpErr(t, "WriteTo past the deadline", err, "write", os.ErrDeadlineExceeded)
	r.SetDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, _, err := r.ReadFromUDPAddrPort(buf)
		done <- err
	}()
	time.AfterFunc(20*time.Millisecond, func() { r.Close() })
	select {
	case err := <-done:
		wantOpErr(t, "ReadFrom blocked at Close", err, "read", net.ErrClosed)
	case <-time.After(30 * time.Second):
		t.Fatal("a ReadFrom blocked at Close is still blocked 30 s later")
	}
	_, _, err = r.ReadFrom(buf)
	wantOpErr(t, "ReadFrom after Close", err, "read", net.ErrClosed)
	_, err = r.WriteTo(buf, net.UDPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.2:9")))
	wantOpErr(t, "WriteTo after Close", err, "write", net.ErrClosed)
	wantOpErr(t, "Close again", r.Close(), "close", net.ErrClosed)
	wantOpErr(t, "SetDeadline after Close", r.SetDeadline(time.Now()), "set", net.ErrClosed)
}

// TestSocketAllocs pins the reads of the socket types at zero heap
// allocations in steady state: TCP's Read and UDP's ReadFromUDPAddrPort,
// of what is queued. (Their writes allocate in gVisor's send path, a
// packet list per segment, which is not theirs.)
func TestSocketAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts need a build without -race and coverage")
	}
	const runs, size = 200, 512
	rx, peer := pairConfig(t, Config{})
	d, a := connPair(t, rx, peer, 7404)
	d.SetDeadline(time.Now().Add(time.Minute))
	a.SetDeadline(time.Now().Add(time.Minute))
	buf := make([]byte, size)
	if _, err := d.Write(make([]byte, (runs+2)*size)); err != nil {
		t.Fatal(err)
	}
	read := func() {
		if _, err := io.ReadFull(a, buf); err != nil {
			t.Fatal(err)
		}
	}
	read() // the first wait makes the read's waiter entry
	// Delivery allocates (gVisor's segment processing): wait until it is
	// done, so that only the reads are counted.
	waitFor(t, "the TCP payload queued", func() bool {
		n, _ := a.ep.GetSockOptInt(tcpip.ReceiveQueueSizeOption)
		return n >= (runs+1)*size
	})
	if allocs := testing.AllocsPerRun(runs, read); allocs != 0 {
		t.Errorf("TCP Read: got %v allocations a run, want 0", allocs)
	}
	r, p := udpPair(t, rx, peer, 7405)
	if err := r.SetReadBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	to := netip.MustParseAddrPort("192.0.2.1:7405")
	for range runs + 2 {
		if _, err := p.WriteToUDPAddrPort(buf, to); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() {
		if _, _, err := r.ReadFromUDPAddrPort(buf); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the datagrams queued", func() bool {
		return rx.ip.Stats().UDP.PacketsReceived.Value() >= runs+2
	})
	recv()
	if allocs := testing.AllocsPerRun(runs, recv); allocs != 0 {
		t.Errorf("UDP ReadFromUDPAddrPort: got %v allocations a run, want 0", allocs)
	}
}

// waitFor waits until cond holds, failing the test after 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 30 s", what)
		}
	}
}
