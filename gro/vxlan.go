package gro

import (
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/hdr"
)

// VXLAN (RFC 7348) as the kernel's GRO merges it: the path of a VXLAN
// packet through Linux 6.18's GRO is dev_gro_receive, inet_gro_receive or
// ipv6_gro_receive (the outer IP header), udp4_gro_receive or
// udp6_gro_receive, udp_gro_receive (the UDP socket lookup finds the vxlan
// socket, whose gro_receive is vxlan_gro_receive), udp_tunnel_gro_rcv,
// vxlan_gro_receive (vxlan_gro_prepare_receive), eth_gro_receive,
// inet_gro_receive or ipv6_gro_receive again (the inner IP header), and
// tcp4_gro_receive or tcp6_gro_receive, tcp_gro_receive; a merged packet
// goes through inet_gro_complete or ipv6_gro_complete, udp4_gro_complete or
// udp6_gro_complete, udp_gro_complete, vxlan_gro_complete, eth_gro_complete,
// inet_gro_complete or ipv6_gro_complete, and tcp4_gro_complete or
// tcp6_gro_complete, tcp_gro_complete. parse4, parse6 and parseL4 are each
// layer's gro_receive, parseVXLAN is the UDP and VXLAN layers', and
// Engine.complete the gro_complete chain.

// Header sizes and values of the tunnel layers.
const (
	vxlanHdrLen = 8 // struct vxlanhdr: flags word, VNI word
	ethHdrLen   = header.EthernetMinimumSize

	// VXLANPort is VXLAN's IANA port (RFC 7348 section 5). Linux's vxlan
	// devices default to 8472, the port of its early adopters, unless
	// created with "dstport 4789".
	VXLANPort = 4789

	// keyTunnel marks the flow key of a VXLAN packet's inner flow, in the
	// version byte of its e word: such a key never equals a plain one, and
	// its outer flow (tunKey) is compared too.
	keyTunnel = 0x80
	// keyCsum marks, in the version byte of a tunKey's e word, an outer
	// UDP checksum that is not zero: udp_gro_receive's "(!uh->check ^
	// !uh2->check)" makes the two kinds two flows.
	keyCsum = 0x40
)

// tunKey is the outer flow of a VXLAN packet: what the layers above the
// inner Ethernet header compare before they set NAPI_GRO_CB(p)->same_flow.
// k is the outer packet's flowKey (gro_list_prepare's Ethernet header;
// inet_gro_receive's or ipv6_gro_receive's addresses, protocol, flow label
// and extension headers; udp_gro_receive's ports, "*(u32 *)&uh->source",
// and keyCsum); vx is the VXLAN header, whose flags word and VNI word
// vxlan_gro_prepare_receive compares ("vh->vx_flags != vh2->vx_flags ||
// vh->vx_vni != vh2->vx_vni"), reserved bits included.
type tunKey struct {
	k  flowKey
	vx uint64
}

// tunnel is the outer layer of a VXLAN packet, as parseVXLAN found it: what
// the engine checks and fixes beyond the inner packet's fields.
type tunnel struct {
	key   tunKey // the outer flow: outer addresses, ports, Ethernet, VXLAN header
	ol4   int    // offset of the outer UDP header
	inner int    // offset of the inner IP header
	oid   uint16 // outer IPv4 identification
	ov6   bool   // outer IPv6
}

// tunSeg is the outer layer of the VXLAN packet being parsed (segInfo.t).
type tunSeg struct {
	tunnel
	// osum is the one's complement sum of the bytes from the outer UDP
	// header to the end, valid with osumOK: the outer checksum was
	// checked in software and the inner one is checked from it.
	osum   uint16
	osumOK bool
}

// vxState is an engine's VXLAN state, which only its goroutine touches:
// the ports, the outer layer of the packet being parsed (one at a time;
// segInfo.t points at seg), and the tunnel slots of the buckets
// (bucket.tuns).
type vxState struct {
	ports []uint16
	seg   tunSeg
	tuns  [numBuckets][bucketCap]tunEnt
}

