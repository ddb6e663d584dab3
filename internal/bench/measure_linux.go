package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// benchPort is the port the receiver of a bench row listens on.
const benchPort = 5001

// Measure starts a receiver for row on the bed's TAP, runs the kernel
// sender (`exe send`, exe being the ustack binary, in the bed's namespace;
// or the iperf3 client with ClientIPerf3) for dur with congestion control
// cc and writes of wsize bytes, and measures. It needs root.
// A kernel row (Row.Kernel) measures the kernel's TCP in peer's namespace
// over a veth pair instead (NewKernelPeer); peer may be nil otherwise.
func Measure(bed *testbed.TAPBed, peer *KernelPeer, exe string, row Row, dur time.Duration, cc string, wsize int) (s Sample, err error) {
	labelled(func() {
		if row.Kernel {
			s, err = measureKernel(bed, peer, exe, row, dur, cc, wsize)
			return
		}
		s, err = measure(bed, exe, row, dur, cc, wsize)
	}, "row", row.Name)
	return s, err
}

func measure(bed *testbed.TAPBed, exe string, row Row, dur time.Duration, cc string, wsize int) (Sample, error) {
	var s Sample
	st, err := openTarget(bed, row)
	if err != nil {
		return s, err
	}
	defer st.Close()
	ap := netip.AddrPortFrom(bed.StackAddr4.Addr(), benchPort)
	var received atomic.Uint64
	if row.Client == ClientIPerf3 {
		stop, err := serveIPerf3(st.Stack, ap, &received)
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
		go func() { served <- discard(row.Policy)(l, &received) }()
		defer func() { l.Close(); <-served }()
	}

	ru0, sys0 := rusage(), machineCPU()
	var nic0 int64
	if d := st.Driver(); d != nil {
		nic0 = d.Stats().NICCPUNanos.Load()
	}
	stopSampling := samplePool(st, &s.peakHeld)
	var res SendResult
	if row.Client == ClientIPerf3 {
		res, err = sendIPerf3(bed.NS, ap, iperf3Options{dur: dur, streams: max(1, row.Streams), cc: cc, wsize: wsize})
		stopSampling()
		if err != nil {
			return s, fmt.Errorf("sender: %w", err)
		}
	} else {
		res, err = sendBuiltin(bed, exe, ap, row, dur, cc, wsize)
		stopSampling()
		if err != nil {
			return s, err
		}
	}
	// Everything sent must arrive before the figures are taken.
	if err := waitReceived(&received, uint64(res.Bytes)); err != nil {
		return s, err
	}
	ru1 := rusage()
	s.fill(res, ru1-ru0, machineCPU()-sys0)
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
func samplePool(st *target, peak *int64) (stop func()) {
	if st.Driver() == nil {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			var held int64 // over every queue's pool
			for q := range st.Queues() {
				held += st.QueueDriver(q).Pool().Stats().BytesHeld
			}
			*peak = max(*peak, held)
			select {
			case <-t.C:
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-finished }
}

// openTarget opens the bed's TAP from inside its namespace and builds the
// row's stack on it.
func openTarget(bed *testbed.TAPBed, row Row) (*target, error) {
	addrs := []netip.Prefix{bed.StackAddr4, bed.StackAddr6}
	if row.Stock {
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
			MTU:            uint32(row.MTU),
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
		return &target{Stack: st, tap: tap}, nil
	}
	cfg, err := row.Policy.StackConfig()
	if err != nil {
		return nil, err
	}
	if err := openWire(bed, row.Policy, &cfg, row.Queues); err != nil {
		return nil, err
	}
	cfg.Addrs = addrs
	st, err := stack.New(cfg)
	if err != nil {
		return nil, err
	}
	return &target{Stack: st}, nil
}

// target is a stack under measurement and the TAP it owns when the
// stack does not (gVisor's fdbased endpoint leaves its fd open).
type target struct {
	*stack.Stack
	tap io.Closer
}

func (b *target) Close() error {
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

// runSender runs cmd, a sender, and returns what it printed.
func runSender(cmd *exec.Cmd) ([]byte, error) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("sender: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// parseSendResult reads the sender's result, the last line it printed.
func parseSendResult(out []byte, res *SendResult) error {
	if err := json.Unmarshal(lastLine(out), res); err != nil {
		return fmt.Errorf("sender output %q: %v", out, err)
	}
	return nil
}

func lastLine(b []byte) []byte {
	b = bytes.TrimSpace(b)
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}
