package bufpool

import "sync"

// Capacities of a Packet: the linear part holds the largest header copy
// (the driver's fixed HDS sizes go up to it), and the frags hold a 64 KB GRO
// packet of 1500-byte frames, each of which may span two pages.
const (
	MaxLinear = 4096
	MaxFrags  = 96
)

// Packet is ustack's sk_buff: a received frame, or several merged by LRO or
// GRO. Linear starts with the Ethernet header and holds the bytes copied out
// of the RX pages (the headers, or a fixed-size prefix); the rest of the
// frame stays in the pages as Frags, in order. Or Linear is a head frag
// (SetHead): the frame itself in its RX page, as build_skb makes an skb
// over the buffer the NIC wrote (skb->head_frag).
//
// A Packet is owned by one goroutine at a time; whoever is handed one owns
// it until it hands it on or calls Release, exactly once.
type Packet struct {
	Linear []byte
	Frags  []Frag // each holds a page reference until Release
	Len    int    // len(Linear) + the frags' lengths (Next's excluded)

	// Head is the page Linear lies in when the linear part is a head frag
	// (the kernel's skb->head_frag: mlx5e_build_linear_skb's
	// napi_build_skb over an RX stride), nil when Linear is the packet's
	// own buffer. The packet holds one reference on Head until Release or
	// TakeHead; Linear starts at HeadOff of Head's bytes and its capacity
	// ends with it, so an append never writes into the page.
	Head    *Page
	HeadOff uint32

	// HdrLen is the length of the frame's headers (Ethernet, IP, L4) as
	// the NIC parsed them. It may be less than len(Linear) when the header
	// copy took payload too; more only when the headers do not fit in the
	// linear part (the driver pulls what a short copy missed, PullTail).
	HdrLen int

	// RxMeta is what the NIC model found in the frame's headers beside
	// its bytes: where they are, and its RSS hash.
	RxMeta

	// CsumVerified reports that every checksum of the frame was verified,
	// or vouched for by the wire (virtio-net NEEDS_CSUM or DATA_VALID).
	CsumVerified bool
	// GSOSize is the payload size of each aggregated segment when the
	// packet aggregates several (LRO, GRO); 0 otherwise.
	GSOSize uint16
	// Segs is the number of wire frames the packet holds (1 when plain).
	Segs uint16
	// Next chains further packets whose payload follows this one's (the
	// kernel's frag_list, GRO's slow path). Each is owned with the head and
	// released by its Release.
	Next *Packet

	linear [MaxLinear]byte
	frags  [MaxFrags]Frag
}

// RxMeta is what a driver hands up with a received frame beside its
// bytes, from what its NIC parsed, so that later stages read it instead of
// parsing the headers again: the header offsets (the kernel's
// skb->network_header and skb->transport_header) and the RSS hash
// (skb->hash, skb->l4_hash). The zero value is "unknown": a packet built
// without the NIC's parse (a test's, a software path's) has it.
type RxMeta struct {
	// NetworkHeader and TransportHeader are the offsets in the frame of
	// its IP header and of what follows the IP header and the extension
	// headers the NIC walked (the TCP or UDP header; a fragment's
	// payload), valid only when HeadersSet: a frame the driver parsed as
	// IPv4 or IPv6. The bytes there may lie in the frags when the linear
	// part is short (Packet.HdrLen): readers check len(Linear) first.
	// A stage that moves the headers (none does: GRO rewrites lengths in
	// place, the driver decapsulates a tunnel frame before it sets them)
	// must update them.
	NetworkHeader   uint16
	TransportHeader uint16
	HeadersSet      bool

	// Hash is the NIC's RSS hash of the frame (mlx5e_skb_set_hash takes
	// it from the CQE): the Toeplitz hash of the IP addresses, and of the
	// TCP or UDP ports when HashType is HashL4. Meaningful only when
	// HashType is not HashNone.
	Hash     uint32
	HashType HashType
}

// HashType says what a packet's Hash covers, as the kernel's
// PKT_HASH_TYPE_* given to skb_set_hash.
type HashType uint8

// Hash types.
const (
	// HashNone: no hash (skb->hash 0): nobody hashed the packet.
	HashNone HashType = iota
	// HashL3: the IP addresses only (PKT_HASH_TYPE_L3): an IP fragment,
	// which RSS hashes without ports, or a protocol other than TCP and
	// UDP.
	HashL3
	// HashL4: the addresses and the TCP or UDP ports (PKT_HASH_TYPE_L4,
	// skb->l4_hash).
	HashL4
)

var packetCache = sync.Pool{New: func() any {
	p := new(Packet)
	p.Linear = p.linear[:0]
	p.Frags = p.frags[:0]
	p.Segs = 1
	return p
}}

