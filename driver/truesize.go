package driver

import "github.com/ustack/ustack/bufpool"

// skbStructSize is SKB_DATA_ALIGN(sizeof(struct sk_buff)) on x86-64: the
// part of an skb's truesize that is the struct itself (SKB_TRUESIZE).
const skbStructSize = 256

// Truesize returns what the kernel would charge a socket for p and the
// packets chained on its frag_list (skb->truesize): for each, the sk_buff
// struct, its head (a head frag: the linear stride it lies in, as
// napi_build_skb's SKB_TRUESIZE of the stride; else the header copy's
// buffer with its skb_shared_info, as napi_alloc_skb's) and its frags,
// each the RX memory it takes: its bytes rounded up to the striding RQ's
// stride (mlx5e_fill_skb_data's ALIGN(len, stride)), the cyclic RQ's frag
// stride (mlx4's frag_stride), or a whole page with PagePerFrame. GRO's
// merges keep this sum, as skb_gro_receive adds each merged skb's
// truesize. A socket that queues packets whole (a UDP train socket)
// charges it against its receive buffer, as __udp_enqueue_schedule_skb
// charges sk_rmem_alloc: the memory a queued packet pins.
func (d *Driver) Truesize(p *bufpool.Packet) int {
	unit := d.cfg.StrideSize
	switch {
	case d.cfg.PagePerFrame:
		unit = d.cfg.Pool.PageSize()
	case d.nic.cyc != nil:
		unit = d.nic.cyc.Stride()
	}
	n := 0
	for q := p; q != nil; q = q.Next {
		n += skbStructSize
		if q.Head != nil && d.nic.linear > 0 {
			n += d.nic.linear
		} else {
			n += skbDataAlign(len(q.Linear)) + skbDataAlign(skbSharedInfoSize)
		}
		for _, f := range q.Frags {
			n += (int(f.Len) + unit - 1) / unit * unit
		}
	}
	return n
}
