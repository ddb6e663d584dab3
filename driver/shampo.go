package driver

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ustack/ustack/bufpool"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

// HWGROMode selects hardware GRO (mlx5 SHAMPO), as `ethtool -K rx-gro-hw`.
type HWGROMode uint8

const (
	// HWGROOff places whole frames in the striding ring.
	HWGROOff HWGROMode = iota
	// HWGROOn is SHAMPO: the headers of each TCP frame go to a header
	// buffer, its payload to a per-session data reservation, back to back;
	// the driver builds one packet per session, one frag per payload.
	HWGROOn
	// HWGROCoalesce is SHAMPO with the SHAMPO coalescing patch: a payload that continues the
	// previous one on the same page extends that frag, up to the page.
	HWGROCoalesce
)

// String returns the flag value for m.
func (m HWGROMode) String() string {
	switch m {
	case HWGROOn:
		return "on"
	case HWGROCoalesce:
		return "coalesce"
	}
	return "off"
}

// ParseHWGRO parses "off", "on" or "coalesce".
func ParseHWGRO(s string) (HWGROMode, error) {
	switch s {
	case "off":
		return HWGROOff, nil
	case "on":
		return HWGROOn, nil
	case "coalesce":
		return HWGROCoalesce, nil
	}
	return 0, fmt.Errorf("hw-gro %q: want off, on or coalesce", s)
}

const (
	// shampoHeaderEntry is the size of one header buffer entry: the
	// largest header SHAMPO splits off (MLX5E_SHAMPO_LOG_MAX_HEADER_ENTRY_SIZE).
	shampoHeaderEntry = 256
	// DefaultReservation is the data reservation of one session: room for
	// a 64 KB GRO packet.
	DefaultReservation = 64 << 10
	// DefaultHWGROTimeout ends a session that has seen no frame for this
	// long (the hardware's LRO/GRO session timer).
	DefaultHWGROTimeout = 100 * time.Microsecond
)

// shampoStats are the hardware GRO counters.
type shampoStats struct {
	starts, sessions, packets, frags, payload, mappable, resvBytes, resvUsed atomic.Uint64
	hdrEntries, hdrBytes                                                     atomic.Uint64
	// Why sessions end: on the NIC, a frame whose flags end the train (PSH,
	// FIN, URG, RST, SYN), and a frame that would have continued the
	// session but came after the timer; in the driver, why a session
	// packet went up: the CQE's flush bit, a CQE that does not match, no
	// room (mlx5e_hw_gro_skb_has_enough_space), the end of a poll.
	endFlags, endTimeout                           atomic.Uint64
	flushCQE, flushMismatch, flushSpace, flushPoll atomic.Uint64
}

func (s *shampoStats) each(fn func(string, uint64)) {
	fn("rx_gro_hw_session_starts", s.starts.Load())
	fn("rx_gro_hw_sessions", s.sessions.Load())
	fn("rx_gro_hw_packets", s.packets.Load())
	fn("rx_gro_hw_frags", s.frags.Load())
	fn("rx_gro_hw_payload_bytes", s.payload.Load())
	fn("rx_gro_hw_mappable_bytes", s.mappable.Load())
	fn("rx_gro_hw_resv_bytes", s.resvBytes.Load())
	fn("rx_gro_hw_resv_used_bytes", s.resvUsed.Load())
	fn("rx_gro_hw_hdr_entries", s.hdrEntries.Load())
	fn("rx_gro_hw_hdr_bytes", s.hdrBytes.Load())
	fn("rx_gro_hw_end_flags", s.endFlags.Load())
	fn("rx_gro_hw_end_timeout", s.endTimeout.Load())
	fn("rx_gro_hw_flush_cqe", s.flushCQE.Load())
	fn("rx_gro_hw_flush_mismatch", s.flushMismatch.Load())
	fn("rx_gro_hw_flush_space", s.flushSpace.Load())
	fn("rx_gro_hw_flush_poll", s.flushPoll.Load())
}

