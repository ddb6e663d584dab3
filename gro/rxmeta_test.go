package gro

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/rss"
	"github.com/ustack/ustack/internal/testutil"
)

// refMeta is a reference parse of the RxMeta a NIC gives p, an Ethernet
// frame with an IPv4 or IPv6 header without extension headers and a TCP
// or UDP header, all in its linear part: the offsets, and the RSS hash of
// its addresses and ports.
func refMeta(t *testing.T, p *bufpool.Packet) bufpool.RxMeta {
	t.Helper()
	b := p.Linear
	l3 := header.EthernetMinimumSize
	var src, dst []byte
	var l4 int
	switch header.IPVersion(b[l3:]) {
	case header.IPv4Version:
		ip := header.IPv4(b[l3:])
		src, dst, l4 = ip.SourceAddressSlice(), ip.DestinationAddressSlice(), l3+int(ip.HeaderLength())
	case header.IPv6Version:
		ip := header.IPv6(b[l3:])
		src, dst, l4 = ip.SourceAddressSlice(), ip.DestinationAddressSlice(), l3+header.IPv6MinimumSize
	default:
		t.Fatalf("not IP: %x", b)
	}
	return bufpool.RxMeta{NetworkHeader: uint16(l3), TransportHeader: uint16(l4), HeadersSet: true,
		Hash: rss.Default().Hash(src, dst, b[l4:l4+4]), HashType: bufpool.HashL4}
}

// TestRxMeta checks that the packets GRO hands up keep the RxMeta their
// first segment came with (a merged packet is its head's, as the kernel's
// GRO keeps the head skb's hash and header offsets), that GRO's output is
// the same whether the packets carry RxMeta or not (the hash picks the
// bucket, the offsets where parsing starts: neither may change a merge),
// and that a held packet sits in the bucket of its hash's low bits
// (napi->gro_hash[hash & (GRO_HASH_BUCKETS - 1)]).
func TestRxMeta(t *testing.T) {
	for _, wl := range workloads() {
		t.Run(wl.name, func(t *testing.T) {
			pool := newPool(t)
			tm := newTemplates(t, pool, wl)
			defer tm.release()
			run := func(meta bool) *collect {
				c := &collect{}
				e := New(Config{}, c)
				for i := range tm.pkts {
					p := tm.clone(i)
					var h uint32
					if meta {
						p.RxMeta = refMeta(t, p)
						h = p.Hash
					}
					e.Receive(p, 0) // p is GRO's now
					if meta && e.Held() > 0 {
						b := &e.buckets[h&(numBuckets-1)]
						if b.n != 1 || b.ents[0].head.Hash != h {
							t.Fatalf("packet %d: bucket %d of its hash holds %d entries, want its flow's", i, h&(numBuckets-1), b.n)
						}
					}
				}
				e.Flush()
				return c
			}
			plain, meta := run(false), run(true)
			defer plain.release()
			defer meta.release()
			if len(meta.got) != len(plain.got) {
				t.Fatalf("packets handed up: got %d with RxMeta, want %d as without", len(meta.got), len(plain.got))
			}
			want := refMeta(t, tm.pkts[0])
			for i, p := range meta.got {
				q := plain.got[i]
				if p.Segs != q.Segs || p.GSOSize != q.GSOSize || p.HdrLen != q.HdrLen || !bytes.Equal(frameOf(p), frameOf(q)) || !bytes.Equal(payloadOf(p), payloadOf(q)) {
					t.Errorf("packet %d: got %d segs, gso %d, differs from the packet without RxMeta (%d segs, gso %d)", i, p.Segs, p.GSOSize, q.Segs, q.GSOSize)
				}
				if p.RxMeta != want {
					t.Errorf("packet %d (%d segs): got RxMeta %+v, want %+v", i, p.Segs, p.RxMeta, want)
				}
				if q.RxMeta != (bufpool.RxMeta{}) {
					t.Errorf("packet %d without RxMeta: got %+v, want none", i, q.RxMeta)
				}
			}
			if meta.got[0].Segs < 2 && wl.l != layoutShampo {
				t.Errorf("first packet: got %d segs, want a merge", meta.got[0].Segs)
			}
		})
	}
}

// TestRxMetaNoAllocs pins Receive at zero allocations for packets that
// carry RxMeta (the hash's bucket, the offsets' parse).
func TestRxMetaNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	wl := workloads()[0]
	pool := newPool(t)
	tm := newTemplates(t, pool, wl)
	defer tm.release()
	metas := make([]bufpool.RxMeta, len(tm.pkts))
	for i, p := range tm.pkts {
		metas[i] = refMeta(t, p)
	}
	e := New(Config{}, &releaser{})
	i := 0
	batch := func() {
		for range 45 {
			p := tm.clone(i)
			p.RxMeta = metas[i]
			e.Receive(p, 0)
			i = (i + 1) % len(tm.pkts)
		}
		e.EndBatch(0)
	}
	for range 100 {
		batch()
	}
	if got := testing.AllocsPerRun(100, batch); got != 0 {
		t.Errorf("allocations per batch of 45: got %v, want 0", got)
	}
}
