package stack

import (
	"encoding/binary"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/driver"
)

// The reference FuzzPipeline judges the sockets by: from the bytes written
// into the wire (a virtio-net header and a frame), which datagrams a UDP
// socket could read, which IP fragments a reassembly could join, and which
// stream bytes a TCP connection could read at which sequence numbers. It
// follows the kernel's length rules, not ustack's code: the IP packet ends
// at its total length (ip_rcv_core's pskb_trim_rcsum; ipv6_rcv's
// payload_len), the datagram at the UDP length, which must fit the IP
// payload (__udp4_lib_rcv's short_packet); an IP fragment is no datagram
// before ip_defrag joins it; a UDP GSO super-frame is the datagrams
// __udp_gso_segment cuts it into, at most maxRefGSOSegs of them; only
// datagrams to the stack's own, broadcast or multicast addresses reach a
// socket (ip_route_input_noref's RTN_LOCAL). It ignores checksums: a
// checksum can only make the stack drop a frame, and DATA_VALID vouches for
// checksums only, so the reference is a superset of what a correct stack
// delivers, and anything a socket reads outside it is wrong.

// maxRefGSOSegs bounds the datagrams a UDP GSO super-frame may be cut
// into: UDP_MAX_SEGMENTS, 128 since Linux 6.11 (64 before), past which
// virtio_net_hdr_to_skb refuses the header. A super-frame of more (a
// gso_size of 1 over 60 KB) delivers nothing.
const maxRefGSOSegs = 128

// refAddrs are the stack's addresses as the reference sees them.
type refAddrs struct {
	own, bcast []netip.Addr
	// tunnel is the tunnel's local outer address (invalid: no tunnel):
	// IPv4-in-IPv6 and IPv6-in-IPv6 to it are decapsulated.
	tunnel netip.Addr
}

// accepts reports whether a datagram to dst may reach a socket bound to
// the unspecified address: an own address, a broadcast one, any multicast
// group (a superset of the groups joined).
func (a *refAddrs) accepts(dst netip.Addr) bool {
	dst = dst.Unmap()
	if dst.IsMulticast() {
		return true
	}
	for _, o := range a.own {
		if o == dst {
			return true
		}
	}
	for _, o := range a.bcast {
		if o == dst {
			return true
		}
	}
	return false
}

// refDgram is a datagram the reference lets a socket read.
type refDgram struct {
	src, dst     netip.Addr
	sport, dport uint16
	payload      []byte
}

// refFrag is an IP fragment: its part of the fragmented packet's payload
// (the L4 header and data) at off.
type refFrag struct {
	v6       bool
	src, dst netip.Addr
	id       uint32
	proto    uint8
	off      int
	more     bool
	data     []byte
}

// refSeg is a TCP segment's payload at its sequence number.
type refSeg struct {
	src, dst     netip.Addr
	sport, dport uint16
	seq          uint32
	syn          bool
	payload      []byte
}

// refOut collects what the reference finds in frames.
type refOut struct {
	dgrams []refDgram
	frags  []refFrag
	segs   []refSeg
}

// refParse adds to out what the frame b (the virtio-net header first, then
// an Ethernet frame, or with l3 an IP packet) could deliver. It never
// panics, whatever b holds.
func refParse(b []byte, l3 bool, a *refAddrs, out *refOut) {
	var vh driver.VirtioNetHdr
	if !vh.Decode(b) {
		return
	}
	f := b[driver.VirtioNetHdrLen:]
	if l3 {
		refIP(f, 0, &vh, a, out, 0)
		return
	}
	if len(f) < header.EthernetMinimumSize {
		return
	}
	// A VLAN tag (no VLAN is configured) or another EtherType: nothing.
	et := binary.BigEndian.Uint16(f[12:])
	if et != uint16(header.IPv4ProtocolNumber) && et != uint16(header.IPv6ProtocolNumber) {
		return
	}
	refIP(f[header.EthernetMinimumSize:], et, &vh, a, out, 0)
}

