// Package bufpool owns ustack's packet memory: pages that the NIC model
// writes frames into, and frags that reference parts of them.
//
// A Page carries a reference count. Whoever holds a Frag of a page holds one
// reference; the NIC model holds one more while the page is in the WQE it
// fills. Pages are recycled as mlx4 recycles order-0 pages since "mlx4:
// Better use of order-0 pages in RX path" (mlx4's page-recycling patch), in the manner of the
// kernel's page_pool:
//
//   - When the NIC model retires a page it calls Recycle instead of its final
//     DecRef. The pool keeps that reference as its own (its bias) and puts
//     the page at the tail of a FIFO quarantine ring: the half of the pages
//     that the NIC cannot write to, still read by packets in flight.
//   - Get looks at the oldest page of the ring. If only the pool's reference
//     is left (every frag was released), the page is handed out again, the
//     same *Page. A page still held (a frag out, or a lent page its borrower
//     keeps) does not stop the pages behind it, as a held page does not
//     stop page_pool's ring (page_pool_recycle_in_ring takes only pages
//     whose page_ref_count is one; __page_pool_put_page releases the
//     others): Get hands out the first free page of the next few instead,
//     and allocates only if they are all held. Pages held for stuckGets
//     Gets, or all the held pages at the head once it has been held that
//     long, are moved out of the way: heap pages are released (the pool
//     forgets them; their last holder frees them), pages of a Memory are
//     parked: kept, counted, and looked at a few per Get until they are
//     free, since they may be lent (now, or by a frag's holder later) and
//     nothing else accounts for the memory a borrower pins.
//   - Pages are allocated at the highest order that fits the memory limit:
//     Config.Order first, one order lower after each failure, and one order
//     higher again every RecoverInterval (mlx4's rx_alloc_order and
//     mlx4_en_recover_from_oom).
//   - A page's memory is released, left to the GC, when its count reaches 0,
//     which happens only to pages the pool no longer holds: dropped because
//     the ring was full, waived after an order change, drained by Close,
//     never recycled (NoRecycle, or a page retired with DecRef).
//
// The quarantine ring above serves the striding RQ (mlx5's page_pool). The
// cyclic RQ, mlx4's kind of ring, places its frames with RXFrags instead,
// as mlx4 did before and after its page-recycling patch: pages from GetUnit
// (high-order allocations split into order-0 units) in a pool array with a
// quarantine half, or one order-0 page per RX slot with NoRecycle.
//
// Lending: a page whose memory was handed to a holder the pool cannot count
// (gVisor's views, which keep reference counts of their own) is marked with
// Lend. Get reuses a lent page only when Config.Memory says nobody else
// holds its memory any more (Memory.Busy); without a Memory that can tell,
// a lent page is let go instead, and its memory goes back to the Memory
// when the pool's last reference is dropped. Lent pages are never poisoned.
//
// Threading: Get, Recycle and Close belong to the pool's owner, one
// goroutine at a time (the NIC model of one RX queue, as a page_pool is
// bound to one NAPI context). They own the ring and take no lock. IncRef
// and DecRef may be called from any goroutine by a holder of a reference:
// they touch only the page's atomic state and, with Poison, the bytes of a
// page whose last holder they are. Stats, InUse, Order and PageBytes may be
// called from any goroutine.
package bufpool

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Page sizes a pool can be built with: the base page of x86 and of the 64 KB
// page machines (PowerPC) that mlx4's page-recycling patch talks about.
const (
	PageSize4K  = 4096
	PageSize64K = 65536
	// MaxOrder is the largest allocation order (16 base pages).
	MaxOrder = 4
)

// DefaultRingSize is the quarantine capacity when Config.RingSize is 0: the
// other half of the pages of a 1024-entry RX ring (mlx4's default RX ring
// size, MLX4_EN_DEF_RX_RING_SIZE), one page per entry.
const DefaultRingSize = 512

// RecoverInterval is how often Get raises a lowered allocation order by one
// step: the 250 ms period of mlx4_en_recover_from_oom. It is counted from the
// last change of the order, a fallback or a recovery, so that a failure is
// not retried at once; Get reads the clock only while the order is lowered.
const RecoverInterval = 250 * time.Millisecond

// ErrExhausted is returned by Get when no page fits the pool's limits.
var ErrExhausted = errors.New("bufpool: pool exhausted")

// Memory supplies a pool's page memory in place of the Go heap: the stack
// uses gVisor's reference-counted buffer chunks, so that payload can be lent
// to gVisor without a copy.
type Memory interface {
	// Alloc returns size bytes and a handle for Free, or nil bytes when it
	// cannot. The bytes must stay valid until Free.
	Alloc(size int) (b []byte, handle any)
	// Free gives back the pool's hold on memory from Alloc, once the page's
	// last reference is dropped. Called from any goroutine.
	Free(handle any)
	// Busy reports whether anything besides the pool still holds the
	// memory (true when it cannot tell). Called by the pool's owner, for a
	// lent page whose references have all come back.
	Busy(handle any) bool
}

