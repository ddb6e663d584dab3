package stack

import (
	"bytes"
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// lendRig is a zero-copy link endpoint over a pool of chunk pages, with a
// dispatcher that keeps what gVisor is given (as a socket's queue would).
type lendRig struct {
	pool *bufpool.Pool
	ep   *linkEndpoint
	held []*gstack.PacketBuffer
}

func newLendRig(t *testing.T, maxLent int) *lendRig {
	t.Helper()
	pool := testutil.NewPool(t, bufpool.Config{Memory: newViewMemory(), RingSize: 64, Poison: true})
	r := &lendRig{pool: pool}
	r.ep = &linkEndpoint{lend: newLendStats(pool, maxLent)}
	r.ep.Attach(&keepDispatcher{keep: &r.held})
	t.Cleanup(func() {
		for _, pb := range r.held {
			pb.DecRef()
		}
		pool.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("pages in use after Close: got %d, want 0", n)
		}
	})
	return r
}

// ipv4Header is an Ethernet and IPv4 header, with fragment flags and
// offset as given.
func ipv4Header(flags uint8, fragOff uint16) []byte {
	b := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize)
	header.Ethernet(b).Encode(&header.EthernetFields{Type: header.IPv4ProtocolNumber})
	header.IPv4(b[header.EthernetMinimumSize:]).Encode(&header.IPv4Fields{
		TotalLength: header.IPv4MinimumSize, TTL: 64, Protocol: uint8(header.UDPProtocolNumber),
		Flags: flags, FragmentOffset: fragOff,
	})
	return b
}

// deliver hands gVisor a packet with hdr as its linear part and one frag
// of n bytes on a page of its own (filled with a pattern), and returns the
// page and the payload gVisor got.
func (r *lendRig) deliver(t *testing.T, hdr []byte, n int) (*bufpool.Page, []byte) {
	t.Helper()
	pg, err := r.pool.Get()
	if err != nil {
		t.Fatal(err)
	}
	got := r.deliverOn(t, hdr, pg, 0, n)
	r.pool.Recycle(pg) // the NIC retires it
	return pg, got
}

// deliverOn is deliver on n bytes at off of pg, a page the caller holds.
func (r *lendRig) deliverOn(t *testing.T, hdr []byte, pg *bufpool.Page, off, n int) []byte {
	t.Helper()
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*13 + n)
	}
	copy(pg.Bytes()[off:], want)
	pkt := bufpool.NewPacket()
	pkt.Linear = append(pkt.Linear, hdr...)
	pkt.HdrLen = len(hdr)
	pkt.Frags = append(pkt.Frags, bufpool.Frag{Page: pg, Off: uint32(off), Len: uint32(n)})
	pkt.Len = len(hdr) + n
	pkt.CsumVerified = true // as the NIC model verified it
	pg.IncRef()
	before := len(r.held)
	r.ep.Deliver(pkt)
	if len(r.held) != before+1 {
		t.Fatalf("packets delivered: got %d, want %d", len(r.held), before+1)
	}
	// What follows the Ethernet header: the rest of hdr, then the payload.
	got := r.held[len(r.held)-1].Data().AsRange().ToSlice()
	if len(got) != len(hdr)-header.EthernetMinimumSize+n || !bytes.Equal(got[len(got)-n:], want) {
		t.Fatalf("payload of %d bytes delivered wrong", n)
	}
	return got[len(got)-n:]
}

// TestLendSmallCopied: a packet with less than lendMinBytes of payload is
// copied into gVisor (its page is not pinned), a longer one is lent.
func TestLendSmallCopied(t *testing.T) {
	if lendMinBytes > 1448 {
		t.Fatalf("lendMinBytes %d: a full-size segment at MTU 1500 (1448 B) must be lent", lendMinBytes)
	}
	for _, tc := range []struct {
		n    int
		lent bool
	}{{1, false}, {64, false}, {lendMinBytes - 1, false}, {lendMinBytes, true}, {1448, true}} {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			r := newLendRig(t, 0)
			pg, _ := r.deliver(t, ipv4Header(0, 0), tc.n)
			if pg.Lent() != tc.lent {
				t.Errorf("page lent: got %v, want %v", pg.Lent(), tc.lent)
			}
			small, views := r.ep.lend.copiedSmall.Load(), r.ep.lend.views.Load()
			if tc.lent && (small != 0 || views != 1) || !tc.lent && (small != 1 || views != 0) {
				t.Errorf("zc_frags_copied_small %d, zc_views_lent %d: want lent %v", small, views, tc.lent)
			}
			if !tc.lent {
				// gVisor holds the bytes, not the page: it is reused.
				if q, _ := r.pool.Get(); q != pg {
					t.Error("the page of a copied packet was not reused while gVisor holds the packet")
				} else {
					r.pool.Recycle(q)
				}
			}
		})
	}
}

