package bufpool

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// newTestPool returns a pool for cfg that the test must leave with no page
// out: at cleanup the ring is drained and nothing may be held any more.
func newTestPool(t testing.TB, cfg Config) *Pool {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		p.Close()
		if got := p.InUse(); got != 0 {
			t.Errorf("pages in use after Close: got %d, want 0", got)
		}
		if got := p.Stats().BytesHeld; got != 0 {
			t.Errorf("bytes held after Close: got %d, want 0", got)
		}
	})
	return p
}

func mustGet(t testing.TB, p *Pool) *Page {
	t.Helper()
	pg, err := p.Get()
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return pg
}

// fakeClock is a Config.Now read by the pool's owner only.
type fakeClock struct{ t time.Time }

func newFakeClock() *fakeClock               { return &fakeClock{t: time.Unix(1e9, 0)} }
func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

// checkCounters compares the named counters of st with want.
func checkCounters(t *testing.T, st Stats, want map[string]uint64) {
	t.Helper()
	st.Each(func(name string, v uint64) {
		if w, ok := want[name]; ok && v != w {
			t.Errorf("%s: got %d, want %d", name, v, w)
		}
	})
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg   Config
		size  int
		order int
		ring  int
		ok    bool
	}{
		{Config{}, 4096, 0, DefaultRingSize, true},
		{Config{PageSize: PageSize64K}, 65536, 0, DefaultRingSize, true},
		{Config{Order: 4}, 65536, 4, DefaultRingSize, true},
		{Config{PageSize: PageSize64K, Order: MaxOrder}, 1 << 20, 4, DefaultRingSize, true},
		{Config{RingSize: 8}, 4096, 0, 8, true},
		{Config{NoRecycle: true}, 4096, 0, 0, true},
		{Config{MaxBytes: 4096}, 4096, 0, DefaultRingSize, true},
		{Config{Order: 5}, 0, 0, 0, false},
		{Config{Order: -1}, 0, 0, 0, false},
		{Config{PageSize: 8192}, 0, 0, 0, false},
		{Config{MaxPages: -1}, 0, 0, 0, false},
		{Config{MaxBytes: -1}, 0, 0, 0, false},
		{Config{MaxBytes: 4095}, 0, 0, 0, false},
		{Config{PageSize: PageSize64K, MaxBytes: 65535}, 0, 0, 0, false},
		{Config{RingSize: -1}, 0, 0, 0, false},
	} {
		p, err := New(tc.cfg)
		if (err == nil) != tc.ok {
			t.Errorf("New(%+v): got error %v, want ok=%v", tc.cfg, err, tc.ok)
			continue
		}
		if err != nil {
			continue
		}
		if got := p.PageBytes(); got != tc.size {
			t.Errorf("New(%+v).PageBytes(): got %d, want %d", tc.cfg, got, tc.size)
		}
		if got := p.Order(); got != tc.order {
			t.Errorf("New(%+v).Order(): got %d, want %d", tc.cfg, got, tc.order)
		}
		if got := len(p.ring); got != tc.ring {
			t.Errorf("New(%+v) ring capacity: got %d, want %d", tc.cfg, got, tc.ring)
		}
	}
}

// TestConstants pins the magic numbers to their reasons.
func TestConstants(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want int64
	}{
		{"RecoverInterval (mlx4_en_recover_from_oom period)", int64(RecoverInterval), int64(250 * time.Millisecond)},
		{"DefaultRingSize (half of a 1024-entry RX ring)", DefaultRingSize, 1024 / 2},
		{"poisonByte (POISON_FREE)", poisonByte, 0x6b},
		{"MaxOrder page of 64K base pages (1 MB)", PageSize64K << MaxOrder, 1 << 20},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, tc.got, tc.want)
		}
	}
}

