package driver

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ustack/ustack/internal/rrtrace"
)

// Run to completion (Config.RunToCompletion): the NIC model and the poll
// loop on one goroutine, on a wire that is a Waiter.
//
// With two goroutines, a frame reaches the handler through a hand-off:
// the NIC model's thread returns from its read, writes the CQE and wakes
// the poll loop's goroutine, which the runtime must schedule (often on a
// thread it wakes for it). Linux has no such hand-off: the NIC's
// interrupt runs NAPI on the CPU that took it, and the poll reads the
// completions the NIC wrote. Here one goroutine plays both parts in turn:
// it reads up to Budget frames from the wire into the ring (the NIC's
// DMA), polls one batch (NAPI), and yields with runtime.Gosched after each
// batch, as ksoftirqd's cond_resched, so that the goroutines a batch
// readied (a socket's reader) run on its P before it reads more; it sleeps
// in the wire's Wait only when the wire is dry and the ring drained.
//
// Why it yields, and never waits for ring space: during a flood a
// goroutine that never parks holds its P, and the goroutines it readies
// wait for the runtime's 10 ms preemption while the TAP's queue overflows
// (receive livelock; docs/design-notes.md). A full ring makes it poll a
// batch, not wait for a poll loop that is itself.
//
// The model's semantics stay: after a sleep the goroutine is the NIC with
// the poll loop asleep, reading until its interrupt is due (Budget frames,
// CoalesceBytes, CoalesceUsecs, a dry wire: due) and counting that
// interrupt (rx_irqs) before the first poll; while it runs, every
// completion is polled as soon as it is written, as a scheduled NAPI
// sees every CQE. The ring has one holder at a time (napiOwner): the
// goroutine from its wake to its sleep, a busy reader (BusyReadPoll)
// while it sleeps, and that reader reads the wire too when the ring is
// empty, as napi_busy_loop's poll reads the CQ the hardware fills.

// runLoop is the goroutine of Config.RunToCompletion: both the NIC model
// and the poll loop. It closes nicDone when the wire stops (Close, or a
// read that failed), and pollDone when Close stops it.
func (d *Driver) runLoop() {
	defer close(d.pollDone)
	cpu := CurrentCPU()
	if len(d.cfg.PollCPUs) > 0 {
		if c, err := PinThread(d.cfg.PollCPUs); err == nil {
			cpu = c
		} // else: as the poll loop, run unpinned
	}
	d.pollCPU.Store(int32(cpu))
	d.nicCPU.Store(int32(cpu))
	// A goroutine locked to its pinned thread cannot yield its P to the
	// goroutines it readied: a yield parks the thread and hands the P to
	// another, a thread wake-up each time. Pinned, it does not yield; the
	// other Ps run what it readies. (The pinned bench matrix's four bulk
	// cells, against two goroutines in the same window: 0.90, 1.02, 0.91
	// and 0.90 without the yield, 0.68, 0.67, 0.87 and 1.02 with it.)
	yield := len(d.cfg.PollCPUs) == 0
	var nicNanos, pollNanos int64
	defer func() {
		d.stats.NICCPUNanos.Store(nicNanos + d.split.nicNanos.Load())
		d.stats.PollCPUNanos.Store(pollNanos)
	}()
	nap := &d.napi
	nap.more, nap.flushAt = false, 0
	nap.state.Store(napiLoop) // from napiOff: nobody else takes it before this
	wake := true              // the first run starts as after a sleep
	yielded := false
	busyRuns, busySince := 0, int64(0)
	defer func() {
		if d.split.started {
			close(d.split.give) // ends the NIC's goroutine: it holds nothing now
		}
	}()
	polls := 0
	for {
		// The NIC: frames from the wire into the ring, without waiting.
		// After a sleep, until the interrupt is due (the poll loop is
		// asleep meanwhile); while the loop runs, a budget's worth.
		t0 := ThreadCPUTime()
		dry, err := d.rtcRead(wake)
		wake = false
		t1 := ThreadCPUTime()
		// A batch polled for ring space (waitRoom) ran inside the
		// NIC's reads: its time is the poll loop's.
		nicNanos += max(0, t1-t0-d.roomPollNanos)
		pollNanos += d.roomPollNanos
		d.roomPollNanos = 0
		if err != nil {
			d.wireFailed(err)
			d.rtcStop(&pollNanos)
			return
		}
		// A run that found more on the wire than it reads at once, ten
		// times in a row or for 2 ms: the NIC model moves to a goroutine
		// of its own until the wire goes quiet, as __do_softirq hands
		// its work to ksoftirqd after MAX_SOFTIRQ_RESTART restarts or
		// MAX_SOFTIRQ_TIME.
		if dry {
			busyRuns = 0
		} else if now := d.since(); busyRuns == 0 {
			busyRuns, busySince = 1, now
		} else if busyRuns++; busyRuns > rtcMaxRestart || now-busySince >= int64(rtcMaxTime) {
			busyRuns = 0
			d.rtcSplit(&pollNanos, yield)
			continue
		}
		// The poll loop: one batch.
		if d.pollHeld(d.cfg.Budget) {
			rrtrace.Mark(rrtrace.PollDone)
			pollNanos += max(0, ThreadCPUTime()-t1)
			if polls++; polls%16 == 0 {
				d.stats.NICCPUNanos.Store(nicNanos + d.split.nicNanos.Load())
				d.stats.PollCPUNanos.Store(pollNanos)
			}
			yielded = false
			if yield {
				runtime.Gosched()
			}
			continue
		}
		if !dry {
			continue // frames read and all dropped: read on
		}
		// The ring is drained and the wire dry: a full flush, as
		// napi_complete_done does before interrupts are re-enabled, and
		// the flush timer's when it is due.
		if nap.more || nap.flushAt != 0 && d.since() >= nap.flushAt {
			nap.more = false
			nap.setFlush(d.handler.Flush(false), d.since())
			pollNanos += max(0, ThreadCPUTime()-t1)
			continue
		}
		if d.cfg.BusyPoll > 0 {
			if d.rtcBusyPoll() {
				continue // a frame came while spinning
			}
		}
		if !yielded && yield {
			// Let the goroutines the last batches readied run on this
			// P before sleeping, then look at the wire once more.
			yielded = true
			runtime.Gosched()
			continue
		}
		yielded = false
		d.stats.NICCPUNanos.Store(nicNanos + d.split.nicNanos.Load())
		d.stats.PollCPUNanos.Store(pollNanos)
		if !d.rtcSleep() {
			d.rtcStop(&pollNanos)
			return
		}
		wake = true
		rrtrace.Mark(rrtrace.PollWoke)
	}
}

