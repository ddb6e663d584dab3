package stack

import (
	"context"
	"crypto/sha256"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/ustack/ustack/internal/testutil"
)

// rcvBufMax returns the stack's TCP receive buffer range's Max.
func rcvBufMax(s *Stack) int {
	var rs tcpip.TCPReceiveBufferSizeRangeOption
	s.ip.TransportProtocolOption(tcp.ProtocolNumber, &rs)
	return rs.Max
}

// memConns opens n connections from peer to l on rx's address and
// returns both ends of each, closed at cleanup.
func memConns(t *testing.T, peer *Stack, l net.Listener, n int) (dialed, accepted []net.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range n {
		c, err := peer.DialTCP(ctx, netip.MustParseAddrPort("192.0.2.1:9"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		a, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		dialed, accepted = append(dialed, c), append(accepted, a)
	}
	return dialed, accepted
}

// transfer sends n bytes from c to a, which reads them, and checks their
// SHA-256.
func transfer(t *testing.T, c, a net.Conn, n int, seed uint64) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(60 * time.Second))
	a.SetReadDeadline(time.Now().Add(60 * time.Second))
	got := make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		io.CopyN(h, a, int64(n))
		var sum [32]byte
		h.Sum(sum[:0])
		got <- sum
	}()
	want, err := sendAndHash(c, n, 32<<10, seed)
	if err != nil {
		t.Fatal(err)
	}
	if sum := <-got; sum != want {
		t.Fatalf("sha256 of %d bytes read: got %x, want %x", n, sum, want)
	}
}

// fill writes n bytes to each of conns in the background (a write blocks
// once the peer's window is shut); the writers end when the test closes
// the connections, and the returned wait waits for them.
func fill(conns []net.Conn, n int) (wait func()) {
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { sendAndHash(c, n, 32<<10, uint64(100+i)) })
	}
	return wg.Wait
}

