package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/driver/xsk"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
)

// runCmd is `ustack run`: parse, build, serve, wait; one cleanup, the
// runner's, undoes whatever was built on every path.
func runCmd(args []string) error {
	o, err := parseRun(args)
	if err != nil {
		return err
	}
	// Room for two: the first starts the shutdown, a second, sent before
	// the first was taken, still cuts its grace short.
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	open := func(name string) (driver.Wire, error) {
		if o.tun != "" {
			return openTUN(name)
		}
		return openWire(name, o.pol.plain, o.cfg.Driver.MTU, o.cfg.VXLAN != nil)
	}
	return newRunner(o, os.Stdout, os.Stderr).run(open, sig)
}

// run builds the stack on the wire open returns, serves and waits for a
// signal on sig; whatever it built is undone when it returns, on every
// path.
func (r *runner) run(open func(tap string) (driver.Wire, error), sig <-chan os.Signal) error {
	defer r.shutdown()
	if err := r.build(open); err != nil {
		return err
	}
	if err := r.serve(); err != nil {
		return err
	}
	return r.wait(sig)
}

// runOptions is run's command line, checked.
type runOptions struct {
	pol                   policy
	cfg                   stack.Config // pol's, finished
	tap, tun              string       // the device: a TAP, or a TUN
	queues                int          // -queues
	addrs                 prefixList
	discard, echo, iperf3 netip.AddrPort // invalid: not served
	sockperf              netip.AddrPort
	stats                 time.Duration
	grace                 time.Duration // -shutdown-grace
	pcap, pcapWire        string
	metrics               string
	srvCfg                serve.Config
	iperf3Cfg             serve.IPerf3Config
}

// parseRun parses and checks run's flags; every error is a usage error.
func parseRun(args []string) (*runOptions, error) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	o := &runOptions{}
	var discard, echo, iperf3, sockperf string
	fs.StringVar(&o.tap, "tap", "", "TAP device to attach to (created if it does not exist)")
	fs.StringVar(&o.tun, "tun", "", "TUN device to attach to instead of a TAP (created if it does not exist): IP packets, no Ethernet header, no ARP or NDP")
	fs.IntVar(&o.queues, "queues", 1, fmt.Sprintf("queues of the TAP or TUN (IFF_MULTI_QUEUE; 1..%d): a NIC model, ring, pool, poll loop and GRO each; -nic-cpu and -poll-cpu lists pin queue i to their i-th CPU", driver.MaxQueues))
	fs.StringVar(&discard, "discard", "", "serve TCP and UDP discard on [ADDR]:PORT")
	fs.StringVar(&echo, "echo", "", "serve TCP and UDP echo on [ADDR]:PORT")
	fs.StringVar(&iperf3, "iperf3", "", "serve the iperf3 protocol (iperf3 -s) on [ADDR]:PORT, e.g. :5201")
	fs.StringVar(&sockperf, "sockperf", "", "serve the sockperf protocol (sockperf server, TCP and UDP) on [ADDR]:PORT, e.g. :11111. TCP connections within the -server-* bounds (and twice -server-conns-per-source per /24 or /64), their read buffers from a shared 64 MiB (sockperf_buffer_waits), each message whole within 10s of its first byte (sockperf_message_timeouts)")
	fs.DurationVar(&o.stats, "stats", 0, "print counters every DURATION (0: only at exit)")
	fs.DurationVar(&o.grace, "shutdown-grace", defaultShutdownGrace, "on SIGINT or SIGTERM, give every TCP connection up to DURATION to deliver what was written and its FIN (Stack.Shutdown), then reset what is left; a second signal resets at once (0: reset at once)")
	fs.StringVar(&o.pcap, "pcap", "", "write the packets as handed to gVisor (after GRO) and the frames sent to this pcap file")
	fs.StringVar(&o.pcapWire, "pcap-wire", "", "write the frames as read from the TAP to this pcap file")
	fs.StringVar(&o.metrics, "metrics", "", "serve every counter as Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9100), and Go's profiles at http://ADDR/debug/pprof/")
	o.pol.register(fs)
	config := fs.String("config", configService, "where the policy switches start: service (stack.ServiceConfig, the policies measured fastest that are safe for any peer: the defaults below with "+strings.Join(serviceSettings(), " ")+") or mlx5 (the defaults below: the NIC and driver as mlx5 ships them, with the TAP's super-frames handed up whole as LRO); a switch given on the command line wins")
	var srvFlags serverFlags
	srvFlags.register(fs)
	fs.Var(&o.addrs, "addr", "address of the stack with its prefix, e.g. 10.0.0.2/24 (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if err := applyConfig(fs, *config); err != nil {
		return nil, usageError{err}
	}
	switch {
	case o.tap == "" && o.tun == "":
		return nil, usageError{errors.New("-tap or -tun is required")}
	case o.tap != "" && o.tun != "":
		return nil, usageError{errors.New("-tap and -tun: one device, a TAP or a TUN")}
	case o.tun != "" && o.pol.plain:
		return nil, usageError{errors.New("-tun with -wire plain: the plain wire (water) is a TAP's; a TUN is opened with offloads")}
	case o.queues < 1 || o.queues > driver.MaxQueues:
		return nil, usageError{fmt.Errorf("-queues %d: want 1 to %d", o.queues, driver.MaxQueues)}
	case o.queues > 1 && o.pol.plain:
		return nil, usageError{errors.New("-queues with -wire plain: water opens one queue; several are ustack's own TAP code's")}
	}
	if len(o.addrs) == 0 {
		return nil, usageError{errors.New("-addr is required")}
	}
	if o.stats < 0 {
		return nil, usageError{fmt.Errorf("-stats %v: want a positive duration", o.stats)}
	}
	if o.grace < 0 {
		return nil, usageError{fmt.Errorf("-shutdown-grace %v: want 0 or more", o.grace)}
	}
	var err error
	o.pol.l3 = o.tun != "" // -xdp's program then reads IP packets
	if o.cfg, err = o.pol.finish(); err != nil {
		return nil, usageError{err}
	}
	if o.srvCfg, o.iperf3Cfg, err = srvFlags.config(); err != nil {
		return nil, usageError{err}
	}
	for _, sv := range []struct {
		name, v string
		dst     *netip.AddrPort
	}{{"discard", discard, &o.discard}, {"echo", echo, &o.echo}, {"iperf3", iperf3, &o.iperf3}, {"sockperf", sockperf, &o.sockperf}} {
		if *sv.dst, err = parseServe(sv.name, sv.v, o.addrs); err != nil {
			return nil, usageError{err}
		}
	}
	return o, nil
}

