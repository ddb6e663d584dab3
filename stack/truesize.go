package stack

import (
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/driver"
)

// rxMeta is what a frame's delivery sets on its gVisor packet buffer
// beside its bytes: the inline batch that processes its TCP endpoint
// (nil: at once), and, for a frame from the wire with Config.TCPRmemBytes
// off, the skb's truesize (driver.Driver.Truesize) and its segment size
// when it aggregates several (skb_shinfo(skb)->gso_size), which the
// patched gVisor's TCP charges and measures as Linux's does (the receive
// memory by truesize, internal/gvisor's patch 0004). Zero values: gVisor
// charges the bytes.
type rxMeta struct {
	inl               *inlineBatch
	truesize, gsoSize int
}

// rxMetaOf is the rxMeta of pkt, delivered with inl.
func (e *linkEndpoint) rxMetaOf(pkt *driver.Packet, inl *inlineBatch) rxMeta {
	m := rxMeta{inl: inl}
	if e.truesize {
		m.truesize = e.drv.Truesize(pkt)
		m.gsoSize = int(pkt.GSOSize)
		e.truesizeBytes.Add(uint64(m.truesize))
	}
	return m
}

// set sets m on pb.
func (m rxMeta) set(pb *gstack.PacketBuffer) {
	setInlineBatch(pb, m.inl)
	setTruesize(pb, m.truesize, m.gsoSize)
}
