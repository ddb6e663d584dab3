// Package gro is ustack's standalone generic receive offload engine: it
// coalesces consecutive TCP segments (over IPv4 and IPv6) and same-sized UDP
// datagrams of one flow into one bufpool.Packet before they go up the stack,
// with the flush rules of the Linux kernel (net/core/gro.c,
// net/ipv4/af_inet.c inet_gro_receive, net/ipv6/ip6_offload.c,
// net/ipv4/tcp_offload.c tcp_gro_receive, net/ipv4/udp_offload.c
// udp_gro_receive_segment).
//
// An Engine is not tied to a poll loop (the cpumap GRO patch: the kernel's GRO decoupled
// from NAPI so cpumap kthreads can run their own): the driver's poll loop and
// every cpumap worker each own one. Engine methods are called from that one
// goroutine only; Stats may be read from any goroutine.
//
// # Ownership
//
// Receive takes ownership of the packet it is given. The engine then merges
// it into a packet it holds, holds it as the head of a new merged packet, or
// hands it to the Sink at once; whatever it holds it hands to the Sink later
// (at a batch end, on a timeout, or when a flush rule fires). Sink.Deliver
// takes ownership of each packet it is given. Every page reference of a
// merged packet's segments ends up in the delivered packet, exactly once.
//
// # Merging
//
// A segment whose linear part holds exactly its headers (header/data split,
// the mlx5 header-copy patch) is merged by moving its payload frags to the last packet of the
// held packet's chain, up to MAX_SKB_FRAGS (17) frags per packet; past them,
// and for a segment whose linear part holds payload too (a fixed 256-byte
// header copy), it is chained on the Next list with its headers, as the
// kernel's frag_list (skb_gro_receive; rx_gro_frag_list counts these), and
// the next segments' frags go onto it. A frag that continues the last
// packet's last frag on the same page is coalesced into it (the SHAMPO coalescing patch). A
// GSO (LRO) packet merges as tcp_gro_receive merges one: only into a packet
// of the same gso_size, counted as its segments. A delivered merged packet
// has its IP length, IPv4 header checksum, UDP length and TCP PSH/FIN fixed
// in the head's headers, Segs set to the segment count and GSOSize to the
// first segment's payload length (or gso_size); its payload is the head's
// bytes after HdrLen, then each chained packet's bytes after its own HdrLen.
//
// # Flush rules
//
// The rules are Linux 6.18's (net/core/gro.c dev_gro_receive,
// gro_list_prepare, skb_gro_receive; net/ipv4/af_inet.c inet_gro_receive;
// net/ipv6/ip6_offload.c ipv6_gro_receive; net/ipv4/tcp_offload.c
// tcp_gro_receive; net/ipv4/udp_offload.c udp_gro_receive_segment;
// include/net/gro.h inet_gro_flush, ipv6_gro_flush), each in the code with
// the kernel line it comes from. Flows are told apart as the kernel does:
// by the Ethernet header, addresses, protocol and ports, and for IPv6 the
// flow label, the first next header and the extension headers, so that two
// packets that differ in one of these are held side by side. A packet that
// no gro_receive looks up (IP options, a fragment, a bad IPv4 header
// checksum, an IPv6 fragment header, a bad TCP or UDP checksum, a UDP
// datagram without checksum) goes up at once, ahead of the held packet of
// its flow; one that is looked up but flushed (Ethernet padding, the
// reserved IPv4 flag) flushes the held packet first. A packet whose
// checksums the NIC did not verify (CHECKSUM_NONE) is checksummed in
// software (skb_gro_checksum_validate): a good one is merged as a verified
// one (rx_gro_csum_sw), a bad one goes up unmerged and unverified
// (rx_gro_csum_bad) for the stack to drop and count.
//
// # Tunnels
//
// With Config.VXLANPorts, a UDP datagram to one of those ports is a VXLAN
// packet (RFC 7348), as one to a port with a vxlan socket is in the kernel,
// and the TCP segment it carries is merged before the tunnel is terminated,
// as Linux 6.18 does it (vxlan.go names each function of the path:
// udp4_gro_receive, udp6_gro_receive, udp_gro_receive, vxlan_gro_receive,
// eth_gro_receive, then the inner inet_gro_receive or ipv6_gro_receive and
// tcp_gro_receive; udp_gro_complete, vxlan_gro_complete, eth_gro_complete
// on the way back). Its flow is told apart by every layer: the outer
// Ethernet header, addresses (and IPv6 flow label and extension headers),
// UDP ports and the zeroness of the UDP checksum, the VXLAN header's flags
// and VNI, the inner Ethernet header, and the inner addresses and ports;
// both IP headers must keep their TTL, TOS (or traffic class and hop
// limit) and DF, and both IPv4 IDs stay fixed or go up by one per segment,
// each as its own second segment decides (ip_fixedid's two bits). An outer
// UDP checksum is checked in software for a CHECKSUM_NONE packet, a zero
// one is allowed; the inner TCP checksum is then checked from the same sum.
// A VXLAN packet that carries anything but TCP over IPv4 or IPv6 (UDP,
// ARP, ICMP) goes up at once and flushes nothing, as in the kernel. A
// merged VXLAN packet keeps its outer headers first, with the outer IP
// length (and IPv4 header checksum), the outer UDP length and the inner IP
// length (and checksum) fixed, HdrLen at its inner TCP payload, Segs and
// GSOSize as for plain TCP; Encap says where its inner headers are and its
// GSO type (SKB_GSO_UDP_TUNNEL or _CSUM with TCPV4 or TCPV6), for the
// stack, which decapsulates it after GRO as vxlan_rcv does. With no port
// configured nothing of this runs, and UDP to any port is merged as UDP.
//
// TestKernelDiff checks this against the running kernel: seeded random
// sequences of TCP segments over several flows go through a veth with the
// kernel's GRO on and through the engine, and the packet boundaries (payload
// lengths per flow, in order) must be equal. 10,000 sequences (seeds 1000 to
// 10999, -gro.diff 10000 -gro.diff.seed 1000) showed no difference on Linux
// 6.18; CI runs 400.
//
// # Ordering
//
// The engine reorders the packets of one flow only where the kernel does: a
// packet handed up at once (above) goes ahead of the held packet of its
// flow; any other packet of a flow with a held packet that cannot be merged
// into it flushes the held packet first. Packets of different flows may
// leave in another order than they came.
//
// # Where it differs from the kernel
//
//   - UDP datagrams are always merged; the kernel merges them only for a
//     socket with UDP_GRO, with rx-udp-gro-forwarding, or with fraglist
//     GRO (udp_gro_receive). TestKernelDiff sends TCP only.
//   - Flows go into 8 buckets of 8 (GRO_HASH_BUCKETS, MAX_GRO_SKBS) by
//     the low bits of the NIC's RSS hash, or into bucket 0 without one, as
//     the kernel's by skb->hash; but two packets of one flow whose hashes
//     differ in their high bits (or of which one has none) are the same
//     flow here, where gro_list_prepare tells them apart.
//   - Adjacent frags on one page are coalesced (the SHAMPO coalescing patch's hardware GRO
//     placement); skb_gro_receive never coalesces, so its packets reach
//     MAX_SKB_FRAGS sooner.
//   - No tunnels but VXLAN (not inet_gro_receive's IPIP or GRE, nor
//     GENEVE, FOU or VXLAN-GPE), no fraglist GRO (NETIF_F_GRO_FRAGLIST),
//     no BIG TCP: merged packets end at 64 KB (GRO_LEGACY_MAX_SIZE) or
//     MaxSize, a VXLAN packet's outer IP length included.
//   - VXLAN: a port is a tunnel port over IPv4 and IPv6 alike (the kernel
//     has a socket per family); remote checksum offload (VXLAN_HF_RCO) is
//     not done, the RCO bit is compared as a flag; an inner VLAN-tagged or
//     Ethernet-in-Ethernet frame goes up at once (the kernel's
//     vlan_gro_receive would merge it); the inner UDP checksum of an
//     inner UDP datagram, which goes up unmerged, is not checked; a VXLAN
//     packet whose UDP, VXLAN or inner Ethernet and IP headers are not
//     all in the header copy goes up at once. CsumVerified stands for a
//     CHECKSUM_UNNECESSARY whose csum_level covers the inner checksum too
//     (mlx5's csum_level 1 for a tunnelled packet); a packet whose NIC
//     verified the outer checksum only is CHECKSUM_NONE here, checked in
//     software, where the kernel would hand it up unmerged if its outer
//     checksum is not zero.
//   - IPv6 extension headers are compared by a 64-bit hash, not memcmp.
//   - A packet whose linear part holds less than its headers, or whose
//     HdrLen the NIC parsed otherwise, flushes the flow and goes up (the
//     kernel's skb_gro_header_slow would pull the headers from the frags
//     and merge). ustack's driver never hands up such a packet: it pulls
//     what a short header copy missed before GRO runs, as pskb_may_pull
//     does, so its packets merge as the kernel's do; headers longer than
//     the linear part's room (bufpool.MaxLinear) are the exception.
//   - FlushTimeout flushes what is held that long at a batch end; the
//     kernel's gro_flush_timeout flushes, at each napi_complete_done, what
//     was held since an earlier jiffy.
//   - A short segment ending a train is counted apart
//     (rx_gro_flush_short).
package gro
