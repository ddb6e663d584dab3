package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack/serve"
)

// cpumapWorkload is one of the table's workloads.
type cpumapWorkload struct {
	name string
	args []string // ustack send arguments besides -addr and -t
	rr   bool     // request/response (transactions/s) rather than UDP (Mpps)
}

var cpumapWorkloads = []cpumapWorkload{
	{"UDP 64 B, UDP_SEGMENT x64 (USO)", []string{"-mode", "udp", "-size", "64", "-gso", "64"}, false},
	{"UDP 64 B, one per write", []string{"-mode", "udp", "-size", "64", "-gso", "0"}, false},
	{"TCP_RR 1 B", []string{"-mode", "rr", "-size", "1"}, true},
	// neper's tcp_rr with many flows, the cpumap GRO patch's TCP_RR workload: 32
	// connections, one transaction in flight on each.
	{"TCP_RR 1 B, 32 flows", []string{"-mode", "rr", "-size", "1", "-P", "32"}, true},
}

const cpumapPort = 9000

// CPUMap is `ustack bench -cpumap`: it runs every workload on every path,
// interleaved, rounds times, with `exe send` as the sender, and prints the
// table. paths[1] is the cpumap path with its GRO off, which the table
// compares with.
func CPUMap(bed *testbed.TAPBed, exe string, paths []Row, dur time.Duration, rounds int) error {
	type key struct{ w, p int }
	rates := map[key][]float64{}
	drops := map[key][]float64{}
	fmt.Printf("ustack bench -cpumap: kernel sender in netns %s -> TAP -> ustack; NIC and poll loop on CPU 0, cpumap worker on CPU 1; UDP into a train socket (stack.ListenUDPTrains), TCP_RR into the echo server; %v per run, %d rounds interleaved\n", bed.NS.Name, dur, rounds)
	for r := 0; r < rounds; r++ {
		for wi, w := range cpumapWorkloads {
			for pi, p := range paths {
				fmt.Fprintf(os.Stderr, "round %d/%d: %s, %s ...\n", r+1, rounds, w.name, p.Name)
				var rate, drop float64
				var err error
				labelled(func() { rate, drop, err = cpumapRun(bed, exe, p, w, dur) }, "workload", w.name, "row", p.Name)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", w.name, p.Name, err)
				}
				rates[key{wi, pi}] = append(rates[key{wi, pi}], rate)
				drops[key{wi, pi}] = append(drops[key{wi, pi}], drop)
			}
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tpath\trate (min-max)\tunit\tlost\tx cpumap gro off\t")
	for wi, w := range cpumapWorkloads {
		off, _, _ := Median(rates[key{wi, 1}])
		for pi, p := range paths {
			m, lo, hi := Median(rates[key{wi, pi}])
			d, _, _ := Median(drops[key{wi, pi}])
			unit, scale := "Mpps", 1e6
			if w.rr {
				unit, scale = "ktrans/s", 1e3
			}
			ratio := "-"
			if off > 0 {
				ratio = fmt.Sprintf("%.2f", m/off)
			}
			lost := "-"
			if !w.rr {
				lost = fmt.Sprintf("%.1f%%", d*100)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.3f (%.3f-%.3f)\t%s\t%s\t%s\t\n", w.name, p.Name, m/scale, lo/scale, hi/scale, unit, lost, ratio)
		}
	}
	return tw.Flush()
}

// cpumapRun measures one workload on one path: datagrams per second
// delivered to the socket (and the share the sender wrote that never
// arrived), or transactions per second.
func cpumapRun(bed *testbed.TAPBed, exe string, row Row, w cpumapWorkload, dur time.Duration) (rate, lost float64, err error) {
	st, err := openTarget(bed, row)
	if err != nil {
		return 0, 0, err
	}
	defer st.Close()
	ap := netip.AddrPortFrom(bed.StackAddr4.Addr(), cpumapPort)
	var got atomic.Int64
	done := make(chan struct{})
	if w.rr {
		l, err := st.ListenTCP(ap)
		if err != nil {
			return 0, 0, err
		}
		go func() { defer close(done); serve.Echo(l) }()
		defer func() { l.Close(); <-done }()
	} else {
		tc, err := st.ListenUDPTrains(ap)
		if err != nil {
			return 0, 0, err
		}
		tc.SetReadBuffer(benchUDPReadBuffer)
		go func() {
			defer close(done)
			buf := make([]byte, 65536)
			for {
				n, seg, _, err := tc.ReadTrain(buf, time.Time{})
				if err != nil {
					return
				}
				if seg > 0 {
					got.Add(int64((n + seg - 1) / seg))
				}
			}
		}()
		defer func() { tc.Close(); <-done }()
	}
	ctx, cancel := context.WithTimeout(context.Background(), dur+30*time.Second)
	defer cancel()
	args := append([]string{"send", "-addr", ap.String(), "-t", dur.String()}, w.args...)
	cmd := bed.NS.Exec(ctx, exe, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return 0, 0, fmt.Errorf("sender: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	var res SendResult
	if err := json.Unmarshal(lastLine(out.Bytes()), &res); err != nil {
		return 0, 0, fmt.Errorf("sender output %q: %v", out.String(), err)
	}
	if w.rr {
		return float64(res.Transactions) / res.Seconds, 0, nil
	}
	// Let what is in flight arrive.
	time.Sleep(200 * time.Millisecond)
	n := got.Load()
	if res.Datagrams > 0 {
		lost = 1 - float64(n)/float64(res.Datagrams)
	}
	return float64(n) / res.Seconds, lost, nil
}
