package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

func TestIsMatrix(t *testing.T) {
	for args, want := range map[string]bool{
		"-matrix":                  true,
		"-t 1s --matrix -mtu 1500": true,
		"-matrix=true":             true,
		"-matrix=false":            false,
		"-t 1s":                    false,
		"-- -matrix":               false,
		"-pool":                    false,
	} {
		if got := isMatrix(strings.Fields(args)); got != want {
			t.Errorf("isMatrix(%q) = %v, want %v", args, got, want)
		}
	}
}

func TestMatrixFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-matrix", "-a", "gro=off"},                  // -b missing
		{"-matrix", "-a", "lro=off", "-b", "lro=on"},  // a dimension
		{"-matrix", "-a", "nosuch=1", "-b", "gro=on"}, // no such switch
		{"-matrix", "-a", "hds=0", "-b", "gro=on"},    // a bad value
		{"-matrix", "-proto", "sctp"},                 // no such workload
		{"-matrix", "-threshold", "ten"},              // not a percentage
		{"-matrix", "-plot", "x.jpg"},                 // not svg or png
		{"-matrix", "-mtu", "1500", "-poll-cpu", "1"}, // a dimension
	} {
		err := matrixCmd(args)
		var ue usageError
		if err == nil || !errors.As(err, &ue) {
			t.Errorf("matrixCmd(%q) = %v, want a usage error", args, err)
		}
	}
}

// benchBinary skips t unless it runs as root (TAP and netns), and builds
// the command into a temporary directory: the bench runs `ustack send`
// from os.Executable.
func benchBinary(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for TAP and netns; run go test -exec sudo ./cmd/ustack")
	}
	bin := filepath.Join(t.TempDir(), "ustack")
	// The go command of the toolchain that built the test: under
	// `go test -exec sudo` PATH is sudo's secure_path, without Go's.
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Skipf("cannot build ustack (%v): %s", err, out)
	}
	return bin
}

// TestMatrixRun runs one cell, A against B, and checks the JSON and that
// no namespace is left.
func TestMatrixRun(t *testing.T) {
	bin := benchBinary(t)
	js := filepath.Join(t.TempDir(), "m.json")
	cmd := exec.Command(bin, "bench", "-matrix", "-t", "300ms", "-rounds", "1", "-mtu", "1500", "-proto", "tcp64k,udp64",
		"-lro", "on", "-tunnel", "off,on", "-core", "same", "-a", "hds=256", "-b", "hds=auto", "-json", js)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// The part of the -json file (internal/bench's report) the test reads.
	var got struct {
		Runs []struct {
			Cell, Side, Proto, Congestion, Error string
			Value                                float64
			Bytes                                int64
			SentBytes                            int64 `json:"sent_bytes"`
			Counters                             map[string]uint64
		} `json:"runs"`
		Skipped map[string]string `json:"skipped"`
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	// A kernel without ip6tnl and seg6 cannot make the tunnel: its two
	// cells are skipped, and say why.
	want := 8
	for c, why := range got.Skipped {
		if strings.Contains(c, "tunnel on") && strings.Contains(why, "neither ip6tnl nor seg6") {
			delete(got.Skipped, c)
			want -= 2
		}
	}
	if len(got.Runs) != want {
		t.Fatalf("got %d runs, want %d (4 cells x A, B, less the skipped):\n%s", len(got.Runs), want, out)
	}
	for _, r := range got.Runs {
		if r.Error != "" || r.Value <= 0 || r.Bytes <= 0 || len(r.Counters) == 0 {
			t.Errorf("run %s %s: value %v, %d bytes, %d counters, error %q", r.Cell, r.Side, r.Value, r.Bytes, len(r.Counters), r.Error)
		}
		// Tunnel on is VXLAN: ustack's VXLAN device took the packets.
		if vx := r.Counters["vxlan_rx_packets"]; strings.Contains(r.Cell, "tunnel on") != (vx > 0) {
			t.Errorf("run %s %s: vxlan_rx_packets %d", r.Cell, r.Side, vx)
		}
		if r.Proto == "tcp64k" && (r.Bytes != r.SentBytes || r.Congestion != "cubic") {
			t.Errorf("run %s %s: %d of %d bytes, cc %q", r.Cell, r.Side, r.Bytes, r.SentBytes, r.Congestion)
		}
	}
	if len(got.Skipped) != 0 {
		t.Errorf("skipped %v, want none", got.Skipped)
	}
	if !strings.Contains(string(out), "TCP 64-Kbyte, core same, MTU 1500, LRO on, tunnel off") {
		t.Errorf("no table:\n%s", out)
	}
	ns, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(ns), fmt.Sprintf("ustack-matrix-%d-", cmd.Process.Pid)) {
		t.Errorf("namespaces left: %s", ns)
	}
}

