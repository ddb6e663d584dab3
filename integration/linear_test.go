//go:build linux

package integration

import (
	"fmt"
	"testing"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// TestTCPLinearRQ sends a bulk stream from the kernel over the TAP at MTU
// 1500 with LRO off, where mlx5 takes the linear striding RQ
// (mlx5e_rx_mpwqe_is_linear_skb): every frame is handed up over its
// stride, nothing copied whatever -hds says, and GRO merges the heads by
// frags (skb_gro_receive's head_frag branch), not by the frag_list. The
// receiver checks the stream's SHA-256, with Read and with ReadViews. With
// zero copy, each frame's payload is lent to gVisor from its stride, the
// GRO head's (its linear part, a head frag) as the merged ones' (frags).
func TestTCPLinearRQ(t *testing.T) {
	needRoot(t)
	const n = 32 << 20
	for i, tt := range []struct {
		v6    bool
		hds   int
		views bool
		zc    bool
	}{
		{false, 256, false, false},
		{true, driver.HDSAuto, true, false},
		{false, driver.HDSAuto, true, true},
	} {
		name := fmt.Sprintf("%s/hds-%s/views-%v", family(tt.v6), driver.FormatHDS(tt.hds), tt.views)
		if tt.zc {
			name += "/zero-copy"
		}
		t.Run(name, func(t *testing.T) {
			r := newRigConfig(t, fmt.Sprintf("usit-lin%d", i), 1500, stack.Config{Driver: driver.Config{HDS: tt.hds}, ZeroCopy: tt.zc})
			r.views = tt.views
			elapsed := kernelToStack(t, r, tt.v6, 9, n, uint64(40+i))
			logRate(t, "kernel -> ustack (linear RQ)", n, elapsed)
			c := counters(r.st)
			t.Logf("rx_packets %d rx_skb_linear %d rx_skb_nonlinear %d rx_hds_bytes %d rx_gro_skbs %d rx_gro_frag_list %d",
				c["rx_packets"], c["rx_skb_linear"], c["rx_skb_nonlinear"], c["rx_hds_bytes"], c["rx_gro_skbs"], c["rx_gro_frag_list"])
			// Every frame linear, read as none nonlinear: a late
			// ACK's batch may land between two counter reads.
			if got := c["rx_skb_linear"]; got == 0 || c["rx_skb_nonlinear"] != 0 {
				t.Errorf("rx_skb_linear %d, rx_skb_nonlinear %d: want every frame linear (rx_packets %d)", got, c["rx_skb_nonlinear"], c["rx_packets"])
			}
			if got := c["rx_hds_bytes"]; got != 0 {
				t.Errorf("rx_hds_bytes on the linear RQ: got %d, want 0", got)
			}
			if c["rx_gro_skbs"] == 0 {
				t.Errorf("rx_gro_skbs: got 0, want merged packets")
			}
			// Head frags merge by frags: a GRO packet chains a
			// packet on its frag_list only when MAX_SKB_FRAGS (17)
			// frags are full, so at most one frag_list merge per 16
			// segments (a frag_list per merge would be the header
			// copy's slow path).
			if got, segs := c["rx_gro_frag_list"], c["rx_gro_packets"]; got*16 > segs {
				t.Errorf("rx_gro_frag_list: got %d for %d merged segments, want at most one per 16 (head frags merge by frags)", got, segs)
			}
			if tt.zc {
				// Every data frame's payload is lent, or copied by a
				// counted rule: the heads' too (the old code copied
				// each GRO packet's first payload, its linear part).
				// Frames without payload (the handshake, the FIN) are
				// the only others.
				handled := c["zc_views_lent"] + c["zc_frags_copied"] + c["zc_frags_copied_small"] + c["zc_frags_copied_over_limit"] + c["zc_frags_copied_ipfrag"] + c["zc_frags_copied_layout"]
				t.Logf("zc_views_lent %d, copied %d small %d over limit %d; read mapped %d, copybuf %d",
					c["zc_views_lent"], c["zc_frags_copied"], c["zc_frags_copied_small"], c["zc_frags_copied_over_limit"], c["zc_read_mapped_bytes"], c["zc_read_copybuf_bytes"])
				if data := c["rx_packets"] - 8; handled < data {
					t.Errorf("payloads lent or copied by rule: got %d, want one per data frame (rx_packets %d, less 8 without payload)", handled, c["rx_packets"])
				}
				// tcp_mmap's rule: a frame's payload in its stride is
				// never a whole page, so ReadViews copies what was lent
				// (copybuf) and maps nothing.
				if c["zc_read_mapped_bytes"] != 0 || c["zc_read_copybuf_bytes"] == 0 {
					t.Errorf("read mapped %d, copybuf %d: want 0 and > 0", c["zc_read_mapped_bytes"], c["zc_read_copybuf_bytes"])
				}
			}
			checkFlowDrops(t, r.st)
			r.close(t)
		})
	}
}