// Config configures a Pool.
type Config struct {
	// PageSize is the base page size, PageSize4K (default) or PageSize64K.
	PageSize int
	// Order is the optimal (highest) allocation order: Get allocates pages
	// of PageSize<<Order bytes while MaxBytes allows, smaller ones after a
	// failure, and climbs back one order per RecoverInterval.
	Order int
	// MaxPages bounds the pages held at once, of any size, handed out or in
	// the ring (0: no bound). A smaller order does not help against it, so
	// reaching it fails Get without lowering the order.
	MaxPages int
	// MaxBytes bounds the bytes of the pages held at once (0: no bound). An
	// allocation that would exceed it fails, and Get retries one order
	// lower, down to 0. It must hold at least one order-0 page.
	MaxBytes int64
	// RingSize is the quarantine capacity in pages (0: DefaultRingSize).
	RingSize int
	// NoRecycle turns recycling off: no quarantine ring, Recycle is DecRef
	// and every Get allocates (the behaviour mlx4's page-recycling patch fixes).
	NoRecycle bool
	// Now is the clock for the order recovery (nil: time.Now).
	Now func() time.Time
	// Memory supplies the pages' memory (nil: the Go heap). An allocation it
	// fails counts as a failure of the memory limit: Get falls back one
	// order, down to 0.
	Memory Memory
	// Poison fills a page with a pattern when its last holder gives it up to
	// the pool, and checks the pattern when Get hands it out again, so that
	// a write through a stale reference is caught (Get panics: that is a
	// broken invariant, not input). For tests: it costs a pass over the page
	// each way.
	Poison bool
}

// Stats are a Pool's counters, named after the kernel's page_pool ones
// (`ethtool -S` rx_pp_*). Each yields them by name, in a fixed order. The
// pool has one tier, the quarantine ring, where the kernel has two (a
// lockless per-NAPI cache refilled from a ptr_ring), so some names shift
// meaning a little:
//
//   - rx_pp_alloc_fast (AllocFast): pages Get took from the ring. Kernel:
//     from the per-NAPI cache.
//   - rx_pp_alloc_slow (AllocSlow): pages Get allocated. Kernel: the same,
//     order-0 ones.
//   - rx_pp_alloc_slow_high_order (AllocSlowHighOrder): those of order > 0.
//     Kernel: the same.
//   - rx_pp_alloc_slow_freed (AllocSlowFreed): of AllocSlow, those whose
//     memory came from the page allocator's free lists (freePages: a page
//     of the same size released earlier), not from a new Go allocation.
//     Kernel: alloc_pages served from the buddy allocator's per-CPU lists.
//   - rx_pp_alloc_empty (AllocEmpty): Gets that failed with ErrExhausted.
//     Kernel: the ptr_ring was empty and forced a slow allocation; its
//     failures are not counted.
//   - rx_pp_alloc_refill (AllocRefill): Gets that found the oldest ring page
//     still referenced and allocated instead. Kernel: refills of the cache
//     from the ptr_ring.
//   - rx_pp_alloc_waive (AllocWaive): ring pages dropped by Get because
//     their size no longer matched the current order. Kernel: ptr_ring pages
//     dropped for being on the wrong NUMA node.
//   - rx_pp_recycle_cached (RecycleCached): pages Recycle put in the ring.
//     Kernel: pages recycled into the cache (NAPI context).
//   - rx_pp_recycle_cache_full (RecycleCacheFull): the same count as
//     rx_pp_recycle_ring_full, there being no cache in front of the ring.
//     Kernel: the cache was full and the page went to the ptr_ring.
//   - rx_pp_recycle_ring (RecycleRing, and Recycled as before): pages handed
//     out again from the ring, so always equal to rx_pp_alloc_fast. Kernel:
//     pages recycled into the ptr_ring.
//   - rx_pp_recycle_ring_full (RecycleRingFull): pages Recycle dropped
//     because the ring was full. Kernel: the same for the ptr_ring.
//   - rx_pp_recycle_released_ref (RecycleReleasedRef): pages released, left
//     to the GC, when their count reached 0 outside the pool. Kernel: pages
//     released because something else still held a reference.
//   - rx_pp_order_fallbacks (OrderFallbacks): steps the allocation order was
//     lowered after a failure. Not in the kernel (mlx4 keeps rx_alloc_order
//     without counting).
//   - rx_pp_order_recoveries (OrderRecoveries): steps it was raised back,
//     one per RecoverInterval at most. Not in the kernel.
//   - rx_pp_alloc_order (AllocOrder): the current allocation order (a
//     gauge), mlx4's rx_alloc_order.
//   - rx_pp_pages_in_use (InUse): pages held, handed out or in the ring,
//     not yet released (a gauge). Not in the kernel.
//   - rx_pp_bytes_held (BytesHeld): the bytes of those pages (a gauge).
//   - rx_pp_lent (Lent): times a page was lent with Lend. Not in the
//     kernel.
//   - rx_pp_lent_busy (LentBusy): times Get found a ring page lent and
//     still held by its borrower. Not in the kernel.
//   - rx_pp_ring_skip_held (RingSkipHeld): Gets that served a page from
//     behind a held oldest page. Kernel: none (page_pool never queues a
//     held page).
//   - rx_pp_ring_release_held (RingReleaseHeld): held heap pages moved
//     out of the way and released (the pool forgets them; they are freed
//     when their last frag is). Kernel: recycle_released_refcnt.
//   - rx_pp_ring_park_held (RingParkHeld): held pages of a Memory moved
//     out of the way onto the parked list, where Get looks at a few per
//     call and reuses them once free. Not in the kernel.
//   - rx_pp_lent_current (LentPages): pages lent now, in the ring or out
//     (a gauge): the memory the pool's borrowers may pin. Not in the
//     kernel.
//   - rx_alloc_pages (AllocPages): order-0 pages GetUnit allocated, each
//     unit of a split high-order allocation counted. Kernel: mlx4's
//     ring->rx_alloc_pages (ethtool -S rx_alloc_pages).
//   - rx_cache_reuse (CacheReuse): pages RXFrags wrote again because
//     their count was back to one. Kernel: mlx5's rx_cache_reuse; mlx4
//     keeps no count of it.
//   - rx_cache_busy (CacheBusy): pages RXFrags found still held and
//     replaced with a new one. Kernel: mlx5's rx_cache_busy.
//
// Allocated equals InUse; it stays for callers that read it. PageBytes is the
// size of the pages Get allocates at the current order.
type Stats struct {
	AllocFast          uint64
	AllocSlow          uint64
	AllocSlowHighOrder uint64
	AllocSlowFreed     uint64
	AllocEmpty         uint64
	AllocRefill        uint64
	AllocWaive         uint64
	RecycleCached      uint64
	RecycleCacheFull   uint64
	RecycleRing        uint64
	RecycleRingFull    uint64
	RecycleReleasedRef uint64
	OrderFallbacks     uint64
	OrderRecoveries    uint64
	Recycled           uint64 // = RecycleRing
	AllocOrder         int
	InUse              int64
	Allocated          int64 // = InUse
	BytesHeld          int64
	PageBytes          int
	Lent               uint64
	LentBusy           uint64
	RingSkipHeld       uint64
	RingReleaseHeld    uint64
	RingParkHeld       uint64
	LentPages          int64
	AllocPages         uint64
	CacheReuse         uint64
	CacheBusy          uint64
}