// The run-to-completion goroutine's hand-over to a goroutine of the NIC
// model's own (rtcSplit), as softirq work goes to ksoftirqd.
const (
	rtcMaxRestart = 10                   // MAX_SOFTIRQ_RESTART
	rtcMaxTime    = 2 * time.Millisecond // MAX_SOFTIRQ_TIME
	// rtcQuiet is how long the wire stays dry before the NIC's goroutine
	// hands the NIC model back: ksoftirqd sleeps once no softirq is
	// pending, and the next interrupt runs NAPI inline again; here a
	// hand-back costs a goroutine wake-up, so a bulk stream's gaps
	// (tens of microseconds) do not end the split.
	rtcQuiet = time.Millisecond
)

// rtcSplitState is the NIC model's own goroutine under load.
type rtcSplitState struct {
	// on: the NIC model runs on its goroutine (set by the
	// run-to-completion goroutine before it hands over, cleared by the
	// NIC's goroutine before it hands back).
	on       atomic.Bool
	give     chan struct{} // run-to-completion goroutine -> NIC's: the NIC model is yours
	back     chan struct{} // NIC's -> run-to-completion goroutine: the wire is quiet, it is yours again
	started  bool          // the NIC's goroutine runs (the run-to-completion goroutine's)
	t        *time.Timer   // the split poll loop's flush timer (the run-to-completion goroutine's)
	nicNanos atomic.Int64  // CPU time of the NIC's goroutine, summed per split
}