// session is the NIC's open SHAMPO session: one flow whose payloads are
// being laid back to back into a reservation.
type session struct {
	open bool
	// The first frame's headers (hdrLen bytes; the IP header at l3, TCP
	// at l4), which the packet the driver builds carries, and what a
	// frame must agree with to join (sameHeaders).
	hdr     [shampoHeaderEntry]byte
	hdrLen  int
	l3, l4  int
	v6      bool
	id      uint16 // the first frame's IPv4 ID
	fixedID bool   // the IPv4 IDs stay fixed (DF), decided by the second frame
	segs    int    // frames in the session
	mss     int    // the first frame's payload: no later one may be longer
	nextSeq uint32
	last    int64 // when the session's last frame arrived
	resv    pageSet
	off     int
}

// placeSHAMPO places a TCP frame the SHAMPO way: its headers into the next
// header buffer entry, its payload into the session's reservation, and
// posts a CQE reporting fi and csum, whose Match bit says whether it
// continues the session. It
// reports false if the frame is not one SHAMPO takes (the caller places it
// whole).
//
// The session match is the software GRO's (gro.mergeTCP, from the kernel's
// tcp_gro_receive and inet_gro_flush / ipv6_gro_flush): a frame joins only
// if its headers agree with the session's first frame (sameHeaders), its
// sequence number continues the session, its payload is no longer than
// the first one's, and it does not carry CWR; so the headers the driver
// builds the packet with (mlx5e_shampo_update_hdr: the first frame's,
// lengths fixed) describe every merged frame. A frame with flags that end
// a train (URG, PSH, RST, SYN, FIN), a payload shorter than the first, or
// headers software GRO never merges (IPv4 options, IPv6 extension headers)
// ends its session once placed.
func (n *nicState) placeSHAMPO(hdr, payload []byte, fi *FrameInfo, csum CsumState) bool {
	d := n.d
	if len(hdr) > shampoHeaderEntry || len(payload) == 0 || fi.Fragment || fi.L4 != L4TCP || len(payload) > d.cfg.Reservation {
		return false
	}
	l3, l4 := fi.L2Len, fi.L2Len+fi.L3Len
	if len(hdr) < l4+20 {
		return false
	}
	tcp := hdr[l4:]
	seq, flags := binary.BigEndian.Uint32(tcp[4:]), tcp[13]
	s := &n.sess
	now := n.now
	// A session ends before its packet's IP length would pass 65535 (the
	// driver's max LRO size; a 64 KB reservation holds a few bytes more):
	// the packet carries the first frame's headers, s.hdrLen bytes.
	fits := s.off+len(payload) <= s.resv.size && s.hdrLen-s.l3+s.off+len(payload) <= 0xffff
	inTime := now-s.last < int64(d.cfg.HWGROTimeout)
	match := s.open && seq == s.nextSeq && fits && len(payload) <= s.mss && flags&tcpFlagCWR == 0 && n.sameHeaders(hdr, fi)
	if match && !inTime {
		d.shampo.endTimeout.Add(1)
		match = false
	}
	if !match {
		d.shampo.starts.Add(1)
		n.closeSession()
		if !s.resv.fill(d.pool, d.cfg.Reservation) {
			n.dropped(DropNoBuffer)
			return true
		}
		d.shampo.resvBytes.Add(uint64(s.resv.size))
		s.open, s.off, s.segs = true, 0, 0
		s.hdrLen = copy(s.hdr[:], hdr)
		s.l3, s.l4, s.v6 = l3, l4, fi.L3 == L3IPv6
		s.mss, s.fixedID = len(payload), false
		if !s.v6 {
			s.id = binary.BigEndian.Uint16(hdr[l3+4:])
		}
	}
	s.last = now
	if !n.waitRoom(len(payload)) {
		n.dropped(DropOutOfBuffer)
		return true
	}
	cqe := &d.cq[n.prod&d.mask]
	hi := n.prod & d.mask // one header entry per CQE: freed when the CQE is
	copy(d.headers[int(hi)*shampoHeaderEntry:], hdr)
	d.shampo.hdrEntries.Add(1)
	d.shampo.hdrBytes.Add(uint64(len(hdr)))
	cqe.ByteCount = uint32(len(hdr) + len(payload))
	cqe.Info = *fi
	cqe.TunHdrLen, cqe.TunMinLen = 0, 0 // SHAMPO takes plain TCP only
	setRSS(cqe, hdr)
	cqe.Csum = csum
	cqe.GSOSize = 0
	cqe.HWGRO = true
	cqe.Match = match
	cqe.Flush = false
	cqe.HeaderIndex = uint16(hi) // Config allows no ring past 16 bits (maxHWGRORing)
	cqe.HeaderSize = uint16(len(hdr))
	cqe.DataOffset = uint32(s.off)
	cqe.NFrags = 0
	s.resv.write(cqe, s.off, payload)
	n.charge(len(payload))
	s.off += len(payload)
	s.segs++
	s.nextSeq = seq + uint32(len(payload))
	d.shampo.resvUsed.Add(uint64(len(payload)))
	n.prod++
	n.pending++
	n.pendBytes += len(hdr) + len(payload)
	// tcp_gro_receive's out_check_final: these flags, or a segment shorter
	// than the MSS, end the train; so do headers GRO never merges, and a
	// full reservation. The frame joins the session and its CQE carries
	// the flush bit (cqe->shampo.flush): the driver hands the packet up
	// with it, and mlx5e_shampo_update_fin_psh_flags copies its PSH and
	// FIN into the packet's header. A bulk sender's TSO frames end with
	// PSH (tcp_push's tcp_mark_push on the write queue's tail), so each
	// session holds at most one of them.
	alone := !s.v6 && s.l4-s.l3 != ipv4MinHdrLen || s.v6 && s.l4-s.l3 != ipv6HdrLen
	endFlags := flags&(tcpFlagURG|tcpFlagPSH|tcpFlagRST|tcpFlagSYN|tcpFlagFIN) != 0
	if endFlags || len(payload) < s.mss || alone || s.off == s.resv.size {
		if endFlags {
			d.shampo.endFlags.Add(1)
		}
		cqe.Flush = true
		n.closeSession()
	}
	return true
}

