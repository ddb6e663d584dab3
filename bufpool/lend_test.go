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
	out     map[*[]byte]bool // outstanding, and whether busy
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
	m.out[h] = false
	m.allocs++
	return b, h
}

func (m *fakeMemory) Free(h any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := h.(*[]byte)
	if _, ok := m.out[k]; !ok {
		panic("Free of memory not outstanding")
	}
	delete(m.out, k)
	m.frees++
}

func (m *fakeMemory) Busy(h any) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.out[h.(*[]byte)]
}

func (m *fakeMemory) setBusy(pg *Page, busy bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.out[pg.Mem().(*[]byte)] = busy
}

func (m *fakeMemory) outstanding() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.out)
}

// TestLend: a lent page is reused only once Memory says its memory is no
// longer busy, is never poisoned, and without a Memory that can tell is let
// go; its memory goes back to Memory with its last reference.
func TestLend(t *testing.T) {
	mem := &fakeMemory{}
	p := newTestPool(t, Config{Memory: mem, Poison: true})

	a := mustGet(t, p)
	a.IncRef() // a frag
	if !a.Lend() || a.Lend() {
		t.Fatal("Lend: want true the first time only")
	}
	copy(a.Bytes(), "delivered")
	mem.setBusy(a, true) // the borrower holds it
	p.Recycle(a)
	a.DecRef() // the frag comes back
	if !bytes.HasPrefix(a.Bytes(), []byte("delivered")) {
		t.Fatal("a lent page was poisoned")
	}
	b := mustGet(t, p)
	if b == a {
		t.Fatal("Get handed out a lent page still busy")
	}
	if st := p.Stats(); st.LentBusy != 1 || st.AllocRefill != 1 {
		t.Errorf("rx_pp_lent_busy %d, rx_pp_alloc_refill %d: want 1, 1", st.LentBusy, st.AllocRefill)
	}
	mem.setBusy(a, false) // the borrower let go
	if c := mustGet(t, p); c != a {
		t.Fatal("a lent page no longer busy was not reused")
	} else if c.Lent() {
		t.Error("a reused page is still marked lent")
	} else {
		p.Recycle(c)
	}
	p.Recycle(b)
	if got := p.Stats().Lent; got != 1 {
		t.Errorf("rx_pp_lent: got %d, want 1", got)
	}
	p.Close()
	if mem.outstanding() != 0 {
		t.Errorf("memory outstanding after Close: %d", mem.outstanding())
	}
}

// TestLendWithoutMemory: heap pages, once lent, are never reused.
func TestLendWithoutMemory(t *testing.T) {
	p := newTestPool(t, Config{})
	a := mustGet(t, p)
	a.IncRef()
	a.Lend()
	p.Recycle(a)
	a.DecRef()
	b := mustGet(t, p)
	if b == a {
		t.Fatal("Get handed out a lent heap page")
	}
	b.IncRef()
	p.Recycle(b)
	b.DecRef()
	if c := mustGet(t, p); c != b {
		t.Fatal("an unlent page was not recycled")
	} else {
		p.Recycle(c)
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
