package stack

import (
	"encoding/binary"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// zeroWindow lets gVisor take the acknowledgement of a segment that meets
// ustack's closed (or too small) receive window, as Linux does.
//
// gVisor's receiver (rcv.go handleRcvdSegment) drops a segment that
// header.Acceptable rejects before the sender sees its ACK field, and it
// judges by the window of the last segment it sent (rcvWnd, rounded down
// to the window scale) from rcv_nxt: at a zero window every segment with
// data is rejected, and so is a pure ACK whose sequence number is past
// rcv_nxt, even inside the right edge ustack advertised before (a window
// of 488 bytes goes out as 0 at scale 10, and the peer's 488 bytes into
// it are then out of window). Linux's tcp_sequence only rejects a segment
// that starts past the right edge it advertised (never shrunk, rounded up
// to the scale) or ends before rcv_wup; tcp_ack then takes its ACK and
// tcp_data_queue drops data that does not fit (TCPZeroWindowDrop). A
// connection that sends while it does not read (io.Copy(c, c) with a peer
// doing the same) lost every ACK the peer sent and waited for RTOs in
// backoff.
//
// The link endpoint sees every segment gVisor sends, so it records per
// flow the window and the ACK (rcv_nxt) ustack last advertised and the
// furthest right edge it advertised; an incoming segment that Linux would
// accept and gVisor would not, by that record, is preceded by a synthetic
// pure ACK carrying the same ACK, window and options at sequence number
// rcv_nxt, which gVisor accepts. The segment follows unchanged (gVisor
// drops it and answers with an ACK, as Linux would for data).
//
// The record is a direct-mapped table of flows, written by the transmit
// path (under the link endpoint's txMu: one writer at a time) and read
// lock-free by the receive paths (poll loop, cpumap workers). A flow keeps
// its slot until a SYN or a zero window of another flow takes it; a lost
// slot only means the old behaviour for that flow. A stale or raced record
// costs at most one pure ACK that gVisor takes or ignores.
type zeroWindow struct {
	tab  [zwSlots]zwSlot
	acks atomic.Uint64 // rx_tcp_zero_window_acks
}

// zwSlots is the table size: 4096 slots of 16 bytes (64 KiB per stack),
// the connection limit of one built-in server.
const zwSlots = 1 << 12

// zwSlot is one flow: key is the flow's hash (0: empty), state packs what
// ustack last advertised (see zwState), edge the furthest right edge it
// advertised. A reader checks key before and after reading state and
// edge, and the writer clears key while it replaces a slot's flow, so
// that a reader never pairs one flow's key with another's state.
type zwSlot struct {
	key, state, edge atomic.Uint64
}

// zwState layout: ack (rcv_nxt) in bits 0-31, the raw window field in bits
// 32-47, the window scale in bits 48-51, bit 52 set when the scale is
// known (seen in ustack's SYN or SYN-ACK), bit 53 always set.
const (
	zwScaleShift = 48
	zwScaleKnown = 1 << 52
	zwValid      = 1 << 53
)

// flowHash hashes a TCP flow from ustack's side: its address and port, the
// peer's. Never 0 (0 marks an empty slot).
func flowHash(local, remote []byte, lport, rport uint16) uint64 {
	h := mix64(uint64(lport)<<16 | uint64(rport) | uint64(len(local))<<32)
	for _, a := range [2][]byte{local, remote} {
		for len(a) >= 8 {
			h = mix64(h ^ binary.BigEndian.Uint64(a))
			a = a[8:]
		}
		if len(a) >= 4 {
			h = mix64(h ^ uint64(binary.BigEndian.Uint32(a)))
		}
	}
	return h | 1
}

// mix64 is splitmix64's finalizer.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// sent records a segment ustack sends: nh and th are its IP and TCP
// headers. Called with the link endpoint's txMu held.
func (z *zeroWindow) sent(nh, th []byte) {
	if len(th) < header.TCPMinimumSize || len(nh) < header.IPv4MinimumSize || !isIPv4(nh) && len(nh) < header.IPv6MinimumSize {
		return
	}
	t := header.TCP(th)
	flags := t.Flags()
	if flags.Contains(header.TCPFlagRst) || !flags.Intersects(header.TCPFlagAck|header.TCPFlagSyn) {
		return
	}
	src, dst := ipAddrs(nh)
	key := flowHash(src, dst, t.SourcePort(), t.DestinationPort())
	slot := &z.tab[key&(zwSlots-1)]
	old := slot.key.Load()
	wnd := t.WindowSize()
	st := uint64(zwValid) | uint64(wnd)<<32 | uint64(t.AckNumber())
	switch {
	case flags.Contains(header.TCPFlagSyn):
		// ustack's SYN or SYN-ACK states its window scale; a SYN-ACK
		// without the option means no scaling (RFC 7323 section 2.2).
		// For a SYN the peer may still refuse scaling: then the scale
		// recorded is too large, which only hides the fix.
		opts := header.ParseSynOptions(t.Options(), flags.Contains(header.TCPFlagAck))
		st |= zwScaleKnown
		if opts.WS > 0 {
			st |= uint64(opts.WS) << zwScaleShift
		}
	case old == key:
		st |= slot.state.Load() & (0x1f << zwScaleShift)
	case old != 0 && wnd != 0:
		return // another flow's slot; this one's window is open
	}
	// A SYN's window is never scaled (RFC 7323 section 2.2).
	edge := seqnum.Value(t.AckNumber()).Add(seqnum.Size(wnd))
	if !flags.Contains(header.TCPFlagSyn) {
		edge = seqnum.Value(t.AckNumber()).Add(seqnum.Size(wnd) << ((st >> zwScaleShift) & 0xf))
	}
	if old != key {
		slot.key.Store(0)
		slot.state.Store(st)
		slot.edge.Store(uint64(edge))
		slot.key.Store(key)
		return
	}
	slot.state.Store(st)
	if seqnum.Value(uint32(slot.edge.Load())).LessThan(edge) {
		slot.edge.Store(uint64(edge))
	}
}

// ackFirst reports whether frame b, a received frame whose headers are in
// b (its IP header at l2), is a TCP segment that gVisor would reject at the
// window ustack last advertised on its flow while Linux's tcp_sequence
// would take it, and if so returns a pure ACK to deliver before it. It
// allocates only then.
func (z *zeroWindow) ackFirst(b []byte, l2 int) (buffer.Buffer, bool) {
	s := rxTCPOf(b, l2)
	return z.ackFirstSeg(b, &s)
}

// ackFirstSeg is ackFirst for the segment s found in b (rxTCPOf), which
// Deliver finds once for its stages.
func (z *zeroWindow) ackFirstSeg(b []byte, s *rxTCP) (buffer.Buffer, bool) {
	if !s.ok {
		return buffer.Buffer{}, false
	}
	tcp, tcpLen, segLen, ip := s.tcp, s.tcpLen, s.segLen, s.ip
	t := header.TCP(b[tcp:])
	if f := t.Flags(); !f.Contains(header.TCPFlagAck) || f.Intersects(header.TCPFlagSyn|header.TCPFlagRst) {
		return buffer.Buffer{}, false
	}
	key := s.flow(b)
	slot := &z.tab[key&(zwSlots-1)]
	if slot.key.Load() != key {
		return buffer.Buffer{}, false
	}
	st := slot.state.Load()
	edge := seqnum.Value(uint32(slot.edge.Load()))
	if slot.key.Load() != key {
		return buffer.Buffer{}, false
	}
	raw := uint32(st>>32) & 0xffff
	if st&zwScaleKnown == 0 && raw != 0 {
		return buffer.Buffer{}, false // the window is open by an unknown scale
	}
	rcvNxt := seqnum.Value(uint32(st))
	wnd := seqnum.Size(raw) << ((st >> zwScaleShift) & 0xf)
	if right := rcvNxt.Add(wnd); edge.LessThan(right) {
		edge = right
	}
	seq := seqnum.Value(t.SequenceNumber())
	end := seq.Add(seqnum.Size(segLen))
	// tcp_sequence (net/ipv4/tcp_input.c), with rcv_wup taken as the
	// last ACK sent: not before rcv_wup, not after the right edge.
	linuxTakes := rcvNxt.LessThanEq(end) && seq.LessThanEq(edge)
	if !linuxTakes || header.Acceptable(seq, seqnum.Size(segLen), rcvNxt, rcvNxt.Add(wnd)) {
		return buffer.Buffer{}, false
	}
	z.acks.Add(1)
	return pureACK(b[:tcp+tcpLen], ip, tcp, tcpLen, uint32(rcvNxt)), true
}

// pureACK builds a copy of the headers hdr (Ethernet, IP at ip, TCP at tcp
// of length tcpLen) as a segment without payload, FIN or PSH at sequence
// number seq, with correct lengths and checksums.
func pureACK(hdr []byte, ip, tcp, tcpLen int, seq uint32) buffer.Buffer {
	v := buffer.NewViewWithData(hdr)
	h := v.AsSlice()
	var src, dst tcpip.Address
	if isIPv4(h[ip:]) {
		n := header.IPv4(h[ip:tcp])
		n.SetTotalLength(uint16(tcp - ip + tcpLen))
		n.SetChecksum(0)
		n.SetChecksum(^n.CalculateChecksum())
		src, dst = n.SourceAddress(), n.DestinationAddress()
	} else {
		n := header.IPv6(h[ip:tcp])
		n.SetPayloadLength(uint16(tcpLen))
		src, dst = n.SourceAddress(), n.DestinationAddress()
	}
	t := header.TCP(h[tcp:])
	t.SetSequenceNumber(seq)
	t.SetFlags(uint8(t.Flags() &^ (header.TCPFlagFin | header.TCPFlagPsh)))
	t.SetChecksum(0)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(tcpLen))
	t.SetChecksum(^t.CalculateChecksum(xsum))
	return buffer.MakeWithView(v)
}

// each yields the counter.
func (z *zeroWindow) each(fn func(string, uint64)) {
	fn("rx_tcp_zero_window_acks", z.acks.Load())
}