// openTUN opens run's TUN as wireguard-go's tun_linux.go opens one:
// IFF_TUN|IFF_NO_PI|IFF_VNET_HDR with TUNSETOFFLOAD (CSUM, TSO4/6, USO4/6).
func openTUN(name string) (driver.Wire, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("-tun needs Linux's TUN (IFF_TUN with IFF_VNET_HDR); elsewhere use -tap with -wire plain")
	}
	return driver.OpenTAP(driver.TAPConfig{Name: name, VnetHdr: true, Offloads: true, TUN: true})
}

// openQueues opens n queues of run's multi-queue TAP or TUN.
func openQueues(name string, tun bool, n int) ([]*driver.TAP, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("-queues needs Linux's multi-queue TAP and TUN")
	}
	return driver.OpenTAPQueues(driver.TAPConfig{Name: name, VnetHdr: true, Offloads: true, TUN: tun}, n)
}

// openWire opens run's TAP: ustack's own TAP code, with the virtio-net
// header and offloads, or with -wire plain water's bare frames (the only
// wire outside Linux); with a VXLAN tunnel, with UDP tunnel GSO, so that
// the peer's tunnel super-frames come whole.
func openWire(name string, plain bool, mtu int, vxlan bool) (driver.Wire, error) {
	if plain && vxlan {
		return nil, fmt.Errorf("-tunnel vxlan needs ustack's own TAP code (-wire offload): water's plain TAP has no UDP tunnel GSO")
	}
	if plain {
		return driver.OpenWater(name, driver.MaxFrameLen(mtu))
	}
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("-wire offload needs Linux's TAP (IFF_VNET_HDR); use -wire plain on %s", runtime.GOOS)
	}
	return driver.OpenTAP(driver.TAPConfig{Name: name, VnetHdr: true, Offloads: true, UDPTunnel: vxlan})
}

