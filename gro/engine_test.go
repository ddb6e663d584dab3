package gro

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// TestMain fails the run if a test leaves a goroutine running or a page
// of a testutil pool out.
func TestMain(m *testing.M) { testutil.Main(m) }

// rule is one table case: frames fed in one batch, what is held before
// EndBatch, and which frames each delivered packet holds.
type rule struct {
	name string
	cfg  Config
	segs []seg
	// want lists the delivered packets, each as the indices of the frames
	// it holds in order. Packets delivered before EndBatch must come in
	// this order; the last held ones, handed up by EndBatch, in any order.
	want    [][]int
	wantBy  map[layout][][]int           // overrides want for a layout
	held    int                          // Held() before EndBatch
	stats   map[string]uint64            // counters that must have these values
	statsBy map[layout]map[string]uint64 // adds to stats for a layout
	// anyFragList leaves rx_gro_frag_list unchecked in the layouts
	// without a 256-byte header copy (where it depends on how frames
	// fall on pages).
	anyFragList bool
}

func n(k int) seg                         { return seg{n: k} }
func fl(k int, f header.TCPFlags) seg     { return seg{n: k, flags: f} }
func udp(k int) seg                       { return seg{n: k, udp: true} }
func ids(k int, id uint16, noDF bool) seg { return seg{n: k, id: id, setID: true, noDF: noDF} }
func gso(k int, size, id uint16) seg      { return seg{n: k, lro: size, id: id, setID: true} }
func fixed(s seg) seg                     { s.id, s.setID = 7, true; return s }
func rep(c int, s seg) []seg              { return slices.Repeat([]seg{s}, c) }
func cat(ss ...[]seg) []seg               { return slices.Concat(ss...) }
func one(s ...seg) []seg                  { return s }
func span(from, to int) []int {
	r := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		r = append(r, i)
	}
	return r
}
func st(kv ...any) map[string]uint64 {
	m := map[string]uint64{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(string)] = uint64(kv[i+1].(int))
	}
	return m
}

