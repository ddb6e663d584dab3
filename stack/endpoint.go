package stack

import (
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/gro"
)

// linkEndpoint is the gVisor link endpoint in front of the driver. It
// receives the poll loop's packets (driver.Handler) and writes gVisor's
// outgoing packets to the wire with a virtio-net header, leaving checksums
// and segmentation of TCP to the kernel on the other side (TSO).
type linkEndpoint struct {
	drv  *driver.Driver
	mtu  uint32
	addr tcpip.LinkAddress
	// noOffloads: the wire takes no transmit offloads (SupportedGSO).
	noOffloads bool
	// l3: the frames are IP packets without a link header, a TUN's wire
	// (driver.Config.L3); else Ethernet frames (l2Len).
	l3 bool

	mu sync.RWMutex
	// +checklocks:mu
	dispatcher gstack.NetworkDispatcher
	// +checklocks:mu
	onClose func()

	// inl is queue 0's inline batch (Config.InlineTCP), run at Flush;
	// used by whoever holds its ring (the poll loop or a busy reader),
	// one at a time.
	inl     inlineBatch
	inlPkts int // packets delivered since inl last ran (endRound)

	pages pageStats
	pcap  *PcapWriter // packets as delivered and frames as sent (Config.Pcap), or nil
	lend  *lendStats  // zero copy: frags lent to gVisor; nil: copied
	// truesize: TCP segments are charged their truesize (Config.TCPRmemBytes
	// off); truesizeBytes sums the truesizes set (rx_truesize_bytes)
	truesize      bool
	truesizeBytes atomic.Uint64
	trains        trainTable // UDP ports bound by TrainConns

	// XDP and cpumap (nil when not configured). The program and the
	// producer are used by the poll loop only.
	xdp      cpumap.Program
	xdpStats xdpStats
	xdpParts [][]byte
	xsk      xskPort // the AF_XDP socket bound by Stack.BindXSK
	cpumap   *cpumap.Map
	cpuProd  *cpumap.Producer
	cpuGRO   []*gro.Engine
	cpuCsum  cpumapCsumStats

	// tunnel is the tunnel's NIC (nil without a tunnel): decapsulated
	// packets for its inner addresses go to it.
	tunnel *tunnelEndpoint
	// vxlan is the VXLAN device's NIC (nil without one): packets GRO let
	// go that are for it lose their outer headers (vxlanEndpoint.decap)
	// and go on to it.
	vxlan *vxlanEndpoint

	// Poll loop only.
	gro        *gro.Engine // nil with GRO off
	groTimeout time.Duration
	epoch      time.Time
	now        int64 // the current batch's clock (ns since epoch), 0 between batches

	txMu sync.Mutex
	// +checklocks:txMu
	parts [][]byte
	// txDrvs are the queues' drivers, queue 0's (drv) first, for transmit
	// (txQueue); set before the stack starts.
	txDrvs []*driver.Driver

	// delack holds pure ACKs for the replies to carry (delack.go; nil:
	// off). Its table is used under txMu.
	delack *delayedACK

	// zw records the windows ustack advertises (written under txMu)
	// and hands gVisor the ACKs it would drop at a closed window.
	zw zeroWindow

	// mem is the TCP memory governor's hard limit (tcpmem_governor.go).
	mem tcpMemGate

	// csum drops packets with a bad checksum nobody verified (csum.go).
	csum csumCheck
}

var _ gstack.LinkEndpoint = (*linkEndpoint)(nil)
var _ gstack.GSOEndpoint = (*linkEndpoint)(nil)
var _ driver.Handler = (*linkEndpoint)(nil)

func newLinkEndpoint(drv *driver.Driver, mtu int, addr tcpip.LinkAddress) *linkEndpoint {
	e := &linkEndpoint{drv: drv, mtu: uint32(mtu), addr: addr, parts: make([][]byte, 0, 16)}
	if drv.Config().L3 {
		e.l3, e.addr = true, "" // a TUN: IP packets, no link address
	}
	e.trains.drv, e.trains.l3 = drv, e.l3
	return e
}

