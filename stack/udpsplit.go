package stack

import (
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
)

// udpTrain reports whether p is a UDP packet that aggregates several
// datagrams (a UDP GRO train), and where its IP and UDP headers are (u's,
// found if nobody did yet: rxUDP).
func udpTrain(p *bufpool.Packet, l2 int, u *rxUDP) (l3, l4 int, ok bool) {
	if p.Segs < 2 || p.GSOSize == 0 {
		return 0, 0, false
	}
	return u.headers(p, l2)
}

// udpSegments returns the datagrams in p, a UDP packet of n payload bytes
// (udpPayloadLen): a train's (udpTrain) n cut in GSOSize pieces, at least
// one; else one.
func udpSegments(p *bufpool.Packet, n int) int {
	if p.Segs < 2 || p.GSOSize == 0 {
		return 1
	}
	return max((n+int(p.GSOSize)-1)/int(p.GSOSize), 1)
}

// splitUDP hands a UDP train to gVisor as the datagrams it was made of, as
// the kernel's udp_queue_rcv_skb does through udp_rcv_segment
// (__udp_gso_segment) for a socket without UDP_GRO: the payload is copied
// once into one view, and each datagram gets its own rebuilt headers (IP
// and UDP lengths, the IPv4 header checksum; the UDP checksum is left as
// it is: GRO merges only verified datagrams, and gVisor takes receive
// checksums as offloaded) and a clone of its part of that view. pcap
// records the train once, as it came. The caller keeps p.
//
// The payload is what the headers say (udpPayloadLen), not the frame's
// length: padding after the IP packet makes no datagram. A train whose UDP
// length is wrong, or that would make more than driver.UDPMaxSegments
// datagrams, is dropped and counted (udp_malformed): the driver refuses
// such a USO super-frame (virtio_net_hdr_to_skb) and GRO makes no train of
// more than UDP_GRO_CNT_MAX (64), so none should come, but nothing that
// does may cost more than that many deliveries.
func (e *linkEndpoint) splitUDP(p *bufpool.Packet, l3, l4 int, vx *vxlanEndpoint) {
	total, ok := udpPayloadLen(p, l3, l4)
	if !ok || udpSegments(p, total) > driver.UDPMaxSegments {
		e.trains.malformed.Add(1)
		return
	}
	hdrLen := l4 + header.UDPMinimumSize
	all := newCopyView(total)
	for w, left := p.Walk(hdrLen), total; left > 0 && w.Next(); {
		b := w.Bytes()
		b = b[:min(len(b), left)]
		all.Write(b)
		left -= len(b)
	}
	if e.pcap != nil {
		e.pcap.WriteFrame(time.Now(), p.Linear[:hdrLen], all.AsSlice())
	}
	gso := int(p.GSOSize)
	v4 := isIPv4(p.Linear[l3:])
	for off := 0; off == 0 || off < total; off += gso { // an empty datagram too
		n := min(gso, total-off)
		hv := buffer.NewViewWithData(p.Linear[:hdrLen])
		h := hv.AsSlice()
		udpLen := uint16(header.UDPMinimumSize + n)
		if v4 {
			ip := header.IPv4(h[l3:l4])
			ip.SetTotalLength(uint16(l4-l3) + udpLen)
			ip.SetChecksum(0)
			ip.SetChecksum(^checksum.Checksum(ip, 0)) // the whole header, options too
		} else {
			header.IPv6(h[l3:l4]).SetPayloadLength(uint16(l4-l3-header.IPv6MinimumSize) + udpLen)
		}
		header.UDP(h[l4:]).SetLength(udpLen)
		pv := all.Clone()
		pv.TrimFront(off)
		pv.CapLength(n)
		buf := buffer.MakeWithView(hv)
		buf.Append(pv)
		e.dispatchTo(vx, buf, rxMeta{})
	}
	all.Release()
}
