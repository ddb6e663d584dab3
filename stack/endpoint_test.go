package stack

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// captureDispatcher keeps a flat copy of every packet delivered to it.
type captureDispatcher struct{ got [][]byte }

func (c *captureDispatcher) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *gstack.PacketBuffer) {
	var b []byte
	for _, s := range pkt.AsSlices() {
		b = append(b, s...)
	}
	c.got = append(c.got, b)
}

func (c *captureDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *gstack.PacketBuffer) {}

// TestDeliverChain checks what gVisor is given for a packet with frags and a
// frag_list chain: the head's bytes, then each chained packet's bytes after
// its headers, and that every page is released; payload copied, and lent.
func TestDeliverChain(t *testing.T) {
	t.Run("copy", func(t *testing.T) { testDeliverChain(t, false) })
	t.Run("zero-copy", func(t *testing.T) { testDeliverChain(t, true) })
}

func testDeliverChain(t *testing.T, zc bool) {
	pc := bufpool.Config{Poison: true}
	if zc {
		pc.Memory = newViewMemory()
	}
	pool := testutil.NewPool(t, pc)
	page, err := pool.Get()
	if err != nil {
		t.Fatal(err)
	}
	for i := range page.Bytes() {
		page.Bytes()[i] = byte(i * 7)
	}
	frag := func(off, n uint32) bufpool.Frag {
		page.IncRef()
		return bufpool.Frag{Page: page, Off: off, Len: n}
	}
	hdr := bytes.Repeat([]byte{0xee}, 20) // an Ethernet header and more
	hdr[12], hdr[13] = 0x08, 0x00

	head := bufpool.NewPacket()
	head.Linear = append(head.Linear, hdr...)
	head.HdrLen = 20
	head.Frags = append(head.Frags, frag(0, 100))
	head.Len = 120
	// A chained packet whose 30-byte linear part holds 20 header bytes and
	// 10 of payload, then a frag.
	q := bufpool.NewPacket()
	q.Linear = append(q.Linear, hdr...)
	q.Linear = append(q.Linear, page.Bytes()[1000:1010]...)
	q.HdrLen = 20
	q.Frags = append(q.Frags, frag(1010, 50))
	q.Len = 80
	head.Next = q
	// A chained packet whose headers run into its frag (header copy short).
	r := bufpool.NewPacket()
	r.Linear = append(r.Linear, hdr[:14]...)
	r.HdrLen = 20
	r.Frags = append(r.Frags, frag(2000, 66))
	r.Len = 80
	q.Next = r
	page.DecRef()

	b := page.Bytes()
	want := append(append([]byte(nil), hdr...), b[0:100]...)
	want = append(want, b[1000:1060]...)
	want = append(want, b[2006:2066]...)

	var c captureDispatcher
	ep := &linkEndpoint{}
	if zc {
		ep.lend = new(lendStats)
	}
	ep.Attach(&c)
	ep.Deliver(head)
	if len(c.got) != 1 {
		t.Fatalf("packets delivered: got %d, want 1", len(c.got))
	}
	if !bytes.Equal(c.got[0], want) {
		for i := range want {
			if i < len(c.got[0]) && c.got[0][i] != want[i] {
				t.Fatalf("delivered bytes differ first at %d of %d: got %#x, want %#x", i, len(want), c.got[0][i], want[i])
			}
		}
		t.Errorf("delivered bytes: got %d, want %d", len(c.got[0]), len(want))
	}
	if zc {
		if pool.Stats().Lent != 1 { // the page itself is released by now
			t.Error("page not lent with zero copy")
		}
		if v := ep.lend.views.Load(); v != 3 {
			t.Errorf("views lent: got %d, want 3", v)
		}
	}
	if n := pool.InUse(); n != 0 {
		t.Errorf("pages in use after Deliver: got %d, want 0", n)
	}
}
