package bufpool

import "testing"

// TestRxMeta checks that a frame's header offsets go to the packet Build
// makes of it and its RSS hash does not (an xdp_frame carries none: a
// packet built on a cpumap worker has no hash), and that Release clears
// the RxMeta, so that a packet from the cache says "unknown".
func TestRxMeta(t *testing.T) {
	pool := newTestPool(t, Config{})
	pg := mustGet(t, pool)
	m := RxMeta{NetworkHeader: 14, TransportHeader: 34, HeadersSet: true, Hash: 0x51ccc178, HashType: HashL4}
	f := Frame{Head: Frag{Page: pg, Off: 0, Len: 60}, RxMeta: m}
	p := f.Build(NewPacket())
	want := m
	want.Hash, want.HashType = 0, HashNone
	if p.RxMeta != want {
		t.Errorf("Build: got %+v, want the frame's offsets without its hash %+v", p.RxMeta, want)
	}
	p.Release()
	// The cache may hand back another packet; fill a few and check each.
	for range 4 {
		q := NewPacket()
		q.RxMeta = m
		q.Release()
	}
	for range 4 {
		q := NewPacket()
		if q.RxMeta != (RxMeta{}) {
			t.Errorf("packet from the cache: got %+v, want the zero RxMeta", q.RxMeta)
		}
		defer q.Release()
	}
}