// sameHeaders reports whether a frame's headers (hdr, parsed into fi) let
// it join the open session: the rules of gro.mergeTCP and gro.sameNet,
// which are the kernel's.
//
//   - Ethernet: the same header (compare_ether_header).
//   - IPv4 (inet_gro_receive, inet_gro_flush): no options, the same TOS
//     (ECN bits included: a CE mark starts a new packet), TTL, protocol,
//     addresses and DF, no other fragment bits, and an ID that goes up by
//     one per frame or, with DF, stays fixed as the second frame decides.
//     Total length and checksum may differ.
//   - IPv6 (ipv6_gro_receive, ipv6_gro_flush): no extension headers, the
//     same traffic class, flow label, next header, hop limit and
//     addresses. Payload length may differ.
//   - TCP (tcp_gro_receive): the same ports, ACK number, data offset,
//     window and flags but for CWR, FIN and PSH (tcp_flag_word), and the
//     same options byte for byte (a new timestamp starts a new packet, so
//     none is lost). Sequence number, checksum and urgent pointer may
//     differ; the caller checks the sequence.
//
// It records the IPv4 ID pattern when the second frame decides it.
func (n *nicState) sameHeaders(hdr []byte, fi *FrameInfo) bool {
	s := &n.sess
	l3, l4 := fi.L2Len, fi.L2Len+fi.L3Len
	if len(hdr) != s.hdrLen || l3 != s.l3 || l4 != s.l4 || (fi.L3 == L3IPv6) != s.v6 {
		return false
	}
	h := s.hdr[:s.hdrLen]
	if !bytes.Equal(hdr[:l3], h[:l3]) {
		return false
	}
	ip, hip := hdr[l3:l4], h[l3:l4]
	if s.v6 {
		// Version, traffic class, flow label; next header, hop limit,
		// addresses.
		if len(ip) != ipv6HdrLen || !bytes.Equal(ip[:4], hip[:4]) || !bytes.Equal(ip[6:], hip[6:]) {
			return false
		}
	} else {
		// Version and IHL, TOS; flags and fragment offset, TTL,
		// protocol; addresses.
		const df = 0x40
		if len(ip) != ipv4MinHdrLen || !bytes.Equal(ip[:2], hip[:2]) || !bytes.Equal(ip[6:10], hip[6:10]) ||
			!bytes.Equal(ip[12:], hip[12:]) || ip[6]&^df != 0 || ip[7] != 0 {
			return false
		}
		off := binary.BigEndian.Uint16(ip[4:]) - s.id
		fixed := s.fixedID
		if s.segs == 1 && ip[6]&df != 0 && off == 0 {
			fixed = true
		}
		if fixed && off != 0 || !fixed && off != uint16(s.segs) {
			return false
		}
		s.fixedID = fixed
	}
	tcp, htcp := hdr[l4:], h[l4:]
	const mergeable = tcpFlagCWR | tcpFlagFIN | tcpFlagPSH
	return bytes.Equal(tcp[:4], htcp[:4]) && bytes.Equal(tcp[8:13], htcp[8:13]) && // ports; ACK number, data offset
		(tcp[13]^htcp[13])&^mergeable == 0 && bytes.Equal(tcp[14:16], htcp[14:16]) && // flags; window
		bytes.Equal(tcp[20:], htcp[20:]) // options
}

