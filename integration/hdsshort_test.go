//go:build linux

package integration

import (
	"fmt"
	"testing"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// TestHDSShortZeroCopyEcho is `ustack run -hds 8 -zero-copy on -echo :7`
// (LRO on, the CLI's default) over a real TAP: a header copy shorter than
// the Ethernet header, payload lent to gVisor. The kernel's ARP or NDP and
// an echoed bulk TCP stream arrive byte for byte (SHA-256 of sent against
// received), the driver having pulled the headers the copy missed
// (rx_hds_pull_bytes). Before the pull, the first frame with frags
// panicked the poll loop.
func TestHDSShortZeroCopyEcho(t *testing.T) {
	needRoot(t)
	const n = 16 << 20
	for i, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			r := newRigConfig(t, fmt.Sprintf("usit-hds%d", i), 1500,
				stack.Config{Driver: driver.Config{LRO: true, HDS: 8}, ZeroCopy: true})
			tcpEcho(t, r, v6, n, uint64(140+i))
			c := counters(r.st)
			t.Logf("rx_hds_bytes %d, rx_hds_pull_bytes %d, zc_views_lent %d, rx_gro_packets %d",
				c["rx_hds_bytes"], c["rx_hds_pull_bytes"], c["zc_views_lent"], c["rx_gro_packets"])
			if c["rx_hds_pull_bytes"] == 0 || c["zc_views_lent"] == 0 {
				t.Errorf("rx_hds_pull_bytes %d, zc_views_lent %d: want headers pulled and payload lent", c["rx_hds_pull_bytes"], c["zc_views_lent"])
			}
		})
	}
}
