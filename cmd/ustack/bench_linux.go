package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/bench"
	"github.com/ustack/ustack/internal/testbed"
)

// benchCmd is `ustack bench`: it parses the flags, builds the rows and the
// bed, and measures the rows round by round (internal/bench measures one).
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
		kernel  = fs.Bool("kernel", true, "add a row for the kernel's TCP over a veth pair from the sender's namespace, the same sender and discard reader (not with -client iperf3, -pool or -hwgro)")
		pool    = fs.Bool("pool", false, "measure page recycling (mlx4's page-recycling patch) on the cyclic RQ (mlx4's ring): recycle off (an order-0 page per RX slot, as mlx4 before the patch) and on (frames packed into pages, a quarantine half, high-order allocations split into order-0 units) at 4k/64k pages, LRO off")
		streams = fs.String("P", "1", "parallel TCP streams: a list runs every row with each count (e.g. 1,4,8)")
		queues  = fs.String("queues", "", "run the ustack rows on a multi-queue TAP with each of these queue counts (e.g. 1,2; with -P 4,8): flows spread over the queues by the kernel")
		hwgro   = fs.Bool("hwgro", false, "measure hardware GRO (the SHAMPO coalescing patch): software GRO only, hw-gro on, hw-gro coalesce, LRO off")
		cpump   = fs.Bool("cpumap", false, "measure cpumap (the cpumap GRO patch): UDP 64 B and TCP_RR without cpumap and through it with its GRO off and on")
		rr      = fs.Bool("rr", false, "measure TCP request/response latency: ustack's echo against the kernel's TCP over a veth and the TAP floor (a stateless reflector on the TAP, blocking and busy), 64 B, one connection")
		spf     = fs.Bool("sockperf", false, "measure with Debian's sockperf client: ping-pong, 64 B, TCP and UDP, against ustack's sockperf server and the kernel's `sockperf server` over a veth")
		cpuprof = fs.String("cpuprofile", "", "write a CPU profile of the whole run (every row) to this file")
		client  = fs.String("client", bench.ClientBuiltin, "TCP sender: builtin (ustack send, a kernel socket of ours) or iperf3 (the iperf3 client against ustack's iperf3 server)")
	)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	stopProf, err := startCPUProfile(*cpuprof)
	if err != nil {
		return err
	}
	defer stopProf()
	if *dur <= 0 || *dur > time.Minute || *rounds < 1 || *rounds > 50 {
		return usageError{errors.New("want 0 < -t <= 1m and 1 <= -rounds <= 50")}
	}
	sender := "kernel sender (ustack send)"
	switch *client {
	case bench.ClientBuiltin:
	case bench.ClientIPerf3:
		if *cpump || os.Geteuid() != 0 {
			return usageError{errors.New("-client iperf3 needs root and does not apply to -cpumap")}
		}
		v, err := bench.IPerf3Version()
		if err != nil {
			return err
		}
		sender = "iperf3 client (" + v + ")"
	default:
		return usageError{fmt.Errorf("-client %q: want builtin or iperf3", *client)}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "ustack bench: not root, so no TAP or namespace: measuring over the in-memory wire with a gVisor TCP sender instead")
		return bench.Mem(defaultRows(*mtu), *dur, *rounds)
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
		rows = append(rows, bench.Row{Name: "gVisor stock fdbased", Stock: true, MTU: *mtu})
	}
	if *pool || *hwgro || *client == bench.ClientIPerf3 {
		*kernel = false
	} else {
		// The TAP's own limit: a stateless sink on the same TAP, ACKing
		// what the same sender sends (it speaks no iperf3).
		rows = append(rows, bench.FloorSinkRow(*mtu))
	}
	bed, err := testbed.NewTAPBed(testbed.TAPConfig{Prefix: "ustack-bench", MTU: *mtu})
	if err != nil {
		return err
	}
	stopSig := testbed.CleanupOnSignal(bed)
	defer stopSig()
	defer bed.Close()
	var tunBed *testbed.TAPBed // for the rows on a TUN device
	for _, r := range rows {
		if r.TUN && tunBed == nil {
			if tunBed, err = testbed.NewTAPBed(testbed.TAPConfig{Prefix: "ustack-bench-tun", MTU: *mtu, TUN: true}); err != nil {
				return err
			}
			stopTunSig := testbed.CleanupOnSignal(tunBed)
			defer stopTunSig()
			defer tunBed.Close()
		}
	}
	var peer *bench.KernelPeer
	if *kernel && !*rr && !*cpump && !*spf {
		if peer, err = bench.NewKernelPeer(bed, *mtu); err != nil {
			return err
		}
		stopPeerSig := testbed.CleanupOnSignal(peer.Netns())
		defer stopPeerSig()
		defer peer.Close()
		rows = append(rows, bench.Row{Name: "kernel over veth", Kernel: true, MTU: *mtu})
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if *rr {
		return bench.RR(bed, exe, rrRows(*mtu), 64, *dur, *rounds)
	}
	if *spf {
		return bench.Sockperf(bed, rrRows(*mtu), 64, *dur, *rounds)
	}
	if *cpump {
		return bench.CPUMap(bed, exe, cpumapPaths(*mtu), *dur, *rounds)
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
		var expanded []bench.Row
		for _, n := range counts {
			for _, r := range rows {
				r.Streams = n
				r.Name = fmt.Sprintf("%s, %d streams", r.Name, n)
				expanded = append(expanded, r)
			}
		}
		rows = expanded
	}
	var qcounts []int
	for _, f := range strings.Split(*queues, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > driver.MaxQueues {
			return usageError{fmt.Errorf("-queues %q: want queue counts in 1..%d", *queues, driver.MaxQueues)}
		}
		qcounts = append(qcounts, n)
	}
	var mqBed *testbed.TAPBed
	if len(qcounts) > 0 {
		if mqBed, err = testbed.NewTAPBed(testbed.TAPConfig{Prefix: "ustack-bench-mq", MTU: *mtu, MultiQueue: true}); err != nil {
			return err
		}
		stopMQSig := testbed.CleanupOnSignal(mqBed)
		defer stopMQSig()
		defer mqBed.Close()
		var expanded []bench.Row
		for _, r := range rows {
			if r.Kernel || r.Stock || r.TUN || r.Floor {
				expanded = append(expanded, r)
				continue
			}
			base := r.Name
			for _, q := range qcounts {
				r.Queues = q
				r.Name = fmt.Sprintf("%s, %d queue%s", base, q, map[bool]string{true: "s"}[q > 1])
				expanded = append(expanded, r)
			}
		}
		rows = expanded
	}
	for i := range rows {
		rows[i].Client = *client
	}
	results := make([][]bench.Sample, len(rows))
	for r := 0; r < *rounds; r++ {
		for i, row := range rows {
			fmt.Fprintf(os.Stderr, "round %d/%d: %s ...\n", r+1, *rounds, row.Name)
			b := bed
			switch {
			case row.TUN:
				b = tunBed
			case row.Queues > 0:
				b = mqBed
			}
			var s bench.Sample
			var err error
			if row.Floor {
				s, err = bench.MeasureFloorSink(b, exe, row, *dur, *cc, *wsize)
			} else {
				s, err = bench.Measure(b, peer, exe, row, *dur, *cc, *wsize)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", row.Name, err)
			}
			results[i] = append(results[i], s)
		}
	}
	if *pool {
		fmt.Println("mlx4's page-recycling patch on the cyclic RQ (mlx4's kind of ring; mlx5's striding RQ is not measured here): recycle off = mlx4 before the patch, on = the patch")
		bench.PrintPool(os.Stdout, rows, results)
		return nil
	}
	if *hwgro {
		bench.PrintHWGRO(os.Stdout, rows, results)
		return nil
	}
	bench.PrintBench(os.Stdout, rows, results)
	bench.PrintQueueShares(os.Stdout, rows, results)
	return nil
}