func newVXState(ports []uint16) *vxState { return &vxState{ports: ports} }

// isVXLANPort reports whether port is one of ports: whether the kernel's
// udp4_gro_lookup_skb or udp6_gro_lookup_skb would find a vxlan socket
// for it.
func isVXLANPort(ports []uint16, port uint16) bool {
	for _, p := range ports {
		if p == port {
			return true
		}
	}
	return false
}

// parseVXLAN parses a UDP datagram to a VXLAN port (s.l4 is its UDP header)
// as udp4_gro_receive or udp6_gro_receive, udp_gro_receive and
// vxlan_gro_receive do, then its inner Ethernet header as eth_gro_receive
// does and the inner packet with parse4 or parse6. flush is the outer IP
// layer's NAPI_GRO_CB(skb)->flush; src and dst are the outer addresses; n
// is frameLen(p).
//
// What the kernel hands up at once is handed up at once (passOther), the
// held packet of the flow left held: a UDP, VXLAN or inner Ethernet header
// beyond the header copy (the kernel would pull it; without it the flow is
// not known), a bad outer UDP checksum (udp4_gro_receive: "goto flush"),
// an unverified one not checked because of a flush ("uh->check &&
// skb->ip_summed != CHECKSUM_PARTIAL && NAPI_GRO_CB(skb)->csum_cnt == 0
// && !NAPI_GRO_CB(skb)->csum_valid"), an inner EtherType GRO has no
// handler for (eth_gro_receive: gro_find_receive_by_type), and what parse4
// and parse6 hand up of the inner packet (inner UDP included).
func parseVXLAN(p *bufpool.Packet, b []byte, s *segInfo, src, dst []byte, n int, flush bool) verdict {
	// The engine's scratch for the outer layer: osumOK says whether osum
	// is valid, and every other field is set below before anything reads
	// it (a packet handed up before then is only counted as VXLAN, by
	// s.t), so a packet need not clear it.
	t := &s.vx.seg
	t.osumOK = false
	s.t = t
	ol4 := s.l4
	if len(b) < ol4+udpHdrLen+vxlanHdrLen+ethHdrLen {
		// udp_gro_udphdr, vxlan_gro_prepare_receive, eth_gro_receive:
		// skb_gro_header.
		return passOther
	}
	// dev_gro_receive: "NAPI_GRO_CB(skb)->flush = skb_has_frag_list(skb)".
	flush = flush || p.Next != nil
	check := header.UDP(b[ol4 : ol4+udpHdrLen]).Checksum()
	if !flush && !p.CsumVerified && check != 0 {
		// udp4_gro_receive, udp6_gro_receive:
		// skb_gro_checksum_validate_zero_check, over the whole datagram
		// (a zero checksum is not checked: RFC 768 over IPv4, RFC 6935
		// over IPv6). The sum is kept for the inner TCP checksum, as
		// skb_gro_checksum_try_convert keeps NAPI_GRO_CB(skb)->csum.
		sum := rawSum(p, ol4)
		if !pseudoValid(sum, src, dst, protoUDP, n-ol4) {
			s.csum = csumBad
			return passOther
		}
		s.csum, t.osum, t.osumOK = csumGood, sum, true
	}
	if check != 0 && !p.CsumVerified && !t.osumOK {
		// udp_gro_receive: the checksum is not verified and was not
		// checked ("Don't bother verifying checksum if we're going to
		// flush anyway"): "goto out", no tunnel GRO.
		return passOther
	}
	// udp_gro_receive: "NAPI_GRO_CB(skb)->encap_mark = 1", then the ports
	// and the checksum's zeroness; vxlan_gro_prepare_receive: the flags
	// and VNI words. Remote checksum offload (VXLAN_HF_RCO with
	// VXLAN_F_REMCSUM_RX) is not supported: the RCO bit is one of the
	// flags, compared like the others.
	vx := ol4 + udpHdrLen
	t.ol4, t.ov6, t.oid = ol4, s.v6, s.id
	t.key = tunKey{k: s.key, vx: be64(b[vx:])}
	if check != 0 {
		t.key.k.e |= keyCsum
	}
	t.inner = vx + vxlanHdrLen + ethHdrLen
	// eth_gro_receive: compare_ether_header (in the inner flow key, by
	// parse4 and parse6), then the EtherType's gro_receive. The inner key
	// is marked as a tunnelled flow's; parseL4 keeps the version byte.
	var v verdict
	switch be16(b[t.inner-2:]) {
	case uint16(header.IPv4ProtocolNumber):
		v = parse4(p, b, s, t.inner, flush)
	case uint16(header.IPv6ProtocolNumber):
		v = parse6(p, b, s, t.inner, flush)
	default:
		// ARP, and any other: no gro_receive here ("flush = 1").
		// VLAN-tagged (vlan_gro_receive) and Ethernet-in-Ethernet
		// (ETH_P_TEB) inner frames, which the kernel would go on with,
		// go up too.
		return passOther
	}
	s.key.e |= keyTunnel
	return v
}

