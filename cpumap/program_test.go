package cpumap

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/rss"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

func TestActionString(t *testing.T) {
	for _, tc := range []struct {
		a    Action
		want string
	}{
		{Pass, "pass"}, {Drop, "drop"}, {TX, "tx"}, {Redirect, "redirect"}, {RedirectXSK, "redirect-xsk"},
		{Action(9), "action(9)"},
	} {
		if got := tc.a.String(); got != tc.want {
			t.Errorf("Action(%d).String() = %q, want %q", tc.a, got, tc.want)
		}
	}
}

func TestParseProgram(t *testing.T) {
	tcp := frameSpec{}.frame()
	for _, tc := range []struct {
		name       string
		ncpu       int
		wantErr    string // a substring of the error; "" for none
		wantString string
		wantAction Action // on an IPv4 TCP frame to port 80
		wantEntry  int
	}{
		{name: "pass", wantString: "pass", wantAction: Pass},
		{name: "drop", ncpu: 2, wantString: "drop", wantAction: Drop},
		{name: "cpu:0", ncpu: 1, wantString: "cpu:0", wantAction: Redirect},
		{name: "cpu:3", ncpu: 4, wantString: "cpu:3", wantAction: Redirect, wantEntry: 3},
		{name: "cpu:4", ncpu: 4, wantErr: "entry out of range"},
		{name: "cpu:0", ncpu: 0, wantErr: "entry out of range"},
		{name: "cpu:-1", ncpu: 4, wantErr: "entry out of range"},
		{name: "cpu:+1", ncpu: 4, wantErr: "entry out of range"},
		{name: "cpu:", ncpu: 4, wantErr: "entry out of range"},
		{name: "cpu:99999999999999999999", ncpu: 4, wantErr: "entry out of range"},
		{name: "hash", ncpu: 1, wantString: "hash", wantAction: Redirect},
		{name: "hash", ncpu: 0, wantErr: "needs 1 to 128 cpumap entries, have 0"},
		{name: "hash", ncpu: 129, wantErr: "needs 1 to 128"},
		{name: "drop-port:80", wantString: "drop-port:80", wantAction: Drop},
		{name: "drop-port:81", wantString: "drop-port:81", wantAction: Pass},
		{name: "drop-port:0", wantString: "drop-port:0", wantAction: Pass},
		{name: "drop-port:65535", wantString: "drop-port:65535", wantAction: Pass},
		{name: "drop-port:65536", wantErr: "port out of range"},
		{name: "drop-port:-1", wantErr: "port out of range"},
		{name: "drop-port:http", wantErr: "port out of range"},
		{name: "xsk:80", wantString: "xsk:80", wantAction: RedirectXSK},
		{name: "xsk:81", ncpu: 2, wantString: "xsk:81", wantAction: Pass},
		{name: "xsk:65535", wantString: "xsk:65535", wantAction: Pass},
		{name: "xsk:65536", wantErr: "port out of range"},
		{name: "xsk:", wantErr: "port out of range"},
		{name: "xsk", wantErr: "unknown program"},
		{name: "", wantErr: "unknown program"},
		{name: "Pass", wantErr: "unknown program"},
		{name: "cpu", ncpu: 2, wantErr: "unknown program"},
		{name: "redirect", ncpu: 2, wantErr: "want pass, drop, cpu:N (0 <= N < 2), hash, drop-port:P or xsk:P (0 <= P <= 65535)"},
	} {
		t.Run(fmt.Sprintf("%s/ncpu=%d", tc.name, tc.ncpu), func(t *testing.T) {
			prog, err := ParseProgram(tc.name, tc.ncpu)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), "want pass, drop, cpu:N") {
					t.Errorf("got error %q, want it to name the valid forms", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if got := fmt.Sprint(prog); got != tc.wantString {
				t.Errorf("got String() %q, want %q", got, tc.wantString)
			}
			a, e := run(prog, tcp)
			if a != tc.wantAction || (a == Redirect && e != tc.wantEntry) {
				t.Errorf("got %v %d, want %v %d", a, e, tc.wantAction, tc.wantEntry)
			}
		})
	}
}

