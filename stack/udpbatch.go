package stack

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
)

// Message is one datagram of a batch call (TrainConn.ReadBatch,
// TrainConn.WriteBatch), or with SetGRO one train of same-size datagrams.
// It mirrors golang.org/x/net/ipv4.Message (and ipv6.Message), the shape
// quic-go's batch connection uses with recvmmsg and sendmmsg:
//
//	x/net ipv4.Message     Message
//	Buffers [][]byte       Buffers [][]byte: scattered into / gathered from in order
//	Addr net.Addr          Addr netip.AddrPort: a value, so no allocation per datagram
//	N int                  N int: bytes read into Buffers, or written from them
//	OOB, NN                SegSize int: the UDP_GRO control message's value on
//	                       read (the size of each datagram in the message, the
//	                       last may be shorter); on write, UDP_SEGMENT's (0: the
//	                       message is one datagram)
//	Flags int              Flags int: MsgTrunc when the datagram did not fit
//
// so a quic-go style reader that parses UDP_GRO's cmsg out of OOB reads
// SegSize instead, and no control message is built or parsed.
type Message struct {
	Buffers [][]byte
	Addr    netip.AddrPort
	N       int
	SegSize int
	Flags   int
}

// MsgTrunc is set in Message.Flags when a datagram was longer than the
// message's buffers and was cut (recvmsg's MSG_TRUNC, the same value).
const MsgTrunc = 0x20

// batchState is a TrainConn's state for batch and train reads and for
// writes.
type batchState struct {
	// rsem is the read side's lock, held by one ReadBatch or ReadTrain
	// at a time; a channel so that waiting for it obeys the deadline and
	// Close. It guards the fields below up to txMu.
	rsem chan struct{}
	// cur is the train being read, taken off the queue (its charge is
	// already off rmem), with what is known about it: the offset of its
	// payload, the payload's length, the segment size, the sender, and
	// how much of the payload has been read, and the walk's position
	// there (the walker, and what is left of its slice).
	cur                   *bufpool.Packet
	hdrLen, total, segLen int
	off                   int
	from                  netip.AddrPort
	wk                    bufpool.Walker
	ws                    []byte
	// timer is the read deadline's, reused from call to call.
	timer *time.Timer
	// gro: one train per message (SetGRO).
	gro atomic.Bool
}

// udpSender is a TrainConn's sending side (WriteBatch).
type udpSender struct {
	mu sync.Mutex
	// +checklocks:mu
	ep tcpip.Endpoint // the sending socket, made by the first write
	// +checklocks:mu
	wq *waiter.Queue
	// +checklocks:mu
	wait waiter.Entry
	// +checklocks:mu
	ready chan struct{}
	// +checklocks:mu
	pay gatherReader
	// +checklocks:mu
	v4 bool // ep is an IPv4 socket
	// The GSO path's scratch (writeGSO): the headers, the frame's parts,
	// and the IPv4 ID of the next super-frame.
	// +checklocks:mu
	hdr [header.EthernetMinimumSize + header.IPv6MinimumSize + header.UDPMinimumSize]byte
	// +checklocks:mu
	parts [][]byte
	// +checklocks:mu
	ipID uint16
}

// SetGRO chooses what ReadBatch puts in a message: on, a train of several
// same-size datagrams with their size in SegSize, as a Linux socket with
// setsockopt(UDP_GRO, 1) returns them to recvmmsg (udp_recvmsg with the
// UDP_GRO cmsg, udp_cmsg_recv); off (the default), one datagram per
// message, as the kernel splits a train for a socket without UDP_GRO
// (udp_rcv_segment).
func (c *TrainConn) SetGRO(on bool) { c.b.gro.Store(on) }

