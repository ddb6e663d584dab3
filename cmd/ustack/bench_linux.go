package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// sample is one measured run of a row.
type sample struct {
	gbps        float64
	rxCPUPerGB  float64 // receiver process CPU seconds per GB
	sysCPUPerGB float64 // whole machine CPU seconds per GB
	nicShare    float64 // share of the receiver's CPU spent in the NIC model's thread
	counters    map[string]uint64
	congestion  string
	peakHeld    int64 // most bytes the page pool held at once during the run
}

func benchCmd(args []string) error {
	if isMatrix(args) {
		return matrixCmd(args)
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var (
		dur     = fs.Duration("t", 3*time.Second, "sending time per run")
		rounds  = fs.Int("rounds", 3, "rounds; the rows run interleaved in each round")
		cc      = fs.String("cc", "cubic", "congestion control of the kernel sender")
		wsize   = fs.Int("w", 64<<10, "sender write size")
		mtu     = fs.Int("mtu", 1500, "MTU of the TAP and the stack")
		stock   = fs.Bool("stock", true, "add a row for gVisor's stock fdbased endpoint")
		pool    = fs.Bool("pool", false, "measure page recycling (seed 001): recycle off/on at 4k/64k pages, LRO off")
		streams = fs.String("P", "1", "parallel TCP streams: a list runs every row with each count (e.g. 1,4,8)")
		hwgro   = fs.Bool("hwgro", false, "measure hardware GRO (seed 002): software GRO only, hw-gro on, hw-gro coalesce, LRO off")
		cpump   = fs.Bool("cpumap", false, "measure cpumap (seed 004): UDP 64 B and TCP_RR without cpumap and through it with its GRO off and on")
		cpuprof = fs.String("cpuprofile", "", "write a CPU profile of the whole run (every row) to this file")
		client  = fs.String("client", clientBuiltin, "TCP sender: builtin (ustack send, a kernel socket of ours) or iperf3 (the iperf3 client against ustack's iperf3 server)")
	)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			return usageError{fmt.Errorf("-cpuprofile: %w", err)}
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *dur <= 0 || *dur > time.Minute || *rounds < 1 || *rounds > 50 {
		return usageError{errors.New("want 0 < -t <= 1m and 1 <= -rounds <= 50")}
	}
	sender := "kernel sender (ustack send)"
	switch *client {
	case clientBuiltin:
	case clientIPerf3:
		if *cpump || os.Geteuid() != 0 {
			return usageError{errors.New("-client iperf3 needs root and does not apply to -cpumap")}
		}
		v, err := iperf3Version()
		if err != nil {
			return err
		}
		sender = "iperf3 client (" + v + ")"
	default:
		return usageError{fmt.Errorf("-client %q: want builtin or iperf3", *client)}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "ustack bench: not root, so no TAP or namespace: measuring over the in-memory wire with a gVisor TCP sender instead")
		return benchMem(*dur, *rounds, *mtu)
	}
	rows := defaultRows(*mtu)
	if *pool {
		rows = poolRows(*mtu)
		*stock = false
	}
	if *hwgro {
		rows = hwGRORows(*mtu)
		*stock = false
	}
	if *stock {
		rows = append(rows, benchRow{name: "gVisor stock fdbased", stock: true, pol: policy{mtu: *mtu}})
	}
	bed, err := testbed.NewTAPBed(testbed.TAPConfig{Prefix: "ustack-bench", MTU: *mtu})
	if err != nil {
		return err
	}
	stopSig := testbed.CleanupOnSignal(bed)
	defer stopSig()
	defer bed.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if *cpump {
		return benchCPUMap(bed, exe, *dur, *rounds, *mtu)
	}
	fmt.Printf("ustack bench: TCP bulk, %s in netns %s -> TAP %s -> ustack, MTU %d, write %d B, sender congestion control %s, %v per run, %d rounds interleaved\n",
		sender, bed.NS.Name, bed.TAPName, *mtu, *wsize, *cc, *dur, *rounds)
	var counts []int
	for _, f := range strings.Split(*streams, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 64 {
			return usageError{fmt.Errorf("-P %q: want stream counts in 1..64", *streams)}
		}
		counts = append(counts, n)
	}
	if len(counts) > 1 || counts[0] != 1 {
		var expanded []benchRow
		for _, n := range counts {
			for _, r := range rows {
				r.streams = n
				r.name = fmt.Sprintf("%s, %d streams", r.name, n)
				expanded = append(expanded, r)
			}
		}
		rows = expanded
	}
	for i := range rows {
		rows[i].client = *client
	}
	results := make([][]sample, len(rows))
	for r := 0; r < *rounds; r++ {
		for i, row := range rows {
			fmt.Fprintf(os.Stderr, "round %d/%d: %s ...\n", r+1, *rounds, row.name)
			s, err := benchRun(bed, exe, row, *dur, *cc, *wsize)
			if err != nil {
				return fmt.Errorf("%s: %w", row.name, err)
			}
			results[i] = append(results[i], s)
		}
	}
	if *pool {
		printPoolBench(os.Stdout, rows, results)
		return nil
	}
	if *hwgro {
		printHWGROBench(os.Stdout, rows, results)
		return nil
	}
	printBench(os.Stdout, rows, results)
	return nil
}

