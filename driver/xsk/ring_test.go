package xsk

import (
	"fmt"
	"math"
	"sync"
	"testing"
)

// TestRingWrapAround drives a ring whose indexes start just below 2^32
// through many batches, so that the producer and consumer indexes wrap
// (separately: the producer first) while the ring is partly full.
func TestRingWrapAround(t *testing.T) {
	for _, start := range []uint32{0, math.MaxUint32 - 2, math.MaxUint32 - 7, math.MaxUint32 - 100} {
		r := newRing[uint64](8, start)
		p, c := newProducer(r), newConsumer(r)
		next, want := uint64(0), uint64(0)
		batches := []uint32{3, 5, 1, 8, 2, 7, 4, 6, 8, 1}
		for round := 0; round < 40; round++ {
			n := batches[round%len(batches)]
			// Produce what fits of n, all or nothing.
			free := p.Free(n)
			got, idx := p.Reserve(n)
			if free >= n && got != n || free < n && got != 0 {
				t.Fatalf("start %#x round %d: Reserve(%d) with %d free: got %d", start, round, n, free, got)
			}
			for i := range got {
				*p.Entry(idx + i) = next
				next++
			}
			p.Submit(got)
			if used := r.producer.Load() - r.consumer.Load(); used > 8 {
				t.Fatalf("start %#x round %d: %d entries in a ring of 8", start, round, used)
			}
			// Consume a different amount than was produced.
			m := batches[(round+3)%len(batches)]
			got, idx = c.Peek(m)
			for i := range got {
				if v := *c.Entry(idx + i); v != want {
					t.Fatalf("start %#x round %d: entry %d: got %d, want %d", start, round, i, v, want)
				}
				want++
			}
			c.Release(got)
		}
		// Drain.
		for {
			got, idx := c.Peek(8)
			if got == 0 {
				break
			}
			for i := range got {
				if v := *c.Entry(idx + i); v != want {
					t.Fatalf("start %#x drain: got %d, want %d", start, v, want)
				}
				want++
			}
			c.Release(got)
		}
		if want != next {
			t.Errorf("start %#x: consumed %d entries, want %d", start, want, next)
		}
		if start != 0 && r.producer.Load() >= start {
			t.Errorf("start %#x: producer index %#x did not wrap", start, r.producer.Load())
		}
		if p.Free(8) != 8 {
			t.Errorf("start %#x: empty ring: Free %d, want 8", start, p.Free(8))
		}
	}
}

// TestRingFullEmpty checks the boundaries: a full ring reserves nothing, an
// empty one peeks nothing, Cancel gives slots and entries back, and Avail
// and Free see the other side's progress across the wrap.
func TestRingFullEmpty(t *testing.T) {
	r := newRing[Desc](4, math.MaxUint32-1)
	p, c := newProducer(r), newConsumer(r)
	if got, _ := c.Peek(4); got != 0 {
		t.Fatalf("empty ring: Peek got %d", got)
	}
	got, idx := p.Reserve(4)
	if got != 4 || idx != math.MaxUint32-1 {
		t.Fatalf("Reserve(4): got %d at %#x, want 4 at %#x", got, idx, uint32(math.MaxUint32-1))
	}
	if got, _ := p.Reserve(1); got != 0 {
		t.Fatalf("full ring: Reserve(1) got %d", got)
	}
	p.Cancel(1)
	for i := range uint32(3) {
		*p.Entry(idx + i) = Desc{Addr: uint64(i)}
	}
	p.Submit(3)
	if n := c.Avail(8); n != 3 {
		t.Fatalf("Avail: got %d, want 3", n)
	}
	got, cidx := c.Peek(2)
	if got != 2 || c.Entry(cidx+1).Addr != 1 {
		t.Fatalf("Peek(2): got %d, second %d", got, c.Entry(cidx+1).Addr)
	}
	c.Cancel(1)
	c.Release(1)
	got, cidx = c.Peek(8)
	if got != 2 || c.Entry(cidx).Addr != 1 || c.Entry(cidx+1).Addr != 2 {
		t.Fatalf("Peek after Cancel: got %d entries starting with %d", got, c.Entry(cidx).Addr)
	}
	c.Release(2)
	if f := p.Free(4); f != 4 {
		t.Errorf("Free after the consumer released everything: got %d, want 4", f)
	}
}

// TestRingConcurrent runs a producer and a consumer goroutine on a ring
// that wraps, under -race: every value arrives once and in order.
func TestRingConcurrent(t *testing.T) {
	const total = 200_000
	r := newRing[uint64](64, math.MaxUint32-1000)
	p, c := newProducer(r), newConsumer(r)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for next := uint64(0); next < total; {
			n := uint32(min(1+next%13, total-next))
			got, idx := p.Reserve(n)
			for i := range got {
				*p.Entry(idx + i) = next
				next++
			}
			p.Submit(got)
		}
	}()
	var bad error
	for want := uint64(0); want < total; {
		got, idx := c.Peek(1 + uint32(want%17))
		for i := range got {
			if v := *c.Entry(idx + i); v != want && bad == nil {
				bad = fmt.Errorf("got %d, want %d", v, want)
			}
			want++
		}
		c.Release(got)
	}
	wg.Wait()
	if bad != nil {
		t.Fatal(bad)
	}
}
