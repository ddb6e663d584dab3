package bench

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

// The TAP floor's frames: what a peer on the TAP that keeps no connection
// state answers, built in place with full IPv4, TCP and UDP checksums.
// The reflector (floorReflect) answers ARP, a TCP SYN with a SYN-ACK, a
// TCP segment with payload with the same payload, a FIN with a FIN-ACK,
// and echoes UDP; the sink (floorSink) ACKs a TCP stream. Neither verifies
// the checksums of what it reads: the TAP is a local wire whose kernel
// side computed them (or, with TUN_F_CSUM, left them partial, which
// tun_get_user marks CHECKSUM_PARTIAL for the kernel's own receive too).
//
//	Ethernet  0: dst MAC (6) | 6: src MAC (6) | 12: EtherType (2)
//	IPv4     14: ver/IHL, TOS, total length, id, flags/frag, TTL,
//	             protocol, checksum, src (4) at 26, dst (4) at 30
//	TCP      34: sport, dport, seq (4), ack (4), data offset, flags,
//	             window, checksum at 16, urgent pointer

const (
	floorEthLen  = 14
	floorIPLen   = 20 // the IPv4 header the floor writes: no options
	floorTCPLen  = 20 // the TCP header the floor writes, but for a SYN-ACK's
	floorARPLen  = 28 // RFC 826 for Ethernet and IPv4
	floorUDPLen  = 8
	floorTTL     = 64     // Linux's sysctl_ip_default_ttl
	floorWindow  = 0xffff // the window field, unscaled for the reflector
	floorWScale  = 14     // the sink's window scale: 65535<<14, 1 GB (RFC 7323 section 2.3's maximum)
	floorISNMult = 2654435761

	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
)

// floorISN is the floor's initial sequence number for a SYN with sequence
// number seq: a multiplicative hash, so that a connection's ISN differs
// from its peer's, and the same SYN (a retransmission) gets the same one
// without the floor remembering it.
func floorISN(seq uint32) uint32 { return seq * floorISNMult }

// floorARP writes into out the ARP reply to in, a frame holding an ARP
// request for ip, and returns the reply's length; 0 if in is no such
// request. in and out must not overlap; out holds at least 42 bytes.
func floorARP(in, out []byte, ip [4]byte, mac [6]byte) int {
	if len(in) < floorEthLen+floorARPLen {
		return 0
	}
	a := in[floorEthLen:]
	// htype Ethernet, ptype IPv4, hlen 6, plen 4, op request
	if binary.BigEndian.Uint16(a) != 1 || binary.BigEndian.Uint16(a[2:]) != 0x0800 || a[4] != 6 || a[5] != 4 ||
		binary.BigEndian.Uint16(a[6:]) != 1 || [4]byte(a[24:28]) != ip {
		return 0
	}
	copy(out, a[8:14]) // to the sender's MAC
	copy(out[6:], mac[:])
	binary.BigEndian.PutUint16(out[12:], 0x0806)
	r := out[floorEthLen:]
	binary.BigEndian.PutUint16(r, 1)
	binary.BigEndian.PutUint16(r[2:], 0x0800)
	r[4], r[5] = 6, 4
	binary.BigEndian.PutUint16(r[6:], 2) // reply
	copy(r[8:], mac[:])
	copy(r[14:], ip[:])
	copy(r[18:], a[8:14])  // target MAC: the sender's
	copy(r[24:], a[14:18]) // target IP: the sender's
	return floorEthLen + floorARPLen
}

// floorIPv4 checks that in is an unfragmented IPv4 packet (behind its
// Ethernet header) for ip and returns its IP header and the L4 bytes its
// total length covers; ok false if not. A total length of 0 in a GSO
// super-frame (BIG TCP, tcp_gso_segment's large packets) covers the rest
// of the frame.
func floorIPv4(in []byte, ip [4]byte, gso bool) (iph, l4 []byte, ok bool) {
	if len(in) < floorEthLen+floorIPLen || binary.BigEndian.Uint16(in[12:]) != 0x0800 {
		return nil, nil, false
	}
	iph = in[floorEthLen:]
	ihl := int(iph[0]&0xf) * 4
	tot := int(binary.BigEndian.Uint16(iph[2:]))
	if tot == 0 && gso {
		tot = len(iph)
	}
	if iph[0]>>4 != 4 || ihl < floorIPLen || tot < ihl || tot > len(iph) ||
		binary.BigEndian.Uint16(iph[6:])&0x3fff != 0 || [4]byte(iph[16:20]) != ip {
		return nil, nil, false
	}
	return iph[:ihl], iph[ihl:tot], true
}

