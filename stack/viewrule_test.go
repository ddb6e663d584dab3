package stack

import (
	"bytes"
	"io"
	"testing"

	"github.com/ustack/ustack/bufpool"
)

// TestReadViewsPageRule checks tcp_mmap's rule in ReadViews' writer, slice
// by slice as gVisor's Read hands them over: a whole, page-aligned order-0
// RX page is mapped; part of a page, a whole page that the read's limit
// cuts when it is the first thing read (after other bytes it stays for the
// next read), and a page of a higher order (compound: can_map_frag refuses it)
// are copied and counted as copybuf; bytes outside the RX pages are copied
// but are no copybuf. Counters exact, bytes exact.
//
// The test owns c alone and calls its viewWriter directly, without the
// ReadViews lock:
// +checklocksignore
func TestReadViewsPageRule(t *testing.T) {
	mem := newViewMemory()
	pool, err := bufpool.New(bufpool.Config{Memory: mem, RingSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	big, err := bufpool.New(bufpool.Config{Memory: mem, RingSize: 8, Order: 1})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := pool.Get()
	if err != nil {
		t.Fatal(err)
	}
	hi, err := big.Get()
	if err != nil {
		t.Fatal(err)
	}
	if len(pg.Bytes()) != bufpool.PageSize4K || len(hi.Bytes()) != 2*bufpool.PageSize4K {
		t.Fatalf("page sizes %d and %d, want 4096 and 8192", len(pg.Bytes()), len(hi.Bytes()))
	}
	for i := range pg.Bytes() {
		pg.Bytes()[i] = byte(i * 3)
	}
	for i := range hi.Bytes() {
		hi.Bytes()[i] = byte(i * 5)
	}
	heap := bytes.Repeat([]byte{0x5a}, 700)

	c := &TCPConn{}
	defer func() {
		if c.cur != nil {
			c.copies.Recycle(c.cur)
		}
		if c.copies != nil {
			c.copies.Close()
		}
	}()
	type write struct {
		b      []byte
		left   int // the read's limit (0: no limit)
		mapped bool
	}
	writes := []write{
		{b: pg.Bytes(), mapped: true},                    // a whole page: mapped
		{b: pg.Bytes()[100:1600]},                        // part of a page: copybuf
		{b: pg.Bytes(), left: 1000},                      // a page max cuts, read first: copybuf
		{b: hi.Bytes()},                                  // a whole order-1 page: copybuf
		{b: hi.Bytes()[bufpool.PageSize4K:]},             // an aligned 4 KB of it: copybuf
		{b: heap},                                        // not an RX page: copied
		{b: pg.Bytes()[bufpool.PageSize4K-1:], left: 10}, // one byte of a page: copybuf
	}
	var want ViewStats
	for i, wr := range writes {
		left := wr.left
		if left == 0 {
			left = 1 << 20
		}
		w := viewWriter{c: c, mem: mem, page: bufpool.PageSize4K, left: left}
		n, _ := w.Write(wr.b)
		if want := min(len(wr.b), left); n != want {
			t.Errorf("write %d: wrote %d, want %d", i, n, want)
		}
		var got []byte
		for j := range w.views {
			v := &w.views[j]
			if v.Copied() == wr.mapped {
				t.Errorf("write %d: view %d copied %v, want %v", i, j, v.Copied(), !wr.mapped)
			}
			got = append(got, v.Bytes()...)
			if wr.mapped && &v.Bytes()[0] != &wr.b[0] {
				t.Errorf("write %d: mapped view is not the page itself", i)
			}
			v.Release()
		}
		if !bytes.Equal(got, wr.b[:n]) {
			t.Errorf("write %d: view bytes differ from the slice's", i)
		}
		if wr.mapped {
			want.MappedBytes += uint64(n)
			want.PageBytes += uint64(n)
		} else {
			want.CopiedBytes += uint64(n)
			if i != 5 {
				want.CopybufBytes += uint64(n)
			}
		}
		want.Views += uint64(len(w.views))
		c.stats = c.stats.plus(w.got)
	}
	if c.stats != want {
		t.Errorf("counts: got %+v, want %+v", c.stats, want)
	}
	// A whole page the limit cuts after other bytes of the same read stays
	// for the next read: nothing of it is taken.
	w := viewWriter{c: c, mem: mem, page: bufpool.PageSize4K, left: 3000}
	if n, err := w.Write(pg.Bytes()[:1000]); n != 1000 || err != nil {
		t.Errorf("first write of a read: got %d, %v, want 1000, nil", n, err)
	}
	if n, err := w.Write(pg.Bytes()); n != 0 || err != io.ErrShortWrite {
		t.Errorf("a cut page after 1000 bytes: got %d, %v, want 0, io.ErrShortWrite", n, err)
	}
	if got := (ViewStats{CopiedBytes: 1000, CopybufBytes: 1000, Views: 1}); w.got != got || len(w.views) != 1 {
		t.Errorf("read with a cut page: counts %+v in %d views, want %+v in 1", w.got, len(w.views), got)
	}
	for i := range w.views {
		w.views[i].Release()
	}
	if want := (ViewStats{MappedBytes: 4096, PageBytes: 4096, CopiedBytes: 1500 + 1000 + 8192 + 4096 + 700 + 1, CopybufBytes: 1500 + 1000 + 8192 + 4096 + 1, Views: 7}); c.stats != want {
		t.Errorf("counts: got %+v, want %+v", c.stats, want)
	}
	pool.Recycle(pg)
	big.Recycle(hi)
	pool.Close()
	big.Close()
	if n := pool.InUse() + big.InUse(); n != 0 {
		t.Errorf("pages in use: got %d, want 0", n)
	}
}
