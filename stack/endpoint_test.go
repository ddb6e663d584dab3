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
	// The head's frags, a chained packet whose linear part holds payload,
	// and one whose headers run into its frag (chainPacket).
	head, want := chainPacket(page), chainWant(page)
	page.DecRef()

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
