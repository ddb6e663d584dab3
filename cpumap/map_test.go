package cpumap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

func TestNewErrors(t *testing.T) {
	recv := func(int) Receiver { return &recorder{} }
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no cpus", Config{NewReceiver: recv}, "no CPUs"},
		{"no receiver", Config{CPUs: []int{0}}, "no NewReceiver"},
		{"nil receiver", Config{CPUs: []int{0}, NewReceiver: func(int) Receiver { return nil }}, "NewReceiver(0) returned nil"},
		{"queue not a power of two", Config{CPUs: []int{0}, NewReceiver: recv, QueueSize: 100}, "queue size 100"},
		{"queue too large", Config{CPUs: []int{0}, NewReceiver: recv, QueueSize: 32768}, "queue size 32768"},
		{"queue negative", Config{CPUs: []int{0}, NewReceiver: recv, QueueSize: -4}, "queue size -4"},
		{"bulk above queue", Config{CPUs: []int{0}, NewReceiver: recv, QueueSize: 4, BulkSize: 8}, "bulk size 8"},
		{"bulk negative", Config{CPUs: []int{0}, NewReceiver: recv, BulkSize: -1}, "bulk size -1"},
		{"batch negative", Config{CPUs: []int{0}, NewReceiver: recv, Batch: -1}, "batch -1"},
		{"bulk 2 but queue 1", Config{CPUs: []int{0}, NewReceiver: recv, QueueSize: 1, BulkSize: 2}, "bulk size 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.cfg)
			if err == nil {
				m.Close()
				t.Fatalf("got no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %q, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestBulkFlush checks that frames stay in the producer's bulk queue until
// it holds BulkSize of them or Flush is called.
func TestBulkFlush(t *testing.T) {
	for _, bulk := range []int{1, 4, 8} {
		t.Run(fmt.Sprint("bulk=", bulk), func(t *testing.T) {
			pool := testutil.NewPoisonPool(t)
			rec := &recorder{}
			m := newTestMap(t, Config{QueueSize: 64, BulkSize: bulk}, rec)
			pr := m.NewProducer()
			r := &m.entries[0].ring
			st := m.Stats()
			tag := uint64(0)
			enqueue := func(n int) {
				for range n {
					pr.Enqueue(0, tagged(t, pool, tag))
					tag++
				}
			}

			enqueue(bulk - 1)
			if got := r.tail.Load(); got != 0 {
				t.Fatalf("after %d frames: got %d in the ring, want 0 before the bulk is full", bulk-1, got)
			}
			if got := st.BulkFlushes.Load(); got != 0 {
				t.Fatalf("got %d bulk flushes, want 0", got)
			}
			enqueue(1)
			if got := r.tail.Load(); got != uint64(bulk) {
				t.Fatalf("after %d frames: got %d in the ring, want %d", bulk, got, bulk)
			}
			pr.Flush() // nothing queued: no flush
			if got := st.BulkFlushes.Load(); got != 1 {
				t.Fatalf("got %d bulk flushes, want 1", got)
			}

			// A partial bulk waits for Flush.
			part := max(bulk-1, 1)
			if bulk == 1 {
				part = 0
			}
			enqueue(part)
			if got := r.tail.Load(); got != uint64(bulk) {
				t.Fatalf("after %d more frames: got %d in the ring, want %d", part, got, bulk)
			}
			pr.Flush()
			total := bulk + part
			if got := r.tail.Load(); got != uint64(total) {
				t.Fatalf("after Flush: got %d in the ring, want %d", got, total)
			}
			testutil.WaitFor(t, "frames received", func() bool { return rec.received() == total })
			wantFlushes := uint64(1)
			if part > 0 {
				wantFlushes = 2
			}
			if got, want := st.BulkFlushes.Load(), wantFlushes; got != want {
				t.Errorf("got %d bulk flushes, want %d", got, want)
			}
			if got := st.BulkFrames.Load(); got != uint64(total) {
				t.Errorf("got %d bulk frames, want %d", got, total)
			}
			if got := st.Enqueued.Load(); got != uint64(total) {
				t.Errorf("got %d enqueued, want %d", got, total)
			}
			if err := m.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			want := make([]uint64, total)
			for i := range want {
				want[i] = uint64(i)
			}
			if got := rec.tags(); !slices.Equal(got, want) {
				t.Errorf("got tags %v, want %v", got, want)
			}
			if n := pool.InUse(); n != 0 {
				t.Errorf("got %d pages in use, want 0", n)
			}
		})
	}
}

// TestDropOnFull fills a ring whose worker is held and checks that what
// does not fit is released and counted, and the producer does not block.
func TestDropOnFull(t *testing.T) {
	const qsize, bulk, extra = 16, 4, 6
	pool := testutil.NewPoisonPool(t)
	rec := newGatedRecorder()
	m := newTestMap(t, Config{QueueSize: qsize, BulkSize: bulk}, rec)
	pr := m.NewProducer()
	pr.Enqueue(0, tagged(t, pool, 0))
	pr.Flush()
	<-rec.blocked // the worker holds frame 0 and the ring is empty

	for i := range qsize + extra {
		pr.Enqueue(0, tagged(t, pool, uint64(1+i)))
	}
	pr.Flush()
	st := m.Stats()
	if got := st.Dropped.Load(); got != extra {
		t.Errorf("got %d dropped, want %d", got, extra)
	}
	if got := st.Entry(0).Dropped.Load(); got != extra {
		t.Errorf("got %d dropped at entry 0, want %d", got, extra)
	}
	// The dropped frames' pages are back already: the held one and the
	// ring's are out.
	if got, want := pool.InUse(), 1+qsize; got != want {
		t.Errorf("got %d pages in use, want %d", got, want)
	}
	close(rec.gate)
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	want := make([]uint64, 1+qsize)
	for i := range want {
		want[i] = uint64(i)
	}
	if got := rec.tags(); !slices.Equal(got, want) {
		t.Errorf("got tags %v, want %v (the last %d dropped)", got, want, extra)
	}
	if got, want := st.Enqueued.Load(), uint64(1+qsize+extra); got != want {
		t.Errorf("got %d enqueued, want %d", got, want)
	}
	if n := pool.InUse(); n != 0 {
		t.Errorf("got %d pages in use, want 0", n)
	}
}

// TestProducers runs several producers into several entries with rings
// small enough to overflow, and checks that each frame is received exactly
// once or dropped, in order per producer and entry, and that no page leaks.
func TestProducers(t *testing.T) {
	const producers, entries, frames = 4, 3, 20000
	pool := testutil.NewPoisonPool(t)
	recs := make([]*recorder, entries)
	m := newTestMap(t, Config{QueueSize: 64, Batch: 5}, recs...)
	var wg sync.WaitGroup
	for p := range producers {
		pr := m.NewProducer()
		wg.Go(func() {
			for i := range frames {
				// Poll batches of 1..64 frames, spread unevenly.
				pr.Enqueue((i*7+p)%entries, tagged(t, pool, uint64(p)<<32|uint64(i)))
				if (i*13+p)%64 == 0 {
					pr.Flush()
				}
			}
			pr.Flush()
		})
	}
	wg.Wait()
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	seen := make(map[uint64]bool)
	for e, rec := range recs {
		last := make(map[uint64]int64)
		for _, tag := range rec.tags() {
			p, i := tag>>32, int64(tag&0xffffffff)
			if seen[tag] {
				t.Fatalf("frame %d of producer %d received twice", i, p)
			}
			seen[tag] = true
			if int(i*7+int64(p))%entries != e {
				t.Fatalf("frame %d of producer %d: got entry %d, want %d", i, p, e, (i*7+int64(p))%entries)
			}
			if l, ok := last[p]; ok && i <= l {
				t.Fatalf("entry %d: got frame %d of producer %d after frame %d, want producer order", e, i, p, l)
			}
			last[p] = i
		}
	}
	st := m.Stats()
	total := uint64(producers * frames)
	received := uint64(len(seen))
	if got := st.Enqueued.Load(); got != total {
		t.Errorf("got %d enqueued, want %d", got, total)
	}
	if got := st.WorkerFrames(); got != received {
		t.Errorf("got %d worker frames, want %d received", got, received)
	}
	if got := st.Dropped.Load(); got != total-received {
		t.Errorf("got %d dropped, want %d (enqueued - received)", got, total-received)
	}
	var perEntry uint64
	for i := range entries {
		perEntry += st.Entry(i).Dropped.Load()
	}
	if got := st.Dropped.Load(); perEntry != got {
		t.Errorf("got %d drops over entries, want %d", perEntry, got)
	}
	if n := pool.InUse(); n != 0 {
		t.Errorf("got %d pages in use, want 0: a frame was neither received nor released", n)
	}
	t.Logf("%d frames: %d received, %d dropped, bulk avg %.2f, %d rounds, %d sleeps",
		total, received, total-received, st.BulkSizeAvg(), st.WorkerRounds(), st.WorkerEmptyWaits())
}

// TestWakeups sends one frame at a time and waits for it: a lost wake-up
// hangs here.
func TestWakeups(t *testing.T) {
	pool := testutil.NewPoisonPool(t)
	rec := &recorder{}
	m := newTestMap(t, Config{}, rec)
	pr := m.NewProducer()
	st := m.Stats().Entry(0)
	const n = 2000
	for i := range n {
		pr.Enqueue(0, tagged(t, pool, uint64(i)))
		pr.Flush()
		// Each frame is a round that leaves the ring empty.
		testutil.WaitFor(t, fmt.Sprint("frame ", i), func() bool { return st.EndBatches.Load() == uint64(i+1) })
	}
	if got := rec.received(); got != n {
		t.Errorf("got %d frames, want %d", got, n)
	}
	// The worker sleeps at most once per frame, plus once at the start.
	if got := st.EmptyWaits.Load(); got < 1 || got > n+1 {
		t.Errorf("got %d empty waits, want 1..%d", got, n+1)
	}
}

// TestEndBatch pins when a worker ends batches: after every flushFrames
// frames under load, and when the ring runs empty, with Flush only then;
// and once more at Close.
func TestEndBatch(t *testing.T) {
	pool := testutil.NewPoisonPool(t)
	rec := newGatedRecorder()
	m := newTestMap(t, Config{QueueSize: 256, Batch: 8}, rec)
	pr := m.NewProducer()
	pr.Enqueue(0, tagged(t, pool, 0))
	pr.Flush()
	<-rec.blocked
	for i := range 200 {
		pr.Enqueue(0, tagged(t, pool, uint64(1+i)))
	}
	pr.Flush()
	close(rec.gate)
	testutil.WaitFor(t, "201 frames", func() bool { return rec.received() == 201 })
	testutil.WaitFor(t, "the batch end", func() bool { return len(rec.batchEnds('F')) == 1 })
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Round 1 takes frame 0 alone; then rounds of 8 frames: 1+64, +64,
	// +64, then 8 more empty the ring.
	if got, want := rec.batchEnds('E'), []int{65, 129, 193, 201, 201}; !slices.Equal(got, want) {
		t.Errorf("got EndBatch after frames %v, want %v", got, want)
	}
	if got, want := rec.batchEnds('F'), []int{201, 201}; !slices.Equal(got, want) {
		t.Errorf("got Flush after frames %v, want %v (empty ring and Close only)", got, want)
	}
	if got := m.Stats().WorkerRounds(); got != 1+25 {
		t.Errorf("got %d rounds, want %d", got, 1+25)
	}
}

// TestClose checks that Close drains the rings into the Receivers,
// releases the bulk queues, drops later frames, ends the last batch, and
// leaves no page out and no goroutine behind.
func TestClose(t *testing.T) {
	before := runtime.NumGoroutine()
	pool := testutil.NewPoisonPool(t)
	held := newGatedRecorder()
	recs := []*recorder{held, nil}
	m := newTestMap(t, Config{QueueSize: 128}, recs...)
	pr := m.NewProducer()
	idle := m.NewProducer()

	pr.Enqueue(0, tagged(t, pool, 0))
	pr.Flush()
	<-held.blocked
	for i := 1; i <= 100; i++ { // in ring 0 behind the held frame
		pr.Enqueue(0, tagged(t, pool, uint64(i)))
	}
	pr.Flush()
	for i := 101; i <= 103; i++ { // in the bulk queue of entry 1
		pr.Enqueue(1, tagged(t, pool, uint64(i)))
	}
	idle.Enqueue(0, tagged(t, pool, 200)) // in another producer's bulk queue

	closed := make(chan error)
	go func() { closed <- m.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v while a worker was held, want it to wait", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(held.gate)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}

	if got := len(held.tags()); got != 101 {
		t.Errorf("entry 0: got %d frames, want 101 (the ring drained)", got)
	}
	if got := len(recs[1].tags()); got != 0 {
		t.Errorf("entry 1: got %d frames, want 0 (bulk queues are released)", got)
	}
	for i, rec := range recs {
		ends := rec.batchEnds('E')
		if len(ends) == 0 || ends[len(ends)-1] != rec.received() {
			t.Errorf("entry %d: got EndBatch after %v, want a last one after all %d frames", i, ends, rec.received())
		}
	}
	st := m.Stats()
	if got := st.Dropped.Load(); got != 4 {
		t.Errorf("got %d dropped, want 4", got)
	}

	// After Close: frames are dropped, Flush does nothing, and a new
	// producer drops too.
	pr.Enqueue(0, tagged(t, pool, 300))
	pr.Flush()
	m.NewProducer().Enqueue(1, tagged(t, pool, 301))
	if got := st.Dropped.Load(); got != 6 {
		t.Errorf("after Close: got %d dropped, want 6", got)
	}
	if got, want := st.Enqueued.Load(), st.WorkerFrames()+st.Dropped.Load(); got != want {
		t.Errorf("got %d enqueued, want %d (received + dropped)", got, want)
	}
	if err := m.Close(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("second Close: got %v, want os.ErrClosed", err)
	}
	if n := pool.InUse(); n != 0 {
		t.Errorf("got %d pages in use, want 0", n)
	}
	checkGoroutines(t, before)
}

// checkGoroutines fails unless the goroutine count falls back to before.
func checkGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("got %d goroutines after Close, want %d:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
}

func TestNoGoroutineLeft(t *testing.T) {
	before := runtime.NumGoroutine()
	pool := testutil.NewPoisonPool(t)
	m, err := New(Config{CPUs: []int{0, 1, 0, 1}, NewReceiver: func(int) Receiver { return &recorder{} }})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	pr := m.NewProducer()
	for i := range 1000 {
		pr.Enqueue(i%4, tagged(t, pool, uint64(i)))
	}
	pr.Flush()
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	checkGoroutines(t, before)
	if n := pool.InUse(); n != 0 {
		t.Errorf("got %d pages in use, want 0", n)
	}
}

func TestPin(t *testing.T) {
	var mu sync.Mutex
	var calls [][]int
	pin := func(cpus []int) (int, error) {
		mu.Lock()
		calls = append(calls, slices.Clone(cpus))
		mu.Unlock()
		return cpus[0] + 100, nil
	}
	cpus := []int{5, 3, 5}
	m := newTestMap(t, Config{CPUs: cpus, Pin: pin}, nil, nil, nil)
	mu.Lock() // New returns after every worker pinned
	got := slices.Clone(calls)
	mu.Unlock()
	slices.SortFunc(got, slices.Compare)
	if want := [][]int{{3}, {5}, {5}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("got Pin calls %v, want %v (once per worker, its CPU)", got, want)
	}
	for i, c := range cpus {
		if got := m.WorkerCPU(i); got != c+100 {
			t.Errorf("WorkerCPU(%d) = %d, want %d (what Pin returned)", i, got, c+100)
		}
	}

	noPin := newTestMap(t, Config{}, nil)
	if got := noPin.WorkerCPU(0); got != -1 {
		t.Errorf("without Pin: WorkerCPU(0) = %d, want -1", got)
	}
}

func TestPinError(t *testing.T) {
	before := runtime.NumGoroutine()
	errNope := errors.New("nope")
	pin := func(cpus []int) (int, error) {
		if cpus[0] == 7 {
			return -1, errNope
		}
		return cpus[0], nil
	}
	m, err := New(Config{CPUs: []int{1, 7}, Pin: pin, NewReceiver: func(int) Receiver { return &recorder{} }})
	if err == nil {
		m.Close()
		t.Fatal("New: got no error, want the Pin error")
	}
	if !errors.Is(err, errNope) || !strings.Contains(err.Error(), "pin worker 1 to cpu 7") {
		t.Errorf("got error %q, want one wrapping %q naming worker 1 and cpu 7", err, errNope)
	}
	checkGoroutines(t, before)
}

func TestStatsEach(t *testing.T) {
	rec := newGatedRecorder()
	m := newTestMap(t, Config{QueueSize: 4, BulkSize: 2}, rec, nil)
	pool := testutil.NewPoisonPool(t)
	pr := m.NewProducer()
	pr.Enqueue(0, tagged(t, pool, 0))
	pr.Flush()
	<-rec.blocked
	for i := range 6 { // 4 fit, 2 dropped
		pr.Enqueue(0, tagged(t, pool, uint64(i+1)))
	}
	pr.Enqueue(5, tagged(t, pool, 9)) // no entry 5
	close(rec.gate)
	testutil.WaitFor(t, "5 frames", func() bool { return rec.received() == 5 })
	testutil.WaitFor(t, "the batch end", func() bool { return len(rec.batchEnds('E')) == 1 })
	testutil.WaitFor(t, "the worker asleep", func() bool { return m.Stats().Entry(0).EmptyWaits.Load() == 2 })

	var got []string
	m.Stats().Each(func(name string, v uint64) { got = append(got, fmt.Sprintf("%s=%d", name, v)) })
	want := []string{
		"cpumap_enqueued=8", "cpumap_bulk_flushes=4", "cpumap_bulk_frames=7",
		"cpumap_dropped=3", "cpumap_redirect_invalid=1",
		"cpumap_worker_rounds=2", "cpumap_worker_frames=5",
		"cpumap_worker_empty_waits=3", "cpumap_worker_end_batches=1",
		"cpumap_worker_flush_old=0", "cpumap_worker_lists=0",
		"cpumap_worker_built=0", "cpumap_worker_prebuilt=5", "cpumap_worker_bulk_allocs=0",
		"cpumap_entry_0_frames=5", "cpumap_entry_0_dropped=2",
		"cpumap_entry_1_frames=0", "cpumap_entry_1_dropped=0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got counters\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := m.Stats().BulkSizeAvg(); got != 7.0/4 {
		t.Errorf("got bulk size avg %v, want %v", got, 7.0/4)
	}

	// Only the first 8 entries are named.
	many := newTestMap(t, Config{CPUs: make([]int, 10)}, make([]*recorder, 10)...)
	var names []string
	many.Stats().Each(func(name string, _ uint64) { names = append(names, name) })
	if got, want := len(names), 14+2*8; got != want {
		t.Errorf("10 entries: got %d counters, want %d", got, want)
	}
	if got, want := names[len(names)-1], "cpumap_entry_7_dropped"; got != want {
		t.Errorf("got last counter %q, want %q", got, want)
	}
}

// headRecorder is a Receiver that records, for each packet, its tag (the
// first 8 bytes), whether its linear part is a head frag, its length and
// its checksum status, and releases it.
type headRecorder struct {
	mu sync.Mutex
	// +checklocks:mu
	got []string
}

func (r *headRecorder) Receive(p *bufpool.Packet, _ int64) {
	r.mu.Lock()
	r.got = append(r.got, fmt.Sprintf("%d head=%v len=%d csum=%v hdr=%d", tagOf(p), p.Head != nil, p.Len, p.CsumVerified, p.HdrLen))
	r.mu.Unlock()
	p.Release()
}
func (r *headRecorder) EndBatch(int64) {}

func (r *headRecorder) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// TestEnqueueFrameBuilds: a frame enqueued without a packet (the linear
// RQ's xdp_frame) reaches the worker's Receiver as a packet the worker
// built around the frame's bytes in their page (a head frag, the frame's
// length and checksum verdict, headers not parsed), in order with frames
// that carry a packet the poll loop built; the worker takes the packet
// structs in one bulk per round; frames the ring has no room for give
// their page references back.
func TestEnqueueFrameBuilds(t *testing.T) {
	pool := testutil.NewPoisonPool(t)
	rec := &headRecorder{}
	m, err := New(Config{CPUs: []int{0}, QueueSize: 16, BulkSize: 4, NewReceiver: func(int) Receiver { return rec }})
	if err != nil {
		t.Fatal(err)
	}
	frame := func(tag uint64, csum bool) bufpool.Frame {
		pg, err := pool.Get()
		if err != nil {
			t.Fatal(err)
		}
		binary.LittleEndian.PutUint64(pg.Bytes()[256:], tag)
		return bufpool.Frame{Head: bufpool.Frag{Page: pg, Off: 256, Len: 100}, CsumVerified: csum}
	}
	pr := m.NewProducer()
	pr.EnqueueFrame(0, frame(1, true))
	pr.Enqueue(0, tagged(t, pool, 2))
	pr.EnqueueFrame(0, frame(3, false))
	pr.EnqueueFrame(0, frame(4, true))
	pr.Flush()
	want := []string{
		"1 head=true len=100 csum=true hdr=0",
		"2 head=false len=72 csum=false hdr=0",
		"3 head=true len=100 csum=false hdr=0",
		"4 head=true len=100 csum=true hdr=0",
	}
	testutil.WaitFor(t, "4 packets", func() bool { return len(rec.events()) == 4 })
	if got := rec.events(); !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	st := m.Stats()
	if b, p, a, r := st.WorkerBuilt(), st.WorkerPrebuilt(), st.WorkerBulkAllocs(), st.WorkerRounds(); b != 3 || p != 1 || a == 0 || a > r {
		t.Errorf("built %d, prebuilt %d, bulk allocs %d in %d rounds: want 3, 1, and 1 to rounds", b, p, a, r)
	}
	// An entry the map does not have, and a closed map: the frames'
	// pages go back.
	pr.EnqueueFrame(3, frame(5, true))
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	pr.EnqueueFrame(0, frame(6, true))
	if got := pool.Stats().InUse; got != 0 {
		t.Errorf("pages in use after close: %d, want 0", got)
	}
	if got := st.Dropped.Load(); got != 2 {
		t.Errorf("dropped: %d, want 2", got)
	}
}