// floorHeaders writes the Ethernet and IPv4 headers of a reply to the
// packet whose frame is in and IP header iph, carrying l4len bytes of
// protocol proto, and returns the L4 checksum's seed: the pseudo-header
// sum (RFC 793 section 3.1, RFC 768). The IPv4 header gets its checksum.
func floorHeaders(out, in, iph []byte, ip [4]byte, mac [6]byte, proto byte, l4len int) uint16 {
	copy(out, in[6:12]) // to the sender's MAC
	copy(out[6:], mac[:])
	binary.BigEndian.PutUint16(out[12:], 0x0800)
	o := out[floorEthLen : floorEthLen+floorIPLen]
	o[0], o[1] = 0x45, 0
	binary.BigEndian.PutUint16(o[2:], uint16(floorIPLen+l4len))
	binary.BigEndian.PutUint16(o[4:], 0)      // id: DF set, as Linux's for a non-fragmentable packet (ip_select_ident)
	binary.BigEndian.PutUint16(o[6:], 0x4000) // DF
	o[8], o[9] = floorTTL, proto
	binary.BigEndian.PutUint16(o[10:], 0)
	copy(o[12:], ip[:])
	copy(o[16:], iph[12:16])
	binary.BigEndian.PutUint16(o[10:], ^checksum.Checksum(o, 0))
	pseudo := checksum.Checksum(o[12:20], uint16(proto))
	return checksum.Combine(pseudo, uint16(l4len))
}

// floorReflect writes into out the reflector's answer to the frame in and
// returns the answer's length, 0 for none: an ARP reply to a request for
// ip; for TCP to ip a SYN-ACK to a SYN (MSS mss, no other option), the
// payload echoed to a segment with payload (seq = the peer's ack, ack =
// its seq + length, plus one for a FIN), a FIN-ACK to a bare FIN; UDP to
// ip echoed. RST, pure ACKs and anything else get nothing. It keeps no
// state: the answer depends on in alone. So an echo's sequence number is
// the peer's ack, which is right while the peer has one segment in flight
// (request/response with requests of at most one MSS); a second segment
// sent before the first's echo arrived would be echoed over it. in and out must not overlap; out
// must hold len(in) plus 4 bytes (a SYN-ACK's MSS option). It does not
// allocate.
func floorReflect(in, out []byte, ip [4]byte, mac [6]byte, mss uint16) int {
	if len(in) < floorEthLen {
		return 0
	}
	if binary.BigEndian.Uint16(in[12:]) == 0x0806 {
		return floorARP(in, out, ip, mac)
	}
	iph, l4, ok := floorIPv4(in, ip, false)
	if !ok {
		return 0
	}
	o4 := out[floorEthLen+floorIPLen:]
	var n int
	var csumAt int
	switch iph[9] {
	case 6:
		n, csumAt = floorReflectTCP(l4, o4, mss), 16
	case 17:
		n, csumAt = floorReflectUDP(l4, o4), 6
	}
	if n == 0 {
		return 0
	}
	seed := floorHeaders(out, in, iph, ip, mac, iph[9], n)
	c := ^checksum.Checksum(o4[:n], seed)
	if iph[9] == 17 && c == 0 {
		c = 0xffff // RFC 768: a computed zero is sent as all ones
	}
	binary.BigEndian.PutUint16(o4[csumAt:], c)
	return floorEthLen + floorIPLen + n
}

