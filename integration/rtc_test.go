package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
)

// TestRunToCompletion carries TCP over a real TAP with the NIC model and
// the poll loop on one goroutine (driver.Config.RunToCompletion): a bulk
// stream from the kernel and an echo, every byte checked, with LRO on and
// off and with busy polling on the wire.
func TestRunToCompletion(t *testing.T) {
	needRoot(t)
	for i, c := range []struct {
		name string
		v6   bool
		cfg  driver.Config
	}{
		{"ipv4/lro-on", false, driver.Config{LRO: true}},
		{"ipv6/lro-off", true, driver.Config{}},
		{"ipv4/lro-off/busy-poll", false, driver.Config{BusyPoll: 50 * time.Microsecond}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.RunToCompletion = true
			r := newRig(t, fmt.Sprintf("usit-rtc%d", i), 1500, c.cfg)
			const n = 64 << 20
			elapsed := kernelToStack(t, r, c.v6, 9, n, uint64(300+i))
			logRate(t, "kernel -> ustack", n, elapsed)
			tcpEcho(t, r, c.v6, 16<<20, uint64(310+i))
			if got := counter(t, r.st, "rx_irqs"); got == 0 {
				t.Errorf("rx_irqs 0: the interrupts after the goroutine's sleeps are not counted")
			}
			// Whether a spin finds a frame depends on the sender's timing
			// (a loaded machine may leave every 50 µs spin dry); the
			// driver's tests check hits with a wire they control.
			if c.cfg.BusyPoll > 0 {
				if counter(t, r.st, "rx_busy_polls") == 0 {
					t.Errorf("rx_busy_polls 0 with busy polling on the wire")
				}
				t.Logf("rx_busy_polls %d rx_busy_poll_hits %d", counter(t, r.st, "rx_busy_polls"), counter(t, r.st, "rx_busy_poll_hits"))
			}
			checkFlowDrops(t, r.st)
			r.close(t) // checks that every page is back in the pool
		})
	}
}