// TestRecycle checks the refcount test at the head of the ring: a recycled
// page whose frags were all released comes back, the same page; one with a
// frag still out does not, until the frag is released.
func TestRecycle(t *testing.T) {
	for _, tc := range []struct {
		name            string
		frags, released int
		wantSame        bool
	}{
		{"no frags", 0, 0, true},
		{"all frags released", 3, 3, true},
		{"one frag held", 3, 2, false},
		{"all frags held", 3, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, Config{Poison: true})
			pg := mustGet(t, p)
			for range tc.frags {
				pg.IncRef()
			}
			p.Recycle(pg)
			if got, want := pg.Refs(), int32(1+tc.frags); got != want {
				t.Errorf("refs after Recycle: got %d, want %d (the pool's and the frags')", got, want)
			}
			for range tc.released {
				pg.DecRef()
			}
			next := mustGet(t, p)
			if got := next == pg; got != tc.wantSame {
				t.Fatalf("Get returned the recycled page: got %v, want %v", got, tc.wantSame)
			}
			if got := next.Refs(); got != 1 {
				t.Errorf("refs of the page Get returned: got %d, want 1", got)
			}
			if tc.wantSame {
				checkCounters(t, p.Stats(), map[string]uint64{
					"rx_pp_alloc_fast": 1, "rx_pp_alloc_slow": 1, "rx_pp_alloc_refill": 0,
					"rx_pp_recycle_cached": 1, "rx_pp_recycle_ring": 1, "rx_pp_pages_in_use": 1,
				})
				if got := p.Stats().Recycled; got != 1 {
					t.Errorf("Recycled: got %d, want 1", got)
				}
				next.DecRef()
				return
			}
			checkCounters(t, p.Stats(), map[string]uint64{
				"rx_pp_alloc_fast": 0, "rx_pp_alloc_slow": 2, "rx_pp_alloc_refill": 1,
				"rx_pp_recycle_ring": 0, "rx_pp_pages_in_use": 2, "rx_pp_bytes_held": 2 * 4096,
			})
			// Released at last, the frags let the page come back.
			for range tc.frags - tc.released {
				pg.DecRef()
			}
			if got := pg.Refs(); got != 1 {
				t.Errorf("refs with only the pool's left: got %d, want 1", got)
			}
			p.Recycle(next)
			again := mustGet(t, p)
			if again != pg {
				t.Errorf("Get once the frags were released: got another page, want the recycled one")
			}
			checkCounters(t, p.Stats(), map[string]uint64{"rx_pp_alloc_fast": 1, "rx_pp_alloc_slow": 2})
			again.DecRef()
		})
	}
}

// TestDecRefRetire checks the path of a page its owner retires with DecRef
// instead of Recycle (the driver until it switches): the last reference
// releases it, and it is never handed out again.
func TestDecRefRetire(t *testing.T) {
	for _, frags := range []int{0, 1, 3} {
		t.Run(fmt.Sprintf("frags=%d", frags), func(t *testing.T) {
			p := newTestPool(t, Config{Poison: true})
			pg := mustGet(t, p)
			for range frags {
				pg.IncRef()
			}
			pg.DecRef() // the owner retires it
			for i := range frags {
				if got := p.InUse(); got != 1 {
					t.Errorf("in use with %d frags out: got %d, want 1", frags-i, got)
				}
				pg.DecRef()
			}
			if got := p.InUse(); got != 0 {
				t.Errorf("in use after the last reference: got %d, want 0", got)
			}
			next := mustGet(t, p)
			if next == pg {
				t.Errorf("Get after a DecRef'd page was released: got that page, want a new one")
			}
			next.DecRef()
			checkCounters(t, p.Stats(), map[string]uint64{
				"rx_pp_alloc_slow": 2, "rx_pp_alloc_fast": 0, "rx_pp_recycle_released_ref": 2,
				"rx_pp_pages_in_use": 0, "rx_pp_bytes_held": 0,
			})
		})
	}
}