// NewPacket returns an empty packet from the packet cache, owned by the
// caller. Taking one from the cache does not allocate in steady state.
func NewPacket() *Packet { return packetCache.Get().(*Packet) }

// SetHead makes f the packet's linear part, a head frag: Linear becomes
// f's bytes in its page (capacity clipped to them), and the packet takes
// f's page reference, dropped by Release. The packet must have no linear
// part yet. It does not copy or allocate.
func (p *Packet) SetHead(f Frag) {
	if len(p.Linear) != 0 || p.Head != nil {
		panic("bufpool: SetHead on a packet with a linear part")
	}
	end := f.Off + f.Len
	p.Linear = f.Page.buf[f.Off:end:end]
	p.Head, p.HeadOff = f.Page, f.Off
}

// TakeHead hands back the head frag's bytes from offset off of Linear on as
// a Frag that takes the packet's reference on Head, as skb_gro_receive
// steals a head_frag skb's head (NAPI_GRO_FREE_STOLEN_HEAD). The linear
// part is then empty; Len is left alone. p.Head must be set and off at
// most len(p.Linear).
func (p *Packet) TakeHead(off int) Frag {
	f := Frag{Page: p.Head, Off: p.HeadOff + uint32(off), Len: uint32(len(p.Linear) - off)}
	p.Head, p.HeadOff = nil, 0
	p.Linear = p.linear[:0]
	return f
}

// PullTail moves the first n bytes of the frags to the end of the linear
// part, as __pskb_pull_tail does for pskb_may_pull, and returns how many
// it moved: at most n, and no more than the frags hold and the linear part
// has room for (its capacity: MaxLinear for the packet's own buffer). A
// frag it empties is dropped with its page reference; Len and the chain
// (Next) are left alone. A packet whose linear part is a head frag (Head
// set) has no room: it moves nothing. It does not allocate.
func (p *Packet) PullTail(n int) int {
	if p.Head != nil {
		return 0
	}
	n = min(n, cap(p.Linear)-len(p.Linear))
	moved, empty := 0, 0
	for ; empty < len(p.Frags) && moved < n; empty++ {
		f := &p.Frags[empty]
		c := min(n-moved, int(f.Len))
		p.Linear = append(p.Linear, f.Bytes()[:c]...)
		moved += c
		f.Off += uint32(c)
		f.Len -= uint32(c)
		if f.Len > 0 {
			break // n reached in this frag, which keeps the rest
		}
		f.Page.DecRef()
	}
	if empty > 0 {
		k := copy(p.Frags, p.Frags[empty:])
		clear(p.Frags[k:])
		p.Frags = p.Frags[:k]
	}
	return moved
}

// PullFront drops the first n bytes of the linear part, as skb_pull does
// when a tunnel pulls its outer headers (__iptunnel_pull_header): Linear,
// Len and HdrLen lose them, a head frag's offset moves past them, and the
// header offsets (RxMeta), which described the outer packet, are unset.
// n must be at most len(Linear).
func (p *Packet) PullFront(n int) {
	p.Linear = p.Linear[n:]
	p.Len -= n
	p.HdrLen = max(p.HdrLen-n, 0)
	if p.Head != nil {
		p.HeadOff += uint32(n)
	}
	p.NetworkHeader, p.TransportHeader, p.HeadersSet = 0, 0, false
}

// CopyTo copies the frame into b and returns the count: the linear part,
// the frags, then each chained packet's bytes after its HdrLen (Walk(0)).
// b must be large enough.
func (p *Packet) CopyTo(b []byte) int {
	n := 0
	for w := p.Walk(0); w.Next(); {
		n += copy(b[n:], w.Bytes())
	}
	return n
}

// TotalLen returns Len summed over the chain.
func (p *Packet) TotalLen() int {
	n := 0
	for q := p; q != nil; q = q.Next {
		n += q.Len
	}
	return n
}

// Release drops the packet's page references, and its chain's, and returns
// them all to the cache. The packet must not be used afterwards.
func (p *Packet) Release() {
	for p != nil {
		next := p.Next
		if p.Head != nil {
			p.Head.DecRef()
			p.Head, p.HeadOff = nil, 0
		}
		for i := range p.Frags {
			p.Frags[i].Page.DecRef()
			p.Frags[i] = Frag{}
		}
		p.Linear = p.linear[:0]
		p.Frags = p.frags[:0]
		p.Len, p.HdrLen, p.CsumVerified, p.GSOSize, p.Segs, p.Next = 0, 0, false, 0, 1, nil
		p.RxMeta = RxMeta{}
		packetCache.Put(p)
		p = next
	}
}
