package main

import (
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver/xsk"
	"github.com/ustack/ustack/internal/stacktest"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
)

// TestCountersDocumented checks that docs/counters.md explains every
// counter ustack emits: the stack's with every optional part on (GRO, zero
// copy, XDP with an XSK socket, cpumap, the tunnel) and the servers'. A name
// is documented when the document has it in backquotes, or a backquoted
// prefix ending in * (rx_drop_*) covers it. gVisor's own counters (ip_*,
// tcp_*, udp_* ...) are covered by their families' row.
func TestCountersDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/counters.md")
	if err != nil {
		t.Fatal(err)
	}
	names, prefixes := map[string]bool{}, []string{}
	for _, m := range regexp.MustCompile("`([a-z0-9_*<>]+)`").FindAllStringSubmatch(string(doc), -1) {
		if n, ok := strings.CutSuffix(m[1], "*"); ok {
			prefixes = append(prefixes, n)
		} else {
			names[m[1]] = true
		}
	}
	prog, err := cpumap.ParseProgram("xsk:9", 1)
	if err != nil {
		t.Fatal(err)
	}
	rx, _ := stacktest.NewPair(t, stack.Config{
		Addrs:    []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")},
		ZeroCopy: true,
		XDP:      prog,
		CPUMap:   []int{0},
		Tunnel: &stack.TunnelConfig{
			Local:  netip.MustParseAddr("2001:db8:1::1"),
			Remote: netip.MustParseAddr("2001:db8:1::2"),
			Addrs:  []netip.Prefix{netip.MustParsePrefix("198.51.100.1/24")},
		},
	}, stack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
	sock, err := xsk.New(xsk.Config{NumFrames: 8, FrameSize: 2048, FillSize: 8, RxSize: 8}, discardWire{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rx.BindXSK(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rx.BindXSK(nil) })
	var st serve.Stats
	got := stacktest.Counters(rx.EachCounter, st.EachCounter)
	for _, fam := range []string{"rx_xdp_", "rx_xsk_", "tx_xsk_", "cpumap_", "tunnel_", "zc_", "rx_gro_", "server_", "iperf3_", "sockperf_"} {
		found := false
		for n := range got {
			found = found || strings.HasPrefix(n, fam)
		}
		if !found {
			t.Errorf("no %s* counter emitted: the test's configuration misses a part", fam)
		}
	}
	var missing []string
	for n := range got {
		if names[n] {
			continue
		}
		covered := false
		for _, p := range prefixes {
			covered = covered || strings.HasPrefix(n, p)
		}
		if !covered {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("counters emitted but not in docs/counters.md: %s", strings.Join(missing, ", "))
	}
}

// discardWire is an xsk.Wire that discards what the socket sends.
type discardWire struct{}

func (discardWire) Write([]byte) error { return nil }
