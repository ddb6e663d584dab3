package bufpool

// Walker is a cursor over a packet's bytes, as Packet.Walk returns it. It is
// a value with no heap state: walking allocates nothing.
type Walker struct {
	p    *Packet // the packet the current slice is in; nil once done
	i    int     // the current slice of p: 0 its Linear, i > 0 Frags[i-1]
	skip int     // bytes of p still to skip
	b    []byte  // the current slice
}

// Walk returns a cursor over the bytes p carries from offset skip on, in
// order: what is left of the linear part, then the frags, then, for each
// packet chained on Next, its bytes after its own HdrLen (its headers,
// which the head's stand for: a GRO frag_list, see gro's package doc).
// skip (>= 0) counts within the head only; a skip past all of the head's
// bytes leaves none of them, and the chain's payload still follows. A
// HdrLen or skip longer than the linear part goes on into the frags. It is
// the walk of the kernel's skb_copy_bits and __skb_to_sgvec over an skb and
// its frag_list, whose members' data already starts past their headers.
//
// Use it as
//
//	for w := p.Walk(skip); w.Next(); {
//		use(w.Bytes())
//	}
//
// The slices alias the packet's memory (its linear array and the RX pages
// its frags reference): they borrow it, are valid until the packet is
// released, and must not be written to unless the caller may write the
// packet. The packet and its chain must not change during the walk.
func (p *Packet) Walk(skip int) Walker { return Walker{p: p, i: -1, skip: skip} }

// Next moves to the next slice of the walk, skipping empty ones, and
// reports whether there is one.
func (w *Walker) Next() bool {
	for w.p != nil {
		w.i++
		var b []byte
		switch {
		case w.i == 0:
			b = w.p.Linear
		case w.i <= len(w.p.Frags):
			b = w.p.Frags[w.i-1].Bytes()
		default: // on to the next packet of the chain, past its headers
			w.p, w.i = w.p.Next, -1
			if w.p != nil {
				w.skip = w.p.HdrLen
			}
			continue
		}
		if w.skip >= len(b) {
			w.skip -= len(b)
			continue
		}
		w.b, w.skip = b[w.skip:], 0
		return true
	}
	w.b = nil
	return false
}

// Bytes returns the current slice: a non-empty suffix of a linear part or
// of a frag's bytes. It is nil before the first Next and after the last.
func (w *Walker) Bytes() []byte { return w.b }

// Frag returns the frag the current slice lies in, its last len(Bytes())
// bytes, or nil when the slice is a linear part. The frag is the packet's,
// borrowed as the slice is.
func (w *Walker) Frag() *Frag {
	if w.p == nil || w.i < 1 {
		return nil
	}
	return &w.p.Frags[w.i-1]
}

// Packet returns the packet the current slice belongs to: the head Walk
// was called on, or one chained on it; nil after the last slice.
func (w *Walker) Packet() *Packet { return w.p }
