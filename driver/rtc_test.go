package driver

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// goid is the calling goroutine's id, from its stack trace's first line
// ("goroutine 7 [running]:"): for tests only.
func goid() int64 {
	var b [64]byte
	s := b[:runtime.Stack(b[:], false)]
	s = bytes.TrimPrefix(s, []byte("goroutine "))
	id, _ := strconv.ParseInt(string(s[:bytes.IndexByte(s, ' ')]), 10, 64)
	return id
}

// goroutineTap records the goroutine the NIC model reads each frame on
// (Config.WireTap runs there).
type goroutineTap struct{ id atomic.Int64 }

func (g *goroutineTap) WriteFrame(time.Time, ...[]byte) { g.id.Store(goid()) }

// sameGoroutineHandler counts the packets delivered on the goroutine that
// read their frame from the wire, and those delivered on another.
type sameGoroutineHandler struct {
	collector
	tap        *goroutineTap
	same, away atomic.Int64
}

func (h *sameGoroutineHandler) Deliver(p *Packet) {
	if goid() == h.tap.id.Load() {
		h.same.Add(1)
	} else {
		h.away.Add(1)
	}
	h.collector.Deliver(p)
}

// TestRunToCompletionOneGoroutine: with RunToCompletion every packet is
// delivered on the goroutine that read its frame from the wire, in
// bursts and one frame at a time; with it off, on another (the mutation
// the switch is about).
func TestRunToCompletionOneGoroutine(t *testing.T) {
	for _, rtc := range []bool{true, false} {
		t.Run(strconv.FormatBool(rtc), func(t *testing.T) {
			tap := &goroutineTap{}
			h := &sameGoroutineHandler{tap: tap}
			d, w := newTestDriver(t, Config{RunToCompletion: rtc, WireTap: tap}, h)
			spec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(200)}
			want := int64(0)
			for i := 0; i < 400; i++ {
				if err := w.Write(wireFrame(VirtioNetHdr{}, spec.build())); err != nil {
					t.Fatal(err)
				}
				want++
				if i%40 == 0 {
					// Now and then one frame at a time, after a sleep.
					h.waitFor(t, want)
					for end := time.Now().Add(10 * time.Second); rtc && !(d.napi.state.Load() == napiIdle && d.pollSleeping.Load()); {
						if time.Now().After(end) {
							t.Fatalf("the goroutine did not go to sleep")
						}
						runtime.Gosched()
					}
				}
			}
			h.waitFor(t, want)
			st := d.Stats()
			if n := st.NICWakeups.Load(); rtc && n < 10 {
				t.Errorf("rx_irqs %d after 10 sleeps: the interrupts that end them are not counted", n)
			}
			if rtc {
				if h.away.Load() != 0 || h.same.Load() != want {
					t.Errorf("delivered on the reading goroutine %d, on another %d; want %d and 0", h.same.Load(), h.away.Load(), want)
				}
			} else if h.away.Load() == 0 {
				t.Errorf("two goroutines: no packet delivered on the poll loop's own goroutine")
			}
			// Counted after the batch's Deliver calls.
			for end := time.Now().Add(10 * time.Second); int64(st.Packets.Load()) != want; {
				if time.Now().After(end) {
					t.Fatalf("rx_packets %d, want %d", st.Packets.Load(), want)
				}
				runtime.Gosched()
			}
		})
	}
}

// orderHandler checks that frames come in wire order (their IPv4 IDs
// count up) and that no Deliver or Flush overlaps another.
type orderHandler struct {
	collector
	inflight atomic.Int32
	overlaps atomic.Int32
	next     uint16
	disorder atomic.Int32
	flushes  atomic.Int64
	again    atomic.Int64 // what Flush returns, in ns
}

func (h *orderHandler) Deliver(p *Packet) {
	if h.inflight.Add(1) != 1 {
		h.overlaps.Add(1)
	}
	if id := header.IPv4(p.Linear[header.EthernetMinimumSize:]).ID(); id != h.next {
		h.disorder.Add(1)
	}
	h.next++
	h.inflight.Add(-1)
	h.collector.Deliver(p)
}

