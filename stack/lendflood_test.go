package stack

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// tcpSpy is a Wire that passes frames through and remembers, per local
// port, the sequence and acknowledgement numbers and the TCP options of
// the last TCP segment its stack sent: enough to forge segments of those
// connections.
type tcpSpy struct {
	*driver.MemWire
	mu sync.Mutex
	// +checklocks:mu
	conns map[uint16]spyConn
}

type spyConn struct {
	nxt, ack uint32
	opts     []byte
	acked    bool // an ACK without SYN was seen: the handshake is done
}

func (s *tcpSpy) Write(b []byte) error {
	f := b[driver.VirtioNetHdrLen:]
	if len(f) >= header.EthernetMinimumSize+header.IPv4MinimumSize+header.TCPMinimumSize &&
		header.Ethernet(f).Type() == header.IPv4ProtocolNumber {
		ip := header.IPv4(f[header.EthernetMinimumSize:])
		if ip.Protocol() == uint8(header.TCPProtocolNumber) {
			tcp := header.TCP(ip[ip.HeaderLength():])
			n := uint32(int(ip.TotalLength()) - int(ip.HeaderLength()) - int(tcp.DataOffset()))
			if tcp.Flags().Contains(header.TCPFlagSyn) {
				n++
			}
			c := spyConn{nxt: tcp.SequenceNumber() + n, ack: tcp.AckNumber(),
				opts:  append([]byte(nil), tcp[header.TCPMinimumSize:tcp.DataOffset()]...),
				acked: tcp.Flags() == header.TCPFlagAck}
			s.mu.Lock()
			if old, ok := s.conns[tcp.SourcePort()]; ok && old.acked {
				c.acked = true
			}
			s.conns[tcp.SourcePort()] = c
			s.mu.Unlock()
		}
	}
	return s.MemWire.Write(b)
}

func (s *tcpSpy) conn(port uint16) (spyConn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.conns[port]
	return c, ok && c.acked
}

var (
	floodRxMAC   = tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 1})
	floodPeerMAC = tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 2})
	floodRx      = netip.MustParseAddrPort("192.0.2.1:20")
)

// tcpSegment returns a frame, virtio-net header first, of a segment from
// the peer's port to floodRx with payload, seq and ack, carrying opts.
func tcpSegment(port uint16, seq, ack uint32, opts, payload []byte) []byte {
	return testutil.Frame{
		Headroom: driver.VirtioNetHdrLen, SrcMAC: floodPeerMAC, DstMAC: floodRxMAC,
		Src: tcpip.AddrFrom4([4]byte{192, 0, 2, 2}), Dst: tcpip.AddrFrom4(floodRx.Addr().As4()),
		SrcPort: port, DstPort: floodRx.Port(), Seq: seq, Ack: ack,
		Flags: header.TCPFlagAck | header.TCPFlagPsh, Window: 65535, TCPOptions: opts, Payload: payload,
	}.Build()
}

// fillerFrame is a full-size UDP datagram to a port nobody listens on: it
// takes room in the RX ring and is dropped by gVisor, and puts the next
// segment on another page.
func fillerFrame() []byte {
	const ipLen = 1500
	return testutil.Frame{
		Headroom: driver.VirtioNetHdrLen, SrcMAC: floodPeerMAC, DstMAC: floodRxMAC,
		Src: tcpip.AddrFrom4([4]byte{192, 0, 2, 2}), Dst: tcpip.AddrFrom4(floodRx.Addr().As4()),
		Proto: header.UDPProtocolNumber, SrcPort: 9, DstPort: 7,
		Payload: make([]byte, ipLen-header.IPv4MinimumSize-header.UDPMinimumSize),
		Csum:    testutil.CsumZero, // none (RFC 768)
	}.Build()
}

// floodResult is what a flood left the receiver's pool holding.
type floodResult struct {
	peakPages, lentPages int64
	c                    map[string]uint64
}