// TestToeplitzRSSVectors pins the hash program's input layout to the RSS
// specification's results (internal/rss pins the tables themselves).
func TestToeplitzRSSVectors(t *testing.T) {
	tab := rss.Default()
	h := newHashProgram(4)
	for _, v := range rss.SpecVectors {
		t.Run(v.Src, func(t *testing.T) {
			src, dst := netip.MustParseAddr(v.Src), netip.MustParseAddr(v.Dst)
			in := append(src.AsSlice(), dst.AsSlice()...)
			if got := tab.Bytes(0, in); got != v.Addrs {
				t.Errorf("addresses: got %#08x, want %#08x", got, v.Addrs)
			}
			in = binary.BigEndian.AppendUint16(in, v.SPort)
			in = binary.BigEndian.AppendUint16(in, v.DPort)
			if got := tab.Bytes(0, in); got != v.TCP {
				t.Errorf("addresses and ports: got %#08x, want %#08x", got, v.TCP)
			}

			// The program's hash of a real frame: RSS's, XORed with
			// the protocol's byte after the ports; addresses only
			// for a fragment.
			s := frameSpec{v6: src.Is6(), src: src, dst: dst, sport: v.SPort, dport: v.DPort}
			if got, want := hashOf(t, h, s.frame()), v.TCP^tab.Byte(len(in), protoTCP); got != want {
				t.Errorf("TCP frame: got %#08x, want %#08x", got, want)
			}
			s.udp = true
			if got, want := hashOf(t, h, s.frame()), v.TCP^tab.Byte(len(in), protoUDP); got != want {
				t.Errorf("UDP frame: got %#08x, want %#08x", got, want)
			}
			s.frag = fragFirst
			if got := hashOf(t, h, s.frame()); got != v.Addrs {
				t.Errorf("first fragment: got %#08x, want %#08x", got, v.Addrs)
			}
		})
	}
}

func hashOf(t *testing.T, h *hashProgram, frame []byte) uint32 {
	t.Helper()
	var f flow
	if !parseFlow(frame, &f) {
		t.Fatalf("parseFlow failed on %x", frame)
	}
	return h.hash(frame, &f)
}

func TestHashSpreadsFlows(t *testing.T) {
	for _, tc := range []struct {
		name    string
		v6, udp bool
	}{
		{"tcp4", false, false}, {"udp4", false, true}, {"tcp6", true, false}, {"udp6", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const ncpu = 4
			prog := mustProgram(t, "hash", ncpu)
			entry := func(s frameSpec) int {
				t.Helper()
				a, e := run(prog, s.frame())
				if a != Redirect || e < 0 || e >= ncpu {
					t.Fatalf("got %v %d, want redirect to 0..%d", a, e, ncpu-1)
				}
				return e
			}
			base := frameSpec{v6: tc.v6, udp: tc.udp}

			// One flow stays on one entry whatever its payload,
			// and a second flow of the same hosts lands elsewhere
			// (some port among the next 32 must).
			a := entry(base)
			for n := range 20 {
				s := base
				s.n = n * 97
				if got := entry(s); got != a {
					t.Fatalf("flow with %d payload bytes: got entry %d, want %d (one flow, one entry)", s.n, got, a)
				}
			}
			other := -1
			for p := uint16(1001); p < 1033 && other < 0; p++ {
				s := base
				s.sport = p
				if e := entry(s); e != a {
					other = e
					if again := entry(s); again != e {
						t.Fatalf("sport %d: got entry %d then %d, want the same", p, e, again)
					}
				}
			}
			if other < 0 {
				t.Fatalf("got every source port 1001..1032 on entry %d, want the flows spread", a)
			}

			// Like RSS, many flows spread evenly.
			rng := rand.New(rand.NewPCG(1, 2))
			var counts [ncpu]int
			const flows = 4096
			for range flows {
				s := base
				s.sport, s.dport = uint16(rng.IntN(65536)), uint16(rng.IntN(65536))
				counts[entry(s)]++
			}
			for i, c := range counts {
				if c < flows/ncpu*8/10 || c > flows/ncpu*12/10 {
					t.Errorf("entry %d got %d of %d flows, want %d +- 20%%", i, c, flows, flows/ncpu)
				}
			}
		})
	}
}