// Deliver is the receive pipeline: the poll loop hands it each frame the
// NIC model accepted and the XDP program passed (driver.Handler), and the
// call owns it. Before
// Deliver the driver has parsed the frame, verified its checksums, laid it
// out (LRO, header split), decapsulated it if it came through the tunnel
// (Config.Tunnel) and recorded it as read (Config.PcapWire). The stages,
// in order, each with the switch that controls it; a stage that ends the
// packet's way owns it from then on (it releases or queues it), one that
// is read only never does:
//
//  1. XDP (Config.XDP; linkEndpoint.XDP, xdp.go), before Deliver: the
//     driver's poll offers each frame to the program before it builds a
//     packet for it (driver.XDPHandler), as mlx5e_xdp_handle runs in
//     mlx5's RX handlers: the verdict drops the frame, sends it back out
//     (XDP_TX), redirects it to a cpumap worker (Config.CPUMap), which
//     builds its packet and runs stages 2 to 10 on its CPU as
//     cpu_map_kthread_run does, with a GRO engine of its own unless
//     Config.NoCPUMapGRO, or copies it into the AF_XDP socket bound by
//     Stack.BindXSK (toXSK, xsk.go). XDP_PASS has the driver build the
//     packet and Deliver it.
//  2. GRO (on unless Config.NoGRO; Config.GROFlushTimeout), as
//     napi_gro_receive: package gro holds the packet to merge with its
//     flow's next segments (TCP segments; UDP datagrams into trains) and
//     hands each packet it lets go, merged or not, to groSink, at once or
//     at Flush. Stages 3 to 10 are toGVisor, for each such packet (every
//     packet without GRO).
//  3. Page statistics (always; pageStats.count, pages.go), read only:
//     rx_pkt_pages_*.
//  4. UDP trains (Stack.ListenUDPTrains; trainTable.deliver, train.go): a
//     UDP packet for a port a TrainConn has bound is queued to it whole,
//     its payload left in the RX pages, as udp_queue_rcv_skb queues a GRO
//     train for a socket with UDP_GRO. Pcap records the train once, whole.
//  5. Zero-window ACKs (always; zeroWindow.ackFirst, zerowindow.go): a TCP
//     segment that gVisor would reject at ustack's closed window and
//     Linux's tcp_sequence would take is preceded by a pure ACK built from
//     it; the segment goes on.
//  6. The TCP memory hard limit (Config.TCPMemLimit; tcpMemRefuse,
//     tcpmem_governor.go): a data segment of a flow refused memory is
//     counted and dropped, its ACK delivered alone, as tcp_data_queue
//     drops past tcp_mem[2].
//  7. UDP split (always; splitUDP, udpsplit.go): a UDP train that no
//     TrainConn took goes to gVisor as its datagrams, payload copied once,
//     as udp_rcv_segment splits one for a socket without UDP_GRO.
//  8. Copy or lend (Config.ZeroCopy; toGVisor's copy, or lendToGVisor
//     with lendAfter in zerocopy.go): the headers become a view of their
//     own, and the payload is copied once into a gVisor view, or lent to
//     gVisor as views of its RX pages. The packet is released either way.
//  9. Pcap (Config.Pcap; PcapWriter, pcap.go), read only: the frame as
//     gVisor gets it, recorded by stage 7 (the train once, whole) or 8.
//     (Pcap also records what the stack sends: transmitLocked.)
//  10. Dispatch (Config.Tunnel; dispatch, and tunnelEndpoint.deliver in
//     tunnel.go): a frame for one of the tunnel's inner addresses goes to
//     the tunnel's gVisor NIC, any other to the wire's, as
//     netif_receive_skb hands a packet to its device's ip_rcv or ipv6_rcv.
//
// Deliver is called by the poll loop only; stages 2 to 10 also run on the
// cpumap workers.
func (e *linkEndpoint) Deliver(pkt *driver.Packet) {
	e.inlPkts++
	if e.gro != nil {
		e.gro.Receive(pkt, e.nowNS()) // stage 2: out through groSink
		return
	}
	e.toGVisor(pkt, &e.inl)
}

// l2Len is the length of a frame's link header: the Ethernet header's, or
// 0 on a TUN's wire.
func (e *linkEndpoint) l2Len() int { return linkLen(e.l3) }

// linkLen is the link header's length of a TUN's frames (l3) or Ethernet
// frames.
func linkLen(l3 bool) int {
	if l3 {
		return 0
	}
	return ethLen
}

// groSink hands the GRO engines' output to toGVisor (Deliver's stage 2 to
// 3).
type groSink struct {
	e   *linkEndpoint
	inl *inlineBatch // the delivering goroutine's (nil: process at once)
}

