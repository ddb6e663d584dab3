package driver

import (
	"testing"
	"time"
)

// TestBusyPoll: with Config.BusyPoll the poll loop spins on the drained ring
// instead of sleeping, so a frame that arrives meanwhile is taken without
// an interrupt (rx_busy_poll_hits, rx_irqs unchanged); without it the loop
// never spins.
func TestBusyPoll(t *testing.T) {
	h, frame, _ := tcpSuper(t, L3IPv4, 2*mss4) // two frames per write
	wf := wireFrame(h, frame)
	t.Run("on", func(t *testing.T) {
		c := &collector{}
		d, w := newTestDriver(t, Config{BusyPoll: MaxBusyPoll}, c)
		st := d.Stats()
		got := int64(0)
		// A frame written while the loop spins must be taken by the
		// spin. The spin lasts a second; a try on a machine too loaded to
		// write within it, or to start the spin before the write, proves
		// nothing, and another follows.
		for try := 0; try < 20; try++ {
			if err := w.Write(wf); err != nil {
				t.Fatal(err)
			}
			got += 2
			c.waitFor(t, got)
			// The loop has drained the ring and spins now (or is
			// about to: then the next frame is taken by a poll, and
			// this try proves nothing).
			hits, irqs := st.BusyPollHits.Load(), st.NICWakeups.Load()
			if err := w.Write(wf); err != nil {
				t.Fatal(err)
			}
			got += 2
			c.waitFor(t, got)
			for end := time.Now().Add(time.Second); st.BusyPollHits.Load() == hits && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			if st.BusyPollHits.Load() > hits && st.NICWakeups.Load() == irqs {
				return // taken by the spin, no interrupt raised
			}
		}
		t.Errorf("no frame taken by a busy poll without an interrupt in 20 tries: rx_busy_polls %d, rx_busy_poll_hits %d, rx_irqs %d",
			st.BusyPolls.Load(), st.BusyPollHits.Load(), st.NICWakeups.Load())
	})
	t.Run("off", func(t *testing.T) {
		c := &collector{}
		d, w := newTestDriver(t, Config{}, c)
		for i := int64(1); i <= 3; i++ {
			if err := w.Write(wf); err != nil {
				t.Fatal(err)
			}
			c.waitFor(t, 2*i)
		}
		if n := d.Stats().BusyPolls.Load(); n != 0 {
			t.Errorf("rx_busy_polls %d without BusyPoll, want 0", n)
		}
	})
	if err := (&Config{BusyPoll: MaxBusyPoll + 1}).setDefaults(); err == nil {
		t.Errorf("BusyPoll past MaxBusyPoll: no error")
	}
}
