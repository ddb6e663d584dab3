package driver

import (
	"sync"

	"github.com/ustack/ustack/bufpool"
)

// CsumState is what the NIC model knows about a frame's checksums.
type CsumState uint8

const (
	// CsumNone: nothing to verify (ARP, unknown L4 after the IPv4 header).
	CsumNone CsumState = iota
	// CsumPartial: the sender left the L4 checksum to offload
	// (VIRTIO_NET_HDR_F_NEEDS_CSUM); the data is trusted, like the kernel's
	// CHECKSUM_PARTIAL.
	CsumPartial
	// CsumUnnecessary: the peer vouched for it (VIRTIO_NET_HDR_F_DATA_VALID).
	CsumUnnecessary
	// CsumComplete: the NIC model verified every checksum in software.
	CsumComplete
)

// maxCQEFrags bounds the pages one frame can span: the largest LRO frame
// over 4 KB pages, not page-aligned.
const maxCQEFrags = (maxLROFrame+bufpool.PageSize4K-1)/bufpool.PageSize4K + 1

// CQE is a completion queue entry: what the NIC model reports for one frame
// it wrote into the RX ring.
type CQE struct {
	ByteCount uint32    // frame length in the ring
	WQE       uint32    // WQE counter the frame was written to
	Stride    uint32    // first stride of the frame in the WQE
	Info      FrameInfo // L2/L3/L4 types and lengths (the CQE's l3/l4/vlan fields)
	Csum      CsumState
	GSOSize   uint16 // LRO: the MSS of the aggregated segments; 0 otherwise
	NFrags    uint8
	Frags     [maxCQEFrags]bufpool.Frag // the pages the frame spans; each holds a reference
}

// Packet is a received frame as the poll loop hands it up: the headers (or
// a fixed-size prefix, per the HDS setting) copied into Linear, the rest left
// in the RX pages as Frags. The Ethernet header starts Linear.
//
// A Packet is owned by one goroutine at a time. Whoever receives it from
// Handler.Deliver owns it and must call Release exactly once.
type Packet struct {
	Linear  []byte
	Frags   []bufpool.Frag // each holds a page reference until Release
	Info    FrameInfo
	Csum    CsumState
	GSOSize uint16
	Len     int // len(Linear) + the frags' lengths

	linear [MaxHDS]byte
	frags  [maxCQEFrags]bufpool.Frag
}

var packetPool = sync.Pool{New: func() any {
	p := new(Packet)
	p.Linear = p.linear[:0]
	p.Frags = p.frags[:0]
	return p
}}

// NewPacket returns an empty packet from the packet cache. It is for code
// that builds packets itself (tests, other RX paths); the poll loop uses it
// too.
func NewPacket() *Packet { return packetPool.Get().(*Packet) }

// PayloadLen returns the bytes held in frags.
func (p *Packet) PayloadLen() int { return p.Len - len(p.Linear) }

// CopyTo copies the whole frame (linear part, then frags) into b, which
// must hold p.Len bytes, and returns the count.
func (p *Packet) CopyTo(b []byte) int {
	n := copy(b, p.Linear)
	for _, f := range p.Frags {
		n += copy(b[n:], f.Bytes())
	}
	return n
}

// Release drops the packet's page references and returns it to the cache.
// The packet must not be used afterwards.
func (p *Packet) Release() {
	for i := range p.Frags {
		p.Frags[i].Page.DecRef()
		p.Frags[i] = bufpool.Frag{}
	}
	p.Linear = p.linear[:0]
	p.Frags = p.frags[:0]
	p.Info = FrameInfo{}
	p.Csum, p.GSOSize, p.Len = CsumNone, 0, 0
	packetPool.Put(p)
}

// Handler receives the packets of each poll batch. Both methods are called
// from the poll loop's goroutine only.
type Handler interface {
	// Deliver takes ownership of pkt.
	Deliver(pkt *Packet)
	// Flush ends a poll batch.
	Flush()
}