// closeSession ends the open session and hands its reservation's pages
// back to the pool (packets keep the ones they use).
func (n *nicState) closeSession() {
	s := &n.sess
	if !s.open {
		return
	}
	s.open = false
	if s.off > 0 && s.off < s.resv.size {
		// The reservation's unused end: its pages stay held by the
		// session's payloads. A reservation no payload went into (its
		// first frame dropped) holds nothing.
		n.chargeTail(s.resv.size - s.off)
	}
	s.resv.release(n.d.pool)
}

// Extra TCP flag bits (gso.go has FIN, PSH and CWR).
const (
	tcpFlagSYN = 0x02
	tcpFlagRST = 0x04
	tcpFlagURG = 0x20
)

// shampoBuilder is the poll loop's side: it builds one packet per session
// from the CQEs, headers from the header buffer, payloads as frags.
type shampoBuilder struct {
	pkt   *bufpool.Packet
	flags byte // PSH/FIN seen in the session's frames
	l3    int  // offset of the IP header
	l4    int  // offset of the TCP header
	v4    bool
	last  *bufpool.Page
}

// shampoAdd takes one hardware-GRO CQE; it returns the finished packets
// to hand up, in order, each nil if none: done, the open packet the CQE
// does not continue (or has no room for), and flushed, the packet the CQE
// joined when it carries the flush bit (mlx5e_handle_rx_cqe_mpwrq_shampo
// then calls mlx5e_shampo_flush_skb at once).
func (d *Driver) shampoAdd(cqe *CQE) (done, flushed *bufpool.Packet) {
	b := &d.hwb
	dataBcnt := int(cqe.ByteCount) - int(cqe.HeaderSize)
	if b.pkt != nil {
		// mlx5e_handle_rx_cqe_mpwrq_shampo: a CQE that does not match,
		// or would not fit (has_enough_space), flushes the packet first.
		var why *atomic.Uint64
		switch {
		case !cqe.Match:
			why = &d.shampo.flushMismatch
		case !d.hwGROHasEnoughSpace(b.pkt, dataBcnt) || len(b.pkt.Frags)+int(cqe.NFrags) > cap(b.pkt.Frags):
			why = &d.shampo.flushSpace
		}
		if why != nil {
			why.Add(1)
			done = d.shampoFlush()
		}
	}
	if b.pkt == nil {
		p := bufpool.NewPacket()
		h := d.headers[int(cqe.HeaderIndex)*shampoHeaderEntry:][:cqe.HeaderSize]
		p.Linear = append(p.Linear, h...)
		p.HdrLen = len(h)
		p.CsumVerified = cqe.Csum != CsumNone
		p.GSOSize = uint16(int(cqe.ByteCount) - len(h))
		p.Segs = 0
		p.RxMeta = cqeMeta(cqe) // the first frame's, as the session's headers
		b.pkt, b.flags, b.last = p, 0, nil
		b.l3 = cqe.Info.L2Len
		b.l4 = cqe.Info.L2Len + cqe.Info.L3Len
		b.v4 = cqe.Info.L3 == L3IPv4
	}
	p := b.pkt
	p.Segs++
	// mlx5e_shampo_update_fin_psh_flags: PSH and FIN of every frame go
	// into the packet's header, read at the frame's own TCP offset.
	b.flags |= d.headers[int(cqe.HeaderIndex)*shampoHeaderEntry+cqe.Info.L2Len+cqe.Info.L3Len+13] & (tcpFlagPSH | tcpFlagFIN)
	coalesce := d.cfg.HWGRO == HWGROCoalesce
	for i := 0; i < int(cqe.NFrags); i++ {
		f := cqe.Frags[i]
		cqe.Frags[i] = bufpool.Frag{}
		if k := len(p.Frags) - 1; coalesce && k >= 0 {
			last := &p.Frags[k]
			// skb_can_coalesce: the same page, starting where the last
			// frag ends, and never beyond the page.
			if last.Page == f.Page && last.Off+last.Len == f.Off && int(last.Len+f.Len) <= len(f.Page.Bytes()) {
				last.Len += f.Len
				f.Page.DecRef() // the frag's reference is now the last one's
				continue
			}
		}
		p.Frags = append(p.Frags, f)
	}
	cqe.NFrags = 0
	d.shampo.packets.Add(1)
	if cqe.Flush {
		d.shampo.flushCQE.Add(1)
		flushed = d.shampoFlush()
	}
	return done, flushed
}