// Each calls fn for every counter, named as above, in the documented order.
func (s Stats) Each(fn func(name string, v uint64)) {
	fn("rx_pp_alloc_fast", s.AllocFast)
	fn("rx_pp_alloc_slow", s.AllocSlow)
	fn("rx_pp_alloc_slow_high_order", s.AllocSlowHighOrder)
	fn("rx_pp_alloc_slow_freed", s.AllocSlowFreed)
	fn("rx_pp_alloc_empty", s.AllocEmpty)
	fn("rx_pp_alloc_refill", s.AllocRefill)
	fn("rx_pp_alloc_waive", s.AllocWaive)
	fn("rx_pp_recycle_cached", s.RecycleCached)
	fn("rx_pp_recycle_cache_full", s.RecycleCacheFull)
	fn("rx_pp_recycle_ring", s.RecycleRing)
	fn("rx_pp_recycle_ring_full", s.RecycleRingFull)
	fn("rx_pp_recycle_released_ref", s.RecycleReleasedRef)
	fn("rx_pp_order_fallbacks", s.OrderFallbacks)
	fn("rx_pp_order_recoveries", s.OrderRecoveries)
	fn("rx_pp_alloc_order", uint64(s.AllocOrder))
	fn("rx_pp_pages_in_use", uint64(s.InUse))
	fn("rx_pp_bytes_held", uint64(s.BytesHeld))
	fn("rx_pp_lent", s.Lent)
	fn("rx_pp_lent_busy", s.LentBusy)
	fn("rx_pp_ring_skip_held", s.RingSkipHeld)
	fn("rx_pp_ring_release_held", s.RingReleaseHeld)
	fn("rx_pp_ring_park_held", s.RingParkHeld)
	fn("rx_pp_lent_current", uint64(s.LentPages))
	fn("rx_alloc_pages", s.AllocPages)
	fn("rx_cache_reuse", s.CacheReuse)
	fn("rx_cache_busy", s.CacheBusy)
}

// cacheLine separates fields written by different goroutines; 128 covers
// arm64's lines and x86's adjacent-line prefetch.
const cacheLine = 128

// Pool hands out pages, recycles the ones its owner retires once their frags
// are released, and lets the others go.
type Pool struct {
	// Fixed by New.
	base      int   // order-0 page size
	maxOrder  int32 // Config.Order
	maxPages  int64
	maxBytes  int64
	poison    bool
	noRecycle bool
	now       func() time.Time
	mem       Memory

	// The owner's: Get, Recycle and Close only. ring is a FIFO of count
	// pages from head, each holding one reference, the pool's.
	ring        []*Page
	head, count int
	// parked holds held pages of a Memory taken out of the ring by
	// compact; each holds the pool's reference. Get looks at a few per
	// call, in turn (parkNext), and hands one out once it is free. Its capacity
	// is the ring's.
	parked   []*Page
	parkNext int
	clogged  int // Gets in a row that found the ring's head held, up to stuckGets
	// units are the order-0 units of the last high-order allocation that
	// GetUnit has not handed out yet (mlx4's ring->pre_allocated), each
	// holding a count of one, the pool's.
	units       []*Page
	lastRecover time.Time // last order change (fallback or recovery)

	order atomic.Int32 // current allocation order; written by the owner

	_ [cacheLine]byte
	// Written by the owner only.
	fast, slow, slowHigh, slowFreed, empty, refill, waive atomic.Uint64
	cached, ringFull, fallbacks, recoveries               atomic.Uint64
	lentBusy, skipHeld, releaseHeld, parkHeld             atomic.Uint64
	allocPages, cacheReuse, cacheBusy                     atomic.Uint64 // GetUnit's and RXFrags'

	_ [cacheLine]byte
	// Written by whoever releases a page, and by the owner's allocations.
	released, lent            atomic.Uint64
	inUse, bytesHeld, lentOut atomic.Int64
}

