package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime/metrics"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack/serve"
)

// The kernel echo's veth link for RR: the client's end in the bed's
// namespace, the server's in a namespace of its own.
var (
	rrVethClient = netip.MustParsePrefix("10.79.0.1/24")
	rrVethServer = netip.MustParsePrefix("10.79.0.2/24")
)

const rrPort = 7007

// rrSample is one RR run: transactions per second, the client's latency
// percentiles, and this process's CPU per transaction (ustack's whole
// stack for a ustack row; for the kernel row only the echo goroutine's
// syscalls, the kernel's receive being counted in softirq time), with its
// hand-offs per transaction: goroutine wake-ups (gWake) and thread sleeps
// (thSleep), see handoffs.
type rrSample struct {
	tps, p50, p99, cpuUs float64
	gWake, thSleep       float64
}

// RR is `ustack bench -rr`: TCP request/response of size bytes on one
// connection with TCP_NODELAY (neper's TCP_RR), `exe send -mode rr` in the
// TAP's namespace as the client, against ustack's echo server for each row
// and against the kernel's TCP over a veth pair (the same Go echo on a
// kernel socket in a namespace of its own), rows interleaved, rounds
// times. It prints transactions/s, median and p99 latency, CPU per
// transaction and the ratio to the kernel. Beside them it measures the
// TAP floor, the stateless reflector on the same TAP (blocking and busy),
// the most any stack on the TAP could answer.
func RR(bed *testbed.TAPBed, exe string, rows []Row, size int, dur time.Duration, rounds int) error {
	rx, closeRx, err := rrPeer(bed, rows[0].MTU)
	if err != nil {
		return err
	}
	defer closeRx()
	fmt.Printf("ustack bench -rr: TCP_RR %d B, one connection, TCP_NODELAY; client `ustack send -mode rr -blocking` (blocking read(2) and write(2) on a locked thread, as a C client) in netns %s -> TAP -> ustack's echo, and -> veth -> the kernel's TCP in netns %s with a C-style echo (blocking, a thread per connection); %v per run, %d rounds interleaved\n",
		size, bed.NS.Name, rx.Name, dur, rounds)
	names := []string{}
	for _, r := range rows {
		names = append(names, r.Name)
	}
	// The TAP floor's rows: the stateless reflector on the same TAP,
	// blocking in read(2) and spinning; then the kernel's.
	names = append(names, FloorReflectorName, FloorReflectorBusyName, "kernel over veth")
	samples := make([][]rrSample, len(names))
	for r := 0; r < rounds; r++ {
		for i, name := range names {
			fmt.Fprintf(os.Stderr, "round %d/%d: %s ...\n", r+1, rounds, name)
			var s rrSample
			var err error
			switch {
			case i < len(rows):
				labelled(func() { s, err = rrUstack(bed, exe, rows[i], size, dur) }, "row", name)
			case name == FloorReflectorName, name == FloorReflectorBusyName:
				labelled(func() { s, err = rrFloor(bed, exe, size, dur, name == FloorReflectorBusyName) }, "row", name)
			default:
				s, err = rrKernel(bed, rx, exe, size, dur)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			samples[i] = append(samples[i], s)
		}
	}
	if err := printRR(os.Stdout, names, samples); err != nil {
		return err
	}
	fmt.Println("TAP floor: a stateless reflector on the same TAP, one read(2) and one write(2) per frame, no connection state: what no stack on this TAP can beat (busy: spinning on non-blocking reads, a whole CPU)")
	return nil
}

// rrPeer builds the kernel server's namespace and the veth pair to it from
// the bed's namespace (rrVethClient to rrVethServer), removed by the
// returned func, also on a signal.
func rrPeer(bed *testbed.TAPBed, mtu int) (*testbed.Netns, func(), error) {
	rx, err := testbed.NewNetns("ustack-rr-rx")
	if err != nil {
		return nil, nil, err
	}
	stopSig := testbed.CleanupOnSignal(rx)
	closeRx := func() { stopSig(); rx.Close() }
	if err := testbed.NewVethPair(bed.NS, rx, "urr0", "urr1", mtu); err != nil {
		closeRx()
		return nil, nil, err
	}
	if err := bed.NS.IP("addr", "add", rrVethClient.String(), "dev", "urr0"); err != nil {
		closeRx()
		return nil, nil, err
	}
	if err := rx.IP("addr", "add", rrVethServer.String(), "dev", "urr1"); err != nil {
		closeRx()
		return nil, nil, err
	}
	return rx, closeRx, nil
}

// printRR prints RR's table: medians of the rounds with the min-max
// spread; the last row is the kernel's, which the ratios are against.
func printRR(w io.Writer, names []string, samples [][]rrSample) error {
	col := func(ss []rrSample, f func(rrSample) float64) []float64 {
		var xs []float64
		for _, s := range ss {
			xs = append(xs, f(s))
		}
		return xs
	}
	ktps, _, _ := Median(col(samples[len(samples)-1], func(s rrSample) float64 { return s.tps }))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tktrans/s (min-max)\tp50 us\tp99 us (min-max)\tCPU us/trans\t~G wake/trans\tthread sleep/trans\tx kernel\t")
	for i, name := range names {
		tps, tlo, thi := Median(col(samples[i], func(s rrSample) float64 { return s.tps }))
		p50, _, _ := Median(col(samples[i], func(s rrSample) float64 { return s.p50 }))
		p99, plo, phi := Median(col(samples[i], func(s rrSample) float64 { return s.p99 }))
		cpu, _, _ := Median(col(samples[i], func(s rrSample) float64 { return s.cpuUs }))
		gw, _, _ := Median(col(samples[i], func(s rrSample) float64 { return s.gWake }))
		ts, _, _ := Median(col(samples[i], func(s rrSample) float64 { return s.thSleep }))
		ratio := "-"
		if ktps > 0 {
			ratio = fmt.Sprintf("%.2f", tps/ktps)
		}
		fmt.Fprintf(tw, "%s\t%.2f (%.2f-%.2f)\t%.0f\t%.0f (%.0f-%.0f)\t%.1f\t%.1f\t%.1f\t%s\t\n", name, tps/1e3, tlo/1e3, thi/1e3, p50, p99, plo, phi, cpu, gw, ts, ratio)
	}
	return tw.Flush()
}

// rrUstack measures one ustack row: its echo server on the TAP.
func rrUstack(bed *testbed.TAPBed, exe string, row Row, size int, dur time.Duration) (rrSample, error) {
	st, err := openTarget(bed, row)
	if err != nil {
		return rrSample{}, err
	}
	defer st.Close()
	ap := netip.AddrPortFrom(bed.StackAddr4.Addr(), rrPort)
	l, err := st.ListenTCP(ap)
	if err != nil {
		return rrSample{}, err
	}
	done := make(chan struct{})
	go func() { defer close(done); serve.Echo(l) }()
	defer func() { l.Close(); <-done }()
	return rrClient(bed.NS, exe, ap, size, dur)
}

// rrKernel measures the kernel's TCP: a C-style echo (BlockingEcho, as the
// TAP floor's tcprr.c server) on a kernel socket in rx, reached over the
// veth pair.
func rrKernel(bed *testbed.TAPBed, rx *testbed.Netns, exe string, size int, dur time.Duration) (rrSample, error) {
	ap := netip.AddrPortFrom(rrVethServer.Addr(), rrPort)
	l, err := rx.ListenTCP(ap)
	if err != nil {
		return rrSample{}, err
	}
	done := make(chan struct{})
	go func() { defer close(done); BlockingEcho(l) }()
	defer func() { l.Close(); <-done }()
	return rrClient(bed.NS, exe, ap, size, dur)
}

// rrClient runs the client against ap and reads its result, with this
// process's CPU over the run.
func rrClient(ns *testbed.Netns, exe string, ap netip.AddrPort, size int, dur time.Duration) (rrSample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dur+30*time.Second)
	defer cancel()
	cmd := ns.Exec(ctx, exe, "send", "-mode", "rr", "-blocking", "-size", fmt.Sprint(size), "-addr", ap.String(), "-t", dur.String())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cpu0, h0 := rusage(), handoffs()
	if err := cmd.Run(); err != nil {
		return rrSample{}, fmt.Errorf("client: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	cpu, h := rusage()-cpu0, handoffs().sub(h0)
	var res SendResult
	if err := json.Unmarshal(lastLine(out.Bytes()), &res); err != nil {
		return rrSample{}, fmt.Errorf("client output %q: %v", out.String(), err)
	}
	if res.Transactions == 0 || res.Seconds <= 0 {
		return rrSample{}, fmt.Errorf("client made no transaction: %q", out.String())
	}
	t := float64(res.Transactions)
	return rrSample{tps: t / res.Seconds, p50: res.P50Us, p99: res.P99Us,
		cpuUs: float64(cpu.Microseconds()) / t, gWake: float64(h.gWake) / t, thSleep: float64(h.thSleep) / t}, nil
}

// handoffCount counts this process's hand-offs, the steps of an exchange
// that wait for another goroutine or thread to run: gWake, goroutines
// made runnable and then run (every channel send, waiter notification or
// timer that wakes one), estimated from runtime/metrics'
// /sched/latencies:seconds, whose samples the runtime takes on one
// transition in gTrackingPeriod (8) of each goroutine, so its count times
// 8; thSleep, voluntary context switches of its threads (getrusage's
// ru_nvcsw: a thread that blocked in the kernel, in futex or a blocking
// read, and had to be woken), exact.
type handoffCount struct{ gWake, thSleep uint64 }

// schedSamplePeriod is the Go runtime's gTrackingPeriod: it records a
// goroutine's scheduling latency on one of this many transitions.
const schedSamplePeriod = 8

func handoffs() handoffCount {
	m := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(m)
	var h handoffCount
	if m[0].Value.Kind() == metrics.KindFloat64Histogram {
		for _, c := range m[0].Value.Float64Histogram().Counts {
			h.gWake += c * schedSamplePeriod
		}
	}
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		h.thSleep = uint64(ru.Nvcsw)
	}
	return h
}

func (h handoffCount) sub(o handoffCount) handoffCount {
	return handoffCount{h.gWake - o.gWake, h.thSleep - o.thSleep}
}