// hwGROMaxSize is GRO_LEGACY_MAX_SIZE, the size a SHAMPO skb may reach.
const hwGROMaxSize = 65536

// hwGROHasEnoughSpace is mlx5e_hw_gro_skb_has_enough_space: the open
// session packet p takes a payload of dataBcnt more bytes only if
// PAGE_SIZE * nr_frags + dataBcnt stays within GRO_LEGACY_MAX_SIZE, each
// frag counted as a whole page whatever it holds; with pages of 64 KB or
// more, skb->len + dataBcnt. PAGE_SIZE is the pool's base page (the
// kernel's, whatever order the pool allocates at). Without coalescing
// every payload is a frag of its own (two where it crosses a page), so a
// session of 1448-byte payloads ends after 16 frags; coalesced frags fill
// pages, and it reaches about 44 payloads.
func (d *Driver) hwGROHasEnoughSpace(p *bufpool.Packet, dataBcnt int) bool {
	page, skbLen := d.pool.PageSize(), 0
	if page >= hwGROMaxSize {
		skbLen = len(p.Linear)
		for _, f := range p.Frags {
			skbLen += int(f.Len)
		}
	}
	return hwGROHasEnoughSpace(page, len(p.Frags), skbLen, dataBcnt)
}

// hwGROHasEnoughSpace is the rule of Driver.hwGROHasEnoughSpace for a
// packet of nrFrags frags and skbLen bytes, with pages of pageSize.
func hwGROHasEnoughSpace(pageSize, nrFrags, skbLen, dataBcnt int) bool {
	if pageSize >= hwGROMaxSize {
		return skbLen+dataBcnt <= hwGROMaxSize
	}
	return pageSize*nrFrags+dataBcnt <= hwGROMaxSize
}

// shampoFlush finishes the open session packet: IP lengths and flags fixed
// for the merged size, as the driver does with the hardware's headers.
func (d *Driver) shampoFlush() *bufpool.Packet {
	b := &d.hwb
	p := b.pkt
	if p == nil {
		return nil
	}
	b.pkt = nil
	payload := 0
	var mappable uint64
	for _, f := range p.Frags {
		payload += int(f.Len)
		if f.Off == 0 && int(f.Len) == len(f.Page.Bytes()) {
			mappable += uint64(f.Len)
		}
	}
	p.Len = len(p.Linear) + payload
	ip := p.Linear[b.l3:]
	if b.v4 {
		binary.BigEndian.PutUint16(ip[2:], uint16(p.Len-b.l3))
		ip[10], ip[11] = 0, 0
		checksum.Put(ip[10:], ^checksum.Checksum(ip[:b.l4-b.l3], 0))
	} else {
		binary.BigEndian.PutUint16(ip[4:], uint16(p.Len-b.l3-40))
	}
	p.Linear[b.l4+13] |= b.flags
	if p.Segs < 2 {
		p.Segs, p.GSOSize = 1, 0
	}
	st := &d.shampo
	st.sessions.Add(1)
	st.frags.Add(uint64(len(p.Frags)))
	st.payload.Add(uint64(payload))
	st.mappable.Add(mappable)
	return p
}
