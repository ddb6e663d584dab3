package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack/serve"
)

// sockperfPort is the port of every sockperf server the bench runs
// (sockperf's own default, 11111).
const sockperfPort = 11111

// spSample is one sockperf ping-pong run: the client's average, median
// and p99 latency in us and its messages per second (replies received
// over the run time).
type spSample struct {
	avg, p50, p99, rate float64
}

// Sockperf is `ustack bench -sockperf`: Debian's sockperf client in
// ping-pong mode (size-byte messages, one in flight), over TCP and over
// UDP, in the TAP's namespace, against ustack's sockperf server (`ustack
// run -sockperf`, serve.ListenSockperf) for each row, and against the
// kernel's `sockperf server` in a namespace of its own over a veth pair,
// rows interleaved, rounds times. It prints the median latencies with
// their spread and the ratio of each row's average latency to the
// kernel's (within 10%).
func Sockperf(bed *testbed.TAPBed, rows []Row, size int, dur time.Duration, rounds int) error {
	if _, err := exec.LookPath("sockperf"); err != nil {
		return errors.New("-sockperf needs Debian's sockperf client: apt-get install sockperf")
	}
	rx, closeRx, err := rrPeer(bed, rows[0].MTU)
	if err != nil {
		return err
	}
	defer closeRx()
	secs := max(1, int(dur.Round(time.Second)/time.Second))
	fmt.Printf("ustack bench -sockperf: sockperf ping-pong -m %d, TCP and UDP, client in netns %s -> TAP -> ustack's sockperf server, and -> veth -> the kernel's `sockperf server` in netns %s; %ds per run, %d rounds interleaved\n",
		size, bed.NS.Name, rx.Name, secs, rounds)
	names := []string{}
	for _, r := range rows {
		names = append(names, r.Name)
	}
	names = append(names, "kernel over veth")
	// samples[row][proto]: proto 0 TCP, 1 UDP.
	samples := make([][2][]spSample, len(names))
	for r := 0; r < rounds; r++ {
		for i, name := range names {
			fmt.Fprintf(os.Stderr, "round %d/%d: %s ...\n", r+1, rounds, name)
			var s [2]spSample
			var err error
			if i < len(rows) {
				labelled(func() { s, err = sockperfUstack(bed, rows[i], size, secs) }, "row", name)
			} else {
				s, err = sockperfKernel(bed, rx, size, secs)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			for p := range s {
				samples[i][p] = append(samples[i][p], s[p])
			}
		}
	}
	return printSockperf(os.Stdout, names, samples)
}

// sockperfUstack measures one ustack row: its sockperf server on the TAP.
func sockperfUstack(bed *testbed.TAPBed, row Row, size, secs int) ([2]spSample, error) {
	st, err := openTarget(bed, row)
	if err != nil {
		return [2]spSample{}, err
	}
	defer st.Close()
	ap := netip.AddrPortFrom(bed.StackAddr4.Addr(), sockperfPort)
	srv, err := serve.ListenSockperf(st.Stack, ap, serve.Config{})
	if err != nil {
		return [2]spSample{}, err
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve() }()
	defer func() { srv.Close(); <-done }()
	return sockperfClients(bed.NS, ap, size, secs)
}

// sockperfKernel measures the kernel: `sockperf server` for UDP and one
// for TCP on the same port in rx, reached over the veth pair. The servers
// are this process's children, stopped by their PIDs.
func sockperfKernel(bed *testbed.TAPBed, rx *testbed.Netns, size, secs int) ([2]spSample, error) {
	ap := netip.AddrPortFrom(rrVethServer.Addr(), sockperfPort)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var servers []*exec.Cmd
	defer func() {
		for _, c := range servers {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for _, tcp := range []bool{false, true} {
		args := []string{"server", "-i", ap.Addr().String(), "-p", strconv.Itoa(sockperfPort)}
		if tcp {
			args = append(args, "--tcp")
		}
		c := rx.Exec(ctx, "sockperf", args...)
		if err := c.Start(); err != nil {
			return [2]spSample{}, fmt.Errorf("sockperf server: %w", err)
		}
		servers = append(servers, c)
	}
	// Wait for the TCP server's listener (the UDP one binds first, and
	// sockperf's client retries its UDP warm-up anyway).
	deadline := time.Now().Add(10 * time.Second)
	for {
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		c, err := bed.NS.DialTCP(dctx, ap, "")
		dcancel()
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return [2]spSample{}, fmt.Errorf("the kernel's sockperf server did not listen: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return sockperfClients(bed.NS, ap, size, secs)
}

// sockperfClients runs the ping-pong client over TCP, then UDP.
func sockperfClients(ns *testbed.Netns, ap netip.AddrPort, size, secs int) ([2]spSample, error) {
	var s [2]spSample
	for p, tcp := range []bool{true, false} {
		var err error
		if s[p], err = sockperfPingPong(ns, ap, tcp, size, secs); err != nil {
			return s, err
		}
	}
	return s, nil
}

var (
	spRunTime = regexp.MustCompile(`\[Valid Duration\] RunTime=([0-9.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)`)
	spAvg     = regexp.MustCompile(`avg-latency=([0-9.]+)`)
	spPct     = regexp.MustCompile(`percentile (\d+\.\d+) = +([0-9.]+)`)
)

// sockperfPingPong runs one client and parses its report.
func sockperfPingPong(ns *testbed.Netns, ap netip.AddrPort, tcp bool, size, secs int) (spSample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	args := []string{"ping-pong", "-i", ap.Addr().String(), "-p", strconv.Itoa(int(ap.Port())), "-m", strconv.Itoa(size), "-t", strconv.Itoa(secs)}
	if tcp {
		args = append(args, "--tcp")
	}
	out, err := ns.Exec(ctx, "sockperf", args...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "ERROR") {
		return spSample{}, fmt.Errorf("sockperf %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return parseSockperf(string(out))
}

// parseSockperf reads a ping-pong client's report: the replies over its
// valid duration (the run after the warm-up), avg-latency and the 50th and
// 99th percentiles (usec).
func parseSockperf(out string) (spSample, error) {
	var s spSample
	m := spRunTime.FindStringSubmatch(out)
	a := spAvg.FindStringSubmatch(out)
	if m == nil || a == nil {
		return s, fmt.Errorf("sockperf's report lacks its run time or avg-latency:\n%s", out)
	}
	f := func(v string) float64 { x, _ := strconv.ParseFloat(v, 64); return x }
	if rt := f(m[1]); rt > 0 {
		s.rate = f(m[3]) / rt
	}
	s.avg = f(a[1])
	for _, p := range spPct.FindAllStringSubmatch(out, -1) {
		switch p[1] {
		case "50.000":
			s.p50 = f(p[2])
		case "99.000":
			s.p99 = f(p[2])
		}
	}
	return s, nil
}

// printSockperf prints Sockperf's table: per row and protocol the median
// average latency with its min-max, the median p50 and p99, the message
// rate, and the average latency over the kernel's (the last row's).
func printSockperf(w io.Writer, names []string, samples [][2][]spSample) error {
	col := func(ss []spSample, f func(spSample) float64) []float64 {
		var xs []float64
		for _, s := range ss {
			xs = append(xs, f(s))
		}
		return xs
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tproto\tavg us (min-max)\tp50 us\tp99 us (min-max)\tkmsg/s\tlatency x kernel\t")
	for p, proto := range []string{"TCP", "UDP"} {
		kavg, _, _ := Median(col(samples[len(samples)-1][p], func(s spSample) float64 { return s.avg }))
		for i, name := range names {
			ss := samples[i][p]
			avg, lo, hi := Median(col(ss, func(s spSample) float64 { return s.avg }))
			p50, _, _ := Median(col(ss, func(s spSample) float64 { return s.p50 }))
			p99, plo, phi := Median(col(ss, func(s spSample) float64 { return s.p99 }))
			rate, _, _ := Median(col(ss, func(s spSample) float64 { return s.rate }))
			ratio := "-"
			if kavg > 0 {
				ratio = fmt.Sprintf("%.2f", avg/kavg)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.1f (%.1f-%.1f)\t%.1f\t%.1f (%.1f-%.1f)\t%.2f\t%s\t\n", name, proto, avg, lo, hi, p50, p99, plo, phi, rate/1e3, ratio)
		}
	}
	return tw.Flush()
}