// TestBenchRR runs `ustack bench -rr` for one short round: a table with
// ustack's row and the kernel's, transactions and latencies in each, and
// no namespace left.
func TestBenchRR(t *testing.T) {
	bin := benchBinary(t)
	cmd := exec.Command(bin, "bench", "-rr", "-t", "300ms", "-rounds", "1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	rows := 0
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		name := strings.TrimSpace(l)
		if len(f) < 8 || !(strings.HasPrefix(name, "ustack service") || strings.HasPrefix(name, "ustack mlx5") || strings.HasPrefix(name, "delayed-ack") || strings.HasPrefix(name, "busy-poll") || strings.HasPrefix(name, "busy-read") || strings.HasPrefix(name, "inline-tcp") || strings.HasPrefix(name, "kernel over veth")) {
			continue
		}
		rows++
		// name, ktrans/s, (min-max), p50, p99, (min-max), CPU, G wake, thread sleep, ratio
		n := len(f)
		tps, err1 := strconv.ParseFloat(f[n-9], 64)
		p50, err2 := strconv.ParseFloat(f[n-7], 64)
		p99, err3 := strconv.ParseFloat(f[n-6], 64)
		if err1 != nil || err2 != nil || err3 != nil || tps <= 0 || p50 <= 0 || p99 < p50 {
			t.Errorf("row %q: want transactions and p50 <= p99", l)
		}
		// Each of ustack's exchanges wakes at least the echo's goroutine;
		// the kernel's row is a C-style client and echo on locked
		// threads, with no goroutine to wake.
		if strings.HasPrefix(name, "kernel") {
			continue
		}
		if gw, err := strconv.ParseFloat(f[n-3], 64); err != nil || gw < 1 {
			t.Errorf("row %q: goroutine wake-ups per transaction %q, want at least 1", l, f[n-3])
		}
	}
	if rows != 7 {
		t.Errorf("%d rows, want ustack's six and the kernel's:\n%s", rows, out)
	}
	// Namespaces are named prefix-PID-N: look only for this run's.
	ns, _ := exec.Command("ip", "netns", "list").Output()
	pid := fmt.Sprintf("-%d-", cmd.Process.Pid)
	if strings.Contains(string(ns), "ustack-rr-rx"+pid) || strings.Contains(string(ns), "ustack-bench"+pid) {
		t.Errorf("namespaces left: %s", ns)
	}
}

// TestBenchKernelRow runs `ustack bench` for one short round: the kernel's
// row over a veth is there by default, every ustack row has its ratio to
// it, and the kernel peer's namespace is gone after.
func TestBenchKernelRow(t *testing.T) {
	bin := benchBinary(t)
	cmd := exec.Command(bin, "bench", "-t", "300ms", "-rounds", "1", "-stock=false")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var ustackRows, kernelRows, tunRows int
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		// name..., Gbit/s, (min-max), x kernel, x stock, ...
		switch name := strings.TrimSpace(l); {
		case strings.HasPrefix(name, "service: lro=") || strings.HasPrefix(name, "mlx5: lro="):
			ustackRows++
		case strings.HasPrefix(name, "TUN: service: lro="):
			tunRows++
		case strings.HasPrefix(name, "kernel over veth"):
			kernelRows++
		default:
			continue
		}
		// The name's words end before Gbit/s, the field before "(min-max)".
		at := -1
		for i, w := range f {
			if strings.HasPrefix(w, "(") {
				at = i - 1
				break
			}
		}
		if at < 1 || len(f) < at+4 {
			t.Fatalf("row %q: too few columns", l)
		}
		gbps, err1 := strconv.ParseFloat(f[at], 64)
		ratio, err2 := strconv.ParseFloat(f[at+2], 64)
		if err1 != nil || err2 != nil || gbps <= 0 || ratio <= 0 {
			t.Errorf("row %q: want Gbit/s and a ratio to the kernel", l)
		}
		if f[0] == "kernel" && ratio != 1 {
			t.Errorf("kernel row %q: x kernel %v, want 1.00", l, ratio)
		}
	}
	if ustackRows != 6 || kernelRows != 1 || tunRows != 1 {
		t.Errorf("%d ustack rows, %d on a TUN and %d kernel rows, want 6 (the service configuration's and mlx5's five), one and one:\n%s", ustackRows, tunRows, kernelRows, out)
	}
	ns, _ := exec.Command("ip", "netns", "list").Output()
	pid := fmt.Sprintf("-%d-", cmd.Process.Pid)
	if strings.Contains(string(ns), "ustack-bench-rx"+pid) || strings.Contains(string(ns), "ustack-bench"+pid) || strings.Contains(string(ns), "ustack-bench-tun"+pid) {
		t.Errorf("namespaces left: %s", ns)
	}
}
