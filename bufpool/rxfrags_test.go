package bufpool

import (
	"testing"
	"time"
)

func TestFragStride(t *testing.T) {
	for _, tc := range []struct{ frame, page, want int }{
		{1522, PageSize4K, 2048},  // two per 4 KB page, 512 bytes of pad each
		{1522, PageSize64K, 1536}, // 42 per 64 KB page, 24 bytes of pad rounded away
		{1000, PageSize4K, 1024},  // four per page
		{4096, PageSize4K, 4096},
		{4097, PageSize4K, 0}, // does not fit a page
		{9022, PageSize64K, 9344},
	} {
		if got := FragStride(tc.frame, tc.page); got != tc.want {
			t.Errorf("FragStride(%d, %d): got %d, want %d", tc.frame, tc.page, got, tc.want)
		}
	}
}

func newTestRXFrags(t *testing.T, p *Pool, slots int) *RXFrags {
	t.Helper()
	r, err := NewRXFrags(p, slots, 1522)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close) // before the pool's Close (cleanups run last first)
	return r
}

func mustNext(t *testing.T, r *RXFrags) Frag {
	t.Helper()
	f, err := r.Next()
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return f
}

// TestRXFragsBeforeReuse: before the patch a slot's page is written again,
// at its start, when its count is back to one.
func TestRXFragsBeforeReuse(t *testing.T) {
	for _, size := range []int{PageSize4K, PageSize64K} {
		p := newTestPool(t, Config{PageSize: size, NoRecycle: true, Poison: true})
		r := newTestRXFrags(t, p, 4)
		var first [4]*Page
		for i := range 4 {
			f := mustNext(t, r)
			if f.Off != 0 || int(f.Len) != size {
				t.Fatalf("frag %d: got off %d len %d, want 0 and %d (a page per slot)", i, f.Off, f.Len, size)
			}
			first[i] = f.Page
			f.Page.DecRef() // the stack released the frame
		}
		for i := range 8 {
			f := mustNext(t, r)
			if f.Page != first[i%4] || f.Off != 0 {
				t.Errorf("size %d, frame %d: got page %p off %d, want slot %d's page %p at 0", size, 4+i, f.Page, f.Off, i%4, first[i%4])
			}
			f.Page.DecRef()
		}
		checkCounters(t, p.Stats(), map[string]uint64{"rx_alloc_pages": 4, "rx_cache_reuse": 8, "rx_cache_busy": 0})
	}
}

// TestRXFragsBeforeBusy: a slot's page still held by the stack is replaced
// by a new one; the old one stays valid until its frag is released, and is
// then freed, not reused.
func TestRXFragsBeforeBusy(t *testing.T) {
	p := newTestPool(t, Config{NoRecycle: true, Poison: true})
	r := newTestRXFrags(t, p, 2)
	held := mustNext(t, r)
	copy(held.Bytes(), "held frame")
	f := mustNext(t, r)
	f.Page.DecRef()
	g := mustNext(t, r) // slot 0 again: its page is held
	if g.Page == held.Page {
		t.Fatal("a held page was written again")
	}
	if string(held.Bytes()[:10]) != "held frame" {
		t.Errorf("held frame changed: %q", held.Bytes()[:10])
	}
	checkCounters(t, p.Stats(), map[string]uint64{"rx_alloc_pages": 3, "rx_cache_busy": 1, "rx_pp_pages_in_use": 3})
	held.Page.DecRef()
	checkCounters(t, p.Stats(), map[string]uint64{"rx_pp_pages_in_use": 2, "rx_pp_recycle_released_ref": 1})
	g.Page.DecRef()
}

