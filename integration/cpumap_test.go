//go:build linux

package integration

import (
	"fmt"
	"testing"

	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// TestCPUMapBulk runs the byte-exact bulk check through the cpumap: every
// frame is redirected by the hash program from the poll loop to one of two
// workers, which run their own GRO (or not) and deliver to gVisor, each
// round as one list, the NIC's checksum status dropped and checked again.
func TestCPUMapBulk(t *testing.T) {
	needRoot(t)
	for i, tc := range []struct {
		v6, lro, noGRO bool
	}{
		{false, false, false},
		{true, false, true},
		{false, true, false},
	} {
		name := fmt.Sprintf("%s/lro-%v/cpumap-gro-%v", family(tc.v6), tc.lro, !tc.noGRO)
		t.Run(name, func(t *testing.T) {
			prog, err := cpumap.ParseProgram("hash", 2)
			if err != nil {
				t.Fatal(err)
			}
			r := newRigConfig(t, fmt.Sprintf("usit-cpumap%d", i), 1500, stack.Config{
				Driver: driver.Config{LRO: tc.lro}, XDP: prog, CPUMap: []int{0, 1}, NoCPUMapGRO: tc.noGRO,
			})
			kernelToStack(t, r, tc.v6, 5001, 64<<20, uint64(40+i))
			c := counters(r.st)
			if c["rx_xdp_redirect"] == 0 || c["cpumap_worker_frames"] == 0 {
				t.Errorf("rx_xdp_redirect %d, cpumap_worker_frames %d: want both > 0", c["rx_xdp_redirect"], c["cpumap_worker_frames"])
			}
			if !tc.noGRO && !tc.lro && c["cpumap_rx_gro_skbs"] == 0 {
				t.Errorf("cpumap_rx_gro_skbs: got 0, want > 0")
			}
			// The worker takes each round as one list and checks in
			// software the checksums of each frame the NIC vouched for
			// (CHECKSUM_NONE after the redirect).
			if l, r := c["cpumap_worker_lists"], c["cpumap_worker_rounds"]; l == 0 || l < r { // read rounds first: a round adds to lists first
				t.Errorf("cpumap_worker_lists %d, cpumap_worker_rounds %d: want one list per round", l, r)
			}
			if n := c["cpumap_rx_csum_sw"] + c["cpumap_rx_csum_trusted"]; n == 0 || n > c["rx_xdp_redirect"] {
				t.Errorf("cpumap_rx_csum_sw + cpumap_rx_csum_trusted %d: want 1 to rx_xdp_redirect %d", n, c["rx_xdp_redirect"])
			}
			if c["cpumap_dropped"] != 0 {
				t.Logf("cpumap_dropped %d (rings full; TCP retransmitted)", c["cpumap_dropped"])
			}
		})
	}
}
