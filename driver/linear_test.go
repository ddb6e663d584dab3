package driver

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
)

// TestLinearStride checks mlx5e_rx_mpwqe_is_linear_skb and
// mlx5e_rx_get_linear_stride_sz as the driver computes them: the linear
// path only without packet merge and with a frame, its headroom and
// skb_shared_info within a page.
func TestLinearStride(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mtu   int
		page  int
		lro   bool
		hwgro HWGROMode
		want  int
	}{
		{"mtu-1500", 1500, 4096, false, HWGROOff, 2048}, // 64+1522 -> 1600, +320: 1920
		{"mtu-1500/lro", 1500, 4096, true, HWGROOff, 0},
		{"mtu-1500/hw-gro", 1500, 4096, false, HWGROOn, 0},
		{"mtu-1500/hw-gro-coalesce", 1500, 4096, false, HWGROCoalesce, 0},
		{"mtu-4096", 4096, 4096, false, HWGROOff, 0}, // 4544 > 4096
		{"mtu-9000", 9000, 4096, false, HWGROOff, 0},
		{"mtu-9000/lro", 9000, 4096, true, HWGROOff, 0},
		{"mtu-1000", 1000, 4096, false, HWGROOff, 2048},
		{"mtu-500", 500, 4096, false, HWGROOff, 1024},   // 64+522 -> 640, +320: 960
		{"mtu-3690", 3690, 4096, false, HWGROOff, 4096}, // the largest that fits: 3776+320
		{"mtu-3691", 3691, 4096, false, HWGROOff, 0},
		// 64 KB pages: the frame fits, but a 16 KB stride is beyond
		// MLX5_MPWQE_LOG_STRIDE_SZ_MAX.
		{"mtu-9000/64k-pages", 9000, 65536, false, HWGROOff, 0},
		{"mtu-4096/64k-pages", 4096, 65536, false, HWGROOff, 8192},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := LinearStride(tc.mtu, tc.page, DefaultWQEBytes, tc.lro, tc.hwgro); got != tc.want {
				t.Errorf("LinearStride(%d, %d, lro %v, hw-gro %v): got %d, want %d", tc.mtu, tc.page, tc.lro, tc.hwgro, got, tc.want)
			}
		})
	}
	// With an XDP program (mlx5e_rx_get_linear_stride_sz): 256 bytes of
	// headroom, and a stride of a whole page.
	for _, tc := range []struct {
		name      string
		mtu, page int
		want      int
	}{
		{"xdp/mtu-1500", 1500, 4096, 4096},         // 256+1522 -> 1792, +320: 2112 -> 4096
		{"xdp/mtu-500", 500, 4096, 4096},           // 256+522 -> 832, +320: 1152 -> 2048, raised to the page
		{"xdp/mtu-3498", 3498, 4096, 4096},         // 256+3520 = 3776, +320: the largest that fits
		{"xdp/mtu-3499", 3499, 4096, 0},            // fits without XDP (LinearStride: 4096)
		{"xdp/mtu-1500/64k-pages", 1500, 65536, 0}, // a 64 KB stride is beyond MLX5_MPWQE_LOG_STRIDE_SZ_MAX
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := linearStride(tc.mtu, tc.page, DefaultWQEBytes, false, HWGROOff, true); got != tc.want {
				t.Errorf("linearStride(%d, %d, xdp): got %d, want %d", tc.mtu, tc.page, got, tc.want)
			}
		})
	}
	if got := LinearStride(3499, 4096, DefaultWQEBytes, false, HWGROOff); got != 4096 {
		t.Errorf("LinearStride(3499, 4096) without XDP: got %d, want 4096", got)
	}
	for _, c := range []Config{{XDP: true, LRO: true}, {XDP: true, HWGRO: HWGROCoalesce}} {
		if err := c.setDefaults(); err == nil {
			t.Errorf("%+v: no error; mlx5e_xdp_allowed refuses XDP with packet merge on", c)
		}
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "linear"},
		{Config{MTU: 9000}, "nonlinear"},
		{Config{LRO: true}, "nonlinear"},
		{Config{RQ: RQCyclic}, "nonlinear"},
		{Config{HWGRO: HWGROOn}, "shampo"},
	} {
		if got := tc.cfg.RXPath(); got != tc.want {
			t.Errorf("Config%+v.RXPath(): got %q, want %q", tc.cfg, got, tc.want)
		}
	}
}

// headCollector records, for each packet, where its head frag lies.
type headCollector struct {
	collector
	mu    sync.Mutex
	pages map[*bufpool.Page]int // +checklocks:mu
	offs  []uint32              // +checklocks:mu
	heads int                   // +checklocks:mu
}

func (c *headCollector) Deliver(p *Packet) {
	c.mu.Lock()
	if p.Head != nil {
		c.heads++
		c.pages[p.Head]++
		c.offs = append(c.offs, p.HeadOff)
	}
	c.mu.Unlock()
	c.collector.Deliver(p)
}