// ReadBatch fills up to len(ms) messages with datagrams (with SetGRO,
// trains), in the order they arrived, and returns how many it filled, as
// recvmmsg does. It waits for the first until deadline (zero: no deadline),
// then takes only what is already queued. Each message gets its Buffers
// filled in order, N, Addr (the sender), SegSize, and Flags (MsgTrunc if
// the datagram was longer than its buffers: the rest of it is lost).
//
// A train read in part stays with the TrainConn for the next call, so
// nothing is lost when ms is short: with SetGRO, a message gets as many
// whole datagrams of a train as its buffers hold (at least one), and the
// rest of the train starts the next message. (The kernel cuts a GRO skb at
// the buffer's end and sets MSG_TRUNC; a Go caller need not size its
// buffers for 64 KB to lose nothing.) Memory stays bounded: the queue's
// bound, plus the one train being read.
//
// Errors: net.ErrClosed after Close, os.ErrDeadlineExceeded past the
// deadline, and only when no message was filled. ReadBatch and ReadTrain
// may be called from several goroutines; they take turns. No allocation in
// steady state.
func (c *TrainConn) ReadBatch(ms []Message, deadline time.Time) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	if err := c.lockRead(deadline); err != nil {
		return 0, err
	}
	defer c.unlockRead()
	gro := c.b.gro.Load()
	n := 0
	for n < len(ms) {
		if err := c.next(deadline, n == 0); err != nil {
			if n > 0 {
				break
			}
			return 0, err
		}
		if c.b.cur == nil {
			break // nothing more queued
		}
		c.fill(&ms[n], gro)
		n++
	}
	return n, nil
}

// fill puts the next datagram of the current train (with gro, the most
// whole datagrams that fit) into m, and lets the train go when it is read.
// Called with rsem held and b.cur set.
func (c *TrainConn) fill(m *Message, gro bool) {
	b := &c.b
	left := b.total - b.off
	room := 0
	for _, buf := range m.Buffers {
		room += len(buf)
	}
	take := min(b.segLen, left)
	if gro && room > take {
		take = max(take, min(left, room/b.segLen*b.segLen))
	}
	m.N = b.consume(m.Buffers, take)
	m.Addr = b.from
	m.SegSize = min(b.segLen, take)
	m.Flags = 0
	if take > room {
		m.Flags = MsgTrunc
	}
	b.off += take
	if b.off >= b.total {
		c.releaseCur()
	}
}

// lockRead takes rsem, waiting at most until deadline, or until Close.
func (c *TrainConn) lockRead(deadline time.Time) error {
	select {
	case c.b.rsem <- struct{}{}:
		return nil
	default:
	}
	// Another reader holds it: wait with a timer of this call's own (the
	// shared one is the holder's).
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case c.b.rsem <- struct{}{}:
		return nil
	case <-c.done:
		return net.ErrClosed
	case <-timeout:
		return os.ErrDeadlineExceeded
	}
}

func (c *TrainConn) unlockRead() { <-c.b.rsem }

// next makes sure b.cur holds a train to read: the one read in part, or
// the queue's next. If none is queued it waits until deadline when block is
// set, and else returns with b.cur nil. Called with rsem held.
func (c *TrainConn) next(deadline time.Time, block bool) error {
	b := &c.b
	select {
	case <-c.done:
		c.releaseCur() // Close waits for rsem to release it; this is quicker
		return net.ErrClosed
	default:
	}
	if b.cur != nil {
		return nil
	}
	select {
	case q := <-c.ready:
		c.take(q)
		return nil
	default:
	}
	if !block {
		return nil
	}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return os.ErrDeadlineExceeded
		}
		if b.timer == nil {
			b.timer = time.NewTimer(d)
		} else {
			b.timer.Reset(d)
		}
		defer b.timer.Stop() // since Go 1.23 no stale tick is left behind
		timeout = b.timer.C
	}
	select {
	case q := <-c.ready:
		c.take(q)
		return nil
	case <-c.done:
		return net.ErrClosed
	case <-timeout:
		return os.ErrDeadlineExceeded
	}
}

