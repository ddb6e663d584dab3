package cpumap

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// returner is a Receiver that hands packets back to the test: it keeps
// them until want have come, then signals done.
type returner struct {
	mu sync.Mutex
	// +checklocks:mu
	back []*bufpool.Packet
	want int
	done chan struct{}
}

func (r *returner) Receive(p *bufpool.Packet, now int64) {
	r.mu.Lock()
	r.back = append(r.back, p)
	n := len(r.back)
	r.mu.Unlock()
	if n == r.want {
		r.done <- struct{}{}
	}
}

func (r *returner) EndBatch(int64) {}

// listReturner is a returner that takes each round as a list and flushes
// old packets under load: the worker's whole ListReceiver/OldFlusher path.
type listReturner struct{ *returner }

func (r listReturner) ReceiveList(ps []*bufpool.Packet, now int64) {
	for _, p := range ps {
		r.Receive(p, now)
	}
}

func (r listReturner) FlushOlderThan(time.Duration, int64) {}
func (r listReturner) Flush()                              {}

// TestNoAllocs pins zero heap allocations per frame in steady state, on
// both sides: Enqueue, Flush, the ring, the wake-up and the worker's round,
// with frames handed over one by one and as lists, and frames without a
// packet that the worker builds one for (EnqueueFrame).
func TestNoAllocs(t *testing.T) {
	t.Run("receive", func(t *testing.T) { testNoAllocs(t, false, false) })
	t.Run("list", func(t *testing.T) { testNoAllocs(t, true, false) })
	t.Run("frames", func(t *testing.T) { testNoAllocs(t, true, true) })
}

func testNoAllocs(t *testing.T, list, frames bool) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	const n = 64 // a NAPI budget of frames per poll batch
	ret := &returner{back: make([]*bufpool.Packet, 0, n), want: n, done: make(chan struct{}, 1)}
	var recv Receiver = ret
	if list {
		recv = listReturner{ret}
	}
	m, err := New(Config{CPUs: []int{0}, NewReceiver: func(int) Receiver { return recv }})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer m.Close()
	pr := m.NewProducer()
	pkts := make([]*bufpool.Packet, n)
	frame := frameSpec{}.frame()
	pool := testutil.NewPool(t, bufpool.Config{})
	heads := make([]bufpool.Frag, n) // the frames' strides, frames only
	for i := range pkts {
		pkts[i] = packetOf(frame)
		if frames {
			pg, err := pool.Get()
			if err != nil {
				t.Fatal(err)
			}
			copy(pg.Bytes()[256:], frame)
			heads[i] = bufpool.Frag{Page: pg, Off: 256, Len: uint32(len(frame))}
		}
	}
	hash := mustProgram(t, "hash", 1)
	batch := func() {
		for i, p := range pkts {
			_, e := hash.Run(p.Linear)
			if frames {
				pr.EnqueueFrame(e, bufpool.Frame{Head: heads[i]})
				continue
			}
			pr.Enqueue(e, p)
		}
		pr.Flush()
		<-ret.done
		ret.mu.Lock()
		if frames {
			for i, p := range ret.back { // the built packets: their strides back
				heads[i] = p.TakeHead(0)
				p.Release()
			}
		} else {
			copy(pkts, ret.back)
		}
		ret.back = ret.back[:0]
		ret.mu.Unlock()
	}
	batch() // warm up
	if allocs := testing.AllocsPerRun(200, batch); allocs != 0 {
		t.Errorf("got %v allocs per batch of %d frames, want 0", allocs, n)
	}
	for _, p := range pkts {
		p.Release()
	}
	for _, f := range heads {
		if f.Page != nil {
			f.Page.DecRef()
		}
	}
	if got, want := m.Stats().WorkerBuilt(), map[bool]uint64{false: 0, true: n * 202}[frames]; got != want {
		t.Errorf("got %d packets built by the worker, want %d", got, want)
	}
	if got, want := m.Stats().WorkerFrames(), uint64(n*202); got != want {
		t.Errorf("got %d frames received, want %d", got, want)
	}
	if list && m.Stats().WorkerLists() != m.Stats().WorkerRounds() {
		t.Errorf("got %d lists in %d rounds, want one per round", m.Stats().WorkerLists(), m.Stats().WorkerRounds())
	}
}

