package stack

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"gvisor.dev/gvisor/pkg/buffer"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
)

// Zero copy (Config.ZeroCopy) is DESIGN.md's second way of getting payload
// into gVisor: the RX pages are gVisor buffer chunks (viewMemory), and a
// packet's payload frags reach gVisor as views cloned from their page's
// chunk, without a copy. gVisor's reference counts on a chunk are private,
// so a page whose memory was cloned is lent (bufpool.Page.Lend): the pool
// never reuses it, and gVisor's chunk pool takes it back once gVisor and
// the pool have both let go. Every write into a chunk that gVisor's views
// share is copy-on-write, so nothing gVisor holds changes.
//
// The lender also keeps the most recently lent pages, up to a byte bound,
// indexed by address: TCPConn.ReadViews finds the page under each slice
// gVisor's receive queue hands it and gives the application a reference on
// that page instead of a copy (the analogue of tcp_mmap's page flipping).

// DefaultZeroCopyHold is Config.ZeroCopyHold when 0.
const DefaultZeroCopyHold = 32 << 20

// viewMemory is a bufpool.Memory of gVisor buffer chunks: each page is a
// view owning one reference on a chunk of exactly the page's size (chunks
// come in powers of two up to buffer.MaxChunkSize, as pages do).
type viewMemory struct{}

func (viewMemory) Alloc(size int) ([]byte, any) {
	if size > buffer.MaxChunkSize {
		return nil, nil
	}
	v := buffer.NewViewSize(size)
	return v.AsSlice(), v
}

func (viewMemory) Free(h any) { h.(*buffer.View).Release() }

// granule is the unit of the lender's address index. Go allocates the
// chunks (4 KB to 64 KB, powers of two) at least 4 KB-aligned, so a page
// covers whole granules and a granule belongs to one page.
const granule = 4096

// lender holds lent pages for ReadViews: a FIFO bounded in bytes, and an
// index from each granule of their memory to the page. It holds one
// reference on each page it keeps; a page it does not keep (evicted, or
// lent before) is still valid for gVisor, only ReadViews copies it instead.
type lender struct {
	mu    sync.Mutex
	index map[uintptr]*bufpool.Page
	fifo  []*bufpool.Page // ring of n pages from head
	head  int
	n     int
	held  int64
	max   int64

	kept, evicted, unaligned atomic.Uint64
	lentViews                atomic.Uint64 // frags handed to gVisor as views
	copied                   atomic.Uint64 // frags copied (memory not a view)
}

func newLender(max int64) *lender {
	if max <= 0 {
		max = DefaultZeroCopyHold
	}
	return &lender{
		index: make(map[uintptr]*bufpool.Page, max/granule),
		fifo:  make([]*bufpool.Page, max/granule+1),
		max:   max,
	}
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// keep takes a reference on pg, which the caller holds and has just lent,
// and indexes it, evicting the oldest pages beyond the byte bound.
func (l *lender) keep(pg *bufpool.Page) {
	b := pg.Bytes()
	base := addr(b)
	if base%granule != 0 || len(b)%granule != 0 {
		l.unaligned.Add(1)
		return
	}
	pg.IncRef()
	l.mu.Lock()
	for l.n > 0 && (l.held+int64(len(b)) > l.max || l.n == len(l.fifo)) {
		l.evictLocked()
	}
	for a := base; a < base+uintptr(len(b)); a += granule {
		l.index[a/granule] = pg
	}
	i := l.head + l.n
	if i >= len(l.fifo) {
		i -= len(l.fifo)
	}
	l.fifo[i] = pg
	l.n++
	l.held += int64(len(b))
	l.mu.Unlock()
	l.kept.Add(1)
}

// evictLocked drops the oldest kept page.
func (l *lender) evictLocked() {
	pg := l.fifo[l.head]
	l.fifo[l.head] = nil
	l.head++
	if l.head == len(l.fifo) {
		l.head = 0
	}
	l.n--
	b := pg.Bytes()
	base := addr(b)
	for a := base; a < base+uintptr(len(b)); a += granule {
		delete(l.index, a/granule)
	}
	l.held -= int64(len(b))
	l.evicted.Add(1)
	pg.DecRef() // under l.mu: cheap, and keeps lookups from seeing it
}

// lookup returns the kept page whose memory holds all of b, with a
// reference for the caller, or nil.
func (l *lender) lookup(b []byte) *bufpool.Page {
	if len(b) == 0 {
		return nil
	}
	a := addr(b)
	l.mu.Lock()
	defer l.mu.Unlock()
	pg := l.index[a/granule]
	if pg == nil {
		return nil
	}
	pb := pg.Bytes()
	if a+uintptr(len(b)) > addr(pb)+uintptr(len(pb)) {
		return nil
	}
	pg.IncRef()
	return pg
}

// close drops every kept page.
func (l *lender) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.n > 0 {
		l.evictLocked()
	}
}

func (l *lender) each(fn func(string, uint64)) {
	fn("zc_views_lent", l.lentViews.Load())
	fn("zc_frags_copied", l.copied.Load())
	fn("zc_pages_kept", l.kept.Load())
	fn("zc_pages_evicted", l.evicted.Load())
	fn("zc_pages_unaligned", l.unaligned.Load())
	l.mu.Lock()
	held := l.held
	l.mu.Unlock()
	fn("zc_bytes_kept", uint64(held))
}

// lendAfter appends q's bytes from offset skip on to b: what is left of the
// linear part as a copy, each frag as a view of its page's chunk (lent), or
// as a copy when its page is not a chunk.
func (l *lender) lendAfter(b *buffer.Buffer, q *driver.Packet, skip int) {
	if skip < len(q.Linear) {
		b.Append(buffer.NewViewWithData(q.Linear[skip:]))
		skip = 0
	} else {
		skip -= len(q.Linear)
	}
	for _, f := range q.Frags {
		if skip >= int(f.Len) {
			skip -= int(f.Len)
			continue
		}
		pv, ok := f.Page.Mem().(*buffer.View)
		if !ok {
			b.Append(buffer.NewViewWithData(f.Bytes()[skip:]))
			l.copied.Add(1)
			skip = 0
			continue
		}
		v := pv.Clone()
		v.TrimFront(int(f.Off) + skip)
		v.CapLength(int(f.Len) - skip)
		skip = 0
		// Lend before the packet's frags are released: the pool must see
		// the mark by the time the page's count falls back.
		if f.Page.Lend() {
			l.keep(f.Page)
		}
		b.Append(v)
		l.lentViews.Add(1)
	}
}