// take makes q's train, just off the queue, the current train and takes
// its charge off rmem. Called with rsem held.
func (c *TrainConn) take(q queuedTrain) {
	b, p := &c.b, q.p
	c.rmem.Add(-q.truesize)
	c.segs.Add(-int64(max(p.Segs, 1)))
	l3, l4, _ := udpHeaders(p, c.s.ep.l2Len()) // checked when queued
	b.cur = p
	b.hdrLen = l4 + header.UDPMinimumSize
	b.total, _ = udpPayloadLen(p, l3, l4) // by the headers: not the padding after
	b.segLen = int(p.GSOSize)
	if p.Segs < 2 || b.segLen == 0 || b.segLen > b.total {
		b.segLen = b.total
	}
	if b.segLen == 0 {
		b.segLen = 1 // an empty datagram: fill advances past it all the same
	}
	b.off = 0
	b.from = udpSource(p.Linear, l3, l4)
	b.wk, b.ws = p.Walk(b.hdrLen), nil
}

// releaseCur lets the current train go (Close). Called with rsem held.
func (c *TrainConn) releaseCur() {
	if c.b.cur != nil {
		c.b.cur.Release()
		c.b.cur = nil
		c.b.wk, c.b.ws = bufpool.Walker{}, nil // no pointer into what was released
	}
}

// consume moves past the current train's next n payload bytes, copying
// them into bufs in order as far as bufs reach, and returns the bytes
// copied. The walk resumes where the last call stopped, so reading a train
// datagram by datagram walks it once. Called with rsem held.
func (b *batchState) consume(bufs [][]byte, n int) int {
	done, moved, bi, bo := 0, 0, 0, 0
	for moved < n {
		if len(b.ws) == 0 {
			if !b.wk.Next() {
				break
			}
			b.ws = b.wk.Bytes()
		}
		s := b.ws[:min(len(b.ws), n-moved)]
		k := len(s)
		for len(s) > 0 && bi < len(bufs) {
			c := copy(bufs[bi][bo:], s)
			s, done, bo = s[c:], done+c, bo+c
			if bo == len(bufs[bi]) {
				bi, bo = bi+1, 0
			}
		}
		b.ws = b.ws[k:]
		moved += k
	}
	return done
}

// WriteBatch sends each message's Buffers, gathered, from the TrainConn's
// port to its Addr, in order, and returns how many messages it sent
// (sendmmsg), setting each sent message's N. A message with SegSize set is
// several datagrams of SegSize bytes each (the last may be shorter), as
// with Linux's UDP_SEGMENT (udp_send_skb; at most 128 of them, as
// UDP_MAX_SEGMENTS), so that a batch read with SetGRO can be echoed as it
// is. WriteBatch waits while gVisor's send buffer is full, and stops at the
// first message that fails, returning the count before it with the error
// (net.ErrClosed after Close).
//
// A message with several segments goes out as one UDP GSO super-frame
// (writeGSO) where the wire is a TAP with USO and gVisor's route to Addr
// is resolved: the kernel behind the TAP cuts it into the datagrams, as a
// NIC with USO does (tx_gso_packets counts them). Every other datagram
// goes through gVisor's UDP endpoint as a packet of its own: gVisor's UDP
// has no segmentation offload (its writes never set GSO options, and the
// link endpoint maps only TCP's to the virtio-net header). The first call
// binds a gVisor UDP socket to the TrainConn's address and port (it
// receives nothing: the TrainConn takes the port's datagrams first); that
// fails if another gVisor socket has the port.
func (c *TrainConn) WriteBatch(ms []Message) (int, error) {
	t := &c.tx
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.open(c); err != nil {
		return 0, err
	}
	for i := range ms {
		if err := t.write(c, &ms[i]); err != nil {
			return i, err
		}
	}
	return len(ms), nil
}

