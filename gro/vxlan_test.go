package gro

import (
	"bytes"
	"fmt"
	"maps"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// vxCfg is the configuration of the VXLAN tests: IANA's port.
var vxCfg = Config{VXLANPorts: []uint16{VXLANPort}}

// checkMergedVX is checkMerged for a merged VXLAN packet of the frames ins:
// its payload, segment count and GSO size, and its headers byte for byte:
// the first frame's, with the outer IP length (and IPv4 header checksum),
// the outer UDP length, the inner IP length (and checksum) and the TCP
// flags fixed, and nothing else changed: the outer UDP checksum (zero stays
// zero) and the inner TCP checksum are the first frame's, stale, in a
// packet that is CsumVerified (the kernel's CHECKSUM_UNNECESSARY), as for
// a plain TCP packet.
func checkMergedVX(p *bufpool.Packet, ins []built) error {
	var want []byte
	wantSegs := 0
	for _, in := range ins {
		want = append(want, in.payload...)
		wantSegs += in.segs()
	}
	if got := payloadOf(p); !bytes.Equal(got, want) {
		return fmt.Errorf("payload: got %d bytes, want %d (or contents differ)", len(got), len(want))
	}
	first := ins[0]
	wantGSO := len(first.payload)
	if first.segs() > 1 {
		wantGSO = int(first.seg.lro)
	}
	if int(p.Segs) != wantSegs || int(p.GSOSize) != wantGSO {
		return fmt.Errorf("Segs, GSOSize: got %d, %d, want %d, %d", p.Segs, p.GSOSize, wantSegs, wantGSO)
	}
	if !p.CsumVerified {
		return fmt.Errorf("merged packet not CsumVerified")
	}
	if p.HdrLen != first.hlen {
		return fmt.Errorf("HdrLen: got %d, want %d", p.HdrLen, first.hlen)
	}
	chainHdrs := 0
	for q := p.Next; q != nil; q = q.Next {
		chainHdrs += q.HdrLen
	}
	if got, want := p.TotalLen()-chainHdrs, first.hlen+len(want); got != want {
		return fmt.Errorf("TotalLen minus chained headers: got %d, want %d", got, want)
	}
	l2 := header.EthernetMinimumSize
	ipLen := first.hlen - l2 + len(want)
	// The expected headers: the first frame's, fixed as gro_complete
	// fixes them.
	exp := bytes.Clone(first.frame[:first.hlen])
	fixIP := func(at, n int, v6 bool) {
		if v6 {
			header.IPv6(exp[at:]).SetPayloadLength(uint16(n - header.IPv6MinimumSize))
			return
		}
		ip := header.IPv4(exp[at:])
		ip.SetTotalLength(uint16(n))
		ip.SetChecksum(0)
		ip.SetChecksum(^ip.CalculateChecksum())
	}
	fixIP(l2, ipLen, first.seg.ov6)
	header.UDP(exp[first.ol4:]).SetLength(uint16(ipLen - (first.ol4 - l2)))
	fixIP(first.inner, ipLen-(first.inner-l2), first.seg.v6)
	flags := header.TCPFlags(0)
	for _, in := range ins[1:] {
		flags |= in.seg.flags & (header.TCPFlagFin | header.TCPFlagPsh)
	}
	exp[first.l4+13] |= uint8(flags)
	got := frameOf(p)
	if len(got) < first.hlen || !bytes.Equal(got[:first.hlen], exp) {
		return fmt.Errorf("headers:\ngot  %x\nwant %x", got[:min(len(got), first.hlen)], exp)
	}
	// The same, field by field, against the packet itself.
	if !first.seg.ov6 {
		if ip := header.IPv4(got[l2:]); int(ip.TotalLength()) != ipLen || !ip.IsChecksumValid() {
			return fmt.Errorf("outer IPv4: total length %d (want %d), checksum valid %v", ip.TotalLength(), ipLen, ip.IsChecksumValid())
		}
	} else if n := int(header.IPv6(got[l2:]).PayloadLength()); n != ipLen-header.IPv6MinimumSize {
		return fmt.Errorf("outer IPv6 payload length: got %d, want %d", n, ipLen-header.IPv6MinimumSize)
	}
	if n := int(header.UDP(got[first.ol4:]).Length()); n != first.hlen-first.ol4+len(want) {
		return fmt.Errorf("outer UDP length: got %d, want %d", n, first.hlen-first.ol4+len(want))
	}
	if c := header.UDP(got[first.ol4:]).Checksum(); first.seg.ocsum0 != (c == 0) {
		return fmt.Errorf("outer UDP checksum %#04x: zero must stay zero, and only zero", c)
	}
	if !first.seg.v6 {
		ip := header.IPv4(got[first.inner:])
		if int(ip.TotalLength()) != first.hlen-first.inner+len(want) || !ip.IsChecksumValid() {
			return fmt.Errorf("inner IPv4: total length %d, checksum valid %v", ip.TotalLength(), ip.IsChecksumValid())
		}
	}
	return nil
}

// vxRuleCases returns the rules of VXLAN packets over an outer IPv4 or
// IPv6 header (ov6) carrying inner IPv4 or IPv6 TCP (v6). The runner wraps
// every segment without plain set.
func vxRuleCases(ov6, v6 bool) []rule {
	vxs := func(f func(*seg)) seg { s := seg{n: 1000}; f(&s); return s }
	rs := []rule{
		{name: "same size segments merge", segs: rep(4, n(1000)), want: [][]int{{0, 1, 2, 3}}, held: 1,
			stats: st("rx_gro_tunnel_packets", 4, "rx_gro_tunnel_skbs", 1, "rx_gro_segs_hist_4_7", 1)},
		{name: "one segment is held and comes out as it went in", segs: one(n(1000)), want: [][]int{{0}}, held: 1,
			stats: st("rx_gro_tunnel_skbs", 0, "rx_gro_passthrough", 0)},
		{name: "shorter segment is merged and ends the train", segs: one(n(1000), n(1000), n(500)),
			want: [][]int{{0, 1, 2}}, stats: st("rx_gro_flush_short", 1)},
		// vxlan_gro_prepare_receive: "vh->vx_vni != vh2->vx_vni".
		{name: "another VNI is another flow", segs: one(n(1000), vxs(func(s *seg) { s.vni = 43 }), n(1000), vxs(func(s *seg) { s.vni = 43 })),
			want: [][]int{{0, 2}, {1, 3}}, held: 2, stats: st("rx_gro_flush_mismatch", 0)},
		{name: "other VXLAN flags are another flow", segs: one(n(1000), vxs(func(s *seg) { s.vxFlags = 0x0c000000 })),
			want: [][]int{{0}, {1}}, held: 2, stats: st("rx_gro_flush_mismatch", 0)},
		// udp_gro_receive: "*(u32 *)&uh->source != *(u32 *)&uh2->source".
		{name: "another outer source port is another flow", segs: one(n(1000), vxs(func(s *seg) { s.oport = 50001 }), n(1000), vxs(func(s *seg) { s.oport = 50001 })),
			want: [][]int{{0, 2}, {1, 3}}, held: 2},
		// udp_gro_receive: "(!uh->check ^ !uh2->check)".
		{name: "a zero outer checksum is another flow, and merges", segs: one(n(1000), vxs(func(s *seg) { s.ocsum0 = true }), vxs(func(s *seg) { s.ocsum0 = true }), n(1000)),
			want: [][]int{{0, 3}, {1, 2}}, held: 2},
		{name: "another inner flow is another flow", segs: one(n(1000), seg{n: 1000, sport: 2000}, n(1000), seg{n: 1000, sport: 2000}),
			want: [][]int{{0, 2}, {1, 3}}, held: 2},
		// eth_gro_receive: compare_ether_header.
		{name: "another inner MAC is another flow", segs: one(n(1000), vxs(func(s *seg) { s.imac = 7 })),
			want: [][]int{{0}, {1}}, held: 2, stats: st("rx_gro_flush_mismatch", 0)},
		// gro_list_prepare: the outer Ethernet header.
		{name: "another outer MAC is another flow", segs: one(n(1000), seg{n: 1000, mac: 7}),
			want: [][]int{{0}, {1}}, held: 2, stats: st("rx_gro_flush_mismatch", 0)},
		{name: "a plain packet of the inner flow is another flow", segs: one(n(1000), seg{n: 1000, plain: true}, n(1000), seg{n: 1000, plain: true}),
			want: [][]int{{0, 2}, {1, 3}}, held: 2, stats: st("rx_gro_tunnel_skbs", 1, "rx_gro_skbs", 2)},
		{name: "sequence gap flushes", segs: one(n(1000), seg{n: 1000, seqOff: 100}, n(1000)),
			want: [][]int{{0}, {1, 2}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "retransmission flushes", segs: one(n(1000), n(1000), seg{n: 1000, seqOff: -2000}),
			want: [][]int{{0, 1}, {2}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "PSH is merged and flushes", segs: one(n(1000), fl(1000, header.TCPFlagPsh), n(1000)),
			want: [][]int{{0, 1}, {2}}, held: 1, stats: st("rx_gro_flush_flags", 1)},
		{name: "FIN is merged and flushes", segs: one(n(1000), fl(1000, header.TCPFlagFin)),
			want: [][]int{{0, 1}}, stats: st("rx_gro_flush_flags", 1)},
		{name: "RST is not merged and flushes", segs: one(n(1000), fl(1000, header.TCPFlagRst), n(1000)),
			want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_flush_flags", 1, "rx_gro_passthrough", 1, "rx_gro_tunnel_passthrough", 1)},
		{name: "URG is not merged and flushes", segs: one(n(1000), fl(1000, header.TCPFlagUrg), n(1000)),
			want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_flush_flags", 1, "rx_gro_passthrough", 1)},
		{name: "pure ACK flushes its flow and goes up", segs: one(n(1000), n(0), n(1000)),
			want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_flush_mismatch", 1, "rx_gro_passthrough", 1)},
		{name: "window change flushes", segs: one(n(1000), seg{n: 1000, window: 8192}),
			want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		// gro_receive_network_flush, with encap_mark: both IP headers.
		{name: "inner TTL change flushes", segs: one(n(1000), seg{n: 1000, ttl: 63}),
			want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "outer TTL change flushes", segs: one(n(1000), vxs(func(s *seg) { s.ottl = 63 }), vxs(func(s *seg) { s.ottl = 63 })),
			want: [][]int{{0}, {1, 2}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "inner TOS change flushes", segs: one(n(1000), seg{n: 1000, tos: 0x10}),
			want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "outer TOS change flushes", segs: one(n(1000), vxs(func(s *seg) { s.otos = 0x10 })),
			want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "outer ECN CE mark flushes", segs: one(n(1000), vxs(func(s *seg) { s.otos = 0x03 }), vxs(func(s *seg) { s.otos = 0x03 })),
			want: [][]int{{0}, {1, 2}}, held: 1},
		{name: "MaxSize bounds the outer IP length", cfg: Config{MaxSize: 3000}, segs: rep(4, n(1000)),
			want: [][]int{{0, 1}, {2, 3}}, held: 1, stats: st("rx_gro_flush_full", 1)},
		// skb_gro_receive: "p->len + len >= netif_get_gro_max_size(p)",
		// p->len the outer IP packet's: 102 to 142 bytes of headers
		// leave room for 45 segments of 1448 bytes in every family.
		{name: "outer IP length stops at 65535", segs: rep(46, n(1448)),
			want: [][]int{span(0, 45), {45}}, held: 1, anyFragList: true, stats: st("rx_gro_flush_full", 1, "rx_gro_tunnel_packets", 45)},
		{name: "MAX_SKB_FRAGS then frag_list", segs: rep(60, n(40)), want: [][]int{span(0, 60)}, held: 1, anyFragList: true},
		// skb_gro_checksum_validate (outer UDP, then inner TCP from the
		// same sum): a good CHECKSUM_NONE packet merges as a verified one.
		{name: "unverified checksums are verified in software and merge", segs: one(n(1000), seg{n: 1000, unver: true}, seg{n: 1000, unver: true}, n(1000)),
			want: [][]int{{0, 1, 2, 3}}, held: 1, stats: st("rx_gro_csum_sw", 2, "rx_gro_csum_bad", 0)},
		{name: "unverified with a zero outer checksum: the inner one is verified", segs: one(vxs(func(s *seg) { s.ocsum0 = true }), vxs(func(s *seg) { s.ocsum0, s.unver = true, true }), vxs(func(s *seg) { s.ocsum0, s.unver, s.badL4 = true, true, true }), vxs(func(s *seg) { s.ocsum0 = true })),
			want: [][]int{{2}, {0, 1}, {3}}, held: 1, stats: st("rx_gro_csum_sw", 1, "rx_gro_csum_bad", 1, "rx_gro_flush_mismatch", 1)},
		// udp4_gro_receive, udp6_gro_receive: "goto flush" before any
		// lookup: up at once, ahead of the held packet of the flow.
		{name: "bad outer checksum goes up ahead of the held packet", segs: one(n(1000), vxs(func(s *seg) { s.unver, s.obadL4 = true, true }), n(1000)),
			want: [][]int{{1}, {0}, {2}}, held: 1, stats: st("rx_gro_csum_bad", 1, "rx_gro_passthrough", 1, "rx_gro_tunnel_passthrough", 1, "rx_gro_flush_mismatch", 1)},
		{name: "bad outer checksum of a verified packet is not looked at", segs: one(n(1000), vxs(func(s *seg) { s.obadL4 = true })),
			want: [][]int{{0, 1}}, held: 1, stats: st("rx_gro_csum_bad", 0)},
		// tcp4_gro_receive, tcp6_gro_receive: the inner checksum, bad
		// under a good outer one.
		{name: "bad inner checksum goes up ahead of the held packet", segs: one(n(1000), seg{n: 1000, unver: true, badL4: true}, n(1000)),
			want: [][]int{{1}, {0}, {2}}, held: 1, stats: st("rx_gro_csum_bad", 1, "rx_gro_passthrough", 1, "rx_gro_flush_mismatch", 1)},
		// Padding: the outer IP length is not the frame's (and the
		// inner one neither). A verified packet is looked up and
		// flushes its flow; an unverified one with an outer checksum
		// goes to udp_gro_receive unchecked ("goto out").
		{name: "padded frame flushes the flow and goes up", segs: one(n(1000), seg{n: 1000, pad: 4}, n(1000)),
			want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_passthrough", 1, "rx_gro_flush_mismatch", 1)},
		{name: "unverified padded frame goes up ahead of the held packet", segs: one(n(1000), seg{n: 1000, pad: 4, unver: true}, n(1000)),
			want: [][]int{{1}, {0}, {2}}, held: 1, stats: st("rx_gro_passthrough", 1, "rx_gro_flush_mismatch", 1, "rx_gro_csum_bad", 0)},
		{name: "header copy shorter than the headers flushes and goes up", segs: one(n(1000), seg{n: 1000, short: 8}, n(1000)),
			want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_passthrough", 1)},
		{name: "HdrLen other than the headers flushes and goes up", segs: one(n(1000), seg{n: 1000, hdrAdj: -8}, n(1000)),
			want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_passthrough", 1)},
		// Inner packets that are not TCP: up at once, nothing flushed
		// (inet_gro_receive: no gro_receive for ICMP; udp_gro_receive:
		// no GRO; eth_gro_receive: no handler for ARP).
		{name: "inner UDP goes up and flushes nothing", segs: one(n(1000), seg{udp: true, n: 500}, seg{udp: true, n: 500}, n(1000)),
			want: [][]int{{1}, {2}, {0, 3}}, held: 1, stats: st("rx_gro_passthrough", 2, "rx_gro_tunnel_passthrough", 2)},
		{name: "inner ARP goes up and flushes nothing", segs: one(n(1000), seg{arp: true}, n(1000)),
			want: [][]int{{1}, {0, 2}}, held: 1, stats: st("rx_gro_passthrough", 1, "rx_gro_tunnel_passthrough", 1)},
		{name: "inner ICMP goes up and flushes nothing", segs: one(n(1000), seg{icmp: true, n: 56}, n(1000)),
			want: [][]int{{1}, {0, 2}}, held: 1, stats: st("rx_gro_passthrough", 1, "rx_gro_tunnel_passthrough", 1)},
		{name: "inner fragment goes up ahead of the held packet", segs: one(n(1000), seg{n: 1000, frag: true}, n(1000)),
			want: [][]int{{1}, {0}, {2}}, held: 1, stats: st("rx_gro_flush_mismatch", 1, "rx_gro_passthrough", 1)},
		{name: "interleaved tunnelled flows merge apart", segs: one(n(1000), seg{n: 1000, sport: 2000, oport: 50001}, n(1000), seg{n: 1000, sport: 2000, oport: 50001}, n(1000)),
			want: [][]int{{0, 2, 4}, {1, 3}}, held: 2, stats: st("rx_gro_held_max", 2)},
	}
	if !ov6 {
		rs = append(rs,
			// inet_gro_flush with the outer header (inner false): the
			// DF bit, and an ID fixed or going up by one per segment.
			rule{name: "outer DF change flushes", segs: one(n(1000), vxs(func(s *seg) { s.onoDF = true })),
				want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
			rule{name: "outer ID fixed merges", segs: rep(3, vxs(func(s *seg) { s.oid, s.osetID = 9, true })),
				want: [][]int{{0, 1, 2}}, held: 1},
			rule{name: "outer ID fixed without DF merges", segs: rep(3, vxs(func(s *seg) { s.oid, s.osetID, s.onoDF = 9, true, true })),
				want: [][]int{{0, 1, 2}}, held: 1},
			rule{name: "outer ID incrementing without DF merges", segs: rep(3, vxs(func(s *seg) { s.onoDF = true })),
				want: [][]int{{0, 1, 2}}, held: 1},
			rule{name: "outer ID jump flushes", segs: one(vxs(func(s *seg) { s.oid, s.osetID = 9, true }), vxs(func(s *seg) { s.oid, s.osetID = 11, true })),
				want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
			rule{name: "outer ID going down flushes", segs: one(vxs(func(s *seg) { s.oid, s.osetID = 9, true }), vxs(func(s *seg) { s.oid, s.osetID = 8, true })),
				want: [][]int{{0}, {1}}, held: 1},
			rule{name: "outer ID fixed then incrementing flushes", segs: one(vxs(func(s *seg) { s.oid, s.osetID = 9, true }), vxs(func(s *seg) { s.oid, s.osetID = 9, true }), vxs(func(s *seg) { s.oid, s.osetID = 10, true })),
				want: [][]int{{0, 1}, {2}}, held: 1},
			rule{name: "outer ID incrementing then fixed flushes", segs: one(vxs(func(s *seg) { s.oid, s.osetID = 9, true }), vxs(func(s *seg) { s.oid, s.osetID = 10, true }), vxs(func(s *seg) { s.oid, s.osetID = 10, true })),
				want: [][]int{{0, 1}, {2}}, held: 1},
			rule{name: "outer ID wraps", segs: one(vxs(func(s *seg) { s.oid, s.osetID = 65535, true }), vxs(func(s *seg) { s.oid, s.osetID = 0, true }), vxs(func(s *seg) { s.oid, s.osetID = 1, true })),
				want: [][]int{{0, 1, 2}}, held: 1},
			// The two IDs are decided apart (ip_fixedid's two bits).
			rule{name: "outer ID fixed, inner incrementing, merges", segs: rep(4, vxs(func(s *seg) { s.oid, s.osetID = 9, true })),
				want: [][]int{{0, 1, 2, 3}}, held: 1},
			rule{name: "outer IP options go up ahead of the held packet", segs: one(n(1000), vxs(func(s *seg) { s.oipOpts = true }), n(1000)),
				want: [][]int{{1}, {0}, {2}}, held: 1, stats: st("rx_gro_passthrough", 1, "rx_gro_tunnel_passthrough", 0)},
			rule{name: "outer fragment goes up ahead of the held packet", segs: one(n(1000), vxs(func(s *seg) { s.ofrag = true }), n(1000)),
				want: [][]int{{1}, {0}, {2}}, held: 1, stats: st("rx_gro_passthrough", 1)},
			rule{name: "outer bad header checksum goes up ahead of the held packet", segs: one(n(1000), vxs(func(s *seg) { s.obadSum = true }), n(1000)),
				want: [][]int{{1}, {0}, {2}}, held: 1, stats: st("rx_gro_passthrough", 1)},
			rule{name: "outer reserved flag flushes the flow and goes up", segs: one(n(1000), vxs(func(s *seg) { s.oevil = true }), n(1000)),
				want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_passthrough", 1, "rx_gro_flush_mismatch", 1)},
		)
	} else {
		rs = append(rs,
			rule{name: "outer flow label change is another flow", segs: one(n(1000), vxs(func(s *seg) { s.olabel = 0x11111 })),
				want: [][]int{{0}, {1}}, held: 2, stats: st("rx_gro_flush_mismatch", 0)},
		)
	}
	if !v6 {
		rs = append(rs,
			rule{name: "inner ID fixed merges", segs: rep(3, ids(1000, 7, false)), want: [][]int{{0, 1, 2}}, held: 1},
			rule{name: "inner ID jump flushes", segs: one(ids(1000, 7, false), ids(1000, 9, false)),
				want: [][]int{{0}, {1}}, held: 1},
			rule{name: "inner DF change flushes", segs: one(n(1000), seg{n: 1000, noDF: true}),
				want: [][]int{{0}, {1}}, held: 1},
			rule{name: "inner IP options go up ahead of the held packet", segs: one(n(1000), seg{n: 1000, ipOpts: true}, n(1000)),
				want: [][]int{{1}, {0}, {2}}, held: 1, stats: st("rx_gro_passthrough", 1, "rx_gro_tunnel_passthrough", 1)},
			rule{name: "inner reserved flag flushes the flow and goes up", segs: one(n(1000), seg{n: 1000, evil: true}, n(1000)),
				want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_passthrough", 1)},
		)
	} else {
		rs = append(rs,
			rule{name: "inner flow label change is another flow", segs: one(n(1000), seg{n: 1000, label: 0x54321}),
				want: [][]int{{0}, {1}}, held: 2},
			rule{name: "inner hop-by-hop header is another flow, and merges", segs: one(n(1000), seg{n: 1000, ipOpts: true}, seg{n: 1000, ipOpts: true}),
				want: [][]int{{0}, {1, 2}}, held: 2},
		)
	}
	return rs
}

// TestVXLANRules runs the VXLAN rules in each family of outer and inner
// IP header and each layout, checking what comes out, its payload and its
// headers at both levels (checkMergedVX), and the counters.
func TestVXLANRules(t *testing.T) {
	for _, ov6 := range []bool{false, true} {
		for _, v6 := range []bool{false, true} {
			fam := fmt.Sprintf("outer%d-inner%d", map[bool]int{false: 4, true: 6}[ov6], map[bool]int{false: 4, true: 6}[v6])
			t.Run(fam, func(t *testing.T) {
				for _, r := range vxRuleCases(ov6, v6) {
					if r.cfg.VXLANPorts == nil {
						r.cfg.VXLANPorts = vxCfg.VXLANPorts
					}
					t.Run(r.name, func(t *testing.T) {
						for l := range numLayouts {
							for _, rss := range []bool{false, true} {
								name := l.String()
								if rss {
									// One RSS hash for every packet: one
									// bucket, flows told apart by their keys
									// alone.
									name += "/rss"
								}
								t.Run(name, func(t *testing.T) {
									plain := false
									stats := runRuleWith(t, r, l, func(s *seg) {
										s.v6 = v6
										if rss {
											s.hash = 0x5a5a5a5a
										}
										if s.plain {
											plain = true
											return
										}
										s.vx, s.ov6 = true, ov6
									})
									// Every merged packet is a tunnelled one,
									// but where a plain flow is beside.
									if !plain && (stats["rx_gro_tunnel_packets"] != stats["rx_gro_packets"] ||
										stats["rx_gro_tunnel_skbs"] != stats["rx_gro_skbs"] ||
										stats["rx_gro_tunnel_bytes"] != stats["rx_gro_bytes"]) {
										t.Errorf("tunnel counters %d packets, %d skbs, %d bytes; all %d, %d, %d",
											stats["rx_gro_tunnel_packets"], stats["rx_gro_tunnel_skbs"], stats["rx_gro_tunnel_bytes"],
											stats["rx_gro_packets"], stats["rx_gro_skbs"], stats["rx_gro_bytes"])
									}
								})
							}
						}
					})
				}
			})
		}
	}
}

// TestVXLANOtherPort: a VXLAN frame to a port that is not a tunnel port is
// a plain UDP datagram (no vxlan socket, no vxlan_gro_receive): UDP GRO
// merges it by its UDP header, its payload the VXLAN header and inner
// frame. And a port list without 4789 leaves 4789 plain UDP.
func TestVXLANOtherPort(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ports []uint16
		dport uint16
	}{
		{"frames to 4790 with 4789 configured", []uint16{VXLANPort}, 4790},
		{"frames to 4789 with 8472 configured", []uint16{8472}, VXLANPort},
		{"frames to 4789 with no port", nil, VXLANPort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := newPool(t)
			w := newWire(t, pool)
			defer w.close()
			c := &collect{}
			defer c.release()
			e := New(Config{VXLANPorts: tc.ports}, c)
			bd := newBuilder()
			var ins []built
			for range 3 {
				b := bd.build(seg{vx: true, n: 1000, dport: tc.dport})
				ins = append(ins, b)
				e.Receive(udpCut(w, b), 0)
			}
			e.EndBatch(0)
			if len(c.got) != 1 || c.got[0].Segs != 3 {
				t.Fatalf("delivered %d packets (first of %d segments), want 1 of 3", len(c.got), c.got[0].Segs)
			}
			p := c.got[0]
			var want []byte
			for _, b := range ins {
				want = append(want, b.frame[b.ol4+udpHdrLen:]...)
			}
			if !bytes.Equal(payloadOf(p), want) {
				t.Errorf("UDP payload differs")
			}
			if got := header.UDP(p.Linear[ins[0].ol4:]).Length(); int(got) != udpHdrLen+len(want) {
				t.Errorf("UDP length: got %d, want %d", got, udpHdrLen+len(want))
			}
			m := statsMap(e.Stats())
			if m["rx_gro_tunnel_skbs"] != 0 || m["rx_gro_tunnel_packets"] != 0 || m["rx_gro_skbs"] != 1 {
				t.Errorf("counters: %v", m)
			}
		})
	}
}

// udpCut cuts the VXLAN frame b as a NIC that parses no tunnel: its
// headers those up to the outer UDP header's end.
func udpCut(w *wire, b built) *bufpool.Packet {
	hl := b.ol4 + udpHdrLen
	return w.packet(b.frame, hl, hl, layoutSplit)
}

// TestVXLANPortsEmptyUnchanged: with no tunnel port, what the engine does
// does not depend on the tunnel code: a sequence of plain TCP and UDP
// segments and of VXLAN frames (which are plain UDP datagrams then) comes
// out of an engine without ports byte for byte as out of one whose only
// port none of them is sent to, with the same counters; and the tunnel
// counters stay 0.
func TestVXLANPortsEmptyUnchanged(t *testing.T) {
	pool := newPool(t)
	var frames []built
	bd := newBuilder()
	for i := range 60 {
		s := seg{v6: i%3 == 1, udp: i%5 == 4, sport: uint16(1000 + i%4), n: 1000}
		switch i % 7 {
		case 2:
			s.vx, s.ov6 = true, i%2 == 0
		case 5:
			s.flags = header.TCPFlagPsh
		case 6:
			s.unver = true
		}
		frames = append(frames, bd.build(s))
	}
	run := func(cfg Config) (*collect, map[string]uint64) {
		w := newWire(t, pool)
		defer w.close()
		c := &collect{}
		e := New(cfg, c)
		for i, b := range frames {
			p := b.packet(w, layout(i%int(numLayouts)))
			if b.seg.vx {
				p.Release()
				p = udpCut(w, b)
				p.CsumVerified = !b.seg.unver
			}
			e.Receive(p, int64(i))
			if i%17 == 16 {
				e.EndBatch(int64(i))
			}
		}
		e.Flush()
		return c, statsMap(e.Stats())
	}
	a, sa := run(Config{})
	defer a.release()
	b, sb := run(Config{VXLANPorts: []uint16{9}})
	defer b.release()
	if len(a.got) != len(b.got) {
		t.Fatalf("delivered: %d without ports, %d with port 9", len(a.got), len(b.got))
	}
	merged := 0
	for i := range a.got {
		p, q := a.got[i], b.got[i]
		if p.Segs != q.Segs || p.GSOSize != q.GSOSize || p.HdrLen != q.HdrLen || p.CsumVerified != q.CsumVerified ||
			!bytes.Equal(frameOf(p), frameOf(q)) || !bytes.Equal(payloadOf(p), payloadOf(q)) {
			t.Errorf("packet %d differs", i)
		}
		if p.Segs > 1 {
			merged++
		}
	}
	if !maps.Equal(sa, sb) {
		t.Errorf("counters differ:\n%v\n%v", sa, sb)
	}
	if sa["rx_gro_tunnel_packets"]+sa["rx_gro_tunnel_passthrough"] != 0 || merged == 0 {
		t.Errorf("tunnel counters %d, %d; merged %d", sa["rx_gro_tunnel_packets"], sa["rx_gro_tunnel_passthrough"], merged)
	}
}

// TestVXLANEncap checks Encap on a merged VXLAN packet and on a single
// one: the offsets of each header, the VNI, and the GSO type.
func TestVXLANEncap(t *testing.T) {
	for _, ov6 := range []bool{false, true} {
		for _, v6 := range []bool{false, true} {
			for _, csum0 := range []bool{false, true} {
				t.Run(fmt.Sprintf("ov6=%v/v6=%v/csum0=%v", ov6, v6, csum0), func(t *testing.T) {
					pool := newPool(t)
					w := newWire(t, pool)
					defer w.close()
					c := &collect{}
					defer c.release()
					e := New(vxCfg, c)
					bd := newBuilder()
					var b built
					for _, k := range []int{1000, 1000, 1000} {
						b = bd.build(seg{vx: true, ov6: ov6, v6: v6, ocsum0: csum0, vni: 0x123456, n: k})
						e.Receive(b.packet(w, layoutSplit), 0)
					}
					e.Receive(bd.build(seg{vx: true, ov6: ov6, v6: v6, ocsum0: csum0, vni: 0x123456, n: 0}).packet(w, layoutSplit), 0)
					e.EndBatch(0)
					if len(c.got) != 2 || c.got[0].Segs != 3 {
						t.Fatalf("delivered %d packets, want a merged one and an ACK", len(c.got))
					}
					wantGSO := GSOUDPTunnelCsum
					if csum0 {
						wantGSO = GSOUDPTunnel
					}
					if v6 {
						wantGSO |= GSOTCPv6
					} else {
						wantGSO |= GSOTCPv4
					}
					for i, p := range c.got {
						en, ok := e.Encap(p)
						if !ok {
							t.Fatalf("packet %d: Encap: not VXLAN", i)
						}
						want := Encap{OuterNetwork: 14, OuterTransport: b.ol4, VXLAN: b.ol4 + 8, InnerMAC: b.ol4 + 16,
							InnerNetwork: b.inner, InnerTransport: b.l4, InnerProto: protoTCP, VNI: 0x123456,
							OuterIPv6: ov6, InnerIPv6: v6, OuterCsum: !csum0, InnerEtherType: 0x0800}
						if v6 {
							want.InnerEtherType = 0x86dd
						}
						if i == 0 {
							want.GSOType = wantGSO
						}
						if en != want {
							t.Errorf("packet %d: Encap:\ngot  %+v\nwant %+v", i, en, want)
						}
						if en2, ok := vxCfg.Encap(p); !ok || en2 != en {
							t.Errorf("packet %d: Config.Encap differs from Engine.Encap", i)
						}
					}
					if _, ok := New(Config{}, c).Encap(c.got[0]); ok {
						t.Errorf("Encap without VXLAN ports: got ok")
					}
				})
			}
		}
	}
}

// TestVXLANL3 runs VXLAN over an L3 (TUN) engine: the outer IP header at 0.
func TestVXLANL3(t *testing.T) {
	pool := newPool(t)
	w := newWire(t, pool)
	defer w.close()
	c := &collect{}
	defer c.release()
	e := New(Config{L3: true, VXLANPorts: vxCfg.VXLANPorts}, c)
	bd := newBuilder()
	var want []byte
	var first built
	for i := range 4 {
		b := bd.build(seg{vx: true, n: 1000})
		if i == 0 {
			first = b
		}
		want = append(want, b.payload...)
		f := b.frame[header.EthernetMinimumSize:]
		e.Receive(w.packet(f, b.hlen-header.EthernetMinimumSize, -1, layoutSplit), 0)
	}
	e.EndBatch(0)
	if len(c.got) != 1 || c.got[0].Segs != 4 || !bytes.Equal(payloadOf(c.got[0]), want) {
		t.Fatalf("delivered %d packets, want 1 of 4 segments with the payload", len(c.got))
	}
	l := c.got[0].Linear
	if ip := header.IPv4(l); int(ip.TotalLength()) != first.hlen-14+len(want) || !ip.IsChecksumValid() {
		t.Errorf("outer IPv4 header: length %d, checksum valid %v", ip.TotalLength(), ip.IsChecksumValid())
	}
	if ip := header.IPv4(l[first.inner-14:]); int(ip.TotalLength()) != first.hlen-first.inner+len(want) || !ip.IsChecksumValid() {
		t.Errorf("inner IPv4 header: length %d, checksum valid %v", ip.TotalLength(), ip.IsChecksumValid())
	}
	if en, ok := e.Encap(c.got[0]); !ok || en.OuterNetwork != 0 || en.InnerNetwork != first.inner-14 {
		t.Errorf("Encap: %+v, %v", en, ok)
	}
}

// vxWrites returns 64 KB TCP writes in VXLAN, as tcpWrites.
func vxWrites(ov6, v6 bool, writes int) []built {
	bd := newBuilder()
	var out []built
	for range writes {
		for i := range 45 {
			s := seg{vx: true, ov6: ov6, v6: v6, n: 1400}
			if i == 44 {
				s.flags = header.TCPFlagPsh
			}
			out = append(out, bd.build(s))
		}
	}
	return out
}

// TestVXLANNoAllocs pins Receive and EndBatch at zero heap allocations per
// VXLAN packet in steady state, checksums verified or not.
func TestVXLANNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	for _, wl := range []workload{
		{"vxlan4-tcp4", layoutSplit, vxWrites(false, false, 2)},
		{"vxlan6-tcp6-hds256", layout256, vxWrites(true, true, 2)},
		{"vxlan6-tcp4-shampo", layoutShampo, vxWrites(true, false, 2)},
	} {
		for _, none := range []bool{false, true} {
			name := wl.name
			if none {
				name += "/csum-none"
			}
			t.Run(name, func(t *testing.T) {
				pool := newPool(t)
				tm := newTemplates(t, pool, wl)
				defer tm.release()
				e := New(vxCfg, &releaser{})
				i := 0
				batch := func() {
					for range 45 {
						p := tm.clone(i)
						p.CsumVerified = p.CsumVerified && !none
						e.Receive(p, 0)
						i = (i + 1) % len(tm.pkts)
					}
					e.EndBatch(0)
				}
				for range 100 {
					batch()
				}
				if got := testing.AllocsPerRun(100, batch); got != 0 {
					t.Errorf("allocations per batch of 45: got %v, want 0", got)
				}
				if e.Stats().TunnelSKBs.Load() == 0 {
					t.Errorf("rx_gro_tunnel_skbs: got 0, want merges")
				}
				if none && e.Stats().CsumSoftware.Load() == 0 {
					t.Errorf("rx_gro_csum_sw: got 0, want checksums verified in software")
				}
			})
		}
	}
}

// TestVXLANChecksumFromOuterSum: the inner TCP checksum, checked from the
// outer UDP checksum's sum, finds what a pass of its own finds, over
// payloads cut into frags of odd lengths.
func TestVXLANChecksumFromOuterSum(t *testing.T) {
	pool := newPool(t)
	w := newWire(t, pool)
	defer w.close()
	bd := newBuilder()
	for _, bad := range []bool{false, true} {
		for _, k := range []int{1, 2, 3, 999, 1000, 1447} {
			b := bd.build(seg{vx: true, ov6: k%2 == 0, v6: k%3 == 0, n: k, badL4: bad})
			p := bufpool.NewPacket()
			p.Linear = append(p.Linear[:0], b.frame[:b.hlen]...)
			for off, n := b.hlen, 1; off < len(b.frame); off, n = off+n, n+1 {
				w.put(p, b.frame[off:min(off+n, len(b.frame))], 0)
			}
			p.Len, p.HdrLen = len(b.frame), b.hlen
			s := segInfo{l2: header.EthernetMinimumSize, vx: newVXState(vxCfg.VXLANPorts)}
			v := parse(p, &s)
			if s.t == nil || !s.t.osumOK {
				t.Fatalf("n %d: the outer checksum was not checked", k)
			}
			wantV, wantCsum := candidate, csumGood
			if bad {
				wantV, wantCsum = passOther, csumBad
			}
			if v != wantV || s.csum != wantCsum || p.CsumVerified == bad {
				t.Errorf("n %d bad %v: verdict %d, csum %d, CsumVerified %v", k, bad, v, s.csum, p.CsumVerified)
			}
			// The inner checksum on its own.
			ip := b.frame[b.inner:]
			src, dst := ip[12:16], ip[16:20]
			if b.seg.v6 {
				src, dst = ip[8:24], ip[24:40]
			}
			if got := pseudoValid(rawSum(p, b.l4), src, dst, protoTCP, len(b.frame)-b.l4); got == bad {
				t.Errorf("n %d bad %v: the inner checksum on its own: valid %v", k, bad, got)
			}
			p.Release()
		}
	}
}

// TestVXLANHeldApart: flows told apart at each layer sit in the table side
// by side, and each merges its own segments.
func TestVXLANHeldApart(t *testing.T) {
	pool := newPool(t)
	w := newWire(t, pool)
	defer w.close()
	c := &collect{}
	defer c.release()
	e := New(vxCfg, c)
	bd := newBuilder()
	variants := []seg{
		{}, {vni: 7}, {oport: 1}, {sport: 3}, {imac: 9}, {mac: 9}, {ocsum0: true}, {ov6: true},
	}
	var ins [][]built
	for range 3 {
		for vi, v := range variants {
			v.vx, v.n = true, 700
			if len(ins) <= vi {
				ins = append(ins, nil)
			}
			b := bd.build(v)
			ins[vi] = append(ins[vi], b)
			e.Receive(b.packet(w, layoutSplit), 0)
		}
	}
	if got := e.Held(); got != len(variants) {
		t.Errorf("held: got %d, want %d", got, len(variants))
	}
	e.EndBatch(0)
	if len(c.got) != len(variants) {
		t.Fatalf("delivered %d, want %d", len(c.got), len(variants))
	}
	found := 0
	for _, p := range c.got {
		for _, in := range ins {
			if checkMerged(p, in) == nil {
				found++
				break
			}
		}
	}
	if found != len(variants) {
		t.Errorf("%d of %d packets are one variant's three segments", found, len(variants))
	}
	if m := statsMap(e.Stats()); m["rx_gro_tunnel_packets"] != uint64(3*len(variants)) {
		t.Errorf("rx_gro_tunnel_packets: got %d", m["rx_gro_tunnel_packets"])
	}
}