// Page is one page of packet memory with a reference count.
type Page struct {
	// state is the reference count (refMask) and whether the page is in
	// its pool's ring (ringBit), in one word so that a DecRef racing with
	// Recycle sees both at once. A page in the ring counts the pool's
	// reference.
	state atomic.Int32
	// poisoned is set by whoever fills the page with the poison pattern,
	// before it drops its reference, and cleared by Get when it hands the
	// page out: Get checks only pages that were filled.
	poisoned bool
	poison   bool // the pool's Config.Poison, here to spare DecRef a load
	// lent is set by Lend and cleared when Get reuses the page: its memory
	// may be held by someone the count does not see; it is not poisoned.
	lent atomic.Bool
	// heldFor counts the Gets that found the page held near the head of
	// the ring, up to stuckGets; the owner's.
	heldFor uint16
	unit    bool // a unit of a split high-order allocation (GetUnit)
	buf     []byte
	mem     any // Config.Memory's handle
	pool    *Pool
}

// pageStructs recycles the Page structs of pages backed by Config.Memory,
// which are let go more often (lent pages still held when the ring is
// full).
var pageStructs = sync.Pool{New: func() any { return new(Page) }}

const (
	ringBit = 1 << 30
	refMask = ringBit - 1
)

// Frag is a reference to Len bytes at Off in Page. Holding a Frag means
// holding one reference on its page.
type Frag struct {
	Page     *Page
	Off, Len uint32
}

// Bytes returns the bytes the frag refers to.
func (f Frag) Bytes() []byte { return f.Page.buf[f.Off : f.Off+f.Len] }

