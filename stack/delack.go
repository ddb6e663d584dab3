package stack

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/driver"
)

// Delayed ACKs (Config.DelayedACK). gVisor's TCP has no delayed ACK: after
// it processes a segment with data it sends a pure ACK at once
// (handleSegmentsLocked: RcvNxt != MaxSentAck -> sendAck), before the
// application has had a chance to answer. In a request/response exchange
// every request then costs two packets back, the ACK and the reply, where
// Linux sends one: in pingpong mode (inet_csk_enter_pingpong_mode, entered
// when the application sends data soon after it received some) it delays
// the ACK (tcp_send_delayed_ack) and the reply carries it.
//
// The link endpoint does the same on the way out, per flow: a pure ACK of
// a flow that sent data in the last delackPingpong, and that acknowledges
// data the flow's last segment did not (an ACK of newly received data, the
// only ACK Linux delays: inet_csk_schedule_ack from tcp_event_data_recv),
// is held for up to Config.DelayedACK. A pure ACK that acknowledges nothing
// new goes at once: a window update after the reader drained the queue
// (tcp_cleanup_rbuf sends it at once; held, a peer facing a zero window
// would wait for its next probe), a duplicate ACK for out-of-order data
// (__tcp_ack_snd_check: "we have out of order data"), the answer to a
// window probe or a keepalive. So does every ACK after the flow's FIN: no
// reply can carry it any more (tcp_fin in FIN_WAIT1/2: tcp_send_ack).
//
// A data segment of the flow that acknowledges as much as the held ACK
// replaces it (the held ACK is dropped: tcp_delack_saved); a second pure
// ACK that acknowledges more replaces it too and goes at once (Linux ACKs
// at least every second segment: __tcp_ack_snd_check); a pure ACK with the
// same acknowledgment number (a duplicate ACK or a window update) sends the
// held one and itself at once, so duplicate ACKs keep their count; the
// timer sends what is still held when its time is up
// (tcp_delack_timeouts), and the stack's Close sends what is left, counted
// as flushed (a held ACK is one gVisor sent). Flows that never send data (a
// bulk receiver) are never held. Held ACKs are bounded by the table:
// delackFlows.
const (
	delackFlows    = 64
	delackPingpong = time.Second
)

// delayedACK is the link endpoint's delayed-ACK table. Every method but the
// counters runs under linkEndpoint.txMu.
type delayedACK struct {
	hold   time.Duration
	timer  *time.Timer // runs expire; armed while an ACK is held
	armed  bool
	closed bool // drop ran: nothing is held any more
	flows  [delackFlows]delackFlow

	held, saved, replaced, flushed, timeouts atomic.Uint64
}

// delackFlow is one flow's entry: its key (local and remote address and
// port, as the TX packet's source and destination), when it last sent
// data, the acknowledgment number of its last segment (sent or held),
// whether it sent its FIN, and the ACK held for it.
type delackFlow struct {
	key      delackKey
	used     bool
	fin      bool
	lastData int64
	lastAck  uint32
	pkt      *gstack.PacketBuffer // held ACK, or nil
	vnet     driver.VirtioNetHdr
	ack      uint32
	deadline int64
}

// delackKey is a flow's addresses and ports; v4 leaves most of it zero.
type delackKey struct {
	addrs [32]byte
	ports uint32
	v6    bool
}

func (d *delayedACK) each(fn func(string, uint64)) {
	fn("tcp_delack_held", d.held.Load())
	fn("tcp_delack_saved", d.saved.Load())
	fn("tcp_delack_replaced", d.replaced.Load())
	fn("tcp_delack_flushed", d.flushed.Load())
	fn("tcp_delack_timeouts", d.timeouts.Load())
}

// txTCPSegment parses a TX packet's TCP segment: its flow, acknowledgment
// number, and whether it is a pure ACK (ACK alone, no payload, no option
// but timestamps: no SACK blocks, which loss recovery needs at once).
func txTCPSegment(pkt *gstack.PacketBuffer) (k delackKey, ack uint32, pure, ok bool) {
	nh, th := pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice()
	if len(th) < header.TCPMinimumSize {
		return k, 0, false, false
	}
	switch {
	case len(nh) >= header.IPv4MinimumSize && nh[0]>>4 == 4:
		copy(k.addrs[:], nh[12:20])
	case len(nh) >= header.IPv6MinimumSize && nh[0]>>4 == 6:
		copy(k.addrs[:], nh[8:40])
		k.v6 = true
	default:
		return k, 0, false, false
	}
	k.ports = binary.BigEndian.Uint32(th[0:4])
	ack = binary.BigEndian.Uint32(th[8:12])
	doff := int(th[12]>>4) * 4
	tsOnly := doff == 32 && len(th) >= 32 && th[20] == 1 && th[21] == 1 && th[22] == 8 && th[23] == 10
	pure = header.TCPFlags(th[13]) == header.TCPFlagAck && pkt.Data().Size() == 0 && (doff == header.TCPMinimumSize || tsOnly)
	return k, ack, pure, true
}

