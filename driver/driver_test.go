package driver

import (
	"bytes"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// collector is a Handler that keeps copies of what it is given.
type collector struct {
	mu sync.Mutex
	// +checklocks:mu
	frames [][]byte
	// +checklocks:mu
	linears []int
	// +checklocks:mu
	nfrags []int // len(Frags) of each packet
	// +checklocks:mu
	verified []bool // CsumVerified of each packet
	n        atomic.Int64
	bytes    atomic.Int64 // payload bytes (after the headers) handed over
	keep     bool
}

func (c *collector) Deliver(p *Packet) {
	if c.keep {
		b := make([]byte, p.Len)
		p.CopyTo(b)
		c.mu.Lock()
		c.frames = append(c.frames, b)
		c.linears = append(c.linears, len(p.Linear))
		c.nfrags = append(c.nfrags, len(p.Frags))
		c.verified = append(c.verified, p.CsumVerified)
		c.mu.Unlock()
	}
	c.bytes.Add(int64(p.TotalLen() - p.HdrLen))
	p.Release()
	c.n.Add(1)
}

func (c *collector) Flush(bool) time.Duration { return 0 }

// waitFor waits until c has been given n packets.
func (c *collector) waitFor(t testing.TB, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.n.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("packets delivered: got %d, want %d", c.n.Load(), n)
		}
		runtime.Gosched()
	}
}

// newTestDriver starts a driver for cfg on one end of an in-memory wire and
// returns the other end to write frames into.
// Tests poison recycled pages; benchmarks do not.
func newTestDriver(t testing.TB, cfg Config, h Handler) (*Driver, *MemWire) {
	t.Helper()
	return newTestDriverDepth(t, cfg, h, 1024)
}

// newTestDriverDepth is newTestDriver with a wire that queues depth frames
// (each queue preallocates depth super-frames).
func newTestDriverDepth(t testing.TB, cfg Config, h Handler, depth int) (*Driver, *MemWire) {
	t.Helper()
	_, bench := t.(*testing.B)
	return startTestDriver(t, cfg, bufpool.Config{Poison: !bench}, h, depth)
}

// startTestDriver starts a driver for cfg with a page pool of pc (a ring of
// 65536 pages unless pc says otherwise) on one end of an in-memory wire
// that queues depth frames, and returns the other end. At Cleanup, Close
// must return within 30 s and leave no page in use.
func startTestDriver(t testing.TB, cfg Config, pc bufpool.Config, h Handler, depth int) (*Driver, *MemWire) {
	t.Helper()
	a, b := NewMemPair(depth, VirtioNetHdrLen+maxLROFrame)
	if pc.RingSize == 0 {
		pc.RingSize = 1 << 16
	}
	pool := testutil.NewPool(t, pc)
	copy(cfg.MAC[:], pkDstMAC)
	cfg.Pool = pool
	d, err := New(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.Start(h)
	t.Cleanup(func() {
		closeWithin(t, d)
		b.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("pages in use after Close: got %d, want 0", n)
		}
	})
	return d, b
}

// wireFrame returns the virtio-net header h followed by frame.
func wireFrame(h VirtioNetHdr, frame []byte) []byte {
	b := make([]byte, VirtioNetHdrLen+len(frame))
	h.Encode(b)
	copy(b[VirtioNetHdrLen:], frame)
	return b
}

func tcpSuper(t testing.TB, l3 L3Type, payload int) (VirtioNetHdr, []byte, FrameInfo) {
	spec := pkSpec{l3: l3, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh, seq: 1000, ack: 1, payload: pkPayload(payload)}
	gt, mss := uint8(VirtioNetHdrGSOTCPv4), uint16(mss4)
	if l3 == L3IPv6 {
		gt, mss = VirtioNetHdrGSOTCPv6, mss6
	}
	return pkSuperFrame(t, spec, gt, mss)
}

// The MSS of a TCP flow with timestamps at MTU 1500.
const (
	mss4 = 1500 - 20 - 32
	mss6 = 1500 - 40 - 32
)

