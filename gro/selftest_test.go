package gro

import (
	"slices"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// The cases of the kernel's GRO selftest (tools/testing/selftests/net/gro.c,
// run by gro.sh over setup_veth.sh) and of its UDP GRO selftests
// (udpgro.sh with udpgso_bench_tx), each with the payload lengths, in order,
// that Linux 6.18 hands up: gro.c's correct_payload. Frames go in as a veth
// hands them to the kernel's GRO: checksums not verified.

// selftestCase is one of them: frames of one flow, and the payload lengths
// of the packets that come up.
type selftestCase struct {
	name string
	v4   bool // IPv4 only
	v6   bool // IPv6 only
	segs []seg
	want []int
}

// gro.c's constants.
const (
	stPayload = 100 // PAYLOAD_LEN
	// stMSS is gro.c's MSS for the "large" case: 4096 less the TCP and
	// IPv6 headers.
	stMSS = 4096 - header.TCPMinimumSize - header.IPv6MinimumSize
	// stMaxPayload is MAX_PAYLOAD: IP_MAXPACKET less the same headers.
	stMaxPayload = 65535 - header.TCPMinimumSize - header.IPv6MinimumSize
	stLargePkts  = stMaxPayload / stMSS // NUM_LARGE_PKT
)

// stSeg is gro.c's create_packet: PAYLOAD_LEN bytes, no TCP options, ACK
// set, DF set, a fixed IPv4 ID of 0 (fill_networklayer leaves it 0),
// TTL or hop limit 8.
func stSeg(n int) seg { return seg{n: n, noOpts: true, ttl: 8, setID: true} }

func stFlags(n int, f header.TCPFlags) seg { s := stSeg(n); s.flags = f; return s }

func selftestCases() []selftestCase {
	p := stPayload
	mod := func(s seg, f func(*seg)) seg { f(&s); return s }
	ts := func(tsval uint32, order int) seg {
		// add_standard_tcp_options: NOP, NOP, TS in some order; the
		// engine compares options as bytes, so another order is another
		// option block, as another value is.
		s := stSeg(p)
		s.noOpts, s.tsval = false, tsval+uint32(order)*1000
		return s
	}
	flagCase := func(name string, f header.TCPFlags, want []int) selftestCase {
		// send_flags: the flagged packets are the (NUM_PACKETS / 2) and,
		// for CWR, (NUM_PACKETS / 2 - 1)th of five; PSH and CWR carry
		// payload, the others none.
		n := 0
		if f == header.TCPFlagPsh || f == header.TCPFlagCwr {
			n = p
		}
		segs := []seg{stSeg(p), stSeg(p), stFlags(n, f), stSeg(p), stSeg(p)}
		if f == header.TCPFlagCwr {
			segs[1] = stFlags(n, f)
		}
		return selftestCase{name: name, segs: segs, want: want}
	}
	idCase := func(name string, df bool, ids []uint16, want []int) selftestCase {
		// send_flush_id_case.
		var segs []seg
		for _, id := range ids {
			segs = append(segs, mod(stSeg(p), func(s *seg) { s.id, s.noDF = id, !df }))
		}
		return selftestCase{name: name, v4: true, segs: segs, want: want}
	}
	large := func(v6 bool, extra int) selftestCase {
		// send_large: NUM_LARGE_PKT segments of MSS, one of remainder
		// (+extra), and one more after a gap. The IPv4 header is 20
		// bytes shorter: 20 more bytes fit (gro.c's offset).
		off := 20
		if v6 {
			off = 0
		}
		rem := (stMaxPayload + off) % stMSS
		last := rem + extra
		var segs []seg
		for range stLargePkts {
			segs = append(segs, stSeg(stMSS))
		}
		segs = append(segs, stSeg(last), mod(stSeg(last), func(s *seg) { s.seqOff = int32(stMSS - last) }))
		want := []int{stMaxPayload + off, rem}
		if extra > 0 {
			want = []int{stLargePkts * stMSS, last, last}
		}
		return selftestCase{name: "large: Shouldn't coalesce if exceed IP max pkt size", segs: segs, want: want, v4: !v6, v6: v6}
	}
	return []selftestCase{
		{name: "data: pure data packet of same size", segs: []seg{stSeg(p), stSeg(p)}, want: []int{2 * p}},
		{name: "data: large data packets followed by a smaller one", segs: []seg{stSeg(p), stSeg(p / 2)}, want: []int{p * 3 / 2}},
		{name: "data: small data packets followed by a larger one", segs: []seg{stSeg(p / 2), stSeg(p)}, want: []int{p / 2, p}},
		{name: "ack: duplicate ack and pure ack", segs: []seg{stSeg(0), stSeg(0), mod(stSeg(0), func(s *seg) { s.ackOff = 1 })}, want: []int{0, 0, 0}},
		flagCase("flags: psh flag ends coalescing", header.TCPFlagPsh, []int{3 * p, 2 * p}),
		flagCase("flags: syn flag ends coalescing", header.TCPFlagSyn, []int{2 * p, 0, 2 * p}),
		flagCase("flags: rst flag ends coalescing", header.TCPFlagRst, []int{2 * p, 0, 2 * p}),
		flagCase("flags: urg flag ends coalescing", header.TCPFlagUrg, []int{2 * p, 0, 2 * p}),
		// gro.c (in trees with AccECN's GRO change) expects {100, 200,
		// 200}: two CWR segments merging. Linux 6.18's tcp_gro_receive
		// still has "flush = flags & TCP_FLAG_CWR", and the kernel this
		// models hands up {100, 100, 100, 200} (TestKernelDiff).
		flagCase("flags: cwr flag ends coalescing", header.TCPFlagCwr, []int{p, p, p, 2 * p}),
		{name: "tcp: changed checksum does not coalesce", segs: []seg{stSeg(p), mod(stSeg(p), func(s *seg) { s.badL4 = true })}, want: []int{p, p}},
		{name: "tcp: Wrong Seq number doesn't coalesce", segs: []seg{stSeg(p), mod(stSeg(p), func(s *seg) { s.seqOff = 1 })}, want: []int{p, p}},
		{name: "tcp: Different timestamp doesn't coalesce", segs: []seg{ts(0, 0), ts(0, 0), ts(100, 0), ts(100, 1), ts(100, 2)}, want: []int{2 * p, p, p, p}},
		{name: "tcp: Different options doesn't coalesce", segs: []seg{ts(0, 0), ts(0, 0), stSeg(p)}, want: []int{2 * p, p}},
		{name: "ip: different ECN doesn't coalesce", segs: []seg{stSeg(p), mod(stSeg(p), func(s *seg) { s.tos = 0x2 })}, want: []int{p, p}},
		{name: "ip: different tos doesn't coalesce", v4: true, segs: []seg{stSeg(p), mod(stSeg(p), func(s *seg) { s.tos = 1 })}, want: []int{p, p}},
		{name: "ip: different tos (priority) doesn't coalesce", v6: true, segs: []seg{stSeg(p), mod(stSeg(p), func(s *seg) { s.tos = 0xf0 })}, want: []int{p, p}},
		{name: "ip: different ttl doesn't coalesce", v4: true, segs: []seg{stSeg(p), mod(stSeg(p), func(s *seg) { s.ttl = 7 })}, want: []int{p, p}},
		{name: "ip: ip options doesn't coalesce", v4: true, segs: []seg{stSeg(p), mod(stSeg(p), func(s *seg) { s.ipOpts = true }), stSeg(p)}, want: []int{p, p, p}},
		{name: "ip: fragmented ip4 doesn't coalesce", v4: true, segs: []seg{stSeg(p), mod(stSeg(p), func(s *seg) { s.frag = true })}, want: []int{p, p}},
		idCase("ip: DF=1, Incrementing - should coalesce", true, []uint16{8, 9}, []int{2 * p}),
		idCase("ip: DF=1, Fixed - should coalesce", true, []uint16{8, 8}, []int{2 * p}),
		idCase("ip: DF=0, Incrementing - should coalesce", false, []uint16{8, 9}, []int{2 * p}),
		idCase("ip: DF=0, Fixed - should coalesce", false, []uint16{8, 8}, []int{2 * p}),
		idCase("ip: DF=1, 2 Incrementing and one fixed - should coalesce only first 2 packets", true, []uint16{8, 9, 9}, []int{2 * p, p}),
		idCase("ip: DF=1, 2 Fixed and one incrementing - should coalesce only first 2 packets", true, []uint16{8, 8, 9}, []int{2 * p, p}),
		// send_fragment6: the fragment goes up at once, ahead of the
		// two held ones; the fourth segment does not follow the held
		// ones.
		{name: "ip: fragmented ip6 doesn't coalesce", v6: true, segs: []seg{stSeg(p), stSeg(p), mod(stSeg(p), func(s *seg) { s.frag = true }), stSeg(p)}, want: []int{p, 2 * p, p}},
		{name: "ip: ipv6 with ext header does coalesce", v6: true, segs: []seg{mod(stSeg(p), func(s *seg) { s.dst6 = 1 }), mod(stSeg(p), func(s *seg) { s.dst6 = 1 })}, want: []int{2 * p}},
		{name: "ip: ipv6 with ext header with different payloads doesn't coalesce", v6: true, segs: []seg{mod(stSeg(p), func(s *seg) { s.dst6 = 1 }), mod(stSeg(p), func(s *seg) { s.dst6 = 2 })}, want: []int{p, p}},
		large(false, 0), large(false, 1), large(true, 0), large(true, 1),
	}
}

// udpgroCases are udpgro.sh's: udpgso_bench_tx sends datagrams of one
// segment size (1452 by default, -S for another), the receiver's GRO
// (UDP_GRO or rx-udp-gro-forwarding) coalesces them into packets of up to
// UDP_GRO_CNT_MAX segments and 64 KB; a shorter datagram ends a packet, a
// longer one starts the next.
func udpgroCases() []selftestCase {
	u := func(n int) seg { return seg{udp: true, n: n, setID: true, id: 1} }
	rep := func(c int, s seg) []seg { return slices.Repeat([]seg{s}, c) }
	// 45 datagrams of 1452 fit the 64 KB IP length (20 + 8 + 45 * 1452 =
	// 65368; 40 + 8 + 45 * 1452 = 65388), a 46th does not.
	return []selftestCase{
		{name: "udpgro: GRO", segs: rep(50, u(1452)), want: []int{45 * 1452, 5 * 1452}},
		{name: "udpgro: GRO with custom segment size", segs: rep(70, u(500)), want: []int{64 * 500, 6 * 500}},
		{name: "udpgro: GRO with custom segment size, short tail", segs: append(rep(3, u(500)), u(300), u(500)), want: []int{1800, 500}},
		{name: "udpgro: a longer datagram starts a packet", segs: []seg{u(500), u(500), u(600), u(600)}, want: []int{1000, 1200}},
		{name: "udpgro: small datagrams end at UDP_GRO_CNT_MAX", segs: rep(130, u(10)), want: []int{640, 640, 20}},
	}
}

// TestKernelSelftest runs gro.c's and udpgro.sh's cases, IPv4 and IPv6,
// through the engine.
func TestKernelSelftest(t *testing.T) {
	all := append(selftestCases(), udpgroCases()...)
	for _, v6 := range []bool{false, true} {
		fam := "ipv4"
		if v6 {
			fam = "ipv6"
		}
		t.Run(fam, func(t *testing.T) {
			for _, tc := range all {
				if tc.v4 && v6 || tc.v6 && !v6 {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					pool := newPool(t)
					w := newWire(t, pool)
					defer w.close()
					bd := newBuilder()
					var frames []built
					for _, s := range tc.segs {
						s.v6 = v6
						frames = append(frames, bd.build(s))
					}
					got := engineLensAll(w, frames)
					if !slices.Equal(got, tc.want) {
						t.Errorf("payloads: got %v, want %v", got, tc.want)
					}
				})
			}
		})
	}
}