// TestQuarantine checks the ring: first in, first out, only the oldest page
// looked at, pages past its capacity dropped and released when their frags
// are, never handed out again.
func TestQuarantine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ring     int
		recycled int   // pages recycled, in order
		held     []int // of those, the ones whose frag is still out
		// want: which recycled pages the next Gets return (-1: a new one)
		want     []int
		ringFull uint64
		// releasedHeld: held pages Get let go, held for stuckGets Gets.
		releasedHeld uint64
	}{
		{"fifo", 4, 4, nil, []int{0, 1, 2, 3, -1}, 0, 0},
		{"ring full", 4, 6, nil, []int{0, 1, 2, 3, -1, -1}, 2, 0},
		{"ring full, dropped pages held", 2, 4, []int{2, 3}, []int{0, 1, -1}, 2, 0},
		// A held page does not stop the ones behind it (page_pool).
		{"oldest busy, next free", 4, 2, []int{0}, []int{1, -1}, 0, 0},
		{"middle busy", 4, 3, []int{1}, []int{0, 2, -1}, 0, 0},
		{"two busy", 4, 4, []int{0, 2}, []int{1, 3, -1}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, Config{RingSize: tc.ring, Poison: true})
			pages := make([]*Page, tc.recycled)
			for i := range pages {
				pages[i] = mustGet(t, p)
			}
			isHeld := map[int]bool{}
			for _, i := range tc.held {
				isHeld[i] = true
			}
			for i, pg := range pages {
				pg.IncRef() // a frag
				p.Recycle(pg)
				if !isHeld[i] {
					pg.DecRef()
				}
			}
			inRing := min(tc.recycled, tc.ring)
			dropped := tc.recycled - inRing
			droppedHeld := 0
			for _, i := range tc.held {
				if i >= inRing {
					droppedHeld++
				}
			}
			st := p.Stats()
			checkCounters(t, st, map[string]uint64{
				"rx_pp_recycle_cached":       uint64(inRing),
				"rx_pp_recycle_ring_full":    tc.ringFull,
				"rx_pp_recycle_cache_full":   tc.ringFull,
				"rx_pp_recycle_released_ref": uint64(dropped - droppedHeld),
				"rx_pp_pages_in_use":         uint64(inRing + droppedHeld),
			})
			index := map[*Page]int{}
			for i, pg := range pages {
				index[pg] = i
			}
			var got []*Page
			for k, w := range tc.want {
				pg := mustGet(t, p)
				got = append(got, pg)
				i, ok := index[pg]
				if !ok {
					i = -1
				}
				if i != w {
					t.Errorf("Get #%d: got recycled page %d, want %d (-1: a new page)", k, i, w)
				}
			}
			// Release the frags still out: the dropped pages are released,
			// the ones in the ring wait for Close.
			for _, i := range tc.held {
				pages[i].DecRef()
			}
			if got, want := p.Stats().RecycleReleasedRef, uint64(dropped)+tc.releasedHeld; got != want {
				t.Errorf("rx_pp_recycle_released_ref after the frags: got %d, want %d", got, want)
			}
			if got := p.Stats().RingReleaseHeld; got != tc.releasedHeld {
				t.Errorf("rx_pp_ring_release_held: got %d, want %d", got, tc.releasedHeld)
			}
			for _, pg := range got {
				pg.DecRef()
			}
		})
	}
}

// TestClose checks that Close drops the pool's references: pages free in
// the ring are released at once, the others with their last frag.
func TestClose(t *testing.T) {
	for _, tc := range []struct {
		name       string
		free, held int
	}{
		{"empty", 0, 0},
		{"free pages", 3, 0},
		{"held pages", 0, 2},
		{"both", 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(Config{Poison: true})
			if err != nil {
				t.Fatal(err)
			}
			var pages, held []*Page
			for range tc.free + tc.held {
				pages = append(pages, mustGet(t, p))
			}
			for i, pg := range pages {
				pg.IncRef()
				p.Recycle(pg)
				if i < tc.free {
					pg.DecRef()
				} else {
					held = append(held, pg)
				}
			}
			if got, want := p.InUse(), tc.free+tc.held; got != want {
				t.Errorf("in use before Close: got %d, want %d", got, want)
			}
			p.Close()
			if got, want := p.InUse(), tc.held; got != want {
				t.Errorf("in use after Close: got %d, want %d", got, want)
			}
			for _, pg := range held {
				if got := pg.Refs(); got != 1 {
					t.Errorf("refs of a held page after Close: got %d, want 1 (the frag's)", got)
				}
				pg.DecRef()
			}
			st := p.Stats()
			if st.InUse != 0 || st.BytesHeld != 0 {
				t.Errorf("after the frags: got in use %d, bytes %d, want 0 0", st.InUse, st.BytesHeld)
			}
			if got, want := st.RecycleReleasedRef, uint64(tc.free+tc.held); got != want {
				t.Errorf("rx_pp_recycle_released_ref: got %d, want %d", got, want)
			}
		})
	}
}

// TestNoRecycle checks the behaviour seed 001 fixes: every Get allocates and
// Recycle only drops the reference.
func TestNoRecycle(t *testing.T) {
	for _, frags := range []int{0, 2} {
		t.Run(fmt.Sprintf("frags=%d", frags), func(t *testing.T) {
			p := newTestPool(t, Config{NoRecycle: true, Poison: true})
			const n = 5
			seen := map[*Page]bool{}
			for range n {
				pg := mustGet(t, p)
				if seen[pg] {
					t.Errorf("Get with NoRecycle: got a page seen before, want a new one")
				}
				seen[pg] = true
				for range frags {
					pg.IncRef()
				}
				p.Recycle(pg)
				for range frags {
					pg.DecRef()
				}
				if got := p.InUse(); got != 0 {
					t.Errorf("in use after Recycle and the frags: got %d, want 0", got)
				}
			}
			checkCounters(t, p.Stats(), map[string]uint64{
				"rx_pp_alloc_slow": n, "rx_pp_alloc_fast": 0, "rx_pp_recycle_cached": 0,
				"rx_pp_recycle_ring": 0, "rx_pp_recycle_released_ref": n,
			})
		})
	}
}

