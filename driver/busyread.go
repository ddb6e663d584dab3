package driver

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Busy reading: a reader about to block may process the ring itself, as
// a socket read with net.core.busy_read (SO_BUSY_POLL) runs the NAPI of
// its queue in napi_busy_loop instead of sleeping until the interrupt.
//
// Exactly one of {the poll loop, busy readers} processes the ring at a
// time: the one that holds it (napiOwner), as NAPI_STATE_SCHED makes a
// NAPI instance run in one context at a time. The poll loop holds it
// from the moment it wakes until it sleeps again, over every batch and
// every -busy-poll spin, as a NAPI instance stays scheduled while its
// polls use their whole budget and is completed (napi_complete_done) only
// when the ring is drained: the bulk path takes and gives up nothing per
// batch. It gives the ring up when it goes to sleep; a busy reader then
// takes it for one batch of at most BusyPollBudget completions
// (napi_busy_loop's cmpxchg of NAPIF_STATE_SCHED | NAPIF_STATE_IN_BUSY_POLL)
// and gives it back at once. A poll loop woken meanwhile (the NIC's
// interrupt, its flush timer) finds the ring held and sleeps on; the
// reader, giving the ring back with completions still waiting, the
// handler's flush timer armed or its batch cut by the budget, wakes it
// (busy_poll_stop's __napi_schedule). While the poll loop runs, a busy
// reader leaves the ring alone and only checks its socket, as
// napi_busy_loop does when the NAPI is scheduled elsewhere.

// BusyPollBudget is the most completions a busy reader processes per
// batch: BUSY_POLL_BUDGET (include/net/busy_poll.h), so that a reader
// that takes the ring soon looks at its own socket again.
const BusyPollBudget = 8

// napiOwner's states.
const (
	napiOff    uint32 = iota // not started, or stopped: nobody processes the ring
	napiIdle                 // the poll loop sleeps: a busy reader may take the ring
	napiLoop                 // the poll loop holds it (NAPI_STATE_SCHED)
	napiReader               // a busy reader holds it (NAPI_STATE_IN_BUSY_POLL)
)

// napiOwner is who holds the ring, and the poll state that passes with
// it between its holders.
type napiOwner struct {
	state atomic.Uint32
	// Held with the ring (state napiLoop or napiReader): moved between
	// holders by state's atomic store and compare-and-swap.
	more    bool  // the last batch used its budget with completions waiting
	flushAt int64 // when the handler's flush timer is due (ns since epoch), 0: not armed
}

// since returns the time since the driver's epoch, in ns: the flush
// timer's clock.
func (d *Driver) since() int64 { return int64(time.Since(d.epoch)) }

// BusyReadPoll processes one batch of at most BusyPollBudget completions
// on behalf of a busy reader, if the poll loop sleeps and completions are
// waiting, and returns how many it processed (0: none waiting, or the
// ring held by the poll loop or another reader). It is one round of
// napi_busy_loop: the handler's Deliver and Flush run on the caller's
// goroutine, never beside the poll loop's or another reader's. It wakes
// the poll loop if it leaves work behind. Safe to call from any
// goroutine, before Start and after Close (it then does nothing); the
// caller must not hold a lock the handler takes.
func (d *Driver) BusyReadPoll() int {
	n := &d.napi
	// Look before taking, so that readers spinning on a quiet ring or
	// on a running poll loop do not dirty the state's cache line, as
	// napi_busy_loop avoids dirtying napi->state.
	rtc := d.waiter != nil
	if n.state.Load() != napiIdle || !rtc && d.prod.Load() == d.cons.Load() {
		return 0
	}
	if !n.state.CompareAndSwap(napiIdle, napiReader) {
		return 0
	}
	if rtc && !d.split.on.Load() {
		// Run to completion: the ring's holder is the NIC too (unless
		// the NIC model runs on its own goroutine under load: rtcSplit). A ring
		// with less than a budget waiting is topped up from the wire,
		// as napi_busy_loop's poll finds what the hardware wrote. An
		// error is the wire's: the run-to-completion goroutine sees it.
		for d.prod.Load()-d.cons.Load() < BusyPollBudget {
			if got, err := d.nic.step(false); !got || err != nil {
				break
			}
		}
		d.nic.publish() // the reader polls them: no interrupt
	}
	cons, prod := d.cons.Load(), d.prod.Load()
	work := min(prod-cons, BusyPollBudget)
	if work > 0 {
		d.pollHeld(int(work))
	}
	kick := n.more || n.flushAt != 0
	n.state.Store(napiIdle)
	// busy_poll_stop: what is left goes to the poll loop. It sleeps (the
	// ring was idle); if it woke meanwhile and took the ring, it sees
	// the work itself.
	if (kick || d.prod.Load() != d.cons.Load()) && d.pollSleeping.Load() {
		if rtc {
			// Asleep in the wire's Wait, or (the NIC split off) on
			// the interrupt: wake either.
			d.waiter.Wake()
		}
		select {
		case d.irq <- struct{}{}:
		default:
		}
	}
	return int(work)
}

// napiSleep gives the ring up and sleeps until the NIC's interrupt, the
// flush timer (again, 0: none) or a busy reader's hand-back, then takes
// the ring again (napi_complete_done, then the next napi_schedule). It
// returns the poll state the ring's last holder left: the consumer
// index, whether its batch was cut by the budget, and the time left on
// the handler's flush timer (the handler flushed first if it is due).
// ok is false when the driver stops: then the ring is drained and
// nobody may take it again.
func (d *Driver) napiSleep(timer *time.Timer, again time.Duration) (cons uint32, more bool, left time.Duration, ok bool) {
	n := &d.napi
	n.more, n.flushAt = false, 0
	if again > 0 {
		n.flushAt = d.since() + int64(again)
	}
	flushAt := n.flushAt
	// Announce the sleep before giving the ring up: a reader that holds
	// it while the loop sleeps finds pollSleeping set when it gives it
	// back, and the NIC raises its interrupt for what comes meanwhile.
	d.pollSleeping.Store(true)
	n.state.Store(napiIdle)
	held := false // a busy reader held the ring when the loop woke: it wakes the loop if it leaves work
	for {
		if held || d.prod.Load() == d.cons.Load() {
			var tc <-chan time.Time
			if !held && flushAt != 0 {
				timer.Reset(max(time.Duration(flushAt-d.since()), 0))
				tc = timer.C
			}
			select {
			case <-d.irq:
			case <-tc:
			case <-d.stop:
				for !n.state.CompareAndSwap(napiIdle, napiOff) {
					runtime.Gosched() // a reader's batch: short
				}
				d.pollSleeping.Store(false)
				d.drain(d.cons.Load())
				return 0, false, 0, false
			}
			timer.Stop()
		}
		if n.state.CompareAndSwap(napiIdle, napiLoop) {
			break
		}
		held = true
	}
	d.pollSleeping.Store(false)
	cons, more = d.cons.Load(), n.more
	if n.flushAt != 0 {
		if left = time.Duration(n.flushAt - d.since()); left <= 0 {
			left = d.handler.Flush(false)
		}
	}
	return cons, more, left, true
}