// floorReflectTCP writes the reflector's TCP answer (header and payload,
// checksum zero) to the segment t into o and returns its length, 0 for
// none.
func floorReflectTCP(t, o []byte, mss uint16) int {
	if len(t) < floorTCPLen {
		return 0
	}
	doff := int(t[12]>>4) * 4
	if doff < floorTCPLen || doff > len(t) {
		return 0
	}
	fl, plen := t[13], len(t)-doff
	seq, ack := binary.BigEndian.Uint32(t[4:]), binary.BigEndian.Uint32(t[8:])
	if fl&tcpRST != 0 {
		return 0
	}
	if fl&(tcpSYN|tcpACK) == tcpSYN {
		return floorTCPHeader(o, t, floorISN(seq), seq+1, tcpSYN|tcpACK, mss, false)
	}
	if fl&tcpSYN != 0 || fl&tcpACK == 0 || (plen == 0 && fl&tcpFIN == 0) {
		return 0 // pure ACKs and oddities
	}
	next := seq + uint32(plen)
	flags := byte(tcpACK) | fl&tcpFIN
	if fl&tcpFIN != 0 {
		next++
	}
	if plen > 0 {
		flags |= tcpPSH
	}
	n := floorTCPHeader(o, t, ack, next, flags, 0, false)
	return n + copy(o[n:], t[doff:])
}

// floorTCPHeader writes at o the TCP header of a reply to the segment t
// (ports swapped) with seq, ack and flags, window 65535, checksum zero;
// with mss > 0 an MSS option, with wscale also a window scale of
// floorWScale (RFC 7323 section 2). It returns the header's length.
func floorTCPHeader(o, t []byte, seq, ack uint32, flags byte, mss uint16, wscale bool) int {
	n := floorTCPLen
	if mss > 0 {
		n += 4
		if wscale {
			n += 4
		}
	}
	copy(o[0:2], t[2:4])
	copy(o[2:4], t[0:2])
	binary.BigEndian.PutUint32(o[4:], seq)
	binary.BigEndian.PutUint32(o[8:], ack)
	o[12], o[13] = byte(n/4)<<4, flags
	binary.BigEndian.PutUint16(o[14:], floorWindow)
	binary.BigEndian.PutUint32(o[16:], 0) // checksum, urgent pointer
	if mss > 0 {
		o[20], o[21] = 2, 4 // MSS, RFC 9293 section 3.2
		binary.BigEndian.PutUint16(o[22:], mss)
		if wscale {
			o[24], o[25], o[26], o[27] = 1, 3, 3, floorWScale // NOP, window scale
		}
	}
	return n
}

// floorReflectUDP writes the echo of the datagram u (ports swapped,
// checksum zero) into o and returns its length, 0 for none.
func floorReflectUDP(u, o []byte) int {
	if len(u) < floorUDPLen {
		return 0
	}
	ul := int(binary.BigEndian.Uint16(u[4:]))
	if ul < floorUDPLen || ul > len(u) {
		return 0
	}
	copy(o[0:2], u[2:4])
	copy(o[2:4], u[0:2])
	binary.BigEndian.PutUint16(o[4:], uint16(ul))
	binary.BigEndian.PutUint16(o[6:], 0)
	copy(o[floorUDPLen:ul], u[floorUDPLen:ul])
	return ul
}

// floorTCPReply writes into out a whole frame: the TCP segment without
// payload answering the segment t of the frame in (IP header iph), with
// seq, ack and flags, and its checksums; a SYN-ACK carries MSS mss and a
// window scale. It returns the frame's length.
func floorTCPReply(out, in, iph, t []byte, ip [4]byte, mac [6]byte, seq, ack uint32, flags byte, mss uint16) int {
	o4 := out[floorEthLen+floorIPLen:]
	var m uint16
	if flags&tcpSYN != 0 {
		m = mss
	}
	n := floorTCPHeader(o4, t, seq, ack, flags, m, true)
	seed := floorHeaders(out, in, iph, ip, mac, 6, n)
	binary.BigEndian.PutUint16(o4[16:], ^checksum.Checksum(o4[:n], seed))
	return floorEthLen + floorIPLen + n
}

// floorSinkFlows bounds the connections the sink tells apart: the bench's
// -P allows 64 streams.
const floorSinkFlows = 64

