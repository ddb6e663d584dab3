package driver

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// gatedHandler holds the poll loop in its first Deliver until open is
// closed, as a stack too slow for the wire would, then passes everything to
// the collector.
type gatedHandler struct {
	*collector
	open chan struct{}
	once sync.Once
}

func (g *gatedHandler) Deliver(p *Packet) {
	<-g.open
	g.collector.Deliver(p)
}

// release lets the poll loop go on.
func (g *gatedHandler) release() { g.once.Do(func() { close(g.open) }) }

// newGatedDriver is newTestDriver with a gatedHandler that keeps copies,
// released at the latest before the driver's Close, so that Close drains.
func newGatedDriver(t *testing.T, cfg Config) (*Driver, *MemWire, *gatedHandler) {
	g := &gatedHandler{collector: &collector{keep: true}, open: make(chan struct{})}
	d, w := newTestDriver(t, cfg, g)
	t.Cleanup(g.release) // cleanups run last first: before the driver's
	return d, w, g
}

// writeSuperFrames writes frames TCP super-frames of payload bytes each,
// one flow in sequence, every payload different, and returns the payloads.
func writeSuperFrames(t *testing.T, w *MemWire, l3 L3Type, frames, payload int) [][]byte {
	t.Helper()
	gt, mss := uint8(VirtioNetHdrGSOTCPv4), uint16(mss4)
	if l3 == L3IPv6 {
		gt, mss = VirtioNetHdrGSOTCPv6, mss6
	}
	var sent [][]byte
	for i := range frames {
		p := make([]byte, payload)
		for j := range p {
			p[j] = byte(i*31 + j*7 + j>>9)
		}
		spec := pkSpec{l3: l3, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck,
			seq: 1000 + uint32(i*payload), ack: 1, payload: p}
		h, frame, fi := pkSuperFrame(t, spec, gt, mss)
		if err := w.Write(wireFrame(h, frame)); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, frame[fi.HeaderLen():])
	}
	return sent
}

// TestRQSizeBoundsRing has the poll loop stop while super-frames keep
// coming: the NIC model may fill RQSize WQEs of ring ahead of it and must
// then stall (rx_rq_stalls), the pool's pages bounded by the RQ rather than
// by the completion queue or the burst. When the poll loop goes on, every
// byte arrives, in order.
func TestRQSizeBoundsRing(t *testing.T) {
	const (
		frames  = 48
		payload = 60000 // 48 super-frames: 2.9 MB, past any of the RQs below
	)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"lro/rq-2", Config{LRO: true, RQSize: 2}},
		{"lro/rq-4", Config{LRO: true, RQSize: 4}},
		{"segmented/rq-2", Config{RQSize: 2}},
		{"hw-gro/rq-2", Config{HWGRO: HWGROCoalesce, RQSize: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, w, g := newGatedDriver(t, tc.cfg)
			sent := writeSuperFrames(t, w, L3IPv4, frames, payload)
			st := d.Stats()
			deadline := time.Now().Add(10 * time.Second)
			for st.RQStalls.Load() == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("rx_rq_stalls: still 0 after 10 s with the poll loop stopped (rx_cqe_stalls %d, pages in use %d)",
						st.CQEStalls.Load(), d.Pool().InUse())
				}
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // give a NIC model that does not stall the time to show it
			cfg := d.Config()
			bound := ((cfg.RQSize + 1) * (cfg.WQEBytes/4096 + 2))
			if n := d.Pool().InUse(); n > bound {
				t.Errorf("pages in use with the poll loop stopped: %d, want at most %d (RQ %d WQEs of %d bytes, and the one being filled)",
					n, bound, cfg.RQSize, cfg.WQEBytes)
			}
			if reads := st.WireReads.Load(); reads == frames {
				t.Errorf("the NIC model read all %d super-frames with the poll loop stopped: the RQ did not stall it", reads)
			}
			g.release()
			deadline = time.Now().Add(10 * time.Second)
			for g.bytes.Load() < frames*payload {
				if time.Now().After(deadline) {
					t.Fatalf("after the poll loop went on: %d of %d super-frames read, %d of %d payload bytes delivered",
						st.WireReads.Load(), frames, g.bytes.Load(), frames*payload)
				}
				time.Sleep(time.Millisecond)
			}
			want := bytes.Join(sent, nil)
			var got []byte
			g.mu.Lock()
			for i, f := range g.frames {
				var pfi FrameInfo
				if drop := ParseFrame(f, &pfi); drop != DropNone {
					t.Fatalf("packet %d does not parse: %v", i, drop)
				}
				got = append(got, f[pfi.HeaderLen():pfi.L2Len+pfi.IPLen]...)
			}
			g.mu.Unlock()
			if !bytes.Equal(got, want) {
				t.Errorf("payload delivered differs from the payload sent (%d vs %d bytes)", len(got), len(want))
			}
			if n := st.Dropped[DropNoBuffer].Load(); n != 0 {
				t.Errorf("rx_drop_no_buffer: %d, want 0 (the RQ stalls, it does not drop)", n)
			}
		})
	}
}

