package bufpool

import (
	"bytes"
	"testing"
)

// walkPage returns a page whose bytes are a known pattern, so that a frag's
// bytes tell where they came from; it is recycled at cleanup.
func walkPage(t testing.TB, pool *Pool) *Page {
	t.Helper()
	pg := mustGet(t, pool)
	b := pg.Bytes()
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[i%36]
	}
	t.Cleanup(func() { pool.Recycle(pg) })
	return pg
}

// piece is one slice of a walk: its bytes, the index of its packet in the
// chain, and its frag index in that packet (-1: the linear part).
type piece struct {
	s         string
	pkt, frag int
}

// walkPieces walks p from skip and checks that each slice is non-empty and
// aliases the end of its linear part or frag.
func walkPieces(t *testing.T, p *Packet, skip int) []piece {
	t.Helper()
	var got []piece
	chain := map[*Packet]int{}
	for q, i := p, 0; q != nil; q, i = q.Next, i+1 {
		chain[q] = i
	}
	w := p.Walk(skip)
	if w.Bytes() != nil || w.Frag() != nil {
		t.Errorf("before Next: Bytes %q, Frag %v; want nil, nil", w.Bytes(), w.Frag())
	}
	for w.Next() {
		b, q := w.Bytes(), w.Packet()
		pi, ok := chain[q]
		if !ok {
			t.Fatalf("Packet() = %p: not in the chain", q)
		}
		src, fi := q.Linear, -1
		if f := w.Frag(); f != nil {
			src = f.Bytes()
			for i := range q.Frags {
				if &q.Frags[i] == f {
					fi = i
				}
			}
			if fi < 0 {
				t.Fatalf("Frag() = %p: not one of packet %d's frags", f, pi)
			}
		}
		if len(b) == 0 || len(b) > len(src) || &b[len(b)-1] != &src[len(src)-1] {
			t.Fatalf("slice %q (packet %d, frag %d) is not a non-empty suffix of its source %q", b, pi, fi, src)
		}
		got = append(got, piece{string(b), pi, fi})
	}
	if w.Bytes() != nil || w.Frag() != nil || w.Packet() != nil {
		t.Errorf("after the last Next: Bytes %q, Frag %v, Packet %v; want nil", w.Bytes(), w.Frag(), w.Packet())
	}
	if w.Next() {
		t.Errorf("Next after the end: got true, want false")
	}
	return got
}

