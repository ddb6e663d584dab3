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
// frame stays in the pages as Frags, in order.
//
// A Packet is owned by one goroutine at a time; whoever is handed one owns
// it until it hands it on or calls Release, exactly once.
type Packet struct {
	Linear []byte
	Frags  []Frag // each holds a page reference until Release
	Len    int    // len(Linear) + the frags' lengths (Next's excluded)

	// HdrLen is the length of the frame's headers (Ethernet, IP, L4) as
	// the NIC parsed them. It may be more than len(Linear) when the header
	// copy was shorter than the headers, or less when it took payload too.
	HdrLen int

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
		for i := range p.Frags {
			p.Frags[i].Page.DecRef()
			p.Frags[i] = Frag{}
		}
		p.Linear = p.linear[:0]
		p.Frags = p.frags[:0]
		p.Len, p.HdrLen, p.CsumVerified, p.GSOSize, p.Segs, p.Next = 0, 0, false, 0, 1, nil
		packetCache.Put(p)
		p = next
	}
}