func (h *orderHandler) Flush(bool) time.Duration {
	if h.inflight.Add(1) != 1 {
		h.overlaps.Add(1)
	}
	h.flushes.Add(1)
	h.inflight.Add(-1)
	return time.Duration(h.again.Swap(0))
}

// TestRunToCompletionRingFull: a burst far larger than the completion
// queue (super-frames of 30 frames each into 8 CQEs) or the RQ (single
// frames into a 4-WQE cyclic RQ) makes the one goroutine poll batches to
// make room instead of waiting for itself: every frame arrives, and the
// full ring is counted. The single frames come in order.
func TestRunToCompletionRingFull(t *testing.T) {
	t.Run("cq", func(t *testing.T) {
		h := &orderHandler{}
		d, w := newTestDriver(t, Config{RunToCompletion: true, RingSize: 8, Budget: 4}, h)
		hdr, frame, _ := tcpSuper(t, L3IPv4, 30*mss4)
		for range 20 {
			if err := w.Write(wireFrame(hdr, frame)); err != nil {
				t.Fatal(err)
			}
		}
		h.waitFor(t, 20*30)
		if n := h.overlaps.Load(); n != 0 {
			t.Errorf("Deliver or Flush overlapped %d times", n)
		}
		if d.Stats().CQEStalls.Load() == 0 {
			t.Errorf("the full completion queue was never counted")
		}
	})
	t.Run("rq", func(t *testing.T) {
		h := &orderHandler{}
		d, w := newTestDriver(t, Config{RunToCompletion: true, RQ: RQCyclic, RQSize: 4, Budget: 64}, h)
		spec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(1000)}
		const frames = 600
		for i := 0; i < frames; i++ {
			spec.ipID = uint16(i)
			if err := w.Write(wireFrame(VirtioNetHdr{}, spec.build())); err != nil {
				t.Fatal(err)
			}
		}
		h.waitFor(t, frames)
		if n := h.disorder.Load(); n != 0 {
			t.Errorf("frames out of order: %d", n)
		}
		if n := h.overlaps.Load(); n != 0 {
			t.Errorf("Deliver or Flush overlapped %d times", n)
		}
		if d.Stats().RQStalls.Load() == 0 {
			t.Errorf("the full RQ was never counted")
		}
	})
}