const benchPort = 5001

// benchRun starts a receiver for row on the bed's TAP, runs the kernel
// sender for dur and measures.
func benchRun(bed *testbed.TAPBed, exe string, row benchRow, dur time.Duration, cc string, wsize int) (sample, error) {
	var s sample
	st, err := benchStack(bed, row)
	if err != nil {
		return s, err
	}
	defer st.Close()
	ap := netip.AddrPortFrom(bed.StackAddr4.Addr(), benchPort)
	var received atomic.Uint64
	if row.client == clientIPerf3 {
		stop, err := benchIPerf3Serve(st.Stack, ap, &received)
		if err != nil {
			return s, err
		}
		defer stop()
	} else {
		l, err := st.ListenTCP(ap)
		if err != nil {
			return s, err
		}
		served := make(chan error, 1)
		go func() { served <- row.pol.discard()(l, &received) }()
		defer func() { l.Close(); <-served }()
	}

	ctx, cancel := context.WithTimeout(context.Background(), dur+30*time.Second)
	defer cancel()
	cmd := bed.NS.Exec(ctx, exe, "send", "-addr", ap.String(),
		"-t", dur.String(), "-cc", cc, "-w", strconv.Itoa(wsize), "-P", strconv.Itoa(max(1, row.streams)))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	ru0, sys0 := rusage(), machineCPU()
	var nic0 int64
	if d := st.Driver(); d != nil {
		nic0 = d.Stats().NICCPUNanos.Load()
	}
	stopSampling := samplePool(st, &s.peakHeld)
	var res sendResult
	if row.client == clientIPerf3 {
		res, err = benchIPerf3Send(bed.NS, ap, dur, max(1, row.streams), cc, wsize)
		stopSampling()
		if err != nil {
			return s, fmt.Errorf("sender: %w", err)
		}
	} else {
		err = cmd.Run()
		stopSampling()
		if err != nil {
			return s, fmt.Errorf("sender: %v: %s", err, strings.TrimSpace(errb.String()))
		}
		if err := json.Unmarshal(lastLine(out.Bytes()), &res); err != nil {
			return s, fmt.Errorf("sender output %q: %v", out.String(), err)
		}
	}
	// Everything sent must arrive before the figures are taken.
	deadline := time.Now().Add(10 * time.Second)
	for received.Load() < uint64(res.Bytes) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	ru1, sys1 := rusage(), machineCPU()
	if got := received.Load(); got != uint64(res.Bytes) {
		return s, fmt.Errorf("received %d bytes, sender wrote %d", got, res.Bytes)
	}
	gb := float64(res.Bytes) / 1e9
	s.gbps = float64(res.Bytes) * 8 / res.Seconds / 1e9
	s.rxCPUPerGB = (ru1 - ru0).Seconds() / gb
	s.sysCPUPerGB = (sys1 - sys0) / gb
	s.congestion = res.Congestion
	s.counters = map[string]uint64{}
	st.EachCounter(func(name string, v uint64) { s.counters[name] = v })
	if d := st.Driver(); d != nil {
		// The NIC thread's time is published when it sleeps on the wire.
		nic := float64(d.Stats().NICCPUNanos.Load()-nic0) / 1e9
		if rx := (ru1 - ru0).Seconds(); rx > 0 {
			s.nicShare = nic / rx
		}
	}
	return s, nil
}