// rtcSplit hands the NIC model to its own goroutine and runs as the poll
// loop, sleeping on the NIC's interrupts, until that goroutine hands the
// NIC back (the wire stayed quiet for rtcQuiet). The caller holds the
// ring; it holds it again on return, with the NIC model.
func (d *Driver) rtcSplit(pollNanos *int64, yield bool) {
	sp := &d.split
	d.stats.RTCSplits.Add(1)
	sp.on.Store(true)
	if !sp.started {
		sp.started = true
		go d.rtcNIC()
	}
	sp.give <- struct{}{}
	nap := &d.napi
	for {
		t := ThreadCPUTime()
		if d.pollHeld(d.cfg.Budget) {
			*pollNanos += max(0, ThreadCPUTime()-t)
			if yield {
				runtime.Gosched()
			}
			continue
		}
		if nap.more || nap.flushAt != 0 && d.since() >= nap.flushAt {
			nap.more = false
			nap.setFlush(d.handler.Flush(false), d.since())
			*pollNanos += max(0, ThreadCPUTime()-t)
			continue
		}
		// Drained: sleep until the NIC's interrupt, its hand-back or the
		// flush timer. Announce the sleep first, then look again: the
		// NIC raises its interrupt for what it writes after the
		// announcement.
		d.pollSleeping.Store(true)
		nap.state.Store(napiIdle)
		back := false
		if d.prod.Load() == d.cons.Load() {
			var tc <-chan time.Time
			if f := nap.flushAt; f != 0 {
				sp.timer().Reset(max(time.Duration(f-d.since()), 0))
				tc = sp.t.C
			}
			select {
			case <-d.irq:
			case <-sp.back:
				back = true
			case <-tc:
			}
			if tc != nil {
				sp.t.Stop()
			}
		}
		for !nap.state.CompareAndSwap(napiIdle, napiLoop) {
			runtime.Gosched() // a busy reader's batch: short
		}
		d.pollSleeping.Store(false)
		if back {
			return
		}
	}
}

// rtcNIC is the NIC model's own goroutine: on each hand-over it reads the
// wire as the NIC goroutine of two-goroutine mode does (nicLoop), raising
// interrupts to the poll loop and waiting for ring space, until the wire
// has stayed dry for rtcQuiet; then it hands the NIC model back.
func (d *Driver) rtcNIC() {
	PinThread(d.cfg.NICCPUs) // the hardware's thread, as nicLoop's; unpinned if that fails
	n := &d.nic
	for range d.split.give {
		start := ThreadCPUTime()
		for {
			got, err := n.step(false)
			if err != nil {
				break // the wire's: the run-to-completion goroutine sees it
			}
			if !got {
				n.publish()
				if d.waiter.Wait(rtcQuiet) != nil {
					break
				}
				if got, err = n.step(false); err != nil || !got {
					break
				}
			}
			if n.due() {
				n.publish()
			}
		}
		n.publish()
		d.split.nicNanos.Add(max(0, ThreadCPUTime()-start))
		d.split.on.Store(false)
		d.split.back <- struct{}{}
	}
}

// timer returns the split poll loop's flush timer, made once (stopped).
func (s *rtcSplitState) timer() *time.Timer {
	if s.t == nil {
		s.t = time.NewTimer(time.Hour)
		s.t.Stop()
	}
	return s.t
}

// rtcRead is the NIC's part of a run: it reads frames from the wire into
// the ring without waiting, at most Budget frames or rtcReadBytes. After a
// sleep (wake) the poll loop is asleep: it stops early when the NIC's
// interrupt is due, and counts the interrupt. It reports
// whether the wire was found dry, and the wire's error. After a sleep too
// it reads at most Budget frames: due raises the interrupt at Budget
// completions, and frames the NIC drops make none.
func (d *Driver) rtcRead(wake bool) (dry bool, err error) {
	n := &d.nic
	used := n.ringUsed
	for i := 0; i < d.cfg.Budget && n.ringUsed-used < rtcReadBytes; i++ {
		got, err := n.step(false)
		if err != nil {
			return false, err
		}
		if !got {
			dry = true
			break
		}
		if wake && n.due() {
			break
		}
	}
	if wake && n.pending > 0 {
		// The interrupt that wakes the poll loop: its moderation ended
		// it (due) or the wire ran dry.
		d.stats.NICWakeups.Add(1)
		if n.timerFired {
			d.stats.TimerIRQs.Add(1)
		}
	}
	d.pollSleeping.Store(false)
	n.publish() // exposes; the loop runs: no interrupt to raise
	return dry, nil
}

