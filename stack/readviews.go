package stack

import (
	"io"
	"net"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"

	"github.com/ustack/ustack/bufpool"
)

// ReadViews, the zero-copy read of a TCPConn, and what it hands over.

// A View is a read-only window on received payload that ReadViews handed to
// the application without copying it: a whole RX page, which the NIC does
// not write to again before Release. Payload in less than a whole page, and
// payload that was not in an RX page (zero copy off, or bytes gVisor copied
// itself), comes in views of pages of the connection's own, filled by a
// copy.
type View struct {
	b  []byte
	v  *buffer.View  // mapped: a reference on the RX page's chunk
	pg *bufpool.Page // copied: a reference on the connection's page
}

// Bytes returns the view's bytes. They must not be written to, nor used
// after Release.
func (v *View) Bytes() []byte { return v.b }

// Len returns the number of bytes in the view.
func (v *View) Len() int { return len(v.b) }

// Copied reports whether the view's bytes were copied rather than mapped.
func (v *View) Copied() bool { return v.pg != nil }

// Release gives the view's page back. The view must not be used again.
func (v *View) Release() {
	switch {
	case v.v != nil:
		v.v.Release()
	case v.pg != nil:
		v.pg.DecRef()
	}
	*v = View{}
}

// ViewStats counts what ReadViews handed over on a connection. The
// mappable share, tcp_mmap's "% data was mmap()ed", is MappedBytes /
// (MappedBytes + CopiedBytes).
type ViewStats struct {
	// MappedBytes were handed over in place: whole RX pages, all that
	// tcp_zerocopy_receive maps. PageBytes, the bytes of mapped views that
	// are a whole page, equals it since only whole pages are mapped; it
	// stays for the callers that read it.
	MappedBytes, PageBytes uint64
	// CopiedBytes were copied into the connection's own pages;
	// CopybufBytes of them lay in RX pages but not in a whole page, what
	// the kernel copies into the copy buffer (tcp_zc_handle_leftover,
	// zc->copybuf_len) or leaves to recv (recv_skip_hint). The rest of
	// CopiedBytes was not in an RX page at all.
	CopiedBytes, CopybufBytes uint64
	// Views is the number of views handed over.
	Views uint64
}

// plus returns st with o's counts added.
func (st ViewStats) plus(o ViewStats) ViewStats {
	return ViewStats{
		MappedBytes:  st.MappedBytes + o.MappedBytes,
		PageBytes:    st.PageBytes + o.PageBytes,
		CopiedBytes:  st.CopiedBytes + o.CopiedBytes,
		CopybufBytes: st.CopybufBytes + o.CopybufBytes,
		Views:        st.Views + o.Views,
	}
}

// viewTotals are the stack's ReadViews counters, over every connection.
type viewTotals struct {
	mapped, page, copied, copybuf, views atomic.Uint64
}

// add adds one read's counts to the totals.
func (t *viewTotals) add(st ViewStats) {
	t.mapped.Add(st.MappedBytes)
	t.page.Add(st.PageBytes)
	t.copied.Add(st.CopiedBytes)
	t.copybuf.Add(st.CopybufBytes)
	t.views.Add(st.Views)
}

func (t *viewTotals) each(fn func(string, uint64)) {
	fn("zc_read_mapped_bytes", t.mapped.Load())
	fn("zc_read_page_bytes", t.page.Load())
	fn("zc_read_copied_bytes", t.copied.Load())
	fn("zc_read_copybuf_bytes", t.copybuf.Load())
	fn("zc_read_views", t.views.Load())
}

// ViewStats returns the connection's ReadViews counters. Call it from the
// reading goroutine or after reads stopped.
func (c *TCPConn) ViewStats() ViewStats { return c.stats }