// TestLendIPFragment: IP fragments, which gVisor holds up to 30 s for
// reassembly, are copied whatever their size.
func TestLendIPFragment(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hdr   []byte
		frag  bool
		bytes int
	}{
		{"first fragment", ipv4Header(header.IPv4FlagMoreFragments, 0), true, 1480},
		{"last fragment", ipv4Header(0, 1480), true, 1480},
		{"DF, not a fragment", ipv4Header(header.IPv4FlagDontFragment, 0), false, 1480},
		{"IPv6 fragment", ipv6FragHeader(), true, 1448},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := isIPFragment(tc.hdr, ethLen); got != tc.frag {
				t.Fatalf("isIPFragment: got %v, want %v", got, tc.frag)
			}
			r := newLendRig(t, 0)
			pg, _ := r.deliver(t, tc.hdr, tc.bytes)
			if pg.Lent() == tc.frag {
				t.Errorf("page lent: got %v, want %v", pg.Lent(), !tc.frag)
			}
			if got, want := r.ep.lend.copiedFrag.Load(), uint64(btoi(tc.frag)); got != want {
				t.Errorf("zc_frags_copied_ipfrag: got %d, want %d", got, want)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ipv6FragHeader is the headers of an IPv6 first fragment of 1448 payload
// bytes (the length TestLendIPFragment delivers behind it).
func ipv6FragHeader() []byte {
	b := make([]byte, header.EthernetMinimumSize+header.IPv6MinimumSize+header.IPv6FragmentHeaderSize)
	header.Ethernet(b).Encode(&header.EthernetFields{Type: header.IPv6ProtocolNumber})
	header.IPv6(b[header.EthernetMinimumSize:]).Encode(&header.IPv6Fields{
		PayloadLength: header.IPv6FragmentHeaderSize + 1448, TransportProtocol: header.IPv6FragmentHeader, HopLimit: 64,
	})
	return b
}

// TestLendBound: once maxLent pages are lent, frags of other pages are
// copied (counted), and frags of a page lent already are still lent; when
// gVisor lets go and the pages are reused, lending resumes.
func TestLendBound(t *testing.T) {
	const maxLent = 3
	r := newLendRig(t, maxLent)
	hdr := ipv4Header(0, 0)
	// The NIC is still filling the first page.
	first, err := r.pool.Get()
	if err != nil {
		t.Fatal(err)
	}
	r.deliverOn(t, hdr, first, 0, 2048)
	pages := []*bufpool.Page{first}
	for range maxLent + 1 {
		pg, _ := r.deliver(t, hdr, 2048)
		pages = append(pages, pg)
	}
	for i, pg := range pages {
		if want := i < maxLent; pg.Lent() != want {
			t.Errorf("page %d lent: got %v, want %v", i, pg.Lent(), want)
		}
	}
	l := r.ep.lend
	if l.views.Load() != maxLent || l.copiedBound.Load() != 2 || r.pool.LentPages() != maxLent {
		t.Errorf("zc_views_lent %d, zc_frags_copied_over_limit %d, rx_pp_lent_current %d: want %d, 2, %d",
			l.views.Load(), l.copiedBound.Load(), r.pool.LentPages(), maxLent, maxLent)
	}
	// Another frame in a page lent already costs nothing more: lent.
	r.deliverOn(t, hdr, first, 2048, 2048)
	r.pool.Recycle(first)
	if l.views.Load() != maxLent+1 || l.copiedBound.Load() != 2 {
		t.Errorf("a frag of a lent page: zc_views_lent %d, zc_frags_copied_over_limit %d, want %d, 2",
			l.views.Load(), l.copiedBound.Load(), maxLent+1)
	}
	// gVisor lets go; the pool reuses the pages and lending resumes.
	for _, pb := range r.held {
		pb.DecRef()
	}
	r.held = r.held[:0]
	for range 2 * len(pages) {
		pg, err := r.pool.Get()
		if err != nil {
			t.Fatal(err)
		}
		r.pool.Recycle(pg)
	}
	if n := r.pool.LentPages(); n != 0 {
		t.Errorf("rx_pp_lent_current once reused: got %d, want 0", n)
	}
	if pg, _ := r.deliver(t, hdr, 2048); !pg.Lent() {
		t.Error("lending did not resume once the lent pages came back")
	}
}

// TestLayoutOf: a View type without the fields chunkRefs reads is not
// recognised.
func TestLayoutOf(t *testing.T) {
	type chunk struct{ other int64 }
	type refs struct{ value int64 }
	type goodChunk struct {
		data     []byte
		refCount refs
	}
	for _, tc := range []struct {
		name string
		t    reflect.Type
		ok   bool
	}{
		{"buffer.View", reflect.TypeFor[buffer.View](), true},
		{"similar", reflect.TypeFor[struct {
			read  int
			chunk *goodChunk
		}](), true},
		{"no chunk field", reflect.TypeFor[struct{ read, write int }](), false},
		{"chunk not a pointer", reflect.TypeFor[struct{ chunk goodChunk }](), false},
		{"no refCount", reflect.TypeFor[struct{ chunk *chunk }](), false},
		{"not a struct", reflect.TypeFor[int](), false},
	} {
		if got := layoutOf(tc.t).ok; got != tc.ok {
			t.Errorf("%s: recognised %v, want %v", tc.name, got, tc.ok)
		}
	}
}

// TestZeroCopyLayoutUnknown: with gVisor's chunk layout not recognised
// (forced here), a zero-copy stack copies every frag instead of lending
// pages it could never reuse: the bytes arrive intact, nothing is lent,
// zc_frags_copied_layout counts the copies, and the pool keeps recycling.
func TestZeroCopyLayoutUnknown(t *testing.T) {
	saved := refsLayout
	t.Cleanup(func() { refsLayout = saved }) // after the stacks' cleanup
	refsLayout.ok = false
	rx, peer := pairConfig(t, Config{ZeroCopy: true})
	bulkTo(t, rx, peer, netip.MustParseAddrPort("192.0.2.1:9"), 4<<20)
	c := counterMap(rx)
	if c["zc_views_lent"] != 0 || c["rx_pp_lent"] != 0 {
		t.Errorf("zc_views_lent %d, rx_pp_lent %d: want 0 (nothing lent)", c["zc_views_lent"], c["rx_pp_lent"])
	}
	if c["zc_frags_copied_layout"] == 0 {
		t.Error("zc_frags_copied_layout: got 0, want > 0")
	}
	if c["rx_pp_alloc_fast"] == 0 {
		t.Error("rx_pp_alloc_fast: got 0, want pages reused")
	}
}

// BenchmarkLendVsCopy measures what handing one packet's payload to gVisor
// costs, lent as a view of its RX page or copied into a chunk of gVisor's,
// by payload size: a page from the pool, a packet of one frag, its payload
// made into a gVisor buffer by lendAfter, the packet released, the buffer
// released (gVisor lets go), the page reused by the pool (for a lent page,
// after its chunk's count is read). The rest of the delivery costs the
// same either way. It chose lendMinBytes; see that constant for figures.
func BenchmarkLendVsCopy(b *testing.B) {
	for _, size := range []int{64, 256, 512, 1024, 1448, 4096} {
		for _, lend := range []bool{true, false} {
			name := fmt.Sprintf("%d/copy", size)
			if lend {
				name = fmt.Sprintf("%d/lend", size)
			}
			b.Run(name, func(b *testing.B) {
				pool, err := bufpool.New(bufpool.Config{Memory: newViewMemory(), RingSize: 64})
				if err != nil {
					b.Fatal(err)
				}
				defer pool.Close()
				l := &lendStats{minLend: 1 << 30}
				if lend {
					l.minLend = 0
				}
				hdr := ipv4Header(0, 0)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					pg, err := pool.Get()
					if err != nil {
						b.Fatal(err)
					}
					pkt := bufpool.NewPacket()
					pkt.Linear = append(pkt.Linear, hdr...)
					pkt.HdrLen = len(hdr)
					pkt.Frags = append(pkt.Frags, bufpool.Frag{Page: pg, Len: uint32(size)})
					pkt.Len = len(hdr) + size
					pg.IncRef()
					pool.Recycle(pg)
					var buf buffer.Buffer
					l.lendAfter(&buf, pkt, len(hdr))
					pkt.Release()
					buf.Release()
				}
			})
		}
	}
}