func TestHashCases(t *testing.T) {
	h := newHashProgram(8)
	for _, tc := range []struct {
		name string
		a, b frameSpec
		same bool // whether a and b must hash alike
	}{
		{"v4 ports differ", frameSpec{}, frameSpec{sport: 1001}, false},
		{"v4 tcp vs udp", frameSpec{}, frameSpec{udp: true}, false},
		{"v6 tcp vs udp", frameSpec{v6: true}, frameSpec{v6: true, udp: true}, false},
		{"v4 fragments of a datagram", frameSpec{udp: true, frag: fragFirst}, frameSpec{udp: true, frag: fragLater}, true},
		{"v6 fragments of a datagram", frameSpec{v6: true, udp: true, frag: fragFirst}, frameSpec{v6: true, udp: true, frag: fragLater}, true},
		{"v4 fragments ignore ports", frameSpec{frag: fragFirst}, frameSpec{frag: fragFirst, sport: 7, dport: 9}, true},
		{"v4 fragment vs whole", frameSpec{frag: fragFirst}, frameSpec{}, false},
		{"v4 VLAN tags skipped", frameSpec{}, frameSpec{vlans: 2}, true},
		{"v6 VLAN tag skipped", frameSpec{v6: true}, frameSpec{v6: true, vlans: 1}, true},
		{"v4 options skipped", frameSpec{}, frameSpec{ipOpts: true}, true},
		{"v6 hop-by-hop skipped", frameSpec{v6: true, udp: true}, frameSpec{v6: true, udp: true, ipOpts: true}, true},
		{"v4 icmp hashes addresses and protocol", frameSpec{icmp: true}, frameSpec{icmp: true, frag: fragFirst}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ha, hb := hashOf(t, h, tc.a.frame()), hashOf(t, h, tc.b.frame())
			if (ha == hb) != tc.same {
				t.Errorf("got hashes %#08x and %#08x, want same=%v", ha, hb, tc.same)
			}
		})
	}
}

func TestHashNonIP(t *testing.T) {
	prog := mustProgram(t, "hash", 4)
	tcp := frameSpec{}.frame()
	tcp6 := frameSpec{v6: true}.frame()
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"arp", frameSpec{arp: true}.frame()},
		{"empty", nil},
		{"ethernet only", tcp[:14]},
		{"short ipv4", tcp[:14+19]},
		{"short ipv6", tcp6[:14+39]},
		{"vlan, no type", frameSpec{vlans: 1}.frame()[:16]},
		{"ipv4 version 6", func() []byte { b := append([]byte(nil), tcp...); b[14] = 0x65; return b }()},
		{"ipv4 ihl 4", func() []byte { b := append([]byte(nil), tcp...); b[14] = 0x44; return b }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if a, e := run(prog, tc.frame); a != Redirect || e != 0 {
				t.Errorf("got %v %d, want redirect 0", a, e)
			}
		})
	}
}

// TestPortPrograms checks which frames drop-port:80 drops and xsk:80
// redirects to the AF_XDP socket: TCP and UDP to port 80, over IPv4 and
// IPv6, whatever comes before the ports; everything else passes.
func TestPortPrograms(t *testing.T) {
	for _, p := range []struct {
		name string
		hit  Action
	}{{"drop-port:80", Drop}, {"xsk:80", RedirectXSK}} {
		t.Run(p.name, func(t *testing.T) { testPortProgram(t, mustProgram(t, p.name, 0), p.hit) })
	}
}