// TestRXFragsPacked: with the patch frames are packed into pages at the
// frag stride: two per 4 KB page, 42 per 64 KB page.
func TestRXFragsPacked(t *testing.T) {
	for _, tc := range []struct{ size, per, stride int }{{PageSize4K, 2, 2048}, {PageSize64K, 42, 1536}} {
		p := newTestPool(t, Config{PageSize: tc.size, Poison: true})
		r := newTestRXFrags(t, p, 1024)
		var pg *Page
		for i := range 2 * tc.per {
			f := mustNext(t, r)
			if i%tc.per == 0 {
				if f.Page == pg {
					t.Fatalf("size %d, frame %d: still on the previous page", tc.size, i)
				}
				pg = f.Page
			}
			if f.Page != pg || int(f.Off) != i%tc.per*tc.stride || int(f.Len) != tc.stride {
				t.Fatalf("size %d, frame %d: got page %p off %d len %d, want %p, %d, %d", tc.size, i, f.Page, f.Off, f.Len, pg, i%tc.per*tc.stride, tc.stride)
			}
			f.Page.DecRef()
		}
		if want := 2 * ((1024 + tc.per - 1) / tc.per); r.Pages() != want {
			t.Errorf("size %d: pool array of %d pages, want %d (twice the ring's)", tc.size, r.Pages(), want)
		}
	}
}

// TestRXFragsQuarantine: a page is looked at again only after the other
// half of the pool array went by, even if it was free long before; then
// it is reused if free, replaced if still held.
func TestRXFragsQuarantine(t *testing.T) {
	p := newTestPool(t, Config{Poison: true})
	r := newTestRXFrags(t, p, 4) // 2 pages of 2 frames: an array of 4
	var pages []*Page
	var held Frag
	for i := range 8 {
		f := mustNext(t, r)
		if i%2 == 0 {
			pages = append(pages, f.Page)
		}
		if i == 3 {
			held = f // page 1 stays held
			continue
		}
		f.Page.DecRef()
	}
	checkCounters(t, p.Stats(), map[string]uint64{"rx_alloc_pages": 4, "rx_cache_reuse": 0})
	f := mustNext(t, r) // the oldest entry, page 0, free: reused
	if f.Page != pages[0] || f.Off != 0 {
		t.Errorf("frame 8: got page %p off %d, want page 0 (%p) at 0", f.Page, f.Off, pages[0])
	}
	f.Page.DecRef()
	f = mustNext(t, r)
	if f.Page != pages[0] {
		t.Fatalf("frame 9 on another page")
	}
	f.Page.DecRef()
	f = mustNext(t, r) // page 1, held: replaced
	if f.Page == pages[1] {
		t.Error("frame 10 went into a held page")
	}
	f.Page.DecRef()
	checkCounters(t, p.Stats(), map[string]uint64{"rx_alloc_pages": 5, "rx_cache_reuse": 1, "rx_cache_busy": 1})
	held.Page.DecRef()
}

// TestGetUnitSplit: a high-order allocation is split into order-0 units,
// each with its own count: one unit held keeps only itself in use.
func TestGetUnitSplit(t *testing.T) {
	p := newTestPool(t, Config{Order: 2, Poison: true})
	var units []*Page
	for range 4 {
		pg, err := p.GetUnit()
		if err != nil {
			t.Fatal(err)
		}
		if len(pg.Bytes()) != PageSize4K || pg.Refs() != 1 {
			t.Fatalf("unit: got %d bytes, %d refs, want %d, 1", len(pg.Bytes()), pg.Refs(), PageSize4K)
		}
		units = append(units, pg)
	}
	// The units do not overlap, and none can grow into the next.
	for i, u := range units {
		if cap(u.Bytes()) != PageSize4K {
			t.Errorf("unit %d: capacity %d, want %d", i, cap(u.Bytes()), PageSize4K)
		}
		for j := range u.Bytes() {
			u.Bytes()[j] = byte(i)
		}
	}
	for i, u := range units {
		for j, c := range u.Bytes() {
			if c != byte(i) {
				t.Fatalf("unit %d byte %d: got %d, want %d", i, j, c, i)
			}
		}
	}
	checkCounters(t, p.Stats(), map[string]uint64{"rx_alloc_pages": 4, "rx_pp_alloc_slow": 1, "rx_pp_alloc_slow_high_order": 1, "rx_pp_pages_in_use": 4, "rx_pp_bytes_held": 4 * PageSize4K})
	for _, u := range units[:3] {
		u.DecRef()
	}
	checkCounters(t, p.Stats(), map[string]uint64{"rx_pp_pages_in_use": 1, "rx_pp_bytes_held": PageSize4K, "rx_pp_recycle_released_ref": 3})
	units[3].DecRef()
	pg, err := p.GetUnit() // a new allocation, split again; 3 units left for Close
	if err != nil {
		t.Fatal(err)
	}
	checkCounters(t, p.Stats(), map[string]uint64{"rx_alloc_pages": 8, "rx_pp_alloc_slow": 2, "rx_pp_pages_in_use": 4})
	pg.DecRef()
}

