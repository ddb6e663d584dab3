//go:build linux

package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// TestPlainWire runs the byte-exact bulk checks over water's plain wire
// (-wire plain: bare frames, no virtio-net header, no offloads): the
// kernel's TAP then has no TSO or checksum offload either, so it sends
// MTU-sized frames with full checksums, which the NIC model verifies
// (rx_csum_complete, never rx_csum_partial, no super-frames), and ustack
// segments and checksums what it sends itself (no GSO packets, nothing
// left for the wire to complete in software). Both directions, IPv4 and
// IPv6. The device was first opened by ustack's TAP with its offloads on,
// as the bench's A side leaves it: the plain wire must clear them.
func TestPlainWire(t *testing.T) {
	needRoot(t)
	const n = 32 << 20
	for i, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			bed := newBed(t, fmt.Sprintf("usit-plain%d", i), 1500)
			if err := bed.NS.Do(func() error {
				tap, err := driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true})
				if err == nil {
					err = tap.Close()
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			r := newBedRigWire(t, bed, 1500, stack.Config{}, true)
			logRate(t, "kernel -> ustack", n, kernelToStack(t, r, v6, 9, n, uint64(300+i)))
			var tl tally
			stackToKernel(t, r, v6, n/2, uint64(310+i), time.Now().Add(transferTimeout(n/2)), &tl)
			if tl.lost.Load() != 0 || tl.checked.Load() != n/2 {
				t.Errorf("ustack -> kernel: %d bytes checked, %d lost; want %d and 0", tl.checked.Load(), tl.lost.Load(), n/2)
			}
			c := counters(r.st)
			if c["rx_csum_complete"] == 0 || c["rx_csum_partial"] != 0 || c["rx_gso_frames"] != 0 {
				t.Errorf("rx_csum_complete %d, rx_csum_partial %d, rx_gso_frames %d: want every frame verified by the NIC model and no super-frames", c["rx_csum_complete"], c["rx_csum_partial"], c["rx_gso_frames"])
			}
			if c["tx_gso_packets"] != 0 || c["tx_sw_segments"] != 0 || c["tx_sw_csum"] != 0 {
				t.Errorf("tx_gso_packets %d, tx_sw_segments %d, tx_sw_csum %d: want 0, the stack segments and checksums itself", c["tx_gso_packets"], c["tx_sw_segments"], c["tx_sw_csum"])
			}
			checkFlowDrops(t, r.st)
			r.close(t)
		})
	}
}