func (s *groSink) Deliver(p *bufpool.Packet) { s.e.toGVisor(p, s.inl) }

// nowNS returns the poll batch's clock, read once per batch.
func (e *linkEndpoint) nowNS() int64 {
	if e.now == 0 {
		e.now = time.Since(e.epoch).Nanoseconds() + 1
	}
	return e.now
}

// toGVisor hands a packet to gVisor and releases it. The buffer gVisor gets
// has the structure of the skb GRO built: the linear part as a view of its
// own (so that gVisor's header parsing never touches the payload's chunk),
// the head's frags as a second view, and each packet chained on its
// frag_list (GRO's slow path) as one more view of that packet's payload, as
// the kernel keeps each chained skb as a buffer of its own
// (skb_gro_receive's merge: path). In copy mode the payload is copied once
// into those views and the RX pages go back to the pool at once; with zero
// copy, the payload frags are lent to gVisor as views of their pages
// instead (zerocopy.go). Either way the views go in with Buffer.Merge, not
// Append, which would copy the start of a view into the spare room of the
// view before it and so blur the boundaries.
//
// Receive memory: the kernel charges a frag_list packet more than a frags
// one of the same length (skb_gro_receive adds a chained skb's whole
// truesize, its head included, where the frags path adds only the frags'
// truesize), and tcp_try_rmem_schedule and the window (tcp_space, the
// len/truesize scaling_ratio) see it. gVisor charges a segment
// segSize + PacketBuffer.MemSize, that is its bytes (Buffer.Size) plus
// fixed struct sizes, not the capacity of its views, so the views' sizes
// cannot tell it more. The only lever from outside is
// PacketBufferOptions.ReserveHeaderBytes, which allocates and zeroes the
// reserve it makes gVisor count: ustack would hold the memory in order to be
// charged for it, and pay a memclr per chained packet the kernel does not.
// So ustack does not inflate gVisor's accounting; a frag_list packet costs
// what it costs here: one more view, and one more copy, per chained packet
// (rx_gro_frag_list counts them). driver's package doc says the same.
//
// It is Deliver's stages 3 to 10 (see there) and takes pkt.
//
// inl is the delivering goroutine's inline batch (Config.InlineTCP: the
// TCP endpoints its segments reach are processed at its batch's end, in
// Flush), or nil (processed as they come).
func (e *linkEndpoint) toGVisor(pkt *driver.Packet, inl *inlineBatch) {
	e.pages.count(pkt)
	if e.dropBadCsum(pkt) {
		return
	}
	var vx *vxlanEndpoint // the inner frame's device; nil: the wire's NIC
	if e.vxlan != nil {
		switch e.vxlan.decap(pkt) {
		case vxlanDrop:
			pkt.Release()
			return
		case vxlanInner:
			vx = e.vxlan
			if e.dropBadCsum(pkt) { // the inner checksums, if nobody verified them
				return
			}
		}
	}
	var udp rxUDP // the UDP headers, found once for stages 4 and 7
	if e.trains.deliverUDP(pkt, &udp) {
		return
	}
	defer pkt.Release()
	// The TCP headers and the flow's hash, found once for stages 5 and 6.
	seg := rxTCPOf(pkt.Linear, e.l2Len())
	if ack, ok := e.zw.ackFirstSeg(pkt.Linear, &seg); ok {
		e.dispatchTo(vx, ack, rxMeta{inl: inl})
	}
	if e.mem.hard.Load() && e.tcpMemRefuseSeg(pkt.Linear, &seg, vx) {
		return // tcp_mem's hard limit (tcpmem_governor.go)
	}
	if l3, l4, ok := udpTrain(pkt, e.l2Len(), &udp); ok {
		e.splitUDP(pkt, l3, l4, vx)
		return
	}
	if e.lend != nil {
		e.lendToGVisor(pkt, inl, vx)
		return
	}
	buf := buffer.MakeWithView(buffer.NewViewWithData(pkt.Linear))
	copyViewsAfter(&buf, pkt, len(pkt.Linear))
	if e.pcap != nil {
		e.pcap.WriteFrame(time.Now(), buf.Flatten())
	}
	e.dispatchTo(vx, buf, e.rxMetaOf(pkt, inl))
}

