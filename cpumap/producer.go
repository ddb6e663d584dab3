package cpumap

import (
	"sync"

	"github.com/ustack/ustack/bufpool"
)

// Producer is one poll loop's handle on a Map, the kernel's per-CPU
// xdp_bulk_queue: a bulk queue of BulkSize frames per entry, flushed into
// the entry's ring when full and at each batch end. Its methods are called
// from one goroutine (the poll loop's); Map.Close may run concurrently.
type Producer struct {
	m *Map

	// mu is held by each method and by Map.Close, which releases what the
	// bulk queues hold; the producer's goroutine is its only other user,
	// so it is never contended before Close.
	mu sync.Mutex
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	bulks []bulkQueue
}

// bulkQueue holds frames for one entry until a flush.
type bulkQueue struct {
	q []bufpool.Frame // len BulkSize
	n int
}

// Enqueue takes ownership of p and queues it for entry, as EnqueueFrame
// does a frame that carries a packet already built.
func (pr *Producer) Enqueue(entry int, p *bufpool.Packet) {
	pr.EnqueueFrame(entry, bufpool.Frame{Pkt: p})
}

// EnqueueFrame takes ownership of f and queues it for entry
// (bq_enqueue): the entry's worker builds its packet. A full bulk queue is
// flushed into the entry's ring at once. f is released and counted as
// dropped when entry is not in the map (also counted as invalid) or the map
// is closed. It never blocks on the ring's consumer.
func (pr *Producer) EnqueueFrame(entry int, f bufpool.Frame) {
	pr.mu.Lock()
	if pr.closed || uint(entry) >= uint(len(pr.bulks)) {
		closed := pr.closed
		pr.mu.Unlock()
		st := pr.m.stats
		st.Enqueued.Add(1)
		st.Dropped.Add(1)
		if !closed {
			st.Invalid.Add(1)
		}
		f.Release()
		return
	}
	b := &pr.bulks[entry]
	b.q[b.n] = f
	b.n++
	if b.n == len(b.q) {
		pr.flush(entry)
	}
	pr.mu.Unlock()
}

// Flush flushes every bulk queue into its ring, as xdp_do_flush at the end
// of a poll batch. Frames a ring has no room for are released and counted
// as dropped.
func (pr *Producer) Flush() {
	pr.mu.Lock()
	for i := range pr.bulks {
		if pr.bulks[i].n > 0 {
			pr.flush(i)
		}
	}
	pr.mu.Unlock()
}

// flush moves bulk queue i into its ring (bq_flush_to_queue).
//
// +checklocks:pr.mu
func (pr *Producer) flush(i int) {
	b := &pr.bulks[i]
	q := b.q[:b.n]
	b.n = 0
	pushed := pr.m.entries[i].ring.push(q)
	for _, f := range q[pushed:] {
		f.Release()
	}
	clear(q)
	st := pr.m.stats
	n := uint64(len(q))
	st.Enqueued.Add(n)
	st.BulkFlushes.Add(1)
	st.BulkFrames.Add(n)
	if d := n - uint64(pushed); d > 0 {
		st.Dropped.Add(d)
		st.entries[i].Dropped.Add(d)
	}
}

// close releases what the bulk queues hold, counting it as enqueued and
// dropped, and makes later calls drop their frames.
func (pr *Producer) close() {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.closed = true
	var n uint64
	for i := range pr.bulks {
		b := &pr.bulks[i]
		for _, f := range b.q[:b.n] {
			f.Release()
		}
		clear(b.q[:b.n])
		n += uint64(b.n)
		b.n = 0
	}
	pr.m.stats.Enqueued.Add(n)
	pr.m.stats.Dropped.Add(n)
}