// GSOType is a merged packet's GSO type: the kernel's
// skb_shinfo(skb)->gso_type bits that gro_complete sets.
type GSOType uint8

// GSO types.
const (
	GSOTCPv4 GSOType = 1 << iota // SKB_GSO_TCPV4 (tcp4_gro_complete)
	GSOTCPv6                     // SKB_GSO_TCPV6 (tcp6_gro_complete)
	// GSOUDPTunnel and GSOUDPTunnelCsum: udp_gro_complete's
	// "uh->check ? SKB_GSO_UDP_TUNNEL_CSUM : SKB_GSO_UDP_TUNNEL".
	GSOUDPTunnel
	GSOUDPTunnelCsum
)

// Encap says where the headers of a VXLAN packet are, offsets into its
// frame (its linear part), for the stack that terminates the tunnel after
// GRO, as vxlan_rcv does in the kernel: the skb offsets that
// udp_gro_complete (skb->encapsulation), eth_gro_complete
// (skb->inner_mac_header), inet_gro_complete or ipv6_gro_complete
// (skb->inner_network_header) and tcp_gro_complete
// (skb->inner_transport_header) set. The engine does not decapsulate: a
// merged VXLAN packet is delivered with its outer headers first, HdrLen the
// offset of the inner TCP payload.
type Encap struct {
	OuterNetwork   int // the outer IP header (skb->network_header)
	OuterTransport int // the outer UDP header (skb->transport_header)
	VXLAN          int // the VXLAN header (RFC 7348 section 5)
	InnerMAC       int // the inner Ethernet header (skb->inner_mac_header)
	// InnerNetwork is the inner IP header (skb->inner_network_header),
	// or, for an inner EtherType other than IPv4 and IPv6, what follows
	// the inner Ethernet header.
	InnerNetwork int
	// InnerTransport is the inner TCP or UDP header, past IPv4 options
	// and the IPv6 extension headers GRO walks (skb->inner_transport_header),
	// 0 when there is none (not IP, a fragment, another protocol).
	InnerTransport int
	InnerProto     uint8  // the inner IP protocol at InnerTransport, 0 when InnerTransport is 0
	InnerEtherType uint16 // the inner Ethernet header's EtherType
	VNI            uint32 // the VXLAN network identifier
	OuterIPv6      bool
	InnerIPv6      bool
	// OuterCsum: the outer UDP checksum is not zero.
	OuterCsum bool
	// GSOType is the gso_type of a packet of several segments (Segs > 1,
	// merged or an LRO super-frame): GSOUDPTunnelCsum or GSOUDPTunnel
	// by OuterCsum, and GSOTCPv4 or GSOTCPv6 for an inner TCP segment;
	// 0 for a single frame.
	GSOType GSOType
}

