//go:build linux

package integration

import (
	"fmt"
	"testing"

	"github.com/ustack/ustack/stack"
)

// TestQueues runs 16 byte-exact kernel -> ustack TCP flows at once over
// two queues of a multi-queue TAP, and of a TUN: the kernel spreads the
// flows over the queues, each flow following the queue ustack answers it
// on (tun_flow_update), so both queues carry packets (rx0_packets,
// rx1_packets; with 16 flows hashed over two queues all on one has odds
// of 1 in 32768), the per-queue counters add up to the totals, and every
// page of every queue's pool comes back at Close.
func TestQueues(t *testing.T) {
	needRoot(t)
	for i, tun := range []bool{false, true} {
		t.Run(map[bool]string{false: "tap", true: "tun"}[tun], func(t *testing.T) {
			r := newQueuesRig(t, fmt.Sprintf("usit-mq%d", i), 2, tun, stack.Config{})
			if r.st.Queues() != 2 {
				t.Fatalf("Queues: %d, want 2", r.st.Queues())
			}
			t.Run("flows", func(t *testing.T) {
				for f := range 16 {
					t.Run(fmt.Sprint(f), func(t *testing.T) {
						t.Parallel()
						kernelToStack(t, r, f%2 == 1, uint16(5100+f), 2<<20, uint64(700+16*i+f))
					})
				}
			})
			r.close(t) // the counters stop moving
			c := counters(r.st)
			t.Logf("rx0_packets %d rx1_packets %d tx0_packets %d tx1_packets %d", c["rx0_packets"], c["rx1_packets"], c["tx0_packets"], c["tx1_packets"])
			if c["rx0_packets"] == 0 || c["rx1_packets"] == 0 || c["rx0_packets"]+c["rx1_packets"] != c["rx_packets"] {
				t.Errorf("rx0_packets %d, rx1_packets %d, rx_packets %d: want both queues used and their sum", c["rx0_packets"], c["rx1_packets"], c["rx_packets"])
			}
		})
	}
}
