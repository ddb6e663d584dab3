package stack

import (
	"reflect"
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
// chunk, without a copy. Such a page is lent (bufpool.Page.Lend): the pool
// hands it to the NIC again only once the chunk's reference count says
// that gVisor (and any application view) let go of it, so nothing gVisor
// holds ever changes. Every write gVisor itself makes into a chunk that
// others share is copy-on-write.
//
// TCPConn.ReadViews finds the chunk under each slice gVisor's receive queue
// hands it (viewMemory indexes its chunks by address) and gives the
// application a view of that chunk, one more reference on it, instead of a
// copy: the analogue of tcp_mmap's page flipping.

// viewMemory is a bufpool.Memory of gVisor buffer chunks: each page is a
// view owning one reference on a chunk of exactly the page's size (chunks
// come in powers of two up to buffer.MaxChunkSize, as pages do). It indexes
// the chunks it handed out by address, for ReadViews.
type viewMemory struct {
	mu    sync.Mutex
	index map[uintptr]*buffer.View // granule -> the page's owning view
}

func newViewMemory() *viewMemory {
	return &viewMemory{index: make(map[uintptr]*buffer.View)}
}

// NewChunkMemory returns a bufpool.Memory of gVisor buffer chunks, for a
// pool given to a zero-copy stack in Config.Driver.Pool.
func NewChunkMemory() bufpool.Memory { return newViewMemory() }

// granule is the unit of the address index. Go allocates the chunks (4 KB
// to 64 KB, powers of two) at least 4 KB-aligned, so a page covers whole
// granules and a granule belongs to one page; Alloc checks it.
const granule = 4096

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func (m *viewMemory) Alloc(size int) ([]byte, any) {
	if size > buffer.MaxChunkSize {
		return nil, nil
	}
	v := buffer.NewViewSize(size)
	b := v.AsSlice()
	if base := addr(b); base%granule == 0 && len(b)%granule == 0 {
		m.mu.Lock()
		for a := base; a < base+uintptr(len(b)); a += granule {
			m.index[a/granule] = v
		}
		m.mu.Unlock()
	}
	return b, v
}

func (m *viewMemory) Free(h any) {
	v := h.(*buffer.View)
	b := v.AsSlice()
	m.mu.Lock()
	for a := addr(b); a < addr(b)+uintptr(len(b)); a += granule {
		if m.index[a/granule] == v {
			delete(m.index, a/granule)
		}
	}
	m.mu.Unlock()
	v.Release()
}

// Busy reports whether a view other than the page's own still holds its
// chunk.
func (m *viewMemory) Busy(h any) bool {
	n, ok := chunkRefs(h.(*buffer.View))
	return !ok || n > 1
}

// view returns a new view of b, which must lie in a chunk of m, taking a
// reference on the chunk; nil if b is not in one. The caller holds a view
// of b's chunk (gVisor's receive queue does), so the chunk cannot be reused
// meanwhile.
func (m *viewMemory) view(b []byte) *buffer.View {
	if len(b) == 0 {
		return nil
	}
	a := addr(b)
	m.mu.Lock()
	defer m.mu.Unlock()
	pv := m.index[a/granule]
	if pv == nil {
		return nil
	}
	base := addr(pv.AsSlice())
	if a+uintptr(len(b)) > base+uintptr(pv.Size()) {
		return nil
	}
	v := pv.Clone()
	v.TrimFront(int(a - base))
	v.CapLength(len(b))
	return v
}

// chunkRefs reads the reference count of v's chunk, which gVisor keeps
// private: the pool must know whether gVisor still holds a lent page before
// the NIC writes into it again. The field offsets come from reflect, and
// are checked once against a chunk whose count is known; if gVisor's layout
// ever changes, ok is false and lent pages are simply never reused.
func chunkRefs(v *buffer.View) (n int64, ok bool) {
	if !refsLayout.ok {
		return 0, false
	}
	c := *(*unsafe.Pointer)(unsafe.Add(unsafe.Pointer(v), refsLayout.chunk))
	if c == nil {
		return 0, false
	}
	// The low 32 bits are the real references (the high ones speculative).
	return atomic.LoadInt64((*int64)(unsafe.Add(c, refsLayout.refs))) & 0xffffffff, true
}

// refsLayout is where the chunk pointer sits in a buffer.View, and the
// 64-bit count in a chunk.
var refsLayout struct {
	chunk, refs uintptr
	ok          bool
}

func init() {
	vt := reflect.TypeFor[buffer.View]()
	cf, ok := vt.FieldByName("chunk")
	if !ok || cf.Type.Kind() != reflect.Pointer || cf.Type.Elem().Kind() != reflect.Struct {
		return
	}
	off, ok := fieldOffset(cf.Type.Elem(), "refCount", "value")
	if !ok {
		return
	}
	refsLayout.chunk, refsLayout.refs, refsLayout.ok = cf.Offset, off, true
	// Check it: a new chunk has 1 reference, a clone makes 2.
	v := buffer.NewViewSize(64)
	c := v.Clone()
	n2, _ := chunkRefs(v)
	c.Release()
	n1, _ := chunkRefs(v)
	v.Release()
	if n2 != 2 || n1 != 1 {
		refsLayout.ok = false
	}
}

// fieldOffset returns the offset of the int64 t.outer.inner, following
// embedded fields.
func fieldOffset(t reflect.Type, outer, inner string) (uintptr, bool) {
	of, ok := t.FieldByName(outer)
	if !ok {
		return 0, false
	}
	off := uintptr(0)
	for i := range of.Index {
		f := t.FieldByIndex(of.Index[:i+1])
		off += f.Offset
	}
	if of.Type.Kind() != reflect.Struct {
		return 0, false
	}
	inf, ok := of.Type.FieldByName(inner)
	if !ok || inf.Type.Kind() != reflect.Int64 || len(inf.Index) != 1 {
		return 0, false
	}
	return off + inf.Offset, true
}

// lendStats count the zero-copy hand-off.
type lendStats struct {
	views  atomic.Uint64 // frags handed to gVisor as views
	copied atomic.Uint64 // frags copied (their page is not a chunk)
}

func (l *lendStats) each(fn func(string, uint64)) {
	fn("zc_views_lent", l.views.Load())
	fn("zc_frags_copied", l.copied.Load())
}

// lendAfter appends q's bytes from offset skip on to b: what is left of the
// linear part as a copy, each frag as a view of its page's chunk (lent), or
// as a copy when its page is not a chunk.
func (l *lendStats) lendAfter(b *buffer.Buffer, q *driver.Packet, skip int) {
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
		f.Page.Lend()
		b.Append(v)
		l.views.Add(1)
	}
}
