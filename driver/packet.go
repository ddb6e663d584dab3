package driver

import (
	"time"

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
	// OuterLen is, for a tunnel frame (TunnelConfig), the length of its
	// outer IPv6 header (extension headers included) between the Ethernet
	// header and the inner IP packet; 0 otherwise. ByteCount counts it;
	// Info describes the frame without it, as the driver hands it up.
	OuterLen uint16
	// TunHdrLen is, for a VXLAN frame (Config.VXLANPorts), the length of
	// all its headers, outer Ethernet to inner L4 (0 otherwise), and
	// TunMinLen the header estimate from the CQE's L3/L4 types, which
	// describe the inner packet of a tunnelled frame (MinHeaderLen of the
	// inner frame). Info describes the outer frame.
	TunHdrLen uint16
	TunMinLen uint16
	// RSSHash and RSSType are the NIC's RSS hash of the frame (mlx5's
	// rss_hash_result and rss_hash_type: rssHash), which the driver hands
	// up as the packet's Hash.
	RSSHash uint32
	RSSType bufpool.HashType
	// Hardware GRO (SHAMPO): the frame's headers are in header buffer
	// entry HeaderIndex (HeaderSize bytes) and its payload at DataOffset of
	// the session's reservation (Frags); Match says it continues the
	// previous CQE's session, Flush that the NIC ended the session with
	// this frame (the CQE's shampo.flush bit: the driver hands the session
	// packet up at once).
	HWGRO       bool
	Match       bool
	Flush       bool
	HeaderIndex uint16
	HeaderSize  uint16
	DataOffset  uint32
	NFrags      uint8
	Frags       [maxCQEFrags]bufpool.Frag // the pages the frame spans; each holds a reference
}

// Packet is the bufpool packet the poll loop hands up: the headers (or a
// fixed-size prefix, per the HDS setting) copied into Linear, the rest of the
// frame left in the RX pages as Frags.
type Packet = bufpool.Packet

// Handler receives the packets of each poll batch. Both methods are called
// from the poll loop's goroutine only.
type Handler interface {
	// Deliver takes ownership of pkt.
	Deliver(pkt *Packet)
	// Flush ends a poll batch. more reports that the batch used the whole
	// budget and completions are still waiting, as when a kernel NAPI poll
	// returns its full weight: then, like napi_poll, a GRO handler flushes
	// only what is older than a jiffy, and everything once the ring is
	// drained. Flush returns how soon it wants to be called again if no
	// packet arrives meanwhile (the gro_flush_timeout timer of a handler
	// that still holds packets), or 0.
	Flush(more bool) time.Duration
}

// XDPHandler is a Handler with an XDP program (Config.XDP set): the poll
// loop offers it each frame before it builds or delivers a packet, as
// mlx5's RX handlers run mlx5e_xdp_handle on the xdp_buff over the stride
// before they build the skb. On the linear RQ the frame is its bytes in
// the stride (Frame.Head) and no packet exists yet; on the nonlinear RQ
// (a multi-buffer frame, the cyclic RQ) it is the packet the driver built
// (Frame.Pkt). Hardware GRO sessions are never offered: an XDP program
// refuses hardware GRO (Config.Validate).
type XDPHandler interface {
	Handler
	// XDP is called from the poll loop's goroutine. It takes ownership of
	// f and reports whether it consumed it (dropped, sent or redirected
	// it); false gives f back to the driver, which builds the packet if
	// there is none and delivers it (XDP_PASS).
	XDP(f bufpool.Frame) bool
}