// TestOrder checks the adaptive allocation order with a fake clock: one
// order lower after each failure down to 0, then ErrExhausted; one order
// higher every RecoverInterval up to Config.Order; ring pages of another
// size waived.
func TestOrder(t *testing.T) {
	const (
		get     = iota // Get: want a page of size bytes, or ErrExhausted if size is 0
		put            // DecRef page i
		recycle        // Recycle page i
		keep           // Recycle page i keeping a frag of it
		unfrag         // DecRef the frag kept of page i
		tick           // advance the clock by d
	)
	type step struct {
		op    int
		i     int           // page, numbered in the order Get returned them
		d     time.Duration // tick
		size  int           // get
		order int           // get: want Order() after it
	}
	const k = 1024
	for _, tc := range []struct {
		name  string
		cfg   Config
		steps []step
		want  map[string]uint64
	}{
		{
			name: "fallback to order 0 and recovery",
			cfg:  Config{Order: 2, MaxBytes: 20 * k},
			steps: []step{
				{op: get, size: 16 * k, order: 2},
				{op: get, size: 4 * k, order: 0}, // 32K, 24K don't fit
				{op: get, size: 0, order: 0},
				{op: put, i: 0}, {op: put, i: 1},
				{op: tick, d: 100 * time.Millisecond},
				{op: get, size: 4 * k, order: 0}, // too early
				{op: put, i: 2},
				{op: tick, d: 150 * time.Millisecond},
				{op: get, size: 8 * k, order: 1},
				{op: put, i: 3},
				{op: tick, d: 249 * time.Millisecond},
				{op: get, size: 8 * k, order: 1},
				{op: put, i: 4},
				{op: tick, d: time.Millisecond},
				{op: get, size: 16 * k, order: 2},
				{op: put, i: 5},
				{op: tick, d: time.Second},
				{op: get, size: 16 * k, order: 2}, // not above Config.Order
				{op: put, i: 6},
			},
			want: map[string]uint64{
				"rx_pp_order_fallbacks": 2, "rx_pp_order_recoveries": 2, "rx_pp_alloc_empty": 1,
				"rx_pp_alloc_slow": 7, "rx_pp_alloc_slow_high_order": 5, "rx_pp_alloc_order": 2,
			},
		},
		{
			name: "exhausted at order 0",
			cfg:  Config{MaxBytes: 8 * k},
			steps: []step{
				{op: get, size: 4 * k}, {op: get, size: 4 * k}, {op: get, size: 0},
				{op: put, i: 0},
				{op: get, size: 4 * k},
				{op: put, i: 1}, {op: put, i: 2},
			},
			want: map[string]uint64{"rx_pp_alloc_empty": 1, "rx_pp_order_fallbacks": 0, "rx_pp_alloc_slow": 3},
		},
		{
			name: "MaxPages does not lower the order",
			cfg:  Config{Order: 2, MaxPages: 1},
			steps: []step{
				{op: get, size: 16 * k, order: 2},
				{op: get, size: 0, order: 2},
				{op: put, i: 0},
				{op: get, size: 16 * k, order: 2},
				{op: put, i: 1},
			},
			want: map[string]uint64{"rx_pp_alloc_empty": 1, "rx_pp_order_fallbacks": 0},
		},
		{
			name: "ring pages waived after a fallback",
			cfg:  Config{Order: 1, MaxBytes: 20 * k},
			steps: []step{
				{op: get, size: 8 * k, order: 1},
				{op: get, size: 8 * k, order: 1},
				{op: keep, i: 0},
				{op: get, size: 4 * k, order: 0}, // page 0 busy; 24K doesn't fit
				{op: unfrag, i: 0},
				{op: get, size: 4 * k, order: 0}, // page 0 free, but 8K: waived
				{op: tick, d: RecoverInterval},
				{op: get, size: 4 * k, order: 0}, // recovered, but 8+4+4+8 > 20: falls back
				{op: put, i: 1}, {op: put, i: 2}, {op: put, i: 3}, {op: put, i: 4},
			},
			want: map[string]uint64{
				"rx_pp_alloc_waive": 1, "rx_pp_alloc_refill": 1, "rx_pp_order_fallbacks": 2,
				"rx_pp_order_recoveries": 1, "rx_pp_recycle_released_ref": 5,
			},
		},
		{
			name: "ring pages waived after a recovery",
			cfg:  Config{Order: 1, MaxBytes: 16 * k},
			steps: []step{
				{op: get, size: 8 * k, order: 1},
				{op: get, size: 8 * k, order: 1},
				{op: get, size: 0, order: 0},
				{op: put, i: 0},
				{op: get, size: 4 * k, order: 0},
				{op: recycle, i: 2},
				{op: tick, d: RecoverInterval},
				{op: get, size: 8 * k, order: 1}, // page 2 is 4K: waived, its room reused
				{op: put, i: 1}, {op: put, i: 3},
			},
			want: map[string]uint64{
				"rx_pp_alloc_waive": 1, "rx_pp_alloc_fast": 0, "rx_pp_order_fallbacks": 1,
				"rx_pp_order_recoveries": 1, "rx_pp_alloc_empty": 1,
			},
		},
		{
			name: "64K pages",
			cfg:  Config{PageSize: PageSize64K, Order: 1, MaxBytes: 192 * k},
			steps: []step{
				{op: get, size: 128 * k, order: 1},
				{op: get, size: 64 * k, order: 0},
				{op: get, size: 0, order: 0},
				{op: recycle, i: 1},
				{op: get, size: 64 * k, order: 0}, // page 1 again
				{op: tick, d: RecoverInterval},
				{op: put, i: 0}, {op: put, i: 2},
				{op: get, size: 128 * k, order: 1},
				{op: put, i: 3},
			},
			want: map[string]uint64{
				"rx_pp_alloc_fast": 1, "rx_pp_order_fallbacks": 1, "rx_pp_order_recoveries": 1,
				"rx_pp_alloc_empty": 1, "rx_pp_alloc_slow_high_order": 2,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			cfg := tc.cfg
			cfg.Now, cfg.Poison = clock.now, true
			p := newTestPool(t, cfg)
			base := cfg.PageSize
			if base == 0 {
				base = PageSize4K
			}
			var pages []*Page
			for n, s := range tc.steps {
				switch s.op {
				case get:
					pg, err := p.Get()
					switch {
					case s.size == 0 && !errors.Is(err, ErrExhausted):
						t.Fatalf("step %d: Get: got %v, want ErrExhausted", n, err)
					case s.size != 0 && err != nil:
						t.Fatalf("step %d: Get: got %v, want a %d-byte page", n, err, s.size)
					case s.size != 0 && len(pg.Bytes()) != s.size:
						t.Errorf("step %d: Get: got a %d-byte page, want %d", n, len(pg.Bytes()), s.size)
					}
					if err == nil {
						pages = append(pages, pg)
					}
					if got := p.Order(); got != s.order {
						t.Errorf("step %d: Order(): got %d, want %d", n, got, s.order)
					}
					if got, want := p.PageBytes(), base<<s.order; got != want {
						t.Errorf("step %d: PageBytes(): got %d, want %d", n, got, want)
					}
				case put:
					pages[s.i].DecRef()
				case recycle:
					p.Recycle(pages[s.i])
				case keep:
					pages[s.i].IncRef()
					p.Recycle(pages[s.i])
				case unfrag:
					pages[s.i].DecRef()
				case tick:
					clock.advance(s.d)
				}
			}
			checkCounters(t, p.Stats(), tc.want)
		})
	}
}