// refIP parses the IP packet at the start of b; et is the EtherType that
// announced it (0: none, the version decides). depth counts tunnel
// headers already taken off.
func refIP(b []byte, et uint16, vh *driver.VirtioNetHdr, a *refAddrs, out *refOut, depth int) {
	if len(b) == 0 {
		return
	}
	v := b[0] >> 4
	switch {
	case et == uint16(header.IPv4ProtocolNumber) && v != 4, et == uint16(header.IPv6ProtocolNumber) && v != 6:
		return
	}
	switch v {
	case 4:
		if len(b) < header.IPv4MinimumSize {
			return
		}
		ip := header.IPv4(b)
		ihl, tot := int(ip.HeaderLength()), int(ip.TotalLength())
		if ihl < header.IPv4MinimumSize || tot < ihl || tot > len(b) {
			return
		}
		b = b[:tot] // ip_rcv_core: the rest is padding
		src, _ := netip.AddrFromSlice(ip.SourceAddressSlice())
		dst, _ := netip.AddrFromSlice(ip.DestinationAddressSlice())
		if ip.More() || ip.FragmentOffset() != 0 {
			out.frags = append(out.frags, refFrag{src: src, dst: dst, id: uint32(ip.ID()), proto: ip.Protocol(),
				off: int(ip.FragmentOffset()), more: ip.More(), data: b[ihl:]})
			return
		}
		refL4(src, dst, ip.Protocol(), b[ihl:], vh, a, out, depth)
	case 6:
		if len(b) < header.IPv6MinimumSize {
			return
		}
		ip := header.IPv6(b)
		plen, nh := int(ip.PayloadLength()), ip.NextHeader()
		if plen == 0 && nh == 0 || header.IPv6MinimumSize+plen > len(b) {
			return // a jumbogram, or longer than the frame
		}
		b = b[:header.IPv6MinimumSize+plen]
		src, _ := netip.AddrFromSlice(ip.SourceAddressSlice())
		dst, _ := netip.AddrFromSlice(ip.DestinationAddressSlice())
		off := header.IPv6MinimumSize
		for n := 0; ; n++ {
			switch nh {
			case 0, 43, 60: // hop-by-hop, routing, destination options
			case uint8(header.IPv6FragmentHeader):
				if len(b)-off < header.IPv6FragmentHeaderSize {
					return
				}
				fh := header.IPv6Fragment(b[off : off+header.IPv6FragmentHeaderSize])
				out.frags = append(out.frags, refFrag{v6: true, src: src, dst: dst, id: fh.ID(), proto: fh.NextHeader(),
					off: int(fh.FragmentOffset()) * 8, more: fh.More(), data: b[off+header.IPv6FragmentHeaderSize:]})
				return
			default:
				refL4(src, dst, nh, b[off:], vh, a, out, depth)
				return
			}
			if n == 16 || len(b)-off < 8 {
				return
			}
			hlen := (int(b[off+1]) + 1) * 8
			if len(b)-off < hlen {
				return
			}
			nh = b[off]
			off += hlen
		}
	}
}

// refL4 takes the L4 part of an IP packet that is not a fragment.
func refL4(src, dst netip.Addr, proto uint8, l4 []byte, vh *driver.VirtioNetHdr, a *refAddrs, out *refOut, depth int) {
	switch proto {
	case uint8(header.UDPProtocolNumber):
		refUDP(src, dst, l4, vh, out)
	case uint8(header.TCPProtocolNumber):
		if len(l4) < header.TCPMinimumSize {
			return
		}
		t := header.TCP(l4)
		doff := int(t.DataOffset())
		if doff < header.TCPMinimumSize || doff > len(l4) {
			return
		}
		out.segs = append(out.segs, refSeg{src: src, dst: dst, sport: t.SourcePort(), dport: t.DestinationPort(),
			seq: t.SequenceNumber(), syn: t.Flags().Contains(header.TCPFlagSyn), payload: l4[doff:]})
	case 4, 41: // IPv4 or IPv6 in IPv6 (RFC 2473), to the tunnel's end
		if depth == 0 && a.tunnel.IsValid() && dst == a.tunnel {
			et := uint16(header.IPv4ProtocolNumber)
			if proto == 41 {
				et = uint16(header.IPv6ProtocolNumber)
			}
			refIP(l4, et, vh, a, out, depth+1)
		}
	}
}

