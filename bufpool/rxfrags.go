package bufpool

import "fmt"

// RXFrags places the frames of a cyclic RQ (mlx4's kind of ring, one
// buffer per descriptor) in pages, as mlx4's en_rx.c does around its page-recycling patch,
// "mlx4: Better use of order-0 pages in RX path". Two modes:
//
//   - Before the patch (packed false; Config.NoRecycle): one order-0 page
//     per RX slot, each frame written at its page's start. When the slot
//     comes round again its page is reused if its count is back to one (the
//     stack released the frame: mlx4_en_complete_rx_desc's page_count()
//     test), else the slot gets a fresh page and the old one lives until
//     its frag is released, then is freed, not recycled (the put_page of
//     mlx4_en_free_frag). A 64 KB GRO packet of 1500-byte frames spans one
//     page per frame.
//   - The patch (packed true): frames packed into pages at mlx4's frag
//     stride (FragStride: two per 4 KB page, 42 per 64 KB page), from a
//     pool array of twice the pages the ring spans: the half the NIC sees
//     and a quarantine half of pages already added to older packets. When
//     a frame needs a new page, the oldest entry of the array is looked at:
//     reused if its count is back to one, else replaced by a new page (the
//     old one is released to its last holder). New pages come from
//     Pool.GetUnit: high-order allocations split into order-0 units, each
//     with its own count, at an order that falls back on failure and
//     recovers every 250 ms (mlx4_alloc_page, mlx4_en_recover_from_oom).
//
// Each page RXFrags holds carries one reference, its own (the driver's
// frags->page); a page it is done writing to waits in the pool's quarantine
// state (as Recycle leaves pages), so that poisoning and lending work as
// for the pool's ring. RXFrags belongs to the pool's owner: Next and Close
// must be called by it alone. It allocates nothing per frame in steady
// state.
type RXFrags struct {
	pool   *Pool
	packed bool
	stride int // frag stride: the bytes a frame takes of its page
	// pages are the RX slots' pages (before the patch) or the pool array
	// (the patch); nil entries are not allocated yet.
	pages []*Page
	next  int   // the entry Next looks at next
	cur   *Page // the page the last frame went into, not yet quarantined
	off   int   // packed: offset of the next frame in cur
}

// FragStride returns mlx4's frag stride for a frame of up to frameSize
// bytes in pages of pageSize bytes, as mlx4_en_calc_rx_buf computes it for
// one frag: frameSize aligned to a cache line (SMP_CACHE_BYTES, 64), plus
// the padding that spreads the page's rest over the strides that fit
// ("We can only pack 2 1536-bytes frames in on 4K page"). For MTU 1500
// (frameSize 1522, mlx4's eff_mtu with two VLAN tags) that is 2048 bytes
// in a 4 KB page and 1536 in a 64 KB one (42 strides). It returns 0 if the
// frame does not fit one page.
func FragStride(frameSize, pageSize int) int {
	const cacheLine = 64 // SMP_CACHE_BYTES
	stride := (frameSize + cacheLine - 1) &^ (cacheLine - 1)
	if frameSize <= 0 || stride > pageSize {
		return 0
	}
	nb := pageSize / stride
	pad := (pageSize - nb*stride) / nb &^ (cacheLine - 1)
	return stride + pad
}

// NewRXFrags returns the frame placement of a cyclic RQ of slots
// descriptors whose frames are up to frameSize bytes, over pool (whose
// NoRecycle selects the mode before the patch). A frame must fit an
// order-0 page.
func NewRXFrags(pool *Pool, slots, frameSize int) (*RXFrags, error) {
	if slots < 1 {
		return nil, fmt.Errorf("bufpool: rx frags: %d slots, want >= 1", slots)
	}
	r := &RXFrags{pool: pool, packed: !pool.noRecycle}
	if !r.packed {
		if frameSize <= 0 || frameSize > pool.base {
			return nil, fmt.Errorf("bufpool: rx frags: frame of %d bytes in a %d-byte page", frameSize, pool.base)
		}
		r.stride = pool.base
		r.pages = make([]*Page, slots)
		return r, nil
	}
	if r.stride = FragStride(frameSize, pool.base); r.stride == 0 {
		return nil, fmt.Errorf("bufpool: rx frags: frame of %d bytes in a %d-byte page", frameSize, pool.base)
	}
	// The pages the ring's descriptors span, twice: the NIC's half and the
	// quarantine half.
	perPage := pool.base / r.stride
	r.pages = make([]*Page, 2*((slots+perPage-1)/perPage))
	return r, nil
}

