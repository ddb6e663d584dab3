package bufpool

import (
	"strings"
	"testing"
	"unsafe"
)

// TestFreePagesReuse: the memory of a page whose last reference went comes
// back to the next allocation of its size (rx_pp_alloc_slow_freed), but
// never the memory of a lent page or of a split allocation's unit.
func TestFreePagesReuse(t *testing.T) {
	p := newTestPool(t, Config{NoRecycle: true})
	reused := 0
	for range 50 { // sync.Pool may drop a Put (always a chance under -race)
		pg := mustGet(t, p)
		old := unsafe.SliceData(pg.Bytes())
		p.Recycle(pg) // NoRecycle: the last reference
		pg = mustGet(t, p)
		if unsafe.SliceData(pg.Bytes()) == old {
			reused++
		}
		p.Recycle(pg)
	}
	if reused == 0 {
		t.Fatalf("no page's memory came back in 50 release/allocate cycles")
	}
	if got := p.Stats().AllocSlowFreed; got < uint64(reused) {
		t.Errorf("rx_pp_alloc_slow_freed %d: want at least the %d reuses seen", got, reused)
	}

	// A lent page's borrower may still read it: its memory is the GC's.
	lent := map[*byte]bool{}
	for range 20 {
		pg := mustGet(t, p)
		pg.Lend()
		lent[unsafe.SliceData(pg.Bytes())] = true
		p.Recycle(pg)
	}
	for range 20 {
		pg := mustGet(t, p)
		if lent[unsafe.SliceData(pg.Bytes())] {
			t.Fatalf("a lent page's memory was handed out again")
		}
		defer p.Recycle(pg)
	}

	// Units of a split order-2 allocation share one backing array: none
	// goes on a free list.
	q := newTestPool(t, Config{Order: 2})
	units := map[*byte]bool{}
	var pages []*Page
	for range 4 {
		u, err := q.GetUnit()
		if err != nil {
			t.Fatal(err)
		}
		units[unsafe.SliceData(u.Bytes())] = true
		pages = append(pages, u)
	}
	if len(units) != 4 || q.Stats().AllocSlowHighOrder != 1 {
		t.Fatalf("%d distinct units, %d high-order allocations: want 4 from 1", len(units), q.Stats().AllocSlowHighOrder)
	}
	for _, u := range pages {
		u.DecRef()
	}
	for range 100 {
		b := takeFree(q.PageSize(), false)
		if b == nil {
			break
		}
		if units[unsafe.SliceData(b)] {
			t.Fatalf("a split unit's memory went on a free list")
		}
	}
}

// TestFreePagesPoison: with poisoning, a page's memory written after it
// was freed is caught when it is taken again.
func TestFreePagesPoison(t *testing.T) {
	const size = 1 << 22 // a size no pool of the tests uses
	for range 50 {
		buf := make([]byte, size)
		putFree(buf, true)
		buf[1234] = 1 // a write after free
		func() {
			defer func() {
				if r := recover(); r != nil && !strings.Contains(r.(string), "written while free, at offset 1234") {
					t.Fatalf("panic %v, want the write at offset 1234 reported", r)
				} else if r != nil {
					return
				}
			}()
			if b := takeFree(size, true); b != nil {
				t.Fatalf("takeFree: memory written after free handed out without a panic")
			}
		}()
	}
}
