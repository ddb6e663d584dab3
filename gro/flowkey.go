package gro

// flowKey names a flow as the kernel's GRO tells flows apart (its
// NAPI_GRO_CB(p)->same_flow): Ethernet header (gro_list_prepare), IP
// version, addresses and protocol (inet_gro_receive, ipv6_gro_receive; for
// IPv6 also the flow label, the first next header and the extension
// headers), ports (tcp_gro_lookup, udp_gro_receive_segment), packed in
// eight words so that comparing two keys is eight compares.
//
//	IPv4: a = source<<32 | destination, b = c = d = 0
//	IPv6: a, b = source; c, d = destination
//	both: e = source port<<32 | destination port<<16 | protocol<<8 | version
//	      f = destination MAC<<16 | source MAC>>32
//	      g = source MAC&0xffffffff<<32 | IPv6 flow label<<8 | IPv6 next header
//	      h = a hash of the IPv6 extension headers, 0 for none
//
// A VXLAN packet's key is its inner packet's, with the inner Ethernet
// addresses in f and g and keyTunnel in the version byte; its outer flow
// is a tunKey beside it.
type flowKey struct {
	a, b, c, d, e, f, g, h uint64
}

// eq reports whether k and o are the same flow's, word by word (as an
// unrolled compare, not a call to memequal).
func (k *flowKey) eq(o *flowKey) bool {
	return k.e == o.e && k.a == o.a && k.b == o.b && k.c == o.c && k.d == o.d &&
		k.f == o.f && k.g == o.g && k.h == o.h
}

// setProto sets the version and protocol, clearing the ports.
func (k *flowKey) setProto(version, proto uint8) {
	k.e = uint64(proto)<<8 | uint64(version)
}

// setPorts sets the ports from the first word of the L4 header.
func (k *flowKey) setPorts(ports uint32) {
	k.e = k.e&0xffff | uint64(ports)<<16
}
