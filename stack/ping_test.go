package stack_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/stacktest"
	"golang.org/x/net/icmp"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// pingWait bounds every wait for a reply: a failure, never a pace.
const pingWait = 10 * time.Second

// echoRequest returns an echo request of seq carrying body, of IPv6 if v6,
// whose identifier and checksum are junk (junkID and 0xbeef): the stack
// must overwrite both, as a ping socket does.
func echoRequest(v6 bool, junkID, seq uint16, body []byte) []byte {
	b := make([]byte, header.ICMPv4MinimumSize+len(body))
	copy(b[header.ICMPv4MinimumSize:], body)
	if v6 {
		h := header.ICMPv6(b)
		h.SetType(header.ICMPv6EchoRequest)
		h.SetIdent(junkID)
		h.SetSequence(seq)
		h.SetChecksum(0xbeef)
		return b
	}
	h := header.ICMPv4(b)
	h.SetType(header.ICMPv4Echo)
	h.SetIdent(junkID)
	h.SetSequence(seq)
	h.SetChecksum(0xbeef)
	return b
}

// checkReply checks that b is the echo reply from src to dst of id, seq
// and body, with a valid checksum.
func checkReply(t *testing.T, b []byte, src, dst netip.Addr, id, seq uint16, body []byte) {
	t.Helper()
	if len(b) < header.ICMPv4MinimumSize {
		t.Fatalf("reply of %d bytes, want at least 8", len(b))
	}
	var typ, code byte
	var gotID, gotSeq uint16
	var csumOK bool
	if src.Is6() {
		h := header.ICMPv6(b)
		typ, code, gotID, gotSeq = byte(h.Type()), byte(h.Code()), h.Ident(), h.Sequence()
		csumOK = h.Checksum() == header.ICMPv6Checksum(header.ICMPv6ChecksumParams{
			Header: h, Src: tcpip.AddrFrom16(src.As16()), Dst: tcpip.AddrFrom16(dst.As16()),
		})
		if want := byte(header.ICMPv6EchoReply); typ != want {
			t.Errorf("reply type %d, want %d", typ, want)
		}
	} else {
		h := header.ICMPv4(b)
		typ, code, gotID, gotSeq = byte(h.Type()), byte(h.Code()), h.Ident(), h.Sequence()
		csumOK = checksum.Checksum(b, 0) == 0xffff
		if want := byte(header.ICMPv4EchoReply); typ != want {
			t.Errorf("reply type %d, want %d", typ, want)
		}
	}
	if code != 0 || gotID != id || gotSeq != seq {
		t.Errorf("reply code %d id %#04x seq %d, want code 0 id %#04x seq %d", code, gotID, gotSeq, id, seq)
	}
	if !csumOK {
		t.Errorf("reply checksum %#04x is not valid", uint16(b[2])<<8|uint16(b[3]))
	}
	if got := b[header.ICMPv4MinimumSize:]; !bytes.Equal(got, body) {
		t.Errorf("reply body %q, want %q", got, body)
	}
}

// ipOf returns a, a *net.IPAddr, as a netip.Addr, failing t otherwise.
func ipOf(t *testing.T, a net.Addr) netip.Addr {
	t.Helper()
	ia, ok := a.(*net.IPAddr)
	if !ok {
		t.Fatalf("address %v is a %T, want a *net.IPAddr", a, a)
	}
	ip, _ := netip.AddrFromSlice(ia.IP)
	return ip.Unmap()
}

// pingOnce sends an echo request of seq from c (to dst with WriteTo, or
// with Write if dst is nil) and checks its reply from src to c's local
// address local.
func pingOnce(t *testing.T, c *stack.PingConn, dst net.Addr, src, local netip.Addr, seq uint16) {
	t.Helper()
	body := fmt.Appendf(nil, "ustack ping %d", seq)
	req := echoRequest(src.Is6(), ^c.ID(), seq, body)
	var n int
	var err error
	if dst == nil {
		n, err = c.Write(req)
	} else {
		n, err = c.WriteTo(req, dst)
	}
	if err != nil || n != len(req) {
		t.Fatalf("write of seq %d: %d, %v; want %d, nil", seq, n, err, len(req))
	}
	c.SetReadDeadline(time.Now().Add(pingWait))
	buf := make([]byte, 1500)
	n, from, err := c.ReadFrom(buf)
	if err != nil {
		t.Fatalf("read of the reply to seq %d: %v", seq, err)
	}
	if got := ipOf(t, from); got != src {
		t.Errorf("reply to seq %d from %s, want %s", seq, got, src)
	}
	checkReply(t, buf[:n], src, local, c.ID(), seq, body)
}

