package gro

import (
	"github.com/ustack/ustack/internal/testutil"
	"testing"

	"github.com/ustack/ustack/bufpool"
)

// headFragPacket writes frame into pg at off and returns a packet whose
// linear part is the frame there, a head frag (mlx5's linear RQ:
// build_skb over the stride), holding its own reference on pg.
func headFragPacket(pg *bufpool.Page, off int, b built) *bufpool.Packet {
	copy(pg.Bytes()[off:], b.frame)
	pg.IncRef()
	p := bufpool.NewPacket()
	p.SetHead(bufpool.Frag{Page: pg, Off: uint32(off), Len: uint32(len(b.frame))})
	p.Len = len(b.frame)
	p.HdrLen = b.hlen
	p.CsumVerified = true
	return p
}

// TestHeadFragMerge checks skb_gro_receive's head_frag branch: segments
// whose linear part holds payload but is a head frag are merged by frags
// (the payload after the headers, in its page, then the segment's own
// frags), not by the frag_list; the head keeps its linear part.
func TestHeadFragMerge(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		pool := testutil.NewPoisonPool(t)
		bd := newBuilder()
		var ins []built
		for range 8 {
			ins = append(ins, bd.build(seg{n: 1448 - 20*boolInt(v6), v6: v6}))
		}
		c := &collect{}
		e := New(Config{}, c)
		var pages []*bufpool.Page
		for i, b := range ins {
			if i%2 == 0 {
				pg, err := pool.Get()
				if err != nil {
					t.Fatal(err)
				}
				pages = append(pages, pg)
			}
			// Two 2 KB strides a page, each frame after 64 bytes of
			// headroom.
			e.Receive(headFragPacket(pages[len(pages)-1], i%2*2048+64, b), 0)
		}
		e.EndBatch(0)
		if len(c.got) != 1 {
			t.Fatalf("v6 %v: packets: got %d, want 1", v6, len(c.got))
		}
		p := c.got[0]
		if err := checkMerged(p, ins); err != nil {
			t.Errorf("v6 %v: %v", v6, err)
		}
		if p.Next != nil || e.Stats().FragList.Load() != 0 {
			t.Errorf("v6 %v: merged by the frag_list (%d), want by frags", v6, e.Stats().FragList.Load())
		}
		if p.Head == nil || len(p.Linear) != len(ins[0].frame) {
			t.Errorf("v6 %v: head's linear part: got %d bytes (head frag %v), want its whole frame", v6, len(p.Linear), p.Head != nil)
		}
		if got, want := len(p.Frags), len(ins)-1; got != want {
			t.Errorf("v6 %v: frags: got %d, want %d (one per merged head)", v6, got, want)
		}
		for i, f := range p.Frags {
			if want := uint32((i+1)%2*2048 + 64 + ins[i+1].hlen); f.Off != want || f.Page != pages[(i+1)/2] {
				t.Errorf("v6 %v: frag %d at offset %d, want %d of page %d", v6, i, f.Off, want, (i+1)/2)
			}
		}
		c.release()
		for _, pg := range pages {
			if got := pg.Refs(); got != 1 {
				t.Errorf("v6 %v: page refs after release: got %d, want 1 (ours)", v6, got)
			}
			pg.DecRef()
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestHeadFragMergeNoAllocs pins the head_frag merge at zero allocations
// per packet.
func TestHeadFragMergeNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	pool := testutil.NewPoisonPool(t)
	bd := newBuilder()
	var ins []built
	for range 8 {
		ins = append(ins, bd.build(seg{n: 1448}))
	}
	pages := make([]*bufpool.Page, 4)
	for i := range pages {
		pg, err := pool.Get()
		if err != nil {
			t.Fatal(err)
		}
		pages[i] = pg
	}
	r := &releaser{}
	e := New(Config{}, r)
	batch := func() {
		for i, b := range ins {
			e.Receive(headFragPacket(pages[i/2], i%2*2048+64, b), 0)
		}
		e.EndBatch(0)
	}
	batch()
	if got := testing.AllocsPerRun(100, batch); got != 0 {
		t.Errorf("allocations per batch of 8 head-frag segments: got %v, want 0", got)
	}
	if got := e.Stats().FragList.Load(); got != 0 {
		t.Errorf("frag_list merges: got %d, want 0", got)
	}
	for _, pg := range pages {
		pg.DecRef()
	}
}