// Encap reports whether p is a VXLAN packet as the engine of cfg parses
// one (cfg.L3 for where its outer IP header is, a UDP destination port in
// cfg.VXLANPorts; an outer IPv4 header without options that is not a
// fragment, or an outer IPv6 header whose extension headers GRO walks; the
// UDP, VXLAN and inner Ethernet headers in the linear part) and where its
// headers are. It reads p's linear part only, does not check checksums,
// never allocates, and may be called from any goroutine.
func (cfg *Config) Encap(p *bufpool.Packet) (Encap, bool) {
	l2 := header.EthernetMinimumSize
	if cfg.L3 {
		l2 = 0
	}
	return encapOf(p, l2, cfg.VXLANPorts)
}

// Encap is Config.Encap with the engine's configuration. It may be called
// from any goroutine.
func (e *Engine) Encap(p *bufpool.Packet) (Encap, bool) {
	return encapOf(p, e.l2, e.vxPorts)
}

func encapOf(p *bufpool.Packet, l2 int, ports []uint16) (Encap, bool) {
	var en Encap
	b := p.Linear
	if len(ports) == 0 || len(b) <= l2 {
		return en, false
	}
	if l2 > 0 && be16(b[l2-2:]) != uint16(header.IPv4ProtocolNumber) && be16(b[l2-2:]) != uint16(header.IPv6ProtocolNumber) {
		return en, false
	}
	en.OuterNetwork = l2
	var proto uint8
	switch b[l2] >> 4 {
	case header.IPv4Version:
		if len(b) < l2+ipv4HdrLen {
			return en, false
		}
		ip := header.IPv4(b[l2 : l2+ipv4HdrLen])
		if b[l2] != 0x45 || hdr.IsIPv4Fragment(ip) {
			return en, false
		}
		proto, en.OuterTransport = ip.Protocol(), l2+ipv4HdrLen
	case header.IPv6Version:
		en.OuterIPv6 = true
		proto, en.OuterTransport = ipv6Walk(b, l2)
	default:
		return en, false
	}
	ol4 := en.OuterTransport
	if proto != protoUDP || len(b) < ol4+udpHdrLen+vxlanHdrLen+ethHdrLen ||
		!isVXLANPort(ports, be16(b[ol4+2:])) {
		return en, false
	}
	en.OuterCsum = be16(b[ol4+6:]) != 0
	en.VXLAN = ol4 + udpHdrLen
	en.VNI = be32(b[en.VXLAN+4:]) >> 8
	en.InnerMAC = en.VXLAN + vxlanHdrLen
	en.InnerNetwork = en.InnerMAC + ethHdrLen
	en.InnerEtherType = be16(b[en.InnerNetwork-2:])
	in := en.InnerNetwork
	switch en.InnerEtherType {
	case uint16(header.IPv4ProtocolNumber):
		if len(b) >= in+ipv4HdrLen && b[in]>>4 == header.IPv4Version {
			ip := header.IPv4(b[in : in+ipv4HdrLen])
			if ihl := int(b[in]&0xf) * 4; ihl >= ipv4HdrLen && ip.FragmentOffset() == 0 && len(b) >= in+ihl {
				en.InnerProto, en.InnerTransport = ip.Protocol(), in+ihl
			}
		}
	case uint16(header.IPv6ProtocolNumber):
		en.InnerIPv6 = true
		en.InnerProto, en.InnerTransport = ipv6Walk(b, in)
	}
	if en.InnerTransport == 0 {
		en.InnerProto = 0
	}
	if p.Segs > 1 {
		en.GSOType = GSOUDPTunnel
		if en.OuterCsum {
			en.GSOType = GSOUDPTunnelCsum
		}
		switch {
		case en.InnerProto == protoTCP && en.InnerIPv6:
			en.GSOType |= GSOTCPv6
		case en.InnerProto == protoTCP:
			en.GSOType |= GSOTCPv4
		}
	}
	return en, true
}