// TestRQDrop is TestRQSizeBoundsRing with Config.RQDrop: the NIC model
// reads on while the poll loop stands still, and drops (and counts) what
// finds the RQ full instead of stalling. What it placed before arrives
// whole once the poll loop goes on.
func TestRQDrop(t *testing.T) {
	const (
		frames  = 48
		payload = 60000
	)
	d, w, g := newGatedDriver(t, Config{LRO: true, RQSize: 2, RQDrop: true})
	sent := writeSuperFrames(t, w, L3IPv6, frames, payload)
	st := d.Stats()
	deadline := time.Now().Add(10 * time.Second)
	for st.WireReads.Load() < frames {
		if time.Now().After(deadline) {
			t.Fatalf("the NIC model read %d of %d super-frames with the poll loop stopped: with RQDrop it must not stall", st.WireReads.Load(), frames)
		}
		time.Sleep(time.Millisecond)
	}
	cfg := d.Config()
	if n, bound := d.Pool().InUse(), (cfg.RQSize+1)*(cfg.WQEBytes/4096+2); n > bound {
		t.Errorf("pages in use with the poll loop stopped: %d, want at most %d", n, bound)
	}
	dropped := st.Dropped[DropOutOfBuffer].Load()
	if dropped == 0 || st.RQStalls.Load() != 0 {
		t.Fatalf("rx_drop_out_of_buffer %d, rx_rq_stalls %d: want > 0 and 0", dropped, st.RQStalls.Load())
	}
	g.release()
	placed := frames - int(dropped)
	g.waitFor(t, int64(placed))
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.frames) != placed {
		t.Fatalf("delivered %d super-frames, want %d (%d read, %d dropped)", len(g.frames), placed, frames, dropped)
	}
	for i, f := range g.frames {
		var pfi FrameInfo
		if drop := ParseFrame(f, &pfi); drop != DropNone {
			t.Fatalf("packet %d does not parse: %v", i, drop)
		}
		if !bytes.Equal(f[pfi.HeaderLen():pfi.L2Len+pfi.IPLen], sent[i]) {
			t.Errorf("super-frame %d delivered differs from the one sent", i)
		}
	}
}

// TestConfigHWGRORing: hardware GRO takes a ring up to what the CQE's
// 16-bit header index names, and refuses a larger one with an error that
// says why; without hardware GRO any power of two goes.
func TestConfigHWGRORing(t *testing.T) {
	for _, tc := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{HWGRO: HWGROOn, RingSize: 1 << 16}, true},
		{Config{HWGRO: HWGROOn, RingSize: 1 << 17}, false},
		{Config{HWGRO: HWGROCoalesce, RingSize: 1 << 17}, false},
		{Config{RingSize: 1 << 17}, true},
	} {
		a, _ := NewMemPair(1, 64)
		d, err := New(a, tc.cfg)
		switch {
		case tc.ok && err != nil:
			t.Errorf("New(hw-gro %v, ring %d): %v, want no error", tc.cfg.HWGRO, tc.cfg.RingSize, err)
		case !tc.ok && err == nil:
			t.Errorf("New(hw-gro %v, ring %d): no error, want one (16-bit header index)", tc.cfg.HWGRO, tc.cfg.RingSize)
		case !tc.ok && !strings.Contains(err.Error(), "header index"):
			t.Errorf("New(hw-gro %v, ring %d): error %q does not say why (header index)", tc.cfg.HWGRO, tc.cfg.RingSize, err)
		}
		if d != nil {
			d.Close()
		}
		a.Close()
	}
}

func TestRQDepth(t *testing.T) {
	for _, tc := range []struct {
		name           string
		cfg            Config
		wqes, wqeBytes int
	}{
		{"striding default", Config{}, DefaultRQSizeStriding, DefaultWQEBytes},
		{"striding set", Config{RQSize: 32, WQEBytes: 1 << 17}, 32, 1 << 17},
		{"cyclic", Config{RQ: RQCyclic}, DefaultRingSize, DefaultMTU + 18},
		{"cyclic lro ring 256", Config{RQ: RQCyclic, LRO: true, RingSize: 256}, 256, maxLROFrame},
		{"page per frame mtu 9000", Config{PagePerFrame: true, MTU: 9000}, DefaultRingSize, 9000 + 18},
	} {
		if w, b := tc.cfg.RQDepth(); w != tc.wqes || b != tc.wqeBytes {
			t.Errorf("%s: RQDepth() = %d WQEs of %d bytes, want %d of %d", tc.name, w, b, tc.wqes, tc.wqeBytes)
		}
	}
}

// TestConfigRejects checks that New refuses settings the NIC model cannot
// run with, the RQ's among them, rather than misbehave later.
func TestConfigRejects(t *testing.T) {
	for _, cfg := range []Config{
		{RQSize: 1},
		{RQSize: -4},
		{RingSize: 3},
		{Budget: 2048},
		{CoalesceBytes: -1},
		{StrideSize: 32},
		{LRO: true, HWGRO: HWGROOn},
		{MTU: 40},
		// A header index of 16 bits names no header entry past 65535:
		// one flow's payload would be built under another's headers.
		{HWGRO: HWGROOn, RingSize: 1 << 17, Budget: 64},
		{HWGRO: HWGROCoalesce, RingSize: 1 << 20},
	} {
		a, _ := NewMemPair(1, 64)
		if _, err := New(a, cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
		a.Close()
	}
}
