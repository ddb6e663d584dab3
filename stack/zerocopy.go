package stack

import (
	"log"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/hdr"
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
// hands it (viewMemory indexes its chunks by address) and, when the slice is
// a whole page, gives the application a view of that chunk, one more
// reference on it, instead of a copy: the analogue of tcp_mmap's page
// flipping, which maps only whole, page-aligned frags and leaves the rest to
// the copy buffer (tcp_zerocopy_receive, tcp_zc_handle_leftover).

// viewMemory is a bufpool.Memory of gVisor buffer chunks: each page is a
// view owning one reference on a chunk of exactly the page's size (chunks
// come in powers of two up to buffer.MaxChunkSize, as pages do). It indexes
// the chunks it handed out by address, for ReadViews. One viewMemory backs
// the pools of every queue of a stack (Config.Queues), so that one index
// covers them all; its methods are safe from any goroutine.
type viewMemory struct {
	mu sync.Mutex
	// +checklocks:mu
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

// mapPage returns a new view of b, taking a reference on its chunk, if b is
// what tcp_zerocopy_receive maps (can_map_frag): one whole page, at offset 0
// of its page, of size page, the base page size (PAGE_SIZE; a larger page of
// the pool is a higher-order, compound page, which the kernel does not map
// either). It returns nil otherwise; in then reports whether b lies in a page
// of m at all, bytes ReadViews copies by the rule (its copybuf). The caller
// holds a view of b's chunk (gVisor's receive queue does), so the chunk
// cannot be reused meanwhile.
func (m *viewMemory) mapPage(b []byte, page int) (v *buffer.View, in bool) {
	if len(b) == 0 {
		return nil, false
	}
	a := addr(b)
	m.mu.Lock()
	defer m.mu.Unlock()
	pv := m.index[a/granule]
	if pv == nil {
		return nil, false
	}
	base := addr(pv.AsSlice())
	if a+uintptr(len(b)) > base+uintptr(pv.Size()) {
		return nil, false
	}
	if a != base || len(b) != pv.Size() || len(b) != page {
		return nil, true
	}
	return pv.Clone(), true
}

// lendMinBytes is the shortest packet payload lent to gVisor; shorter ones
// are copied. Lending costs a view clone per frag and pins each frag's
// whole page (4 to 64 KB) for as long as gVisor keeps the bytes, while
// gVisor charges a segment, out of order or in a reassembly queue, about
// its data size: a peer sending 1-byte segments would pin a page per byte.
// Copying costs a memmove and a small chunk. BenchmarkLendVsCopy, on the
// loaded 2-core test machine (go test -run X -bench LendVsCopy -count 12
// -cpu 1 -benchtime 200000x ./stack/; ns/op, min and median of 12):
//
//	payload   64       256      512      1024     1448     4096
//	lend      240/523  189/206  184/204  169/233  170/208  217/226
//	copy      198/322  210/232  210/289  173/244  327/332  348/357
//
// Up to 1 KB the two are within the noise of each other; from a full-size
// TCP segment (1448 B at MTU 1500) on, lending is cheaper by a third or
// more. So copy below 1 KB, where it costs no more and pins no page.
// TestLendSmallCopied pins it. The rule is per packet,
// not per frag: a frame split over two pages leaves a short frag on a page
// that the frame's other frags (and its neighbours) pin anyway.
const lendMinBytes = 1024

// lendStats decides, frag by frag, between lending and copying, and counts
// the zero-copy hand-off. Its zero value lends every frag of a chunk page
// (unit tests); newLendStats sets the stack's limits. Used by the poll loop
// and the cpumap workers at once: the counters are atomic, the rest fixed.
type lendStats struct {
	minLend    int             // frags shorter than this are copied
	maxLent    int             // pages lent at once, at most (0: no bound)
	pool       *bufpool.Pool   // whose LentPages maxLent bounds (with more's)
	more       []*bufpool.Pool // the further queues' pools (addPool)
	defaultMax bool            // maxLent is the pools' rings (ZeroCopyMaxLent 0)
	noLayout   bool            // gVisor's chunk layout is unknown: copy all
	ipFrags    bool            // copy IP fragments
	l3         bool            // the packets are a TUN's, without an Ethernet header

	views        atomic.Uint64 // frags handed to gVisor as views
	copied       atomic.Uint64 // frags copied: their page is not a chunk
	copiedSmall  atomic.Uint64 // frags copied: shorter than minLend
	copiedBound  atomic.Uint64 // frags copied: maxLent pages were lent
	copiedFrag   atomic.Uint64 // frags copied: of an IP fragment
	copiedLayout atomic.Uint64 // frags copied: noLayout
}

// layoutLog logs once that gVisor's chunk layout was not recognised.
var layoutLog sync.Once

// newLendStats returns the lending policy of a zero-copy stack whose pages
// come from pool: packets with less than lendMinBytes of payload are
// copied, and so are IP fragments, and every frag of a page not lent yet
// once maxLent pages are (0: as many as the pool.s ring holds, see
// Config.ZeroCopyMaxLent). If gVisor's chunk layout was
// not recognised, pages could never be reused: every frag is copied, and
// that is logged once.
func newLendStats(pool *bufpool.Pool, maxLent int) *lendStats {
	def := maxLent == 0
	if def {
		maxLent = max(pool.RingSize(), 1)
	}
	l := &lendStats{minLend: lendMinBytes, maxLent: maxLent, pool: pool, noLayout: !refsLayout.ok, ipFrags: true, defaultMax: def}
	if l.noLayout {
		layoutLog.Do(func() {
			log.Printf("ustack: zero copy: gVisor's buffer chunk layout is not recognised; payload is copied (zc_frags_copied_layout)")
		})
	}
	return l
}

// addPool adds a further queue's pool (Config.Queues): the bound on lent
// pages is over every queue's pool, and a default bound grows by the
// pool's ring. Called before the stack starts.
func (l *lendStats) addPool(p *bufpool.Pool) {
	l.more = append(l.more, p)
	if l.defaultMax {
		l.maxLent += max(p.RingSize(), 1)
	}
}

// lentPages returns the pages lent out of every queue's pool.
func (l *lendStats) lentPages() int {
	n := l.pool.LentPages()
	for _, p := range l.more {
		n += p.LentPages()
	}
	return n
}

func (l *lendStats) each(fn func(string, uint64)) {
	fn("zc_views_lent", l.views.Load())
	fn("zc_frags_copied", l.copied.Load())
	fn("zc_frags_copied_small", l.copiedSmall.Load())
	fn("zc_frags_copied_over_limit", l.copiedBound.Load())
	fn("zc_frags_copied_ipfrag", l.copiedFrag.Load())
	fn("zc_frags_copied_layout", l.copiedLayout.Load())
}

// lendAfter appends p's bytes from offset skip on, and its chain's payload
// (bufpool.Packet.Walk), to b, each slice as a view of its own (appendView:
// a lent view is never cut, so a whole page stays whole for ReadViews):
// what is left of a linear part as a copy, unless the linear part is a
// head frag (bufpool.Packet.Head: the linear RQ's frame in its stride),
// which is lent as a frag is, as skb_gro_receive's head_frag branch makes
// such a head's payload a frag of the page; each frag as a view of its
// page's chunk (lent), or as a copy when its page is not a chunk, when its
// packet is short, when too many pages are lent already, when its packet
// is an IP fragment (gVisor holds those up to 30 s for reassembly), or
// when gVisor's layout is unknown.
func (l *lendStats) lendAfter(b *buffer.Buffer, p *driver.Packet, skip int) {
	var q *driver.Packet // the packet the walk is in
	var small, ipFrag bool
	for w := p.Walk(skip); w.Next(); {
		if w.Packet() != q {
			// A short segment is copied whole (gVisor charges it its
			// size), a longer one lent whole even if a frame's split over
			// two pages left a short frag.
			q = w.Packet()
			from := q.HdrLen
			if q == p {
				from = skip
			}
			small = q.Len-from < l.minLend
			ipFrag = l.ipFrags && (len(q.Frags) > 0 || q.Head != nil) && isIPFragment(q.Linear, l.l2Len())
		}
		n := len(w.Bytes())
		var pg *bufpool.Page
		var end int // where the slice ends in pg's bytes
		if f := w.Frag(); f != nil {
			pg, end = f.Page, int(f.Off+f.Len)
		} else if q.Head != nil {
			// The slice is the end of a head frag's linear part.
			pg, end = q.Head, int(q.HeadOff)+len(q.Linear)
		} else {
			appendView(b, buffer.NewViewWithData(w.Bytes()))
			continue
		}
		pv, ok := pg.Mem().(*buffer.View)
		var why *atomic.Uint64
		switch {
		case !ok:
			why = &l.copied
		case l.noLayout:
			why = &l.copiedLayout
		case ipFrag:
			why = &l.copiedFrag
		case small:
			why = &l.copiedSmall
		case l.maxLent > 0 && !pg.Lent() && l.lentPages() >= l.maxLent:
			// A page lent already costs nothing more.
			why = &l.copiedBound
		}
		if why != nil {
			appendView(b, buffer.NewViewWithData(w.Bytes()))
			why.Add(1)
			continue
		}
		v := pv.Clone()
		v.TrimFront(end - n)
		v.CapLength(n)
		// Lend before the packet's frags are released: the pool must see
		// the mark by the time the page's count falls back.
		pg.Lend()
		appendView(b, v)
		l.views.Add(1)
	}
}

func (l *lendStats) l2Len() int { return linkLen(l.l3) }

// isIPFragment reports whether frame, an Ethernet frame's first bytes (its
// linear part; with l2 0 a TUN's frame, from its IP header), holds an IPv4
// fragment (MF set or a fragment offset) or an IPv6 packet with a Fragment
// header anywhere in its extension header chain (RFC 8200 section 4.5),
// which it walks as ipv6_skip_exthdr does (hdr.IPv6SkipExtHdrs). A frame
// too short for its link and fixed IP headers says no; an IPv6 chain that
// runs past frame or the walk's bound says yes, so that what gVisor might
// hold for reassembly is copied rather than lent. It never panics.
func isIPFragment(frame []byte, l2 int) bool {
	const eth = header.EthernetMinimumSize
	typ, off := netProto(frame, l2), l2
	if l2 > 0 && typ == 0x8100 && len(frame) >= eth+4 { // an 802.1Q tag left in place
		typ, off = tcpip.NetworkProtocolNumber(frame[eth+2])<<8|tcpip.NetworkProtocolNumber(frame[eth+3]), eth+4
	}
	if len(frame) < off {
		return false
	}
	ip := frame[off:]
	switch typ {
	case header.IPv4ProtocolNumber:
		return len(ip) >= header.IPv4MinimumSize && hdr.IsIPv4Fragment(ip)
	case header.IPv6ProtocolNumber:
		if len(ip) < header.IPv6MinimumSize {
			return false
		}
		nh, _, ok := hdr.IPv6SkipExtHdrs(ip)
		return !ok || nh == uint8(header.IPv6FragmentExtHdrIdentifier)
	}
	return false
}
