package bufpool

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
)

// fakeMemory is a Config.Memory that records what is outstanding and can
// refuse sizes above a limit.
type fakeMemory struct {
	mu sync.Mutex
	// +checklocks:mu
	out map[*[]byte]bool // outstanding, and whether busy
	// +checklocks:mu
	allocs int
	// +checklocks:mu
	frees int
	// +checklocks:mu
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

// TestHeldPageDoesNotStopRecycling: pages held forever at the head of the
// ring (lent to a borrower that keeps them, as an idle socket or an
// application View does, or with a frag kept) do not stop the pages behind
// them from being recycled: Gets keep being served from the ring and
// allocations stay bounded. One held page is stepped over; more than
// skipWindow are moved out of the way (parked if lent, else released) once
// held for stuckGets Gets. Before, every Get allocated behind a held head
// and the ring filled.
func TestHeldPageDoesNotStopRecycling(t *testing.T) {
	for _, tc := range []struct {
		lent, heap bool
		held       int
	}{
		{true, false, 1}, {false, false, 1}, {false, true, 1},
		{true, false, 2 * skipWindow}, {false, false, 2 * skipWindow}, {false, true, 2 * skipWindow},
	} {
		name := fmt.Sprintf("frag kept/%d", tc.held)
		switch {
		case tc.lent:
			name = fmt.Sprintf("lent, borrower keeps it/%d", tc.held)
		case tc.heap:
			name = fmt.Sprintf("frag kept, heap/%d", tc.held)
		}
		t.Run(name, func(t *testing.T) {
			const ring, packets = 64, 10000
			mem := &fakeMemory{}
			cfg := Config{Memory: mem, RingSize: ring, Poison: true}
			if tc.heap {
				cfg.Memory = nil
			}
			p := newTestPool(t, cfg)
			var held []*Page
			isHeld := map[*Page]bool{}
			for range tc.held {
				pg := mustGet(t, p)
				pg.IncRef() // its frag
				if tc.lent {
					pg.Lend()
					mem.setBusy(pg, true)
				}
				p.Recycle(pg)
				if tc.lent {
					pg.DecRef() // the frag is back; the borrower keeps the memory
				}
				held = append(held, pg)
				isHeld[pg] = true
			}
			for i := range packets {
				pg := mustGet(t, p)
				if isHeld[pg] {
					t.Fatalf("packet %d: Get handed out a held page", i)
				}
				pg.IncRef() // a frag, released once delivered
				p.Recycle(pg)
				pg.DecRef()
			}
			st := p.Stats()
			t.Logf("alloc_fast %d, alloc_slow %d, skip_held %d, release_held %d, ring_full %d",
				st.AllocFast, st.AllocSlow, st.RingSkipHeld, st.RingReleaseHeld, st.RecycleRingFull)
			maxSlow := uint64(3)
			if tc.held > skipWindow {
				// Each window of held pages costs stuckGets allocations.
				maxSlow = uint64(tc.held+(tc.held/skipWindow+1)*stuckGets) + 3
			}
			if st.AllocSlow > maxSlow {
				t.Errorf("rx_pp_alloc_slow: got %d, want at most %d (the ring keeps serving Gets)", st.AllocSlow, maxSlow)
			}
			if st.AllocFast < packets-maxSlow {
				t.Errorf("rx_pp_alloc_fast: got %d, want at least %d", st.AllocFast, packets-maxSlow)
			}
			if moved := st.RingSkipHeld + st.RingParkHeld + st.RingReleaseHeld; moved == 0 {
				t.Error("rx_pp_ring_skip_held + rx_pp_ring_park_held + rx_pp_ring_release_held: got 0, want > 0")
			}
			if tc.lent {
				// Lent pages stay the pool's (in the ring or parked),
				// counted, until their borrower lets go; then they are
				// reused.
				if st.RingReleaseHeld != 0 || st.LentPages != int64(tc.held) || st.LentBusy == 0 {
					t.Errorf("release_held %d, lent_current %d, lent_busy %d: want 0, %d, > 0",
						st.RingReleaseHeld, st.LentPages, st.LentBusy, tc.held)
				}
				for _, pg := range held {
					mem.setBusy(pg, false)
				}
				reused := map[*Page]bool{}
				for range 2 * ring {
					pg := mustGet(t, p)
					if isHeld[pg] {
						reused[pg] = true
					}
					p.Recycle(pg)
				}
				if len(reused) != tc.held {
					t.Errorf("lent pages reused once their borrower let go: got %d, want %d", len(reused), tc.held)
				}
				if n := p.LentPages(); n != 0 {
					t.Errorf("rx_pp_lent_current after reuse: got %d, want 0", n)
				}
				return
			}
			// More than a window of them clogged it: those were let go
			// (heap pages) or parked (a Memory's, which may be lent yet).
			moved := st.RingParkHeld
			if tc.heap {
				moved = st.RingReleaseHeld
			}
			if tc.held > skipWindow && moved < uint64(tc.held-skipWindow) {
				t.Errorf("pages parked (Memory) or released (heap): got %d, want at least %d", moved, tc.held-skipWindow)
			}
			before := p.Stats().InUse
			for _, pg := range held {
				pg.DecRef()
			}
			// Let go by the ring, the kept pages are freed by their frags.
			if got, want := p.Stats().InUse, before-int64(st.RingReleaseHeld); got != want {
				t.Errorf("pages in use after the kept frags' release: got %d, want %d", got, want)
			}
		})
	}
}

// TestLendWithoutMemoryBehindHead: lent heap pages behind a held head, in
// the window Get looks at and in the pages it compacts, are let go, never
// reused (nobody can tell when their borrower is done).
func TestLendWithoutMemoryBehindHead(t *testing.T) {
	p := newTestPool(t, Config{RingSize: 64})
	head := mustGet(t, p)
	head.IncRef() // kept
	p.Recycle(head)
	var lent []*Page
	for range 4 {
		pg := mustGet(t, p)
		pg.IncRef()
		p.Recycle(pg)
		pg.Lend() // by the frag's holder, once in the ring
		pg.DecRef()
		lent = append(lent, pg)
	}
	for range 2 * stuckGets {
		pg := mustGet(t, p)
		for _, l := range lent {
			if pg == l {
				t.Fatal("Get handed out a lent heap page")
			}
		}
		p.Recycle(pg)
	}
	head.DecRef()
}
