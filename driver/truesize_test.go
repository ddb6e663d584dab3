package driver

import (
	"testing"

	"github.com/ustack/ustack/bufpool"
)

// TestTruesize checks skb->truesize as the driver models it for each RX
// layout: the struct, the head (a linear stride, or the header copy with
// its skb_shared_info) and each frag rounded to what it takes of the RX
// memory; a chained packet adds its own.
func TestTruesize(t *testing.T) {
	const skb, shinfo = 256, 320
	frags := func(lens ...uint32) *bufpool.Packet {
		p := new(bufpool.Packet)
		p.Linear = make([]byte, 66) // a TCP/IPv4 header copy: 128 aligned
		for _, l := range lens {
			p.Frags = append(p.Frags, bufpool.Frag{Len: l})
		}
		return p
	}
	head := new(bufpool.Packet)
	head.Head, head.Linear = new(bufpool.Page), make([]byte, 1514)
	chained := frags(1448)
	chained.Next = frags(1448, 100)
	for _, tc := range []struct {
		name string
		cfg  Config
		p    *bufpool.Packet
		want int
	}{
		{"linear head frag", Config{}, head, skb + 2048},
		{"linear head frag, xdp", Config{XDP: true}, head, skb + 4096},
		{"striding frags", Config{LRO: true}, frags(1448, 1448), skb + 128 + shinfo + 2*1472},
		{"striding frag_list", Config{LRO: true}, chained, 2*(skb+128+shinfo) + 1472 + 1472 + 128},
		{"cyclic", Config{RQ: RQCyclic}, frags(1448), skb + 128 + shinfo + 2048},
		{"page per frame", Config{LRO: true, PagePerFrame: true}, frags(1448), skb + 128 + shinfo + 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newTestDriver(t, tc.cfg, &collector{})
			if got := d.Truesize(tc.p); got != tc.want {
				t.Errorf("Truesize: got %d, want %d", got, tc.want)
			}
		})
	}
}