// samplePool records in peak the most bytes st's page pool holds, sampled
// every 10 ms until the returned function is called.
func samplePool(st *benchTarget, peak *int64) (stop func()) {
	d := st.Driver()
	if d == nil {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			*peak = max(*peak, d.Pool().Stats().BytesHeld)
			select {
			case <-t.C:
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-finished }
}

// benchStack opens the bed's TAP from inside its namespace and builds the
// row's stack on it.
func benchStack(bed *testbed.TAPBed, row benchRow) (*benchTarget, error) {
	addrs := []netip.Prefix{bed.StackAddr4, bed.StackAddr6}
	if row.stock {
		var tap *driver.TAP
		if err := bed.Open(func() (err error) {
			tap, err = driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName})
			return err
		}); err != nil {
			return nil, err
		}
		// gVisor's fdbased endpoint with its default options, as a user of
		// gVisor would attach it to a TAP.
		ep, err := fdbased.New(&fdbased.Options{
			FDs:            []int{tap.FD()},
			MTU:            uint32(row.pol.mtu),
			EthernetHeader: true,
			Address:        tcpip.LinkAddress(stack.DefaultMAC[:]),
		})
		if err != nil {
			tap.Close()
			return nil, err
		}
		st, err := stack.NewWithEndpoint(ep, stack.Config{Addrs: addrs})
		if err != nil {
			tap.Close()
			return nil, err
		}
		return &benchTarget{Stack: st, tap: tap}, nil
	}
	cfg, err := row.pol.stackConfig()
	if err != nil {
		return nil, err
	}
	var tap *driver.TAP
	if err := bed.Open(func() (err error) {
		tap, err = driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true})
		return err
	}); err != nil {
		return nil, err
	}
	cfg.Wire = tap
	cfg.Addrs = addrs
	st, err := stack.New(cfg)
	if err != nil {
		return nil, err
	}
	return &benchTarget{Stack: st}, nil
}

// benchTarget is a stack under measurement and the TAP it owns when the
// stack does not (gVisor's fdbased endpoint leaves its fd open).
type benchTarget struct {
	*stack.Stack
	tap io.Closer
}

func (b *benchTarget) Close() error {
	err := b.Stack.Close()
	if b.tap != nil {
		b.tap.Close()
	}
	return err
}

// rusage returns the CPU time (user + system) this process has used.
func rusage() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU returns the busy CPU seconds of the whole machine so far, from
// /proc/stat (everything but idle and iowait).
func machineCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy float64
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		busy += n
	}
	return busy / 100 // USER_HZ
}

func lastLine(b []byte) []byte {
	b = bytes.TrimSpace(b)
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}