// open makes the sending socket of c, bound to its address and port.
//
// +checklocks:t.mu
func (t *udpSender) open(c *TrainConn) error {
	select {
	case <-c.done:
		return net.ErrClosed
	default:
	}
	if t.ep != nil {
		return nil
	}
	ap := netip.AddrPortFrom(c.addr, c.port)
	fa, proto := c.s.fullAddr(ap)
	if ap.Addr().IsUnspecified() {
		fa.Addr = tcpip.Address{} // as ListenUDP binds it
	}
	wq := new(waiter.Queue)
	ep, e := c.s.ip.NewEndpoint(udp.ProtocolNumber, proto, wq)
	if e != nil {
		return fmt.Errorf("udp write batch %s: %s", ap, e)
	}
	if e := ep.Bind(fa); e != nil {
		ep.Close()
		return fmt.Errorf("udp write batch %s: bind: %s", ap, e)
	}
	t.ep, t.wq, t.v4 = ep, wq, proto == ipv4.ProtocolNumber
	t.wait, t.ready = waiter.NewChannelEntry(waiter.WritableEvents)
	return nil
}

// write sends one message, waiting while the send buffer is full, until
// done is closed.
//
// +checklocks:t.mu
func (t *udpSender) write(c *TrainConn, m *Message) error {
	done := c.done
	to := m.Addr
	a := to.Addr()
	fa := tcpip.FullAddress{Port: to.Port()}
	switch {
	case !a.IsValid():
		return errors.New("udp write batch: no address")
	case t.v4 && a.Unmap().Is4():
		fa.Addr = tcpip.AddrFrom4(a.Unmap().As4())
	case t.v4:
		return fmt.Errorf("udp write batch to %s: an IPv4 socket", to)
	default: // an IPv6 socket: IPv4 peers as v4-mapped (dual stack)
		fa.Addr = tcpip.AddrFrom16(a.As16())
	}
	t.pay.reset(m.Buffers)
	total, seg := t.pay.n, m.SegSize
	if seg <= 0 || seg > total {
		seg = max(total, 1)
	}
	if (total+seg-1)/seg > udpMaxSegments {
		return fmt.Errorf("udp write batch to %s: %d bytes in segments of %d: more than %d", to, total, m.SegSize, udpMaxSegments)
	}
	if seg < total {
		if ok, err := t.writeGSO(c, m, fa, total, seg); ok || err != nil {
			return err
		}
	}
	opts := tcpip.WriteOptions{To: &fa}
	m.N = 0
	for {
		t.pay.limit(seg)
		if err := t.write1(&opts, done); err != nil {
			return err
		}
		m.N = total - t.pay.n
		if t.pay.n == 0 {
			return nil
		}
	}
}

