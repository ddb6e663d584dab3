// Package bufpool owns ustack's packet memory: pages that the NIC model
// writes frames into, and frags that reference parts of them.
//
// A Page carries a reference count. Whoever holds a Frag of a page holds one
// reference; the page goes back to its Pool when the last one is dropped, and
// is never handed out again while anything can still read it. Pages are
// returned from any goroutine; Get is meant for one producer (the NIC model
// of one RX queue), like a kernel page_pool bound to one queue.
package bufpool

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Page sizes a pool can be built with: the base page of x86 and of the 64 KB
// page machines (PowerPC) that seed 001 talks about.
const (
	PageSize4K  = 4096
	PageSize64K = 65536
	// MaxOrder is the largest allocation order (16 base pages).
	MaxOrder = 4
)

// ErrExhausted is returned by Get when the pool may not allocate another page.
var ErrExhausted = errors.New("bufpool: pool exhausted")

// Config configures a Pool.
type Config struct {
	// PageSize is the base page size, PageSize4K (default) or PageSize64K.
	PageSize int
	// Order is the allocation order: a page is PageSize<<Order bytes.
	Order int
	// MaxPages bounds the pages allocated at once (0: no bound).
	MaxPages int
	// Poison fills a page with a pattern when it comes back and checks the
	// pattern when it is handed out again, so that a write through a stale
	// reference is caught (it panics: that is a broken invariant, not input).
	Poison bool
}

// Stats are a Pool's counters, named as the kernel's page_pool ones.
type Stats struct {
	AllocFast  uint64 // rx_pp_alloc_fast: pages taken from the recycle list
	AllocSlow  uint64 // rx_pp_alloc_slow: pages freshly allocated
	AllocEmpty uint64 // rx_pp_alloc_empty: Get failed, pool exhausted
	Recycled   uint64 // rx_pp_recycle_ring: pages returned to the recycle list
	InUse      int64  // pages handed out and not yet returned
	Allocated  int64  // pages allocated in all (in use or on the recycle list)
	PageBytes  int    // bytes per page
}

// Pool hands out pages of one size and takes them back when their last
// reference is dropped.
type Pool struct {
	size   int
	max    int
	poison bool

	mu   sync.Mutex
	free []*Page // +checklocks:mu

	allocFast, allocSlow, allocEmpty, recycled atomic.Uint64
	inUse, allocated                           atomic.Int64
}

// Page is one page of packet memory with a reference count.
type Page struct {
	buf  []byte
	refs atomic.Int32
	pool *Pool
}

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
	return &Pool{size: cfg.PageSize << cfg.Order, max: cfg.MaxPages, poison: cfg.Poison}, nil
}

// PageBytes returns the size of the pool's pages.
func (p *Pool) PageBytes() int { return p.size }

// Get returns a page holding one reference, owned by the caller, or
// ErrExhausted. Its contents are undefined.
func (p *Pool) Get() (*Page, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		pg := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		p.mu.Unlock()
		p.allocFast.Add(1)
		if p.poison {
			pg.checkPoison()
		}
		pg.refs.Store(1)
		p.inUse.Add(1)
		return pg, nil
	}
	if p.max > 0 && p.allocated.Load() >= int64(p.max) {
		p.mu.Unlock()
		p.allocEmpty.Add(1)
		return nil, ErrExhausted
	}
	p.allocated.Add(1)
	p.mu.Unlock()
	p.allocSlow.Add(1)
	pg := &Page{buf: make([]byte, p.size), pool: p}
	pg.refs.Store(1)
	p.inUse.Add(1)
	return pg, nil
}

// Bytes returns the page's memory.
func (pg *Page) Bytes() []byte { return pg.buf }

// Refs returns the current reference count (for tests and counters).
func (pg *Page) Refs() int32 { return pg.refs.Load() }

// IncRef takes one more reference on the page.
func (pg *Page) IncRef() {
	if pg.refs.Add(1) <= 1 {
		panic("bufpool: IncRef on a free page")
	}
}

// DecRef drops one reference; the last one returns the page to its pool.
// The caller must not touch the page afterwards.
func (pg *Page) DecRef() {
	switch r := pg.refs.Add(-1); {
	case r > 0:
		return
	case r < 0:
		panic("bufpool: DecRef on a free page")
	}
	p := pg.pool
	if p.poison {
		pg.fillPoison()
	}
	p.inUse.Add(-1)
	p.recycled.Add(1)
	p.mu.Lock()
	p.free = append(p.free, pg)
	p.mu.Unlock()
}

// Stats returns a snapshot of the pool's counters.
func (p *Pool) Stats() Stats {
	return Stats{
		AllocFast:  p.allocFast.Load(),
		AllocSlow:  p.allocSlow.Load(),
		AllocEmpty: p.allocEmpty.Load(),
		Recycled:   p.recycled.Load(),
		InUse:      p.inUse.Load(),
		Allocated:  p.allocated.Load(),
		PageBytes:  p.size,
	}
}

// InUse returns the number of pages handed out and not yet returned.
func (p *Pool) InUse() int { return int(p.inUse.Load()) }

// poisonByte is the pattern a recycled page holds while it is free.
const poisonByte = 0x6b // the kernel's POISON_FREE

func (pg *Page) fillPoison() {
	for i := range pg.buf {
		pg.buf[i] = poisonByte
	}
}

func (pg *Page) checkPoison() {
	for i, b := range pg.buf {
		if b != poisonByte {
			panic(fmt.Sprintf("bufpool: free page written at offset %d: %#x", i, b))
		}
	}
}
