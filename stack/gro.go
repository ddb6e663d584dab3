package stack

import (
	"encoding/binary"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
)

// groSink hands the GRO engine's output to gVisor.
type groSink linkEndpoint

func (s *groSink) Deliver(p *bufpool.Packet) { (*linkEndpoint)(s).toGVisor(p) }

// nowNS returns the poll batch's clock, read once per batch.
func (e *linkEndpoint) nowNS() int64 {
	if e.now == 0 {
		e.now = time.Since(e.epoch).Nanoseconds() + 1
	}
	return e.now
}

// udpTrain reports whether p is a UDP packet that aggregates several
// datagrams (a UDP GRO train), and where its IP and UDP headers are.
func udpTrain(p *bufpool.Packet) (l3, l4 int, ok bool) {
	if p.Segs < 2 || p.GSOSize == 0 {
		return 0, 0, false
	}
	return udpHeaders(p)
}

// splitUDP hands a UDP train to gVisor as the datagrams it was made of, as
// the kernel does for a socket without UDP_GRO: the payload is copied once
// into one view, and each datagram gets its own rebuilt headers and a clone
// of its part of that view.
func (e *linkEndpoint) splitUDP(p *bufpool.Packet, l3, l4 int) {
	hdrLen := l4 + header.UDPMinimumSize
	total := p.TotalLen() - chainHeaders(p) - hdrLen
	all := buffer.NewView(total)
	writeAfter(all, p, hdrLen)
	for q := p.Next; q != nil; q = q.Next {
		writeAfter(all, q, q.HdrLen)
	}
	if e.pcap != nil {
		e.pcap.WriteFrame(time.Now(), p.Linear[:hdrLen], all.AsSlice())
	}
	gso := int(p.GSOSize)
	for off := 0; off < total; off += gso {
		n := min(gso, total-off)
		hv := buffer.NewViewWithData(p.Linear[:hdrLen])
		h := hv.AsSlice()
		ip := h[l3:l4]
		if ip[0]>>4 == 4 {
			binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+8+n))
			ip[10], ip[11] = 0, 0
			checksum.Put(ip[10:], ^checksum.Checksum(ip, 0))
		} else {
			binary.BigEndian.PutUint16(ip[4:], uint16(len(ip)-40+8+n))
		}
		binary.BigEndian.PutUint16(h[l4+4:], uint16(8+n))
		pv := all.Clone()
		pv.TrimFront(off)
		pv.CapLength(n)
		buf := buffer.MakeWithView(hv)
		buf.Append(pv)
		e.dispatch(buf)
	}
	all.Release()
}
