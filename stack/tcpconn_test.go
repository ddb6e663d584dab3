package stack

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/nettest"
	"gvisor.dev/gvisor/pkg/tcpip"
)

// connPair dials from peer to a listener of rx's on port and returns the
// dialed end and the accepted one, closed at cleanup.
func connPair(t testing.TB, rx, peer *Stack, port uint16) (dialed, accepted *TCPConn) {
	t.Helper()
	addr := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), port)
	l, err := rx.ListenTCP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d, a, err := dialAccept(peer, l.(*TCPListener), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(); a.Close() })
	return d, a
}

// dialAccept dials addr from peer and accepts the connection on l.
func dialAccept(peer *Stack, l *TCPListener, addr netip.AddrPort) (dialed, accepted *TCPConn, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := peer.DialTCP(ctx, addr)
	if err != nil {
		return nil, nil, err
	}
	d, ok := c.(*TCPConn)
	if !ok {
		c.Close()
		return nil, nil, errors.New("DialTCP did not return a *TCPConn")
	}
	l.SetDeadline(time.Now().Add(30 * time.Second))
	a, err := l.AcceptTCP()
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	return d, a, nil
}

// TestTCPConnNettest runs x/net's net.Conn conformance suite on a dialed
// connection and on an accepted one.
func TestTCPConnNettest(t *testing.T) {
	for _, dialedFirst := range []bool{true, false} {
		name := "accepted"
		if dialedFirst {
			name = "dialed"
		}
		t.Run(name, func(t *testing.T) {
			rx, peer := pairConfig(t, Config{})
			addr := netip.MustParseAddrPort("192.0.2.1:7300")
			l, err := rx.ListenTCP(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
				d, a, err := dialAccept(peer, l.(*TCPListener), addr)
				if err != nil {
					return nil, nil, nil, err
				}
				stop = func() { d.Close(); a.Close() }
				if dialedFirst {
					return d, a, stop, nil
				}
				return a, d, stop, nil
			})
		})
	}
}

// wantOpErr fails the test unless err is a *net.OpError of op wrapping
// target (errors.Is).
func wantOpErr(t *testing.T, what string, err error, op string, target error) {
	t.Helper()
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != op || !errors.Is(err, target) {
		t.Errorf("%s: got %v (%T), want a *net.OpError of %q wrapping %v", what, err, err, op, target)
	}
}

// TestTCPConnSetLingerZero: Close after SetLinger(0) resets the
// connection; the peer's read fails with ECONNRESET, then returns io.EOF,
// and its write with EPIPE, as the kernel's.
func TestTCPConnSetLingerZero(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	d, a := connPair(t, rx, peer, 7301)
	if err := a.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	a.Close()
	d.SetDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 8)
	_, err := d.Read(buf)
	wantOpErr(t, "read after the peer's RST", err, "read", syscall.ECONNRESET)
	var se *os.SyscallError
	if !errors.As(err, &se) || se.Syscall != "read" {
		t.Errorf("read after the peer's RST: got %v, want an *os.SyscallError of read", err)
	}
	if _, err := d.Read(buf); err != io.EOF {
		t.Errorf("second read after the RST: got %v, want io.EOF", err)
	}
	_, err = d.Write([]byte("x"))
	wantOpErr(t, "write after the RST", err, "write", syscall.EPIPE)
}

