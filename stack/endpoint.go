package stack

import (
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

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

	mu         sync.RWMutex
	dispatcher stack.NetworkDispatcher // +checklocks:mu
	onClose    func()                  // +checklocks:mu

	pages  pageStats
	pcap   *PcapWriter // packets as delivered, or nil
	lend   *lendStats  // zero copy: frags lent to gVisor; nil: copied
	trains trainTable  // UDP ports bound by TrainConns

	// XDP and cpumap (nil when not configured). The program and the
	// producer are used by the poll loop only.
	xdp      cpumap.Program
	xdpStats xdpStats
	xdpParts [][]byte
	xsk      xskPort // the AF_XDP socket bound by Stack.BindXSK
	cpumap   *cpumap.Map
	cpuProd  *cpumap.Producer
	cpuGRO   []*gro.Engine

	// tunnel is the tunnel's NIC (nil without a tunnel): decapsulated
	// packets for its inner addresses go to it.
	tunnel *tunnelEndpoint

	// Poll loop only.
	gro        *gro.Engine // nil with GRO off
	groTimeout time.Duration
	epoch      time.Time
	now        int64 // the current batch's clock (ns since epoch), 0 between batches

	txMu  sync.Mutex
	parts [][]byte // +checklocks:txMu

	// zw records the windows ustack advertises (written under txMu)
	// and hands gVisor the ACKs it would drop at a closed window.
	zw zeroWindow

	// mem is the TCP memory governor's hard limit (tcpmem_governor.go).
	mem tcpMemGate

	// csum drops packets with a bad checksum nobody verified (csum.go).
	csum csumCheck
}

var _ stack.LinkEndpoint = (*linkEndpoint)(nil)
var _ stack.GSOEndpoint = (*linkEndpoint)(nil)
var _ driver.Handler = (*linkEndpoint)(nil)

func newLinkEndpoint(drv *driver.Driver, mtu int, addr tcpip.LinkAddress) *linkEndpoint {
	return &linkEndpoint{drv: drv, mtu: uint32(mtu), addr: addr, parts: make([][]byte, 0, 16)}
}

// Deliver takes one received packet from the poll loop: into the GRO
// engine when there is one, else straight to gVisor. Called by the poll
// loop only.
func (e *linkEndpoint) Deliver(pkt *driver.Packet) {
	if e.xdp != nil && e.runXDP(pkt) {
		return
	}
	if e.gro != nil {
		e.gro.Receive(pkt, e.nowNS())
		return
	}
	e.toGVisor(pkt)
}

// toGVisor hands a packet to gVisor and releases it: the linear part
// becomes a small view of its own (so that gVisor's header parsing never
// touches the payload's chunk), the payload (frags, then the payload of any
// packets chained by GRO's slow path) is copied once into a second view,
// and the RX pages go back to the pool at once. With zero copy, the payload
// frags are lent to gVisor as views of their pages instead (zerocopy.go).
func (e *linkEndpoint) toGVisor(pkt *driver.Packet) {
	e.pages.count(pkt)
	if e.dropBadCsum(pkt) {
		return
	}
	if e.trains.deliver(pkt) {
		return
	}
	defer pkt.Release()
	if ack, ok := e.zw.ackFirst(pkt.Linear); ok {
		e.dispatch(ack)
	}
	if e.mem.hard.Load() && e.tcpMemRefuse(pkt.Linear) {
		return // tcp_mem's hard limit (tcpmem_governor.go)
	}
	if l3, l4, ok := udpTrain(pkt); ok {
		e.splitUDP(pkt, l3, l4)
		return
	}
	if e.lend != nil {
		e.lendToGVisor(pkt)
		return
	}
	var payload *buffer.View
	if n := pkt.TotalLen() - len(pkt.Linear) - chainHeaders(pkt); n > 0 {
		payload = buffer.NewView(n)
		writeAfter(payload, pkt, len(pkt.Linear))
	}
	if e.pcap != nil {
		var b []byte
		if payload != nil {
			b = payload.AsSlice()
		}
		e.pcap.WriteFrame(time.Now(), pkt.Linear, b)
	}
	buf := buffer.MakeWithView(buffer.NewViewWithData(pkt.Linear))
	if payload != nil {
		buf.Append(payload)
	}
	e.dispatch(buf)
}

// lendToGVisor is toGVisor's zero-copy half: the payload goes to gVisor as
// views of the RX pages. The caller releases pkt.
func (e *linkEndpoint) lendToGVisor(pkt *driver.Packet) {
	var payload buffer.Buffer
	e.lend.lendAfter(&payload, pkt, len(pkt.Linear))
	if e.pcap != nil {
		e.pcap.WriteFrame(time.Now(), pkt.Linear, payload.Flatten())
	}
	buf := buffer.MakeWithView(buffer.NewViewWithData(pkt.Linear))
	buf.Merge(&payload)
	e.dispatch(buf)
}

// dispatch delivers one frame, owned by the call, to gVisor: to the
// tunnel's NIC if it is for one of its addresses, else to the wire's.
func (e *linkEndpoint) dispatch(buf buffer.Buffer) {
	if e.tunnel != nil && e.tunnel.deliver(&buf) {
		return
	}
	e.mu.RLock()
	d := e.dispatcher
	e.mu.RUnlock()
	if d == nil {
		buf.Release()
		return
	}
	pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buf})
	defer pb.DecRef()
	hdr, ok := pb.LinkHeader().Consume(header.EthernetMinimumSize)
	if !ok {
		return
	}
	proto := header.Ethernet(hdr).Type()
	pb.NetworkProtocolNumber = proto
	d.DeliverNetworkPacket(proto, pb)
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