// TestPoison checks that a write into a page after its last holder gave it
// up is caught by the Get that hands it out again, at its offset, and that a
// normal cycle raises no false alarm.
func TestPoison(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order int
		frag  bool // a frag is out when the owner recycles the page
		// write happens before the frag is released, or after: the latter
		// is the stale one.
		writeBefore, writeAfter bool
		off                     int
		wantPanic               bool
	}{
		{name: "normal cycle", frag: true},
		{name: "normal cycle, no frag"},
		{name: "stale write after Recycle", off: 100, writeAfter: true, wantPanic: true},
		{name: "stale write after the last frag", frag: true, off: 4095, writeAfter: true, wantPanic: true},
		{name: "stale write, order 1 page", order: 1, frag: true, off: 8000, writeAfter: true, wantPanic: true},
		{name: "write while a frag is held", frag: true, off: 7, writeBefore: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, Config{Order: tc.order, Poison: true})
			pg := mustGet(t, p)
			stale := pg.Bytes()
			if tc.frag {
				pg.IncRef()
			}
			p.Recycle(pg)
			if tc.writeBefore {
				stale[tc.off] = 1 // the frag holder may still write
			}
			if tc.frag {
				pg.DecRef()
			}
			if tc.writeAfter {
				stale[tc.off] = 1 // through a reference that was given up
			}
			var got *Page
			msg := func() (msg string) {
				defer func() {
					if r := recover(); r != nil {
						msg = fmt.Sprint(r)
					}
				}()
				got = mustGet(t, p)
				return ""
			}()
			if (msg != "") != tc.wantPanic {
				t.Fatalf("Get: got panic %q, want panic %v", msg, tc.wantPanic)
			}
			if tc.wantPanic {
				if want := fmt.Sprintf("offset %d:", tc.off); !strings.Contains(msg, want) {
					t.Errorf("panic: got %q, want it to name %q", msg, want)
				}
				stale[tc.off] = poisonByte // let Close drain it
				return
			}
			if got != pg {
				t.Errorf("Get: got a new page, want the recycled one")
			}
			got.DecRef()
		})
	}
}

