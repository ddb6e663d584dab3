package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/stacktest"
)

// TestSockperfBudget opens more connections, each in the middle of a
// message, than the sockperf budget has buffers for: the buffers held
// never exceed the budget, the connections beyond it wait for room and are
// counted, and once the messages are completed every one is answered and
// every buffer given back.
func TestSockperfBudget(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	const budgetBufs, conns = 4, 6
	srv, st := spServer(t, rx, Config{SockperfMemory: budgetBufs * sockperfBufSize})
	const limit = budgetBufs * sockperfBufSize
	var (
		mu   sync.Mutex
		peak uint64
	)
	sample := func() uint64 {
		v := spCounter(st, "server_buf_bytes_current")
		mu.Lock()
		peak = max(peak, v)
		mu.Unlock()
		return v
	}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(100 * time.Microsecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	defer func() { close(stop); <-sampled }()

	msgs := make([][]byte, conns)
	cs := make([]net.Conn, conns)
	for i := range cs {
		cs[i] = spDial(t, peer)
		msgs[i] = spMsg(uint64(i), spPing, 1000+i, 0)
		if _, err := cs[i].Write(msgs[i][:100]); err != nil {
			t.Fatal(err)
		}
	}
	// Every connection read its part, or waits for room to.
	spWaitFor(t, fmt.Sprintf("%d connections holding a buffer or waiting for one", conns), func() bool {
		return sample()/sockperfBufSize+spCounter(st, "sockperf_buffer_waits") >= conns
	})
	if got := sample(); got > limit {
		t.Fatalf("server_buf_bytes_current with %d partial messages: got %d, want at most the budget's %d", conns, got, limit)
	}
	if got, want := spCounter(st, "sockperf_buffer_waits"), uint64(conns-budgetBufs); got != want {
		t.Errorf("sockperf_buffer_waits: got %d, want %d", got, want)
	}
	if n := len(srv.budget); n != budgetBufs {
		t.Errorf("budget tokens held: got %d, want %d", n, budgetBufs)
	}

	for i, c := range cs {
		if _, err := c.Write(msgs[i][100:]); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cs {
		b := make([]byte, len(msgs[i]))
		if _, err := io.ReadFull(c, b); err != nil || !bytes.Equal(b, spReply(msgs[i])) {
			t.Fatalf("connection %d: reply %x... (%v), want %x...", i, b[:16], err, spReply(msgs[i])[:16])
		}
	}
	spWaitCounter(t, st, "server_buf_bytes_current", 0)
	spWaitFor(t, "every budget token back", func() bool { return len(srv.budget) == 0 })
	mu.Lock()
	defer mu.Unlock()
	if peak > limit {
		t.Errorf("server_buf_bytes_current: peak %d, want at most the budget's %d", peak, limit)
	}
	if got := spCounter(st, "sockperf_message_timeouts"); got != 0 {
		t.Errorf("sockperf_message_timeouts: got %d, want 0", got)
	}
}

// spWaitFor waits until cond holds.
func spWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
	}
}

// TestSockperfMessageTimeout: a peer that trickles a message a byte at a
// time, each byte well within the idle timeout, has its connection closed
// once the message is older than the message timeout, counted; one whose
// messages each arrive in pieces but whole within it is served past it.
func TestSockperfMessageTimeout(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	const timeout = time.Second // short for the test; long beside a message's pieces (load stretches them)
	_, st := spServerOn(t, rx, spAddr, Config{}, func(srv *SockperfServer) { srv.msgTimeout = timeout })

	t.Run("trickle", func(t *testing.T) {
		c := spDial(t, peer)
		closed := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 1))
			closed <- err
		}()
		m := spMsg(1, spPing, 1000, 0)
		// A byte every 20 ms, up to 500 (10 s, 10 times the timeout):
		// until the server closes the connection.
		var err error
		for i := 0; err == nil; i++ {
			if i == 500 {
				t.Fatalf("connection still open after trickling 500 bytes of a message over 10s: want it closed at the %v message timeout", timeout)
			}
			if _, werr := c.Write(m[i : i+1]); werr != nil {
				err = <-closed // the server's close came first
				break
			}
			select {
			case err = <-closed:
			case <-time.After(20 * time.Millisecond):
			}
		}
		if !errors.Is(err, io.EOF) {
			t.Errorf("read after trickling: got %v, want io.EOF (the server's close)", err)
		}
		spWaitCounter(t, st, "sockperf_message_timeouts", 1)
		if got := spCounter(st, "server_idle_timeouts"); got != 0 {
			t.Errorf("server_idle_timeouts: got %d, want 0", got)
		}
		spWaitCounter(t, st, "server_buf_bytes_current", 0)
	})

	t.Run("whole in time", func(t *testing.T) {
		c := spDial(t, peer)
		// Each message in three pieces 25 ms apart: 40 of them take
		// three times the message timeout, each one a thirteenth of it.
		b := make([]byte, 2000)
		for seq := range 40 {
			m := spMsg(uint64(seq), spPing, 1000, 0)
			for _, piece := range [][]byte{m[:7], m[7:500], m[500:]} {
				if _, err := c.Write(piece); err != nil {
					t.Fatal(err)
				}
				time.Sleep(25 * time.Millisecond)
			}
			if _, err := io.ReadFull(c, b[:len(m)]); err != nil || !bytes.Equal(b[:len(m)], spReply(m)) {
				t.Fatalf("message %d: reply %x... (%v), want %x...", seq, b[:16], err, spReply(m)[:16])
			}
		}
		if got := spCounter(st, "sockperf_message_timeouts"); got != 1 {
			t.Errorf("sockperf_message_timeouts: got %d, want the trickler's 1", got)
		}
	})
}

