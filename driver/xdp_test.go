package driver

import (
	"sync"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
)

// xdpCollector is an XDPHandler that consumes every other frame offered
// (releasing it) and passes the rest, recording what it was offered.
type xdpCollector struct {
	collector
	mu sync.Mutex
	// offered frames, heads of them without a packet, badOff head frames
	// not at a stride's start + XDPHeadroom, csum frames with the NIC's
	// checksum verdict.
	// +checklocks:mu
	offered int
	// +checklocks:mu
	heads int
	// +checklocks:mu
	badOff int
	// +checklocks:mu
	csum int
}

func (c *xdpCollector) XDP(f bufpool.Frame) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offered++
	if f.Pkt == nil {
		c.heads++
		if f.Head.Off%4096 != XDPHeadroom {
			c.badOff++
		}
		if f.CsumVerified {
			c.csum++
		}
	}
	if c.offered%2 == 0 {
		f.Release()
		return true
	}
	return false
}

// TestXDPHook: with an XDP program attached, the poll loop offers each
// frame to the handler before it builds a packet: on the linear RQ (MTU
// 1500) as the bytes in its stride with no packet (the xdp_buff
// mlx5e_xdp_handle runs on), on the nonlinear RQ as the packet built; a
// frame the handler consumed is not delivered, one it passed is, as a
// packet over its stride on the linear RQ. Without Config.XDP nothing is
// offered. No page is left in use (startTestDriver's cleanup).
func TestXDPHook(t *testing.T) {
	const payload = 64000
	frames := (payload + mss4 - 1) / mss4
	for _, tc := range []struct {
		name         string
		cfg          Config
		offered      int
		heads        int
		deliveredAll bool
	}{
		{"mtu-1500/xdp", Config{XDP: true}, frames, frames, false},
		{"mtu-4096/xdp", Config{MTU: 4096, XDP: true}, frames, 0, false},
		{"mtu-1500/no-xdp", Config{}, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &xdpCollector{}
			d, w := newTestDriver(t, tc.cfg, c)
			h, frame, _ := tcpSuper(t, L3IPv4, payload)
			if err := w.Write(wireFrame(h, frame)); err != nil {
				t.Fatal(err)
			}
			want := frames - frames/2 // every other one consumed
			if tc.deliveredAll {
				want = frames
			}
			c.waitFor(t, int64(want))
			st := d.Stats()
			for end := time.Now().Add(30 * time.Second); st.Packets.Load() < uint64(frames) && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.offered != tc.offered || c.heads != tc.heads {
				t.Errorf("offered %d frames, %d without a packet: want %d and %d", c.offered, c.heads, tc.offered, tc.heads)
			}
			if c.badOff != 0 || c.csum != c.heads {
				t.Errorf("head frames: %d off the stride's start + %d, %d of %d with the NIC's checksum verdict", c.badOff, XDPHeadroom, c.csum, c.heads)
			}
			if got := c.n.Load(); got != int64(want) {
				t.Errorf("delivered %d packets, want %d", got, want)
			}
			if got := st.Packets.Load(); got != uint64(frames) {
				t.Errorf("rx_packets: %d, want %d (consumed frames count)", got, frames)
			}
		})
	}
}