// TestInvariantPanics checks that misuse that breaks the refcount invariant
// panics instead of corrupting memory silently.
func TestInvariantPanics(t *testing.T) {
	other, _ := New(Config{})
	for _, tc := range []struct {
		name string
		do   func(p *Pool, pg *Page)
		want string
	}{
		{"DecRef of a free page", func(p *Pool, pg *Page) { pg.DecRef(); pg.DecRef() }, "DecRef on a free page"},
		{"IncRef of a free page", func(p *Pool, pg *Page) { pg.DecRef(); pg.IncRef() }, "IncRef on a free page"},
		{"IncRef of a page in the ring", func(p *Pool, pg *Page) { p.Recycle(pg); pg.IncRef() }, "IncRef on a free page"},
		{"DecRef of the pool's reference", func(p *Pool, pg *Page) { p.Recycle(pg); pg.DecRef() }, "dropped the pool's reference"},
		{"Recycle twice", func(p *Pool, pg *Page) { pg.IncRef(); p.Recycle(pg); p.Recycle(pg) }, "already in the ring"},
		{"Recycle of a free page", func(p *Pool, pg *Page) { pg.DecRef(); p.Recycle(pg) }, "Recycle of a free page"},
		{"Recycle into another pool", func(p *Pool, pg *Page) { other.Recycle(pg) }, "another pool's page"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := New(Config{Poison: true}) // left corrupt: no cleanup check
			pg := mustGet(t, p)
			defer func() {
				r := recover()
				if msg := fmt.Sprint(r); r == nil || !strings.Contains(msg, tc.want) {
					t.Errorf("got panic %v, want one saying %q", r, tc.want)
				}
			}()
			tc.do(p, pg)
		})
	}
}

func TestStatsEach(t *testing.T) {
	st := Stats{
		AllocFast: 1, AllocSlow: 2, AllocSlowHighOrder: 3, AllocSlowFreed: 4, AllocEmpty: 5, AllocRefill: 6,
		AllocWaive: 7, RecycleCached: 8, RecycleCacheFull: 9, RecycleRing: 10, RecycleRingFull: 11,
		RecycleReleasedRef: 12, OrderFallbacks: 13, OrderRecoveries: 14, AllocOrder: 15,
		InUse: 16, BytesHeld: 17, Lent: 18, LentBusy: 19, RingSkipHeld: 20, RingReleaseHeld: 21,
		RingParkHeld: 22, LentPages: 23, AllocPages: 24, CacheReuse: 25, CacheBusy: 26, Allocated: 99, Recycled: 99, PageBytes: 99,
	}
	want := []string{
		"rx_pp_alloc_fast", "rx_pp_alloc_slow", "rx_pp_alloc_slow_high_order", "rx_pp_alloc_slow_freed", "rx_pp_alloc_empty",
		"rx_pp_alloc_refill", "rx_pp_alloc_waive", "rx_pp_recycle_cached", "rx_pp_recycle_cache_full",
		"rx_pp_recycle_ring", "rx_pp_recycle_ring_full", "rx_pp_recycle_released_ref",
		"rx_pp_order_fallbacks", "rx_pp_order_recoveries", "rx_pp_alloc_order",
		"rx_pp_pages_in_use", "rx_pp_bytes_held", "rx_pp_lent", "rx_pp_lent_busy",
		"rx_pp_ring_skip_held", "rx_pp_ring_release_held", "rx_pp_ring_park_held", "rx_pp_lent_current",
		"rx_alloc_pages", "rx_cache_reuse", "rx_cache_busy",
	}
	var got []string
	st.Each(func(name string, v uint64) {
		got = append(got, name)
		if v != uint64(len(got)) {
			t.Errorf("%s: got %d, want %d", name, v, len(got))
		}
	})
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("names:\ngot  %v\nwant %v", got, want)
	}
}

