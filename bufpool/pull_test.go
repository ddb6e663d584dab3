package bufpool

import (
	"bytes"
	"testing"
)

// TestPullTail checks __pskb_pull_tail's model: the first n bytes of the
// frags move to the end of the linear part, in order, frags it empties go
// with their page reference, Len stays, and it stops at what the frags
// hold, at the linear part's capacity, and at a head frag.
func TestPullTail(t *testing.T) {
	pool := newTestPool(t, Config{Poison: true})
	pg := mustGet(t, pool)
	for i := range pg.Bytes() {
		pg.Bytes()[i] = byte(i * 7)
	}
	// The frame: 8 linear bytes, then frags of 10, 20 and 30 bytes.
	frame := make([]byte, 0, 68)
	frame = append(frame, "linear.."...)
	frags := []Frag{{Page: pg, Off: 100, Len: 10}, {Page: pg, Off: 200, Len: 20}, {Page: pg, Off: 300, Len: 30}}
	for _, f := range frags {
		frame = append(frame, f.Bytes()...)
	}
	build := func(linear int) *Packet {
		p := NewPacket()
		p.Linear = append(p.Linear, make([]byte, linear-8)...)
		p.Linear = append(p.Linear, frame[:8]...)
		for _, f := range frags {
			pg.IncRef()
			p.Frags = append(p.Frags, f)
		}
		p.Len = len(p.Linear) + 60
		return p
	}
	for _, tc := range []struct {
		name      string
		linear, n int
		want      int // bytes moved
		wantFrags int
	}{
		{"within the first frag", 8, 6, 6, 3},
		{"the first frag exactly", 8, 10, 10, 2},
		{"across two frags", 8, 25, 25, 2},
		{"every frag", 8, 60, 60, 0},
		{"more than the frags hold", 8, 100, 60, 0},
		{"nothing", 8, 0, 0, 3},
		{"up to the linear part's capacity", MaxLinear - 12, 30, 12, 2},
		{"a full linear part", MaxLinear, 30, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := build(tc.linear)
			refs := pg.Refs()
			if got := p.PullTail(tc.n); got != tc.want {
				t.Fatalf("PullTail(%d): got %d, want %d", tc.n, got, tc.want)
			}
			if got := len(p.Frags); got != tc.wantFrags {
				t.Errorf("frags: got %d, want %d", got, tc.wantFrags)
			}
			if got, want := pg.Refs(), refs-int32(3-tc.wantFrags); got != want {
				t.Errorf("page refs: got %d, want %d (one dropped per emptied frag)", got, want)
			}
			if got, want := len(p.Linear), tc.linear+tc.want; got != want {
				t.Errorf("linear part: got %d bytes, want %d", got, want)
			}
			if p.Len != tc.linear+60 {
				t.Errorf("Len: got %d, want %d (unchanged)", p.Len, tc.linear+60)
			}
			b := make([]byte, p.Len)
			if n := p.CopyTo(b); n != p.Len || !bytes.Equal(b[tc.linear-8:], frame) {
				t.Errorf("frame after the pull differs:\ngot  %x\nwant %x", b[tc.linear-8:n], frame)
			}
			p.Release()
		})
	}
	t.Run("head frag", func(t *testing.T) {
		p := NewPacket()
		pg.IncRef()
		p.SetHead(Frag{Page: pg, Off: 0, Len: 8})
		pg.IncRef()
		p.Frags = append(p.Frags, frags[0])
		if got := p.PullTail(4); got != 0 || len(p.Linear) != 8 || len(p.Frags) != 1 {
			t.Errorf("PullTail(4) on a head frag: moved %d, linear %d, frags %d; want 0, 8, 1", got, len(p.Linear), len(p.Frags))
		}
		p.Release()
	})
	allocs := testing.AllocsPerRun(1000, func() {
		p := build(8)
		p.PullTail(25)
		p.Release()
	})
	if allocs != 0 {
		t.Errorf("PullTail: got %v allocations, want 0", allocs)
	}
	if got := pg.Refs(); got != 1 {
		t.Errorf("page refs at the end: got %d, want 1", got)
	}
	pool.Recycle(pg)
}
