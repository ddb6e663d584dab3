//go:build linux

package integration

import (
	"fmt"
	"testing"

	"github.com/ustack/ustack/driver"
)

// TestHWGROBulk runs the byte-exact bulk check with hardware GRO (SHAMPO)
// emulation on and with coalescing, IPv4 and IPv6.
func TestHWGROBulk(t *testing.T) {
	needRoot(t)
	i := 0
	for _, mode := range []driver.HWGROMode{driver.HWGROOn, driver.HWGROCoalesce} {
		for _, v6 := range []bool{false, true} {
			i++
			t.Run(fmt.Sprintf("%s/hw-gro-%s", family(v6), mode), func(t *testing.T) {
				r := newRig(t, fmt.Sprintf("usit-hwgro%d", i), 1500, driver.Config{HWGRO: mode})
				kernelToStack(t, r, v6, 5001, 64<<20, uint64(60+i))
				c := counters(r.st)
				if c["rx_gro_hw_sessions"] == 0 {
					t.Errorf("rx_gro_hw_sessions: got 0, want > 0")
				}
				// Coalescing makes every frag of a session page-sized
				// but the partial pages at its two ends. How long the
				// sessions are is the sender's doing (a session ends at
				// a short segment or a new timestamp, as software GRO's
				// packets do): under load its TSO bursts are small.
				mappable, payload, sessions := c["rx_gro_hw_mappable_bytes"], c["rx_gro_hw_payload_bytes"], c["rx_gro_hw_sessions"]
				if mode == driver.HWGROCoalesce && mappable+2*4096*sessions < payload {
					t.Errorf("mappable bytes %d of %d in %d sessions with coalesce: want all but the sessions' partial pages", mappable, payload, sessions)
				}
				t.Logf("mappable bytes %d of %d in %d sessions", mappable, payload, sessions)
				if mode == driver.HWGROOn && c["rx_gro_hw_mappable_bytes"] != 0 {
					t.Errorf("mappable bytes with hw-gro on: got %d, want 0", c["rx_gro_hw_mappable_bytes"])
				}
			})
		}
	}
}