// TestTCPConnSetLingerWaits: after SetLinger(sec > 0), Close blocks until
// the peer has acknowledged every byte and the FIN, as Linux's close with
// SO_LINGER. The stream is larger than the peer's receive buffer but fits
// the sender's, so Write returns at once; the peer reads only once Close
// was called, so Close cannot return before the peer has read all but a
// receive buffer's worth. The peer then reads every byte and io.EOF.
func TestTCPConnSetLingerWaits(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	d, a := connPair(t, rx, peer, 7303)
	const n, rcvbuf = 2 << 20, 64 << 10
	if err := d.SetReadBuffer(rcvbuf); err != nil {
		t.Fatal(err)
	}
	if err := a.SetWriteBuffer(4 * n); err != nil {
		t.Fatal(err)
	}
	if err := a.SetLinger(30); err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("linger!!"), n/8)
	a.SetWriteDeadline(time.Now().Add(30 * time.Second))
	if _, err := a.Write(msg); err != nil {
		t.Fatalf("write (queued in the send buffer): %v", err)
	}
	var read atomic.Int64
	closing := make(chan struct{})
	closed := make(chan int64, 1)
	go func() {
		close(closing)
		if err := a.Close(); err != nil {
			t.Errorf("Close with linger: %v", err)
		}
		closed <- read.Load()
	}()
	<-closing
	d.SetReadDeadline(time.Now().Add(60 * time.Second))
	buf := make([]byte, 16<<10)
	var got []byte
	for {
		m, err := d.Read(buf)
		got = append(got, buf[:m]...)
		read.Add(int64(m))
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("peer read after %d bytes: %v", len(got), err)
		}
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("peer read %d bytes, want the %d written", len(got), n)
	}
	var atClose int64
	select {
	case atClose = <-closed:
	case <-time.After(60 * time.Second):
		t.Fatal("Close with linger did not return after the peer read everything")
	}
	if atClose < n-4*rcvbuf {
		t.Errorf("Close with linger returned when the peer had read %d of %d bytes: want it to wait for the ACK of the FIN", atClose, n)
	}
}

// TestTCPConnSetLingerTimeout: a peer that never reads holds Close with
// SetLinger(1) for about a second, no more: then Close returns nil, as
// Linux's close does when the linger time is up.
func TestTCPConnSetLingerTimeout(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	d, a := connPair(t, rx, peer, 7304)
	defer d.Close()
	if err := a.SetLinger(1); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 16<<20)
	a.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
	a.Write(big) // fills the peer's window, then times out
	done := make(chan error, 1)
	go func() { done <- a.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close with SetLinger(1) still blocked after 30 s")
	}
}

