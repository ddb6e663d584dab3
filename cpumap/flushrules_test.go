package cpumap

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// oldRecorder is a recorder that is also an OldFlusher: FlushOlderThan
// records an 'O' event with the age and clock it was given.
type oldRecorder struct {
	*recorder
	mu sync.Mutex
	// +checklocks:mu
	olds []oldFlush
}

type oldFlush struct {
	n   int // frames received before it
	age time.Duration
	now int64
}

func (r *oldRecorder) FlushOlderThan(age time.Duration, now int64) {
	n := r.received()
	r.mu.Lock()
	r.olds = append(r.olds, oldFlush{n, age, now})
	r.mu.Unlock()
}

func (r *oldRecorder) flushes() []oldFlush {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.olds)
}

// TestFlushOld pins cpu_map_gro_flush's rule, with an injected clock: while
// the ring still holds frames, the flush every 64 frames hands up only the
// packets older than a jiffy (FlushOlderThan(1ms, the round's clock)), and
// neither ends the batch nor flushes in full; when the ring runs empty the
// worker ends the batch and flushes everything (EndBatch, Flush).
func TestFlushOld(t *testing.T) {
	pool := testutil.NewPoisonPool(t)
	rec := &oldRecorder{recorder: newGatedRecorder()}
	var clock atomic.Int64 // each round reads the clock once: 1, 2, 3 ... ms
	now := func() int64 { return clock.Add(int64(time.Millisecond)) }
	m, err := New(Config{CPUs: []int{0}, QueueSize: 256, Batch: 8, Now: now,
		NewReceiver: func(int) Receiver { return rec }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pr := m.NewProducer()
	pr.Enqueue(0, tagged(t, pool, 0))
	pr.Flush()
	<-rec.blocked
	for i := range 200 {
		pr.Enqueue(0, tagged(t, pool, uint64(1+i)))
	}
	pr.Flush()
	close(rec.gate)
	testutil.WaitFor(t, "the full flush", func() bool { return len(rec.batchEnds('F')) == 1 })
	// Round 1 (clock 1 ms) takes frame 0 alone; then rounds of 8, the
	// 8th, 16th and 24th (clock 9, 17, 25 ms) end at 65, 129 and 193
	// frames with the ring not empty; the 26th (27 ms) empties it.
	ms := int64(time.Millisecond)
	want := []oldFlush{{65, time.Millisecond, 9 * ms}, {129, time.Millisecond, 17 * ms}, {193, time.Millisecond, 25 * ms}}
	if got := rec.flushes(); !slices.Equal(got, want) {
		t.Errorf("got flushes of old packets %v, want %v", got, want)
	}
	if got, want := rec.batchEnds('E'), []int{201}; !slices.Equal(got, want) {
		t.Errorf("got EndBatch after frames %v, want %v (the empty ring only)", got, want)
	}
	if got, want := rec.batchEnds('F'), []int{201}; !slices.Equal(got, want) {
		t.Errorf("got Flush after frames %v, want %v (the empty ring only)", got, want)
	}
	st := m.Stats()
	if got := st.WorkerFlushOld(); got != 3 {
		t.Errorf("cpumap_worker_flush_old: got %d, want 3", got)
	}
	if got := st.WorkerEndBatches(); got != 1 {
		t.Errorf("cpumap_worker_end_batches: got %d, want 1", got)
	}
}

// listRecorder is a ListReceiver: it records the tags of each list and
// releases them. With gate set,
// its first list signals blocked and waits until gate is closed.
type listRecorder struct {
	mu sync.Mutex
	// +checklocks:mu
	lists   [][]uint64
	singles atomic.Int64
	ends    atomic.Int64
	gate    chan struct{}
	blocked chan struct{}
	once    sync.Once
}

func (r *listRecorder) Receive(p *bufpool.Packet, _ int64) {
	r.singles.Add(1)
	p.Release()
}

func (r *listRecorder) EndBatch(int64) { r.ends.Add(1) }

func (r *listRecorder) ReceiveList(ps []*bufpool.Packet, _ int64) {
	r.once.Do(func() {
		close(r.blocked)
		<-r.gate
	})
	tags := make([]uint64, 0, len(ps))
	r.mu.Lock()
	for _, p := range ps {
		tags = append(tags, tagOf(p))
		p.Release()
	}
	r.lists = append(r.lists, tags)
	r.mu.Unlock()
}

func (r *listRecorder) sizes() (sizes []int, tags []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.lists {
		sizes = append(sizes, len(l))
		tags = append(tags, l...)
	}
	return sizes, tags
}

// TestListReceiver: a ListReceiver gets each round as one list
// (netif_receive_skb_list), in order, one call per round and no Receive.
func TestListReceiver(t *testing.T) {
	pool := testutil.NewPoisonPool(t)
	rec := &listRecorder{gate: make(chan struct{}), blocked: make(chan struct{})}
	m, err := New(Config{CPUs: []int{0}, QueueSize: 256, Batch: 8,
		NewReceiver: func(int) Receiver { return rec }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pr := m.NewProducer()
	send := func(tag uint64) { pr.Enqueue(0, tagged(t, pool, tag)) }
	send(0)
	pr.Flush()
	select {
	case <-rec.blocked:
	case <-time.After(30 * time.Second):
		close(rec.gate)
		t.Fatal("no ReceiveList call for the first frame")
	}
	for i := range 100 {
		send(uint64(1 + i))
	}
	pr.Flush()
	close(rec.gate)
	testutil.WaitFor(t, "101 frames", func() bool { return m.Stats().WorkerFrames() == 101 })
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	sizes, tags := rec.sizes()
	want := []int{1}
	for range 12 {
		want = append(want, 8)
	}
	want = append(want, 4)
	if !slices.Equal(sizes, want) {
		t.Errorf("got lists of %v frames, want %v (one per round)", sizes, want)
	}
	for i, tag := range tags {
		if tag != uint64(i) {
			t.Fatalf("frame %d of the lists: got tag %d, want %d", i, tag, i)
		}
	}
	if n := rec.singles.Load(); n != 0 {
		t.Errorf("Receive calls for a ListReceiver: got %d, want 0", n)
	}
	st := m.Stats()
	if got, rounds := st.WorkerLists(), st.WorkerRounds(); got != rounds || got != uint64(len(want)) {
		t.Errorf("cpumap_worker_lists: got %d, want %d (the rounds: %d)", got, len(want), rounds)
	}
}