// TestRunToCompletionFlushTimer: a Flush that asks to be called again is
// called again after that time with no frame arriving: the goroutine's
// sleep on the wire ends at the handler's flush timer.
func TestRunToCompletionFlushTimer(t *testing.T) {
	h := &orderHandler{}
	_, w := newTestDriver(t, Config{RunToCompletion: true}, h)
	h.again.Store(int64(5 * time.Millisecond))
	spec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(64)}
	if err := w.Write(wireFrame(VirtioNetHdr{}, spec.build())); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, 1)
	// The flush after the batch returned 5 ms; only the timer calls
	// Flush again.
	deadline := time.Now().Add(10 * time.Second)
	for h.flushes.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("Flush called %d times in 10 s, want a second call at its timer", h.flushes.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// handBackRTC blocks the busy reader's first batch until gate closes.
type handBackRTC struct {
	collector
	d       *Driver
	reader  atomic.Bool
	once    sync.Once
	blocked chan struct{}
	gate    chan struct{}
}

func (h *handBackRTC) Deliver(p *Packet) {
	if h.reader.Load() && h.d.napi.state.Load() == napiReader {
		h.once.Do(func() {
			close(h.blocked)
			<-h.gate
		})
	}
	h.collector.Deliver(p)
}

// TestRunToCompletionBusyReader: while the goroutine sleeps, a busy reader
// takes the ring, reads the wire itself (a 30-frame super-frame cut into
// 30 completions), processes its budget and leaves the rest; the
// goroutine, woken by the frame meanwhile, waits for the ring and takes
// the rest.
func TestRunToCompletionBusyReader(t *testing.T) {
	hdr, frame, _ := tcpSuper(t, L3IPv4, 30*mss4)
	h := &handBackRTC{blocked: make(chan struct{}), gate: make(chan struct{})}
	d, w := newTestDriver(t, Config{RunToCompletion: true}, h)
	h.d = d
	for end := time.Now().Add(10 * time.Second); d.napi.state.Load() != napiIdle; {
		if time.Now().After(end) {
			t.Fatalf("the goroutine did not go to sleep")
		}
		runtime.Gosched()
	}
	done := make(chan int, 1)
	go func() {
		h.reader.Store(true)
		for {
			if n := d.BusyReadPoll(); n > 0 {
				h.reader.Store(false)
				done <- n
				return
			}
			if h.n.Load() > 0 {
				h.reader.Store(false)
				done <- 0 // the goroutine took the frame first
				return
			}
			runtime.Gosched()
		}
	}()
	if err := w.Write(wireFrame(hdr, frame)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.blocked:
	case n := <-done:
		if n == 0 {
			t.Skip("the goroutine read the frame before the reader")
		}
		t.Fatalf("the reader's batch was not blocked (%d)", n)
	}
	// The reader holds the ring in its first Deliver; the goroutine
	// woken by the frame finds it held. Let it look.
	time.Sleep(10 * time.Millisecond)
	close(h.gate)
	if n := <-done; n != BusyPollBudget {
		t.Fatalf("the reader's batch: %d completions, want %d", n, BusyPollBudget)
	}
	h.waitFor(t, 30)
}

// TestRunToCompletionExclusion is TestBusyReadExclusion's load with the
// NIC model and poll loop on one goroutine: readers that also read the
// wire, frames in ring order, no overlap.
func TestRunToCompletionExclusion(t *testing.T) {
	// The goroutine may win every race for the ring in one run; then the
	// run says nothing about readers: try again.
	for try := 0; try < 5; try++ {
		if rtcExclusion(t) > 0 {
			return
		}
	}
	t.Errorf("readers processed no completion in 5 runs")
}

// rtcExclusion is one run of TestRunToCompletionExclusion; it returns the
// completions the readers processed.
func rtcExclusion(t *testing.T) int64 {
	h := &orderHandler{}
	d, w := newTestDriver(t, Config{RunToCompletion: true}, h)
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
	for i := 0; i < frames; i++ {
		spec.ipID = uint16(i)
		if err := w.Write(wireFrame(VirtioNetHdr{}, spec.build())); err != nil {
			t.Fatal(err)
		}
		if i%16 == 0 {
			// A pause until the goroutine sleeps, so that readers find
			// the ring idle: while it runs they leave it alone.
			h.waitFor(t, int64(i))
			for end := time.Now().Add(10 * time.Second); !(d.napi.state.Load() != napiLoop && d.pollSleeping.Load()); {
				if time.Now().After(end) {
					t.Fatalf("the goroutine did not go to sleep")
				}
				runtime.Gosched()
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	h.waitFor(t, frames)
	if n := h.overlaps.Load(); n != 0 {
		t.Errorf("Deliver or Flush overlapped another %d times, want 0", n)
	}
	if n := h.disorder.Load(); n != 0 {
		t.Errorf("frames out of order: %d, want 0", n)
	}
	t.Logf("readers processed %d of %d frames; poll batches %d", readerWork.Load(), frames, d.Stats().Polls.Load())
	return readerWork.Load()
}

// TestRunToCompletionBusyPoll: with BusyPoll the goroutine spins on the
// wire after the ring drains, and a frame that comes meanwhile is taken
// without a sleep.
func TestRunToCompletionBusyPoll(t *testing.T) {
	h := &orderHandler{}
	d, w := newTestDriver(t, Config{RunToCompletion: true, BusyPoll: time.Second}, h)
	spec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(64)}
	for i := 0; i < 20; i++ {
		spec.ipID = uint16(i)
		for end := time.Now().Add(10 * time.Second); d.Stats().BusyPolls.Load() <= uint64(i); {
			if time.Now().After(end) {
				t.Fatalf("the goroutine is not spinning")
			}
			runtime.Gosched()
		}
		if err := w.Write(wireFrame(VirtioNetHdr{}, spec.build())); err != nil {
			t.Fatal(err)
		}
		h.waitFor(t, int64(i+1))
	}
	if hits := d.Stats().BusyPollHits.Load(); hits == 0 {
		t.Errorf("busy poll hits 0 of 20 frames sent while it spun")
	}
}

// TestRunToCompletionClose: Close stops the goroutine, closes Done, leaves
// Err nil and (the cleanup checks) returns every page.
func TestRunToCompletionClose(t *testing.T) {
	h := &orderHandler{}
	d, w := newTestDriver(t, Config{RunToCompletion: true}, h)
	spec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(64)}
	for i := 0; i < 100; i++ {
		spec.ipID = uint16(i)
		if err := w.Write(wireFrame(VirtioNetHdr{}, spec.build())); err != nil {
			t.Fatal(err)
		}
	}
	h.waitFor(t, 100)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Done():
	default:
		t.Fatal("Done not closed after Close")
	}
	if err := d.Err(); err != nil {
		t.Errorf("Err after Close: %v", err)
	}
}

// orderGoroutineHandler is orderHandler with sameGoroutineHandler's count
// of packets delivered on the goroutine that read their frame.
type orderGoroutineHandler struct {
	orderHandler
	tap        *goroutineTap
	same, away atomic.Int64
}

func (h *orderGoroutineHandler) Deliver(p *Packet) {
	if goid() == h.tap.id.Load() {
		h.same.Add(1)
	} else {
		h.away.Add(1)
	}
	h.orderHandler.Deliver(p)
}

// TestRunToCompletionSplit: a backlog on the wire longer than ten runs
// moves the NIC model to its own goroutine (rx_rtc_splits, frames then
// delivered on another goroutine than the one that read them), every
// frame arrives once and in order, and once the wire has been quiet the
// NIC model is back: a frame after that is read and delivered on one
// goroutine again.
func TestRunToCompletionSplit(t *testing.T) {
	tap := &goroutineTap{}
	h := &orderGoroutineHandler{tap: tap}
	d, w := newTestDriverDepth(t, Config{RunToCompletion: true, WireTap: tap}, h, 8192)
	spec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(64)}
	const frames = 6000 // 94 budgets: more than ten runs' worth
	for round := 0; round < 3; round++ {
		// Stop the goroutine from draining the wire while it fills: the
		// ring is taken as a busy reader would take it.
		for end := time.Now().Add(10 * time.Second); !d.napi.state.CompareAndSwap(napiIdle, napiReader); {
			if time.Now().After(end) {
				t.Fatalf("the goroutine did not go to sleep")
			}
			runtime.Gosched()
		}
		base := round * (frames + 1)
		for i := 0; i < frames; i++ {
			spec.ipID = uint16(base + i)
			if err := w.Write(wireFrame(VirtioNetHdr{}, spec.build())); err != nil {
				t.Fatal(err)
			}
		}
		d.napi.state.Store(napiIdle) // the goroutine, woken by the first frame, waits for it
		h.waitFor(t, int64(base+frames))
		if d.Stats().RTCSplits.Load() == 0 {
			t.Fatalf("rx_rtc_splits 0 after a backlog of %d frames", frames)
		}
		// Quiet: the NIC comes back.
		for end := time.Now().Add(10 * time.Second); d.split.on.Load(); {
			if time.Now().After(end) {
				t.Fatalf("the NIC model did not come back after the wire went quiet")
			}
			time.Sleep(time.Millisecond)
		}
		same := h.same.Load()
		spec.ipID = uint16(base + frames)
		if err := w.Write(wireFrame(VirtioNetHdr{}, spec.build())); err != nil {
			t.Fatal(err)
		}
		h.waitFor(t, int64(base+frames+1))
		if h.same.Load() != same+1 {
			t.Errorf("round %d: the frame after the split was not delivered on the goroutine that read it", round)
		}
	}
	if h.away.Load() == 0 {
		t.Errorf("no frame delivered on another goroutine than its reader's: the split did not happen")
	}
	if n := h.disorder.Load(); n != 0 {
		t.Errorf("frames out of order: %d", n)
	}
	if n := h.overlaps.Load(); n != 0 {
		t.Errorf("Deliver or Flush overlapped %d times", n)
	}
	t.Logf("splits %d, delivered on the reader's goroutine %d, on another %d", d.Stats().RTCSplits.Load(), h.same.Load(), h.away.Load())
}