// TestTCPConnOptions: the option setters reach gVisor's socket options,
// and refuse what the kernel refuses.
func TestTCPConnOptions(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	d, a := connPair(t, rx, peer, 7302)
	// Go's net defaults, on dialed and accepted connections alike:
	// TCP_NODELAY, keep-alive after 15 s idle, every 15 s, 9 probes, no
	// linger.
	for _, c := range []*TCPConn{d, a} {
		ops := c.ep.SocketOptions()
		var idle tcpip.KeepaliveIdleOption
		var intvl tcpip.KeepaliveIntervalOption
		c.ep.GetSockOpt(&idle)
		c.ep.GetSockOpt(&intvl)
		cnt, _ := c.ep.GetSockOptInt(tcpip.KeepaliveCountOption)
		if ops.GetDelayOption() || !ops.GetKeepAlive() || ops.GetLinger().Enabled ||
			time.Duration(idle) != 15*time.Second || time.Duration(intvl) != 15*time.Second || cnt != 9 {
			t.Errorf("defaults: delay %v, keepalive %v (%v, %v, %d), linger %+v; want Go's: TCP_NODELAY, keep-alive (15s, 15s, 9), no linger",
				ops.GetDelayOption(), ops.GetKeepAlive(), time.Duration(idle), time.Duration(intvl), cnt, ops.GetLinger())
		}
	}
	ops := d.ep.SocketOptions()
	if err := d.SetKeepAlive(false); err != nil || ops.GetKeepAlive() {
		t.Errorf("SetKeepAlive(false): %v, keepalive %v", err, ops.GetKeepAlive())
	}
	if err := d.SetNoDelay(false); err != nil || !ops.GetDelayOption() {
		t.Errorf("SetNoDelay(false): %v, delay %v; want Nagle on", err, ops.GetDelayOption())
	}
	if err := d.SetNoDelay(true); err != nil || ops.GetDelayOption() {
		t.Errorf("SetNoDelay(true): %v, delay %v; want Nagle off", err, ops.GetDelayOption())
	}
	if err := d.SetKeepAlive(true); err != nil || !ops.GetKeepAlive() {
		t.Errorf("SetKeepAlive(true): %v, keepalive %v", err, ops.GetKeepAlive())
	}
	idle := func() time.Duration {
		var v tcpip.KeepaliveIdleOption
		if e := d.ep.GetSockOpt(&v); e != nil {
			t.Fatal(e)
		}
		return time.Duration(v)
	}
	for _, tc := range []struct {
		set, want time.Duration
	}{
		{30 * time.Second, 30 * time.Second},
		{1500 * time.Millisecond, 2 * time.Second}, // rounded up, as Go's
		{0, 15 * time.Second},                      // Go's default
		{-1, 15 * time.Second},                     // unchanged
	} {
		if err := d.SetKeepAlivePeriod(tc.set); err != nil || idle() != tc.want {
			t.Errorf("SetKeepAlivePeriod(%v): %v, idle %v; want %v", tc.set, err, idle(), tc.want)
		}
	}
	wantOpErr(t, "SetKeepAlivePeriod(40000 s)", d.SetKeepAlivePeriod(40000*time.Second), "set", syscall.EINVAL)
	if err := d.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 3 * time.Second, Count: 4}); err != nil {
		t.Fatal(err)
	}
	var intvl tcpip.KeepaliveIntervalOption
	d.ep.GetSockOpt(&intvl)
	if cnt, _ := d.ep.GetSockOptInt(tcpip.KeepaliveCountOption); idle() != 5*time.Second || time.Duration(intvl) != 3*time.Second || cnt != 4 {
		t.Errorf("SetKeepAliveConfig: idle %v, interval %v, count %d; want 5s, 3s, 4", idle(), time.Duration(intvl), cnt)
	}
	wantOpErr(t, "SetKeepAliveConfig(Count 200)", d.SetKeepAliveConfig(net.KeepAliveConfig{Count: 200}), "set", syscall.EINVAL)
	if err := d.SetLinger(5); err != nil || ops.GetLinger() != (tcpip.LingerOption{Enabled: true, Timeout: 5 * time.Second}) {
		t.Errorf("SetLinger(5): %v, %+v", err, ops.GetLinger())
	}
	if err := d.SetLinger(-1); err != nil || ops.GetLinger().Enabled {
		t.Errorf("SetLinger(-1): %v, %+v; want linger off", err, ops.GetLinger())
	}
	before := ops.GetReceiveBufferSize()
	if err := d.SetReadBuffer(int(before) * 2); err != nil || ops.GetReceiveBufferSize() == before {
		t.Errorf("SetReadBuffer(%d): %v, size %d; want changed", before*2, err, ops.GetReceiveBufferSize())
	}
	sndBefore := ops.GetSendBufferSize()
	if err := d.SetWriteBuffer(int(sndBefore) * 2); err != nil || ops.GetSendBufferSize() == sndBefore {
		t.Errorf("SetWriteBuffer(%d): %v, size %d; want changed", sndBefore*2, err, ops.GetSendBufferSize())
	}
	wantOpErr(t, "SetReadBuffer(-1)", d.SetReadBuffer(-1), "set", syscall.EINVAL)
	wantOpErr(t, "SetWriteBuffer(-1)", d.SetWriteBuffer(-1), "set", syscall.EINVAL)
}

