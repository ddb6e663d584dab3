package cpumap

import (
	"sync"
	"sync/atomic"

	"github.com/ustack/ustack/bufpool"
)

// cacheLine pads fields written by different goroutines apart.
const cacheLine = 64

// ring is one entry's queue: bounded, several producers, one consumer (the
// kernel's ptr_ring). Producers are serialized by mu, which each takes once
// per bulk; the consumer takes no lock. tail is written by producers under
// mu, head by the consumer only; each side reads the other's index
// atomically, which orders the slot accesses (the Go memory model's atomics
// are sequentially consistent). Each side also keeps the other's index as
// last read and reads it again only when that copy says full (producers)
// or empty (consumer), so that the index's cache line moves between CPUs
// about once per bulk rather than at every check.
type ring struct {
	// Set up once.
	slots []bufpool.Frame
	mask  uint64
	wake  chan struct{} // capacity 1
	_     [cacheLine]byte

	// The producers'.
	mu sync.Mutex
	// +checklocks:mu
	closed bool
	// headCache is head as a producer last read it.
	// +checklocks:mu
	headCache uint64
	tail      atomic.Uint64 // next slot to fill, as a running count
	_         [cacheLine]byte

	// The consumer's.
	head      atomic.Uint64 // next slot to take, as a running count
	tailCache uint64        // tail as last read
	_         [cacheLine]byte

	// Written rarely: sleeping is set by the consumer before it parks on
	// wake, and the producer that clears it sends the wake-up; closing is
	// set when the map closes, under mu.
	sleeping atomic.Bool
	closing  atomic.Bool
	_        [cacheLine]byte
}

func (r *ring) init(size int) {
	r.slots = make([]bufpool.Frame, size)
	r.mask = uint64(size - 1)
	r.wake = make(chan struct{}, 1)
}

// push moves as many of ps as fit into the ring and returns how many did;
// the caller keeps ownership of ps[n:]. It returns 0 once the ring is
// closed. It wakes the consumer when it finds it asleep.
func (r *ring) push(ps []bufpool.Frame) int {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return 0
	}
	t := r.tail.Load()
	size := uint64(len(r.slots))
	if t-r.headCache+uint64(len(ps)) > size {
		r.headCache = r.head.Load()
	}
	n := min(uint64(len(ps)), size-(t-r.headCache))
	for i := range n {
		r.slots[(t+i)&r.mask] = ps[i]
	}
	r.tail.Store(t + n)
	r.mu.Unlock()
	if n > 0 && r.sleeping.Load() && r.sleeping.CompareAndSwap(true, false) {
		r.signal()
	}
	return int(n)
}

// signal wakes the consumer, or leaves a wake-up for it.
func (r *ring) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// pop takes up to len(dst) frames into dst and returns the count. Only
// the consumer calls it.
func (r *ring) pop(dst []bufpool.Frame) int {
	h := r.head.Load()
	if h == r.tailCache {
		r.tailCache = r.tail.Load()
	}
	n := min(uint64(len(dst)), r.tailCache-h)
	for i := range n {
		s := &r.slots[(h+i)&r.mask]
		dst[i], *s = *s, bufpool.Frame{}
	}
	r.head.Store(h + n)
	return int(n)
}

// empty reports whether the ring holds nothing. Only the consumer calls
// it; it is exact until the next push.
func (r *ring) empty() bool {
	h := r.head.Load()
	if h != r.tailCache {
		return false
	}
	r.tailCache = r.tail.Load()
	return h == r.tailCache
}

// wait parks the consumer until a push or close, unless the ring is no
// longer empty or is closing. It adds 1 to sleeps before it parks.
func (r *ring) wait(sleeps *atomic.Uint64) {
	r.sleeping.Store(true)
	// Recheck after announcing the sleep: a producer that stored its
	// tail before this load is seen here; one that stores it after sees
	// sleeping and wakes us.
	if !r.empty() || r.closing.Load() {
		r.sleeping.Store(false)
		return
	}
	sleeps.Add(1)
	<-r.wake
	r.sleeping.Store(false)
}

// close makes further pushes fail and wakes the consumer, which drains
// what the ring holds.
func (r *ring) close() {
	r.mu.Lock()
	r.closed = true
	r.closing.Store(true)
	r.mu.Unlock()
	r.signal()
}