// testPortProgram checks a port-matching program that returns hit for the
// frames to port 80 (Drop in the table) and Pass for the others.
func testPortProgram(t *testing.T, prog Program, hit Action) {
	v4 := frameSpec{}.frame()
	for _, tc := range []struct {
		name  string
		frame []byte
		want  Action
	}{
		{"tcp4 to 80", frameSpec{}.frame(), Drop},
		{"tcp4 to 81", frameSpec{dport: 81}.frame(), Pass},
		{"tcp4 from 80", frameSpec{sport: 80, dport: 1000}.frame(), Pass},
		{"udp4 to 80", frameSpec{udp: true}.frame(), Drop},
		{"tcp6 to 80", frameSpec{v6: true}.frame(), Drop},
		{"udp6 to 80", frameSpec{v6: true, udp: true}.frame(), Drop},
		{"udp6 to 80 after hop-by-hop", frameSpec{v6: true, udp: true, ipOpts: true}.frame(), Drop},
		{"tcp4 with options to 80", frameSpec{ipOpts: true}.frame(), Drop},
		{"tcp4 to 80 in VLANs", frameSpec{vlans: 2}.frame(), Drop},
		{"udp4 first fragment to 80", frameSpec{udp: true, frag: fragFirst}.frame(), Drop},
		{"udp6 first fragment to 80", frameSpec{v6: true, udp: true, frag: fragFirst}.frame(), Drop},
		{"udp4 later fragment", frameSpec{udp: true, frag: fragLater, n: 64}.frame(), Pass},
		{"udp6 later fragment", frameSpec{v6: true, udp: true, frag: fragLater, n: 64}.frame(), Pass},
		{"icmp4", frameSpec{icmp: true}.frame(), Pass},
		{"arp", frameSpec{arp: true}.frame(), Pass},
		{"ports cut off", v4[:len(v4)-header20+2], Pass},
		{"ports just in", v4[:len(v4)-header20+4], Drop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want == Drop {
				want = hit
			}
			if got, e := run(prog, tc.frame); got != want || e != 0 {
				t.Errorf("got %v %d, want %v 0", got, e, want)
			}
		})
	}
}

// header20 is the TCP header length of frameSpec's frames.
const header20 = 20

func TestProgramsNoAllocs(t *testing.T) {
	frames := [][]byte{
		frameSpec{}.frame(), frameSpec{v6: true, udp: true, ipOpts: true}.frame(),
		frameSpec{frag: fragLater}.frame(), frameSpec{arp: true}.frame(),
	}
	for _, name := range []string{"pass", "drop", "cpu:1", "hash", "drop-port:80", "xsk:80"} {
		prog := mustProgram(t, name, 2)
		ps := make([]*bufpool.Packet, len(frames))
		for i, f := range frames {
			ps[i] = packetOf(f)
		}
		allocs := testing.AllocsPerRun(100, func() {
			for _, p := range ps {
				prog.Run(p.Linear)
			}
		})
		for _, p := range ps {
			p.Release()
		}
		if allocs != 0 {
			t.Errorf("%s: got %v allocs per run, want 0", name, allocs)
		}
	}
}

// TestProgramsL3: each built-in program for a TUN's frames
// (ParseProgramLink with l3: the IP header first) gives an IP packet the
// verdict the Ethernet program gives the same packet in an Ethernet frame.
func TestProgramsL3(t *testing.T) {
	specs := []frameSpec{
		{}, {udp: true, dport: 53}, {v6: true}, {v6: true, udp: true, sport: 7, dport: 80},
		{frag: fragFirst}, {frag: fragLater}, {v6: true, frag: fragLater}, {ipOpts: true}, {icmp: true},
	}
	for _, name := range []string{"pass", "drop", "cpu:1", "hash", "drop-port:80", "xsk:53"} {
		eth, l3 := mustProgram(t, name, 4), mustProgramLink(t, name, 4)
		for i, s := range specs {
			f := s.frame()
			ae, ee := eth.Run(f)
			a3, e3 := l3.Run(f[header.EthernetMinimumSize:])
			if ae != a3 || ee != e3 {
				t.Errorf("%s, frame %d: Ethernet %v %d, L3 %v %d", name, i, ae, ee, a3, e3)
			}
		}
	}
}

func mustProgramLink(t testing.TB, name string, ncpu int) Program {
	t.Helper()
	prog, err := ParseProgramLink(name, ncpu, true)
	if err != nil {
		t.Fatal(err)
	}
	return prog
}
