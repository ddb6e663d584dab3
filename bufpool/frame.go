package bufpool

// Frame is a received frame before it is a packet, or with a packet the
// poll loop built for it: what an XDP program sees and what a cpumap moves
// to another CPU. It is the kernel's xdp_buff, and its xdp_frame once
// redirected: on the linear RQ the frame's bytes in the RX stride the NIC
// wrote (Head, holding one page reference), with no sk_buff yet, so that the
// CPU that takes the frame builds the packet (__xdp_build_skb_from_frame on
// a cpumap kthread). A frame of several buffers (the nonlinear RQ, XDP
// multi-buffer) is carried as the Packet the poll loop built for it (Pkt),
// whose Frags hold what the xdp_frame's skb_shared_info would: ustack's
// pages have no room after the frame for them.
//
// A Frame is a value; whoever holds one owns its reference (Head's or
// Pkt's) until it hands the Frame on or calls Release.
type Frame struct {
	// Head is the frame in its RX page when Pkt is nil.
	Head Frag
	// Pkt is the frame as a packet, when the poll loop built one; then
	// Head is empty.
	Pkt *Packet
	// CsumVerified is the NIC's checksum verdict for the frame (the CQE's),
	// for a Head frame. An xdp_frame carries none, and a packet built from
	// one is CHECKSUM_NONE; ustack keeps the verdict so that the worker can
	// tell a frame whose checksum a sender left to offload (a TAP's
	// NEEDS_CSUM, which no wire carries) from one it must verify again.
	CsumVerified bool
	// RxMeta is what the driver found in a Head frame's headers (the
	// CQE's): Build gives the header offsets to the packet it makes, but
	// not the RSS hash, which an xdp_frame does not carry (a packet built
	// on a cpumap worker has none, so its GRO uses bucket 0, as
	// dev_gro_receive with skb->hash 0). A Pkt frame's packet keeps its
	// offsets and loses its hash the same way.
	RxMeta
}

// Data returns the frame's first bytes from its Ethernet header: the whole
// frame for a Head frame, the linear part of Pkt (xdp_buff's data to
// data_end, the first buffer of a multi-buffer frame).
func (f Frame) Data() []byte {
	if f.Pkt != nil {
		return f.Pkt.Linear
	}
	return f.Head.Bytes()
}

// Release drops the frame's reference: Pkt's, or Head's page reference.
func (f Frame) Release() {
	if f.Pkt != nil {
		f.Pkt.Release()
		return
	}
	if f.Head.Page != nil {
		f.Head.Page.DecRef()
	}
}

// Build turns a Head frame into a packet over its stride, in p (empty, from
// NewPacket or NewPackets), as __xdp_build_skb_from_frame builds an skb
// around an xdp_frame's buffer: the linear part is the frame (a head frag
// holding Head's page reference), the checksum status and the header
// offsets are the frame's, the RSS hash none, and HdrLen is 0 (the worker finds it). A frame that carries a packet
// returns that packet and leaves p alone. The frame's reference moves to
// the packet returned.
func (f Frame) Build(p *Packet) *Packet {
	if f.Pkt != nil {
		f.Pkt.Hash, f.Pkt.HashType = 0, HashNone
		return f.Pkt
	}
	p.SetHead(f.Head)
	p.Len = int(f.Head.Len)
	p.CsumVerified = f.CsumVerified
	p.RxMeta = f.RxMeta
	p.Hash, p.HashType = 0, HashNone // __xdp_build_skb_from_frame sets no hash
	return p
}

// NewPackets fills dst with empty packets from the packet cache, as
// napi_skb_cache_get_bulk takes a bulk of sk_buff heads from the CPU's NAPI
// cache. The cache is a sync.Pool, whose per-P caches are the per-CPU ones:
// a goroutine that takes its packets where they are released (a cpumap
// worker) takes them from its own P's cache, where one that takes them on
// another P (the poll loop, for packets a worker releases) finds its cache
// empty and steals from the others'. It does not allocate in steady state.
func NewPackets(dst []*Packet) {
	for i := range dst {
		dst[i] = packetCache.Get().(*Packet)
	}
}