// ruleCases returns the table for one IP version; v4-only and v6-only
// rules are left out of the other.
func ruleCases(v6 bool) []rule {
	// frames of exactly 128 bytes: 32 per page on 64-byte strides.
	small := 128 - 66
	if v6 {
		small = 128 - 86
	}
	rs := []rule{
		{name: "same size segments merge", segs: rep(4, n(1000)), want: [][]int{{0, 1, 2, 3}}, held: 1,
			stats: st("rx_gro_flush_batch_end", 1, "rx_gro_segs_hist_4_7", 1, "rx_gro_held_max", 1)},
		{name: "one segment is held until batch end", segs: one(n(1000)), want: [][]int{{0}}, held: 1,
			stats: st("rx_gro_skbs", 0, "rx_gro_segs_hist_1", 1, "rx_gro_passthrough", 0)},
		{name: "shorter segment is merged and ends the train", segs: one(n(1000), n(1000), n(1000), n(500)),
			want: [][]int{{0, 1, 2, 3}}, stats: st("rx_gro_flush_short", 1)},
		{name: "longer segment flushes and starts a train", segs: one(n(1000), n(1000), n(1200), n(1200)),
			want: [][]int{{0, 1}, {2, 3}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "short head: a longer segment flushes it", segs: one(n(500), n(1000)),
			want: [][]int{{0}, {1}}, held: 1},
		{name: "PSH is merged and flushes", segs: one(n(1000), n(1000), fl(1000, header.TCPFlagPsh), n(1000)),
			want: [][]int{{0, 1, 2}, {3}}, held: 1, stats: st("rx_gro_flush_flags", 1)},
		{name: "FIN is merged and flushes", segs: one(n(1000), fl(1000, header.TCPFlagFin)),
			want: [][]int{{0, 1}}, stats: st("rx_gro_flush_flags", 1)},
		{name: "short PSH segment is merged and flushes", segs: one(n(1000), fl(300, header.TCPFlagPsh)),
			want: [][]int{{0, 1}}, stats: st("rx_gro_flush_flags", 1, "rx_gro_flush_short", 0)},
		{name: "PSH with nothing held goes up", segs: one(fl(1000, header.TCPFlagPsh), n(1000), n(1000)),
			want: [][]int{{0}, {1, 2}}, held: 1, stats: st("rx_gro_passthrough", 1)},
		{name: "SYN is not merged and flushes", segs: one(n(1000), n(1000), fl(1000, header.TCPFlagSyn), n(1000)),
			want: [][]int{{0, 1}, {2}, {3}}, held: 1, stats: st("rx_gro_flush_flags", 1, "rx_gro_passthrough", 1)},
		{name: "RST is not merged and flushes", segs: one(n(1000), fl(1000, header.TCPFlagRst), n(1000)),
			want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_flush_flags", 1, "rx_gro_passthrough", 1)},
		{name: "URG is not merged and flushes", segs: one(n(1000), fl(1000, header.TCPFlagUrg), n(1000)),
			want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_flush_flags", 1, "rx_gro_passthrough", 1)},
		// tcp_gro_receive: "flags & TCP_FLAG_CWR" flushes, and a segment
		// without CWR after a held one with it differs in its flags.
		{name: "CWR flushes and is held alone", segs: one(n(1000), fl(1000, header.TCPFlagCwr), n(1000)),
			want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_flush_flags", 2)},
		{name: "CWR after CWR flushes", segs: one(n(1000), fl(1000, header.TCPFlagCwr), fl(1000, header.TCPFlagCwr)),
			want: [][]int{{0}, {1}, {2}}, held: 1, stats: st("rx_gro_flush_flags", 2)},
		{name: "ECE change flushes", segs: one(n(1000), fl(1000, header.TCPFlagEce), fl(1000, header.TCPFlagEce)),
			want: [][]int{{0}, {1, 2}}, held: 1, stats: st("rx_gro_flush_flags", 1)},
		{name: "window change flushes", segs: one(n(1000), seg{n: 1000, window: 8192}),
			want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "ACK number change flushes", segs: one(n(1000), seg{n: 1000, ackOff: 1}, seg{n: 1000, ackOff: 1}),
			want: [][]int{{0}, {1, 2}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "timestamp change flushes", segs: one(n(1000), seg{n: 1000, tsval: 2}),
			want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "options length change flushes", segs: one(n(1000), seg{n: 1000, noOpts: true}),
			want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "segments without options merge", segs: rep(3, seg{n: 1000, noOpts: true}),
			want: [][]int{{0, 1, 2}}, held: 1},
		{name: "sequence gap flushes", segs: one(n(1000), seg{n: 1000, seqOff: 100}, n(1000)),
			want: [][]int{{0}, {1, 2}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "retransmission flushes", segs: one(n(1000), n(1000), seg{n: 1000, seqOff: -2000}),
			want: [][]int{{0, 1}, {2}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "pure ACK flushes its flow and goes up", segs: one(n(1000), n(0), n(0), n(1000)),
			want: [][]int{{0}, {1}, {2}, {3}}, held: 1, stats: st("rx_gro_flush_mismatch", 1, "rx_gro_passthrough", 2)},
		{name: "pure ACK alone goes up", segs: one(n(0)), want: [][]int{{0}}, stats: st("rx_gro_passthrough", 1)},
		{name: "TTL change flushes", segs: one(n(1000), seg{n: 1000, ttl: 63}),
			want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "TOS change flushes", segs: one(n(1000), seg{n: 1000, tos: 0x10}),
			want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "ECN CE mark flushes", segs: one(n(1000), seg{n: 1000, tos: 0x03}, seg{n: 1000, tos: 0x03}),
			want: [][]int{{0}, {1, 2}}, held: 1},
		// gro_list_prepare: another Ethernet header is another flow,
		// held beside the first.
		{name: "MAC change is another flow", segs: one(n(1000), seg{n: 1000, mac: 7}),
			want: [][]int{{0}, {1}}, held: 2, stats: st("rx_gro_flush_mismatch", 0)},
		{name: "fragment goes up ahead of the held packet", segs: one(n(1000), seg{n: 1000, frag: true}, seg{n: 1000, frag: true}, n(1000)),
			want: [][]int{{1}, {2}, {0}, {3}}, held: 1, stats: st("rx_gro_flush_mismatch", 1, "rx_gro_passthrough", 2)},
		{name: "fragment of another flow flushes nothing", segs: one(n(1000), seg{n: 1000, frag: true, sport: 7}, n(1000)),
			want: [][]int{{1}, {0, 2}}, held: 1, stats: st("rx_gro_flush_mismatch", 0)},
		// skb_gro_checksum_validate: a CHECKSUM_NONE packet is
		// verified in software and merges as a verified one.
		{name: "unverified checksum is verified in software and merges", segs: one(n(1000), seg{n: 1000, unver: true}, seg{n: 1000, unver: true}, n(1000)),
			want: [][]int{{0, 1, 2, 3}}, held: 1, stats: st("rx_gro_csum_sw", 2, "rx_gro_csum_bad", 0)},
		// gro.c "changed checksum does not coalesce": a bad checksum
		// goes up unmerged at once, ahead of the held packet of its flow
		// (tcp4_gro_receive: "goto flush" before tcp_gro_receive).
		{name: "bad TCP checksum goes up ahead of the held packet", segs: one(n(1000), seg{n: 1000, unver: true, badL4: true}, n(1000)),
			want: [][]int{{1}, {0}, {2}}, held: 1, stats: st("rx_gro_csum_bad", 1, "rx_gro_passthrough", 1, "rx_gro_flush_mismatch", 1)},
		{name: "bad checksum of a verified packet is not looked at", segs: one(n(1000), seg{n: 1000, badL4: true}),
			want: [][]int{{0, 1}}, held: 1, stats: st("rx_gro_csum_bad", 0)},
		{name: "unverified checksum of another flow flushes nothing", segs: one(n(1000), seg{n: 1000, unver: true, sport: 2000}, n(1000)),
			want: [][]int{{0, 2}, {1}}, held: 2, stats: st("rx_gro_passthrough", 0, "rx_gro_flush_mismatch", 0)},
		{name: "ARP goes up and flushes nothing", segs: one(n(1000), seg{arp: true}, n(1000)),
			want: [][]int{{1}, {0, 2}}, held: 1, stats: st("rx_gro_passthrough", 1)},
		{name: "ICMP goes up and flushes nothing", segs: one(n(1000), seg{icmp: true, n: 56}, n(1000)),
			want: [][]int{{1}, {0, 2}}, held: 1, stats: st("rx_gro_passthrough", 1)},
		{name: "interleaved flows merge apart", segs: one(n(1000), seg{n: 1000, sport: 2000}, n(1000), seg{n: 1000, sport: 2000}, n(1000)),
			want: [][]int{{0, 2, 4}, {1, 3}}, held: 2, stats: st("rx_gro_held_max", 2)},
		{name: "padded frame goes up and flushes the flow", segs: one(n(1000), seg{n: 1000, pad: 4}, seg{n: 1000, pad: 4}, n(1000)),
			want: [][]int{{0}, {1}, {2}, {3}}, held: 1, stats: st("rx_gro_passthrough", 2)},
		{name: "header copy shorter than the headers goes up", segs: one(n(1000), seg{n: 1000, short: 12}, seg{n: 1000, short: 12}, n(1000)),
			want: [][]int{{0}, {1}, {2}, {3}}, held: 1, stats: st("rx_gro_passthrough", 2)},
		{name: "HdrLen other than the headers goes up", segs: one(n(1000), seg{n: 1000, hdrAdj: 4}, seg{n: 1000, hdrAdj: 4}, n(1000)),
			want: [][]int{{0}, {1}, {2}, {3}}, held: 1, stats: st("rx_gro_passthrough", 2)},
		// tcp_gro_receive merges GSO (LRO) packets of the held packet's
		// gso_size. An LRO packet carries its first segment's IPv4 ID,
		// and inet_gro_flush counts its segments. Counts are wire
		// frames: 1 + 3 + 3 + 1.
		{name: "GSO packets of equal gso_size merge", segs: one(ids(1000, 7, false), gso(3000, 1000, 8), gso(3000, 1000, 11), ids(1000, 14, false)),
			want: [][]int{{0, 1, 2, 3}}, held: 1, stats: st("rx_gro_packets", 8, "rx_gro_segs_hist_8_15", 1)},
		{name: "GSO packet of another gso_size flushes and is held", segs: one(ids(1000, 7, false), gso(3000, 1500, 8), ids(1000, 10, false)),
			want: [][]int{{0}, {1, 2}}, held: 0, stats: st("rx_gro_flush_mismatch", 1, "rx_gro_flush_short", 1, "rx_gro_packets", 3)},
		{name: "GSO packet as head holds its gso_size", segs: one(gso(3000, 1000, 7), ids(1000, 10, false), ids(1000, 11, false)),
			want: [][]int{{0, 1, 2}}, held: 1, stats: st("rx_gro_packets", 5)},
		{name: "GSO packet with a short last segment merges and ends the train", segs: one(ids(1000, 7, false), gso(2500, 1000, 8)),
			want: [][]int{{0, 1}}, held: 0, stats: st("rx_gro_flush_short", 1, "rx_gro_packets", 4)},
		{name: "GSO packet with a short last segment goes up alone", segs: one(seg{n: 2500, lro: 1000}),
			want: [][]int{{0}}, held: 0, stats: st("rx_gro_passthrough", 1)},
		{name: "MaxSize ends a packet", cfg: Config{MaxSize: 3000}, segs: rep(4, n(1000)),
			want: [][]int{{0, 1}, {2, 3}}, held: 1, stats: st("rx_gro_flush_full", 1)},
		// With header/data split, 1448-byte payloads on 64-byte strides
		// take 62 frags: 17 per packet of the chain (MAX_SKB_FRAGS),
		// then 3 more packets on the frag_list.
		{name: "IP length stops at 65535", segs: rep(46, n(1448)),
			want: [][]int{span(0, 45), {45}}, held: 1, stats: st("rx_gro_flush_full", 1, "rx_gro_segs_hist_32_63", 1),
			statsBy: map[layout]map[string]uint64{layoutSplit: st("rx_gro_frag_list", 3)}},
		// skb_gro_receive: "if (nr_frags > MAX_SKB_FRAGS) goto merge",
		// and the frags go on in the frag_list's last packet: 100
		// one-frag payloads make 6 packets of at most 17 frags.
		{name: "MAX_SKB_FRAGS then frag_list", segs: rep(100, n(small)),
			want: [][]int{span(0, 100)}, held: 1,
			statsBy: map[layout]map[string]uint64{layoutSplit: st("rx_gro_frag_list", 5)}},

		{name: "UDP datagrams of one size merge", segs: rep(4, udp(500)), want: [][]int{{0, 1, 2, 3}}, held: 1},
		{name: "UDP shorter datagram is merged and ends the train", segs: one(udp(500), udp(500), udp(200)),
			want: [][]int{{0, 1, 2}}, stats: st("rx_gro_flush_short", 1)},
		{name: "UDP longer datagram starts a train", segs: one(udp(500), udp(500), udp(800), udp(800)),
			want: [][]int{{0, 1}, {2, 3}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "UDP train ends at 64 datagrams", segs: rep(70, udp(100)),
			want: [][]int{span(0, 64), span(64, 70)}, held: 1, stats: st("rx_gro_flush_full", 1, "rx_gro_segs_hist_64_plus", 1),
			statsBy: map[layout]map[string]uint64{layoutSplit: st("rx_gro_frag_list", 3)}},
		// udp_gro_receive_segment: "ulen <= sizeof(*uh)" and "!uh->check"
		// go up at once, ahead of the held datagrams.
		{name: "UDP empty datagram goes up ahead of the held ones", segs: one(fixed(udp(500)), fixed(udp(0)), fixed(udp(0)), fixed(udp(500))),
			want: [][]int{{1}, {2}, {0, 3}}, held: 1, stats: st("rx_gro_passthrough", 2)},
		{name: "UDP checksum 0 goes up ahead of the held ones", segs: one(fixed(udp(500)), fixed(seg{udp: true, n: 500, csum0: true}), fixed(seg{udp: true, n: 500, csum0: true}), fixed(udp(500))),
			want: [][]int{{1}, {2}, {0, 3}}, held: 1, stats: st("rx_gro_passthrough", 2)},
		{name: "UDP unverified checksum is verified in software", segs: one(udp(500), seg{udp: true, n: 500, unver: true}, udp(500)),
			want: [][]int{{0, 1, 2}}, held: 1, stats: st("rx_gro_csum_sw", 1)},
		{name: "UDP bad checksum goes up ahead of the held ones", segs: one(fixed(udp(500)), fixed(seg{udp: true, n: 500, unver: true, badL4: true}), fixed(udp(500))),
			want: [][]int{{1}, {0, 2}}, held: 1, stats: st("rx_gro_csum_bad", 1, "rx_gro_passthrough", 1)},
		{name: "UDP TTL change flushes", segs: one(udp(500), seg{udp: true, n: 500, ttl: 1}),
			want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		{name: "UDP MaxSize ends a train", cfg: Config{MaxSize: 1100}, segs: rep(4, udp(500)),
			want: [][]int{{0, 1}, {2, 3}}, held: 1, stats: st("rx_gro_flush_full", 1)},
		{name: "UDP and TCP of the same ports are apart", segs: one(n(1000), udp(500), n(1000), udp(500)),
			want: [][]int{{0, 2}, {1, 3}}, held: 2},
	}
	if !v6 {
		rs = append(rs,
			rule{name: "IPv4 ID fixed with DF merges", segs: one(ids(1000, 7, false), ids(1000, 7, false), ids(1000, 7, false)),
				want: [][]int{{0, 1, 2}}, held: 1},
			// inet_gro_flush in 6.18: "if (count == 1 &&
			// !ipid_offset)", DF or not (gro.c "DF=0, Fixed").
			rule{name: "IPv4 ID fixed without DF merges", segs: one(ids(1000, 7, true), ids(1000, 7, true), ids(1000, 7, true)),
				want: [][]int{{0, 1, 2}}, held: 1},
			rule{name: "IP options go up ahead of the held packet", segs: one(n(1000), seg{n: 1000, ipOpts: true}, seg{n: 1000, ipOpts: true}, n(1000)),
				want: [][]int{{1}, {2}, {0}, {3}}, held: 1, stats: st("rx_gro_flush_mismatch", 1, "rx_gro_passthrough", 2)},
			rule{name: "IPv4 ID incrementing without DF merges", segs: rep(3, seg{n: 1000, noDF: true}),
				want: [][]int{{0, 1, 2}}, held: 1},
			rule{name: "IPv4 ID fixed then incrementing flushes", segs: one(ids(1000, 7, false), ids(1000, 7, false), ids(1000, 8, false)),
				want: [][]int{{0, 1}, {2}}, held: 1},
			rule{name: "IPv4 ID incrementing then fixed flushes", segs: one(ids(1000, 7, false), ids(1000, 8, false), ids(1000, 8, false)),
				want: [][]int{{0, 1}, {2}}, held: 1},
			rule{name: "IPv4 ID jump flushes", segs: one(ids(1000, 7, false), ids(1000, 9, false)),
				want: [][]int{{0}, {1}}, held: 1},
			rule{name: "IPv4 ID wraps", segs: one(ids(1000, 65535, false), ids(1000, 0, false), ids(1000, 1, false)),
				want: [][]int{{0, 1, 2}}, held: 1},
			rule{name: "IPv4 DF change flushes", segs: one(n(1000), seg{n: 1000, noDF: true}),
				want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
			// inet_gro_receive: ip_fast_csum fails before any flow
			// is looked up.
			rule{name: "IPv4 bad header checksum goes up ahead of the held packet", segs: one(n(1000), seg{n: 1000, badSum: true}, seg{n: 1000, badSum: true}, n(1000)),
				want: [][]int{{1}, {2}, {0}, {3}}, held: 1, stats: st("rx_gro_passthrough", 2)},
			// inet_gro_receive: "frag_off & ~IP_DF" sets the flush
			// that tcp_gro_receive turns into a flush of the flow.
			rule{name: "IPv4 reserved flag flushes the flow and goes up", segs: one(n(1000), seg{n: 1000, evil: true}, seg{n: 1000, evil: true}, n(1000)),
				want: [][]int{{0}, {1}, {2}, {3}}, held: 1, stats: st("rx_gro_passthrough", 2)},
		)
	} else {
		rs = append(rs,
			// ipv6_gro_receive: "first_word & htonl(0xF00FFFFF)":
			// another flow label is another flow, held beside.
			rule{name: "IPv6 flow label change is another flow", segs: one(n(1000), seg{n: 1000, label: 0x54321}),
				want: [][]int{{0}, {1}}, held: 2, stats: st("rx_gro_flush_mismatch", 0)},
			// A hop-by-hop header is walked (ipv6_gro_pull_exthdrs)
			// and part of the flow, byte for byte.
			rule{name: "IPv6 hop-by-hop header is another flow, and merges", segs: one(n(1000), seg{n: 1000, ipOpts: true}, seg{n: 1000, ipOpts: true}, n(1000)),
				want: [][]int{{0}, {1, 2}, {3}}, held: 2, stats: st("rx_gro_flush_mismatch", 1)},
			rule{name: "IPv6 hop limit change flushes", segs: one(n(1000), seg{n: 1000, ttl: 9}),
				want: [][]int{{0}, {1}}, held: 1, stats: st("rx_gro_flush_mismatch", 1)},
		)
	}
	return rs
}

// TestRules feeds each rule's frames, in each packet layout and IP version,
// and checks which packets come out, their bytes and headers, and the
// counters.
func TestRules(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		fam := "ipv4"
		if v6 {
			fam = "ipv6"
		}
		t.Run(fam, func(t *testing.T) {
			for _, r := range ruleCases(v6) {
				t.Run(r.name, func(t *testing.T) {
					for l := range numLayouts {
						t.Run(l.String(), func(t *testing.T) { runRule(t, r, v6, l) })
					}
				})
			}
		})
	}
}

func runRule(t *testing.T, r rule, v6 bool, l layout) {
	runRuleWith(t, r, l, func(s *seg) { s.v6 = v6 })
}

// runRuleWith runs rule r in layout l, each segment set by prep first, and
// returns the engine's counters.
func runRuleWith(t *testing.T, r rule, l layout, prep func(*seg)) map[string]uint64 {
	pool := testutil.NewPoisonPool(t)
	w := newWire(t, pool)
	c := &collect{}
	defer func() {
		c.release()
		w.close()
		if got := pool.InUse(); got != 0 {
			t.Errorf("pages in use after release: got %d, want 0", got)
		}
	}()
	e := New(r.cfg, c)
	bd := newBuilder()
	ins := make([]built, len(r.segs))
	for i, s := range r.segs {
		prep(&s)
		ins[i] = bd.build(s)
		e.Receive(ins[i].packet(w, l), int64(i))
	}
	want := r.want
	if wb, ok := r.wantBy[l]; ok {
		want = wb
	}
	if got := e.Held(); got != r.held {
		t.Errorf("Held before batch end: got %d, want %d", got, r.held)
	}
	before := len(c.got)
	e.EndBatch(int64(len(r.segs)))
	if got := e.Held(); got != 0 {
		t.Errorf("Held after batch end: got %d, want 0", got)
	}
	got := make([][]int, len(c.got))
	for k, p := range c.got {
		got[k] = identify(p, ins)
	}
	if len(c.got) != len(want) || before != len(want)-r.held {
		t.Fatalf("delivered: got %v (%d before batch end), want %v (%d before batch end)", got, before, want, len(want)-r.held)
	}
	for k := range before {
		if err := checkMerged(c.got[k], pick(ins, want[k])); err != nil {
			t.Errorf("packet %d: got %v, want %v: %v", k, got[k], want[k], err)
		}
	}
	rest := slices.Clone(want[before:])
	for k := before; k < len(c.got); k++ {
		found := false
		for j, wj := range rest {
			if wj != nil && checkMerged(c.got[k], pick(ins, wj)) == nil {
				rest[j], found = nil, true
				break
			}
		}
		if !found {
			t.Errorf("packet %d (at batch end): got %v, want one of %v", k, got[k], want[before:])
		}
	}

	stats := statsMap(e.Stats())
	var pkts, skbs, fragList uint64
	for _, wk := range want {
		if len(wk) > 1 {
			pkts += uint64(len(wk))
			skbs++
			if l == layout256 {
				fragList += uint64(len(wk) - 1)
			}
		}
	}
	checks := map[string]uint64{"rx_gro_packets": pkts, "rx_gro_skbs": skbs, "rx_gro_frag_list": fragList}
	for k, v := range r.stats {
		checks[k] = v
	}
	for k, v := range r.statsBy[l] {
		checks[k] = v
	}
	if r.anyFragList && l != layout256 {
		delete(checks, "rx_gro_frag_list")
	}
	for k, v := range checks {
		if stats[k] != v {
			t.Errorf("%s: got %d, want %d", k, stats[k], v)
		}
	}
	return stats
}

func pick(ins []built, idx []int) []built {
	out := make([]built, len(idx))
	for i, k := range idx {
		out[i] = ins[k]
	}
	return out
}

// identify names the frames a delivered packet holds, for messages: a
// single frame by its bytes, a merged packet by matching payloads in order.
func identify(p *bufpool.Packet, ins []built) []int {
	if p.Segs <= 1 && p.Next == nil {
		f := frameOf(p)
		for i, in := range ins {
			if bytes.Equal(f, in.frame) {
				return []int{i}
			}
		}
		return []int{-1}
	}
	var out []int
	rest := payloadOf(p)
	for len(rest) > 0 {
		i := -1
		for k, in := range ins {
			if len(in.payload) > 0 && bytes.HasPrefix(rest, in.payload) && !slices.Contains(out, k) {
				i = k
				break
			}
		}
		if i < 0 {
			return append(out, -1)
		}
		out = append(out, i)
		rest = rest[len(ins[i].payload):]
	}
	return out
}

func statsMap(s *Stats) map[string]uint64 {
	m := make(map[string]uint64)
	s.Each(func(name string, v uint64) { m[name] = v })
	return m
}

// TestFragCoalescing checks that payloads adjacent on a page become one
// frag, that payloads apart stay apart, and that page references add up.
func TestFragCoalescing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		l         layout
		sizes     []int
		wantFrags int
	}{
		{"adjacent payloads on one page", layoutShampo, []int{1000, 1000, 1000}, 1},
		{"adjacent payloads over two pages", layoutShampo, []int{1448, 1448, 1448}, 2},
		{"payloads apart on one page", layoutSplit, []int{900, 900, 900}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testutil.NewPoisonPool(t)
			w := newWire(t, pool)
			c := &collect{}
			e := New(Config{}, c)
			bd := newBuilder()
			var ins []built
			for _, sz := range tc.sizes {
				b := bd.build(n(sz))
				ins = append(ins, b)
				e.Receive(b.packet(w, tc.l), 0)
			}
			e.EndBatch(0)
			if len(c.got) != 1 {
				t.Fatalf("delivered: got %d packets, want 1", len(c.got))
			}
			p := c.got[0]
			if err := checkMerged(p, ins); err != nil {
				t.Error(err)
			}
			if got := len(p.Frags); got != tc.wantFrags {
				t.Errorf("frags: got %d, want %d", got, tc.wantFrags)
			}
			// Each frag holds one reference; the wire holds one on
			// its current page.
			refs := map[*bufpool.Page]int32{w.page: 1}
			for _, f := range p.Frags {
				refs[f.Page]++
			}
			for pg, want := range refs {
				if got := pg.Refs(); got != want {
					t.Errorf("page references: got %d, want %d", got, want)
				}
			}
			c.release()
			w.close()
			if got := pool.InUse(); got != 0 {
				t.Errorf("pages in use after release: got %d, want 0", got)
			}
		})
	}
}

// TestFlushTimeout checks gro_flush_timeout: EndBatch keeps packets younger
// than FlushTimeout and hands up the older ones.
func TestFlushTimeout(t *testing.T) {
	const ms = int64(time.Millisecond)
	type step struct {
		recv      int   // flow (source port) to receive a 1000-byte segment of; 0: none
		end       bool  // EndBatch
		olderThan int64 // FlushOlderThan this age (ns), if > 0
		flush     bool  // Flush
		at        int64 // now
		delivered int   // packets delivered so far, after the step
		held      int
	}
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		steps   []step
		stats   map[string]uint64
	}{
		{"timeout 0 flushes at each batch end", 0, []step{
			{recv: 1, at: 0, held: 1},
			{end: true, at: 0, delivered: 1},
		}, st("rx_gro_flush_batch_end", 1)},
		{"young packets stay across batches", 10 * time.Millisecond, []step{
			{recv: 1, at: 0, held: 1},
			{recv: 1, at: 1 * ms, held: 1},
			{end: true, at: 5 * ms, held: 1},
			{recv: 2, at: 6 * ms, held: 2},
			{recv: 1, at: 7 * ms, held: 2},
			{end: true, at: 10 * ms, delivered: 1, held: 1},
			{end: true, at: 15 * ms, delivered: 1, held: 1},
			{end: true, at: 16 * ms, delivered: 2, held: 0},
		}, st("rx_gro_flush_timeout", 2, "rx_gro_packets", 3, "rx_gro_skbs", 1)},
		{"FlushOlderThan and Flush", 10 * time.Millisecond, []step{
			{recv: 1, at: 0, held: 1},
			{recv: 2, at: 3 * ms, held: 2},
			{olderThan: 2 * ms, at: 4 * ms, delivered: 1, held: 1},
			{recv: 3, at: 4 * ms, delivered: 1, held: 2},
			{flush: true, at: 4 * ms, delivered: 3},
		}, st("rx_gro_flush_timeout", 1, "rx_gro_flush_batch_end", 2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testutil.NewPoisonPool(t)
			w := newWire(t, pool)
			c := &collect{}
			e := New(Config{FlushTimeout: tc.timeout}, c)
			bd := newBuilder()
			for i, s := range tc.steps {
				switch {
				case s.recv > 0:
					b := bd.build(seg{n: 1000, sport: uint16(s.recv)})
					e.Receive(b.packet(w, layoutSplit), s.at)
				case s.end:
					e.EndBatch(s.at)
				case s.olderThan > 0:
					e.FlushOlderThan(time.Duration(s.olderThan), s.at)
				case s.flush:
					e.Flush()
				}
				if got := len(c.got); got != s.delivered {
					t.Errorf("step %d: delivered: got %d, want %d", i, got, s.delivered)
				}
				if got := e.Held(); got != s.held {
					t.Errorf("step %d: held: got %d, want %d", i, got, s.held)
				}
			}
			m := statsMap(e.Stats())
			for k, v := range tc.stats {
				if m[k] != v {
					t.Errorf("%s: got %d, want %d", k, m[k], v)
				}
			}
			c.release()
			w.close()
		})
	}
}

// sportOf returns the (inner) TCP source port of a delivered packet whose
// TCP header carries the timestamp option (32 bytes, ending at HdrLen).
func sportOf(p *bufpool.Packet) uint16 {
	return header.TCP(p.Linear[p.HdrLen-32:]).SourcePort()
}

// TestEvict fills one hash bucket with 8 flows and checks that a ninth
// evicts the oldest (MAX_GRO_SKBS), and that other buckets are untouched:
// flows of RSS hashes whose low bits are alike, and flows without a hash,
// which all share bucket 0 (dev_gro_receive's skb_get_hash_raw is 0).
func TestEvict(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, rss := range []bool{false, true} {
			t.Run(fmt.Sprintf("v6=%v/rss=%v", v6, rss), func(t *testing.T) {
				pool := testutil.NewPoisonPool(t)
				w := newWire(t, pool)
				defer w.close()
				c := &collect{}
				defer c.release()
				e := New(Config{}, c)
				bd := newBuilder()
				// Nine flows of one bucket (3, or 0 without a hash)
				// and one of bucket 5, which comes first.
				hashOf := func(i int) uint32 {
					if !rss {
						return 0
					}
					return uint32(i)<<8 | 3
				}
				e.Receive(bd.build(seg{v6: v6, n: 1000, sport: 100, hash: 0x5005}).packet(w, layoutSplit), 0)
				for i := range 8 {
					e.Receive(bd.build(seg{v6: v6, n: 1000, sport: uint16(1 + i), hash: hashOf(i + 1)}).packet(w, layoutSplit), int64(i+1))
				}
				if got := e.Held(); got != 9 {
					t.Fatalf("held: got %d, want 9", got)
				}
				e.Receive(bd.build(seg{v6: v6, n: 1000, sport: 9, hash: hashOf(9)}).packet(w, layoutSplit), 9)
				if len(c.got) != 1 {
					t.Fatalf("delivered: got %d, want 1 (the evicted oldest)", len(c.got))
				}
				if got := sportOf(c.got[0]); got != 1 {
					t.Errorf("evicted flow: got port %d, want 1 (the oldest of the bucket)", got)
				}
				if got := e.Held(); got != 9 {
					t.Errorf("held: got %d, want 9", got)
				}
				m := statsMap(e.Stats())
				if m["rx_gro_flush_evict"] != 1 || m["rx_gro_held_max"] != 9 {
					t.Errorf("evict, held_max: got %d, %d, want 1, 9", m["rx_gro_flush_evict"], m["rx_gro_held_max"])
				}
				e.Flush()
			})
		}
	}
}

// TestBucketOf: a packet with an RSS hash is held in the bucket of the
// hash's low bits, one without a hash in bucket 0 whatever its Hash field
// says (dev_gro_receive: gro_hash[skb_get_hash_raw(skb) &
// (GRO_HASH_BUCKETS - 1)]), plain and VXLAN packets alike; and at a batch
// end flows leave bucket by bucket, 0 first, oldest first in each, as
// napi_gro_flush walks gro->hash.
func TestBucketOf(t *testing.T) {
	pool := testutil.NewPoisonPool(t)
	w := newWire(t, pool)
	defer w.close()
	c := &collect{}
	defer c.release()
	for _, vx := range []bool{false, true} {
		for _, tc := range []struct {
			hash uint32
			none bool // HashNone, with hash left in the Hash field
			want int
		}{
			{hash: 0x11, want: 1},
			{hash: 0x2f, want: 7},
			{hash: 0x1000, want: 0},
			{hash: 0x5a5a5a5a, want: 2},
			{none: true, want: 0},
			{hash: 0x7, none: true, want: 0},
		} {
			e := New(vxCfg, c)
			p := newBuilder().build(seg{vx: vx, n: 1000}).packet(w, layoutSplit)
			p.Hash, p.HashType = tc.hash, bufpool.HashL4
			if tc.none {
				p.HashType = bufpool.HashNone
			}
			e.Receive(p, 0)
			for bi := range e.buckets {
				want := 0
				if bi == tc.want {
					want = 1
				}
				if b := &e.buckets[bi]; b.n != want || want == 1 && b.ents[0].head != p {
					t.Errorf("vxlan %v, hash %#x none %v: bucket %d holds %d entries, want %d", vx, tc.hash, tc.none, bi, b.n, want)
				}
			}
			e.Flush()
		}
		// Flush order: flows come in bucket 6, 2, 4, none (0), 2 again.
		e := New(vxCfg, c)
		bd := newBuilder()
		c.release()
		for _, f := range []struct {
			sport uint16
			hash  uint32
		}{{1, 0x106}, {2, 0x202}, {3, 0x304}, {4, 0}, {5, 0x502}} {
			e.Receive(bd.build(seg{vx: vx, n: 1000, sport: f.sport, hash: f.hash}).packet(w, layoutSplit), 0)
		}
		e.EndBatch(0)
		var got []uint16
		for _, p := range c.got {
			got = append(got, sportOf(p))
		}
		if want := []uint16{4, 2, 5, 3, 1}; !slices.Equal(got, want) {
			t.Errorf("vxlan %v: flows left in the order %v, want %v (by bucket, oldest first)", vx, got, want)
		}
		c.release()
	}
}

// TestStatsNames pins the counter names and their order.
func TestStatsNames(t *testing.T) {
	var got []string
	var s Stats
	s.Each(func(name string, _ uint64) { got = append(got, name) })
	want := []string{
		"rx_gro_packets", "rx_gro_bytes", "rx_gro_skbs", "rx_gro_frag_list", "rx_gro_held_max",
		"rx_gro_segs_hist_1", "rx_gro_segs_hist_2_3", "rx_gro_segs_hist_4_7", "rx_gro_segs_hist_8_15",
		"rx_gro_segs_hist_16_31", "rx_gro_segs_hist_32_63", "rx_gro_segs_hist_64_plus",
		"rx_gro_flush_batch_end", "rx_gro_flush_timeout", "rx_gro_flush_full", "rx_gro_flush_flags",
		"rx_gro_flush_short", "rx_gro_flush_mismatch", "rx_gro_flush_evict", "rx_gro_passthrough",
		"rx_gro_csum_sw", "rx_gro_csum_bad",
		"rx_gro_tunnel_packets", "rx_gro_tunnel_bytes", "rx_gro_tunnel_skbs", "rx_gro_tunnel_passthrough",
	}
	if !slices.Equal(got, want) {
		t.Errorf("names:\ngot  %v\nwant %v", got, want)
	}
	if got := s.SegsAverage(); got != 0 {
		t.Errorf("SegsAverage with nothing merged: got %v, want 0", got)
	}
	s.Packets.Store(45)
	s.SKBs.Store(2)
	if got := s.SegsAverage(); got != 22.5 {
		t.Errorf("SegsAverage: got %v, want 22.5", got)
	}
}

// TestSegsBucket pins the histogram's bucket edges.
func TestSegsBucket(t *testing.T) {
	for _, tc := range []struct{ segs, want int }{
		{1, 0}, {2, 1}, {3, 1}, {4, 2}, {7, 2}, {8, 3}, {15, 3}, {16, 4}, {31, 4}, {32, 5}, {63, 5}, {64, 6}, {1000, 6},
	} {
		if got := segsBucket(tc.segs); got != tc.want {
			t.Errorf("segsBucket(%d): got %d, want %d", tc.segs, got, tc.want)
		}
	}
}

// TestBytesCounter checks rx_gro_bytes: the Ethernet header plus the merged
// IP length.
func TestBytesCounter(t *testing.T) {
	pool := testutil.NewPoisonPool(t)
	w := newWire(t, pool)
	r := &releaser{}
	e := New(Config{}, r)
	bd := newBuilder()
	for range 3 {
		e.Receive(bd.build(n(1000)).packet(w, layoutSplit), 0)
	}
	e.EndBatch(0)
	w.close()
	if got, want := e.Stats().Bytes.Load(), uint64(14+20+32+3000); got != want {
		t.Errorf("rx_gro_bytes: got %d, want %d", got, want)
	}
}

// TestStatsConcurrentRead reads the counters from another goroutine while
// the engine runs (meaningful under -race).
func TestStatsConcurrentRead(t *testing.T) {
	pool := testutil.NewPoisonPool(t)
	tm := newTemplates(t, pool, workload{"tcp4", layoutSplit, tcpWrites(false, 1)})
	defer tm.release()
	e := New(Config{}, &releaser{})
	done := make(chan struct{})
	read := make(chan uint64)
	go func() {
		var last uint64
		for {
			select {
			case <-done:
				read <- last
				return
			default:
				e.Stats().Each(func(name string, v uint64) {
					if name == "rx_gro_packets" {
						last = v
					}
				})
			}
		}
	}()
	for range 20 {
		for i := range tm.pkts {
			e.Receive(tm.clone(i), 0)
		}
		e.EndBatch(0)
	}
	close(done)
	<-read
	if got, want := e.Stats().Packets.Load(), uint64(20*45); got != want {
		t.Errorf("rx_gro_packets: got %d, want %d", got, want)
	}
}

// TestMaxSKBFrags: skb_gro_receive moves a segment's frags onto the last
// packet of the chain (NAPI_GRO_CB(p)->last) while it holds at most
// MAX_SKB_FRAGS (17); past them the segment goes on the frag_list with its
// own frag, and the next segments' frags go onto it.
func TestMaxSKBFrags(t *testing.T) {
	pool := newPool(t)
	w := newWire(t, pool)
	defer w.close()
	c := &collect{}
	defer c.release()
	e := New(Config{}, c)
	bd := newBuilder()
	var ins []built
	for range 40 {
		// 62-byte payloads on 64-byte strides: one frag each, never
		// adjacent to the last.
		b := bd.build(n(62))
		ins = append(ins, b)
		e.Receive(b.packet(w, layoutSplit), 0)
	}
	e.EndBatch(0)
	if len(c.got) != 1 {
		t.Fatalf("packets: got %d, want 1", len(c.got))
	}
	var frags []int
	for q := c.got[0]; q != nil; q = q.Next {
		frags = append(frags, len(q.Frags))
	}
	if want := []int{maxSKBFrags, maxSKBFrags, 40 - 2*maxSKBFrags}; !slices.Equal(frags, want) {
		t.Errorf("frags per packet of the chain: got %v, want %v", frags, want)
	}
	if err := checkMerged(c.got[0], ins); err != nil {
		t.Error(err)
	}
}
