package main

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
	"github.com/ustack/ustack/stack/stackprom"
	"github.com/ustack/ustack/stack/stacktest"
)

// TestRunCounters: run prints (and exports) the stack's counters and then
// its servers', every one of them.
func TestRunCounters(t *testing.T) {
	rx, _ := stacktest.Pair(t, driver.Config{})
	var st serve.Stats
	var b strings.Builder
	printCounters(&b, allCounters(rx, &st))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if want := 1 + len(rx.Counters()) + len(stacktest.Counters(st.EachCounter)); len(lines) != want {
		t.Fatalf("printCounters: got %d lines, want %d (a header, the stack's counters and the servers')", len(lines), want)
	}
	if got, want := strings.TrimSpace(lines[len(lines)-1]), "sockperf_udp_send_errors: 0"; got != want {
		t.Errorf("last line: got %q, want %q (the servers' last counter)", got, want)
	}
	if !strings.Contains(b.String(), "server_conns_refused: 0") || !strings.Contains(b.String(), "rx_packets: ") {
		t.Errorf("printCounters: want the stack's rx_packets and the servers' server_conns_refused in\n%s", b.String())
	}
}

// TestRunCollector: run's -metrics exports what it prints, the stack's
// counters and then its servers', each once, typed by its kind.
func TestRunCollector(t *testing.T) {
	rx, _ := stacktest.Pair(t, driver.Config{})
	var st serve.Stats
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(runCollector(rx, &st)); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetType().String()
	}
	want := map[string]string{}
	allCounters(rx, &st)(func(name string, _ uint64) {
		metric := "ustack_" + name
		if b, _, ok := stack.SplitQueueCounter(name); ok {
			metric = "ustack_queue_" + b
		}
		want[metric] = "COUNTER"
		if stack.KindOf(name) != stack.KindCounter {
			want[metric] = "GAUGE"
		}
	})
	for name, typ := range want {
		if got[name] != typ {
			t.Errorf("%s: exported as %q, want %s", name, got[name], typ)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: exported, not printed", name)
		}
	}
	const refused = "ustack_server_conns_refused 0"
	if err := testutil.GatherAndCompare(reg, strings.NewReader("# HELP ustack_server_conns_refused ustack server_conns_refused (a counter, see docs/counters.md).\n# TYPE ustack_server_conns_refused counter\n"+refused+"\n"), "ustack_server_conns_refused"); err != nil {
		t.Error(err)
	}
}

// TestMetricsMux: run's -metrics address serves the counters and Go's
// profiles beside them.
func TestMetricsMux(t *testing.T) {
	srv := httptest.NewServer(metricsMux(stackprom.NewCollector(nil, stackprom.WithCounters(func(fn func(string, uint64)) { fn("rx_packets", 7) }))))
	defer srv.Close()
	for path, want := range map[string]string{
		"/metrics":                       "ustack_rx_packets 7",
		"/debug/pprof/":                  "goroutine",
		"/debug/pprof/goroutine?debug=1": "goroutine profile:",
		"/debug/pprof/cmdline":           "",
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %s, want 200 with %q in:\n%.300s", path, resp.Status, want, body)
		}
	}
}

// TestStartCPUProfile: -cpuprofile writes a profile pprof can read, and
// a path it cannot create is a usage error.
func TestStartCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	stop, err := startCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b { // a profile is gzipped protobuf
		t.Errorf("the profile is %d bytes, not gzip: % x", len(b), b[:min(len(b), 8)])
	}
	var ue usageError
	if _, err := startCPUProfile(filepath.Join(t.TempDir(), "no", "such", "dir")); !errors.As(err, &ue) {
		t.Errorf("uncreatable path: got %v, want a usage error", err)
	}
}

// TestRunCountersQueues: a stack on two queues at page order 2 prints and
// exports rx_pp_alloc_order 2, each queue's order, not their sum, and
// exports it as a gauge.
func TestRunCountersQueues(t *testing.T) {
	a0, a0p := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535+18)
	a1, a1p := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535+18)
	t.Cleanup(func() { a0p.Close(); a1p.Close() })
	rx, err := stack.New(stack.Config{
		Wire:   a0,
		Queues: []driver.Wire{a1},
		Addrs:  []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")},
		Pool:   bufpool.Config{Order: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rx.Close() })
	var st serve.Stats
	var b strings.Builder
	printCounters(&b, allCounters(rx, &st))
	for _, line := range []string{"rx_pp_alloc_order: 2", "rx0_pp_alloc_order: 2", "rx1_pp_alloc_order: 2"} {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("printCounters: no %q in\n%s", line, b.String())
		}
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(runCollector(rx, &st)); err != nil {
		t.Fatal(err)
	}
	want := "# HELP ustack_rx_pp_alloc_order ustack rx_pp_alloc_order (a max, see docs/counters.md).\n# TYPE ustack_rx_pp_alloc_order gauge\nustack_rx_pp_alloc_order 2\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ustack_rx_pp_alloc_order"); err != nil {
		t.Error(err)
	}
}