func TestDriverRx(t *testing.T) {
	const payload = 65000
	for _, tc := range []struct {
		name string
		cfg  Config
		l3   L3Type
	}{
		{"striding/linear/v4", Config{}, L3IPv4},
		{"striding/linear/v6", Config{HDS: 256}, L3IPv6}, // the header copy size does not apply
		{"striding/lro-off/mtu-4096/hds-auto/v4", Config{MTU: 4096}, L3IPv4},
		{"striding/lro-on/hds-auto/v4", Config{LRO: true}, L3IPv4},
		{"striding/lro-off/mtu-9000/hds-256/v6", Config{HDS: 256, MTU: 9000}, L3IPv6},
		{"cyclic/lro-off/hds-auto/v6", Config{RQ: RQCyclic}, L3IPv6},
		{"cyclic/lro-on/hds-256/v4", Config{RQ: RQCyclic, LRO: true, HDS: 256}, L3IPv4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{keep: true}
			d, w := newTestDriver(t, tc.cfg, c)
			h, frame, fi := tcpSuper(t, tc.l3, payload)
			if err := w.Write(wireFrame(h, frame)); err != nil {
				t.Fatal(err)
			}
			want := 1
			if mss := mss4; !tc.cfg.LRO {
				if tc.l3 == L3IPv6 {
					mss = mss6
				}
				want = (payload + mss - 1) / mss
			}
			c.waitFor(t, int64(want))
			c.mu.Lock()
			defer c.mu.Unlock()
			if len(c.frames) != want {
				t.Fatalf("packets: got %d, want %d", len(c.frames), want)
			}
			var got []byte
			for i, f := range c.frames {
				var pfi FrameInfo
				if drop := ParseFrame(f, &pfi); drop != DropNone {
					t.Fatalf("packet %d does not parse: %v", i, drop)
				}
				got = append(got, f[pfi.HeaderLen():pfi.L2Len+pfi.IPLen]...)
				wantLin := MinHeaderLen(&pfi)
				switch {
				case tc.cfg.LinearStride() > 0:
					wantLin = len(f) // mlx5e_skb_from_cqe_mpwrq_linear: the frame
				case tc.cfg.HDS != HDSAuto:
					wantLin = min(tc.cfg.HDS, len(f))
				}
				if c.linears[i] != wantLin {
					t.Errorf("packet %d linear part: got %d bytes, want %d", i, c.linears[i], wantLin)
				}
			}
			if !bytes.Equal(got, frame[fi.HeaderLen():]) {
				t.Errorf("payload reassembled from packets differs from the payload sent (%d vs %d bytes)", len(got), len(frame)-fi.HeaderLen())
			}
			st := d.Stats()
			if tc.cfg.LRO && st.LROFrames.Load() != 1 {
				t.Errorf("rx_lro_packets: got %d, want 1", st.LROFrames.Load())
			}
			if !tc.cfg.LRO && st.GSOSegs.Load() != uint64(want) {
				t.Errorf("rx_gso_segs: got %d, want %d", st.GSOSegs.Load(), want)
			}
			if tc.cfg.HDS == HDSAuto && st.HDSPayload.Load() != 0 {
				t.Errorf("rx_hds_payload_bytes: got %d, want 0", st.HDSPayload.Load())
			}
		})
	}
}

func TestDriverDropsAndContinues(t *testing.T) {
	c := &collector{keep: true}
	d, w := newTestDriver(t, Config{}, c)
	good := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(100)}
	goodFrame := good.build()
	otherMAC := append([]byte(nil), goodFrame...)
	copy(otherMAC[:6], []byte{2, 9, 9, 9, 9, 9})
	mcast := append([]byte(nil), goodFrame...)
	copy(mcast[:6], []byte{0x01, 0x00, 0x5e, 1, 2, 3})
	h, super, _ := tcpSuper(t, L3IPv4, 5000)
	h0 := h
	h0.GSOSize = 0
	hBig := h
	hBig.GSOSize = uint16(len(super) + 1)
	for _, tc := range []struct {
		name string
		b    []byte
		want Drop
	}{
		{"other host", wireFrame(VirtioNetHdr{}, otherMAC), DropOtherHost},
		{"multicast not joined", wireFrame(VirtioNetHdr{}, mcast), DropMulticast},
		{"short ethernet", wireFrame(VirtioNetHdr{}, goodFrame[:10]), DropShortEther},
		{"short vnet header", []byte{1, 2, 3}, DropBadVnetHdr},
		{"gso size 0", wireFrame(h0, super), DropBadGSO},
		{"gso size larger than frame", wireFrame(hBig, super), DropBadGSO},
		{"truncated ip", wireFrame(VirtioNetHdr{}, goodFrame[:20]), DropShortIP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := d.Stats().Dropped[tc.want].Load()
			n := c.n.Load()
			if err := w.Write(tc.b); err != nil {
				t.Fatal(err)
			}
			// A good frame after the bad one must still arrive.
			if err := w.Write(wireFrame(VirtioNetHdr{}, goodFrame)); err != nil {
				t.Fatal(err)
			}
			c.waitFor(t, n+1)
			if got := d.Stats().Dropped[tc.want].Load() - before; got != 1 {
				t.Errorf("%s: got %d, want 1", tc.want, got)
			}
		})
	}
}