// TestSockperfPrefixLimit connects from many addresses of one /24 and of
// one /64, each within the per-source bound: the connections beyond the
// per-prefix bound are closed at once and counted, per prefix.
func TestSockperfPrefixLimit(t *testing.T) {
	const addrs = 7
	peerAddrs := []netip.Prefix{}
	var v4s, v6s []netip.Addr
	for i := range addrs {
		a4 := netip.AddrFrom4([4]byte{192, 0, 2, byte(2 + i)})
		a6 := netip.MustParseAddr(fmt.Sprintf("2001:db8::%x:%x", 0x100+i, i+2))
		v4s, v6s = append(v4s, a4), append(v6s, a6)
		peerAddrs = append(peerAddrs, netip.PrefixFrom(a4, 24), netip.PrefixFrom(a6, 64))
	}
	rx, peer := stacktest.NewPair(t,
		stack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64")}},
		stack.Config{Addrs: peerAddrs})
	const perSource, perPrefix = 2, 5
	ap := netip.MustParseAddrPort("[::]:11111")
	_, st := spServerOn(t, rx, ap, Config{MaxConnsPerSource: perSource, MaxConnsPerPrefix: perPrefix}, nil)
	for _, fam := range []struct {
		name string
		srcs []netip.Addr
		dst  netip.AddrPort
	}{
		{"/24", v4s, netip.MustParseAddrPort("192.0.2.1:11111")},
		{"/64", v6s, netip.MustParseAddrPort("[2001:db8::1]:11111")},
	} {
		t.Run(fam.name, func(t *testing.T) {
			before := spCounter(st, "server_conns_prefix_refused")
			// One connection from each address, each served until the
			// prefix holds perPrefix, each refused after.
			for i, src := range fam.srcs {
				c := spDialFrom(t, peer, src, fam.dst)
				m := spMsg(uint64(i), spPing, 64, 0)
				if _, err := c.Write(m); err != nil {
					t.Fatal(err)
				}
				b := make([]byte, len(m))
				_, err := io.ReadFull(c, b)
				if i < perPrefix {
					if err != nil || !bytes.Equal(b, spReply(m)) {
						t.Fatalf("connection %d of the prefix, from %v: reply %x (%v), want %x", i+1, src, b, err, spReply(m))
					}
					continue
				}
				if err == nil {
					t.Fatalf("connection %d of the prefix, from %v, over a prefix bound of %d: answered, want it closed by the server", i+1, src, perPrefix)
				}
				spWaitCounter(t, st, "server_conns_prefix_refused", before+uint64(i+1-perPrefix))
			}
			if got := spCounter(st, "server_conns_source_refused"); got != 0 {
				t.Errorf("server_conns_source_refused: got %d, want 0 (one connection per address)", got)
			}
		})
	}
}

// spDialFrom connects from peer's address src to dst, closed at cleanup.
func spDialFrom(t *testing.T, peer *stack.Stack, src netip.Addr, dst netip.AddrPort) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	proto := ipv4.ProtocolNumber
	if dst.Addr().Is6() {
		proto = ipv6.ProtocolNumber
	}
	c, err := gonet.DialTCPWithBind(ctx, peer.GVisor(),
		tcpip.FullAddress{Addr: tcpip.AddrFromSlice(src.AsSlice())},
		tcpip.FullAddress{Addr: tcpip.AddrFromSlice(dst.Addr().AsSlice()), Port: dst.Port()}, proto)
	if err != nil {
		t.Fatalf("dial %v from %v: %v", dst, src, err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return c
}

func TestPrefixOf(t *testing.T) {
	for _, tc := range []struct {
		src  netip.Addr
		want netip.Prefix
	}{
		{netip.MustParseAddr("192.0.2.77"), netip.MustParsePrefix("192.0.2.0/24")},
		{netip.MustParseAddr("2001:db8:1:2:3:4:5:6"), netip.MustParsePrefix("2001:db8:1:2::/64")},
		{netip.MustParseAddr("fe80::1%eth0"), netip.MustParsePrefix("fe80::/64")},
		{netip.Addr{}, netip.Prefix{}},
	} {
		if got := prefixOf(tc.src); got != tc.want {
			t.Errorf("prefixOf(%v): got %v, want %v", tc.src, got, tc.want)
		}
	}
}