// dispatchTo is dispatch for a frame of the VXLAN device vx (its inner
// frame, after decap), or of the wire if vx is nil.
func (e *linkEndpoint) dispatchTo(vx *vxlanEndpoint, buf buffer.Buffer, m rxMeta) {
	if vx != nil {
		vx.dispatch(buf, m)
		return
	}
	e.dispatch(buf, m)
}

// rxTCP is a received TCP segment's headers as Deliver's stages read them
// (tcpHeaders' results), found once per packet and handed to each stage,
// as the kernel's TCP input reads the header tcp_v4_rcv pulled rather than
// parsing it again: the offsets of the IP and TCP headers in the frame,
// the TCP header's length, the sequence length, and ok false for anything
// but an unfragmented TCP segment (tcpHeaders). hash caches the flow's
// flowHash (local address first, as the stack's own tables key flows),
// computed on first use; 0 until then (flowHash is never 0).
type rxTCP struct {
	ip, tcp, tcpLen, segLen int
	ok                      bool
	hash                    uint64
}

// rxTCPOf finds the TCP segment in frame b, its IP header at l2
// (tcpHeaders).
func rxTCPOf(b []byte, l2 int) rxTCP {
	var s rxTCP
	s.ip, s.tcp, s.tcpLen, s.segLen, s.ok = tcpHeaders(b, l2)
	return s
}

// flow returns the flowHash of the segment found in b (s.ok must be set),
// keyed from the receiver's side: local (the destination) first.
func (s *rxTCP) flow(b []byte) uint64 {
	if s.hash == 0 {
		t := header.TCP(b[s.tcp:])
		src, dst := ipAddrs(b[s.ip:])
		s.hash = flowHash(dst, src, t.DestinationPort(), t.SourcePort())
	}
	return s.hash
}

// lendToGVisor is toGVisor's zero-copy half: the payload goes to gVisor as
// views of the RX pages. The headers are copied into a view of their own:
// the whole linear part, or, when it is a head frag (the linear RQ's frame
// in its stride, bufpool.Packet.Head), its first HdrLen bytes, the rest
// being payload that lendAfter lends from the page, as tcp_gro_receive's
// skb_gro_receive turns a head_frag skb's payload into a frag. The caller
// releases pkt.
func (e *linkEndpoint) lendToGVisor(pkt *driver.Packet, inl *inlineBatch, vx *vxlanEndpoint) {
	hdr := pkt.Linear
	if pkt.Head != nil {
		hdr = hdr[:min(pkt.HdrLen, len(hdr))]
	}
	var payload buffer.Buffer
	e.lend.lendAfter(&payload, pkt, len(hdr))
	if e.pcap != nil {
		e.pcap.WriteFrame(time.Now(), hdr, payload.Flatten())
	}
	buf := buffer.MakeWithView(buffer.NewViewWithData(hdr))
	buf.Merge(&payload)
	e.dispatchTo(vx, buf, e.rxMetaOf(pkt, inl))
}

// dispatch delivers one frame, owned by the call, to gVisor: to the
// tunnel's NIC if it is for one of its addresses, else to the wire's
// (Deliver's stage 10), with m set on its packet buffer.
func (e *linkEndpoint) dispatch(buf buffer.Buffer, m rxMeta) {
	if e.tunnel != nil && e.tunnel.deliver(&buf, e.l2Len(), m) {
		return
	}
	e.mu.RLock()
	d := e.dispatcher
	e.mu.RUnlock()
	if d == nil {
		buf.Release()
		return
	}
	trimIPv6(&buf, e.l2Len())
	pb := gstack.NewPacketBuffer(gstack.PacketBufferOptions{Payload: buf})
	defer pb.DecRef()
	var proto tcpip.NetworkProtocolNumber
	if e.l3 {
		// A TUN's frame: no link header, the IP version says which.
		v, ok := pb.Data().PullUp(1)
		if !ok {
			return
		}
		proto = netProto(v, 0)
	} else {
		hdr, ok := pb.LinkHeader().Consume(ethLen)
		if !ok {
			return
		}
		proto = header.Ethernet(hdr).Type()
	}
	pb.NetworkProtocolNumber = proto
	m.set(pb)
	d.DeliverNetworkPacket(proto, pb)
}

