package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/driver/xsk"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
)

func runCmd(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var (
		pol     policy
		addrs   prefixList
		tap     = fs.String("tap", "", "TAP device to attach to (created if it does not exist)")
		discard = fs.String("discard", "", "serve TCP and UDP discard on [ADDR]:PORT")
		echo    = fs.String("echo", "", "serve TCP and UDP echo on [ADDR]:PORT")
		iperf3  = fs.String("iperf3", "", "serve the iperf3 protocol (iperf3 -s) on [ADDR]:PORT, e.g. :5201")
		stats   = fs.Duration("stats", 0, "print counters every DURATION (0: only at exit)")
		pcap    = fs.String("pcap", "", "write the packets as handed to gVisor (after GRO) to this pcap file")
		pcapW   = fs.String("pcap-wire", "", "write the frames as read from the TAP to this pcap file")
		metrics = fs.String("metrics", "", "serve every counter as Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9100)")
	)
	pol.register(fs)
	var srvFlags serverFlags
	srvFlags.register(fs)
	fs.Var(&addrs, "addr", "address of the stack with its prefix, e.g. 10.0.0.2/24 (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *tap == "" {
		return usageError{errors.New("-tap is required")}
	}
	if len(addrs) == 0 {
		return usageError{errors.New("-addr is required")}
	}
	if *stats < 0 {
		return usageError{fmt.Errorf("-stats %v: want a positive duration", *stats)}
	}
	cfg, err := pol.stackConfig()
	if err != nil {
		return usageError{err}
	}
	srvCfg, iperf3Cfg, err := srvFlags.config()
	if err != nil {
		return usageError{err}
	}
	// One Stats for every server: their counters, printed after the
	// stack's.
	var srvStats serve.Stats
	srvCfg.Stats, iperf3Cfg.Stats = &srvStats, &srvStats
	dport, err := parseServe("discard", *discard, addrs)
	if err != nil {
		return usageError{err}
	}
	eport, err := parseServe("echo", *echo, addrs)
	if err != nil {
		return usageError{err}
	}
	iport, err := parseServe("iperf3", *iperf3, addrs)
	if err != nil {
		return usageError{err}
	}

	for _, p := range []struct {
		path string
		dst  **stack.PcapWriter
	}{{*pcap, &cfg.Pcap}, {*pcapW, &cfg.PcapWire}} {
		if p.path == "" {
			continue
		}
		w, err := stack.CreatePcap(p.path)
		if err != nil {
			return usageError{err}
		}
		*p.dst = w
		defer func() {
			if err := w.Close(); err != nil {
				fmt.Fprintf(os.Stderr, "ustack run: %v\n", err)
			}
		}()
	}
	w, err := driver.OpenTAP(driver.TAPConfig{Name: *tap, VnetHdr: true, Offloads: true})
	if err != nil {
		return usageError{err} // a missing TAP or no permission: say so, exit 2
	}
	cfg.Wire = w
	cfg.Addrs = addrs
	s, err := stack.New(cfg)
	if err != nil {
		return err
	}
	counters := allCounters(s, &srvStats)
	if strings.HasPrefix(pol.xdp, "xsk:") {
		stopXSK, err := drainXSK(s, w)
		if err != nil {
			s.Close()
			return err
		}
		defer stopXSK()
	}
	var closers []io.Closer
	var wg sync.WaitGroup
	start := func(fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(); err != nil {
				fmt.Fprintf(os.Stderr, "ustack run: %v\n", err)
			}
		}()
	}
	for _, sv := range []struct {
		ap   netip.AddrPort
		echo bool
	}{{dport, false}, {eport, true}} {
		if !sv.ap.IsValid() {
			continue
		}
		l, err := s.ListenTCP(sv.ap)
		if err != nil {
			s.Close()
			return err
		}
		u, err := s.ListenUDP(sv.ap)
		if err != nil {
			l.Close()
			s.Close()
			return err
		}
		closers = append(closers, l, u)
		if sv.echo {
			start(func() error { return srvCfg.Echo(l) })
			start(func() error { return serve.UDPEcho(u) })
		} else {
			start(func() error { return pol.discardWith(srvCfg)(l, nil) })
			start(func() error { return serve.UDPDiscard(u, nil, nil) })
		}
	}
	if iport.IsValid() {
		iperf3Cfg.OnTest = logIPerf3
		srv, err := serve.ListenIPerf3(s, iport, iperf3Cfg)
		if err != nil {
			for _, c := range closers {
				c.Close()
			}
			s.Close()
			wg.Wait()
			return err
		}
		closers = append(closers, srv)
		start(srv.Serve)
	}
	if *metrics != "" {
		ml, err := net.Listen("tcp", *metrics)
		if err != nil {
			s.Close()
			return usageError{fmt.Errorf("-metrics %q: %w", *metrics, err)}
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(newCollector(counters))
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		closers = append(closers, srv)
		start(func() error {
			if err := srv.Serve(ml); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	fmt.Fprintf(os.Stderr, "ustack: on %s as %v, %s (mac %s)\n", *tap, addrs, pol.String(), net.HardwareAddr(stack.DefaultMAC[:]))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	var tick <-chan time.Time
	if *stats > 0 {
		t := time.NewTicker(*stats)
		defer t.Stop()
		tick = t.C
	}
	var rxErr error // receive died (the TAP's device deleted, say): exit 1
	for done := false; !done; {
		select {
		case <-tick:
			printCounters(os.Stdout, counters)
		case <-sig:
			done = true
		case <-s.Done():
			done = true
			if rxErr = s.Err(); rxErr == nil {
				rxErr = errors.New("the TAP was closed")
			}
		}
	}
	// Stop the servers first so that the final counters are final.
	for _, c := range closers {
		c.Close()
	}
	err = s.Close()
	wg.Wait()
	printCounters(os.Stdout, counters)
	if rxErr != nil {
		return fmt.Errorf("receive stopped: %w", rxErr)
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

// logIPerf3 prints one line on stderr for every iperf3 test served.
func logIPerf3(r serve.IPerf3Result) {
	if r.Protocol == "" {
		fmt.Fprintf(os.Stderr, "ustack: iperf3 connection from %s ended before a test: %v\n", r.Client, r.Err)
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
	fmt.Fprintln(os.Stderr, line)
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
