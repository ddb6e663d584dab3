//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
)

// The kernel is the spec of ustack's socket errors: every case of
// errorCases runs once with Go's net on the kernel's sockets (in the bed's
// namespace, ustack the peer across the TAP) and once with ustack's
// sockets (the kernel the peer), and each step must fail (or not) the same
// way on both: the same errors.Is and errors.As answers (errSig).

// sockSide is one side's socket calls: the kernel's through Go's net,
// made inside the bed's namespace, or ustack's.
type sockSide struct {
	name string
	// self is the side's address on the TAP's link, peer the other's.
	self, peer netip.Addr
	dial       func(ctx context.Context, ap netip.AddrPort) (net.Conn, error)
	dialString func(ctx context.Context, network, address string) (net.Conn, error)
	listen     func(ap netip.AddrPort) (net.Listener, error)
	listenUDP  func(ap netip.AddrPort) (net.PacketConn, error)
}

func kernelSide(r *rig) *sockSide {
	ns := r.bed.NS
	in := func(fn func()) error { return ns.Do(func() error { fn(); return nil }) }
	s := &sockSide{name: "kernel", self: r.bed.KernelAddr4.Addr(), peer: r.bed.StackAddr4.Addr()}
	s.dialString = func(ctx context.Context, network, address string) (c net.Conn, err error) {
		if e := in(func() { c, err = (&net.Dialer{}).DialContext(ctx, network, address) }); e != nil {
			return nil, e
		}
		return c, err
	}
	s.dial = func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
		return s.dialString(ctx, "tcp", ap.String())
	}
	s.listen = func(ap netip.AddrPort) (l net.Listener, err error) {
		if e := in(func() { l, err = net.Listen("tcp", ap.String()) }); e != nil {
			return nil, e
		}
		return l, err
	}
	s.listenUDP = func(ap netip.AddrPort) (c net.PacketConn, err error) {
		if e := in(func() { c, err = net.ListenPacket("udp", ap.String()) }); e != nil {
			return nil, e
		}
		return c, err
	}
	return s
}

func ustackSide(r *rig) *sockSide {
	st := r.st
	return &sockSide{
		name: "ustack", self: r.bed.StackAddr4.Addr(), peer: r.bed.KernelAddr4.Addr(),
		dial:       st.DialTCP,
		dialString: st.DialContext,
		listen:     st.ListenTCP,
		listenUDP:  st.ListenUDP,
	}
}

// errSig is what a caller of Go's net can tell of an error: whether it is
// io.EOF itself, the *net.OpError's fields (Source and Addr only as set or
// not: the two sides' addresses differ), the *os.SyscallError's call, the
// errno, the sentinels errors.Is finds, Timeout, and the innermost error's
// text.
type errSig struct {
	Nil, EOF                    bool
	Op, Net                     string
	Source, Addr                bool
	Syscall                     string
	Errno                       syscall.Errno
	Closed, OSDeadline, Timeout bool
	CtxDeadline, Canceled       bool
	WriteToConnected            bool
	Inner                       string
}

func sigOf(err error) errSig {
	if err == nil {
		return errSig{Nil: true}
	}
	s := errSig{
		EOF:              err == io.EOF,
		Closed:           errors.Is(err, net.ErrClosed),
		OSDeadline:       errors.Is(err, os.ErrDeadlineExceeded),
		CtxDeadline:      errors.Is(err, context.DeadlineExceeded),
		Canceled:         errors.Is(err, context.Canceled),
		WriteToConnected: errors.Is(err, net.ErrWriteToConnected),
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		s.Op, s.Net, s.Source, s.Addr = oe.Op, oe.Net, oe.Source != nil, oe.Addr != nil
	}
	var se *os.SyscallError
	if errors.As(err, &se) {
		s.Syscall = se.Syscall
	}
	errors.As(err, &s.Errno)
	var ne net.Error
	if errors.As(err, &ne) {
		s.Timeout = ne.Timeout()
	}
	inner := err
	for u := errors.Unwrap(inner); u != nil; u = errors.Unwrap(inner) {
		inner = u
	}
	s.Inner = inner.Error()
	return s
}

func (s errSig) String() string {
	if s.Nil {
		return "nil"
	}
	if s.EOF {
		return "io.EOF"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "op=%s net=%s src=%v addr=%v", s.Op, s.Net, s.Source, s.Addr)
	if s.Syscall != "" {
		fmt.Fprintf(&b, " syscall=%s", s.Syscall)
	}
	if s.Errno != 0 {
		fmt.Fprintf(&b, " errno=%s", errnoName(s.Errno))
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{s.Closed, "ErrClosed"}, {s.OSDeadline, "os.ErrDeadlineExceeded"}, {s.CtxDeadline, "context.DeadlineExceeded"},
		{s.Canceled, "context.Canceled"}, {s.Timeout, "Timeout"}, {s.WriteToConnected, "ErrWriteToConnected"}} {
		if f.on {
			b.WriteString(" " + f.name)
		}
	}
	fmt.Fprintf(&b, " %q", s.Inner)
	return b.String()
}

