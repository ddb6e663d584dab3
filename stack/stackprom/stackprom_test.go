package stackprom

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack/stacktest"
)

func TestCollector(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	// Three datagrams from the peer; a connection refused by a closed
	// port resolves the neighbours first (gVisor queues only a few
	// packets while it waits for ARP).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := peer.DialTCP(ctx, netip.MustParseAddrPort("192.0.2.1:1")); err == nil {
		c.Close()
	}
	pu, err := peer.ListenUDP(netip.MustParseAddrPort("192.0.2.2:5555"))
	if err != nil {
		t.Fatal(err)
	}
	defer pu.Close()
	for range 3 {
		if _, err := pu.WriteTo(make([]byte, 100), net.UDPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.1:9"))); err != nil {
			t.Fatal(err)
		}
	}
	// The burst is sent; wait until the receiver has polled it.
	for deadline := time.Now().Add(5 * time.Second); stacktest.Counters(rx.EachCounter)["rx_packets"] < 3 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(NewCollector(rx)); err != nil {
		t.Fatal(err)
	}
	n, err := testutil.GatherAndCount(reg)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(rx.Counters()); n != want {
		t.Errorf("metrics: got %d, want one per counter (%d)", n, want)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "ustack_rx_packets" {
			found = true
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v < 3 {
				t.Errorf("ustack_rx_packets: got %v, want >= 3", v)
			}
			if !strings.Contains(mf.GetHelp(), "rx_packets") {
				t.Errorf("help text %q does not name the counter", mf.GetHelp())
			}
		}
		if mf.GetName() == "ustack_rx_pp_pages_in_use" && mf.GetMetric()[0].GetGauge() == nil {
			t.Errorf("ustack_rx_pp_pages_in_use: want a gauge")
		}
	}
	if !found {
		t.Errorf("no ustack_rx_packets metric")
	}
}

// TestTCPMemGauges checks that the governor's levels are exported as
// Prometheus gauges, its totals as counters.
func TestTCPMemGauges(t *testing.T) {
	for name, gauge := range map[string]bool{
		"tcp_mem_committed_bytes": true, "tcp_mem_pressure": true, "tcp_mem_hard_limit": true,
		"tcp_mem_pressure_entered": false, "tcp_mem_rcvbuf_shrinks": false, "rx_tcp_mem_drops": false,
	} {
		if got := promType(name) == prometheus.GaugeValue; got != gauge {
			t.Errorf("promType(%q) is a gauge: got %v, want %v", name, got, gauge)
		}
	}
}

// TestCollectorQueues: a multi-queue stack's per-queue counters become
// ustack_queue_<total's name> with a queue label, beside the totals, and a
// pedantic registry takes them (one label set per metric name).
func TestCollectorQueues(t *testing.T) {
	each := func(fn func(string, uint64)) {
		for _, c := range []struct {
			name string
			v    uint64
		}{{"rx_packets", 30}, {"rx0_packets", 10}, {"rx1_packets", 20}, {"q1_poll_cpu_ns", 5}, {"rx0_pp_pages_in_use", 7}, {"rx1_pp_pages_in_use", 8}} {
			fn(c.name, c.v)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(NewCollector(nil, WithCounters(each))); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			v := m.GetCounter().GetValue()
			if g := m.GetGauge(); g != nil {
				v, key = g.GetValue(), key+" gauge"
			}
			got[key] = fmt.Sprint(v)
		}
	}
	for key, want := range map[string]string{
		"ustack_rx_packets":                              "30",
		"ustack_queue_rx_packets{queue=0}":               "10",
		"ustack_queue_rx_packets{queue=1}":               "20",
		"ustack_queue_poll_cpu_ns{queue=1}":              "5",
		"ustack_queue_rx_pp_pages_in_use{queue=1} gauge": "8",
	} {
		if got[key] != want {
			t.Errorf("%s: got %q, want %s (all: %v)", key, got[key], want, got)
		}
	}
}

// TestCollectorKinds: the collector types each counter by its kind
// (stack.KindOf): levels (gauges) and maxima are Prometheus gauges, per
// queue too; counts that only grow are counters.
func TestCollectorKinds(t *testing.T) {
	want := map[string]bool{ // name -> exported as a gauge
		"rx_packets":                     false,
		"rx_pp_order_fallbacks":          false,
		"rx_gro_skbs":                    false,
		"rx_pp_pages_in_use":             true,
		"rx_pp_lent_current":             true,
		"tcp_established":                true,
		"server_buf_bytes_current":       true,
		"rx_pp_alloc_order":              true,
		"rx_gro_held_max":                true,
		"cpumap_rx_gro_held_max":         true,
		"queue_rx_pp_alloc_order{1}":     true,
		"queue_rx_gro_held_max{1}":       true,
		"queue_rx_pp_order_fallbacks{1}": false,
	}
	each := func(fn func(string, uint64)) {
		for name := range want {
			if b, ok := strings.CutPrefix(name, "queue_"); ok {
				name = "rx1" + strings.TrimSuffix(strings.TrimPrefix(b, "rx"), "{1}")
			}
			fn(name, 2)
		}
	}
	got := gatherTypes(t, NewCollector(nil, WithCounters(each)))
	for name, gauge := range want {
		if g, ok := got["ustack_"+name]; !ok || g != gauge {
			t.Errorf("ustack_%s: gauge %v (exported %v), want gauge %v", name, g, ok, gauge)
		}
	}
}

// gatherTypes gathers c's metrics from a pedantic registry and returns
// whether each is a gauge, keyed by name with {queue} for a queue label.
func gatherTypes(t *testing.T, c prometheus.Collector) map[string]bool {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetValue() + "}"
			}
			got[key] = m.GetGauge() != nil
		}
	}
	return got
}

// TestStackLinksNoPrometheus: package stack, and so every service that
// embeds it without this package, links no Prometheus library.
func TestStackLinksNoPrometheus(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(gobin, "list", "-deps", "github.com/ustack/ustack/stack").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 || !slices.Contains(deps, "github.com/ustack/ustack/driver") {
		t.Fatalf("go list -deps stack: got %d packages, want stack's (driver among them):\n%s", len(deps), out)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/prometheus/") {
			t.Errorf("package stack depends on %s; only stackprom may", d)
		}
	}
}
