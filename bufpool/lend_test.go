package bufpool

import (
	"bytes"
	"sync"
	"testing"
)

// fakeMemory is a Config.Memory that records what is outstanding and can
// refuse sizes above a limit.
type fakeMemory struct {
	mu      sync.Mutex
	out     map[*[]byte]bool
	allocs  int
	frees   int
	maxSize int // 0: any
}

func (m *fakeMemory) Alloc(size int) ([]byte, any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.maxSize > 0 && size > m.maxSize {
		return nil, nil
	}
	b := make([]byte, size)
	h := &b
	if m.out == nil {
		m.out = map[*[]byte]bool{}
	}
	m.out[h] = true
	m.allocs++
	return b, h
}

func (m *fakeMemory) Free(h any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := h.(*[]byte)
	if !m.out[k] {
		panic("Free of memory not outstanding")
	}
	delete(m.out, k)
	m.frees++
}

func (m *fakeMemory) outstanding() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.out)
}

// TestLendNeverReused: a lent page is never handed out again, neither from
// the ring (lent while quarantined) nor by Recycle, and its memory goes back
// to Memory when its last reference is dropped; an unlent page is recycled
// as usual.
func TestLendNeverReused(t *testing.T) {
	mem := &fakeMemory{}
	p := newTestPool(t, Config{Memory: mem, Poison: true})

	// Lent while a frag is out, then recycled: Recycle lets it go.
	a := mustGet(t, p)
	a.IncRef() // a frag
	if !a.Lend() || a.Lend() {
		t.Fatal("Lend: want true the first time only")
	}
	copy(a.Bytes(), "delivered")
	p.Recycle(a)
	if p.count != 0 {
		t.Fatalf("ring holds %d pages after recycling a lent page, want 0", p.count)
	}
	b := mustGet(t, p)
	if b == a {
		t.Fatal("Get handed out a lent page")
	}
	if !bytes.HasPrefix(a.Bytes(), []byte("delivered")) {
		t.Fatal("a lent page was written (poisoned) while a frag was out")
	}
	if mem.outstanding() != 2 {
		t.Fatalf("memory outstanding: got %d, want 2", mem.outstanding())
	}
	a.DecRef() // the frag: the last reference
	if mem.outstanding() != 1 {
		t.Fatalf("memory outstanding after the last frag: got %d, want 1", mem.outstanding())
	}

	// Recycled first, lent while quarantined: Get drops it from the ring.
	b.IncRef()
	p.Recycle(b)
	if !b.Lend() {
		t.Fatal("Lend of a quarantined page")
	}
	b.DecRef()
	c := mustGet(t, p)
	if c == b {
		t.Fatal("Get handed out a page lent while in the ring")
	}
	// Not lent: recycled and handed out again.
	c.IncRef()
	p.Recycle(c)
	c.DecRef()
	if d := mustGet(t, p); d != c {
		t.Fatal("an unlent page was not recycled")
	} else {
		p.Recycle(d)
	}
	if got := p.Stats().Lent; got != 2 {
		t.Errorf("rx_pp_lent: got %d, want 2", got)
	}
	p.Close()
	if mem.outstanding() != 0 {
		t.Errorf("memory outstanding after Close: %d", mem.outstanding())
	}
}

// TestMemoryFallback: an allocation Memory refuses lowers the order.
func TestMemoryFallback(t *testing.T) {
	mem := &fakeMemory{maxSize: 16384}
	p := newTestPool(t, Config{Memory: mem, Order: 4})
	pg := mustGet(t, p)
	if len(pg.Bytes()) != 16384 || p.Order() != 2 {
		t.Errorf("page %d bytes at order %d, want 16384 at order 2", len(pg.Bytes()), p.Order())
	}
	if got := p.Stats().OrderFallbacks; got != 2 {
		t.Errorf("fallbacks: got %d, want 2", got)
	}
	pg.DecRef()
	mem.maxSize = 1
	if _, err := p.Get(); err != ErrExhausted {
		t.Errorf("Get with no memory: got %v, want ErrExhausted", err)
	}
}