// writeAfter writes p's bytes from offset skip on, and its chain's
// payload (bufpool.Packet.Walk), to v.
func writeAfter(v *buffer.View, p *driver.Packet, skip int) {
	for w := p.Walk(skip); w.Next(); {
		v.Write(w.Bytes())
	}
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
	if e.gro == nil {
		return 0
	}
	if more {
		e.gro.FlushOlderThan(max(jiffy, e.groTimeout), e.nowNS())
	} else {
		e.gro.EndBatch(e.nowNS())
	}
	e.now = 0
	if e.gro.Held() > 0 {
		return e.groTimeout
	}
	return 0
}

// jiffy is how old a GRO packet may grow while the poll loop has more
// work: one tick of a HZ=1000 kernel.
const jiffy = time.Millisecond

// MTU implements stack.LinkEndpoint.
func (e *linkEndpoint) MTU() uint32 { return e.mtu }

// SetMTU implements stack.LinkEndpoint. The MTU is fixed by the driver.
func (e *linkEndpoint) SetMTU(uint32) {}

// MaxHeaderLength implements stack.LinkEndpoint.
func (e *linkEndpoint) MaxHeaderLength() uint16 { return header.EthernetMinimumSize }

// LinkAddress implements stack.LinkEndpoint.
func (e *linkEndpoint) LinkAddress() tcpip.LinkAddress { return e.addr }

// SetLinkAddress implements stack.LinkEndpoint. The address is fixed: the
// NIC model filters on it.
func (e *linkEndpoint) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.LinkEndpoint. Receive checksums are the NIC
// model's job (it verifies what the wire does not vouch for); transmit
// checksums of TCP are left to the kernel through NEEDS_CSUM via host GSO.
func (e *linkEndpoint) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityRXChecksumOffload | stack.CapabilityResolutionRequired
}

// GSOMaxSize implements stack.GSOEndpoint.
func (e *linkEndpoint) GSOMaxSize() uint32 { return 1 << 16 }

// SupportedGSO implements stack.GSOEndpoint: the kernel behind the TAP
// segments (TSO) and completes checksums for us.
func (e *linkEndpoint) SupportedGSO() stack.SupportedGSO { return stack.HostGSOSupported }

// Attach implements stack.LinkEndpoint.
func (e *linkEndpoint) Attach(d stack.NetworkDispatcher) {
	e.mu.Lock()
	e.dispatcher = d
	e.mu.Unlock()
}

// IsAttached implements stack.LinkEndpoint.
func (e *linkEndpoint) IsAttached() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.dispatcher != nil
}

// Wait implements stack.LinkEndpoint.
func (e *linkEndpoint) Wait() {}

// ARPHardwareType implements stack.LinkEndpoint.
func (e *linkEndpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareEther }

// AddHeader implements stack.LinkEndpoint.
func (e *linkEndpoint) AddHeader(pkt *stack.PacketBuffer) {
	eth := header.Ethernet(pkt.LinkHeader().Push(header.EthernetMinimumSize))
	eth.Encode(&header.EthernetFields{
		SrcAddr: pkt.EgressRoute.LocalLinkAddress,
		DstAddr: pkt.EgressRoute.RemoteLinkAddress,
		Type:    pkt.NetworkProtocolNumber,
	})
}

// ParseHeader implements stack.LinkEndpoint.
func (e *linkEndpoint) ParseHeader(pkt *stack.PacketBuffer) bool {
	hdr, ok := pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	if ok {
		pkt.NetworkProtocolNumber = header.Ethernet(hdr).Type()
	}
	return ok
}

// Close implements stack.LinkEndpoint.
func (e *linkEndpoint) Close() {
	e.mu.Lock()
	f := e.onClose
	e.onClose = nil
	e.mu.Unlock()
	if f != nil {
		f()
	}
}

// SetOnCloseAction implements stack.LinkEndpoint.
func (e *linkEndpoint) SetOnCloseAction(f func()) {
	e.mu.Lock()
	e.onClose = f
	e.mu.Unlock()
}

// WritePackets implements stack.LinkWriter.
func (e *linkEndpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
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

func (e *linkEndpoint) writePacket(pkt *stack.PacketBuffer) tcpip.Error {
	var h driver.VirtioNetHdr
	if g := pkt.GSOOptions; g.Type != stack.GSONone {
		h.HdrLen = uint16(pkt.HeaderSize())
		if g.NeedsCsum {
			h.Flags = driver.VirtioNetHdrFNeedsCsum
			h.CsumStart = header.EthernetMinimumSize + g.L3HdrLen
			h.CsumOffset = g.CsumOffset
		}
		if pkt.Data().Size() > int(g.MSS) {
			switch g.Type {
			case stack.GSOTCPv4:
				h.GSOType = driver.VirtioNetHdrGSOTCPv4
			case stack.GSOTCPv6:
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
	}
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
	err := e.drv.Transmit(&h, parts)
	for i := range parts {
		parts[i] = nil
	}
	e.parts = parts[:0]
	if err != nil {
		return &tcpip.ErrClosedForSend{}
	}
	return nil
}