// refUDP takes a UDP packet: one datagram, or a USO super-frame's
// datagrams.
func refUDP(src, dst netip.Addr, l4 []byte, vh *driver.VirtioNetHdr, out *refOut) {
	if len(l4) < header.UDPMinimumSize {
		return
	}
	u := header.UDP(l4)
	add := func(p []byte) {
		out.dgrams = append(out.dgrams, refDgram{src: src, dst: dst, sport: u.SourcePort(), dport: u.DestinationPort(), payload: p})
	}
	ulen := int(u.Length())
	okLen := ulen >= header.UDPMinimumSize && ulen <= len(l4)
	if vh.GSOType&^driver.VirtioNetHdrGSOECN == driver.VirtioNetHdrGSOUDPL4 && vh.GSOSize > 0 {
		// The datagrams of gso_size bytes the sender's __udp_gso_segment
		// cut the payload into: the IP payload's, or the UDP length's if
		// that is shorter (udp_rcv trims a GSO skb to it first).
		gso := int(vh.GSOSize)
		cut := func(p []byte) {
			if (len(p)+gso-1)/gso > maxRefGSOSegs {
				return
			}
			for len(p) > gso {
				add(p[:gso])
				p = p[gso:]
			}
			add(p)
		}
		cut(l4[header.UDPMinimumSize:])
		if okLen && ulen < len(l4) {
			cut(l4[header.UDPMinimumSize:ulen])
		}
		return
	}
	if okLen {
		add(l4[header.UDPMinimumSize:ulen])
	}
}

// refKey is the key of a datagram a socket may read: its destination
// port, its sender and its payload.
func refKey(port uint16, from netip.AddrPort, payload []byte) string {
	var h [2 + 16 + 2]byte
	binary.BigEndian.PutUint16(h[0:], port)
	a := from.Addr().Unmap().As16()
	copy(h[2:], a[:])
	binary.BigEndian.PutUint16(h[18:], from.Port())
	return string(h[:]) + string(payload)
}

// refExec is what the reference found in one execution's frames.
type refExec struct {
	id     uint64
	dgrams map[string]struct{}      // refKey of each datagram a socket may read
	frags  map[netip.Addr][]refFrag // by source
}

// refWindow holds the last executions' references: a packet may reach its
// socket after the execution that sent it has read (a GRO engine can hold it
// past the sentinel, up to the next flush), never later than two executions
// on (each execution waits for its sentinel, which the pipeline delivers
// only after what came before it, or in the same flush).
type refWindow struct {
	execs [3]*refExec
}

func (w *refWindow) push(e *refExec) {
	copy(w.execs[1:], w.execs[:len(w.execs)-1])
	w.execs[0] = e
}

// datagram reports whether a socket bound to port (accepting datagrams
// to the addresses accept takes) may read payload from from: a datagram
// of a window's frame, or one that IP fragments could have been
// reassembled into.
func (w *refWindow) datagram(port uint16, from netip.AddrPort, payload []byte, accept func(netip.Addr) bool) bool {
	k := refKey(port, from, payload)
	for _, e := range w.execs {
		if e == nil {
			continue
		}
		if _, ok := e.dgrams[k]; ok {
			return true
		}
	}
	return w.reassembled(port, from, payload, accept)
}