// runner is a running `ustack run`: its stack, servers and the cleanup
// that undoes them.
type runner struct {
	o              *runOptions
	stdout, stderr io.Writer
	s              *stack.Stack
	srvStats       serve.Stats // every server's: printed after the stack's counters
	counters       func(func(name string, v uint64))
	wg             sync.WaitGroup // the servers' goroutines
	live           atomic.Int32   // of them, those running
	// cleanups undo what build and serve did; shutdown runs them last
	// first: the servers' listeners, then the stack (and the wait for the
	// servers' goroutines), then the pcap files.
	cleanups []func()
	closeErr error // the stack's Close
	// graceSig, once wait got a signal on it, makes the stack's cleanup
	// shut down gracefully first (drain); another signal on it cuts that
	// short.
	graceSig <-chan os.Signal
}

func newRunner(o *runOptions, stdout, stderr io.Writer) *runner {
	return &runner{o: o, stdout: stdout, stderr: stderr}
}

// onShutdown adds f to the cleanups.
func (r *runner) onShutdown(f func()) { r.cleanups = append(r.cleanups, f) }

// shutdown runs the cleanups, last first; a second call does nothing.
func (r *runner) shutdown() {
	for len(r.cleanups) > 0 {
		f := r.cleanups[len(r.cleanups)-1]
		r.cleanups = r.cleanups[:len(r.cleanups)-1]
		f()
	}
}

// logf prints one error line on stderr.
func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.stderr, "ustack run: "+format+"\n", args...)
}

// build opens the pcap files and the wire and starts the stack on it.
func (r *runner) build(open func(tap string) (driver.Wire, error)) error {
	cfg := r.o.cfg
	for _, p := range []struct {
		path string
		dst  **stack.PcapWriter
	}{{r.o.pcap, &cfg.Pcap}, {r.o.pcapWire, &cfg.PcapWire}} {
		if p.path == "" {
			continue
		}
		create := stack.CreatePcap
		if r.o.tun != "" {
			create = stack.CreateRawPcap // IP packets
		}
		w, err := create(p.path)
		if err != nil {
			return usageError{err}
		}
		*p.dst = w
		r.onShutdown(func() {
			if err := w.Close(); err != nil {
				r.logf("%v", err)
			}
		})
	}
	var w driver.Wire
	var err error
	if r.o.queues > 1 {
		var qs []*driver.TAP
		if qs, err = openQueues(r.o.device(), r.o.tun != "", r.o.queues); err != nil {
			return usageError{err}
		}
		w = qs[0]
		for _, q := range qs[1:] {
			cfg.Queues = append(cfg.Queues, q)
		}
	} else if w, err = open(r.o.device()); err != nil {
		return usageError{err} // a missing TAP or no permission: say so, exit 2
	}
	cfg.Wire = w
	cfg.Addrs = r.o.addrs
	if r.s, err = stack.New(cfg); err != nil {
		return err
	}
	r.onShutdown(func() {
		var err error
		if r.graceSig != nil && r.o.grace > 0 {
			err = r.drain(r.graceSig)
		}
		r.closeErr = errors.Join(err, r.s.Close())
		r.wg.Wait()
	})
	r.counters = allCounters(r.s, &r.srvStats)
	if strings.HasPrefix(r.o.pol.xdp, "xsk:") {
		stopXSK, err := drainXSK(r.s, w)
		if err != nil {
			return err
		}
		r.onShutdown(stopXSK)
	}
	return nil
}

// start runs fn in a server goroutine, printing its error.
func (r *runner) start(fn func() error) {
	r.wg.Add(1)
	r.live.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.live.Add(-1)
		if err := fn(); err != nil {
			r.logf("%v", err)
		}
	}()
}