// writeGSO sends the message's datagrams, total bytes in segments of seg
// (at least two), as one UDP GSO super-frame through the TAP's USO offload
// (VIRTIO_NET_HDR_GSO_UDP_L4, the checksum left partial), as udp_send_skb
// hands a UDP_SEGMENT send to the device as one SKB_GSO_UDP_L4 skb: the
// kernel behind the TAP cuts it into the datagrams (__udp_gso_segment).
// It builds the headers itself, gVisor's UDP having no GSO, from gVisor's
// route (source address, next hop's MAC). It reports false, having sent
// nothing, where it cannot: a wire without USO (driver.TAP.USO), a tunnel,
// a route that is local or not resolved yet (gVisor's own send resolves
// it), a segment past the MTU, or more than an IP packet holds; the caller
// then sends the datagrams one by one.
//
// +checklocks:t.mu
func (t *udpSender) writeGSO(c *TrainConn, m *Message, fa tcpip.FullAddress, total, seg int) (bool, error) {
	st := c.s
	uso, _ := st.cfg.Wire.(interface{ USO() bool })
	if st.drv == nil || st.ep.tunnel != nil || st.ep.l3 || uso == nil || !uso.USO() {
		return false, nil
	}
	dst := m.Addr.Addr().Unmap()
	proto, ipLen := header.IPv6ProtocolNumber, header.IPv6MinimumSize
	var dstAddr tcpip.Address
	if dst.Is4() {
		proto, ipLen = header.IPv4ProtocolNumber, header.IPv4MinimumSize
		dstAddr = tcpip.AddrFrom4(dst.As4())
	} else {
		dstAddr = tcpip.AddrFrom16(dst.As16())
	}
	if seg+ipLen+header.UDPMinimumSize > int(st.ep.mtu) || total+ipLen+header.UDPMinimumSize > 0xffff {
		return false, nil
	}
	var local tcpip.Address
	if c.addr.IsValid() && !c.addr.IsUnspecified() {
		if a := c.addr.Unmap(); a.Is4() == dst.Is4() {
			local = tcpip.AddrFromSlice(a.AsSlice())
		}
	}
	r, e := st.ip.FindRoute(nicID, local, dstAddr, proto, false)
	if e != nil {
		return false, nil
	}
	defer r.Release()
	if r.Loop() != gstack.PacketOut {
		return false, nil
	}
	var mac tcpip.LinkAddress
	if e := r.ResolvedFields(func(res gstack.ResolvedFieldsResult) {
		if res.Err == nil {
			mac = res.RouteInfo.RemoteLinkAddress
		}
	}); e != nil || mac == "" {
		return false, nil // resolving: called back later, mac unread
	}
	h, vh := encodeUDPGSO(t.hdr[:], st.ep.addr, mac, r.LocalAddress(), dstAddr, c.port, fa.Port, total, seg, t.ipID)
	t.ipID += uint16((total + seg - 1) / seg) // one ID per datagram the kernel cuts
	parts := append(t.parts[:0], h)
	for _, b := range m.Buffers {
		if len(b) > 0 {
			parts = append(parts, b)
		}
	}
	if st.ep.pcap != nil {
		st.ep.pcap.WriteFrame(time.Now(), parts...) // the super-frame, as transmitLocked records
	}
	err := st.drv.Transmit(&vh, parts)
	clear(parts)
	t.parts = parts[:0]
	if err != nil {
		return true, fmt.Errorf("udp write batch to %s: %w", m.Addr, err)
	}
	m.N = total
	return true, nil
}

// encodeUDPGSO writes into b the Ethernet, IP (IPv4 when dst is 4 bytes,
// with ID id) and UDP headers of a UDP GSO super-frame carrying total
// payload bytes in datagrams of seg, from src to dst, and returns them with
// the virtio-net header that sends it: VIRTIO_NET_HDR_GSO_UDP_L4 of seg
// bytes, NEEDS_CSUM from the UDP header on, the UDP checksum field seeded
// with the pseudo-header's folded sum over the whole length, not inverted,
// as udp_send_skb's udp4_hwcsum (and udp6_hwcsum_outgoing) leave a
// CHECKSUM_PARTIAL skb for __udp_gso_segment to cut.
func encodeUDPGSO(b []byte, srcMAC, dstMAC tcpip.LinkAddress, src, dst tcpip.Address, sport, dport uint16, total, seg int, id uint16) ([]byte, driver.VirtioNetHdr) {
	proto, ipLen := header.IPv6ProtocolNumber, header.IPv6MinimumSize
	if dst.Len() == 4 {
		proto, ipLen = header.IPv4ProtocolNumber, header.IPv4MinimumSize
	}
	l3 := header.EthernetMinimumSize
	l4 := l3 + ipLen
	h := b[:l4+header.UDPMinimumSize]
	header.Ethernet(h).Encode(&header.EthernetFields{SrcAddr: srcMAC, DstAddr: dstMAC, Type: proto})
	udpLen := uint16(header.UDPMinimumSize + total)
	if proto == header.IPv4ProtocolNumber {
		ip := header.IPv4(h[l3:l4])
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(ipLen) + udpLen, ID: id, TTL: 64,
			Protocol: uint8(header.UDPProtocolNumber), SrcAddr: src, DstAddr: dst,
		})
		ip.SetChecksum(^ip.CalculateChecksum())
	} else {
		header.IPv6(h[l3:l4]).Encode(&header.IPv6Fields{
			PayloadLength: udpLen, TransportProtocol: header.UDPProtocolNumber, HopLimit: 64,
			SrcAddr: src, DstAddr: dst,
		})
	}
	u := header.UDP(h[l4:])
	u.Encode(&header.UDPFields{SrcPort: sport, DstPort: dport, Length: udpLen})
	u.SetChecksum(header.PseudoHeaderChecksum(header.UDPProtocolNumber, src, dst, udpLen))
	return h, driver.VirtioNetHdr{
		Flags: driver.VirtioNetHdrFNeedsCsum, GSOType: driver.VirtioNetHdrGSOUDPL4,
		HdrLen: uint16(len(h)), GSOSize: uint16(seg),
		CsumStart: uint16(l4), CsumOffset: udpChecksumOffset,
	}
}

