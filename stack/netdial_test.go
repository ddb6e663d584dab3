package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
)

// The addresses of routePair: the peer owns 198.51.100.1 and
// 2001:db8:1::1 beside its addresses on the wire's subnets, so that the
// receiver reaches them only through a route via the peer.
var (
	rxAddrs   = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64")}
	peerAddrs = []netip.Prefix{
		netip.MustParsePrefix("192.0.2.2/24"), netip.MustParsePrefix("2001:db8::2/64"),
		netip.MustParsePrefix("198.51.100.1/24"), netip.MustParsePrefix("2001:db8:1::1/64"),
	}
)

// routePair builds a receiver at 192.0.2.1 and 2001:db8::1 with routes and
// name servers, and its peer on the in-memory wire (peerAddrs).
func routePair(t *testing.T, routes []Route, dns []netip.Addr) (rx, peer *Stack) {
	t.Helper()
	return newPair(t, Config{Addrs: rxAddrs, Routes: routes, DNSServers: dns}, Config{Addrs: peerAddrs})
}

// echoListener serves l: every connection is echoed until its peer
// closes. It stops when l is closed, before the test ends.
func echoListener(t *testing.T, l net.Listener) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
}

// checkEcho sends a message on c and checks that the echo brings the same
// bytes back, then closes c.
func checkEcho(t *testing.T, c net.Conn, what string) {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	msg := []byte(fmt.Sprintf("hello over %s from %v to %v", what, c.LocalAddr(), c.RemoteAddr()))
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("%s: write: %v", what, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("%s: read: %v", what, err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("%s: echo: got %q, want %q", what, got, msg)
	}
}

// dialEcho dials address on network from s and checks an echo.
func dialEcho(t *testing.T, s *Stack, network, address string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := s.DialContext(ctx, network, address)
	if err != nil {
		t.Fatalf("DialContext(%s, %s): %v", network, address, err)
	}
	checkEcho(t, c, network+" "+address)
}

func TestRoutes(t *testing.T) {
	via := func(dst, gw string) Route {
		return Route{Dst: netip.MustParsePrefix(dst), Gateway: netip.MustParseAddr(gw)}
	}
	for _, tc := range []struct {
		name   string
		routes []Route
	}{
		// The default route's gateway is not there: the dial reaches the
		// peer only if the more specific route is taken, wherever it is
		// listed.
		{"gateway", []Route{
			via("0.0.0.0/0", "192.0.2.77"), via("198.51.100.0/24", "192.0.2.2"),
			via("::/0", "2001:db8::77"), via("2001:db8:1::/64", "2001:db8::2"),
		}},
		{"default", []Route{via("0.0.0.0/0", "192.0.2.2"), via("::/0", "2001:db8::2")}},
		{"host", []Route{via("198.51.100.1/32", "192.0.2.2"), via("2001:db8:1::1/128", "2001:db8::2")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rx, peer := routePair(t, tc.routes, nil)
			l, err := peer.Listen("tcp", ":7")
			if err != nil {
				t.Fatal(err)
			}
			echoListener(t, l)
			dialEcho(t, rx, "tcp", "198.51.100.1:7")
			dialEcho(t, rx, "tcp", "[2001:db8:1::1]:7")
			dialEcho(t, rx, "tcp", "192.0.2.2:7") // the subnet's own route stays
		})
	}
}

// TestDialUnreachable dials addresses no route reaches: each dial fails
// at once, with the route lookup's error, not the context's.
func TestDialUnreachable(t *testing.T) {
	rx, peer := routePair(t, nil, nil)
	l, err := peer.Listen("tcp", ":7")
	if err != nil {
		t.Fatal(err)
	}
	echoListener(t, l)
	for _, a := range []string{"198.51.100.1:7", "[2001:db8:1::1]:7"} {
		for _, network := range []string{"tcp", "udp"} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			c, err := rx.DialContext(ctx, network, a)
			ctxErr := ctx.Err()
			cancel()
			if err == nil {
				c.Close()
				t.Errorf("Dial(%s, %s): got a connection, want an error", network, a)
				continue
			}
			t.Logf("Dial(%s, %s): %v", network, a, err)
			if ctxErr != nil || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Dial(%s, %s): got %v after the context ended, want a failure at once", network, a, err)
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "dial" || !errors.Is(err, syscall.ENETUNREACH) {
				t.Errorf("Dial(%s, %s): got %#v, want a *net.OpError with Op dial around ENETUNREACH", network, a, err)
			}
		}
	}
}

