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
// the next read), and, as tcp_mmap maps only whole pages, with coalescing
// the bytes the NIC laid in whole pages are read in place and with software
// GRO none.
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
				t.Logf("lent %d views, read %d bytes mapped, %d copied (%d copybuf); pages reused %d, allocated %d, busy %d, ring full %d",
					c["zc_views_lent"], c["zc_read_mapped_bytes"], c["zc_read_copied_bytes"], c["zc_read_copybuf_bytes"], c["rx_pp_alloc_fast"], c["rx_pp_alloc_slow"], c["rx_pp_lent_busy"], c["rx_pp_recycle_ring_full"])
				if got := c["zc_read_mapped_bytes"] + c["zc_read_copied_bytes"]; c["zc_views_lent"] == 0 || got != 64<<20 {
					t.Errorf("zc_views_lent %d, read mapped+copied %d: want views lent and %d bytes", c["zc_views_lent"], got, 64<<20)
				}
				// tcp_mmap's rule: whole pages are mapped, the rest copied.
				// MTU-sized frags never fill a page; with coalescing, what
				// the NIC laid in whole pages (rx_gro_hw_mappable_bytes: most
				// of it, unless a loaded machine cuts the sessions short) is
				// read in place.
				if whole := c["rx_gro_hw_mappable_bytes"]; mode == driver.HWGROCoalesce && (whole == 0 || c["zc_read_mapped_bytes"]*10 < whole*9) {
					t.Errorf("read in place with coalescing: %d, the NIC laid %d in whole pages: want at least 90%% of them", c["zc_read_mapped_bytes"], whole)
				}
				if mode == driver.HWGROOff && (c["zc_read_mapped_bytes"] != 0 || c["zc_read_copybuf_bytes"] == 0) {
					t.Errorf("mapped %d, copybuf %d with software GRO: want none mapped, copybuf > 0", c["zc_read_mapped_bytes"], c["zc_read_copybuf_bytes"])
				}
			})
		}
	}
}
