//go:build linux

package integration

import (
	"fmt"
	"testing"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// TestZeroCopyBulk runs the byte-exact bulk check with payload lent to
// gVisor and read in place with ReadViews, with software GRO and with
// hardware GRO coalescing, IPv4 and IPv6: every byte arrives, no page is
// written while gVisor or the reader holds it (the views are hashed after
// the next read), and with coalescing most bytes are read in whole pages.
func TestZeroCopyBulk(t *testing.T) {
	needRoot(t)
	i := 0
	for _, mode := range []driver.HWGROMode{driver.HWGROOff, driver.HWGROCoalesce} {
		for _, v6 := range []bool{false, true} {
			i++
			t.Run(fmt.Sprintf("%s/hw-gro-%s", family(v6), mode), func(t *testing.T) {
				r := newRigConfig(t, fmt.Sprintf("usit-zc%d", i), 1500, stack.Config{Driver: driver.Config{HWGRO: mode}, ZeroCopy: true})
				r.views = true
				kernelToStack(t, r, v6, 5002, 64<<20, uint64(80+i))
				c := counters(r.st)
				t.Logf("lent %d views, read %d bytes mapped (%d in whole pages), %d copied; pages reused %d, allocated %d, busy %d, ring full %d",
					c["zc_views_lent"], c["zc_read_mapped_bytes"], c["zc_read_page_bytes"], c["zc_read_copied_bytes"], c["rx_pp_alloc_fast"], c["rx_pp_alloc_slow"], c["rx_pp_lent_busy"], c["rx_pp_recycle_ring_full"])
				if c["zc_views_lent"] == 0 || c["zc_read_mapped_bytes"] < (64<<20)*9/10 {
					t.Errorf("zc_views_lent %d, zc_read_mapped_bytes %d: want views lent and at least 90%% read in place", c["zc_views_lent"], c["zc_read_mapped_bytes"])
				}
				if mode == driver.HWGROCoalesce && c["zc_read_page_bytes"]*2 < c["zc_read_mapped_bytes"] {
					t.Errorf("read in whole pages with coalescing: %d of %d, want most", c["zc_read_page_bytes"], c["zc_read_mapped_bytes"])
				}
			})
		}
	}
}
