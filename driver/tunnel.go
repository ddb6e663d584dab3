package driver

import (
	"fmt"
	"net/netip"
)

// IP protocol numbers of the tunnels the NIC model terminates.
const (
	protoIPIP = 4  // IPv4 in IP (RFC 2003; IPv4-in-IPv6 with an IPv6 outer header, RFC 2473)
	protoIPv6 = 41 // IPv6 in IP (RFC 2473)
)

// maxTunnelOuterLen bounds the outer header of a tunnelled frame: the fixed
// IPv6 header plus extension headers (such as the tunnel encapsulation
// limit option Linux's ip6tnl adds by default, RFC 2473 section 5.1). A
// longer outer header is DropBadTunnel.
const maxTunnelOuterLen = 128

// TunnelConfig configures IPv6 tunnel termination (ip6tnl: IPv4-in-IPv6 and
// IPv6-in-IPv6, RFC 2473) in the NIC model. The zero value turns it off.
//
// A frame whose outer IPv6 destination is one of Local is a tunnel frame:
//
//	+----------+--------------------------+--------------------+----+---------+
//	| Ethernet | outer IPv6 (+ ext hdrs)  | inner IPv4 or IPv6 | L4 | payload |
//	|  14 B    | 40 B, next header 4/41   |                    |    |         |
//	+----------+--------------------------+--------------------+----+---------+
//
// With next header 4 (an IPv4 packet inside) or 41 (IPv6 inside) the NIC
// model parses and checks the inner packet (its checksums: verified, or
// trusted from the virtio-net header, whose csum_start must then point
// into the inner packet) and reports it in the CQE; the ring gets the whole
// frame. The driver hands the packet up decapsulated (Ethernet with the
// inner EtherType + inner IP + L4: the outer header's bytes are skipped
// while the headers are copied, see Driver.build), so software GRO merges
// inner flows. LRO has nothing to aggregate (a TAP gets tunnelled traffic
// already segmented) and hardware GRO places tunnel frames as plain frames,
// outside its sessions.
// ICMPv6 to a tunnel address goes up as it came (neighbour discovery and
// errors need it); any other next header is DropTunnelProto, and a tunnel
// frame that cannot be decapsulated (outer fragment, outer header longer
// than 128 bytes, a GSO super-frame, an inner packet that does not parse)
// is DropBadTunnel or the inner packet's own drop reason. The outer
// source is not checked: any peer may send into the tunnel.
//
// A Local address is the tunnel's own: give the stack's ordinary TCP and UDP
// traffic another address.
type TunnelConfig struct {
	// Local lists the local outer IPv6 addresses that terminate tunnels.
	Local []netip.Addr
}

// validate checks that every local address is IPv6.
func (c *TunnelConfig) validate() error {
	for _, a := range c.Local {
		if !a.Is6() || a.Is4In6() {
			return fmt.Errorf("tunnel local address %s: want IPv6", a)
		}
	}
	return nil
}

// locals returns the local tunnel addresses in wire form.
func (c *TunnelConfig) locals() [][16]byte {
	out := make([][16]byte, len(c.Local))
	for i, a := range c.Local {
		out[i] = a.As16()
	}
	return out
}

// isLocal reports whether the 16-byte IPv6 address a is one of locals.
func isLocal(locals [][16]byte, a []byte) bool {
	for i := range locals {
		if string(locals[i][:]) == string(a) {
			return true
		}
	}
	return false
}

// decapsulate looks at a frame ParseFrame accepted into fi. If it is not a
// tunnel frame it returns 0 and DropNone and changes nothing. If it is one,
// it parses the inner packet and returns the outer header's length (after
// the Ethernet header); fi then describes the frame as it will be handed up,
// the outer header removed: Ethernet (L2Len as before, EtherType the inner
// one) followed by the inner IP packet. h's CsumStart is moved by the same
// amount, so that frame[outer:] with h and fi is a plain frame for the
// checksum logic. A tunnel frame that cannot be decapsulated returns the
// reason. locals are the local tunnel addresses. It never allocates and
// never panics.
func decapsulate(h *VirtioNetHdr, frame []byte, fi *FrameInfo, locals [][16]byte) (int, Drop) {
	if len(locals) == 0 || fi.L3 != L3IPv6 || !isLocal(locals, frame[fi.L2Len+24:fi.L2Len+40]) {
		return 0, DropNone
	}
	switch fi.L4Proto {
	case protoIPIP, protoIPv6:
	case protoICMPv6:
		return 0, DropNone
	default:
		return 0, DropTunnelProto
	}
	outer := fi.L3Len
	if fi.Fragment || outer > maxTunnelOuterLen || h.GSOType != VirtioNetHdrGSONone {
		return 0, DropBadTunnel
	}
	// Parse the inner packet in place, bounded by the outer packet: the
	// parsers take the IP header's offset from L2Len.
	l2, et := fi.L2Len, uint16(etherTypeIPv4)
	inner := FrameInfo{L2Len: l2 + outer, VLAN: fi.VLAN, VLANTCI: fi.VLANTCI} // the tag stays on the frame
	var drop Drop
	if fi.L4Proto == protoIPIP {
		drop = parseIPv4(frame[:l2+fi.IPLen], &inner)
	} else {
		et = etherTypeIPv6
		drop = parseIPv6(frame[:l2+fi.IPLen], &inner)
	}
	if drop != DropNone {
		return 0, drop
	}
	if h.Flags&VirtioNetHdrFNeedsCsum != 0 {
		// csum_start must point into the inner packet: the outer
		// header has no checksum of its own to complete.
		if int(h.CsumStart) < inner.L2Len {
			return 0, DropBadVnetHdr
		}
		h.CsumStart -= uint16(outer)
	}
	inner.L2Len = l2
	inner.EtherType = et
	*fi = inner
	return outer, DropNone
}
