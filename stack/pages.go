package stack

import (
	"sync/atomic"

	"github.com/ustack/ustack/bufpool"
)

// pageStats is mlx4's page-recycling patch's figure: how many distinct pages the payload of a
// packet handed up (after GRO) sits on. Fewer pages mean fewer cache misses
// when the packet is freed, and less memory per ring slot.
type pageStats struct {
	hist     [len(pageBuckets)]atomic.Uint64
	groPages atomic.Uint64 // pages summed over merged (GRO/LRO) packets
	groPkts  atomic.Uint64 // merged packets counted in groPages
}

// pageBuckets are the histogram's upper bounds.
var pageBuckets = [...]struct {
	max  int
	name string
}{
	{1, "rx_pkt_pages_1"}, {2, "rx_pkt_pages_2"}, {4, "rx_pkt_pages_3_4"}, {8, "rx_pkt_pages_5_8"},
	{16, "rx_pkt_pages_9_16"}, {32, "rx_pkt_pages_17_32"}, {64, "rx_pkt_pages_33_64"}, {1 << 30, "rx_pkt_pages_65_plus"},
}

// count adds p to the statistics. Frames are laid out in ring order, so a
// packet's frags visit its pages in order and a page change is a new page.
func (s *pageStats) count(p *bufpool.Packet) {
	n := 0
	var last *bufpool.Page
	for w := p.Walk(0); w.Next(); {
		if f := w.Frag(); f != nil && f.Page != last {
			n++
			last = f.Page
		}
	}
	if n == 0 {
		return
	}
	for i := range pageBuckets {
		if n <= pageBuckets[i].max {
			s.hist[i].Add(1)
			break
		}
	}
	if p.Segs > 1 || p.GSOSize > 0 {
		s.groPages.Add(uint64(n))
		s.groPkts.Add(1)
	}
}

// each yields the counters.
func (s *pageStats) each(fn func(string, uint64)) {
	for i := range pageBuckets {
		fn(pageBuckets[i].name, s.hist[i].Load())
	}
	fn("rx_gro_pkt_pages", s.groPages.Load())
	fn("rx_gro_pkt_paged", s.groPkts.Load())
}
