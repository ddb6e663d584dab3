package stack

import (
	"bytes"
	"github.com/ustack/ustack/internal/testutil"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
)

// viewsDispatcher records, for every packet delivered to it, the sizes of
// its buffer's views (the frame's, from the Ethernet header on) and its
// bytes.
type viewsDispatcher struct {
	sizes [][]int
	got   [][]byte
}

func (d *viewsDispatcher) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *gstack.PacketBuffer) {
	var sizes []int
	var b []byte
	vl, off := pkt.AsViewList()
	for v := vl.Front(); v != nil; v = v.Next() {
		s := v.AsSlice()
		if off >= len(s) {
			off -= len(s)
			continue
		}
		sizes = append(sizes, len(s)-off)
		b = append(b, s[off:]...)
		off = 0
	}
	d.sizes = append(d.sizes, sizes)
	d.got = append(d.got, b)
}

func (d *viewsDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *gstack.PacketBuffer) {}

// chainPacket builds the frag_list packet of TestDeliverChain and TestDeliverChainViews on page: a
// head with a 20-byte linear part and a 100-byte frag, a chained packet
// whose linear part holds its 20 header bytes and 10 of payload, then a
// 50-byte frag, and one whose headers run 6 bytes into its frag. It returns
// the packet; chainWant the bytes gVisor must see.
func chainPacket(page *bufpool.Page) *bufpool.Packet {
	frag := func(off, n uint32) bufpool.Frag {
		page.IncRef()
		return bufpool.Frag{Page: page, Off: off, Len: n}
	}
	hdr := chainHdr[:]
	head := bufpool.NewPacket()
	head.Linear = append(head.Linear, hdr...)
	head.HdrLen = 20
	head.Frags = append(head.Frags, frag(0, 100))
	head.Len = 120
	q := bufpool.NewPacket()
	q.Linear = append(q.Linear, hdr...)
	q.Linear = append(q.Linear, page.Bytes()[1000:1010]...)
	q.HdrLen = 20
	q.Frags = append(q.Frags, frag(1010, 50))
	q.Len = 80
	head.Next = q
	r := bufpool.NewPacket()
	r.Linear = append(r.Linear, hdr[:14]...)
	r.HdrLen = 20
	r.Frags = append(r.Frags, frag(2000, 66))
	r.Len = 80
	q.Next = r
	return head
}

// chainHdr is chainPacket's header bytes: an IPv4 Ethernet header and more.
var chainHdr = [20]byte{0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0x08, 0x00, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee}

// chainWant returns the frame gVisor is to get for chainPacket(page).
func chainWant(page *bufpool.Page) []byte {
	b := page.Bytes()
	want := append(append([]byte(nil), chainHdr[:]...), b[0:100]...)
	want = append(want, b[1000:1060]...)
	return append(want, b[2006:2066]...)
}

// TestDeliverChainViews checks that a GRO frag_list packet reaches gVisor
// with the skb's structure, not flattened: copied, one view for the linear
// part, one for the head's frags and one per chained packet's payload;
// lent, one view per linear remainder and per frag, none cut into the view
// before it. The bytes are exact.
func TestDeliverChainViews(t *testing.T) {
	for _, tc := range []struct {
		name string
		zc   bool
		want []int
	}{
		{"copy", false, []int{20, 100, 60, 60}},
		{"zero-copy", true, []int{20, 100, 10, 50, 60}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := bufpool.Config{Poison: true}
			if tc.zc {
				pc.Memory = newViewMemory()
			}
			pool, err := bufpool.New(pc)
			if err != nil {
				t.Fatal(err)
			}
			page, err := pool.Get()
			if err != nil {
				t.Fatal(err)
			}
			for i := range page.Bytes() {
				page.Bytes()[i] = byte(i * 7)
			}
			pkt, want := chainPacket(page), chainWant(page)
			page.DecRef()
			var d viewsDispatcher
			ep := &linkEndpoint{}
			if tc.zc {
				ep.lend = new(lendStats)
			}
			ep.Attach(&d)
			ep.Deliver(pkt)
			if len(d.got) != 1 {
				t.Fatalf("packets delivered: got %d, want 1", len(d.got))
			}
			if !bytes.Equal(d.got[0], want) {
				t.Errorf("delivered bytes differ (%d bytes, want %d)", len(d.got[0]), len(want))
			}
			if got := d.sizes[0]; !equalInts(got, tc.want) {
				t.Errorf("view sizes: got %v, want %v", got, tc.want)
			}
			if n := pool.InUse(); n != 0 {
				t.Errorf("pages in use after Deliver: got %d, want 0", n)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDeliverChainNoAllocs pins the frag_list packet's way to gVisor, copied
// and lent, at zero heap allocations per packet once warm.
func TestDeliverChainNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	for _, zc := range []bool{false, true} {
		pc := bufpool.Config{RingSize: 64}
		if zc {
			pc.Memory = newViewMemory()
		}
		pool, err := bufpool.New(pc)
		if err != nil {
			t.Fatal(err)
		}
		var d nullDispatcher
		ep := &linkEndpoint{}
		if zc {
			ep.lend = new(lendStats)
		}
		ep.Attach(&d)
		deliver := func() {
			pg, err := pool.Get()
			if err != nil {
				t.Fatal(err)
			}
			pkt := chainPacket(pg)
			pool.Recycle(pg) // the NIC retires it; the frags hold it
			ep.Deliver(pkt)
		}
		for range 100 {
			deliver()
		}
		if allocs := testing.AllocsPerRun(500, deliver); allocs != 0 {
			t.Errorf("zero copy %v: allocations per frag_list packet: got %v, want 0", zc, allocs)
		}
		pool.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("zero copy %v: pages in use: got %d, want 0", zc, n)
		}
	}
}

// TestFragListBulk sends bulk TCP through the nonlinear path with a fixed
// 256-byte header copy (MTU 9000: the frame does not fit a stride, so the
// payload in the linear part sends GRO merges to the frag_list) and checks
// every byte (SHA-256), copied and lent, and that frag_list merges happened.
func TestFragListBulk(t *testing.T) {
	for _, zc := range []bool{false, true} {
		name := "copy"
		if zc {
			name = "zero-copy"
		}
		t.Run(name, func(t *testing.T) {
			rxCfg := Config{Driver: driver.Config{HDS: 256, MTU: 9000}, ZeroCopy: zc,
				Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}}
			peerCfg := Config{Driver: driver.Config{MTU: 9000}, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}}
			rx, peer := newPair(t, rxCfg, peerCfg)
			bulkTo(t, rx, peer, netip.MustParseAddrPort("192.0.2.1:9"), 8<<20)
			if c := counterMap(rx); c["rx_gro_frag_list"] == 0 {
				t.Errorf("rx_gro_frag_list: got 0, want frag_list merges (rx_gro_packets %d)", c["rx_gro_packets"])
			}
		})
	}
}