// find returns k's entry, or with insert a fresh one (evicting a slot:
// its held ACK, if any, is returned in out for the caller to send).
func (d *delayedACK) find(k delackKey, insert bool, out **delackFlow) *delackFlow {
	h := uint32(k.ports)
	for i := 0; i < len(k.addrs); i += 4 {
		h = h*31 + binary.BigEndian.Uint32(k.addrs[i:])
	}
	f := &d.flows[h%delackFlows]
	if f.used && f.key == k {
		return f
	}
	if !insert {
		return nil
	}
	if f.pkt != nil {
		ev := *f
		*out = &ev
		d.flushed.Add(1)
	}
	*f = delackFlow{key: k, used: true}
	return f
}

// onTx looks at a TCP segment about to go out at now and reports whether
// it is held (the caller keeps it no longer; d took a reference), and in
// send a held ACK that must go out first (the caller sends and releases
// it).
func (d *delayedACK) onTx(pkt *gstack.PacketBuffer, vnet *driver.VirtioNetHdr, now int64, send **delackFlow) bool {
	k, ack, pure, ok := txTCPSegment(pkt)
	if !ok {
		return false
	}
	if !pure {
		// A segment with data marks its flow as one that answers
		// (pingpong); any other (SYN, FIN, SACK) only carries its ACK.
		var f *delackFlow
		if pkt.Data().Size() > 0 {
			f = d.find(k, true, send)
			f.lastData = now
		} else if f = d.find(k, false, nil); f == nil {
			return false
		}
		flags := header.TCPFlags(pkt.TransportHeader().Slice()[13])
		f.fin = f.fin || flags&header.TCPFlagFin != 0
		if flags&header.TCPFlagAck != 0 {
			f.lastAck = ack
		}
		if f.pkt != nil && int32(ack-f.ack) >= 0 {
			// The segment carries the held ACK's acknowledgment: the
			// reply the delay waited for.
			f.pkt.DecRef()
			f.pkt = nil
			d.saved.Add(1)
		}
		return false
	}
	f := d.find(k, false, nil)
	if f == nil {
		return false
	}
	newData := int32(ack-f.lastAck) > 0
	f.lastAck = ack
	if f.pkt == nil && (d.closed || f.fin || !newData || now-f.lastData > int64(delackPingpong)) {
		// Only an ACK of newly received data, on a pingpong flow that
		// has not sent its FIN, may wait for the reply.
		return false
	}
	if f.pkt != nil {
		if ack == f.ack {
			// A duplicate ACK or a window update: both go now, in order.
			ev := *f
			*send = &ev
			f.pkt = nil
			d.flushed.Add(1)
			return false
		}
		// This ACK covers the held one, which is dropped; a second ACK
		// goes at once.
		f.pkt.DecRef()
		f.pkt = nil
		d.replaced.Add(1)
		return false
	}
	pkt.IncRef()
	f.pkt, f.vnet, f.ack, f.deadline = pkt, *vnet, ack, now+int64(d.hold)
	d.held.Add(1)
	if !d.armed {
		d.armed = true
		d.timer.Reset(d.hold)
	}
	return true
}

// expired calls send for every ACK held past now and clears it, then
// re-arms the timer for the next one, if any.
func (d *delayedACK) expired(now int64, send func(*gstack.PacketBuffer, *driver.VirtioNetHdr)) {
	next := int64(-1)
	for i := range d.flows {
		f := &d.flows[i]
		if f.pkt == nil {
			continue
		}
		if f.deadline <= now {
			send(f.pkt, &f.vnet)
			f.pkt.DecRef()
			f.pkt = nil
			d.timeouts.Add(1)
			continue
		}
		if next < 0 || f.deadline < next {
			next = f.deadline
		}
	}
	d.armed = next >= 0
	if d.armed {
		d.timer.Reset(time.Duration(next - now))
	}
}

// drop sends every held ACK with send, releases it and holds no more (the
// stack is closing; its wire is still open). A held ACK is one gVisor
// sent: dropped, a peer whose FIN it acknowledges would stay in LAST_ACK
// and retransmit its FIN to a stack that is gone.
func (d *delayedACK) drop(send func(*gstack.PacketBuffer, *driver.VirtioNetHdr)) {
	d.timer.Stop()
	d.armed, d.closed = false, true
	for i := range d.flows {
		if f := &d.flows[i]; f.pkt != nil {
			send(f.pkt, &f.vnet)
			f.pkt.DecRef()
			f.pkt = nil
			d.flushed.Add(1)
		}
	}
}