// trimIPv6 cuts buf, a frame whose IP header is at l2, to the end of its
// IPv6 packet (the fixed header and the payload length), as ipv6_rcv trims
// an skb to payload_len (pskb_trim_rcsum) before it parses the extension
// headers. gVisor's parser (header/parse.IPv6) takes the extension headers
// off first and then caps the rest at the payload length, which counts
// them too: without the cut, as many bytes after the packet (Ethernet
// padding, or whatever a TAP's sender appended) as the extension headers
// hold would become TCP or UDP payload. An IPv4 packet is left alone:
// gVisor trims it to its total length itself. No allocation.
func trimIPv6(buf *buffer.Buffer, l2 int) {
	var h [ethLen + 6]byte // the Ethernet header, the IPv6 header to its payload length
	b := h[:l2+6]
	if n, _ := buf.ReadAt(b, 0); n < len(b) || netProto(b, l2) != header.IPv6ProtocolNumber {
		return
	}
	if end := int64(l2 + header.IPv6MinimumSize + int(header.IPv6(b[l2:]).PayloadLength())); buf.Size() > end {
		buf.Truncate(end)
	}
}

// chainHeaders returns the header bytes of the packets chained behind p,
// which are not delivered: their payload continues p's.
func chainHeaders(p *driver.Packet) int {
	n := 0
	for q := p.Next; q != nil; q = q.Next {
		n += min(q.HdrLen, q.Len)
	}
	return n
}

// copyViewsAfter copies p's bytes from offset skip on, and its chain's payload
// (bufpool.Packet.Walk), into views it appends to b: one for p's bytes, one
// for each chained packet's, so that b's views end where the packets do.
// Packets with no bytes to give add no view. p stays the caller's.
func copyViewsAfter(b *buffer.Buffer, p *driver.Packet, skip int) {
	var v *buffer.View
	var q *driver.Packet // the packet v holds the bytes of
	for w := p.Walk(skip); w.Next(); {
		if w.Packet() != q {
			appendView(b, v)
			q = w.Packet()
			from := q.HdrLen
			if q == p {
				from = skip
			}
			v = newCopyView(q.Len - min(from, q.Len))
		}
		v.Write(w.Bytes())
	}
	appendView(b, v)
}

// appendView appends v (which it takes, nil: none) to b as a view of its
// own. Buffer.Append would copy what fits into the spare room of b's last
// view instead.
func appendView(b *buffer.Buffer, v *buffer.View) {
	if v == nil {
		return
	}
	one := buffer.MakeWithView(v)
	b.Merge(&one)
}

// Flush ends a poll batch. When the ring is drained, GRO flushes what it
// holds (or, with a flush timeout, what is older than it); when the batch
// used the whole budget and more is waiting, only what is older than a
// jiffy, as napi_poll does, so that GRO packets are not cut at every budget.
// Flush asks to be called again while GRO still holds packets.
func (e *linkEndpoint) Flush(more bool) time.Duration {
	if e.cpuProd != nil {
		e.cpuProd.Flush() // xdp_do_flush: the bulk queues go to the rings
	}
	var again time.Duration
	if e.gro != nil {
		again = flushGRO(e.gro, e.groTimeout, more, e.nowNS())
		e.now = 0
	}
	e.inlPkts = endRound(&e.inl, e.inlPkts, more)
	return again
}

// netdevBudget is net.core.netdev_budget: how many packets one softirq
// round (net_rx_action) polls, over as many NAPI polls as it takes, before
// it yields the CPU.
const netdevBudget = 300

// endRound ends a poll batch for the inline batch inl, which pkts packets
// reached since it last ran: it runs it at the end of a softirq round,
// when the ring is drained (more false) or netdevBudget packets were
// polled, and returns the packets it still holds (0 once it ran). A poll
// batch that used its whole budget with more waiting leaves the
// connections it reached for the next one, as net_rx_action polls on:
// with LRO off a batch of 64 segments is 92 KB, and acknowledging each
// batch sent twice the ACKs the kernel's receiver sends.
func endRound(inl *inlineBatch, pkts int, more bool) int {
	if more && pkts < netdevBudget {
		return pkts
	}
	runInline(inl)
	return 0
}

// runInline processes the TCP endpoints a poll batch's segments reached
// (Config.InlineTCP): each once, after the batch, so that gVisor
// acknowledges what the batch brought to a connection once, as Linux's
// socket backlog defers its ACK to release_sock (TCP_ACK_DEFERRED).
func runInline(inl *inlineBatch) {
	if inl.Len() > 0 {
		inl.Run()
	}
}

// jiffy is how old a GRO packet may grow while the poll loop has more
// work: one tick of a HZ=1000 kernel.
const jiffy = time.Millisecond