func errnoName(e syscall.Errno) string {
	for _, n := range []struct {
		e    syscall.Errno
		name string
	}{{syscall.ECONNREFUSED, "ECONNREFUSED"}, {syscall.ECONNRESET, "ECONNRESET"}, {syscall.EADDRINUSE, "EADDRINUSE"},
		{syscall.EADDRNOTAVAIL, "EADDRNOTAVAIL"}, {syscall.EPIPE, "EPIPE"}, {syscall.ETIMEDOUT, "ETIMEDOUT"},
		{syscall.ENETUNREACH, "ENETUNREACH"}, {syscall.EHOSTUNREACH, "EHOSTUNREACH"}, {syscall.ECONNABORTED, "ECONNABORTED"},
		{syscall.EINVAL, "EINVAL"}, {syscall.EDESTADDRREQ, "EDESTADDRREQ"}} {
		if n.e == e {
			return n.name
		}
	}
	return fmt.Sprintf("errno %d", int(e))
}

// errorCase is one row: run makes its calls with sut's sockets against
// peer's and returns the error of each step it checks.
type errorCase struct {
	name string
	run  func(t *testing.T, sut, peer *sockSide) []error
	// racyDeadline: the kernel's side reports a dial's context deadline
	// as net's errTimeout or as os.ErrDeadlineExceeded, whichever timer
	// fires first (fd_unix.go's connect); both count as the same answer.
	racyDeadline bool
}

// A port nothing listens on, on either side.
const closedPort = 9