// TestGetUnitFallbackRecover: an allocation that fails at the current order
// falls back to a lower one, and the order climbs back one step per 250 ms
// (mlx4_en_recover_from_oom), on an injected clock.
func TestGetUnitFallbackRecover(t *testing.T) {
	clk := newFakeClock()
	p := newTestPool(t, Config{Order: 2, MaxBytes: 6 * PageSize4K, Now: clk.now})
	var held []*Page
	get := func() {
		t.Helper()
		pg, err := p.GetUnit()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, pg)
	}
	for range 4 {
		get() // one order-2 allocation, 4 units
	}
	get() // 16 KB more would pass 24 KB: order 1 (8 KB) fits
	if p.Order() != 1 {
		t.Fatalf("order after a failure: got %d, want 1", p.Order())
	}
	get() // the second unit of the order-1 allocation
	checkCounters(t, p.Stats(), map[string]uint64{"rx_pp_order_fallbacks": 1, "rx_alloc_pages": 6, "rx_pp_alloc_order": 1})
	for _, pg := range held {
		pg.DecRef()
	}
	held = held[:0]
	clk.advance(RecoverInterval - time.Millisecond)
	get()
	if p.Order() != 1 {
		t.Errorf("order before 250 ms: got %d, want 1", p.Order())
	}
	clk.advance(time.Millisecond)
	get() // the second unit of that order-1 allocation
	get() // a new allocation: at order 2 again
	if n := len(held[len(held)-1].Bytes()); n != PageSize4K {
		t.Errorf("unit of %d bytes, want %d", n, PageSize4K)
	}
	if p.Order() != 2 {
		t.Errorf("order after 250 ms: got %d, want 2", p.Order())
	}
	checkCounters(t, p.Stats(), map[string]uint64{"rx_pp_order_recoveries": 1})
	for _, pg := range held {
		pg.DecRef()
	}
}

// TestRXFragsShortPool: when the pool cannot back the whole array (a page
// limit), RXFrags cycles through the pages it has instead of dropping
// every frame at the first entry it cannot fill.
func TestRXFragsShortPool(t *testing.T) {
	p := newTestPool(t, Config{MaxPages: 2, Poison: true})
	r := newTestRXFrags(t, p, 8) // an array of 8 pages
	var pages []*Page
	for i := range 20 {
		f, err := r.Next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if i%2 == 0 && len(pages) < 2 {
			pages = append(pages, f.Page)
		}
		if f.Page != pages[i/2%2] {
			t.Fatalf("frame %d: got page %p, want %p", i, f.Page, pages[i/2%2])
		}
		f.Page.DecRef()
	}
	// Held pages and no room: the frame is dropped, and the next one finds
	// the page again once it is free.
	var held []Frag
	for range 4 {
		held = append(held, mustNext(t, r)) // both pages' frames
	}
	if _, err := r.Next(); err == nil {
		t.Error("Next with every page held and none to allocate: got no error")
	}
	for _, f := range held {
		f.Page.DecRef()
	}
	f := mustNext(t, r)
	f.Page.DecRef()
}