// TestTCPConnCloseWrite: after CloseWrite the peer reads what was written
// then io.EOF, while this side still reads what the peer sends; its own
// writes fail with EPIPE. CloseRead makes reads return io.EOF.
func TestTCPConnCloseWrite(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	d, a := connPair(t, rx, peer, 7303)
	d.SetDeadline(time.Now().Add(30 * time.Second))
	a.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := d.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	if err := d.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(a)
	if err != nil || string(got) != "last" {
		t.Errorf("peer's read after CloseWrite: %q, %v; want \"last\", then io.EOF", got, err)
	}
	if _, err := a.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(d, buf); err != nil || string(buf) != "reply" {
		t.Errorf("read after CloseWrite: %q, %v; want \"reply\"", buf, err)
	}
	_, err = d.Write([]byte("x"))
	wantOpErr(t, "write after CloseWrite", err, "write", syscall.EPIPE)
	if err := d.CloseRead(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Read(buf); err != io.EOF {
		t.Errorf("read after CloseRead: got %v, want io.EOF", err)
	}
}

// TestTCPConnLocalClose: reads blocked when the connection is closed (one
// waiting for data, one for the other's turn), and every call after, fail
// with net.ErrClosed; the addresses stay.
func TestTCPConnLocalClose(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	_, a := connPair(t, rx, peer, 7304)
	la, ra := a.LocalAddr().String(), a.RemoteAddr().String()
	done := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 8))
		done <- err
	}()
	viewsDone := make(chan error, 1)
	go func() {
		_, _, err := a.ReadViews(nil, 100)
		viewsDone <- err
	}()
	time.AfterFunc(20*time.Millisecond, func() { a.Close() })
	for _, ch := range []chan error{done, viewsDone} {
		select {
		case err := <-ch:
			wantOpErr(t, "read blocked at Close", err, "read", net.ErrClosed)
		case <-time.After(30 * time.Second):
			t.Fatal("a read blocked at Close is still blocked 30 s later")
		}
	}
	_, err := a.Read(make([]byte, 8))
	wantOpErr(t, "Read after Close", err, "read", net.ErrClosed)
	_, err = a.Read(nil)
	wantOpErr(t, "empty Read after Close", err, "read", net.ErrClosed)
	_, err = a.Write([]byte("x"))
	wantOpErr(t, "Write after Close", err, "write", net.ErrClosed)
	_, _, err = a.ReadViews(nil, 100)
	wantOpErr(t, "ReadViews after Close", err, "read", net.ErrClosed)
	_, err = a.TryRead(make([]byte, 8))
	wantOpErr(t, "TryRead after Close", err, "read", net.ErrClosed)
	wantOpErr(t, "Close again", a.Close(), "close", net.ErrClosed)
	wantOpErr(t, "CloseWrite after Close", a.CloseWrite(), "close", net.ErrClosed)
	wantOpErr(t, "SetDeadline after Close", a.SetDeadline(time.Now()), "set", net.ErrClosed)
	wantOpErr(t, "SetNoDelay after Close", a.SetNoDelay(true), "set", net.ErrClosed)
	wantOpErr(t, "SetLinger after Close", a.SetLinger(0), "set", net.ErrClosed)
	if a.LocalAddr().String() != la || a.RemoteAddr().String() != ra {
		t.Errorf("addresses after Close: %v %v, want %s %s", a.LocalAddr(), a.RemoteAddr(), la, ra)
	}
}

// TestTCPConnPeerFIN: the peer's FIN is io.EOF itself, after the data.
func TestTCPConnPeerFIN(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	d, a := connPair(t, rx, peer, 7305)
	d.Write([]byte("bye"))
	d.Close()
	a.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 3)
	if _, err := io.ReadFull(a, buf); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Read(buf); n != 0 || err != io.EOF {
		t.Errorf("Read at the peer's FIN: %d, %v (%T); want 0, io.EOF itself", n, err, err)
	}
}

// TestTCPConnDeadlines: a read deadline in the past, one that passes while
// a read waits, and a write deadline passing while the peer does not read,
// fail with os.ErrDeadlineExceeded (Timeout true); a later deadline makes
// the calls work again.
func TestTCPConnDeadlines(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	d, a := connPair(t, rx, peer, 7306)
	buf := make([]byte, 8)
	a.SetReadDeadline(time.Now().Add(-time.Second))
	_, err := a.Read(buf)
	wantOpErr(t, "Read past the deadline", err, "read", os.ErrDeadlineExceeded)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("Read past the deadline: %v, want Timeout() true", err)
	}
	a.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err = a.Read(buf)
	wantOpErr(t, "Read as the deadline passes", err, "read", os.ErrDeadlineExceeded)
	_, _, err = a.ReadViews(nil, 8)
	wantOpErr(t, "ReadViews past the deadline", err, "read", os.ErrDeadlineExceeded)
	a.SetReadDeadline(time.Now().Add(30 * time.Second))
	d.Write([]byte("ok"))
	if n, err := a.Read(buf); err != nil || string(buf[:n]) != "ok" {
		t.Errorf("Read after a later deadline: %q, %v", buf[:n], err)
	}
	d.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	big := make([]byte, 1<<20)
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatal("1000 writes of 1 MB to a peer that does not read did not time out")
		}
		if _, err = d.Write(big); err != nil {
			break
		}
	}
	wantOpErr(t, "Write as the deadline passes", err, "write", os.ErrDeadlineExceeded)
}