// oooFlood opens conns connections from a peer to a zero-copy stack built
// with cfg, then sends perConn out-of-order segments of size bytes on each
// (every other byte after the next expected one, so none ever becomes in
// order), each on an RX page of its own, and returns the pool's peak.
func oooFlood(t *testing.T, cfg Config, conns, perConn, size int) floodResult {
	t.Helper()
	a, b := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535+18)
	// A ring large enough that no page is dropped from it, so that
	// rx_pp_pages_in_use counts every page gVisor pins.
	pool := testutil.NewPool(t, bufpool.Config{Memory: NewChunkMemory(), RingSize: 1 << 16})
	cfg.Wire, cfg.MAC, cfg.ZeroCopy = a, [6]byte([]byte(floodRxMAC)), true
	cfg.Addrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}
	cfg.Driver.Pool = pool
	// MTU 4096: mlx5's nonlinear RQ, whose payload is in frags to lend; at
	// 1500 the linear RQ hands the payload up in the packet's head frag.
	cfg.Driver.MTU = 4096
	rx, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	spy := &tcpSpy{MemWire: b, conns: map[uint16]spyConn{}}
	peer, err := New(Config{Wire: spy, MAC: [6]byte([]byte(floodPeerMAC)), Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
	if err != nil {
		rx.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		peer.Close()
		rx.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("pages still in use after Close: got %d, want 0", n)
		}
	})
	l, err := rx.ListenTCP(floodRx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var ports []uint16
	for range conns {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := peer.DialTCP(ctx, floodRx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		sc, err := l.Accept() // left unread: an idle socket
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sc.Close() })
		ports = append(ports, uint16(c.LocalAddr().(*net.TCPAddr).Port))
	}
	known := make([]spyConn, len(ports))
	testutil.WaitFor(t, "every handshake's last ACK", func() bool {
		for i, p := range ports {
			c, ok := spy.conn(p)
			if !ok {
				return false
			}
			known[i] = c
		}
		return true
	})

	// Frames the poll loop built packets from: delivered, or dropped.
	built := func() uint64 { return counterMap(rx)["rx_packets"] }
	segs := func() uint64 { return rx.ip.Stats().TCP.ValidSegmentsReceived.Value() }
	segsBefore := segs()
	filler := fillerFrame()
	payload := make([]byte, size)
	var res floodResult
	const batch = 512 // frames, well under the wire's depth
	sent, builtBefore := 0, built()
	for k := range perConn {
		for i, p := range ports {
			c := known[i]
			// Segment k covers [nxt+1+k*(size+1), +size): a gap of one
			// byte before each, never filled.
			seq := c.nxt + 1 + uint32(k*(size+1))
			payload[0] = byte(seq) // some content
			frames := [][]byte{tcpSegment(p, seq, c.ack, c.opts, payload), filler, filler, filler}
			for _, f := range frames {
				if err := b.Write(f); err != nil {
					t.Fatal(err)
				}
			}
			sent += len(frames)
			if sent%batch < len(frames) || k == perConn-1 && i == len(ports)-1 {
				// Let the receiver catch up (the wire drops what does not
				// fit): its poll loop has had every frame sent so far, so
				// that the pages in flight are a batch's whatever its
				// speed.
				testutil.WaitFor(t, "the receiver to take what was sent", func() bool {
					return built() >= builtBefore+uint64(sent) || b.Dropped() > 0
				})
				res.peakPages = max(res.peakPages, int64(pool.InUse()))
			}
		}
	}
	if n := b.Dropped(); n != 0 {
		t.Fatalf("the wire dropped %d frames", n)
	}
	// Let the last batch reach gVisor.
	testutil.WaitFor(t, "the segments to reach gVisor", func() bool {
		return segs() >= segsBefore+uint64(conns*perConn)
	})
	res.peakPages = max(res.peakPages, int64(pool.InUse()))
	res.lentPages = int64(pool.LentPages())
	res.c = counterMap(rx)
	t.Logf("%d connections x %d out-of-order %d-byte segments: peak pages %d, lent now %d, views lent %d, copied small %d, over limit %d, tcp segments %d",
		conns, perConn, size, res.peakPages, res.lentPages, res.c["zc_views_lent"], res.c["zc_frags_copied_small"],
		res.c["zc_frags_copied_over_limit"], res.c["tcp_segments_received"])
	return res
}

// TestLendFlood: a flood of out-of-order segments over many connections,
// each on an RX page of its own, does not grow a zero-copy stack's pool
// with the flood. 1-byte segments are copied (lent, each would pin a page:
// gVisor charges a segment about its size); 1100-byte ones are lent up to
// ZeroCopyMaxLent pages, then copied. Peak pool pages, before (copy of
// the base commit) and after, on the loaded 2-core test machine:
//
//	segments          1-byte         1100-byte (max lent 64)
//	128 x 32 = 4096   4792 -> 207    5880 -> 296
//	256 x 32 = 8192   9520 -> 212    11696 -> 310
//
// Before, a page per segment and more; now flat whatever the flood.
func TestLendFlood(t *testing.T) {
	// 32 segments a connection: the 1100-byte ones span 35 KB, inside any
	// receive window gVisor opens (beyond it, it drops them).
	const conns, perConn = 128, 32
	// One page per segment would be conns*perConn; the receiver's working
	// set under this traffic (batches of 512 frames, about a page per
	// four) is about 200 pages, and the lent bound adds its own.
	const maxPeak = 1024
	t.Run("1-byte", func(t *testing.T) {
		r := oooFlood(t, Config{}, conns, perConn, 1)
		if r.c["zc_frags_copied_small"] < conns*perConn {
			t.Errorf("zc_frags_copied_small: got %d, want at least %d", r.c["zc_frags_copied_small"], conns*perConn)
		}
		if r.peakPages > maxPeak {
			t.Errorf("peak pool pages: got %d, want at most %d (one per segment: %d)", r.peakPages, maxPeak, conns*perConn)
		}
	})
	t.Run("1100-byte", func(t *testing.T) {
		const maxLent = 64
		r := oooFlood(t, Config{ZeroCopyMaxLent: maxLent}, conns, perConn, 1100)
		// Under -race, with an earlier pacing, gVisor was seen to hold
		// fewer than 64 of the segments' pages (not chased): the bound
		// was then not reached. TestLendBound pins it in any case.
		if r.c["zc_frags_copied_over_limit"] == 0 && !testutil.RaceEnabled {
			t.Error("zc_frags_copied_over_limit: got 0, want > 0")
		}
		// A few workers may lend at once past the check: a little slack.
		if r.lentPages > maxLent+8 {
			t.Errorf("pages lent: got %d, want at most %d", r.lentPages, maxLent+8)
		}
		if r.peakPages > maxPeak {
			t.Errorf("peak pool pages: got %d, want at most %d (one per segment: %d)", r.peakPages, maxPeak, conns*perConn)
		}
	})
}