// floorSink is the bulk sink's receive side: it ACKs every TCP segment (a
// GSO super-frame counts as one) read from the TAP with one pure ACK, and
// counts the bytes. The ACK is what a receiver that never lacks memory
// sends: ack = the end of the in-order data (rcv_nxt), window 65535 << 14,
// seq = the peer's ack. To know rcv_nxt, and to count each byte once, it
// keeps the next expected sequence number of up to floorSinkFlows
// connections by the peer's port; nothing else. A segment past rcv_nxt (a
// loss) gets a duplicate ACK and is not counted; one before it (a
// retransmission) counts only its new bytes. One goroutine uses it.
type floorSink struct {
	ip  [4]byte
	mac [6]byte
	mss uint16

	flows [floorSinkFlows]floorSinkFlow
	nflow int

	bytes   uint64 // in-order payload bytes
	segs    uint64 // reads with payload
	acks    uint64 // ACKs written (by the caller: floorSinkStep only builds them)
	gaps    uint64 // segments past rcv_nxt
	retrans uint64 // segments (partly) before rcv_nxt
	ignored uint64 // frames with no answer
}

type floorSinkFlow struct {
	port uint16 // the peer's
	next uint32 // rcv_nxt
}

// flow returns port's flow, making it (or reusing the oldest slot) if
// absent.
func (s *floorSink) flow(port uint16) *floorSinkFlow {
	for i := range s.nflow {
		if s.flows[i].port == port {
			return &s.flows[i]
		}
	}
	i := s.nflow
	if i == len(s.flows) {
		copy(s.flows[:], s.flows[1:])
		i--
	} else {
		s.nflow++
	}
	s.flows[i] = floorSinkFlow{port: port}
	return &s.flows[i]
}

// step answers one frame in (behind the virtio-net header, which the
// caller strips) into out and returns the answer's length, 0 for none.
// It counts payload bytes into s. out must hold 70 bytes.
func (s *floorSink) step(in, out []byte) int {
	if len(in) >= floorEthLen && binary.BigEndian.Uint16(in[12:]) == 0x0806 {
		n := floorARP(in, out, s.ip, s.mac)
		if n == 0 {
			s.ignored++
		}
		return n
	}
	iph, t, ok := floorIPv4(in, s.ip, true)
	if !ok || iph[9] != 6 || len(t) < floorTCPLen {
		s.ignored++
		return 0
	}
	doff := int(t[12]>>4) * 4
	if doff < floorTCPLen || doff > len(t) {
		s.ignored++
		return 0
	}
	fl, plen := t[13], uint32(len(t)-doff)
	seq, ack := binary.BigEndian.Uint32(t[4:]), binary.BigEndian.Uint32(t[8:])
	port := binary.BigEndian.Uint16(t[0:])
	if fl&tcpRST != 0 {
		s.ignored++
		return 0
	}
	if fl&(tcpSYN|tcpACK) == tcpSYN {
		f := s.flow(port)
		f.next = seq + 1
		return floorTCPReply(out, in, iph, t, s.ip, s.mac, floorISN(seq), f.next, tcpSYN|tcpACK, s.mss)
	}
	if fl&tcpSYN != 0 || fl&tcpACK == 0 || (plen == 0 && fl&tcpFIN == 0) {
		s.ignored++
		return 0 // pure ACKs and oddities
	}
	f := s.flow(port)
	end := seq + plen
	switch {
	case seq == f.next:
		s.bytes += uint64(plen)
		f.next = end
	case seqBefore(f.next, seq):
		s.gaps++
	default: // before rcv_nxt: a retransmission; count what is new
		s.retrans++
		if seqBefore(f.next, end) {
			s.bytes += uint64(end - f.next)
			f.next = end
		}
	}
	if plen > 0 {
		s.segs++
	}
	flags := byte(tcpACK)
	if fl&tcpFIN != 0 && end == f.next {
		f.next++
		flags |= tcpFIN
	}
	return floorTCPReply(out, in, iph, t, s.ip, s.mac, ack, f.next, flags, 0)
}

// seqBefore reports a < b in sequence space (RFC 9293 section 3.4).
func seqBefore(a, b uint32) bool { return int32(a-b) < 0 }
