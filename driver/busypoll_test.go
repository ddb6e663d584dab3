package driver

import (
	"sync/atomic"
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

// flushTimerHandler asks, at its first Flush, to be flushed again after
// 20 ms (a GRO flush timeout holding packets), and records whether the poll
// loop was asleep at each later Flush.
type flushTimerHandler struct {
	collector
	d       atomic.Pointer[Driver]
	flushes atomic.Int32
	asleep  atomic.Int32 // later Flushes called from the sleeping loop's timer
	awake   atomic.Int32 // later Flushes called from the spinning loop
}

func (h *flushTimerHandler) Flush(bool) time.Duration {
	n := h.flushes.Add(1)
	if n == 1 {
		return 20 * time.Millisecond
	}
	if d := h.d.Load(); d != nil && d.pollSleeping.Load() {
		h.asleep.Add(1)
	} else {
		h.awake.Add(1)
	}
	return 0
}

// TestBusyPollFlushTimer: a spin counts against the handler's flush timer,
// so the flush it asked for comes when the timer's time has passed, from
// the spinning loop, not a whole timer later from the sleeping one.
func TestBusyPollFlushTimer(t *testing.T) {
	h, frame, _ := tcpSuper(t, L3IPv4, 2*mss4)
	fh := &flushTimerHandler{}
	d, w := newTestDriver(t, Config{BusyPoll: MaxBusyPoll}, fh)
	fh.d.Store(d)
	if err := w.Write(wireFrame(h, frame)); err != nil {
		t.Fatal(err)
	}
	fh.waitFor(t, 2)
	for end := time.Now().Add(10 * time.Second); fh.flushes.Load() < 2 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	if fh.awake.Load() != 1 || fh.asleep.Load() != 0 {
		t.Errorf("the timer's flush: %d from the spinning loop, %d from the sleeping one; want 1 and 0", fh.awake.Load(), fh.asleep.Load())
	}
}