func field(ss []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

// printBench prints one line per row: medians with their spread, and the
// ratio to the stock endpoint when it ran.
func printBench(w io.Writer, rows []benchRow, results [][]sample) {
	stockMed := 0.0
	for i, r := range rows {
		if r.stock {
			stockMed, _, _ = median(field(results[i], func(s sample) float64 { return s.gbps }))
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "configuration\tGbit/s (min-max)\tx stock\trx CPU s/GB\tmachine CPU s/GB\tNIC share\tframes/read\tpkts/poll\thds B/pkt\thds payload B\tsegs/GRO pkt\tfrag_list\tcc\t")
	for i, r := range rows {
		ss := results[i]
		g, lo, hi := median(field(ss, func(s sample) float64 { return s.gbps }))
		rx, _, _ := median(field(ss, func(s sample) float64 { return s.rxCPUPerGB }))
		sys, _, _ := median(field(ss, func(s sample) float64 { return s.sysCPUPerGB }))
		nic, _, _ := median(field(ss, func(s sample) float64 { return s.nicShare }))
		ratio := "-"
		if stockMed > 0 {
			ratio = fmt.Sprintf("%.2f", g/stockMed)
		}
		last := ss[len(ss)-1]
		c := last.counters
		fpr, ppp, hdsPkt, hdsPay, segs, fl := "-", "-", "-", "-", "-", "-"
		if !r.stock {
			fpr = ratioStr(c["rx_packets"], c["rx_wire_reads"])
			ppp = ratioStr(c["rx_packets"], c["rx_napi_polls"])
			hdsPkt = ratioStr(c["rx_hds_bytes"], c["rx_packets"])
			hdsPay = strconv.FormatUint(c["rx_hds_payload_bytes"], 10)
			if _, ok := c["rx_gro_skbs"]; ok {
				segs = ratioStr(c["rx_gro_packets"], c["rx_gro_skbs"])
				fl = strconv.FormatUint(c["rx_gro_frag_list"], 10)
			}
		}
		fmt.Fprintf(tw, "%s\t%.2f (%.2f-%.2f)\t%s\t%.3f\t%.3f\t%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.name, g, lo, hi, ratio, rx, sys, nic*100, fpr, ppp, hdsPkt, hdsPay, segs, fl, last.congestion)
	}
	tw.Flush()
}

// printPoolBench prints seed 001's figures: distinct pages per GRO packet
// and pool memory per RX ring slot, with throughput.
func printPoolBench(w io.Writer, rows []benchRow, results [][]sample) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "configuration\tGbit/s (min-max)\trx CPU s/GB\tpages/GRO pkt\tpeak pool bytes/ring slot\tpeak pool MB\tpages 1|2|3-4|5-8|9-16|17-32|33-64|65+\tcc\t")
	for i, r := range rows {
		ss := results[i]
		g, lo, hi := median(field(ss, func(s sample) float64 { return s.gbps }))
		rx, _, _ := median(field(ss, func(s sample) float64 { return s.rxCPUPerGB }))
		held, _, _ := median(field(ss, func(s sample) float64 { return float64(s.peakHeld) }))
		c := ss[len(ss)-1].counters
		var hist []string
		for _, b := range []string{"1", "2", "3_4", "5_8", "9_16", "17_32", "33_64", "65_plus"} {
			hist = append(hist, strconv.FormatUint(c["rx_pkt_pages_"+b], 10))
		}
		fmt.Fprintf(tw, "%s\t%.2f (%.2f-%.2f)\t%.3f\t%s\t%.0f\t%.1f\t%s\t%s\t\n",
			r.name, g, lo, hi, rx, ratioStr(c["rx_gro_pkt_pages"], c["rx_gro_pkt_paged"]),
			held/float64(driver.DefaultRingSize), held/1e6, strings.Join(hist, "|"), ss[len(ss)-1].congestion)
	}
	tw.Flush()
}

// printHWGROBench prints seed 002's figures: throughput, CPU, frags per
// packet and the share of payload bytes in page-sized, page-aligned frags.
func printHWGROBench(w io.Writer, rows []benchRow, results [][]sample) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "configuration\tGbit/s (min-max)\trx CPU s/GB\tNIC share\tframes/session\tfrags/session\tmappable share\tread in pages\tsegs/GRO pkt\tcc\t")
	for i, r := range rows {
		ss := results[i]
		g, lo, hi := median(field(ss, func(s sample) float64 { return s.gbps }))
		rx, _, _ := median(field(ss, func(s sample) float64 { return s.rxCPUPerGB }))
		nic, _, _ := median(field(ss, func(s sample) float64 { return s.nicShare }))
		c := ss[len(ss)-1].counters
		share := "-"
		if p := c["rx_gro_hw_payload_bytes"]; p > 0 {
			share = fmt.Sprintf("%.0f%%", 100*float64(c["rx_gro_hw_mappable_bytes"])/float64(p))
		}
		// What ReadViews handed over in whole pages, without a copy.
		read := "-"
		if t := c["zc_read_mapped_bytes"] + c["zc_read_copied_bytes"]; t > 0 {
			read = fmt.Sprintf("%.0f%%", 100*float64(c["zc_read_page_bytes"])/float64(t))
		}
		fmt.Fprintf(tw, "%s\t%.2f (%.2f-%.2f)\t%.3f\t%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.name, g, lo, hi, rx, nic*100,
			ratioStr(c["rx_gro_hw_packets"], c["rx_gro_hw_sessions"]), ratioStr(c["rx_gro_hw_frags"], c["rx_gro_hw_sessions"]), share, read,
			ratioStr(c["rx_gro_packets"], c["rx_gro_skbs"]), ss[len(ss)-1].congestion)
	}
	tw.Flush()
}

func ratioStr(a, b uint64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(a)/float64(b))
}