// TestRxNoAllocs pins the steady-state receive path (wire read, GSO split,
// ring placement, CQE, poll loop, header split, packet hand-off and release)
// at zero heap allocations per packet.
func TestRxNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	for _, tc := range []struct {
		name   string
		cfg    Config
		tunnel bool // one IPv4-in-IPv6 frame decapsulated, instead of a super-frame
	}{
		{"linear", Config{}, false},
		{"linear-tunnel", tunnelConfig(Config{}), true},
		{"nonlinear-mtu-9000", Config{MTU: 9000}, false},
		{"lro-on", Config{LRO: true}, false},
		{"cyclic-hds-256", Config{RQ: RQCyclic, HDS: 256}, false},
		{"hw-gro-coalesce", Config{HWGRO: HWGROCoalesce}, false},
		{"hw-gro-on", Config{HWGRO: HWGROOn}, false},
		{"nonlinear-tunnel", tunnelConfig(Config{MTU: 4096}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{}
			_, w := newTestDriver(t, tc.cfg, c)
			// Hardware GRO gets 12000 bytes, one session in either
			// mode (has_enough_space ends one at 16 frags; 9 payloads
			// take at most 12).
			payload := 64000
			if tc.cfg.HWGRO != HWGROOff {
				payload = 12000
			}
			h, frame, _ := tcpSuper(t, L3IPv4, payload)
			b := wireFrame(h, frame)
			per := int64(1)
			if !tc.cfg.LRO && tc.cfg.HWGRO == HWGROOff {
				per = int64(payload+1447) / 1448
			}
			if tc.tunnel {
				b = wireFrame(VirtioNetHdr{}, pkTunnel(pkInner(L3IPv4, 1400).build(), pkTunLocal, protoIPIP, false))
				per = 1
			}
			var sent int64
			send := func() {
				if err := w.Write(b); err != nil {
					t.Fatal(err)
				}
				sent += per
				c.waitFor(t, sent)
			}
			for range 200 {
				send() // warm the pools
			}
			allocs := testing.AllocsPerRun(200, send)
			if allocs != 0 {
				t.Errorf("allocations per super-frame (%d packets): got %v, want 0", per, allocs)
			}
		})
	}
}

// BenchmarkRx measures the driver's receive path on the in-memory wire: one
// 64 KB TCP super-frame per iteration, through the NIC model and the poll
// loop to a handler that releases each packet.
func BenchmarkRx(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  Config
	}{
		{"lro-off/hds-auto", Config{}},
		{"lro-off/hds-256", Config{HDS: 256}},
		{"lro-on/hds-auto", Config{LRO: true}},
		{"lro-on/hds-256", Config{LRO: true, HDS: 256}},
		{"cyclic/lro-off/hds-auto", Config{RQ: RQCyclic}},
		{"hw-gro-on", Config{HWGRO: HWGROOn}},
		{"hw-gro-coalesce", Config{HWGRO: HWGROCoalesce}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := &collector{}
			_, w := newTestDriver(b, bc.cfg, c)
			h, frame, _ := tcpSuper(b, L3IPv4, 64000)
			wb := wireFrame(h, frame)
			per := int64(1)
			if !bc.cfg.LRO && bc.cfg.HWGRO == HWGROOff {
				per = (64000 + 1447) / 1448
			}
			b.SetBytes(64000)
			b.ReportAllocs()
			var sent, sentBytes int64
			send := func() {
				// Keep the wire's queue from overflowing: the in-memory
				// wire drops rather than blocks.
				for sentBytes-c.bytes.Load() > 256*64000 {
					runtime.Gosched()
				}
				if err := w.Write(wb); err != nil {
					b.Fatal(err)
				}
				sent += per
				sentBytes += 64000
			}
			for range 4096 {
				send() // grow the page pool to its working set
			}
			for b.Loop() {
				send()
			}
			if w.Dropped() > 0 {
				b.Fatalf("wire dropped %d frames", w.Dropped())
			}
			c.waitFor(b, sent)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(sentBytes/64000), "ns/super-frame")
		})
	}
}

// timerHandler asks to be flushed again 2 ms after each batch, three times.
type timerHandler struct {
	collector
	flushes atomic.Int64
}

func (h *timerHandler) Flush(bool) time.Duration {
	if h.flushes.Add(1) < 4 {
		return 2 * time.Millisecond
	}
	return 0
}

// TestFlushTimer checks that a handler holding packets is flushed again
// when the wire goes quiet, as gro_flush_timeout's timer does, and no more
// once it says it holds nothing.
func TestFlushTimer(t *testing.T) {
	h := &timerHandler{}
	_, w := newTestDriver(t, Config{}, h)
	good := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(100)}
	if err := w.Write(wireFrame(VirtioNetHdr{}, good.build())); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, 1)
	deadline := time.Now().Add(5 * time.Second)
	for h.flushes.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if got := h.flushes.Load(); got != 4 {
		t.Errorf("flushes after one packet and a quiet wire: got %d, want 4 (one per batch, then three by the timer)", got)
	}
}
