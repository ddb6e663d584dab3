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
// workers, which run their own GRO (or not) and deliver to gVisor.
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
			if c["cpumap_dropped"] != 0 {
				t.Logf("cpumap_dropped %d (rings full; TCP retransmitted)", c["cpumap_dropped"])
			}
		})
	}
}