func TestConfigRefused(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	via := func(dst, gw string) Route { return Route{Dst: p(dst), Gateway: a(gw)} }
	for _, tc := range []struct {
		name   string
		addrs  []netip.Prefix
		routes []Route
		dns    []netip.Addr
		want   string // in the error; "" for a valid configuration
	}{
		{"valid", rxAddrs, []Route{via("0.0.0.0/0", "192.0.2.2"), via("::/0", "2001:db8::2"), {Dst: p("198.51.100.0/24")}}, []netip.Addr{a("192.0.2.53")}, ""},
		{"zero prefix", []netip.Prefix{{}}, nil, nil, "not a valid prefix"},
		{"zero prefix beside a valid one", append(rxAddrs[:1:1], netip.Prefix{}), nil, nil, "not a valid prefix"},
		{"unspecified address", []netip.Prefix{p("0.0.0.0/24")}, nil, nil, "unspecified"},
		{"unspecified IPv6 address", []netip.Prefix{p("::/64")}, nil, nil, "unspecified"},
		{"multicast address", []netip.Prefix{p("224.0.0.1/24")}, nil, nil, "multicast"},
		{"loopback address", []netip.Prefix{p("127.0.0.2/8")}, nil, nil, "loopback"},
		{"IPv4-mapped address", []netip.Prefix{p("::ffff:192.0.2.1/120")}, nil, nil, "IPv4-mapped"},
		{"zero destination", rxAddrs, []Route{{Gateway: a("192.0.2.2")}}, nil, "not a valid prefix"},
		{"host bits", rxAddrs, []Route{via("198.51.100.1/24", "192.0.2.2")}, nil, "host bits"},
		{"host bits on link", rxAddrs, []Route{{Dst: p("2001:db8:1::1/64")}}, nil, "host bits"},
		{"gateway of the other family", rxAddrs, []Route{via("198.51.100.0/24", "2001:db8::2")}, nil, "different families"},
		{"IPv4-mapped gateway", rxAddrs, []Route{via("::/0", "::ffff:192.0.2.2")}, nil, "different families"},
		{"gateway off the subnets", rxAddrs, []Route{via("0.0.0.0/0", "203.0.113.1")}, nil, "invalid gateway"},
		{"IPv6 gateway off the subnets", rxAddrs, []Route{via("::/0", "2001:db8:2::1")}, nil, "invalid gateway"},
		{"gateway is the stack", rxAddrs, []Route{via("0.0.0.0/0", "192.0.2.1")}, nil, "invalid gateway"},
		{"gateway is the broadcast", rxAddrs, []Route{via("0.0.0.0/0", "192.0.2.255")}, nil, "invalid gateway"},
		{"unspecified gateway", rxAddrs, []Route{via("0.0.0.0/0", "0.0.0.0")}, nil, "unicast"},
		{"multicast gateway", rxAddrs, []Route{via("::/0", "ff02::1")}, nil, "unicast"},
		{"unspecified DNS server", rxAddrs, nil, []netip.Addr{a("0.0.0.0")}, "DNS server"},
		{"zero DNS server", rxAddrs, nil, []netip.Addr{{}}, "DNS server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, peer := driver.NewMemPair(64, 0)
			defer peer.Close()
			s, err := New(Config{Wire: w, Addrs: tc.addrs, Routes: tc.routes, DNSServers: tc.dns})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("New: got a stack, want an error with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestLoopback reaches the stack's own listeners on 127.0.0.1, ::1,
// localhost and its own wire address, and checks that none of it went on
// the wire.
func TestLoopback(t *testing.T) {
	rx, _ := routePair(t, nil, nil)
	for _, tc := range []struct {
		network, addr string
		dials         []string
	}{
		{"tcp", "127.0.0.1:7001", []string{"127.0.0.1:7001", "localhost:7001"}},
		{"tcp4", "localhost:7002", []string{"127.0.0.1:7002"}},
		{"tcp", "[::1]:7003", []string{"[::1]:7003"}},
		{"tcp", ":7004", []string{"127.0.0.1:7004", "127.0.0.2:7004", "[::1]:7004", "localhost:7004", "192.0.2.1:7004", "[2001:db8::1]:7004", ":7004"}},
		{"tcp4", ":7005", []string{"127.0.0.1:7005", "localhost:7005", "192.0.2.1:7005"}},
		{"tcp6", ":7006", []string{"[::1]:7006", "localhost:7006", "[2001:db8::1]:7006"}},
		{"tcp", "0.0.0.0:7007", []string{"127.0.0.1:7007", "[::1]:7007"}}, // as Go's: 0.0.0.0 on "tcp" is dual stack
	} {
		l, err := rx.Listen(tc.network, tc.addr)
		if err != nil {
			t.Fatalf("Listen(%s, %s): %v", tc.network, tc.addr, err)
		}
		echoListener(t, l)
		before := wireCounters(rx)
		for _, d := range tc.dials {
			dialEcho(t, rx, "tcp", d)
		}
		if after := wireCounters(rx); after != before {
			t.Errorf("listener %s %s: the wire's counters moved from %v to %v", tc.network, tc.addr, before, after)
		}
	}
	// The existing netip-typed listeners on the unspecified address too.
	l, err := rx.ListenTCP(netip.MustParseAddrPort("0.0.0.0:7010"))
	if err != nil {
		t.Fatal(err)
	}
	echoListener(t, l)
	dialEcho(t, rx, "tcp", "127.0.0.1:7010")
	c, err := rx.DialTCP(context.Background(), netip.MustParseAddrPort("127.0.0.1:7010"))
	if err != nil {
		t.Fatal(err)
	}
	checkEcho(t, c, "DialTCP 127.0.0.1:7010")

	// An IPv4-only listener takes no IPv6, an IPv6-only one no IPv4.
	for _, d := range []string{"[::1]:7005", "127.0.0.1:7006"} {
		if c, err := rx.Dial("tcp", d); err == nil {
			c.Close()
			t.Errorf("Dial(tcp, %s): connected, want refused", d)
		}
	}
}

// wireCounters returns the wire's packet counts.
func wireCounters(s *Stack) [2]uint64 {
	st := s.Driver().Stats()
	return [2]uint64{st.Packets.Load(), st.TxPackets.Load()}
}

func TestLoopbackUDP(t *testing.T) {
	rx, _ := routePair(t, nil, nil)
	pc, err := rx.ListenPacket("udp", ":5353")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	for _, d := range []string{"127.0.0.1:5353", "[::1]:5353", "localhost:5353"} {
		c, err := rx.Dial("udp", d)
		if err != nil {
			t.Fatalf("Dial(udp, %s): %v", d, err)
		}
		msg := []byte("datagram to " + d)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		pc.SetDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 100)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf[:n], msg) {
			t.Errorf("ReadFrom: got %q, want %q", buf[:n], msg)
		}
		reply := append([]byte("reply to "), msg...)
		if _, err := pc.WriteTo(reply, from); err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		n, err = c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf[:n], reply) {
			t.Errorf("Read: got %q, want %q", buf[:n], reply)
		}
		c.Close()
		if _, err := c.Write(msg); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Write after Close: got %v, want net.ErrClosed", err)
		}
	}
}