// TestPingPair pings the peer of an in-memory pair over IPv4 and IPv6,
// from a dialed socket (Write, Read) and a listening one (WriteTo,
// ReadFrom): each reply carries the socket's identifier (not the junk
// one written), the sequence number and body sent, and a valid checksum.
func TestPingPair(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	_ = peer
	for _, tc := range []struct {
		network     string
		local, peer netip.Addr
	}{
		{"ping4", netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")},
		{"ping6", netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")},
	} {
		t.Run(tc.network+"/dial", func(t *testing.T) {
			c, err := rx.DialPing(tc.network, tc.peer.String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := ipOf(t, c.LocalAddr()); got != tc.local {
				t.Errorf("LocalAddr %s, want %s", got, tc.local)
			}
			if got := ipOf(t, c.RemoteAddr()); got != tc.peer {
				t.Errorf("RemoteAddr %s, want %s", got, tc.peer)
			}
			if c.ID() == 0 {
				t.Errorf("ID 0, want the identifier the stack picked")
			}
			for seq := uint16(1); seq <= 3; seq++ {
				pingOnce(t, c, nil, tc.peer, tc.local, seq)
			}
			// A reply longer than the buffer is cut to it, the rest dropped.
			if _, err := c.Write(echoRequest(tc.peer.Is6(), 0, 4, []byte("0123456789"))); err != nil {
				t.Fatal(err)
			}
			small := make([]byte, 10)
			if n, err := c.Read(small); n != len(small) || err != nil {
				t.Errorf("Read of an 18-byte reply into 10 bytes: %d, %v; want 10, nil", n, err)
			}
			pingOnce(t, c, nil, tc.peer, tc.local, 5) // the next read is the next reply
		})
		t.Run(tc.network+"/listen", func(t *testing.T) {
			c, err := rx.ListenPing(tc.network, "")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := ipOf(t, c.LocalAddr()); !got.IsUnspecified() || got.Is4() != tc.local.Is4() {
				t.Errorf("LocalAddr %s, want the unspecified address of %s", got, tc.network)
			}
			if c.RemoteAddr() != nil {
				t.Errorf("RemoteAddr %v, want nil", c.RemoteAddr())
			}
			dsts := []net.Addr{
				&net.IPAddr{IP: tc.peer.AsSlice()},
				&net.UDPAddr{IP: tc.peer.AsSlice(), Port: 9}, // x/net/icmp's; the port ignored
				stack.PingAddrFromAddr(tc.peer),
				*stack.PingAddrFromAddr(tc.peer),
			}
			for i, dst := range dsts {
				pingOnce(t, c, dst, tc.peer, tc.local, uint16(10+i))
			}
		})
	}
}

// TestPingIdentFilter: two sockets ping the same peer, interleaved; each
// reads only the replies to its own identifier, in order, as Linux's
// ping_lookup delivers them.
func TestPingIdentFilter(t *testing.T) {
	rx, _ := stacktest.Pair(t, driver.Config{})
	peer := netip.MustParseAddr("192.0.2.2")
	var cs [2]*stack.PingConn
	for i := range cs {
		c, err := rx.ListenPingAddr(netip.IPv4Unspecified())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	if cs[0].ID() == cs[1].ID() {
		t.Fatalf("both sockets have identifier %#04x", cs[0].ID())
	}
	const n = 5
	dst := &net.IPAddr{IP: peer.AsSlice()}
	for seq := uint16(1); seq <= n; seq++ {
		for i, c := range cs {
			if _, err := c.WriteTo(echoRequest(false, 0, seq*10+uint16(i), []byte("x")), dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	// ICMP is datagrams: the replies may come in another order (the first
	// requests wait for ARP), but each socket gets exactly its own.
	buf := make([]byte, 64)
	for i, c := range cs {
		c.SetReadDeadline(time.Now().Add(pingWait))
		want := map[uint16]bool{}
		for seq := uint16(1); seq <= n; seq++ {
			want[seq*10+uint16(i)] = true
		}
		for r := 0; r < n; r++ {
			m, _, err := c.ReadFrom(buf)
			if err != nil {
				t.Fatalf("socket %d, reply %d: %v", i, r, err)
			}
			if m < 8 || !want[binary.BigEndian.Uint16(buf[6:8])] {
				t.Fatalf("socket %d: reply % x is not one of its outstanding requests %v", i, buf[:m], want)
			}
			seq := binary.BigEndian.Uint16(buf[6:8])
			delete(want, seq)
			checkReply(t, buf[:m], peer, netip.MustParseAddr("192.0.2.1"), c.ID(), seq, []byte("x"))
		}
	}
}

// TestPingLoopback pings the stack's own addresses over its loopback
// interface: 127.0.0.1, ::1 and "localhost" by name, and its wire IPv6
// address (an IPv4 one goes unanswered: see PingConn).
func TestPingLoopback(t *testing.T) {
	rx, _ := stacktest.Pair(t, driver.Config{})
	for _, tc := range []struct {
		network, address string
		want             netip.Addr
	}{
		{"ping4", "127.0.0.1", netip.MustParseAddr("127.0.0.1")},
		{"ping6", "::1", netip.IPv6Loopback()},
		{"ping", "localhost", netip.MustParseAddr("127.0.0.1")},
		{"ping6", "localhost", netip.IPv6Loopback()},
		{"ping4", "0.0.0.0", netip.MustParseAddr("127.0.0.1")}, // connect(0.0.0.0) is loopback
		{"ping6", "::", netip.IPv6Loopback()},
		{"ping6", "2001:db8::1", netip.MustParseAddr("2001:db8::1")},
	} {
		t.Run(tc.network+"/"+tc.address, func(t *testing.T) {
			c, err := rx.DialPing(tc.network, tc.address)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := ipOf(t, c.RemoteAddr()); got != tc.want {
				t.Errorf("RemoteAddr %s, want %s", got, tc.want)
			}
			pingOnce(t, c, nil, tc.want, ipOf(t, c.LocalAddr()), 1)
		})
	}
	// sendto(0.0.0.0) and sendto(::) are loopback too.
	for _, a := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
		c, err := rx.ListenPingAddr(a)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		lo := netip.IPv6Loopback()
		if a.Is4() {
			lo = netip.MustParseAddr("127.0.0.1")
		}
		pingOnce(t, c, &net.IPAddr{IP: a.AsSlice()}, lo, lo, 2)
	}
}

// TestPingDeadline: a read with no reply to come fails at its deadline,
// a deadline in the past fails reads and writes at once, and a cleared
// one lets them through again; the errors are *net.OpError wrapping
// os.ErrDeadlineExceeded whose Timeout is true.
func TestPingDeadline(t *testing.T) {
	rx, _ := stacktest.Pair(t, driver.Config{})
	c, err := rx.DialPingAddr(netip.Addr{}, netip.MustParseAddr("192.0.2.2"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wantTimeout := func(what string, err error, op string) {
		t.Helper()
		var oe *net.OpError
		var ne net.Error
		if !errors.As(err, &oe) || oe.Op != op || !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("%s: got %v, want a *net.OpError of %s wrapping os.ErrDeadlineExceeded", what, err, op)
		}
	}
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	_, err = c.Read(make([]byte, 64))
	wantTimeout("Read with nothing to read", err, "read")
	if d := time.Since(start); d < 40*time.Millisecond {
		t.Errorf("Read failed after %v, before its deadline", d)
	}
	c.SetDeadline(time.Now().Add(-time.Second))
	_, _, err = c.ReadFrom(make([]byte, 64))
	wantTimeout("ReadFrom past the deadline", err, "read")
	_, err = c.Write(echoRequest(false, 0, 1, nil))
	wantTimeout("Write past the deadline", err, "write")
	c.SetDeadline(time.Time{})
	pingOnce(t, c, nil, netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.1"), 2)
}

// TestPingClose: a Read blocked when the socket is closed returns
// net.ErrClosed, as does every call after Close, Close included.
func TestPingClose(t *testing.T) {
	rx, _ := stacktest.Pair(t, driver.Config{})
	c, err := rx.ListenPingAddr(netip.IPv6Unspecified())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 64))
		done <- err
	}()
	waitReadBlocked(t)
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-done:
		wantClosed(t, "Read blocked at Close", err, "read")
	case <-time.After(pingWait):
		t.Fatal("Read still blocked after Close")
	}
	dst := &net.IPAddr{IP: net.ParseIP("2001:db8::2")}
	msg := echoRequest(true, 0, 1, nil)
	_, err = c.Read(make([]byte, 64))
	wantClosed(t, "Read", err, "read")
	_, _, err = c.ReadFrom(make([]byte, 64))
	wantClosed(t, "ReadFrom", err, "read")
	_, err = c.Write(msg)
	wantClosed(t, "Write", err, "write")
	_, err = c.WriteTo(msg, dst)
	wantClosed(t, "WriteTo", err, "write")
	wantClosed(t, "SetDeadline", c.SetDeadline(time.Now()), "set")
	wantClosed(t, "SetReadDeadline", c.SetReadDeadline(time.Now()), "set")
	wantClosed(t, "SetWriteDeadline", c.SetWriteDeadline(time.Now()), "set")
	wantClosed(t, "Close", c.Close(), "close")
}

// waitReadBlocked waits until a goroutine is parked in a PingConn read,
// waiting for a reply (its select), as runtime.Stack shows it.
func waitReadBlocked(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for start := time.Now(); time.Since(start) < pingWait; time.Sleep(time.Millisecond) {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, "(*dgramSock).recvLocked") {
				return
			}
		}
	}
	t.Fatal("no read blocked in dgramSock.recvLocked")
}

// wantClosed fails t unless err is a *net.OpError of op wrapping
// net.ErrClosed.
func wantClosed(t *testing.T, what string, err error, op string) {
	t.Helper()
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != op || !errors.Is(err, net.ErrClosed) {
		t.Errorf("%s after Close: got %v, want a *net.OpError of %s wrapping net.ErrClosed", what, err, op)
	}
}

// TestPingStackClose: a Read blocked when the stack closes returns
// net.ErrClosed.
func TestPingStackClose(t *testing.T) {
	rx, _ := stacktest.Pair(t, driver.Config{})
	c, err := rx.ListenPing("ping4", "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 64))
		done <- err
	}()
	waitReadBlocked(t)
	rx.Close()
	select {
	case err := <-done:
		wantClosed(t, "Read blocked at the stack's Close", err, "read")
	case <-time.After(pingWait):
		t.Fatal("Read still blocked after the stack's Close")
	}
}

// errIs is a target of errors.Is or, for the error types net puts in an
// OpError, of errors.As; a string is the text of the OpError's Err, for
// net's unexported errors.
type errIs struct{ target any }

func (w errIs) String() string {
	switch target := w.target.(type) {
	case string:
		return fmt.Sprintf("%q", target)
	case *net.AddrError, *net.DNSError, net.UnknownNetworkError:
		return fmt.Sprintf("a %T", target)
	case error:
		return target.Error()
	}
	return fmt.Sprint(w.target)
}

func (w errIs) check(err error) bool {
	switch target := w.target.(type) {
	case string:
		var oe *net.OpError
		return errors.As(err, &oe) && oe.Err != nil && oe.Err.Error() == target
	case *net.AddrError:
		return errors.As(err, &target)
	case *net.DNSError:
		return errors.As(err, &target)
	case net.UnknownNetworkError:
		return errors.As(err, &target)
	case error:
		return errors.Is(err, target)
	}
	return false
}

// TestPingBadInput: bad networks, addresses and messages fail with
// *net.OpError around what Go's net or Linux's ping socket answer, never
// a panic.
func TestPingBadInput(t *testing.T) {
	rx, _ := stacktest.Pair(t, driver.Config{})
	v4, v6 := netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")
	noRoute4, noRoute6 := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8:1::1")
	addrErr, dnsErr, netErr := errIs{(*net.AddrError)(nil)}, errIs{(*net.DNSError)(nil)}, errIs{net.UnknownNetworkError("")}
	is := func(err error) errIs { return errIs{err} }
	missing := errIs{"missing address"} // net's errMissingAddress, by its text
	open := []struct {
		name string
		op   string
		fn   func() (*stack.PingConn, error)
		want errIs
	}{
		{"DialPingAddr(zero, zero)", "dial", func() (*stack.PingConn, error) { return rx.DialPingAddr(netip.Addr{}, netip.Addr{}) }, missing},
		{"DialPingAddr(v6, v4)", "dial", func() (*stack.PingConn, error) { return rx.DialPingAddr(netip.MustParseAddr("2001:db8::1"), v4) }, addrErr},
		{"DialPingAddr(v4, v6)", "dial", func() (*stack.PingConn, error) { return rx.DialPingAddr(netip.MustParseAddr("192.0.2.1"), v6) }, is(syscall.EINVAL)},
		{"DialPingAddr(::, v4)", "dial", func() (*stack.PingConn, error) { return rx.DialPingAddr(netip.IPv6Unspecified(), v4) }, addrErr},
		{"DialPingAddr(not ours, v4)", "dial", func() (*stack.PingConn, error) { return rx.DialPingAddr(netip.MustParseAddr("192.0.2.77"), v4) }, is(syscall.EADDRNOTAVAIL)},
		{"DialPingAddr(no route v4)", "dial", func() (*stack.PingConn, error) { return rx.DialPingAddr(netip.Addr{}, noRoute4) }, is(syscall.ENETUNREACH)},
		{"DialPingAddr(no route v6)", "dial", func() (*stack.PingConn, error) { return rx.DialPingAddr(netip.Addr{}, noRoute6) }, is(syscall.ENETUNREACH)},
		{"ListenPingAddr(zero)", "listen", func() (*stack.PingConn, error) { return rx.ListenPingAddr(netip.Addr{}) }, missing},
		{"ListenPingAddr(not ours)", "listen", func() (*stack.PingConn, error) { return rx.ListenPingAddr(netip.MustParseAddr("2001:db8::77")) }, is(syscall.EADDRNOTAVAIL)},
		{"DialPing(icmp)", "dial", func() (*stack.PingConn, error) { return rx.DialPing("icmp", "192.0.2.2") }, netErr},
		{"DialPing(ping4, \"\")", "dial", func() (*stack.PingConn, error) { return rx.DialPing("ping4", "") }, missing},
		{"DialPing(ping4, ::1)", "dial", func() (*stack.PingConn, error) { return rx.DialPing("ping4", "::1") }, addrErr},
		{"DialPing(ping4, host:port)", "dial", func() (*stack.PingConn, error) { return rx.DialPing("ping4", "192.0.2.2:7") }, dnsErr},
		{"DialPing(ping, name without DNS)", "dial", func() (*stack.PingConn, error) { return rx.DialPing("ping", "host.example") }, dnsErr},
		{"ListenPing(udp4)", "listen", func() (*stack.PingConn, error) { return rx.ListenPing("udp4", "") }, netErr},
		{"ListenPing(ping6, 192.0.2.1)", "listen", func() (*stack.PingConn, error) { return rx.ListenPing("ping6", "192.0.2.1") }, addrErr},
	}
	for _, tc := range open {
		c, err := tc.fn()
		var oe *net.OpError
		if c != nil || !errors.As(err, &oe) || oe.Op != tc.op || !tc.want.check(err) {
			t.Errorf("%s: got %v, %v (%T); want a *net.OpError of %s wrapping %v", tc.name, c, err, err, tc.op, tc.want)
		}
		if c != nil {
			c.Close()
		}
	}

	l4, err := rx.ListenPingAddr(netip.IPv4Unspecified())
	if err != nil {
		t.Fatal(err)
	}
	defer l4.Close()
	l6, err := rx.ListenPingAddr(netip.IPv6Unspecified())
	if err != nil {
		t.Fatal(err)
	}
	defer l6.Close()
	d4, err := rx.DialPingAddr(netip.Addr{}, v4)
	if err != nil {
		t.Fatal(err)
	}
	defer d4.Close()
	req4, req6 := echoRequest(false, 0, 1, []byte("x")), echoRequest(true, 0, 1, []byte("x"))
	ip4, ip6 := &net.IPAddr{IP: v4.AsSlice()}, &net.IPAddr{IP: v6.AsSlice()}
	badType, badCode := echoRequest(false, 0, 1, nil), echoRequest(false, 0, 1, nil)
	badType[0] = byte(header.ICMPv4EchoReply)
	badCode[1] = 1
	write := []struct {
		name string
		c    *stack.PingConn
		b    []byte
		dst  net.Addr // nil: Write
		want errIs
	}{
		{"Write on a socket not connected", l4, req4, nil, is(syscall.EDESTADDRREQ)},
		{"WriteTo on a connected socket", d4, req4, ip4, is(net.ErrWriteToConnected)},
		{"WriteTo a *net.TCPAddr", l4, req4, &net.TCPAddr{IP: v4.AsSlice()}, is(syscall.EINVAL)},
		{"WriteTo a nil net.Addr", l4, req4, nil, is(syscall.EINVAL)},
		{"WriteTo a nil *net.IPAddr", l4, req4, (*net.IPAddr)(nil), missing},
		{"WriteTo a 3-byte IP", l4, req4, &net.IPAddr{IP: net.IP{1, 2, 3}}, addrErr},
		{"WriteTo the zero PingAddr", l4, req4, stack.PingAddr{}, addrErr},
		{"WriteTo IPv6 on ping4", l4, req6, ip6, addrErr},
		{"WriteTo IPv4 on ping6", l6, req4, ip4, is(syscall.EINVAL)},
		{"WriteTo with no route", l4, req4, &net.IPAddr{IP: noRoute4.AsSlice()}, is(syscall.ENETUNREACH)},
		{"WriteTo of 7 bytes", l4, req4[:7], ip4, is(syscall.EINVAL)},
		{"WriteTo of an echo reply", l4, badType, ip4, is(syscall.EINVAL)},
		{"WriteTo of code 1", l4, badCode, ip4, is(syscall.EINVAL)},
		{"WriteTo of ICMPv4 echo on ping6", l6, req4, ip6, is(syscall.EINVAL)},
		{"WriteTo of 70000 bytes", l4, append(echoRequest(false, 0, 1, nil), make([]byte, 70000)...), ip4, is(syscall.EMSGSIZE)},
	}
	for _, tc := range write {
		var n int
		var err error
		if tc.dst == nil && tc.name != "WriteTo a nil net.Addr" {
			n, err = tc.c.Write(tc.b)
		} else {
			n, err = tc.c.WriteTo(tc.b, tc.dst)
		}
		var oe *net.OpError
		if n != 0 || !errors.As(err, &oe) || oe.Op != "write" || !tc.want.check(err) {
			t.Errorf("%s: got %d, %v (%T); want 0 and a *net.OpError of write wrapping %v", tc.name, n, err, err, tc.want)
		}
	}
}

// TestPingTAP pings across a TAP device with the kernel as the peer, in a
// namespace of the test's own: the stack's ping socket pings the kernel,
// and a kernel ping socket (golang.org/x/net/icmp's "udp4" and "udp6",
// socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)), and ping(8) if installed,
// ping the stack, over IPv4 and IPv6. Then the same bad calls go to a
// kernel ping socket and to the stack's, which must fail alike.
func TestPingTAP(t *testing.T) {
	r := stacktest.NewTAP(t, stacktest.TAPConfig{})
	// net.ipv4.ping_group_range, per namespace, is "1 0" (no group may
	// open a ping socket) in a new one: open it to every group there.
	if err := r.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	fams := []struct {
		name, kernelNet, kernelAddr string
		peer, self                  netip.Addr
	}{
		{"ipv4", "udp4", "0.0.0.0", r.PeerAddr4.Addr(), r.StackAddr4.Addr()},
		{"ipv6", "udp6", "::", r.PeerAddr6.Addr(), r.StackAddr6.Addr()},
	}
	for _, f := range fams {
		t.Run(f.name+"/stack-pings-kernel", func(t *testing.T) {
			c, err := r.Stack.DialPingAddr(netip.Addr{}, f.peer)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for seq := uint16(1); seq <= 3; seq++ {
				pingOnce(t, c, nil, f.peer, f.self, seq)
			}
		})
		t.Run(f.name+"/kernel-pings-stack", func(t *testing.T) {
			kc := kernelPingConn(t, r, f.kernelNet, f.kernelAddr)
			id := uint16(kc.LocalAddr().(*net.UDPAddr).Port) // the kernel's identifier
			buf := make([]byte, 1500)
			for seq := uint16(1); seq <= 3; seq++ {
				body := fmt.Appendf(nil, "kernel ping %d", seq)
				if _, err := kc.WriteTo(echoRequest(f.peer.Is6(), ^id, seq, body), &net.UDPAddr{IP: f.self.AsSlice()}); err != nil {
					t.Fatal(err)
				}
				kc.SetReadDeadline(time.Now().Add(pingWait))
				n, _, err := kc.ReadFrom(buf)
				if err != nil {
					t.Fatalf("kernel's read of the reply to seq %d: %v", seq, err)
				}
				checkReply(t, buf[:n], f.self, f.peer, id, seq, body)
			}
		})
		t.Run(f.name+"/ping8", func(t *testing.T) {
			if _, err := exec.LookPath("ping"); err != nil {
				t.Skip("no ping(8) on this host")
			}
			ctx, cancel := context.WithTimeout(context.Background(), pingWait)
			defer cancel()
			out, err := r.Command(ctx, "ping", "-c", "2", "-i", "0.2", "-W", "5", f.self.String()).CombinedOutput()
			if err != nil {
				t.Fatalf("ping %s from the kernel: %v\n%s", f.self, err, out)
			}
		})
	}

	// The bad calls of TestPingBadInput that a kernel ping socket can
	// make, on an unconnected socket of each family.
	for _, f := range fams {
		t.Run(f.name+"/errors-as-kernel", func(t *testing.T) {
			v6 := f.peer.Is6()
			kc := kernelPingConn(t, r, f.kernelNet, f.kernelAddr)
			network, noRoute, other := "ping4", netip.MustParseAddr("198.51.100.1"), r.PeerAddr6.Addr()
			if v6 {
				network, noRoute, other = "ping6", netip.MustParseAddr("2001:db8:ffff::1"), r.PeerAddr4.Addr()
			}
			sc, err := r.Stack.ListenPing(network, "")
			if err != nil {
				t.Fatal(err)
			}
			defer sc.Close()
			req := echoRequest(v6, 0, 1, []byte("x"))
			badType, badCode := echoRequest(v6, 0, 1, nil), echoRequest(v6, 0, 1, nil)
			badType[0]++ // ICMPv4 type 9 (router advertisement), ICMPv6 129 (echo reply)
			badCode[1] = 1
			cases := []struct {
				name string
				b    []byte
				dst  netip.Addr // the peer's own family if zero
				want errIs
			}{
				{"7 bytes", req[:7], netip.Addr{}, errIs{syscall.EINVAL}},
				{"not an echo request", badType, netip.Addr{}, errIs{syscall.EINVAL}},
				{"code 1", badCode, netip.Addr{}, errIs{syscall.EINVAL}},
				{"70000 bytes", append(echoRequest(v6, 0, 1, nil), make([]byte, 70000)...), netip.Addr{}, errIs{syscall.EMSGSIZE}},
				{"no route", req, noRoute, errIs{syscall.ENETUNREACH}},
				{"other family", req, other, map[bool]errIs{false: {(*net.AddrError)(nil)}, true: {syscall.EINVAL}}[v6]},
			}
			for _, tc := range cases {
				dst := tc.dst
				if !dst.IsValid() {
					dst = f.peer
				}
				to := &net.UDPAddr{IP: dst.AsSlice()}
				_, kerr := kc.WriteTo(tc.b, to)
				_, serr := sc.WriteTo(tc.b, to)
				if !tc.want.check(kerr) || !tc.want.check(serr) {
					t.Errorf("WriteTo of %s: kernel %v, stack %v; want both %v", tc.name, kerr, serr, tc.want)
				}
			}
			for _, c := range []net.PacketConn{kc, sc} {
				c.SetReadDeadline(time.Now().Add(-time.Second))
			}
			_, _, kerr := kc.ReadFrom(make([]byte, 64))
			_, _, serr := sc.ReadFrom(make([]byte, 64))
			if !errors.Is(kerr, os.ErrDeadlineExceeded) || !errors.Is(serr, os.ErrDeadlineExceeded) {
				t.Errorf("ReadFrom past the deadline: kernel %v, stack %v; want both os.ErrDeadlineExceeded", kerr, serr)
			}
			kc.Close()
			sc.Close()
			_, kerr = kc.WriteTo(req, &net.UDPAddr{IP: f.peer.AsSlice()})
			_, serr = sc.WriteTo(req, &net.UDPAddr{IP: f.peer.AsSlice()})
			if !errors.Is(kerr, net.ErrClosed) || !errors.Is(serr, net.ErrClosed) {
				t.Errorf("WriteTo after Close: kernel %v, stack %v; want both net.ErrClosed", kerr, serr)
			}
		})
	}
}

// kernelPingConn opens a kernel ping socket of network ("udp4" or "udp6")
// on address in r's peer namespace; the test's cleanup closes it.
func kernelPingConn(t *testing.T, r *stacktest.TAPRig, network, address string) *icmp.PacketConn {
	t.Helper()
	var c *icmp.PacketConn
	if err := r.Do(func() (err error) {
		c, err = icmp.ListenPacket(network, address)
		return err
	}); err != nil {
		t.Fatalf("kernel ping socket %s: %v", network, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