// udpChecksumOffset is where the checksum sits in a UDP header (RFC 768).
const udpChecksumOffset = 6

// udpMaxSegments is UDP_MAX_SEGMENTS (driver.UDPMaxSegments): udp_send_skb
// refuses a UDP_SEGMENT send of more datagrams than that with EINVAL.
const udpMaxSegments = driver.UDPMaxSegments

// write1 sends the next datagram of t.pay, waiting while the send buffer
// is full, until done is closed.
//
// +checklocks:t.mu
func (t *udpSender) write1(opts *tcpip.WriteOptions, done <-chan struct{}) error {
	registered := false
	var err error
	for {
		_, e := t.ep.Write(&t.pay, *opts)
		if e == nil {
			break
		}
		if _, ok := e.(*tcpip.ErrWouldBlock); !ok {
			err = fmt.Errorf("udp write batch to %v: %s", opts.To.Addr, e)
			if _, ok := e.(*tcpip.ErrClosedForSend); ok {
				err = net.ErrClosed
			}
			break
		}
		if !registered {
			t.wq.EventRegister(&t.wait)
			registered = true
			continue // it may have become writable before we listened
		}
		closed := false
		select {
		case <-t.ready:
		case <-done:
			closed = true
		}
		if closed {
			err = net.ErrClosed
			break
		}
	}
	if registered {
		t.wq.EventUnregister(&t.wait)
	}
	return err
}

// close closes the sending socket (TrainConn.Close).
func (t *udpSender) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ep != nil {
		t.ep.Close()
		t.ep = nil
	}
}

// gatherReader reads a message's Buffers in order, a datagram (limit) at a
// time, as gVisor's tcpip.Payloader; it lives in the TrainConn so that a
// write allocates none.
type gatherReader struct {
	bufs [][]byte
	i, o int
	n    int // bytes left in bufs
	lim  int // bytes left in this datagram
}

func (r *gatherReader) reset(bufs [][]byte) {
	r.bufs, r.i, r.o, r.n, r.lim = bufs, 0, 0, 0, 0
	for _, b := range bufs {
		r.n += len(b)
	}
}

// limit starts the next datagram, of up to seg bytes.
func (r *gatherReader) limit(seg int) { r.lim = min(seg, r.n) }

// Len implements tcpip.Payloader.
func (r *gatherReader) Len() int { return r.lim }

// Read implements io.Reader.
func (r *gatherReader) Read(p []byte) (int, error) {
	if r.lim == 0 {
		return 0, io.EOF
	}
	p = p[:min(len(p), r.lim)]
	done := 0
	for done < len(p) && r.i < len(r.bufs) {
		k := copy(p[done:], r.bufs[r.i][r.o:])
		done, r.o = done+k, r.o+k
		if r.o == len(r.bufs[r.i]) {
			r.i, r.o = r.i+1, 0
		}
	}
	r.n -= done
	r.lim -= done
	return done, nil
}

var _ tcpip.Payloader = (*gatherReader)(nil)
