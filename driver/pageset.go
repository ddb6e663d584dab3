package driver

import "github.com/ustack/ustack/bufpool"

// pageSet is a run of pages addressed as one buffer: a WQE or a SHAMPO
// data reservation. Each page holds one reference of the NIC's, and a
// bias of more that the NIC hands to the frags it writes without touching
// the page (used counts them): mlx5's pagecnt_bias
// (mlx5e_page_alloc_fragmented takes MLX5E_PAGECNT_BIAS_MAX references at
// once, mlx5e_page_release_fragmented gives back the unused ones), so that
// no frag costs an atomic operation on its page.
type pageSet struct {
	pages []*bufpool.Page
	start []int
	used  []int32
	size  int
	// hint is the page the last record ended in: frames go into a WQE in
	// order, so the next one starts there or after it.
	hint int
}

// fill takes pages from pool until the set spans at least want bytes.
func (s *pageSet) fill(pool *bufpool.Pool, want int) bool {
	s.size = 0
	for s.size < want {
		pg, err := pool.Get()
		if err != nil {
			s.release(pool)
			return false
		}
		pg.AddRefs(pageBias(pg))
		s.pages = append(s.pages, pg)
		s.start = append(s.start, s.size)
		s.used = append(s.used, 0)
		s.size += len(pg.Bytes())
	}
	return true
}

// release gives back the unused part of each page's bias and hands the
// pages back to the pool's quarantine ring.
func (s *pageSet) release(pool *bufpool.Pool) {
	for i, pg := range s.pages {
		if unused := pageBias(pg) - s.used[i]; unused > 0 {
			pg.PutRefs(unused)
		}
		pool.Recycle(pg)
		s.pages[i] = nil
	}
	s.pages, s.start, s.used, s.size, s.hint = s.pages[:0], s.start[:0], s.used[:0], 0, 0
}

// pageBias is the references the NIC takes on a page of the set at once
// (MLX5E_PAGECNT_BIAS_MAX): one per 64-byte stride, the most frames that
// can start in it, and one for a frame that began before it. A page that
// runs out (SHAMPO's payloads may be smaller) takes one at a time.
func pageBias(pg *bufpool.Page) int32 { return int32(len(pg.Bytes())/64 + 1) }

// write copies src to offset off of the set and records the pages it
// touched in cqe's frags, taking a reference on each new one.
func (s *pageSet) write(cqe *CQE, off int, src []byte) { s.record(cqe, off, len(src), src) }

// claim records the n bytes at offset off, which a direct read already
// put there, in cqe's frags as write does, without copying.
func (s *pageSet) claim(cqe *CQE, off, n int) { s.record(cqe, off, n, nil) }

// record is write (src not nil: its n bytes are copied) and claim.
func (s *pageSet) record(cqe *CQE, off, n int, src []byte) {
	pi := s.find(off)
	for n > 0 {
		var b []byte
		pi, b = s.at(pi, off)
		pg, po := s.pages[pi], off-s.start[pi]
		c := min(n, len(b))
		if src != nil {
			copy(b, src[:c])
			src = src[c:]
		}
		if k := int(cqe.NFrags); k > 0 && cqe.Frags[k-1].Page == pg {
			cqe.Frags[k-1].Len += uint32(c)
		} else {
			if s.used[pi] < pageBias(pg) {
				s.used[pi]++ // one of the bias
			} else {
				pg.IncRef()
			}
			cqe.Frags[k] = bufpool.Frag{Page: pg, Off: uint32(po), Len: uint32(c)}
			cqe.NFrags++
		}
		n -= c
		off += c
	}
	s.hint = pi
}

// find returns the index of a page at or before the one holding offset
// off: the hint if it starts at or before off (the common case, a frame
// after the last one), else the last page that does.
func (s *pageSet) find(off int) int {
	pi := s.hint
	if pi >= len(s.pages) {
		pi = len(s.pages) - 1
	}
	for pi > 0 && s.start[pi] > off {
		pi--
	}
	return pi
}

// at returns the index of the page holding offset off, searching forward
// from page pi (at or before it), and that page's bytes from off on.
func (s *pageSet) at(pi, off int) (int, []byte) {
	for off-s.start[pi] >= len(s.pages[pi].Bytes()) {
		pi++
	}
	return pi, s.pages[pi].Bytes()[off-s.start[pi]:]
}

// slices appends to iov the set's bytes from offset off on, up to n bytes
// in at most max slices (one per page), and returns iov and the bytes the
// appended slices cover.
func (s *pageSet) slices(iov [][]byte, off, n, max int) ([][]byte, int) {
	pi, covered := s.find(off), 0
	for covered < n && max > 0 {
		var b []byte
		pi, b = s.at(pi, off)
		b = b[:min(len(b), n-covered)]
		iov = append(iov, b)
		covered += len(b)
		off += len(b)
		max--
	}
	return iov, covered
}

// read copies len(dst) bytes of the set from offset off into dst.
func (s *pageSet) read(dst []byte, off int) {
	pi := s.find(off)
	for len(dst) > 0 {
		var b []byte
		pi, b = s.at(pi, off)
		c := copy(dst, b)
		dst = dst[c:]
		off += c
	}
}