var errorCases = []errorCase{
	{name: "refused", run: func(t *testing.T, sut, peer *sockSide) []error {
		_, err := sut.dial(caseCtx(t), netip.AddrPortFrom(peer.self, closedPort))
		return []error{err}
	}},
	{name: "unreachable/no-route", run: func(t *testing.T, sut, peer *sockSide) []error {
		_, err := sut.dial(caseCtx(t), netip.MustParseAddrPort("198.51.100.1:80"))
		return []error{err}
	}},
	{name: "unreachable/no-neighbour", run: func(t *testing.T, sut, peer *sockSide) []error {
		// Nobody answers ARP for .99: no route to host after the
		// neighbour's three probes (about 3 s).
		_, err := sut.dial(caseCtx(t), netip.AddrPortFrom(onLink(sut.self, 99), 80))
		return []error{err}
	}},
	{name: "unreachable/multicast", run: func(t *testing.T, sut, peer *sockSide) []error {
		_, err := sut.dial(caseCtx(t), netip.MustParseAddrPort("224.0.0.1:80"))
		return []error{err}
	}},
	{name: "dial-timeout", racyDeadline: true, run: func(t *testing.T, sut, peer *sockSide) []error {
		ctx, cancel := context.WithTimeout(caseCtx(t), 300*time.Millisecond)
		defer cancel()
		_, err := sut.dial(ctx, netip.AddrPortFrom(onLink(sut.self, 98), 80))
		return []error{err}
	}},
	{name: "dial-cancelled", run: func(t *testing.T, sut, peer *sockSide) []error {
		ctx, cancel := context.WithCancel(caseCtx(t))
		cancel()
		_, before := sut.dial(ctx, netip.AddrPortFrom(peer.self, closedPort))
		// Cancelled while waiting for a neighbour that never answers
		// (or before the dial began: the answer is the same).
		ctx, cancel = context.WithCancel(caseCtx(t))
		time.AfterFunc(100*time.Millisecond, cancel)
		_, during := sut.dial(ctx, netip.AddrPortFrom(onLink(sut.self, 97), 80))
		return []error{before, during}
	}},
	{name: "dial-missing-address", run: func(t *testing.T, sut, peer *sockSide) []error {
		_, err := sut.dialString(caseCtx(t), "tcp", "")
		return []error{err}
	}},
	{name: "dial-unspecified-is-loopback", run: func(t *testing.T, sut, peer *sockSide) []error {
		l, err := sut.listen(netip.MustParseAddrPort("127.0.0.1:0"))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := sut.dial(caseCtx(t), netip.AddrPortFrom(netip.IPv4Unspecified(), portOf(l.Addr())))
		if err == nil {
			c.Close()
		}
		_, refused := sut.dial(caseCtx(t), netip.AddrPortFrom(netip.IPv4Unspecified(), closedPort))
		return []error{err, refused}
	}},
	{name: "address-in-use", run: func(t *testing.T, sut, peer *sockSide) []error {
		l, err := sut.listen(netip.AddrPortFrom(sut.self, 0))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		_, tcpErr := sut.listen(netip.AddrPortFrom(sut.self, portOf(l.Addr())))
		u, err := sut.listenUDP(netip.AddrPortFrom(sut.self, 0))
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		_, udpErr := sut.listenUDP(netip.AddrPortFrom(sut.self, portOf(u.LocalAddr())))
		return []error{tcpErr, udpErr}
	}},
	{name: "address-not-available", run: func(t *testing.T, sut, peer *sockSide) []error {
		_, tcpErr := sut.listen(netip.AddrPortFrom(onLink(sut.self, 77), 0))
		_, udpErr := sut.listenUDP(netip.AddrPortFrom(onLink(sut.self, 77), 0))
		return []error{tcpErr, udpErr}
	}},
	{name: "reset/read-then-write", run: func(t *testing.T, sut, peer *sockSide) []error {
		c := resetConn(t, sut, peer)
		buf := make([]byte, 16)
		_, read1 := c.Read(buf) // blocks until the RST
		_, read2 := c.Read(buf)
		_, write := c.Write([]byte("x"))
		return []error{read1, read2, write}
	}},
	{name: "reset/write", run: func(t *testing.T, sut, peer *sockSide) []error {
		c := resetConn(t, sut, peer)
		first := writeUntilError(t, c)
		_, next := c.Write([]byte("x"))
		return []error{first, next}
	}},
	{name: "deadline/read", run: func(t *testing.T, sut, peer *sockSide) []error {
		c, _ := connPair(t, sut, peer)
		buf := make([]byte, 16)
		c.SetReadDeadline(time.Now().Add(-time.Second))
		_, past := c.Read(buf)
		c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, passing := c.Read(buf)
		return []error{past, passing}
	}},
	{name: "deadline/write", run: func(t *testing.T, sut, peer *sockSide) []error {
		c, _ := connPair(t, sut, peer) // the peer never reads
		c.SetWriteDeadline(time.Now().Add(-time.Second))
		_, past := c.Write([]byte("x"))
		c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		passing := writeUntilError(t, c)
		return []error{past, passing}
	}},
	{name: "local-close/conn", run: func(t *testing.T, sut, peer *sockSide) []error {
		c, _ := connPair(t, sut, peer)
		buf := make([]byte, 16)
		c.SetDeadline(time.Now().Add(20 * time.Second))
		// Closed while the read blocks (or before it began: the answer
		// is the same).
		time.AfterFunc(50*time.Millisecond, func() { c.Close() })
		_, blocked := c.Read(buf)
		_, read := c.Read(buf)
		_, write := c.Write([]byte("x"))
		again := c.Close()
		return []error{blocked, read, write, again}
	}},
	{name: "local-close/listener", run: func(t *testing.T, sut, peer *sockSide) []error {
		l, err := sut.listen(netip.AddrPortFrom(sut.self, 0))
		if err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(50*time.Millisecond, func() { l.Close() })
		_, blocked := l.Accept()
		_, after := l.Accept()
		again := l.Close()
		return []error{blocked, after, again}
	}},
	{name: "peer-fin", run: func(t *testing.T, sut, peer *sockSide) []error {
		c, p := connPair(t, sut, peer)
		if _, err := p.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		p.Close()
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		got, err := io.ReadAll(io.LimitReader(c, 5))
		if err != nil || string(got) != "hello" {
			t.Fatalf("read %q, %v; want \"hello\"", got, err)
		}
		_, eof := c.Read(make([]byte, 16))
		return []error{eof}
	}},
	{name: "close-write", run: func(t *testing.T, sut, peer *sockSide) []error {
		c, p := connPair(t, sut, peer)
		cw := c.(interface{ CloseWrite() error }).CloseWrite()
		p.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, peerEOF := p.Read(make([]byte, 16))
		if _, err := p.Write([]byte("still")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, read := io.ReadFull(c, make([]byte, 5))
		_, write := c.Write([]byte("x"))
		return []error{cw, peerEOF, read, write}
	}},
	{name: "udp/refused", run: func(t *testing.T, sut, peer *sockSide) []error {
		c, err := sut.dialString(caseCtx(t), "udp", netip.AddrPortFrom(peer.self, closedPort).String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, write := c.Write([]byte("x"))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, read := c.Read(make([]byte, 16)) // the port unreachable's error
		return []error{write, read}
	}},
	{name: "udp/deadline-and-close", run: func(t *testing.T, sut, peer *sockSide) []error {
		u, err := sut.listenUDP(netip.AddrPortFrom(sut.self, 0))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 16)
		u.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, _, deadline := u.ReadFrom(buf)
		u.SetReadDeadline(time.Time{})
		time.AfterFunc(50*time.Millisecond, func() { u.Close() })
		_, _, blocked := u.ReadFrom(buf)
		_, write := u.WriteTo([]byte("x"), net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer.self, closedPort)))
		again := u.Close()
		return []error{deadline, blocked, write, again}
	}},
	{name: "udp/bad-destination", run: func(t *testing.T, sut, peer *sockSide) []error {
		u, err := sut.listenUDP(netip.AddrPortFrom(sut.self, 0))
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		_, tcpAddr := u.WriteTo([]byte("x"), &net.TCPAddr{IP: peer.self.AsSlice(), Port: closedPort})
		_, nilAddr := u.WriteTo([]byte("x"), (*net.UDPAddr)(nil))
		c, err := sut.dialString(caseCtx(t), "udp", netip.AddrPortFrom(peer.self, closedPort).String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, connected := c.(net.PacketConn).WriteTo([]byte("x"), net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer.self, closedPort)))
		return []error{tcpAddr, nilAddr, connected}
	}},
}