func TestWalk(t *testing.T) {
	pool := newTestPool(t, Config{})
	pg := walkPage(t, pool)
	frag := func(off, n uint32) Frag { return Frag{Page: pg, Off: off, Len: n} }
	pkt := func(linear string, hdrLen int, frags ...Frag) *Packet {
		return &Packet{Linear: []byte(linear), HdrLen: hdrLen, Frags: frags}
	}
	chain := func(ps ...*Packet) *Packet {
		for i := range len(ps) - 1 {
			ps[i].Next = ps[i+1]
		}
		return ps[0]
	}
	for _, tc := range []struct {
		name string
		p    *Packet
		skip int
		want []piece
	}{
		{"linear only", pkt("HHHHpay", 4), 0, []piece{{"HHHHpay", 0, -1}}},
		{"linear only, skip inside", pkt("HHHHpay", 4), 4, []piece{{"pay", 0, -1}}},
		{"linear only, skip to its end", pkt("HHHHpay", 4), 7, nil},
		{"linear only, skip past everything", pkt("HHHHpay", 4), 100, nil},
		{"empty", pkt("", 0), 0, nil},
		{"frags", pkt("HHHH", 4, frag(0, 3), frag(10, 2)), 0,
			[]piece{{"HHHH", 0, -1}, {"abc", 0, 0}, {"kl", 0, 1}}},
		{"frags, skip the linear part", pkt("HHHH", 4, frag(0, 3), frag(10, 2)), 4,
			[]piece{{"abc", 0, 0}, {"kl", 0, 1}}},
		{"frags, skip inside the linear part", pkt("HHHH", 4, frag(0, 3)), 2,
			[]piece{{"HH", 0, -1}, {"abc", 0, 0}}},
		{"frags, skip inside a frag", pkt("HHHH", 4, frag(0, 3), frag(10, 2)), 5,
			[]piece{{"bc", 0, 0}, {"kl", 0, 1}}},
		{"frags, skip to a frag's end", pkt("HHHH", 4, frag(0, 3), frag(10, 2)), 7,
			[]piece{{"kl", 0, 1}}},
		{"frags, skip inside the last frag", pkt("HHHH", 4, frag(0, 3), frag(10, 2)), 8,
			[]piece{{"l", 0, 1}}},
		{"frags, skip past everything", pkt("HHHH", 4, frag(0, 3), frag(10, 2)), 9, nil},
		{"frags, no linear part", pkt("", 0, frag(0, 3)), 1, []piece{{"bc", 0, 0}}},
		{"empty frag skipped", pkt("H", 1, frag(0, 0), frag(3, 1)), 0,
			[]piece{{"H", 0, -1}, {"d", 0, 1}}},
		{"chain", chain(pkt("HHpay", 2, frag(0, 2)), pkt("hhq", 2, frag(5, 2)), pkt("hr", 2)), 2,
			[]piece{{"pay", 0, -1}, {"ab", 0, 0}, {"q", 1, -1}, {"fg", 1, 0}}},
		{"chain, skip 0 keeps the head's headers only", chain(pkt("HH", 2), pkt("hhq", 2)), 0,
			[]piece{{"HH", 0, -1}, {"q", 1, -1}}},
		{"chain, HdrLen into a frag", chain(pkt("HH", 2), pkt("hh", 4, frag(0, 3), frag(20, 1))), 2,
			[]piece{{"c", 1, 0}, {"u", 1, 1}}},
		{"chain, HdrLen past everything", chain(pkt("HHp", 2), pkt("hh", 9, frag(0, 3)), pkt("hhr", 2)), 2,
			[]piece{{"p", 0, -1}, {"r", 2, -1}}},
		{"chain, skip past the head", chain(pkt("HHp", 2, frag(0, 1)), pkt("hhq", 2, frag(5, 1))), 50,
			[]piece{{"q", 1, -1}, {"f", 1, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := walkPieces(t, tc.p, tc.skip)
			if len(got) != len(tc.want) {
				t.Fatalf("Walk(%d): got %v, want %v", tc.skip, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("Walk(%d) slice %d: got %+v, want %+v", tc.skip, i, got[i], tc.want[i])
				}
			}
			var flat []byte
			for _, pc := range tc.want {
				flat = append(flat, pc.s...)
			}
			b := make([]byte, len(flat)+8)
			if tc.skip == 0 {
				if n := tc.p.CopyTo(b); !bytes.Equal(b[:n], flat) {
					t.Errorf("CopyTo: got %q, want %q", b[:n], flat)
				}
			}
		})
	}
}

// FuzzWalk checks the walk against a plain reference on packets and chains
// of any shape: the slices are non-empty suffixes of their sources (see
// walkPieces), and their concatenation is the head's bytes after skip
// followed by each chained packet's after its HdrLen.
func FuzzWalk(f *testing.F) {
	f.Add([]byte{5, 2, 10, 0}, uint16(3))
	f.Add([]byte{5, 2, 10, 0, 3, 1, 4, 2}, uint16(0))
	f.Add([]byte{0, 3, 7, 0, 2, 0, 9, 40, 1, 5, 1}, uint16(12))
	f.Add([]byte{20, 1, 200, 1, 3, 0, 2, 200}, uint16(300))
	// A chain of three: skip inside the head, and past it.
	f.Add([]byte{4, 1, 2, 0, 5, 3, 1, 1, 2, 3, 2, 0, 1}, uint16(1))
	f.Add([]byte{4, 1, 2, 0, 5, 3, 1, 1, 2, 3, 2, 0, 1}, uint16(20))
	f.Fuzz(func(t *testing.T, shape []byte, skip uint16) {
		pool := newTestPool(t, Config{})
		pg := walkPage(t, pool)
		var head, tail *Packet
		var want []byte
		flat := func(q *Packet) []byte {
			b := append([]byte(nil), q.Linear...)
			for _, fr := range q.Frags {
				b = append(b, fr.Bytes()...)
			}
			return b
		}
		next := func() int {
			if len(shape) == 0 {
				return 0
			}
			v := int(shape[0])
			shape = shape[1:]
			return v
		}
		// Each packet: linear length, frag count (mod 5), HdrLen, frag
		// lengths; at most 6 packets.
		for n := 0; len(shape) > 0 && n < 6; n++ {
			q := &Packet{Linear: bytes.Repeat([]byte{'A' + byte(n)}, next())}
			frags := next() % 5
			q.HdrLen = next()
			for range frags {
				q.Frags = append(q.Frags, Frag{Page: pg, Off: uint32(next() * 7), Len: uint32(next())})
			}
			s := q.HdrLen
			if head == nil {
				head, s = q, int(skip)
			} else {
				tail.Next = q
			}
			tail = q
			b := flat(q)
			want = append(want, b[min(s, len(b)):]...)
		}
		if head == nil {
			return
		}
		var got []byte
		for _, pc := range walkPieces(t, head, int(skip)) {
			got = append(got, pc.s...)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("Walk(%d): got %q, want %q", skip, got, want)
		}
	})
}

// walkShapes are packets to walk in the allocation test and the benchmark:
// a plain frame, a 64 KB LRO/GRO packet of 1448-byte segments over 4 KB
// pages, and a GRO chain of 16 such frames (the slow path).
func walkShapes(t testing.TB, pool *Pool) []struct {
	name string
	p    *Packet
} {
	pg := walkPage(t, pool)
	frame := func(frags int) *Packet {
		p := &Packet{Linear: make([]byte, 66), HdrLen: 66}
		for i := range frags {
			p.Frags = append(p.Frags, Frag{Page: pg, Off: uint32(i%2) * 2048, Len: 1448})
		}
		return p
	}
	chain := frame(1)
	for q, i := chain, 1; i < 16; q, i = q.Next, i+1 {
		q.Next = frame(1)
	}
	return []struct {
		name string
		p    *Packet
	}{{"frame", frame(1)}, {"gro64k", frame(45)}, {"chain16", chain}}
}

// TestWalkAllocs pins that a walk allocates nothing.
func TestWalkAllocs(t *testing.T) {
	pool := newTestPool(t, Config{})
	for _, sh := range walkShapes(t, pool) {
		n := 0
		if got := testing.AllocsPerRun(100, func() {
			for w := sh.p.Walk(sh.p.HdrLen); w.Next(); {
				n += len(w.Bytes())
			}
		}); got != 0 {
			t.Errorf("%s: allocations per walk: got %v, want 0", sh.name, got)
		}
	}
}

func BenchmarkWalk(b *testing.B) {
	pool := newTestPool(b, Config{})
	for _, sh := range walkShapes(b, pool) {
		b.Run(sh.name, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				for w := sh.p.Walk(sh.p.HdrLen); w.Next(); {
					n += len(w.Bytes())
				}
			}
			if n == 0 {
				b.Fatal("walked nothing")
			}
		})
	}
}