// TestStatsAliases checks the fields that mirror others.
func TestStatsAliases(t *testing.T) {
	p := newTestPool(t, Config{RingSize: 1, Order: 1})
	a, b := mustGet(t, p), mustGet(t, p)
	p.Recycle(a)
	p.Recycle(b) // ring full
	c := mustGet(t, p)
	st := p.Stats()
	for _, tc := range []struct {
		name      string
		got, want int64
	}{
		{"Recycled", int64(st.Recycled), int64(st.RecycleRing)},
		{"RecycleRing", int64(st.RecycleRing), int64(st.AllocFast)},
		{"RecycleCacheFull", int64(st.RecycleCacheFull), int64(st.RecycleRingFull)},
		{"RecycleRingFull", int64(st.RecycleRingFull), 1},
		{"Allocated", st.Allocated, st.InUse},
		{"InUse", st.InUse, 1},
		{"BytesHeld", st.BytesHeld, 8192},
		{"PageBytes", int64(st.PageBytes), 8192},
		{"AllocOrder", int64(st.AllocOrder), 1},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, tc.got, tc.want)
		}
	}
	c.DecRef()
}

// TestStress runs the NIC's side (Get, a frame per frag, Recycle) on one
// goroutine and releases the frags on others in random order, as the poll
// loop and the stack do; with -race and poison. Every frag is checked to
// still hold what the NIC wrote when it is released: a page handed out
// again too early would have been overwritten.
func TestStress(t *testing.T) {
	iters := 20000
	if testing.Short() {
		iters = 2000
	}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"default", Config{}},
		{"small ring", Config{RingSize: 4}},
		{"order fallbacks", Config{Order: 2, MaxBytes: 48 * PageSize4K}},
		{"64K", Config{PageSize: PageSize64K, RingSize: 16}},
		{"no recycle", Config{NoRecycle: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock() // read by the owner only
			cfg := tc.cfg
			cfg.Poison, cfg.Now = true, clock.now
			p := newTestPool(t, cfg)

			type msg struct {
				f   Frag
				tag byte
			}
			const workers = 4
			chans := make([]chan msg, workers)
			var wg sync.WaitGroup
			for w := range chans {
				chans[w] = make(chan msg, 64)
				wg.Add(1)
				go func(ch chan msg, seed uint64) {
					defer wg.Done()
					r := rand.New(rand.NewPCG(seed, 1))
					var held []msg
					release := func() {
						r.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
						for _, m := range held {
							for i, b := range m.f.Bytes() {
								if b != m.tag {
									t.Errorf("frag at %d+%d: got %#x, want %#x: page reused while referenced", m.f.Off, i, b, m.tag)
									break
								}
							}
							m.f.Page.DecRef()
						}
						held = held[:0]
					}
					for m := range ch {
						held = append(held, m)
						if len(held) >= 1+r.IntN(48) || len(ch) == 0 {
							release()
						}
					}
					release()
				}(chans[w], uint64(w))
			}

			r := rand.New(rand.NewPCG(42, 0))
			gets := uint64(0)
			for it := range iters {
				pg, err := p.Get()
				for errors.Is(err, ErrExhausted) {
					runtime.Gosched() // the workers release when idle
					pg, err = p.Get()
				}
				if err != nil {
					t.Fatal(err)
				}
				gets++
				b := pg.Bytes()
				for off := 0; off < len(b); {
					n := min(64+r.IntN(1500), len(b)-off)
					tag := byte(it)
					for i := range b[off : off+n] {
						b[off+i] = tag
					}
					pg.IncRef()
					chans[r.IntN(workers)] <- msg{Frag{pg, uint32(off), uint32(n)}, tag}
					off += n
					if r.IntN(4) == 0 {
						break // the rest of the WQE is skipped
					}
				}
				p.Recycle(pg)
				clock.advance(time.Millisecond)
			}
			for _, ch := range chans {
				close(ch)
			}
			wg.Wait()
			st := p.Stats()
			if got := st.AllocFast + st.AllocSlow; got != gets {
				t.Errorf("fast + slow allocations: got %d, want %d Gets", got, gets)
			}
			p.Close()
			st = p.Stats()
			if st.InUse != 0 || st.BytesHeld != 0 {
				t.Errorf("after Close: got in use %d, bytes held %d, want 0 0", st.InUse, st.BytesHeld)
			}
			if st.RecycleReleasedRef != st.AllocSlow {
				t.Errorf("released: got %d, want %d (every page allocated)", st.RecycleReleasedRef, st.AllocSlow)
			}
			if tc.cfg.NoRecycle && st.AllocFast != 0 {
				t.Errorf("rx_pp_alloc_fast with NoRecycle: got %d, want 0", st.AllocFast)
			}
			t.Logf("%+v", st)
		})
	}
}

