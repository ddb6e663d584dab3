package cpumap

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ustack/ustack/bufpool"
)

// lockFreeRing is the alternative to ring that BenchmarkRing weighs it
// against: producers reserve slots with a CAS on tail and publish each slot
// with an atomic pointer store; the consumer takes a slot when its pointer
// is set. It is kept here, in a test, as the measured road not taken; it
// carries frames that hold a packet only (a pointer per slot), as the
// ring carried before it held Frame values.
type lockFreeRing struct {
	slots []atomic.Pointer[bufpool.Packet]
	mask  uint64
	_     [cacheLine]byte
	tail  atomic.Uint64
	_     [cacheLine]byte
	head  atomic.Uint64
	_     [cacheLine]byte
}

func newLockFreeRing(size int) *lockFreeRing {
	return &lockFreeRing{slots: make([]atomic.Pointer[bufpool.Packet], size), mask: uint64(size - 1)}
}

func (r *lockFreeRing) push(ps []bufpool.Frame) int {
	size := uint64(len(r.slots))
	for {
		t := r.tail.Load()
		n := min(uint64(len(ps)), size-(t-r.head.Load()))
		if n == 0 {
			return 0
		}
		if r.tail.CompareAndSwap(t, t+n) {
			for i := range n {
				r.slots[(t+i)&r.mask].Store(ps[i].Pkt)
			}
			return int(n)
		}
	}
}

func (r *lockFreeRing) pop(dst []bufpool.Frame) int {
	h := r.head.Load()
	n := 0
	for n < len(dst) {
		s := &r.slots[(h+uint64(n))&r.mask]
		p := s.Load()
		if p == nil {
			break
		}
		s.Store(nil)
		dst[n] = bufpool.Frame{Pkt: p}
		n++
	}
	r.head.Store(h + uint64(n))
	return n
}

// ringer is what BenchmarkRing drives.
type ringer interface {
	push([]bufpool.Frame) int
	pop([]bufpool.Frame) int
}

func newMutexRing(size int) *ring {
	r := new(ring)
	r.init(size)
	return r
}

func TestLockFreeRing(t *testing.T) {
	// The alternative must be right for its figures to count.
	r := newLockFreeRing(16)
	testRingOrder(t, r)
	testRingOrder(t, newMutexRing(16))
}

// testRingOrder pushes from two producers and checks that the consumer
// gets every packet once, in each producer's order.
func testRingOrder(t *testing.T, r ringer) {
	const per = 20000
	ps := make([]bufpool.Frame, 2*per)
	for i := range ps {
		ps[i].Pkt = bufpool.NewPacket()
		ps[i].Pkt.Len = i
	}
	var wg sync.WaitGroup
	for k := range 2 {
		wg.Go(func() {
			mine := ps[k*per : (k+1)*per]
			for len(mine) > 0 {
				n := r.push(mine[:min(len(mine), 8)])
				mine = mine[n:]
				if n == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	last := [2]int{-1, -1}
	got := 0
	dst := make([]bufpool.Frame, 8)
	for got < 2*per {
		n := r.pop(dst)
		if n == 0 {
			runtime.Gosched()
		}
		for _, f := range dst[:n] {
			p := f.Pkt
			k := p.Len / per
			if p.Len <= last[k] {
				t.Fatalf("got packet %d after %d", p.Len, last[k])
			}
			last[k] = p.Len
		}
		got += n
	}
	wg.Wait()
	for _, f := range ps {
		f.Release()
	}
}

// BenchmarkRing weighs the mutex ring against the lock-free one: producers
// push bulks, one consumer pops batches of 8; ns/op is per frame.
func BenchmarkRing(b *testing.B) {
	for _, kind := range []string{"mutex", "lockfree"} {
		for _, producers := range []int{1, 2} {
			for _, bulk := range []int{1, 8} {
				b.Run(fmt.Sprintf("%s/producers=%d/bulk=%d", kind, producers, bulk), func(b *testing.B) {
					var r ringer = newMutexRing(DefaultQueueSize)
					if kind == "lockfree" {
						r = newLockFreeRing(DefaultQueueSize)
					}
					benchRing(b, r, producers, bulk)
				})
			}
		}
	}
}

func benchRing(b *testing.B, r ringer, producers, bulk int) {
	p := bufpool.NewPacket()
	defer p.Release()
	q := make([]bufpool.Frame, bulk)
	for i := range q {
		q[i].Pkt = p
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	// Helper producers push until stopped; the benchmark goroutine is the
	// consumer and counts frames.
	for range producers {
		wg.Go(func() {
			for !stop.Load() {
				if r.push(q) == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	dst := make([]bufpool.Frame, DefaultBatch)
	b.ReportAllocs()
	var pending int
	for b.Loop() {
		for pending == 0 {
			if pending = r.pop(dst); pending == 0 {
				runtime.Gosched()
			}
		}
		pending--
	}
	stop.Store(true)
	wg.Wait()
	for r.pop(dst) > 0 {
	}
}
