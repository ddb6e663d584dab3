package stack

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// headOff is where the linear RQ writes a frame in its stride: after
// driver.LinearHeadroom bytes.
const headOff = driver.LinearHeadroom

// headPacket returns a packet built as the linear RQ builds one
// (driver.buildLinear): hdr and then n bytes of payload written at off of
// pg, the packet's linear part a head frag over them (SetHead), holding a
// reference on pg of its own. It returns the payload too.
func headPacket(pg *bufpool.Page, off int, hdr []byte, n int) (*bufpool.Packet, []byte) {
	b := pg.Bytes()[off:]
	copy(b, hdr)
	want := b[len(hdr) : len(hdr)+n]
	for i := range want {
		want[i] = byte(i*11 + n)
	}
	pg.IncRef()
	p := bufpool.NewPacket()
	p.SetHead(bufpool.Frag{Page: pg, Off: uint32(off), Len: uint32(len(hdr) + n)})
	p.HdrLen = len(hdr)
	p.Len = len(p.Linear)
	p.CsumVerified = true
	return p, append([]byte(nil), want...)
}

// inPage reports whether b starts at offset off of pg's bytes.
func inPage(b []byte, pg *bufpool.Page, off int) bool {
	return len(b) > 0 && &b[0] == &pg.Bytes()[off]
}

// deliveredViews returns the views of what gVisor got, from the Ethernet
// header on.
func deliveredViews(pb *gstack.PacketBuffer) [][]byte {
	var out [][]byte
	vl, off := pb.AsViewList()
	for v := vl.Front(); v != nil; v = v.Next() {
		s := v.AsSlice()
		if off >= len(s) {
			off -= len(s)
			continue
		}
		out = append(out, s[off:])
		off = 0
	}
	return out
}

// TestLendHead: with zero copy, a linear-path packet (its linear part a
// head frag: the frame in its RX stride) reaches gVisor as a copy of its
// headers and its payload lent as a view of the page, with the page lent,
// under the bounds frags have: a short payload, an IP fragment, a page
// that is not a chunk, and a page past the lent bound are copied, and
// counted as frags are. The old code copied the whole linear part.
func TestLendHead(t *testing.T) {
	tcp := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+header.TCPMinimumSize+12)
	copy(tcp, ipv4Header(header.IPv4FlagDontFragment, 0))
	for _, tc := range []struct {
		name    string
		hdr     []byte
		n       int
		maxLent int  // the lent bound; -1: one page lent already fills it
		heap    bool // the page is not a chunk
		lent    bool
		counter func(l *lendStats) uint64 // the copy's counter, for a copy
	}{
		{name: "full segment", hdr: tcp, n: 1448, lent: true},
		{name: "lendMinBytes", hdr: tcp, n: lendMinBytes, lent: true},
		{name: "short", hdr: tcp, n: lendMinBytes - 1, counter: func(l *lendStats) uint64 { return l.copiedSmall.Load() }},
		{name: "IP fragment", hdr: ipv4Header(header.IPv4FlagMoreFragments, 0), n: 1480, counter: func(l *lendStats) uint64 { return l.copiedFrag.Load() }},
		{name: "over the bound", hdr: tcp, n: 1448, maxLent: -1, counter: func(l *lendStats) uint64 { return l.copiedBound.Load() }},
		{name: "not a chunk", hdr: tcp, n: 1448, heap: true, counter: func(l *lendStats) uint64 { return l.copied.Load() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newLendRig(t, max(tc.maxLent, 0))
			if tc.maxLent < 0 {
				r.ep.lend.maxLent = 1
				r.deliver(t, tcp, 2048) // one page lent: the bound is reached
			}
			if tc.heap {
				r.pool = testutil.NewPool(t, bufpool.Config{RingSize: 8})
				t.Cleanup(r.pool.Close)
			}
			pg, err := r.pool.Get()
			if err != nil {
				t.Fatal(err)
			}
			pkt, want := headPacket(pg, headOff, tc.hdr, tc.n)
			r.pool.Recycle(pg) // the NIC retires it; the packet holds it
			views0 := r.ep.lend.views.Load()
			r.ep.Deliver(pkt)
			pb := r.held[len(r.held)-1]
			vs := deliveredViews(pb)
			var got []byte
			for _, v := range vs {
				got = append(got, v...)
			}
			hdrLen := len(tc.hdr)
			if !bytes.Equal(got[:hdrLen], tc.hdr) || !bytes.Equal(got[hdrLen:], want) {
				t.Fatalf("gVisor got %d bytes, want the headers and %d bytes of payload", len(got), tc.n)
			}
			last := vs[len(vs)-1]
			if lentView := inPage(last, pg, headOff+len(tc.hdr)); lentView != tc.lent || pg.Lent() != tc.lent {
				t.Errorf("payload a view of the page %v, page lent %v: want %v", lentView, pg.Lent(), tc.lent)
			}
			if tc.lent {
				if len(vs) != 2 || len(vs[0]) != hdrLen || len(last) != tc.n {
					t.Errorf("views: got %d (%d and %d bytes), want the headers' %d and the payload's %d", len(vs), len(vs[0]), len(last), hdrLen, tc.n)
				}
				if got := r.ep.lend.views.Load() - views0; got != 1 {
					t.Errorf("zc_views_lent: got %d more, want 1", got)
				}
			} else if got := tc.counter(r.ep.lend); got != 1 {
				t.Errorf("copy counter: got %d, want 1", got)
			}
		})
	}
}