// TestLinearRx checks mlx5's linear striding RQ (MTU 1500, LRO off): each
// frame is handed up as a head frag over its stride, headroom and all,
// two to a 4 KB page, nothing copied; at MTU 4096 the same frames take
// the nonlinear path with its header copy.
func TestLinearRx(t *testing.T) {
	const payload = 64000
	for _, tc := range []struct {
		name   string
		cfg    Config
		linear bool
	}{
		{"mtu-1500", Config{}, true},
		{"mtu-1500/hds-256", Config{HDS: 256}, true},
		{"mtu-4096", Config{MTU: 4096}, false},
		// With an XDP program, one frame per page after 256 bytes of
		// headroom (mlx5e_rx_get_linear_stride_sz).
		{"mtu-1500/xdp", Config{XDP: true}, true},
		{"mtu-4096/xdp", Config{MTU: 4096, XDP: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &headCollector{collector: collector{keep: true}, pages: map[*bufpool.Page]int{}}
			d, w := newTestDriver(t, tc.cfg, c)
			h, frame, fi := tcpSuper(t, L3IPv4, payload)
			if err := w.Write(wireFrame(h, frame)); err != nil {
				t.Fatal(err)
			}
			want := (payload + mss4 - 1) / mss4
			c.waitFor(t, int64(want))
			st := d.Stats()
			// The poll loop adds its counters after the batch went up.
			for end := time.Now().Add(30 * time.Second); st.SKBLinear.Load()+st.SKBNonlinear.Load() < uint64(want) && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			c.collector.mu.Lock()
			var got []byte
			for i, f := range c.frames {
				var pfi FrameInfo
				if drop := ParseFrame(f, &pfi); drop != DropNone {
					t.Fatalf("packet %d does not parse: %v", i, drop)
				}
				got = append(got, f[pfi.HeaderLen():pfi.L2Len+pfi.IPLen]...)
				if tc.linear && (c.linears[i] != len(f) || c.nfrags[i] != 0) {
					t.Errorf("packet %d: linear %d bytes and %d frags, want the whole %d-byte frame linear", i, c.linears[i], c.nfrags[i], len(f))
				}
			}
			c.collector.mu.Unlock()
			if !bytes.Equal(got, frame[fi.HeaderLen():]) {
				t.Errorf("payload reassembled differs from the payload sent")
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			wantLinear, wantNonlinear, wantHeads := uint64(want), uint64(0), want
			if !tc.linear {
				wantLinear, wantNonlinear, wantHeads = 0, uint64(want), 0
			}
			if c.heads != wantHeads {
				t.Errorf("packets with a head frag: got %d, want %d", c.heads, wantHeads)
			}
			if got := st.SKBLinear.Load(); got != wantLinear {
				t.Errorf("rx_skb_linear: got %d, want %d", got, wantLinear)
			}
			if got := st.SKBNonlinear.Load(); got != wantNonlinear {
				t.Errorf("rx_skb_nonlinear: got %d, want %d", got, wantNonlinear)
			}
			if !tc.linear {
				if st.HDSBytes.Load() == 0 {
					t.Errorf("rx_hds_bytes on the nonlinear path: got 0, want the header copies")
				}
				return
			}
			if got := st.HDSBytes.Load(); got != 0 {
				t.Errorf("rx_hds_bytes on the linear path: got %d, want 0 (nothing copied)", got)
			}
			stride, hr := 2048, LinearHeadroom
			if tc.cfg.XDP {
				stride, hr = 4096, XDPHeadroom
			}
			for i, off := range c.offs {
				if int(off)%stride != hr {
					t.Errorf("packet %d: head at page offset %d, want a %d-byte stride's start + %d", i, off, stride, hr)
				}
			}
			// 2 frames a page, 45 frames in 23 pages; with XDP 1 a page.
			perPage := 4096 / stride
			if got, wantPages := len(c.pages), (want+perPage-1)/perPage; got != wantPages {
				t.Errorf("pages holding the %d frames: got %d, want %d (%d strides a page)", want, got, wantPages, perPage)
			}
			if got := st.Strides.Load(); got != uint64(want) {
				t.Errorf("rx_strides: got %d, want %d (one stride a frame)", got, want)
			}
		})
	}
}

// TestHWGROHasEnoughSpace checks mlx5e_hw_gro_skb_has_enough_space at its
// boundary: a packet takes a payload while PAGE_SIZE * nr_frags plus the
// payload stays within 64 KB; with 64 KB pages, skb->len plus the
// payload.
func TestHWGROHasEnoughSpace(t *testing.T) {
	for _, tc := range []struct {
		name                         string
		page, frags, skbLen, payload int
		want                         bool
	}{
		{"15 frags, 1448 more", 4096, 15, 15 * 1448, 1448, true}, // 61440+1448
		{"16 frags, 1448 more", 4096, 16, 16 * 1448, 1448, false},
		{"15 frags, to the limit", 4096, 15, 0, 4096, true}, // 65536
		{"15 frags, a byte over", 4096, 15, 0, 4097, false},
		{"no frag", 4096, 0, 66, 65536, true},
		{"64k pages, to the limit", 65536, 1, 65536 - 1448, 1448, true},
		{"64k pages, a byte over", 65536, 1, 65536 - 1447, 1448, false},
	} {
		if got := hwGROHasEnoughSpace(tc.page, tc.frags, tc.skbLen, tc.payload); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
