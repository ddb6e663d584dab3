package stack

import (
	"testing"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// TestPageStatsCount pins what pageStats.count counts: the distinct pages
// (a page change in ring order is a new page) under a packet's payload,
// its chain's included, in the histogram, and for merged packets in
// rx_gro_pkt_pages / rx_gro_pkt_paged.
func TestPageStatsCount(t *testing.T) {
	pool := testutil.NewPool(t, bufpool.Config{})
	defer pool.Close()
	var pages [3]*bufpool.Page
	for i := range pages {
		var err error
		if pages[i], err = pool.Get(); err != nil {
			t.Fatal(err)
		}
		defer pool.Recycle(pages[i])
	}
	frag := func(pg int, off uint32) bufpool.Frag { return bufpool.Frag{Page: pages[pg], Off: off, Len: 100} }
	pkt := func(segs uint16, frags ...bufpool.Frag) *bufpool.Packet {
		return &bufpool.Packet{Linear: make([]byte, 54), HdrLen: 54, Segs: segs, Frags: frags}
	}
	chained := pkt(2, frag(0, 0), frag(0, 100))
	chained.Next = pkt(1, frag(1, 0))
	chained.Next.Next = pkt(1, frag(2, 0))
	for _, tc := range []struct {
		name string
		p    *bufpool.Packet
		want map[string]uint64
	}{
		{"headers only", pkt(1), map[string]uint64{}},
		{"one frag", pkt(1, frag(0, 0)), map[string]uint64{"rx_pkt_pages_1": 1}},
		{"two frags, one page", pkt(1, frag(0, 0), frag(0, 100)), map[string]uint64{"rx_pkt_pages_1": 1}},
		{"merged, two pages", pkt(2, frag(0, 0), frag(1, 0)),
			map[string]uint64{"rx_pkt_pages_2": 1, "rx_gro_pkt_pages": 2, "rx_gro_pkt_paged": 1}},
		{"page changes back", pkt(1, frag(0, 0), frag(1, 0), frag(0, 200)), map[string]uint64{"rx_pkt_pages_3_4": 1}},
		{"chain", chained, map[string]uint64{"rx_pkt_pages_3_4": 1, "rx_gro_pkt_pages": 3, "rx_gro_pkt_paged": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s pageStats
			s.count(tc.p)
			s.each(func(name string, v uint64) {
				if v != tc.want[name] {
					t.Errorf("%s: got %d, want %d", name, v, tc.want[name])
				}
			})
		})
	}
}