// TestLendHeadChain: a GRO packet over the linear RQ: a head-frag head
// (its payload in its linear part), a frag (a merged head's payload moved
// by skb_gro_receive's head_frag branch) and a chained head-frag packet
// (the frag_list) is lent whole, each packet's payload a view of its page.
func TestLendHeadChain(t *testing.T) {
	r := newLendRig(t, 0)
	hdr := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+header.TCPMinimumSize)
	copy(hdr, ipv4Header(header.IPv4FlagDontFragment, 0))
	pg, err := r.pool.Get()
	if err != nil {
		t.Fatal(err)
	}
	head, want := headPacket(pg, headOff, hdr, 1448)
	second, w2 := headPacket(pg, 2048+headOff, hdr, 1448)
	head.Frags = append(head.Frags, second.TakeHead(len(hdr)))
	head.Len += int(head.Frags[0].Len)
	second.Release()
	pg2, err := r.pool.Get()
	if err != nil {
		t.Fatal(err)
	}
	chained, w3 := headPacket(pg2, headOff, hdr, 1448)
	head.Next = chained
	r.pool.Recycle(pg)
	r.pool.Recycle(pg2)
	want = append(append(want, w2...), w3...)

	r.ep.Deliver(head)
	vs := deliveredViews(r.held[len(r.held)-1])
	var got []byte
	for _, v := range vs {
		got = append(got, v...)
	}
	if n := len(hdr); !bytes.Equal(got[n:], want) {
		t.Fatalf("payload: got %d bytes, want %d (or they differ)", len(got)-n, len(want))
	}
	if len(vs) != 4 || !inPage(vs[1], pg, headOff+len(hdr)) || !inPage(vs[2], pg, 2048+headOff+len(hdr)) || !inPage(vs[3], pg2, headOff+len(hdr)) {
		t.Errorf("views: got %d, want the headers and three views of the pages", len(vs))
	}
	if got := r.ep.lend.views.Load(); got != 3 {
		t.Errorf("zc_views_lent: got %d, want 3", got)
	}
}

// TestLendHeadNoAllocs pins lending a linear-path packet's payload at zero
// heap allocations per packet once warm.
func TestLendHeadNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	pool := testutil.NewPool(t, bufpool.Config{Memory: newViewMemory(), RingSize: 64})
	var d nullDispatcher
	ep := &linkEndpoint{lend: new(lendStats)}
	ep.Attach(&d)
	hdr := make([]byte, 66)
	hdr[12], hdr[13] = 0x08, 0x00
	deliver := func() {
		pg, err := pool.Get()
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < len(pg.Bytes()); off += 2048 {
			pg.IncRef()
			p := bufpool.NewPacket()
			p.SetHead(bufpool.Frag{Page: pg, Off: uint32(off + headOff), Len: uint32(len(hdr) + 1448)})
			copy(p.Linear, hdr)
			p.HdrLen = len(hdr)
			p.Len = len(p.Linear)
			ep.Deliver(p)
		}
		pool.Recycle(pg)
	}
	for range 100 {
		deliver()
	}
	if allocs := testing.AllocsPerRun(500, deliver); allocs != 0 {
		t.Errorf("allocations per page of lent head frags: got %v, want 0", allocs)
	}
	if st := pool.Stats(); st.Lent < 600 {
		t.Errorf("pages lent %d: want every page lent", st.Lent)
	}
	pool.Close()
	if n := pool.InUse(); n != 0 {
		t.Errorf("pages in use: got %d, want 0", n)
	}
}
