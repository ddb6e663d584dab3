package serve

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/stacktest"
)

// TestIPerf3SpoofedHello: a UDP hello from another address than the
// control connection's (a spoofed source, B) is dropped and counted, and
// the server sends nothing to B; the client's own hello (from A) then
// gets the stream, and the reverse test sends to A only.
func TestIPerf3SpoofedHello(t *testing.T) {
	rx, peer := stacktest.NewPair(t,
		stack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}},
		stack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24"), netip.MustParsePrefix("192.0.2.3/24")}})
	srv, results := startIPerf3(t, rx, IPerf3Config{})
	c := dialIPerf3(t, peer, testCookie)
	a := addrPortOf(c.ctrl.LocalAddr()).Addr()
	b := netip.MustParseAddr("192.0.2.3")
	if a == b {
		b = netip.MustParseAddr("192.0.2.2")
	}
	const blocks = 5
	// -u -R -b 0: as fast as the server sends, which the hello aims.
	c.start(map[string]any{"udp": true, "time": 10, "blockcount": blocks, "parallel": 1, "reverse": true, "len": 200, "bandwidth": 0})

	udpBefore := counterMap(peer, nil)["udp_packets_received"]
	spoof, err := peer.ListenUDP(netip.AddrPortFrom(b, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer spoof.Close()
	dst := net.UDPAddrFromAddrPort(iperf3Addr)
	if _, err := spoof.WriteTo(binary.LittleEndian.AppendUint32(nil, iperf3UDPConnectMsg), dst); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the spoofed hello counted", func() bool { return counterMap(rx, srv.stats)["iperf3_udp_hellos_rejected"] == 1 })

	u := c.udpHello() // from A: answered
	c.expect(iperf3TestStart)
	c.expect(iperf3TestRunning)
	buf := make([]byte, 2048)
	for range blocks {
		if _, _, err := u.ReadFrom(buf); err != nil {
			t.Fatal(err)
		}
	}
	c.finish(iperf3Results{Streams: []iperf3StreamResult{{ID: 1, Bytes: blocks * 200, Packets: blocks}}})
	if r := result(t, results); r.Err != nil || r.BytesSent != blocks*200 {
		t.Errorf("result: got err %v sent %d, want nil %d", r.Err, r.BytesSent, blocks*200)
	}
	// Everything the server sent over UDP since the spoofed hello has
	// arrived (the wire is in order, and the results came after it): the
	// reply to A's hello and the blocks, nothing for B.
	if got, want := counterMap(peer, nil)["udp_packets_received"]-udpBefore, uint64(1+blocks); got != want {
		t.Errorf("UDP datagrams the peer received during the test: got %d, want %d (A's reply and blocks only)", got, want)
	}
	spoof.SetReadDeadline(time.Now())
	if n, from, err := spoof.ReadFrom(buf); err == nil {
		t.Errorf("spoofed address B got %d bytes from %v, want nothing", n, from)
	}
	if got := counterMap(rx, srv.stats)["iperf3_udp_hellos_rejected"]; got != 1 {
		t.Errorf("iperf3_udp_hellos_rejected: got %d, want 1", got)
	}
}

// TestIPerf3IdleTimeout: a running test in which nothing moves ends after
// the idle timeout, with SERVER_TERMINATE and counted, and the server is
// free for the next client.
func TestIPerf3IdleTimeout(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	srv, results := startIPerf3(t, rx, IPerf3Config{IdleTimeout: time.Second})
	c := dialIPerf3(t, peer, testCookie)
	c.start(map[string]any{"tcp": true, "time": 300, "parallel": 1})
	c.dialStream() // and sends nothing
	c.expect(iperf3TestStart)
	c.expect(iperf3TestRunning)
	c.expect(iperf3ServerTerminate)
	if r := result(t, results); !errors.Is(r.Err, ErrIPerf3Idle) {
		t.Errorf("result error: got %v, want %v", r.Err, ErrIPerf3Idle)
	}
	if got := counterMap(rx, srv.stats)["iperf3_idle_timeouts"]; got != 1 {
		t.Errorf("iperf3_idle_timeouts: got %d, want 1", got)
	}
	next := dialIPerf3(t, peer, testCookie)
	next.expect(iperf3ParamExchange)
}

// TestIPerf3RateCap: what the server sends is paced at the cap, shared by
// its sending streams, whatever -b asked.
func TestIPerf3RateCap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cap      float64
		p        iperf3Params
		wantRate float64 // per stream
	}{
		{"unlimited-b0", 0, iperf3Params{UDP: true, Reverse: true, Parallel: 4}, DefaultIPerf3MaxRate / 4},
		{"over", 1e9, iperf3Params{TCP: true, Reverse: true, Parallel: 2, Bandwidth: 1e9}, 5e8},
		{"bidir", 1e9, iperf3Params{TCP: true, Bidirectional: true, Parallel: 4, Bandwidth: 0}, 2.5e8},
		{"under", 1e9, iperf3Params{UDP: true, Reverse: true, Parallel: 1, Bandwidth: 1e6}, 1e6},
		{"no-cap", -1, iperf3Params{UDP: true, Reverse: true, Parallel: 1}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.p.Time = 10
			set, _, err := tc.p.settings(&IPerf3Config{MaxRate: tc.cap})
			if err != nil {
				t.Fatal(err)
			}
			if set.rate != tc.wantRate {
				t.Errorf("rate per stream: got %v, want %v", set.rate, tc.wantRate)
			}
		})
	}
}

// TestIPerf3PendingBound: with iperf3MaxPending connections already being
// refused, one more is closed at once, without a goroutine, and counted.
func TestIPerf3PendingBound(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	srv, _ := startIPerf3(t, rx, IPerf3Config{})
	a := dialIPerf3(t, peer, testCookie)
	a.expect(iperf3ParamExchange) // the test slot is taken
	for range iperf3MaxPending {
		srv.pending <- struct{}{} // as many refusals under way
	}
	defer func() {
		for range iperf3MaxPending {
			<-srv.pending
		}
	}()
	b := dialIPerf3(t, peer, "one too many")
	if got, err := io.ReadAll(b.ctrl); len(got) != 0 {
		t.Errorf("connection over the bound: got %v, %v; want it closed without ACCESS_DENIED", got, err)
	}
	if got := counterMap(rx, srv.stats)["iperf3_conns_dropped"]; got != 1 {
		t.Errorf("iperf3_conns_dropped: got %d, want 1", got)
	}
}