// serve starts the servers the flags ask for and prints the startup line.
func (r *runner) serve() error {
	o := r.o
	srvCfg, iperf3Cfg := o.srvCfg, o.iperf3Cfg
	srvCfg.Stats, iperf3Cfg.Stats = &r.srvStats, &r.srvStats
	for _, sv := range []struct {
		ap   netip.AddrPort
		echo bool
	}{{o.discard, false}, {o.echo, true}} {
		if !sv.ap.IsValid() {
			continue
		}
		l, err := r.s.ListenTCP(sv.ap)
		if err != nil {
			return err
		}
		r.onShutdown(func() { l.Close() })
		u, err := r.s.ListenUDP(sv.ap)
		if err != nil {
			return err
		}
		r.onShutdown(func() { u.Close() })
		if sv.echo {
			r.start(func() error { return srvCfg.Echo(l) })
			r.start(func() error { return serve.UDPEcho(u) })
		} else {
			r.start(func() error { return o.pol.discardWith(srvCfg)(l, nil) })
			r.start(func() error { return serve.UDPDiscard(u, nil, nil) })
		}
	}
	if o.iperf3.IsValid() {
		iperf3Cfg.OnTest = func(res serve.IPerf3Result) { logIPerf3(r.stderr, res) }
		srv, err := serve.ListenIPerf3(r.s, o.iperf3, iperf3Cfg)
		if err != nil {
			return err
		}
		r.onShutdown(func() { srv.Close() })
		r.start(srv.Serve)
	}
	if o.sockperf.IsValid() {
		srv, err := serve.ListenSockperf(r.s, o.sockperf, srvCfg)
		if err != nil {
			return err
		}
		r.onShutdown(func() { srv.Close() })
		r.start(srv.Serve)
	}
	if o.metrics != "" {
		ml, err := net.Listen("tcp", o.metrics)
		if err != nil {
			return usageError{fmt.Errorf("-metrics %q: %w", o.metrics, err)}
		}
		srv := &http.Server{Handler: metricsMux(runCollector(r.s, &r.srvStats)), ReadHeaderTimeout: 5 * time.Second}
		r.onShutdown(func() { srv.Close() })
		r.start(func() error {
			if err := srv.Serve(ml); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if o.tun != "" {
		fmt.Fprintf(r.stderr, "ustack: on TUN %s as %v, %s\n", o.tun, o.addrs, o.pol.String())
	} else {
		fmt.Fprintf(r.stderr, "ustack: on %s as %v, %s (mac %s)\n", o.tap, o.addrs, o.pol.String(), net.HardwareAddr(stack.DefaultMAC[:]))
	}
	return nil
}

// wait prints the counters every -stats until a signal on sig or the end
// of the stack's receive, then shuts down and prints the final counters.
func (r *runner) wait(sig <-chan os.Signal) error {
	var tick <-chan time.Time
	if r.o.stats > 0 {
		t := time.NewTicker(r.o.stats)
		defer t.Stop()
		tick = t.C
	}
	var rxErr error // receive died (the TAP's device deleted, say): exit 1
	for done := false; !done; {
		select {
		case <-tick:
			printCounters(r.stdout, r.counters)
		case <-sig:
			done = true
			r.graceSig = sig
		case <-r.s.Done():
			done = true
			if rxErr = r.s.Err(); rxErr == nil {
				rxErr = errors.New("the TAP was closed")
			}
		}
	}
	// The servers stop first (their cleanups are the last added): they
	// close their connections, as close(2) does, and after a signal the
	// stack's Shutdown then lets those deliver what they queued, within
	// -shutdown-grace; so the final counters are final.
	r.shutdown()
	printCounters(r.stdout, r.counters)
	if rxErr != nil {
		return fmt.Errorf("receive stopped: %w", rxErr)
	}
	return r.closeErr
}

// defaultShutdownGrace is -shutdown-grace's default: a peer that reads
// acknowledges the FIN within a round trip, so this is for the slow
// readers, well inside what service managers give between SIGTERM and
// SIGKILL (systemd's TimeoutStopSec 90 s, Kubernetes'
// terminationGracePeriodSeconds 30 s).
const defaultShutdownGrace = 5 * time.Second

// drain shuts the stack down gracefully (Stack.Shutdown) for up to
// -shutdown-grace, or until another signal on sig, after which Shutdown
// resets the connections left. Either is logged, not an error; the error
// is the stack's Close's.
func (r *runner) drain(sig <-chan os.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.o.grace)
	defer cancel()
	stop, again := make(chan struct{}), make(chan bool, 1)
	go func() {
		select {
		case <-sig:
			cancel()
			again <- true
		case <-stop:
			again <- false
		}
	}()
	err := r.s.Shutdown(ctx)
	close(stop)
	if <-again && errors.Is(err, context.Canceled) {
		r.logf("second signal: connections reset")
	} else if errors.Is(err, context.DeadlineExceeded) {
		r.logf("-shutdown-grace %v over: connections reset", r.o.grace)
	}
	if err == context.DeadlineExceeded || err == context.Canceled {
		return nil // Close went well
	}
	return err
}

// parseServe parses [ADDR]:PORT for a server flag. An empty host serves on
// every address of the stack (IPv6 wildcard, dual-stack, when the stack has
// an IPv6 address).
func parseServe(name, v string, addrs []netip.Prefix) (netip.AddrPort, error) {
	if v == "" {
		return netip.AddrPort{}, nil
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("-%s %q: want [ADDR]:PORT", name, v)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return netip.AddrPort{}, fmt.Errorf("-%s %q: bad port", name, v)
	}
	if host != "" {
		a, err := netip.ParseAddr(host)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("-%s %q: bad address", name, v)
		}
		return netip.AddrPortFrom(a, uint16(p)), nil
	}
	any := netip.IPv4Unspecified()
	for _, a := range addrs {
		if a.Addr().Is6() {
			any = netip.IPv6Unspecified()
		}
	}
	return netip.AddrPortFrom(any, uint16(p)), nil
}

// logIPerf3 prints one line on w (stderr) for every iperf3 test served.
func logIPerf3(w io.Writer, r serve.IPerf3Result) {
	if r.Protocol == "" {
		fmt.Fprintf(w, "ustack: iperf3 connection from %s ended before a test: %v\n", r.Client, r.Err)
		return
	}
	dir := "received"
	bytes, bps := r.BytesReceived, r.ReceivedBitsPerSecond()
	switch {
	case r.Bidir:
		dir = "received+sent"
		bytes, bps = r.BytesReceived+r.BytesSent, r.ReceivedBitsPerSecond()+r.SentBitsPerSecond()
	case r.Reverse:
		dir = "sent"
		bytes, bps = r.BytesSent, r.SentBitsPerSecond()
	}
	line := fmt.Sprintf("ustack: iperf3 %s test from %s, %d streams: %s %d bytes in %.3fs, %.3f Gbit/s",
		r.Protocol, r.Client, r.Streams, dir, bytes, r.Duration.Seconds(), bps/1e9)
	if r.Protocol == "tcp" && (r.Reverse || r.Bidir) {
		line += fmt.Sprintf(", %d retransmits", r.Retransmits)
	}
	if r.Protocol == "udp" && !r.Reverse {
		line += fmt.Sprintf(", lost %d/%d datagrams, jitter %.3f ms", r.Lost, r.Packets, float64(r.Jitter)/1e6)
	}
	if r.Err != nil {
		line += fmt.Sprintf(", ended: %v", r.Err)
	}
	fmt.Fprintln(w, line)
}

// allCounters enumerates run's counters: the stack's, then its servers'.
func allCounters(s *stack.Stack, st *serve.Stats) func(func(name string, v uint64)) {
	return func(fn func(string, uint64)) {
		s.EachCounter(fn)
		st.EachCounter(fn)
	}
}

// printCounters prints every counter each enumerates as `ethtool -S` does.
func printCounters(w io.Writer, each func(func(name string, v uint64))) {
	fmt.Fprintln(w, "NIC statistics:")
	each(func(name string, v uint64) { fmt.Fprintf(w, "     %s: %d\n", name, v) })
}

// drainXSK serves `-xdp xsk:PORT`: it binds an AF_XDP socket to s and
// consumes its RX ring in a goroutine, handing every frame straight back
// to the fill ring (xdpsock's rxdrop); rx_xsk_packets counts them. The
// socket's TX side writes to w, unused. stop ends the goroutine.
func drainXSK(s *stack.Stack, w xsk.Wire) (stop func(), err error) {
	const frames = 2048 // the fill ring's size: every frame fits in it
	sock, err := xsk.New(xsk.Config{NumFrames: frames, FrameSize: 2048, FillSize: frames, RxSize: frames}, w)
	if err != nil {
		return nil, err
	}
	fill, rx := sock.Fill(), sock.RX()
	got, idx := fill.Reserve(frames)
	for i := range got {
		*fill.Entry(idx + i) = sock.UMEM().FrameAddr(int(i))
	}
	fill.Submit(got)
	if err := s.BindXSK(sock); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			n, ridx := rx.Peek(64)
			if n == 0 {
				time.Sleep(50 * time.Microsecond) // no wakeups: poll
				continue
			}
			// Cannot fail: the fill ring holds every frame.
			_, fidx := fill.Reserve(n)
			for i := range n {
				*fill.Entry(fidx + i) = rx.Entry(ridx + i).Addr
			}
			fill.Submit(n)
			rx.Release(n)
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}, nil
}

// device returns the name of run's device, the TAP's or the TUN's.
func (o *runOptions) device() string {
	if o.tun != "" {
		return o.tun
	}
	return o.tap
}