// ReadViews reads up to max bytes of payload, without copying what it can:
// it appends views of the RX pages that hold them to vs and returns the
// result and the number of bytes. It follows tcp_mmap's rule
// (tcp_zerocopy_receive): only a whole, page-aligned page of the RX pool is
// handed over in place; the rest (parts of pages) is copied into the
// connection's own pages, as the kernel leaves it to the copy buffer or
// recv. A whole page that max cuts is left for the next read, unless it is
// the first thing read. So the mappable share depends on the receive path:
// with hardware GRO coalescing frags are whole pages, with software GRO and
// MTU-sized frames they are not. It blocks until at least one byte is
// there, like Read, and returns io.EOF once the peer closed and everything
// was read; its other errors are Read's. Each view must be released; until
// then its page stays out of the pool. Pass vs[:0] of a reused slice to
// read without allocating.
func (c *TCPConn) ReadViews(vs []View, max int) ([]View, int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if c.closed.Load() {
		return vs, 0, c.opError("read", net.ErrClosed)
	}
	if max <= 0 {
		return vs, 0, nil
	}
	c.w = viewWriter{c: c, mem: c.s.chunks(), views: vs, left: max}
	if c.w.mem != nil {
		if c.page == 0 {
			st := c.s.drv.Pool().Stats()
			c.page = st.PageBytes >> st.AllocOrder
		}
		c.w.page = c.page
	}
	res, err := c.read(&c.w)
	vs, got := c.w.views, c.w.got
	c.w = viewWriter{}
	c.stats = c.stats.plus(got)
	c.s.views.add(got)
	if err != nil {
		return vs, 0, err
	}
	if res.Count > 0 {
		c.ep.ModerateRecvBuf(res.Count)
	}
	return vs, res.Count, nil
}

// copyPageSize is the size of the pages a connection copies payload into
// when it cannot map it.
const copyPageSize = 64 << 10

// copyView copies as much of b as fits in the current copy page into a view.
//
// +checklocks:c.readMu
func (c *TCPConn) copyView(b []byte) (View, int, error) {
	if c.copies == nil {
		p, err := bufpool.New(bufpool.Config{PageSize: bufpool.PageSize64K, RingSize: 64})
		if err != nil {
			return View{}, 0, err
		}
		c.copies = p
	}
	if c.cur != nil && c.curOff == len(c.cur.Bytes()) {
		c.copies.Recycle(c.cur)
		c.cur = nil
	}
	if c.cur == nil {
		pg, err := c.copies.Get()
		if err != nil {
			return View{}, 0, err
		}
		c.cur, c.curOff = pg, 0
	}
	dst := c.cur.Bytes()[c.curOff:]
	n := copy(dst, b)
	c.cur.IncRef()
	c.curOff += n
	return View{b: dst[:n:n], pg: c.cur}, n, nil
}

// viewWriter is the io.Writer ReadViews gives gVisor's Read: gVisor writes
// the slices of its receive queue (one per view of its buffers: the RX
// pages' frags as the stack lent them), in order, and each becomes a view.
type viewWriter struct {
	c     *TCPConn
	mem   *viewMemory // the zero-copy stack's RX pages, or nil
	page  int         // their base page size, with mem
	views []View
	left  int
	got   ViewStats // this read's counts
}

// Write takes b (or the part of it that fits in what ReadViews may still
// read) as views: in place if it is a whole RX page (viewMemory.mapPage),
// else copied. A short write tells gVisor to stop. gVisor's Read calls it
// from ReadViews, under readMu.
//
// +checklocks:w.c.readMu
func (w *viewWriter) Write(b []byte) (int, error) {
	n := min(len(b), w.left)
	if n == 0 {
		return 0, io.ErrShortWrite
	}
	st := &w.got
	rest := b[:n]
	inRX := false
	if w.mem != nil && n < len(b) && st.MappedBytes+st.CopiedBytes > 0 {
		// A whole page the limit cuts stays for the next read, as
		// tcp_zerocopy_receive maps only the whole pages that fit and
		// leaves the rest queued; with nothing read yet it is copied, as
		// a zerocopy receive shorter than a page leaves it to recv.
		if v, _ := w.mem.mapPage(b, w.page); v != nil {
			v.Release()
			return 0, io.ErrShortWrite
		}
	}
	if w.mem != nil {
		var v *buffer.View
		if v, inRX = w.mem.mapPage(rest, w.page); v != nil {
			w.views = append(w.views, View{b: rest[:len(rest):len(rest)], v: v})
			st.MappedBytes += uint64(len(rest))
			st.PageBytes += uint64(len(rest))
			st.Views++
			rest = nil
		}
	}
	for len(rest) > 0 {
		v, m, err := w.c.copyView(rest)
		if err != nil {
			w.left -= n - len(rest)
			return n - len(rest), err
		}
		w.views = append(w.views, v)
		st.CopiedBytes += uint64(m)
		if inRX {
			st.CopybufBytes += uint64(m)
		}
		st.Views++
		rest = rest[m:]
	}
	w.left -= n
	if n < len(b) {
		return n, io.ErrShortWrite
	}
	return n, nil
}

// chunks returns the zero-copy stack's page memory, or nil.
func (s *Stack) chunks() *viewMemory {
	if s == nil || s.drv == nil || s.ep.lend == nil {
		return nil
	}
	m, _ := s.drv.Pool().Memory().(*viewMemory)
	return m
}