// TestTCPMemPressure checks the governor's memory pressure: 64
// connections that never read, whose buffers (1 MiB each by default)
// commit far more than an 8 MiB TCPMemLimit, are shrunk to a fair share,
// auto-tuning is capped there, and the committed memory comes within the
// limit; one connection that reads still completes a transfer; once all
// are closed pressure ends and the configured Max is back.
func TestTCPMemPressure(t *testing.T) {
	const (
		limit = 8 << 20
		conns = 64
		rmax  = 64 << 20
	)
	rx, peer := pairConfig(t, Config{TCPMemLimit: limit, TCPReceiveBufferMax: rmax})
	l, err := rx.ListenTCP(netip.MustParseAddrPort("192.0.2.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dialed, accepted := memConns(t, peer, l, conns+1)
	testutil.WaitFor(t, "committed memory within the limit", func() bool {
		return counterValue(rx, "tcp_mem_committed_bytes") <= limit
	})
	if v := counterValue(rx, "tcp_mem_pressure"); v != 1 {
		t.Errorf("tcp_mem_pressure: got %d, want 1", v)
	}
	if v := counterValue(rx, "tcp_mem_pressure_entered"); v == 0 {
		t.Errorf("tcp_mem_pressure_entered: got 0, want > 0")
	}
	if v := counterValue(rx, "tcp_mem_rcvbuf_shrinks"); v < conns {
		t.Errorf("tcp_mem_rcvbuf_shrinks: got %d, want >= %d", v, conns)
	}
	if got, want := rcvBufMax(rx), limit/(conns+1); got != want {
		t.Errorf("receive buffer Max under pressure: got %d, want %d (the fair share)", got, want)
	}
	wait := fill(dialed[1:], 1<<20)
	// Auto-tuning grows the reading connection's buffer, but not past
	// the fair share: the committed memory stays within the limit.
	stop, peak := make(chan struct{}), make(chan uint64)
	go func() {
		var m uint64
		for {
			m = max(m, counterValue(rx, "tcp_mem_committed_bytes"))
			select {
			case <-stop:
				peak <- m
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	transfer(t, dialed[0], accepted[0], 8<<20, 1)
	close(stop)
	if m := <-peak; m > limit {
		t.Errorf("tcp_mem_committed_bytes during the transfer: peak %d, want <= %d", m, limit)
	}
	testutil.WaitFor(t, "the paused connections' queues to fill", func() bool {
		// gVisor advertises half the free buffer (rcvAdvWndScale, as
		// Linux's tcp_adv_win_scale 1): at most 64 KiB each here.
		return counterValue(rx, "tcp_rcv_queued_bytes_current") >= conns*TCPMemFloor/2
	})
	committed, queued := counterValue(rx, "tcp_mem_committed_bytes"), counterValue(rx, "tcp_rcv_queued_bytes_current")
	t.Logf("%d connections paused: committed %d bytes, queued %d", conns, committed, queued)
	if committed > limit {
		t.Errorf("tcp_mem_committed_bytes after the transfer: got %d, want <= %d", committed, limit)
	}
	if v := counterValue(rx, "tcp_mem_hard_limit"); v != 0 {
		t.Errorf("tcp_mem_hard_limit: got %d, want 0 (the fair share is above the floor)", v)
	}
	for i := range dialed {
		dialed[i].Close()
		accepted[i].Close()
	}
	wait()
	testutil.WaitFor(t, "pressure to end", func() bool { return counterValue(rx, "tcp_mem_pressure") == 0 })
	if got := rcvBufMax(rx); got != rmax {
		t.Errorf("receive buffer Max after pressure: got %d, want %d", got, rmax)
	}
}

// TestTCPMemHardLimit checks the hard limit: with more connections than
// the limit holds at TCPMemFloor each, the two that hold more than the
// floor unread get no more (rx_tcp_mem_drops), while one that reads, under
// its floor, still gets all its data.
func TestTCPMemHardLimit(t *testing.T) {
	const (
		limit  = 4 << 20
		full   = 2
		filled = 256 << 10 // half of a 1 MiB buffer is the most a window offers
		conns  = 80        // 82 at the floor commit 5.1 MiB
	)
	rx, peer := pairConfig(t, Config{TCPMemLimit: limit})
	l, err := rx.ListenTCP(netip.MustParseAddrPort("192.0.2.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Two connections, 2 MiB committed (below the 3 MiB of pressure),
	// each with 256 KiB unread.
	fd, fa := memConns(t, peer, l, full)
	for i, c := range fd {
		if _, err := sendAndHash(c, filled, 32<<10, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "the first connections' queues", func() bool {
		return counterValue(rx, "tcp_rcv_queued_bytes_current") == full*filled
	})
	if v := counterValue(rx, "tcp_mem_pressure"); v != 0 {
		t.Fatalf("tcp_mem_pressure with %d connections: got %d, want 0", full, v)
	}
	dialed, accepted := memConns(t, peer, l, conns)
	testutil.WaitFor(t, "the hard limit", func() bool { return counterValue(rx, "tcp_mem_hard_limit") == 1 })
	wait := fill(fd, 256<<10)
	testutil.WaitFor(t, "rx_tcp_mem_drops", func() bool { return counterValue(rx, "rx_tcp_mem_drops") > 0 })
	transfer(t, dialed[0], accepted[0], 1<<20, 7)
	if got := counterValue(rx, "tcp_rcv_queued_bytes_current"); got > full*filled+full*TCPMemFloor {
		t.Errorf("tcp_rcv_queued_bytes_current: got %d, want <= %d (the full connections got more than the floor)", got, full*filled+full*TCPMemFloor)
	}
	for _, c := range append(append(fd, fa...), append(dialed, accepted...)...) {
		c.Close()
	}
	wait()
	testutil.WaitFor(t, "pressure to end", func() bool { return counterValue(rx, "tcp_mem_pressure") == 0 })
	if v := counterValue(rx, "tcp_mem_hard_limit"); v != 0 {
		t.Errorf("tcp_mem_hard_limit after close: got %d, want 0", v)
	}
}

func TestTCPMemLimits(t *testing.T) {
	for _, tc := range []struct {
		limit, pressure         int64
		wantLimit, wantPressure int64
		on, err                 bool
	}{
		{0, 0, DefaultTCPMemLimit, DefaultTCPMemLimit / 4 * 3, true, false},
		{8 << 20, 0, 8 << 20, 6 << 20, true, false},
		{8 << 20, 1 << 20, 8 << 20, 1 << 20, true, false},
		{-1, 0, 0, 0, false, false},
		{8 << 20, 9 << 20, 0, 0, false, true},
		{8 << 20, -1, 0, 0, false, true},
	} {
		l, p, on, err := tcpMemLimits(&Config{TCPMemLimit: tc.limit, TCPMemPressure: tc.pressure})
		if l != tc.wantLimit || p != tc.wantPressure || on != tc.on || (err != nil) != tc.err {
			t.Errorf("limit %d pressure %d: got %d, %d, %v, %v, want %d, %d, %v, error %v", tc.limit, tc.pressure, l, p, on, err, tc.wantLimit, tc.wantPressure, tc.on, tc.err)
		}
	}
}

// TestTCPMemRefuse checks which segments the hard limit drops: those with
// payload of a flow in the set, SYN, FIN and RST aside, in IPv4 and IPv6.
func TestTCPMemRefuse(t *testing.T) {
	over := []uint64{flowHash(zwLocal4.AsSlice(), zwRemote4.AsSlice(), 7, 40000), flowHash(zwLocal6.AsSlice(), zwRemote6.AsSlice(), 7, 40000)}
	slices.Sort(over)
	for _, tc := range []struct {
		name  string
		frame []byte
		drop  bool
	}{
		{"data", zwSegment(zwRemote4, zwLocal4, 40000, 7, 100, 2, header.TCPFlagAck, 100, nil, 1448), true},
		{"data/v6", zwSegment(zwRemote6, zwLocal6, 40000, 7, 100, 2, header.TCPFlagAck|header.TCPFlagPsh, 100, nil, 1448), true},
		{"pure-ack", zwSegment(zwRemote4, zwLocal4, 40000, 7, 100, 2, header.TCPFlagAck, 100, nil, 0), false},
		{"fin", zwSegment(zwRemote4, zwLocal4, 40000, 7, 100, 2, header.TCPFlagAck|header.TCPFlagFin, 100, nil, 10), false},
		{"syn", zwSegment(zwRemote4, zwLocal4, 40000, 7, 100, 0, header.TCPFlagSyn, 100, nil, 0), false},
		{"rst", zwSegment(zwRemote4, zwLocal4, 40000, 7, 100, 2, header.TCPFlagRst|header.TCPFlagAck, 100, nil, 10), false},
		{"other-flow", zwSegment(zwRemote4, zwLocal4, 40001, 7, 100, 2, header.TCPFlagAck, 100, nil, 1448), false},
		{"other-direction", zwSegment(zwLocal4, zwRemote4, 7, 40000, 100, 2, header.TCPFlagAck, 100, nil, 1448), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e linkEndpoint
			var d captureDispatcher
			e.Attach(&d)
			e.mem.over.Store(&over)
			e.mem.hard.Store(true)
			if got := e.tcpMemRefuse(tc.frame); got != tc.drop {
				t.Errorf("dropped: got %v, want %v", got, tc.drop)
			}
			if !tc.drop {
				if len(d.got) != 0 {
					t.Errorf("delivered %d frames for a segment that passes, want 0", len(d.got))
				}
				return
			}
			// The dropped segment's ACK goes to gVisor alone: the
			// same headers without payload or PSH, checksums valid.
			ip, tcpOff, tcpLen, _, _ := tcpHeaders(tc.frame, ethLen)
			if len(d.got) != 1 || len(d.got[0]) != tcpOff+tcpLen {
				t.Fatalf("delivered %d frames (%v), want one pure ACK of %d bytes", len(d.got), d.got, tcpOff+tcpLen)
			}
			ack := d.got[0]
			th, orig := header.TCP(ack[tcpOff:]), header.TCP(tc.frame[tcpOff:])
			if th.Flags() != header.TCPFlagAck || th.SequenceNumber() != orig.SequenceNumber() || th.AckNumber() != orig.AckNumber() || th.WindowSize() != orig.WindowSize() {
				t.Errorf("pure ACK: flags %v seq %d ack %d wnd %d, want %v %d %d %d", th.Flags(), th.SequenceNumber(), th.AckNumber(), th.WindowSize(), header.TCPFlagAck, orig.SequenceNumber(), orig.AckNumber(), orig.WindowSize())
			}
			src, dst := ipAddrs(ack[ip:])
			if !th.IsChecksumValid(tcpip.AddrFromSlice(src), tcpip.AddrFromSlice(dst), 0, 0) {
				t.Errorf("pure ACK: TCP checksum invalid")
			}
			if got, want := e.mem.drops.Load(), map[bool]uint64{true: 1}[tc.drop]; got != want {
				t.Errorf("rx_tcp_mem_drops: got %d, want %d", got, want)
			}
		})
	}
}

// TestTCPMemRefuseNoAllocs pins the hard limit's cost to the segments it
// lets pass: a parse and a binary search, no allocation.
func TestTCPMemRefuseNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	over := []uint64{flowHash(zwLocal4.AsSlice(), zwRemote4.AsSlice(), 7, 40000)}
	var e linkEndpoint
	e.mem.over.Store(&over)
	e.mem.hard.Store(true)
	in := zwSegment(zwRemote4, zwLocal4, 40001, 7, 100, 2, header.TCPFlagAck, 100, nil, 1448)
	if a := testing.AllocsPerRun(500, func() {
		if e.tcpMemRefuse(in) {
			t.Fatal("dropped a flow not in the set")
		}
	}); a != 0 {
		t.Errorf("allocations per segment: got %v, want 0", a)
	}
}

// TestDefaultTCPMemLimit pins the default limit to Linux's tcp_init_mem
// sizing: 3/32 of the memory, 512 MiB where it is unknown.
func TestDefaultTCPMemLimit(t *testing.T) {
	for _, tc := range []struct{ ram, want int64 }{
		{24 << 30, 2304 << 20},
		{0, 512 << 20},
	} {
		if got := defaultTCPMemLimit(tc.ram); got != tc.want {
			t.Errorf("defaultTCPMemLimit(%d): got %d, want %d", tc.ram, got, tc.want)
		}
	}
	if totalRAM() <= 0 {
		t.Logf("memory size unknown here: default %d", DefaultTCPMemLimit)
	}
}