// TestListenNotOwned binds to addresses the stack does not own: as the
// kernel's bind, it fails with EADDRNOTAVAIL.
func TestListenNotOwned(t *testing.T) {
	rx, _ := routePair(t, nil, nil)
	check := func(what string, err error, network string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: got a socket, want EADDRNOTAVAIL", what)
			return
		}
		if !errors.Is(err, syscall.EADDRNOTAVAIL) {
			t.Errorf("%s: got %v, want EADDRNOTAVAIL", what, err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "listen" || oe.Net != network || oe.Addr == nil {
			t.Errorf("%s: got %#v, want a *net.OpError listen %s with the address", what, err, network)
		}
	}
	l, err := rx.ListenTCP(netip.MustParseAddrPort("203.0.113.9:80"))
	if err == nil {
		l.Close()
	}
	check("ListenTCP(203.0.113.9:80)", err, "tcp")
	l, err = rx.Listen("tcp6", "[2001:db8::9]:80")
	if err == nil {
		l.Close()
	}
	check("Listen(tcp6, [2001:db8::9]:80)", err, "tcp6")
	pc, err := rx.ListenUDP(netip.MustParseAddrPort("203.0.113.9:53"))
	if err == nil {
		pc.Close()
	}
	check("ListenUDP(203.0.113.9:53)", err, "udp")
	pc, err = rx.ListenPacket("udp4", "198.51.100.1:53")
	if err == nil {
		pc.Close()
	}
	check("ListenPacket(udp4, 198.51.100.1:53)", err, "udp4")
	if l, err := rx.Listen("tcp", "192.0.2.1:80"); err != nil {
		t.Errorf("Listen on an owned address: %v", err)
	} else {
		l.Close()
	}
}

// TestResolveErrors checks the errors of names that are not looked up.
func TestResolveErrors(t *testing.T) {
	rx, _ := routePair(t, nil, nil)
	for _, tc := range []struct{ network, addr, want string }{
		{"tcp", "bad..name:80", "dial tcp: lookup bad..name: no such host"},
		{"tcp", "x.onion:80", "dial tcp: lookup x.onion: no such host"},
		{"udp", "192.0.2.2:http", "dial udp: lookup udp/http: unknown port"},
		{"tcp", "192.0.2.2:HTTP", ""},
		{"tcp", "name.test:80", "dial tcp: lookup name.test: no DNS servers configured"},
	} {
		c, err := rx.DialContext(context.Background(), tc.network, tc.addr)
		if tc.want == "" {
			// A known service name gives its port: the dial gets as
			// far as the peer, where nothing listens on port 80.
			if err == nil {
				c.Close()
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Addr == nil || oe.Addr.String() != "192.0.2.2:80" {
				t.Errorf("Dial(%s, %s): got %v, want a dial error for 192.0.2.2:80", tc.network, tc.addr, err)
			}
			continue
		}
		if err == nil || err.Error() != tc.want {
			t.Errorf("Dial(%s, %s): got %v, want %q", tc.network, tc.addr, err, tc.want)
		}
		var de *net.DNSError
		if !errors.As(err, &de) {
			t.Errorf("Dial(%s, %s): got %T, want a *net.DNSError inside", tc.network, tc.addr, err)
		}
	}
}

// TestDialErrors checks the errors of bad networks and addresses against
// Go's own: the same text, type and fields. None of these calls gets as
// far as a socket, in Go's net or in the stack.
func TestDialErrors(t *testing.T) {
	rx, _ := routePair(t, nil, nil)
	for _, tc := range []struct {
		op, network, addr string
	}{
		{"dial", "foo", "192.0.2.2:80"},
		{"dial", "tcp5", "192.0.2.2:80"},
		{"dial", "tcp", ""},
		{"dial", "tcp", "192.0.2.2"},
		{"dial", "tcp", "192.0.2.2:99999"},
		{"dial", "udp", "192.0.2.2:-1"},
		{"dial", "tcp", "192.0.2.2:nosuchservice"},
		{"dial", "tcp", "[2001:db8::2"},
		{"dial", "tcp", "2001:db8::2:80"},
		{"dial", "tcp4", "[2001:db8::2]:80"},
		{"dial", "udp6", "192.0.2.2:80"},
		{"listen", "foo", ":80"},
		{"listen", "udp", ":80"},
		{"listen", "tcp", "192.0.2.1"},
		{"listen", "tcp6", "192.0.2.1:80"},
		{"listenpacket", "tcp", ":80"},
		{"listenpacket", "bar", ":80"},
		{"listenpacket", "udp", "192.0.2.1:x"},
	} {
		name := tc.op + " " + tc.network + " " + tc.addr
		var got, want error
		switch tc.op {
		case "dial":
			_, got = rx.Dial(tc.network, tc.addr)
			_, want = net.Dial(tc.network, tc.addr)
		case "listen":
			_, got = rx.Listen(tc.network, tc.addr)
			_, want = net.Listen(tc.network, tc.addr)
		case "listenpacket":
			_, got = rx.ListenPacket(tc.network, tc.addr)
			_, want = net.ListenPacket(tc.network, tc.addr)
		}
		if got == nil || want == nil {
			t.Fatalf("%s: got %v, Go's net %v: want errors from both", name, got, want)
		}
		if got.Error() != want.Error() {
			t.Errorf("%s: got %q, want Go's %q", name, got, want)
		}
		gop, ok1 := got.(*net.OpError)
		wop, ok2 := want.(*net.OpError)
		if !ok1 || !ok2 {
			t.Errorf("%s: got %T, Go's %T: want *net.OpError", name, got, want)
			continue
		}
		if fmt.Sprintf("%T", gop.Err) != fmt.Sprintf("%T", wop.Err) {
			t.Errorf("%s: got an OpError around %T, Go's around %T", name, gop.Err, wop.Err)
		}
		var gu, wu net.UnknownNetworkError
		if errors.As(got, &gu) != errors.As(want, &wu) {
			t.Errorf("%s: errors.As UnknownNetworkError: got %v, Go's %v", name, errors.As(got, &gu), errors.As(want, &wu))
		}
	}
}