// releaser is a Receiver that releases what it is given.
type releaser struct{}

func (releaser) Receive(p *bufpool.Packet, now int64) { p.Release() }
func (releaser) EndBatch(int64)                       {}

// discarder is a Receiver that does nothing with what it is given: the
// benchmark that uses it keeps the packets.
type discarder struct{}

func (discarder) Receive(*bufpool.Packet, int64) {}
func (discarder) EndBatch(int64)                 {}

// BenchmarkPipeline measures producer -> ring -> worker throughput, one
// frame per iteration (ns/op is ns per frame), with poll batches of 64
// frames. The producer keeps no more than QueueSize-128 frames in flight,
// so nothing is dropped and the figure is the slower side's.
//
// With packets=pool, the producer takes each packet from the packet cache
// and the worker releases it, as in ustack (the cache's cross-CPU traffic
// included). With packets=fixed, a fixed set of more packets than can be in
// flight is enqueued round robin and the worker does nothing with them, so
// that only the cpumap's own cost is measured.
func BenchmarkPipeline(b *testing.B) {
	for _, fixed := range []bool{false, true} {
		for _, bulk := range []int{1, 8} {
			name := fmt.Sprintf("packets=pool/bulk=%d", bulk)
			if fixed {
				name = fmt.Sprintf("packets=fixed/bulk=%d", bulk)
			}
			b.Run(name, func(b *testing.B) { benchPipeline(b, bulk, fixed) })
		}
	}
}

func benchPipeline(b *testing.B, bulk int, fixed bool) {
	const budget = 64
	var recv Receiver = releaser{}
	if fixed {
		recv = discarder{}
	}
	m, err := New(Config{CPUs: []int{0}, BulkSize: bulk, NewReceiver: func(int) Receiver { return recv }})
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	pr := m.NewProducer()
	st := m.Stats()
	frame := frameSpec{n: 1448}.frame()[:54]
	limit := uint64(DefaultQueueSize - 2*budget)
	var pkts []*bufpool.Packet
	if fixed {
		pkts = make([]*bufpool.Packet, 2*DefaultQueueSize)
		for i := range pkts {
			pkts[i] = packetOf(frame)
		}
	}
	var sent uint64
	b.ReportAllocs()
	for b.Loop() {
		var p *bufpool.Packet
		if fixed {
			p = pkts[sent%uint64(len(pkts))]
		} else {
			p = bufpool.NewPacket()
			p.Linear = append(p.Linear, frame...)
		}
		pr.Enqueue(0, p)
		if sent++; sent%budget == 0 {
			pr.Flush()
			// Spin, yielding now and then: Gosched at every check
			// costs the worker its CPU's scheduler time.
			for i := 1; sent-st.Entry(0).Frames.Load() > limit; i++ {
				if i%1024 == 0 {
					runtime.Gosched()
				}
			}
		}
	}
	pr.Flush()
	m.Close()
	for _, p := range pkts {
		p.Release()
	}
	if d := st.Dropped.Load(); d != 0 {
		b.Errorf("got %d dropped, want 0", d)
	}
	b.ReportMetric(st.BulkSizeAvg(), "frames/bulk")
	b.ReportMetric(float64(st.WorkerFrames())/float64(max(st.WorkerRounds(), 1)), "frames/round")
	b.ReportMetric(float64(st.WorkerEmptyWaits())/float64(sent)*1000, "sleeps/kframe")
}

func BenchmarkPrograms(b *testing.B) {
	for _, tc := range []struct {
		prog string
		s    frameSpec
	}{
		{"hash", frameSpec{}},
		{"hash", frameSpec{v6: true, udp: true}},
		{"drop-port:80", frameSpec{v6: true}},
	} {
		name := tc.prog + "/v4"
		if tc.s.v6 {
			name = tc.prog + "/v6"
		}
		b.Run(name, func(b *testing.B) {
			prog := mustProgram(b, tc.prog, 4)
			p := packetOf(tc.s.frame())
			defer p.Release()
			b.ReportAllocs()
			for b.Loop() {
				prog.Run(p.Linear)
			}
		})
	}
}