// TestTCPListenerDeadline: Accept times out at the listener's deadline,
// also when it passes during the wait, and works again without one.
func TestTCPListenerDeadline(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	addr := netip.MustParseAddrPort("192.0.2.1:7307")
	ln, err := rx.ListenTCP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := ln.(*TCPListener)
	l.SetDeadline(time.Now().Add(-time.Second))
	_, err = l.Accept()
	wantOpErr(t, "Accept past the deadline", err, "accept", os.ErrDeadlineExceeded)
	l.SetDeadline(time.Now().Add(20 * time.Millisecond))
	_, err = l.Accept()
	wantOpErr(t, "Accept as the deadline passes", err, "accept", os.ErrDeadlineExceeded)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("Accept at the deadline: %v, want Timeout() true", err)
	}
	l.SetDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := peer.DialTCP(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := l.Accept()
	if err != nil {
		t.Fatalf("Accept without a deadline: %v", err)
	}
	a.Close()
}

// TestTCPListenerClose: Accept blocked at Close and Accept after it fail
// with net.ErrClosed, as does a second Close; Addr stays.
func TestTCPListenerClose(t *testing.T) {
	rx, _ := pairConfig(t, Config{})
	ln, err := rx.ListenTCP(netip.MustParseAddrPort("192.0.2.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	l := ln.(*TCPListener)
	addr := l.Addr().(*net.TCPAddr)
	if addr.Port == 0 || addr.IP.String() != "192.0.2.1" {
		t.Errorf("Addr: %v, want 192.0.2.1 and the port chosen", addr)
	}
	time.AfterFunc(20*time.Millisecond, func() { l.Close() })
	_, err = l.Accept()
	wantOpErr(t, "Accept blocked at Close", err, "accept", net.ErrClosed)
	_, err = l.AcceptTCP()
	wantOpErr(t, "AcceptTCP after Close", err, "accept", net.ErrClosed)
	wantOpErr(t, "Close again", l.Close(), "close", net.ErrClosed)
	wantOpErr(t, "SetDeadline after Close", l.SetDeadline(time.Now()), "set", net.ErrClosed)
	if l.Addr().String() != addr.String() {
		t.Errorf("Addr after Close: %v, want %v", l.Addr(), addr)
	}
	any, err := rx.ListenTCP(netip.AddrPortFrom(netip.IPv6Unspecified(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer any.Close()
	if ip := any.Addr().(*net.TCPAddr).IP; !ip.Equal(net.IPv6unspecified) {
		t.Errorf("Addr of a listener on [::]: IP %v, want ::", ip)
	}
}

// TestDialTCPErrors: failed dials are *net.OpError of "dial" with the
// kernel's errno, at once where the kernel fails at once.
func TestDialTCPErrors(t *testing.T) {
	rx, _ := pairConfig(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cancelled, cancel2 := context.WithCancel(ctx)
	cancel2()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		addr   netip.AddrPort
		target error
	}{
		{"refused", ctx, netip.MustParseAddrPort("192.0.2.2:9"), syscall.ECONNREFUSED},
		{"refused/v6", ctx, netip.MustParseAddrPort("[2001:db8::2]:9"), syscall.ECONNREFUSED},
		{"no-route", ctx, netip.MustParseAddrPort("198.51.100.1:80"), syscall.ENETUNREACH},
		{"multicast", ctx, netip.MustParseAddrPort("224.0.0.1:80"), syscall.ENETUNREACH},
		{"multicast/v6", ctx, netip.MustParseAddrPort("[ff02::1]:80"), syscall.ENETUNREACH},
		{"limited-broadcast", ctx, netip.MustParseAddrPort("255.255.255.255:80"), syscall.ENETUNREACH},
		{"subnet-broadcast", ctx, netip.MustParseAddrPort("192.0.2.255:80"), syscall.ENETUNREACH},
		{"unspecified-is-loopback", ctx, netip.MustParseAddrPort("0.0.0.0:9"), syscall.ECONNREFUSED},
		{"cancelled", cancelled, netip.MustParseAddrPort("192.0.2.2:9"), context.Canceled},
		{"zero", ctx, netip.AddrPort{}, errMissingAddress},
		{"nil-context", nil, netip.MustParseAddrPort("192.0.2.2:9"), errNilContext},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := rx.DialTCP(tc.ctx, tc.addr)
			if c != nil {
				t.Errorf("DialTCP returned a connection with error %v", err)
			}
			wantOpErr(t, "DialTCP", err, "dial", tc.target)
			var oe *net.OpError
			if errors.As(err, &oe) && (oe.Net != "tcp" || oe.Source != nil) {
				t.Errorf("OpError: Net %q, Source %v; want tcp, nil", oe.Net, oe.Source)
			}
		})
	}
	t.Run("timeout", func(t *testing.T) {
		// Nobody answers ARP for .99: the context's deadline comes first.
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := rx.DialTCP(short, netip.MustParseAddrPort("192.0.2.99:80"))
		wantOpErr(t, "DialTCP to a silent address", err, "dial", context.DeadlineExceeded)
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("DialTCP past its deadline: %v, want os.ErrDeadlineExceeded too, Timeout() true", err)
		}
	})
	t.Run("network-name", func(t *testing.T) {
		_, err := rx.DialContext(ctx, "tcp4", "192.0.2.2:9")
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Net != "tcp4" || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("Dial tcp4: %v, want an OpError of tcp4 wrapping ECONNREFUSED", err)
		}
	})
}

// TestListenTCPErrors: a port in use is EADDRINUSE, an address the stack
// does not own EADDRNOTAVAIL, as the kernel's bind.
func TestListenTCPErrors(t *testing.T) {
	rx, _ := pairConfig(t, Config{})
	l, err := rx.ListenTCP(netip.MustParseAddrPort("192.0.2.1:7308"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = rx.ListenTCP(netip.MustParseAddrPort("192.0.2.1:7308"))
	wantOpErr(t, "ListenTCP on a port in use", err, "listen", syscall.EADDRINUSE)
	_, err = rx.ListenTCP(netip.MustParseAddrPort("192.0.2.77:7308"))
	wantOpErr(t, "ListenTCP on an address not the stack's", err, "listen", syscall.EADDRNOTAVAIL)
}

// TestTCPConnBadArguments: nil and empty buffers and odd values are
// answered, not a panic.
func TestTCPConnBadArguments(t *testing.T) {
	rx, peer := pairConfig(t, Config{})
	d, a := connPair(t, rx, peer, 7309)
	if n, err := d.Write(nil); n != 0 || err != nil {
		t.Errorf("Write(nil): %d, %v; want 0, nil", n, err)
	}
	if n, err := a.Read(nil); n != 0 || err != nil {
		t.Errorf("Read(nil): %d, %v; want 0, nil", n, err)
	}
	if n, err := a.TryRead(nil); n != 0 || err != nil {
		t.Errorf("TryRead(nil): %d, %v; want 0, nil", n, err)
	}
	d.Write([]byte("queued"))
	a.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := a.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if n, err := a.TryRead(nil); n != 0 || err != nil {
		t.Errorf("TryRead(nil) with data queued: %d, %v; want 0, nil", n, err)
	}
	if n, err := a.Read(nil); n != 0 || err != nil {
		t.Errorf("Read(nil) with data queued: %d, %v; want 0, nil", n, err)
	}
	if vs, n, err := a.ReadViews(nil, -1); len(vs) != 0 || n != 0 || err != nil {
		t.Errorf("ReadViews(nil, -1): %d views, %d, %v", len(vs), n, err)
	}
	if err := d.SetLinger(1 << 62); err != nil {
		t.Errorf("SetLinger(huge): %v", err)
	}
	if err := d.SetKeepAlivePeriod(-time.Hour); err != nil {
		t.Errorf("SetKeepAlivePeriod(negative): %v", err)
	}
	if err := d.SetKeepAliveConfig(net.KeepAliveConfig{Idle: -1, Interval: -1, Count: -1}); err != nil {
		t.Errorf("SetKeepAliveConfig(negative): %v", err)
	}
	d.SetDeadline(time.Unix(0, 0))
	if _, err := d.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Write with a deadline in 1970: %v", err)
	}
}