// TestSocketErrorsMatchKernel runs errorCases with Go's net on the
// kernel's sockets and with ustack's, and requires the same answers.
func TestSocketErrorsMatchKernel(t *testing.T) {
	needRoot(t)
	r := newRig(t, "usit-err", 1500, driver.Config{})
	kernel, ustack := kernelSide(r), ustackSide(r)
	for _, tc := range errorCases {
		t.Run(tc.name, func(t *testing.T) {
			want := sigsOf(tc.run(t, kernel, ustack), tc.racyDeadline)
			got := sigsOf(tc.run(t, ustack, kernel), tc.racyDeadline)
			allNil := true
			for i := range want {
				allNil = allNil && want[i].Nil
				t.Logf("step %d: kernel %v", i, want[i])
				if i < len(got) && got[i] != want[i] {
					t.Errorf("step %d: ustack %v\n\t\twant (the kernel's) %v", i, got[i], want[i])
				}
			}
			if len(got) != len(want) {
				t.Fatalf("ustack took %d steps, the kernel %d", len(got), len(want))
			}
			if allNil {
				t.Fatal("the kernel's side failed no step: the case checks nothing")
			}
		})
	}
}

// sigsOf returns the signatures of errs; with racy, a deadline found by
// os.ErrDeadlineExceeded or by context.DeadlineExceeded counts as both.
func sigsOf(errs []error, racy bool) []errSig {
	out := make([]errSig, len(errs))
	for i, err := range errs {
		out[i] = sigOf(err)
		if racy && (out[i].OSDeadline || out[i].CtxDeadline) {
			out[i].OSDeadline, out[i].CtxDeadline = true, true
		}
	}
	return out
}

// caseCtx bounds a case's dials.
func caseCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// onLink returns the address host of a's /24.
func onLink(a netip.Addr, host byte) netip.Addr {
	b := a.As4()
	b[3] = host
	return netip.AddrFrom4(b)
}

func portOf(a net.Addr) uint16 {
	switch a := a.(type) {
	case *net.TCPAddr:
		return uint16(a.Port)
	case *net.UDPAddr:
		return uint16(a.Port)
	}
	return 0
}

// connPair connects sut to a listener of peer's and returns sut's end and
// the peer's, both closed at cleanup.
func connPair(t *testing.T, sut, peer *sockSide) (c, p net.Conn) {
	t.Helper()
	l, err := peer.listen(netip.AddrPortFrom(peer.self, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	c, err = sut.dial(caseCtx(t), netip.AddrPortFrom(peer.self, portOf(l.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	select {
	case p = <-accepted:
	case <-time.After(20 * time.Second):
		t.Fatal("the peer accepted nothing in 20 s")
	}
	if p == nil {
		t.Fatal("the peer's accept failed")
	}
	t.Cleanup(func() { p.Close() })
	return c, p
}

// resetConn returns sut's end of a connection the peer reset (SO_LINGER 0,
// then close).
func resetConn(t *testing.T, sut, peer *sockSide) net.Conn {
	t.Helper()
	c, p := connPair(t, sut, peer)
	if err := p.(interface{ SetLinger(int) error }).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	p.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

// writeUntilError writes to c until a write fails, within 10000 writes and
// 20 s, and returns the error.
func writeUntilError(t *testing.T, c net.Conn) error {
	t.Helper()
	buf := make([]byte, 64<<10)
	end := time.Now().Add(20 * time.Second)
	for i := 0; i < 10000 && time.Now().Before(end); i++ {
		if _, err := c.Write(buf); err != nil {
			return err
		}
	}
	t.Fatal("writes did not fail within 10000 writes or 20 s")
	return nil
}
