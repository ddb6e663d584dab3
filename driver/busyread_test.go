package driver

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// exclHandler checks that the ring is processed by one goroutine at a
// time: every Deliver and Flush counts itself in flight, and records an
// overlap if another is; next and seen are written without
// synchronisation, so that the race detector also sees two holders. It
// checks that frames come in ring order (their IPv4 IDs count up).
type exclHandler struct {
	collector
	inflight atomic.Int32
	overlaps atomic.Int32
	next     uint16 // the IPv4 ID expected next
	seen     int
	disorder atomic.Int32
}

func (h *exclHandler) enter() {
	if h.inflight.Add(1) != 1 {
		h.overlaps.Add(1)
	}
}

func (h *exclHandler) leave() { h.inflight.Add(-1) }

func (h *exclHandler) Deliver(p *Packet) {
	h.enter()
	if id := header.IPv4(p.Linear[header.EthernetMinimumSize:]).ID(); id != h.next {
		h.disorder.Add(1)
	}
	h.next++
	h.seen++
	runtime.Gosched() // widen the window for a second holder
	h.leave()
	h.collector.Deliver(p)
}

func (h *exclHandler) Flush(bool) time.Duration {
	h.enter()
	h.seen++
	h.leave()
	return 0
}

// TestBusyReadExclusion: readers spinning in BusyReadPoll beside the poll
// loop while frames arrive one at a time and in bursts: every frame is
// delivered once, in ring order, no Deliver or Flush ever overlaps
// another, readers processed some of the frames, and nothing is left in
// the ring when they stop (a reader that leaves work wakes the loop).
func TestBusyReadExclusion(t *testing.T) {
	h := &exclHandler{}
	d, w := newTestDriver(t, Config{}, h)
	const readers, frames = 8, 3000
	var stop atomic.Bool
	var readerWork atomic.Int64
	var wg sync.WaitGroup
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				readerWork.Add(int64(d.BusyReadPoll()))
				runtime.Gosched()
			}
		}()
	}
	spec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(64)}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < frames; i++ {
		spec.ipID = uint16(i)
		if err := w.Write(wireFrame(VirtioNetHdr{}, spec.build())); err != nil {
			t.Fatal(err)
		}
		if i%16 == 0 {
			// A pause now and then, so the poll loop drains and sleeps
			// and readers find the ring idle.
			for h.n.Load() < int64(i) && time.Now().Before(deadline) {
				runtime.Gosched()
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	h.waitFor(t, frames) // the rest: the poll loop, woken by the NIC or by a reader's hand-back
	if n := h.overlaps.Load(); n != 0 {
		t.Errorf("Deliver or Flush overlapped another %d times, want 0", n)
	}
	if n := h.disorder.Load(); n != 0 {
		t.Errorf("frames out of ring order: %d, want 0", n)
	}
	if readerWork.Load() == 0 {
		t.Errorf("readers processed no completion of %d", frames)
	}
	t.Logf("readers processed %d of %d frames; poll batches %d, interrupts %d",
		readerWork.Load(), frames, d.Stats().Polls.Load(), d.Stats().NICWakeups.Load())
}

// TestBusyReadIdle: BusyReadPoll does nothing before Start, on an empty
// ring, and after Close.
func TestBusyReadIdle(t *testing.T) {
	c := &collector{}
	a, b := NewMemPair(16, VirtioNetHdrLen+maxLROFrame)
	defer b.Close()
	cfg := Config{Pool: testutil.NewPool(t, bufpool.Config{Poison: true})}
	copy(cfg.MAC[:], pkDstMAC)
	d, err := New(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := d.BusyReadPoll(); n != 0 {
		t.Errorf("before Start: %d completions, want 0", n)
	}
	d.Start(c)
	if n := d.BusyReadPoll(); n != 0 {
		t.Errorf("empty ring: %d completions, want 0", n)
	}
	closeWithin(t, d)
	if n := d.BusyReadPoll(); n != 0 {
		t.Errorf("after Close: %d completions, want 0", n)
	}
	if s := d.napi.state.Load(); s != napiOff {
		t.Errorf("owner after Close: %d, want napiOff", s)
	}
}

// handBackHandler blocks the first Deliver of a busy reader's batch when
// asked, so that the test can hold the ring in the reader's hands while
// the poll loop wakes.
type handBackHandler struct {
	collector
	inReader  atomic.Bool // set by the one reader goroutine around BusyReadPoll
	d         *Driver     // its owner state says whose batch a Deliver is in
	blockNext atomic.Bool
	blocked   chan struct{}
	gate      chan struct{}
}

func (h *handBackHandler) Deliver(p *Packet) {
	// inReader alone is not enough: the poll loop may deliver while the
	// reader is in a BusyReadPoll that found the ring held. The owner
	// state is napiReader only while the reader holds the ring.
	if h.inReader.Load() && h.d.napi.state.Load() == napiReader && h.blockNext.CompareAndSwap(true, false) {
		h.blocked <- struct{}{}
		<-h.gate
	}
	h.collector.Deliver(p)
}

// TestBusyReadHandBack: a poll loop woken by the NIC's interrupt while a
// busy reader holds the ring sleeps on; the reader, leaving completions
// in the ring after its batch of BusyPollBudget, wakes it, and the loop
// takes the rest. Without the hand-back (busy_poll_stop's
// __napi_schedule) they would wait for an interrupt that never comes.
func TestBusyReadHandBack(t *testing.T) {
	hdr, frame, _ := tcpSuper(t, L3IPv4, 30*mss4) // 30 frames in one write
	wf := wireFrame(hdr, frame)
	h := &handBackHandler{blocked: make(chan struct{}), gate: make(chan struct{})}
	d, w := newTestDriver(t, Config{}, h)
	h.d = d
	st := d.Stats()
	want := int64(0)
	for try := 0; try < 50; try++ {
		// The loop asleep on an empty ring.
		for end := time.Now().Add(10 * time.Second); d.napi.state.Load() != napiIdle || d.prod.Load() != d.cons.Load(); {
			if time.Now().After(end) {
				t.Fatalf("the poll loop did not go to sleep")
			}
			runtime.Gosched()
		}
		h.blockNext.Store(true)
		irqs := st.NICWakeups.Load()
		done := make(chan int)
		target := want + 30
		go func() { // the reader: polls until one batch of its was blocked
			work := 0
			for h.blockNext.Load() && h.n.Load() < target {
				h.inReader.Store(true)
				work = d.BusyReadPoll()
				h.inReader.Store(false)
				runtime.Gosched()
			}
			done <- work
		}()
		if err := w.Write(wf); err != nil {
			t.Fatal(err)
		}
		want += 30
		select {
		case <-h.blocked:
		case <-done:
			// The poll loop took the frames first: try again.
			h.blockNext.Store(false)
			h.waitFor(t, want)
			continue
		}
		// The reader holds the ring. Let the NIC's interrupt wake the
		// loop and the loop find the ring held.
		for end := time.Now().Add(10 * time.Second); st.NICWakeups.Load() == irqs || len(d.irq) != 0; {
			if time.Now().After(end) {
				t.Fatalf("no interrupt taken by the poll loop")
			}
			runtime.Gosched()
		}
		time.Sleep(10 * time.Millisecond) // for the loop's look at the ring; the outcome does not depend on it
		close(h.gate)
		if work := <-done; work != BusyPollBudget {
			t.Fatalf("the reader's batch: %d completions, want %d", work, BusyPollBudget)
		}
		h.waitFor(t, want) // the loop, woken by the reader, takes the rest
		return
	}
	t.Skip("the poll loop took every write before a busy reader in 50 tries")
}
