package main

import (
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/driver/xsk"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
	"github.com/ustack/ustack/stack/stacktest"
)

// TestCountersDocumented checks that docs/counters.md explains every
// counter ustack emits: the stack's with every optional part on (GRO, zero
// copy, XDP with an XSK socket, cpumap, the tunnel) and the servers'. A name
// is documented when the document has it in backquotes, or a backquoted
// prefix ending in * (rx_drop_*) covers it. gVisor's own counters (ip_*,
// tcp_*, udp_* ...) are covered by their families' row.
func TestCountersDocumented(t *testing.T) {
	doc := countersDoc(t)
	names, prefixes := map[string]bool{}, []string{}
	for _, m := range regexp.MustCompile("`([a-z0-9_*<>]+)`").FindAllStringSubmatch(doc, -1) {
		if n, ok := strings.CutSuffix(m[1], "*"); ok {
			prefixes = append(prefixes, n)
		} else {
			names[m[1]] = true
		}
	}
	got := emittedCounters(t, false)
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

// TestCounterKindsDocumented ties docs/counters.md's kinds to the code's
// (stack.KindOf): every counter the full configuration emits, on two queues
// (so each queue's too), is a gauge if and only if the document's gauge
// list names it or it ends in _current, a max if and only if the max list
// names it, else a counter; every name those lists give is emitted; and a
// table row whose meaning says "gauge" holds gauges only.
func TestCounterKindsDocumented(t *testing.T) {
	doc := countersDoc(t)
	name := regexp.MustCompile("`([a-z0-9_]+)`")
	listed := map[stack.CounterKind]map[string]bool{stack.KindGauge: {}, stack.KindMax: {}}
	var kind stack.CounterKind // of the list item being read; KindCounter: none
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(line, "- **gauge**"):
			kind = stack.KindGauge
		case strings.HasPrefix(line, "- **max**"):
			kind = stack.KindMax
		case !strings.HasPrefix(line, "  "):
			kind = stack.KindCounter
		}
		if kind == stack.KindCounter {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(line, -1) {
			if !strings.HasPrefix(m[1], "_") { // `_current`, the suffix rule
				listed[kind][m[1]] = true
			}
		}
	}
	if len(listed[stack.KindGauge]) == 0 || len(listed[stack.KindMax]) == 0 {
		t.Fatalf("docs/counters.md: no gauge or no max list item found (%v)", listed)
	}
	docKind := func(n string) stack.CounterKind {
		if b, _, ok := stack.SplitQueueCounter(n); ok {
			n = b
		}
		switch {
		case listed[stack.KindMax][n]:
			return stack.KindMax
		case listed[stack.KindGauge][n] || strings.HasSuffix(n, "_current"):
			return stack.KindGauge
		}
		return stack.KindCounter
	}
	got := emittedCounters(t, true)
	for _, q := range []string{"rx1_packets", "rx1_pp_alloc_order", "rx1_gro_held_max"} {
		if _, ok := got[q]; !ok {
			t.Errorf("no %s emitted: the test's configuration misses the second queue", q)
		}
	}
	for n := range got {
		if d, c := docKind(n), stack.KindOf(n); d != c {
			t.Errorf("%s: docs/counters.md says %v, stack.KindOf %v", n, d, c)
		}
	}
	for k, names := range listed {
		for n := range names {
			if _, ok := got[n]; !ok {
				t.Errorf("docs/counters.md lists %s as a %v, but no such counter is emitted", n, k)
			}
		}
	}
	for _, line := range strings.Split(doc, "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) < 2 || !strings.HasPrefix(line, "| `") || !regexp.MustCompile(`\bgauge\b`).MatchString(cells[1]) {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(cells[0], -1) {
			if k := stack.KindOf(m[1]); k != stack.KindGauge {
				t.Errorf("docs/counters.md's row of %s says gauge, stack.KindOf says %v", m[1], k)
			}
		}
	}
}

func countersDoc(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/counters.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

// emittedCounters returns the counters of a stack with every optional part
// on (GRO, zero copy, XDP with an XSK socket, cpumap, the tunnel; with
// queues, a second, idle queue) and the servers'.
func emittedCounters(t *testing.T, queues bool) map[string]uint64 {
	t.Helper()
	prog, err := cpumap.ParseProgram("xsk:9", 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := stack.Config{
		Addrs:    []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")},
		ZeroCopy: true,
		XDP:      prog,
		CPUMap:   []int{0},
		Tunnel: &stack.TunnelConfig{
			Local:  netip.MustParseAddr("2001:db8:1::1"),
			Remote: netip.MustParseAddr("2001:db8:1::2"),
			Addrs:  []netip.Prefix{netip.MustParsePrefix("198.51.100.1/24")},
		},
	}
	if queues {
		q, qp := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535+18)
		t.Cleanup(func() { qp.Close() })
		cfg.Queues = []driver.Wire{q}
	}
	rx, _ := stacktest.NewPair(t, cfg, stack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
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
	return got
}

// discardWire is an xsk.Wire that discards what the socket sends.
type discardWire struct{}

func (discardWire) Write([]byte) error { return nil }