// reassembled reports whether the fragments in the window with from's
// address as their source could make a UDP datagram to port from from's
// port with payload: a first fragment whose UDP header names the ports and
// a length of 8+len(payload), a last fragment ending at or past it, and
// every byte of the payload in some fragment of the same packet (source,
// destination, ID, protocol) at its offset. Overlaps may resolve either
// way.
func (w *refWindow) reassembled(port uint16, from netip.AddrPort, payload []byte, accept func(netip.Addr) bool) bool {
	src := from.Addr().Unmap()
	var pieces []refFrag
	for _, e := range w.execs {
		if e != nil {
			pieces = append(pieces, e.frags[src]...)
		}
	}
	same := func(p, q *refFrag) bool {
		return p.v6 == q.v6 && p.dst == q.dst && p.id == q.id && p.proto == q.proto
	}
	for i := range pieces {
		first := &pieces[i]
		if first.off != 0 || first.proto != uint8(header.UDPProtocolNumber) || len(first.data) < header.UDPMinimumSize || !accept(first.dst) {
			continue
		}
		u := header.UDP(first.data)
		ulen := int(u.Length())
		if u.DestinationPort() != port || u.SourcePort() != from.Port() || ulen != header.UDPMinimumSize+len(payload) {
			continue
		}
		ends := false
		for j := range pieces {
			if q := &pieces[j]; same(first, q) && !q.more && q.off+len(q.data) >= ulen {
				ends = true
			}
		}
		if !ends {
			continue
		}
		ok := true
		for k := 0; ok && k < len(payload); {
			// The longest match of any piece from here on.
			best := 0
			at := header.UDPMinimumSize + k
			for j := range pieces {
				q := &pieces[j]
				if !same(first, q) || at < q.off || at >= q.off+len(q.data) {
					continue
				}
				d := q.data[at-q.off:]
				n := 0
				for n < len(d) && k+n < len(payload) && d[n] == payload[k+n] {
					n++
				}
				best = max(best, n)
			}
			if best == 0 {
				ok = false
			}
			k += best
		}
		if ok {
			return true
		}
	}
	return false
}

// refStream is what a TCP connection may read: segments' payloads at
// their sequence numbers.
type refStream struct {
	segs []refSeg
}

// tcpFragSegs returns the segments IP fragments in the window could make
// for a connection from peer:pport to local:lport: for each first fragment
// whose TCP header names the ports, every fragment of the same packet as
// the payload at its offset, so that each byte of a reassembled segment is
// in one of them.
func (w *refWindow) tcpFragSegs(peer, local netip.Addr, pport, lport uint16) []refSeg {
	var pieces []refFrag
	for _, e := range w.execs {
		if e != nil {
			pieces = append(pieces, e.frags[peer]...)
		}
	}
	var segs []refSeg
	for i := range pieces {
		first := &pieces[i]
		if first.off != 0 || first.proto != uint8(header.TCPProtocolNumber) || first.dst.Unmap() != local || len(first.data) < header.TCPMinimumSize {
			continue
		}
		t := header.TCP(first.data)
		doff := int(t.DataOffset())
		if t.SourcePort() != pport || t.DestinationPort() != lport || doff < header.TCPMinimumSize {
			continue
		}
		for j := range pieces {
			q := &pieces[j]
			if q.v6 != first.v6 || q.dst != first.dst || q.id != first.id || q.proto != first.proto {
				continue
			}
			data, off := q.data, q.off-doff
			if off < 0 {
				data = data[min(-off, len(data)):]
				off = 0
			}
			segs = append(segs, refSeg{seq: t.SequenceNumber() + uint32(off), syn: t.Flags().Contains(header.TCPFlagSyn), payload: data})
		}
	}
	return segs
}

// check reports whether b, read at stream offset off of a connection whose
// first byte has sequence number start, is what some segments carried at
// those sequence numbers (several may overlap, with other bytes: each
// byte must be in one of them), and if not the offset of the first byte
// that is not.
func (s *refStream) check(start uint32, off int, b []byte) (int, bool) {
	for k := 0; k < len(b); {
		at := start + uint32(off+k)
		best := 0
		for i := range s.segs {
			sg := &s.segs[i]
			for _, seq := range [2]uint32{sg.seq, sg.seq + 1} {
				if seq != sg.seq && !sg.syn {
					continue // only a SYN's data starts a number later
				}
				rel := int(at - seq) // wraps as sequence numbers do
				if rel < 0 || rel >= len(sg.payload) || at-seq >= 1<<31 {
					continue
				}
				d := sg.payload[rel:]
				n := 0
				for n < len(d) && k+n < len(b) && d[n] == b[k+n] {
					n++
				}
				best = max(best, n)
			}
		}
		if best == 0 {
			return off + k, false
		}
		k += best
	}
	return 0, true
}