// MTU implements gstack.LinkEndpoint.
func (e *linkEndpoint) MTU() uint32 { return e.mtu }

// SetMTU implements gstack.LinkEndpoint. The MTU is fixed by the driver.
func (e *linkEndpoint) SetMTU(uint32) {}

// MaxHeaderLength implements gstack.LinkEndpoint.
func (e *linkEndpoint) MaxHeaderLength() uint16 { return uint16(e.l2Len()) }

// LinkAddress implements gstack.LinkEndpoint.
func (e *linkEndpoint) LinkAddress() tcpip.LinkAddress { return e.addr }

// SetLinkAddress implements gstack.LinkEndpoint. The address is fixed: the
// NIC model filters on it.
func (e *linkEndpoint) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements gstack.LinkEndpoint. Receive checksums are the NIC
// model's job (it verifies what the wire does not vouch for); transmit
// checksums of TCP are left to the kernel through NEEDS_CSUM via host GSO.
func (e *linkEndpoint) Capabilities() gstack.LinkEndpointCapabilities {
	if e.l3 {
		return gstack.CapabilityRXChecksumOffload // a TUN: no link addresses to resolve
	}
	return gstack.CapabilityRXChecksumOffload | gstack.CapabilityResolutionRequired
}

// GSOMaxSize implements gstack.GSOEndpoint.
func (e *linkEndpoint) GSOMaxSize() uint32 { return 1 << 16 }

// SupportedGSO implements gstack.GSOEndpoint: the kernel behind the TAP
// segments (TSO) and completes checksums for us. A wire without offloads
// (driver.PlainWire: Offloads false) gets none: gVisor segments to the MSS
// and computes every checksum itself, as the kernel's stack does for a
// device without NETIF_F_TSO and NETIF_F_HW_CSUM.
func (e *linkEndpoint) SupportedGSO() gstack.SupportedGSO {
	if e.noOffloads {
		return gstack.GSONotSupported
	}
	return gstack.HostGSOSupported
}

// Attach implements gstack.LinkEndpoint.
func (e *linkEndpoint) Attach(d gstack.NetworkDispatcher) {
	e.mu.Lock()
	e.dispatcher = d
	e.mu.Unlock()
}

// IsAttached implements gstack.LinkEndpoint.
func (e *linkEndpoint) IsAttached() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.dispatcher != nil
}

// Wait implements gstack.LinkEndpoint.
func (e *linkEndpoint) Wait() {}

// ARPHardwareType implements gstack.LinkEndpoint.
func (e *linkEndpoint) ARPHardwareType() header.ARPHardwareType {
	if e.l3 {
		return header.ARPHardwareNone
	}
	return header.ARPHardwareEther
}

// AddHeader implements gstack.LinkEndpoint.
func (e *linkEndpoint) AddHeader(pkt *gstack.PacketBuffer) {
	if e.l3 {
		return // a TUN's packets have no link header
	}
	addEthernet(pkt)
}

// addEthernet pushes pkt's Ethernet header, from its route's link
// addresses.
func addEthernet(pkt *gstack.PacketBuffer) {
	eth := header.Ethernet(pkt.LinkHeader().Push(header.EthernetMinimumSize))
	eth.Encode(&header.EthernetFields{
		SrcAddr: pkt.EgressRoute.LocalLinkAddress,
		DstAddr: pkt.EgressRoute.RemoteLinkAddress,
		Type:    pkt.NetworkProtocolNumber,
	})
}

// ParseHeader implements gstack.LinkEndpoint.
func (e *linkEndpoint) ParseHeader(pkt *gstack.PacketBuffer) bool {
	if e.l3 {
		v, ok := pkt.Data().PullUp(1)
		if ok {
			pkt.NetworkProtocolNumber = netProto(v, 0)
		}
		return ok
	}
	return parseEthernet(pkt)
}

// parseEthernet consumes pkt's Ethernet header and takes its EtherType.
func parseEthernet(pkt *gstack.PacketBuffer) bool {
	hdr, ok := pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	if ok {
		pkt.NetworkProtocolNumber = header.Ethernet(hdr).Type()
	}
	return ok
}

// Close implements gstack.LinkEndpoint.
func (e *linkEndpoint) Close() {
	e.mu.Lock()
	f := e.onClose
	e.onClose = nil
	e.mu.Unlock()
	if f != nil {
		f()
	}
}