// rtcReadBytes bounds the ring bytes one run's wire reads fill before it
// polls them. A NIC's DMA and its NAPI poll overlap; one goroutine's reads
// and polls do not, and a run of Budget LRO super-frames (4 MB) would hold
// the first one's ACK back for 63 reads and fill the ring: with this bound
// the bench's peak pool was 0.5 MB instead of 2.4 (docs/figures-2026-12.md).
const rtcReadBytes = 256 << 10

// pollHeld polls one batch of at most budget completions for the ring's
// holder (the run-to-completion goroutine or a busy reader), keeping the
// poll state in d.napi, and reports whether there was any.
func (d *Driver) pollHeld(budget int) bool {
	cons, prod := d.cons.Load(), d.prod.Load()
	if cons == prod {
		return false
	}
	prod = cons + min(prod-cons, uint32(budget))
	_, more, again := d.poll(cons, prod)
	d.napi.more = more
	d.napi.setFlush(again, d.since())
	return true
}

// setFlush arms the handler's flush timer again from now (ns since the
// driver's epoch), or disarms it (again 0).
func (n *napiOwner) setFlush(again time.Duration, now int64) {
	n.flushAt = 0
	if again > 0 {
		n.flushAt = now + int64(again)
	}
}

// rtcBusyPoll spins on the wire for up to Config.BusyPoll (and no longer
// than the handler's flush timer), yielding to other goroutines between
// looks, and reports whether a frame came: busy polling's napi_busy_loop,
// whose poll here reads the wire. A frame it finds is in the ring.
func (d *Driver) rtcBusyPoll() bool {
	d.stats.BusyPolls.Add(1)
	spin := d.cfg.BusyPoll
	if f := d.napi.flushAt; f != 0 {
		spin = min(spin, max(time.Duration(f-d.since()), 0))
	}
	start := time.Now()
	for i := 0; ; i++ {
		got, err := d.nic.step(false)
		if got || err != nil {
			// An error is the wire's: the next read sees it again.
			if got {
				d.stats.BusyPollHits.Add(1)
			}
			return true
		}
		if i%16 == 15 && time.Since(start) >= spin {
			return false
		}
		runtime.Gosched()
	}
}

// rtcSleep gives the ring up and sleeps in the wire's Wait until a frame
// may be there, the handler's flush timer is due, or a busy reader that
// left work in the ring wakes it (Wake); then it takes the ring back. It reports false
// when the wire is closed or failed (the next read says which).
func (d *Driver) rtcSleep() bool {
	nap := &d.napi
	timeout := time.Duration(-1)
	if f := nap.flushAt; f != 0 {
		timeout = max(time.Duration(f-d.since()), 0)
	}
	d.pollSleeping.Store(true)
	nap.state.Store(napiIdle)
	err := d.waiter.Wait(timeout)
	// A busy reader may hold the ring for one short batch: wait for it,
	// as napi_schedule after busy_poll_stop. (Waiting in Wait instead
	// would spin there: the wire it polls may hold a frame.)
	for !nap.state.CompareAndSwap(napiIdle, napiLoop) {
		runtime.Gosched()
	}
	if err != nil {
		d.pollSleeping.Store(false)
		return false
	}
	// What the ring's last holder left: cons is in d.cons, more and the
	// flush timer in nap. A flush timer due now is handled by the run.
	return true
}

// rtcStop ends the run-to-completion goroutine once the wire has stopped
// (Close, or a read that failed): it delivers what the ring holds, tells
// Done that receive has stopped, keeps the handler's flush timer until
// Close, then drains what is left. It holds the ring throughout, so busy
// readers leave it alone: nothing new comes into it.
func (d *Driver) rtcStop(pollNanos *int64) {
	t := ThreadCPUTime()
	for d.pollHeld(d.cfg.Budget) {
	}
	d.napi.setFlush(d.handler.Flush(false), d.since())
	*pollNanos += max(0, ThreadCPUTime()-t)
	close(d.nicDone)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		var tc <-chan time.Time
		if f := d.napi.flushAt; f != 0 {
			timer.Reset(max(time.Duration(f-d.since()), 0))
			tc = timer.C
		}
		select {
		case <-d.stop:
			d.napi.state.Store(napiOff)
			d.drain(d.cons.Load())
			return
		case <-tc:
		}
		t := ThreadCPUTime()
		d.napi.setFlush(d.handler.Flush(false), d.since())
		*pollNanos += max(0, ThreadCPUTime()-t)
	}
}