// Stride returns the bytes a frame takes of its page: FragStride (the
// patch), or a whole page (before it).
func (r *RXFrags) Stride() int { return r.stride }

// Pages returns the number of pages RXFrags cycles through: the RX slots
// (before the patch) or the pool array, both halves (the patch).
func (r *RXFrags) Pages() int { return len(r.pages) }

// Next returns where the next frame goes: a Frag of Stride bytes (at most
// the rest of its page) that holds a reference for the caller, who writes
// the frame into it and hands the reference on with it (as
// mlx4_en_complete_rx_desc hands frags to the skb). The frag of the
// previous call must have been written: its page may be quarantined now.
// Next fails with ErrExhausted when the pool cannot allocate a page.
func (r *RXFrags) Next() (Frag, error) {
	if r.packed && r.cur != nil && r.off+r.stride <= len(r.cur.buf) {
		// mlx4_en_alloc_frags: the next stride of the current page.
		off := r.off
		r.off += r.stride
		r.cur.IncRef()
		return Frag{Page: r.cur, Off: uint32(off), Len: uint32(r.stride)}, nil
	}
	r.quarantine()
	i := r.next
	pg, err := r.take(r.pages[i])
	if err != nil && r.pages[i] == nil && i > 0 {
		// The pool cannot back the whole array (Config.MaxPages,
		// MaxBytes): cycle through the pages it could allocate.
		i = 0
		pg, err = r.take(r.pages[0])
	}
	if err != nil {
		return Frag{}, err // the frame is dropped; the entry stays
	}
	r.pages[i] = pg
	if r.next = i + 1; r.next == len(r.pages) {
		r.next = 0
	}
	r.cur, r.off = pg, r.stride
	pg.IncRef()
	return Frag{Page: pg, Off: 0, Len: uint32(r.stride)}, nil
}

// take returns pg, the oldest entry (a slot's page, or the pool array's
// oldest), to be written again if its count is back to one (nothing but
// RXFrags holds it), else a new page in its place; pg's reference is then
// dropped, and it is freed when its last frag is. pg may be nil (not
// allocated yet). The page returned holds RXFrags' reference.
func (r *RXFrags) take(pg *Page) (*Page, error) {
	p := r.pool
	if pg != nil {
		if p.free(pg) {
			p.reuse(pg)
			p.cacheReuse.Add(1)
			return pg, nil
		}
		// Still held by the stack (page_count() != 1): replace it.
		p.cacheBusy.Add(1)
	}
	np, err := p.GetUnit()
	if err != nil {
		return nil, err
	}
	if pg != nil {
		pg.state.And(^ringBit)
		pg.DecRef() // RXFrags' reference: its holders free it
	}
	return np, nil
}

// quarantine puts the page the last frame went into, which the NIC is done
// writing, into the quarantine state with RXFrags' reference, as Recycle
// does: its last holder poisons it (Config.Poison), and take reuses it
// only once nothing else holds it.
func (r *RXFrags) quarantine() {
	pg := r.cur
	if pg == nil {
		return
	}
	r.cur = nil
	old := pg.state.Or(ringBit)
	if old == 1 && pg.poison && !pg.lent.Load() {
		pg.fillPoison() // nobody else holds it
	}
}

// Close drops RXFrags' references on its pages: each is freed now, or when
// its last frag is released. Packets still out stay valid. The owner calls
// it once, when the RQ stops; the pool's own Close then drops the split
// units not yet handed out.
func (r *RXFrags) Close() {
	r.quarantine()
	for i, pg := range r.pages {
		if pg == nil {
			continue
		}
		r.pages[i] = nil
		pg.state.And(^ringBit)
		pg.DecRef()
	}
	r.next, r.off = 0, 0
}