// cycle is the NIC's steady state for one page: take it, write frags frames
// into it (a reference each), retire it, and release the frames.
func cycle(p *Pool, frags int) {
	pg, err := p.Get()
	if err != nil {
		panic(err)
	}
	for range frags {
		pg.IncRef()
	}
	p.Recycle(pg)
	for range frags {
		pg.DecRef()
	}
}

// TestAllocs pins the zero-allocation steady state of the recycling cycle;
// without recycling each cycle allocates a page struct, its memory coming
// back from the free lists (freePages) once the previous page was released.
func TestAllocs(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want float64
	}{
		{"4K", Config{}, 0},
		{"64K order 1", Config{PageSize: PageSize64K, Order: 1}, 0},
		{"poison", Config{Poison: true}, 0},
		{"no recycle", Config{NoRecycle: true}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, tc.cfg)
			cycle(p, 2)
			if got := testing.AllocsPerRun(100, func() { cycle(p, 2) }); got != tc.want {
				t.Errorf("allocations per Get/IncRef/Recycle/DecRef: got %v, want %v", got, tc.want)
			}
		})
	}
}

func BenchmarkCycle(b *testing.B) {
	for _, bc := range []struct {
		name  string
		cfg   Config
		frags int
	}{
		// 2 frames of 1500 bytes fit a 4 KB page, 42 a 64 KB one.
		{"recycle/4K", Config{}, 2},
		{"recycle/64K", Config{PageSize: PageSize64K}, 42},
		{"norecycle/4K", Config{NoRecycle: true}, 2},
		{"norecycle/64K", Config{PageSize: PageSize64K, NoRecycle: true}, 42},
		{"poison/4K", Config{Poison: true}, 2},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := newTestPool(b, bc.cfg)
			b.ReportAllocs()
			for b.Loop() {
				cycle(p, bc.frags)
			}
		})
	}
}

// TestBias: a bias of references taken at once (AddRefs) and its unused
// part given back (PutRefs) leave the page's count what one IncRef per
// frag would: the page is recycled once its frags are released, not
// before; AddRefs on a page the caller does not hold and PutRefs of more
// than it holds panic.
func TestBias(t *testing.T) {
	p := newTestPool(t, Config{Poison: true})
	pg := mustGet(t, p)
	pg.AddRefs(65)
	if got := pg.Refs(); got != 66 {
		t.Fatalf("refs after AddRefs(65): got %d, want 66", got)
	}
	const frags = 3 // handed out of the bias
	pg.PutRefs(65 - frags)
	p.Recycle(pg)
	for i := range frags {
		if next := mustGet(t, p); next == pg {
			t.Fatalf("Get with %d of %d frags out returned the page", frags-i, frags)
		} else {
			p.Recycle(next)
		}
		pg.DecRef()
	}
	next := mustGet(t, p)
	if next != pg {
		t.Errorf("Get with every frag released: got another page, want the recycled one")
	}
	next.DecRef()
	mustPanicWith(t, "AddRefs on a free page", func() {
		q := &Page{}
		q.AddRefs(4)
	})
	mustPanicWith(t, "PutRefs of every reference", func() {
		q := &Page{}
		q.state.Store(1)
		q.AddRefs(2)
		q.PutRefs(3)
	})
}

func mustPanicWith(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", what)
		}
	}()
	f()
}
