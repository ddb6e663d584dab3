//go:build linux

package integration

import (
	"fmt"
	"testing"

	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/stack"
)

// TestCPUMapBulk runs the byte-exact bulk check through the cpumap: every
// frame is redirected by the hash program from the poll loop to one of two
// workers, which run their own GRO (or not) and deliver to gVisor, each
// round as one list, the NIC's checksum status dropped and checked again.
// With the program attached the RQ is mlx5's with XDP: at MTU 1500 one
// frame per page on the linear path, redirected as the frame itself and
// built into a packet by the worker, at MTU 9000 the nonlinear path, whose
// packets the poll loop builds.
func TestCPUMapBulk(t *testing.T) {
	needRoot(t)
	for i, tc := range []struct {
		v6, noGRO bool
		mtu       int
	}{
		{false, false, 1500},
		{true, true, 1500},
		{false, false, 9000},
	} {
		name := fmt.Sprintf("%s/mtu-%d/cpumap-gro-%v", family(tc.v6), tc.mtu, !tc.noGRO)
		t.Run(name, func(t *testing.T) {
			prog, err := cpumap.ParseProgram("hash", 2)
			if err != nil {
				t.Fatal(err)
			}
			r := newRigConfig(t, fmt.Sprintf("usit-cpumap%d", i), tc.mtu, stack.Config{
				XDP: prog, CPUMap: []int{0, 1}, NoCPUMapGRO: tc.noGRO,
			})
			kernelToStack(t, r, tc.v6, 5001, 64<<20, uint64(40+i))
			c := counters(r.st)
			if c["rx_xdp_redirect"] == 0 || c["cpumap_worker_frames"] == 0 {
				t.Errorf("rx_xdp_redirect %d, cpumap_worker_frames %d: want both > 0", c["rx_xdp_redirect"], c["cpumap_worker_frames"])
			}
			if !tc.noGRO && c["cpumap_rx_gro_skbs"] == 0 {
				t.Errorf("cpumap_rx_gro_skbs: got 0, want > 0")
			}
			if linear := tc.mtu == 1500; (c["rx_skb_linear"] > 0) != linear || (c["rx_skb_nonlinear"] > 0) == linear {
				t.Errorf("rx_skb_linear %d, rx_skb_nonlinear %d: want only the %s path at MTU %d", c["rx_skb_linear"], c["rx_skb_nonlinear"], map[bool]string{true: "linear", false: "nonlinear"}[linear], tc.mtu)
			}
			built, prebuilt := c["cpumap_worker_built"], c["cpumap_worker_prebuilt"]
			if linear := tc.mtu == 1500; (built > 0) != linear || (prebuilt > 0) == linear {
				t.Errorf("cpumap_worker_built %d, cpumap_worker_prebuilt %d: want only the worker (linear RQ) or only the poll loop (nonlinear) building at MTU %d", built, prebuilt, tc.mtu)
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