// New returns a pool for cfg.
func New(cfg Config) (*Pool, error) {
	if cfg.PageSize == 0 {
		cfg.PageSize = PageSize4K
	}
	if cfg.PageSize != PageSize4K && cfg.PageSize != PageSize64K {
		return nil, fmt.Errorf("bufpool: page size %d: want %d or %d", cfg.PageSize, PageSize4K, PageSize64K)
	}
	if cfg.Order < 0 || cfg.Order > MaxOrder {
		return nil, fmt.Errorf("bufpool: order %d: want 0..%d", cfg.Order, MaxOrder)
	}
	if cfg.MaxPages < 0 {
		return nil, fmt.Errorf("bufpool: max pages %d < 0", cfg.MaxPages)
	}
	if cfg.MaxBytes < 0 || cfg.MaxBytes > 0 && cfg.MaxBytes < int64(cfg.PageSize) {
		return nil, fmt.Errorf("bufpool: max bytes %d: want 0 or at least one page (%d)", cfg.MaxBytes, cfg.PageSize)
	}
	if cfg.RingSize < 0 {
		return nil, fmt.Errorf("bufpool: ring size %d < 0", cfg.RingSize)
	}
	if cfg.RingSize == 0 {
		cfg.RingSize = DefaultRingSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Pool{
		base:      cfg.PageSize,
		maxOrder:  int32(cfg.Order),
		maxPages:  int64(cfg.MaxPages),
		maxBytes:  cfg.MaxBytes,
		poison:    cfg.Poison,
		noRecycle: cfg.NoRecycle,
		now:       cfg.Now,
		mem:       cfg.Memory,
	}
	if !cfg.NoRecycle {
		p.ring = make([]*Page, cfg.RingSize)
		if cfg.Memory != nil {
			p.parked = make([]*Page, 0, cfg.RingSize)
		}
	}
	p.order.Store(int32(cfg.Order))
	return p, nil
}

// PageBytes returns the size of the pages Get allocates at the current
// order. Pages allocated before an order change keep their size: use
// len(Page.Bytes()).
func (p *Pool) PageBytes() int { return p.base << p.order.Load() }

// PageSize returns the pool's base page size (Config.PageSize), the
// size of an order-0 page: the kernel's PAGE_SIZE.
func (p *Pool) PageSize() int { return p.base }

// Order returns the current allocation order.
func (p *Pool) Order() int { return int(p.order.Load()) }

// Get returns a page holding one reference, the caller's, or ErrExhausted.
// Its contents are undefined. The page is a parked one that is free again
// (up to skipWindow are looked at per call), else the oldest of the first skipWindow
// pages of the ring whose other references were all dropped, else a new
// one; held pages are moved out of the ring's way (see the package doc),
// so that they never stop recycling. Lent pages stay the pool's until
// their borrower lets go: a caller bounds them with LentPages. Only the
// pool's owner may call Get. It does not allocate when it reuses a page.
func (p *Pool) Get() (*Page, error) {
	order := p.order.Load()
	if order < p.maxOrder {
		order = p.raiseOrder(order)
	}
	size := p.base << order
	if pg := p.unpark(size); pg != nil {
		return pg, nil
	}
	compacted := false
	for p.count > 0 {
		pg := p.ring[p.head]
		if pg.lent.Load() && p.mem == nil {
			// Nobody can tell when the borrower is done: let it go.
			p.pop()
			pg.state.And(^ringBit)
			pg.DecRef()
			continue
		}
		if len(pg.buf) != size {
			p.pop()
			pg.state.And(^ringBit)
			p.waive.Add(1)
			pg.DecRef() // the pool's reference
			continue
		}
		if p.free(pg) {
			p.reuse(pg) // before pop: a corrupt page stays for Close
			p.pop()
			p.clogged = 0
			return pg, nil
		}
		// The oldest page is held. Serve the first free one of the next
		// few, which takes the held page's slot: it stays near the head.
		pg.held()
		n := min(p.count, skipWindow)
		for i := 1; i < n; i++ {
			j := p.head + i
			if j >= len(p.ring) {
				j -= len(p.ring)
			}
			q := p.ring[j]
			if len(q.buf) != size || !p.free(q) {
				q.held()
				continue
			}
			p.reuse(q)
			p.ring[j] = pg
			p.pop()
			p.clogged = 0
			p.skipHeld.Add(1)
			return q, nil
		}
		if pg.heldFor < stuckGets && p.clogged < stuckGets || compacted {
			// Held, but maybe not for long: don't wait for it.
			if p.clogged < stuckGets {
				p.clogged++
			}
			p.refill.Add(1)
			break
		}
		// Held for stuckGets Gets, or the head of the ring has been for
		// that long: the held pages near the head go out of the way.
		p.compact()
		compacted = true
	}
	return p.alloc(order)
}

// compact takes the held pages out of the first maxMoves of the ring,
// keeping the others in order. Heap pages are released, as
// __page_pool_put_page releases a page whose page_ref_count is not one
// (their frags keep them until the last one's DecRef releases them).
// Pages of a Memory are parked instead: they may be lent, or lent later by
// a frag's holder, and released their memory would go on being pinned by
// the borrower, uncounted. With the parked list full they stay.
func (p *Pool) compact() {
	m := min(p.count, maxMoves)
	at := func(i int) int {
		if i += p.head; i >= len(p.ring) {
			i -= len(p.ring)
		}
		return i
	}
	w := m // the kept pages move to the back of the m slots, in order
	for i := m - 1; i >= 0; i-- {
		pg := p.ring[at(i)]
		p.ring[at(i)] = nil
		switch {
		case p.free(pg):
		case p.mem == nil:
			pg.state.And(^ringBit)
			p.releaseHeld.Add(1)
			pg.DecRef() // the pool's reference
			continue
		case len(p.parked) < cap(p.parked):
			p.parked = append(p.parked, pg)
			p.parkHeld.Add(1)
			continue
		}
		w--
		p.ring[at(w)] = pg
	}
	p.head = at(w)
	p.count -= w
}

// unpark looks at up to skipWindow parked pages, in turn, and hands out
// the first that is free; else it returns nil. Most parked pages were held
// by packets in flight, and are free again soon.
func (p *Pool) unpark(size int) *Page {
	for range min(len(p.parked), skipWindow) {
		if p.parkNext >= len(p.parked) {
			p.parkNext = 0
		}
		i := p.parkNext
		pg := p.parked[i]
		if !p.free(pg) {
			p.parkNext++
			continue
		}
		last := len(p.parked) - 1
		p.parked[i], p.parked[last] = p.parked[last], nil
		p.parked = p.parked[:last]
		if len(pg.buf) != size {
			pg.state.And(^ringBit)
			p.waive.Add(1)
			pg.DecRef() // the pool's reference
			continue
		}
		p.reuse(pg)
		return pg
	}
	return nil
}

// free reports whether pg, a page of the ring, can be handed out again: no
// frag of it is out and, if it was lent, its borrower let go (then it is
// lent no more).
func (p *Pool) free(pg *Page) bool {
	if pg.state.Load() != ringBit|1 {
		return false // frags still out
	}
	if pg.lent.Load() {
		// Its frags are back; its borrower may still hold the memory.
		// Nobody can start holding it now: the borrower only takes more
		// from what it holds. Without a Memory, nobody can tell.
		if p.mem == nil || p.mem.Busy(pg.mem) {
			p.lentBusy.Add(1)
			return false
		}
		pg.lent.Store(false)
		p.lentOut.Add(-1)
	}
	return true
}

// reuse readies pg, a free page of the ring, to be handed out: the caller
// takes it out of the ring.
func (p *Pool) reuse(pg *Page) {
	if pg.poisoned {
		pg.checkPoison()
		pg.poisoned = false
	}
	pg.heldFor = 0
	pg.state.Store(1) // the pool's reference becomes the caller's
	p.fast.Add(1)
}

// held counts one more Get that found pg held.
func (pg *Page) held() {
	if pg.heldFor < stuckGets {
		pg.heldFor++
	}
}

// skipWindow is how many pages from the head of the ring Get looks at for
// a free one: enough to step over a few pages held by idle sockets or
// applications, few enough that a ring of held pages costs a Get little.
const skipWindow = 8

// maxMoves is how many pages from the head one Get compacts at most, a
// pointer move each: a cluster of held pages (the pages idle sockets hold)
// is passed in a few Gets rather than costing stuckGets allocations per
// skipWindow of them.
const maxMoves = 64

// stuckGets is how many Gets must find a page held near the head, or find
// the head of the ring held, before the held pages there are moved out of
// the way: onto the parked list if lent, else out of the pool. Pages held for a short while (packets in flight, a socket's
// unread data a reader is catching up with) are best reused where they
// are, in order; a page that stays held while this many pages go by is
// held by someone who may never let go.
const stuckGets = 128

// push appends pg, which holds the pool's reference, to the ring's tail.
// The ring must have room.
func (p *Pool) push(pg *Page) {
	i := p.head + p.count
	if i >= len(p.ring) {
		i -= len(p.ring)
	}
	p.ring[i] = pg
	p.count++
}

// raiseOrder raises the allocation order by one if RecoverInterval has
// passed since it last changed, and returns it.
func (p *Pool) raiseOrder(order int32) int32 {
	now := p.now()
	if now.Sub(p.lastRecover) < RecoverInterval {
		return order
	}
	p.lastRecover = now
	order++
	p.order.Store(order)
	p.recoveries.Add(1)
	return order
}

// alloc allocates a page at order, or at the highest lower order that fits
// MaxBytes, and remembers that order.
func (p *Pool) alloc(order int32) (*Page, error) {
	if p.maxPages > 0 && p.inUse.Load() >= p.maxPages {
		p.empty.Add(1)
		return nil, ErrExhausted
	}
	if p.maxBytes > 0 {
		// Only the owner allocates, and releases only make room, so the
		// limit read here cannot be overrun.
		held := p.bytesHeld.Load()
		fell := false
		for held+int64(p.base<<order) > p.maxBytes {
			if order == 0 {
				if fell {
					p.lastRecover = p.now()
				}
				p.empty.Add(1)
				return nil, ErrExhausted
			}
			order--
			p.order.Store(order)
			p.fallbacks.Add(1)
			fell = true
		}
		if fell {
			p.lastRecover = p.now()
		}
	}
	var pg *Page
	for {
		size := p.base << order
		if p.mem == nil {
			buf := takeFree(size, p.poison)
			if buf != nil {
				p.slowFreed.Add(1)
			} else {
				buf = make([]byte, size)
			}
			pg = &Page{buf: buf, pool: p, poison: p.poison}
			break
		}
		b, h := p.mem.Alloc(size)
		if len(b) >= size {
			pg = pageStructs.Get().(*Page)
			pg.buf, pg.mem, pg.pool, pg.poison = b[:size], h, p, p.poison
			pg.lent.Store(false)
			pg.poisoned, pg.heldFor = false, 0
			break
		}
		if b != nil {
			p.mem.Free(h)
		}
		if order == 0 {
			p.empty.Add(1)
			return nil, ErrExhausted
		}
		order--
		p.order.Store(order)
		p.fallbacks.Add(1)
		p.lastRecover = p.now()
	}
	size := len(pg.buf)
	pg.state.Store(1)
	p.inUse.Add(1)
	p.bytesHeld.Add(int64(size))
	p.slow.Add(1)
	if order > 0 {
		p.slowHigh.Add(1)
	}
	return pg, nil
}

// GetUnit returns an order-0 page (PageSize bytes) holding one reference,
// the caller's, or ErrExhausted, as mlx4_alloc_page does since mlx4's page-recycling patch:
// the next unit of the last high-order allocation, else a new allocation
// at the current order (Config.Order, lowered after a failure and raised
// one step per RecoverInterval, mlx4_en_recover_from_oom) split into
// order-0 units each with a count of its own (split_page), so that a frag
// pins its unit, not the whole allocation. Each unit is a page of its own
// to the counters (rx_alloc_pages). With a Config.Memory every unit is
// allocated alone, at order 0: a Memory's allocations are not split. The
// Go heap keeps a split allocation's memory until its last unit is
// unreachable. Only the pool's owner may call GetUnit. It does not
// allocate when a unit is left.
func (p *Pool) GetUnit() (*Page, error) {
	if n := len(p.units); n > 0 {
		pg := p.units[n-1]
		p.units[n-1] = nil
		p.units = p.units[:n-1]
		return pg, nil
	}
	order := p.order.Load()
	if order < p.maxOrder {
		order = p.raiseOrder(order)
	}
	if p.mem != nil {
		order = 0
	}
	pg, err := p.alloc(order)
	if err != nil {
		return nil, err
	}
	n := len(pg.buf) / p.base
	p.allocPages.Add(uint64(n))
	if n == 1 {
		return pg, nil
	}
	// split_page: n order-0 units, each with its own count (one, as
	// alloc left pg's); pg becomes the first, handed out now.
	buf := pg.buf
	units := make([]Page, n-1)
	if cap(p.units) < n-1 {
		p.units = make([]*Page, 0, n-1)
	}
	for i := n - 1; i >= 1; i-- {
		u := &units[i-1]
		u.buf = buf[i*p.base : (i+1)*p.base : (i+1)*p.base]
		u.pool, u.poison, u.unit = p, p.poison, true
		u.state.Store(1)
		p.units = append(p.units, u)
	}
	pg.buf = buf[:p.base:p.base]
	pg.unit = true
	p.inUse.Add(int64(n - 1))
	return pg, nil
}

// Recycle takes the caller's reference on pg, which must be its last use of
// the page: the owner retiring a page calls it instead of DecRef. The pool
// keeps the reference and quarantines the page until its other references
// are dropped and Get hands it out again; if the ring is full the reference
// is dropped. With NoRecycle, Recycle is DecRef. Only the pool's owner may
// call Recycle. It does not allocate.
func (p *Pool) Recycle(pg *Page) {
	if pg.pool != p {
		panic("bufpool: Recycle of another pool's page")
	}
	if p.noRecycle || pg.lent.Load() && p.mem == nil {
		pg.DecRef()
		return
	}
	if p.count == len(p.ring) {
		p.ringFull.Add(1)
		pg.DecRef()
		return
	}
	old := pg.state.Or(ringBit)
	switch {
	case old&ringBit != 0:
		panic("bufpool: Recycle of a page already in the ring")
	case old&refMask == 0:
		panic("bufpool: Recycle of a free page")
	case old == 1 && p.poison && !pg.lent.Load():
		// The retiring owner was the last holder: no one else can touch it.
		pg.fillPoison()
	}
	p.push(pg)
	p.cached.Add(1)
}

// pop removes the oldest page from the ring.
func (p *Pool) pop() {
	p.ring[p.head] = nil
	p.head++
	if p.head == len(p.ring) {
		p.head = 0
	}
	p.count--
}

// Close drops the pool's references on the pages in its ring: each is
// released now, or when the last frag of it is. Packets still out stay
// valid. Only the pool's owner may call Close, once it stopped recycling
// (the pool stays usable, but a page recycled later is held again).
func (p *Pool) Close() {
	for p.count > 0 {
		pg := p.ring[p.head]
		p.pop()
		pg.state.And(^ringBit)
		pg.DecRef()
	}
	for i, pg := range p.parked {
		p.parked[i] = nil
		pg.state.And(^ringBit)
		pg.DecRef()
	}
	p.parked = p.parked[:0]
	for i, pg := range p.units {
		p.units[i] = nil
		pg.DecRef()
	}
	p.units = p.units[:0]
}

// Stats returns a snapshot of the pool's counters, from any goroutine. The
// counters are read one by one, so a snapshot taken while the pool is busy
// may be a little inconsistent (BytesHeld from one instant, InUse from the
// next).
func (p *Pool) Stats() Stats {
	fast := p.fast.Load()
	ringFull := p.ringFull.Load()
	inUse := p.inUse.Load()
	order := int(p.order.Load())
	return Stats{
		AllocFast:          fast,
		AllocSlow:          p.slow.Load(),
		AllocSlowHighOrder: p.slowHigh.Load(),
		AllocSlowFreed:     p.slowFreed.Load(),
		AllocEmpty:         p.empty.Load(),
		AllocRefill:        p.refill.Load(),
		AllocWaive:         p.waive.Load(),
		RecycleCached:      p.cached.Load(),
		RecycleCacheFull:   ringFull,
		RecycleRing:        fast,
		RecycleRingFull:    ringFull,
		RecycleReleasedRef: p.released.Load(),
		OrderFallbacks:     p.fallbacks.Load(),
		OrderRecoveries:    p.recoveries.Load(),
		Recycled:           fast,
		AllocOrder:         order,
		InUse:              inUse,
		Allocated:          inUse,
		BytesHeld:          p.bytesHeld.Load(),
		PageBytes:          p.base << order,
		Lent:               p.lent.Load(),
		LentBusy:           p.lentBusy.Load(),
		RingSkipHeld:       p.skipHeld.Load(),
		RingReleaseHeld:    p.releaseHeld.Load(),
		RingParkHeld:       p.parkHeld.Load(),
		LentPages:          p.lentOut.Load(),
		AllocPages:         p.allocPages.Load(),
		CacheReuse:         p.cacheReuse.Load(),
		CacheBusy:          p.cacheBusy.Load(),
	}
}

// Memory returns Config.Memory (nil: the Go heap).
func (p *Pool) Memory() Memory { return p.mem }

// RingSize returns the quarantine ring's capacity in pages (0 with
// NoRecycle).
func (p *Pool) RingSize() int { return len(p.ring) }

// InUse returns the number of pages held, handed out or in the ring, not
// yet released; from any goroutine.
func (p *Pool) InUse() int { return int(p.inUse.Load()) }

// Bytes returns the page's memory.
func (pg *Page) Bytes() []byte { return pg.buf }

// Refs returns the current reference count, the pool's included while the
// page is in its ring (for tests and counters).
func (pg *Page) Refs() int32 { return pg.state.Load() & refMask }

// IncRef takes one more reference on the page. The caller must hold one.
func (pg *Page) IncRef() {
	// A page in the ring with the pool's reference only has no other holder
	// that could take one.
	if s := pg.state.Add(1); s&refMask <= 1 || s == ringBit|2 {
		panic("bufpool: IncRef on a free page")
	}
}

// AddRefs takes n more references on pg at once, the caller holding one:
// the bias a NIC driver takes on a page it posts (mlx5's pagecnt_bias,
// MLX5E_PAGECNT_BIAS_MAX), to hand out one per frag without touching the
// page's count, and to give back what it did not hand out with PutRefs.
func (pg *Page) AddRefs(n int32) {
	if s := pg.state.Add(n); n <= 0 || s&refMask <= n || s&ringBit != 0 {
		panic("bufpool: AddRefs on a page the caller does not hold")
	}
}

// PutRefs drops n of the caller's references at once, leaving it at least
// one: the unused part of an AddRefs bias.
func (pg *Page) PutRefs(n int32) {
	if s := pg.state.Add(-n); n < 0 || s&refMask < 1 {
		panic("bufpool: PutRefs of more references than the caller holds")
	}
}

// DecRef drops one of the caller's references, from any goroutine. The
// caller must not touch the page through it afterwards. The last reference
// releases the page; a page in the ring keeps the pool's.
func (pg *Page) DecRef() {
	var s int32
	if pg.poison {
		s = pg.decRefPoison()
	} else {
		s = pg.state.Add(-1)
	}
	switch {
	case s < 0:
		panic("bufpool: DecRef on a free page")
	case s&refMask != 0:
		return
	case s&ringBit != 0:
		panic("bufpool: DecRef dropped the pool's reference on a page in its ring")
	}
	p := pg.pool
	lent := pg.lent.Load()
	if lent {
		// Nobody else can clear it: the page has no holder left.
		pg.lent.Store(false)
		p.lentOut.Add(-1)
	}
	p.released.Add(1)
	p.inUse.Add(-1)
	p.bytesHeld.Add(-int64(len(pg.buf)))
	switch {
	case p.mem != nil:
		h := pg.mem
		pg.buf, pg.mem, pg.pool = nil, nil, nil
		pageStructs.Put(pg)
		p.mem.Free(h)
	case !lent && !pg.unit:
		// A heap page lent without a Memory may still be read by its
		// borrower through a slice: only the GC can tell when it is not.
		// A unit of a split allocation shares its backing array with the
		// others: it goes back to the GC with them.
		buf := pg.buf
		pg.buf = nil
		putFree(buf, pg.poison)
	}
}

// Lend marks the page's memory as lent to a holder the pool cannot count,
// from any goroutine holding a reference: from then on the pool hands the
// page out again only once Config.Memory says the memory is no longer busy,
// and never poisons it. It reports whether this call lent it (false if it
// already was).
func (pg *Page) Lend() bool {
	if pg.lent.Load() || !pg.lent.CompareAndSwap(false, true) {
		return false
	}
	pg.pool.lent.Add(1)
	pg.pool.lentOut.Add(1)
	return true
}

// Lent reports whether the page was lent.
func (pg *Page) Lent() bool { return pg.lent.Load() }

// LentPages returns the number of pages lent now (rx_pp_lent_current): lent
// with Lend and not yet reused or released. From any goroutine.
func (p *Pool) LentPages() int { return int(p.lentOut.Load()) }

// Mem returns the handle Config.Memory gave for the page's memory (nil for
// Go heap pages).
func (pg *Page) Mem() any { return pg.mem }

// decRefPoison is DecRef's decrement in poison mode: the last holder of a
// page in the ring (the pool's reference and the caller's are all that is
// left) fills it before letting go. A compare-and-swap rather than an add,
// so that of two holders dropping at once the one that ends up last fills.
func (pg *Page) decRefPoison() int32 {
	for {
		s := pg.state.Load()
		if s == ringBit|2 && !pg.poisoned && !pg.lent.Load() {
			pg.fillPoison()
		}
		if pg.state.CompareAndSwap(s, s-1) {
			return s - 1
		}
	}
}

// poisonByte is the pattern a page holds while it waits in the ring.
const poisonByte = 0x6b // the kernel's POISON_FREE

var poisonChunk = bytes.Repeat([]byte{poisonByte}, 4096)

func (pg *Page) fillPoison() {
	fillPoisoned(pg.buf)
	pg.poisoned = true
}

func fillPoisoned(buf []byte) {
	for off := 0; off < len(buf); {
		off += copy(buf[off:], poisonChunk)
	}
}

func (pg *Page) checkPoison() { checkPoisoned(pg.buf) }

// checkPoisoned panics if buf, filled with the poison pattern when it was
// freed, was written since.
func checkPoisoned(buf []byte) {
	for off := 0; off < len(buf); off += len(poisonChunk) {
		b := buf[off:min(off+len(poisonChunk), len(buf))]
		if bytes.Equal(b, poisonChunk[:len(b)]) {
			continue
		}
		for i, c := range b {
			if c != poisonByte {
				panic(fmt.Sprintf("bufpool: page written while free, at offset %d: %#x, want %#x", off+i, c, poisonByte))
			}
		}
	}
}
