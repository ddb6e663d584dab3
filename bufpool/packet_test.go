package bufpool

import (
	"bytes"
	"testing"
)

// TestPacketHead checks the head frag (skb->head_frag): SetHead makes a
// frag of a page the linear part without a copy, holding the frag's page
// reference; Release drops it; TakeHead moves it into a Frag.
func TestPacketHead(t *testing.T) {
	pool := newTestPool(t, Config{Poison: true})
	pg := mustGet(t, pool)
	for i := range pg.Bytes() {
		pg.Bytes()[i] = byte(i * 7)
	}
	want := append([]byte(nil), pg.Bytes()[64:64+1514]...)

	t.Run("Release", func(t *testing.T) {
		p := NewPacket()
		pg.IncRef()
		p.SetHead(Frag{Page: pg, Off: 64, Len: 1514})
		if got := pg.Refs(); got != 2 {
			t.Fatalf("page refs with a head: got %d, want 2", got)
		}
		if !bytes.Equal(p.Linear, want) || &p.Linear[0] != &pg.Bytes()[64] {
			t.Fatalf("Linear is not the page's bytes at 64")
		}
		if got := cap(p.Linear); got != 1514 {
			t.Errorf("cap(Linear): got %d, want 1514 (an append must not write into the page)", got)
		}
		b := make([]byte, 2000)
		if n := p.CopyTo(b); n != 1514 || !bytes.Equal(b[:n], want) {
			t.Errorf("CopyTo: got %d bytes, want the 1514 of the head", n)
		}
		p.Release()
		if got := pg.Refs(); got != 1 {
			t.Errorf("page refs after Release: got %d, want 1", got)
		}
	})
	t.Run("TakeHead", func(t *testing.T) {
		p := NewPacket()
		pg.IncRef()
		p.SetHead(Frag{Page: pg, Off: 64, Len: 1514})
		f := p.TakeHead(66)
		if f.Page != pg || f.Off != 130 || f.Len != 1448 || !bytes.Equal(f.Bytes(), want[66:]) {
			t.Errorf("TakeHead(66): got {off %d len %d}, want {off 130 len 1448} of the page", f.Off, f.Len)
		}
		if p.Head != nil || len(p.Linear) != 0 {
			t.Errorf("after TakeHead: Head %v, len(Linear) %d, want nil, 0", p.Head, len(p.Linear))
		}
		p.Release()
		if got := pg.Refs(); got != 2 {
			t.Errorf("page refs after Release with the head taken: got %d, want 2 (the frag's)", got)
		}
		f.Page.DecRef()
	})
	allocs := testing.AllocsPerRun(1000, func() {
		p := NewPacket()
		pg.IncRef()
		p.SetHead(Frag{Page: pg, Off: 0, Len: 100})
		p.Release()
	})
	if allocs != 0 {
		t.Errorf("SetHead and Release: got %v allocations, want 0", allocs)
	}
	pool.Recycle(pg)
}