// SetOnCloseAction implements gstack.LinkEndpoint.
func (e *linkEndpoint) SetOnCloseAction(f func()) {
	e.mu.Lock()
	e.onClose = f
	e.mu.Unlock()
}

// WritePackets implements gstack.LinkWriter.
func (e *linkEndpoint) WritePackets(pkts gstack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		if err := e.writePacket(pkt); err != nil {
			if n == 0 {
				return 0, err
			}
			break
		}
		n++
	}
	return n, nil
}

func (e *linkEndpoint) writePacket(pkt *gstack.PacketBuffer) tcpip.Error {
	var h driver.VirtioNetHdr
	if g := pkt.GSOOptions; g.Type != gstack.GSONone {
		h.HdrLen = uint16(pkt.HeaderSize())
		if g.NeedsCsum {
			h.Flags = driver.VirtioNetHdrFNeedsCsum
			h.CsumStart = uint16(e.l2Len()) + g.L3HdrLen
			h.CsumOffset = g.CsumOffset
		}
		if pkt.Data().Size() > int(g.MSS) {
			switch g.Type {
			case gstack.GSOTCPv4:
				h.GSOType = driver.VirtioNetHdrGSOTCPv4
			case gstack.GSOTCPv6:
				h.GSOType = driver.VirtioNetHdrGSOTCPv6
			}
			if h.GSOType != driver.VirtioNetHdrGSONone {
				h.GSOSize = g.MSS
			}
		}
	}
	e.txMu.Lock()
	defer e.txMu.Unlock()
	if pkt.TransportProtocolNumber == header.TCPProtocolNumber {
		e.zw.sent(pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice())
		if e.delack != nil {
			var first *delackFlow
			held := e.delack.onTx(pkt, &h, time.Since(e.epoch).Nanoseconds(), &first)
			if first != nil {
				e.transmitLocked(first.pkt, &first.vnet)
				first.pkt.DecRef()
			}
			if held {
				return nil
			}
		}
	}
	return e.transmitLocked(pkt, &h)
}

// startDelayedACK turns delayed ACKs on (Config.DelayedACK).
func (e *linkEndpoint) startDelayedACK(hold time.Duration) {
	d := &delayedACK{hold: hold}
	d.timer = time.AfterFunc(time.Hour, func() {
		e.txMu.Lock()
		defer e.txMu.Unlock()
		d.expired(time.Since(e.epoch).Nanoseconds(), e.sendHeld)
	})
	d.timer.Stop()
	e.delack = d
}

// sendHeld transmits a held ACK whose time is up: delayedACK.expired's
// callback, which runs under txMu (the timer's function takes it).
//
// +checklocksignore
func (e *linkEndpoint) sendHeld(p *gstack.PacketBuffer, h *driver.VirtioNetHdr) {
	e.transmitLocked(p, h)
}

// stopDelayedACK sends the ACKs still held and holds no more (the stack is
// closing; the wire is still open).
func (e *linkEndpoint) stopDelayedACK() {
	if e.delack == nil {
		return
	}
	e.txMu.Lock()
	defer e.txMu.Unlock()
	e.delack.drop(e.sendHeld)
}

// transmitLocked writes pkt with virtio-net header h to the wire, and
// records the frame in Config.Pcap.
//
// +checklocks:e.txMu
func (e *linkEndpoint) transmitLocked(pkt *gstack.PacketBuffer, h *driver.VirtioNetHdr) tcpip.Error {
	parts := e.parts[:0]
	vl, off := pkt.AsViewList()
	for v := vl.Front(); v != nil; v = v.Next() {
		s := v.AsSlice()
		if off >= len(s) {
			off -= len(s)
			continue
		}
		parts = append(parts, s[off:])
		off = 0
	}
	drv := e.drv
	if len(e.txDrvs) > 1 {
		drv = e.txDrvs[txQueue(pkt, len(e.txDrvs))] // the flow's queue
	}
	if e.pcap != nil {
		// The frame after its virtio-net header, a GSO super-frame whole,
		// as dev_queue_xmit_nit hands it to tcpdump before the device.
		e.pcap.WriteFrame(time.Now(), parts...)
	}
	err := drv.Transmit(h, parts)
	for i := range parts {
		parts[i] = nil
	}
	e.parts = parts[:0]
	if err != nil {
		return &tcpip.ErrClosedForSend{}
	}
	return nil
}
