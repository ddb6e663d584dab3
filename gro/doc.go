// Package gro is ustack's standalone generic receive offload engine: it
// coalesces consecutive TCP segments (over IPv4 and IPv6) and same-sized UDP
// datagrams of one flow into one bufpool.Packet before they go up the stack,
// with the flush rules of the Linux kernel (net/core/gro.c,
// net/ipv4/af_inet.c inet_gro_receive, net/ipv6/ip6_offload.c,
// net/ipv4/tcp_offload.c tcp_gro_receive, net/ipv4/udp_offload.c
// udp_gro_receive_segment).
//
// An Engine is not tied to a poll loop (seed 004: the kernel's GRO decoupled
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
// seed 000) is merged by moving its payload frags to the held packet; a frag
// that continues the held packet's last frag on the same page is coalesced
// into it (seed 002). A segment whose linear part holds payload too (a fixed
// 256-byte header copy) is merged the slow way: it is chained on the held
// packet's Next list with its headers, as the kernel's frag_list
// (rx_gro_frag_list counts these). A delivered merged packet has its IP
// length, IPv4 header checksum, UDP length and TCP PSH/FIN fixed in the
// head's headers, Segs set to the segment count and GSOSize to the first
// segment's payload length; its payload is the head's bytes after HdrLen,
// then each chained packet's bytes after its own HdrLen.
//
// # Ordering
//
// The engine never reorders the packets of one flow (5-tuple): a packet of a
// flow with a held packet that cannot be merged into it flushes the held
// packet first. Packets the engine does not touch (not IP, not TCP or UDP,
// unverified checksums, IP options, fragments, IPv6 extension headers) go up
// at once without flushing other flows. Packets of different flows may leave
// in another order than they came.
//
// # Where it differs from the kernel
//
//   - A packet of a held flow that GRO does not touch (IP options, an
//     unverified checksum, padding, a header copy shorter than the headers,
//     an LRO super-frame) flushes the flow first; the kernel hands such a
//     packet up at once, ahead of the held ones. A fragment, whose ports
//     may be unknown, flushes every held flow of its address pair and
//     protocol.
//   - An IPv6 flow label or Ethernet header that differs flushes the held
//     packet; the kernel holds the two side by side as different flows,
//     which can reorder a TCP flow.
//   - When the held packet's frags are full it is flushed; the kernel goes
//     on in its frag_list.
//   - IPv6 extension headers are never merged (the kernel merges
//     identical ones).
//   - UDP: a zero checksum over IPv4 is merged; the kernel requires a
//     checksum "for symmetry with GSO". Trains end at 64 datagrams
//     (UDP_GRO_CNT_MAX), as in the kernel.
//   - A short segment ending a train is counted apart
//     (rx_gro_flush_short).
package gro
