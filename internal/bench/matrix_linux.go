package bench

// ustack bench -matrix: the test matrix of the mlx5 header-copy patch: every cell of
// {TCP 64 KB, 512 KB writes; UDP 64 B, 1400 B datagrams} x {poll loop and
// reader on one core, on adjacent cores} x {MTU 1500, 4096, 9000} x {LRO
// on, off} x {tunnel off, on}, with a kernel sender in a namespace, and
// policies A and B (and the peers) interleaved in each cell.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// The kernel peer's veth link: its sender end in the bed's namespace, its
// receiver end in a namespace of its own.
var (
	vethSend = netip.MustParsePrefix("10.78.0.1/24")
	vethRecv = netip.MustParsePrefix("10.78.0.2/24")
)

const matrixPort = 5001

// MatrixConfig is a matrix run as `ustack bench -matrix` parsed it.
type MatrixConfig struct {
	Exe       string    // the ustack binary: the sender runs as `Exe send ...` in the TAP's namespace
	Command   string    // the command line, for the report
	Start     time.Time // when the command started, for the report and the wall time
	Dur       time.Duration
	Rounds    int
	CC        string   // congestion control of the kernel TCP sender
	Dims      Dims     // the cells
	Sides     []Side   // in the order they run in each cell: A and B (or ustack), then the peers
	AB        bool     // Sides[0] and Sides[1] are A and B
	Peers     bool     // Sides has the stock and kernel peers: build the kernel's veth pair
	Threshold float64  // percent
	Base      []string // policy settings of every ustack side
	Policy    ParsePolicy
	Verbose   bool   // a line per run on stderr
	JSON      string // files to write the report to ("": none)
	CSV       string
	Plot      string // .svg or .png
}

// Matrix runs the matrix of cfg: it builds the namespaces, the TAP and
// (with peers) the veth pair, measures every cell, prints the report on
// stdout, writes the files cfg names and removes what it built, also on
// SIGINT or SIGTERM. It needs root.
func Matrix(cfg MatrixConfig) error {
	start, sides, dims := cfg.Start, cfg.Sides, cfg.Dims
	cpus, err := allowedCPUs()
	if err != nil {
		return err
	}
	env := &matrixEnv{exe: cfg.Exe, dur: cfg.Dur, cc: cfg.CC, base: cfg.Base, policy: cfg.Policy, verbose: cfg.Verbose, pollCPU: cpus[0],
		readerCPU: map[string]int{"same": cpus[0], "adjacent": -1}}
	if len(cpus) > 1 {
		env.readerCPU["adjacent"] = cpus[1]
	}

	rep := &matrixReport{Sides: sides, Threshold: cfg.Threshold, AB: cfg.AB}
	rep.Meta = matrixMeta{Start: start.UTC(), Command: cfg.Command, Kernel: kernelRelease(),
		CPUs: len(cpus), Congestion: cfg.CC, RunSeconds: cfg.Dur.Seconds(), Rounds: cfg.Rounds, BaseSettings: cfg.Base,
		PollCPU: env.pollCPU, ReaderCPUs: [2]int{env.readerCPU["same"], env.readerCPU["adjacent"]},
		Sender: "ustack send (kernel sockets) in the TAP's namespace"}
	for _, c := range dims.Cells() {
		cr := &matrixCellResult{Cell: c, Runs: make([][]matrixRun, len(sides))}
		switch {
		case env.readerCPU[c.Core] < 0:
			cr.Skip = "one CPU: no adjacent core"
		}
		rep.Cells = append(rep.Cells, cr)
	}

	cl := &Closers{}
	stopSig := testbed.CleanupOnSignal(cl)
	defer stopSig()
	defer cl.Close()
	env.bed, err = testbed.NewTAPBed(testbed.TAPConfig{Prefix: "ustack-matrix", TAPName: "umxtap0", MTU: dims.MTUs[0]})
	if err != nil {
		return err
	}
	cl.Add(env.bed)
	env.mtu = dims.MTUs[0]
	skipTunnelCells(env.bed, rep)
	if cfg.Peers {
		if env.rx, err = testbed.NewNetns("ustack-matrix-rx"); err != nil {
			return err
		}
		cl.Add(env.rx)
		if err := testbed.NewVethPair(env.bed.NS, env.rx, "umx0", "umx1", env.mtu); err != nil {
			return err
		}
		if err := env.bed.NS.IP("addr", "add", vethSend.String(), "dev", "umx0"); err != nil {
			return err
		}
		if err := env.rx.IP("addr", "add", vethRecv.String(), "dev", "umx1"); err != nil {
			return err
		}
	}
	printMatrixHeader(os.Stdout, env, rep, dims)

	err = runMatrix(env, rep, dims, cfg.Rounds)
	rep.Meta.WallSeconds = time.Since(start).Seconds()
	if perr := rep.Print(os.Stdout); perr != nil && err == nil {
		err = perr
	}
	fmt.Printf("\nwall time %s\n", time.Since(start).Round(time.Second))
	if cfg.JSON != "" {
		err = errors.Join(err, writeFile(cfg.JSON, rep.WriteJSON))
	}
	if cfg.CSV != "" {
		err = errors.Join(err, writeFile(cfg.CSV, rep.WriteCSV))
	}
	if cfg.Plot != "" {
		err = errors.Join(err, writeMatrixPlot(cfg.Plot, rep))
	}
	return err
}

// runMatrix measures every cell that is not skipped: MTU by MTU (the TAP's
// MTU changes between them), and in each cell rounds rounds of the sides
// in turn. It stops early after maxFailures failed runs in a row.
func runMatrix(env *matrixEnv, rep *matrixReport, dims Dims, rounds int) error {
	const maxFailures = 5
	order := make([]int, 0, len(rep.Cells))
	total := 0
	for i, c := range rep.Cells {
		if c.Skip != "" {
			continue
		}
		order = append(order, i)
		total += rounds * len(env.sidesFor(rep, c.Cell))
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ca, cb := rep.Cells[a].Cell, rep.Cells[b].Cell
		if d := slices.Index(dims.MTUs, ca.MTU) - slices.Index(dims.MTUs, cb.MTU); d != 0 {
			return d
		}
		return strings.Compare(ca.Tunnel, cb.Tunnel)
	})
	prog := newProgress(total)
	defer prog.Done()
	failures := 0
	for n, ci := range order {
		c := rep.Cells[ci]
		if err := env.setMTU(c.Cell.MTU); err != nil {
			return err
		}
		for r := 1; r <= rounds; r++ {
			for _, si := range env.sidesFor(rep, c.Cell) {
				side := rep.Sides[si]
				prog.Show(c.Cell.Label(), n+1, len(order), r, rounds, side.Name)
				run := env.run(c.Cell, side, r)
				prog.Step()
				c.Runs[si] = append(c.Runs[si], run)
				if env.verbose || run.Error != "" {
					prog.Done()
					msg := fmt.Sprintf("%.2f %s, rx CPU %.3f s/GB, set-up %.0f ms", run.Value, run.Unit, run.RxCPUPerGB, run.SetupSeconds*1000)
					if run.Error != "" {
						msg = "failed: " + run.Error
					}
					fmt.Fprintf(os.Stderr, "%s | %s round %d: %s\n", c.Cell.Label(), side.Name, r, msg)
				}
				if run.Error == "" {
					failures = 0
				} else if failures++; failures >= maxFailures {
					return fmt.Errorf("%d runs failed in a row, the last: %s", failures, run.Error)
				}
			}
		}
	}
	return nil
}

// matrixEnv is what the runs share: the TAP bed, the kernel peer's
// namespace, the sender and the CPUs.
type matrixEnv struct {
	bed       *testbed.TAPBed
	rx        *testbed.Netns // the kernel peer's receiver namespace; nil without -peers
	mtu       int            // the links' MTU now
	exe       string
	dur       time.Duration
	cc        string
	base      []string // policy settings of every ustack side
	policy    ParsePolicy
	pollCPU   int
	readerCPU map[string]int // by core value; -1: not available
	verbose   bool
}

// skipTunnelCells marks the tunnel cells of rep skipped when the kernel
// cannot make the tunnel (testbed.ErrNoIP6Tunnel), after one try.
func skipTunnelCells(bed *testbed.TAPBed, rep *matrixReport) {
	for _, cr := range rep.Cells {
		if cr.Cell.Tunnel != "ip6tnl" || cr.Skip != "" {
			continue
		}
		tun, err := bed.AddIP6Tunnel(testbed.IP6TunnelConfig{})
		if err == nil {
			tun.Close()
			return
		}
		if !errors.Is(err, testbed.ErrNoIP6Tunnel) {
			return // the cells' runs report it
		}
		for _, c := range rep.Cells {
			if c.Cell.Tunnel == "ip6tnl" && c.Skip == "" {
				c.Skip = testbed.ErrNoIP6Tunnel.Error()
			}
		}
		return
	}
}

// sidesFor lists the indexes of the sides that run in cell: the peers do
// not run in tunnel cells (they have no decap).
func (e *matrixEnv) sidesFor(rep *matrixReport, cell matrixCell) []int {
	var out []int
	for i, s := range rep.Sides {
		if s.Peer() && cell.Tunnel != "off" {
			continue
		}
		out = append(out, i)
	}
	return out
}

// setMTU sets the MTU of the TAP and of the veth pair.
func (e *matrixEnv) setMTU(mtu int) error {
	if mtu == e.mtu {
		return nil
	}
	m := strconv.Itoa(mtu)
	if err := e.bed.NS.IP("link", "set", "dev", e.bed.TAPName, "mtu", m); err != nil {
		return err
	}
	e.bed.MTU = mtu
	if e.rx != nil {
		if err := e.bed.NS.IP("link", "set", "dev", "umx0", "mtu", m); err != nil {
			return err
		}
		if err := e.rx.IP("link", "set", "dev", "umx1", "mtu", m); err != nil {
			return err
		}
	}
	e.mtu = mtu
	return nil
}

// run measures one side in one cell once.
func (e *matrixEnv) run(cell matrixCell, side Side, round int) matrixRun {
	r := matrixRun{Cell: cell.Label(), Proto: cell.Proto.Name, Core: cell.Core, MTU: cell.MTU, LRO: cell.LRO, Tunnel: cell.Tunnel,
		Side: side.Name, Round: round, Unit: cell.Proto.Unit(), PollCPU: -1, ReaderCPU: e.readerCPU[cell.Core]}
	var err error
	labelled(func() { err = e.measure(cell, side, &r) }, "cell", cell.Label(), "row", side.Name)
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

// measure builds the side's receiver, runs the sender and fills r.
func (e *matrixEnv) measure(cell matrixCell, side Side, r *matrixRun) error {
	setup := time.Now()
	var sk sink
	defer sk.close()
	var rc receiver
	var err error
	switch side.Kind {
	case "ustack", "stock":
		rc, err = e.stackReceiver(cell, side, r, &sk)
	case "kernel":
		rc, err = e.kernelReceiver(cell, &sk)
	default:
		err = fmt.Errorf("unknown side kind %q", side.Kind)
	}
	if err != nil {
		return err
	}
	defer rc.close()
	r.SetupSeconds = time.Since(setup).Seconds()
	// The kernel's side of the link toward the receiver: its tx drops are
	// what the receiver did not take in time (the TAP's queue was full).
	link0, err := linkStats(e.bed.NS, rc.linkDev)
	if err != nil {
		return err
	}

	args := []string{"send", "-addr", rc.dst.String(), "-t", e.dur.String()}
	if cell.Proto.UDP {
		args = append(args, "-mode", "udp", "-size", strconv.Itoa(cell.Proto.Size), "-gso", strconv.Itoa(udpGSO(cell.Proto.Size)))
	} else {
		args = append(args, "-cc", e.cc, "-w", strconv.Itoa(cell.Proto.Size))
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.dur+30*time.Second)
	defer cancel()
	cmd := e.bed.NS.Exec(ctx, e.exe, args...)
	// If this process dies, so does the sender.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	ru0, sys0 := rusage(), machineCPU()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("sender: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	var res SendResult
	if err := json.Unmarshal(lastLine(out.Bytes()), &res); err != nil {
		return fmt.Errorf("sender output %q: %v", out.String(), err)
	}
	if res.Seconds <= 0 {
		return fmt.Errorf("sender output %q: no sending time", out.String())
	}
	if cell.Proto.UDP {
		sk.settle(3 * time.Second)
	} else {
		// Everything sent must arrive before the figures are taken.
		deadline := time.Now().Add(10 * time.Second)
		for sk.n.Load() < uint64(res.Bytes) && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
	}
	ru1, sys1 := rusage(), machineCPU()
	got := int64(sk.n.Load())
	r.Bytes, r.SentBytes, r.Seconds, r.Congestion = got, res.Bytes, res.Seconds, res.Congestion
	r.RxCPUSeconds, r.MachineCPUSeconds = (ru1 - ru0).Seconds(), sys1-sys0
	if got > 0 {
		gb := float64(got) / 1e9
		r.RxCPUPerGB, r.MachineCPUPerGB = r.RxCPUSeconds/gb, r.MachineCPUSeconds/gb
	}
	r.Counters = map[string]uint64{}
	rc.counters(r)
	if link1, err := linkStats(e.bed.NS, rc.linkDev); err == nil {
		for _, k := range slices.Sorted(maps.Keys(link1)) {
			addCounter(r, k, link1[k]-link0[k])
		}
	}
	if cell.Proto.UDP {
		r.DatagramsSent = res.Datagrams
		r.DatagramsReceived = got / int64(cell.Proto.Size)
		r.Value = float64(r.DatagramsReceived) / res.Seconds
		if got == 0 {
			return errors.New("no datagram arrived")
		}
		return nil
	}
	r.Value = float64(got) * 8 / res.Seconds / 1e6
	if got != res.Bytes {
		return fmt.Errorf("received %d bytes, sender wrote %d", got, res.Bytes)
	}
	return nil
}

// receiver is one side's receiving end in a run.
type receiver struct {
	dst      netip.AddrPort     // where the sender sends
	linkDev  string             // the kernel's device toward it, in the bed's namespace
	counters func(r *matrixRun) // adds the receiver's counters to r.Counters
	close    func()             // stops it (after its sockets are closed)
}

// addCounter adds a counter to r, keeping the order it was added in.
func addCounter(r *matrixRun, name string, v uint64) {
	r.Counters[name] = v
	r.order = append(r.order, name)
}

// stackReceiver builds a ustack side's stack (or gVisor's stock endpoint)
// on the bed's TAP with the cell's policy and its reader: TCP discard, a
// UDP train socket (stock: a gVisor UDP socket).
func (e *matrixEnv) stackReceiver(cell matrixCell, side Side, r *matrixRun, sk *sink) (receiver, error) {
	row := Row{Stock: side.Kind == "stock", MTU: cell.MTU}
	if !row.Stock {
		settings := slices.Concat(e.base, []string{"mtu=" + strconv.Itoa(cell.MTU), "lro=" + cell.LRO, "poll-cpu=" + strconv.Itoa(e.pollCPU)}, side.Settings)
		var err error
		if row.Policy, err = e.policy(settings); err != nil {
			return receiver{}, err
		}
		r.Policy = strings.Join(slices.Concat(e.base, side.Settings), " ")
		r.PollCPU = e.pollCPU
	}
	var st *target
	addr, untunnel := e.bed.StackAddr4.Addr(), func() {}
	var err error
	if row.Stock {
		st, err = openTarget(e.bed, row)
	} else {
		st, addr, untunnel, err = e.ustack(row.Policy, cell.Tunnel)
	}
	if err != nil {
		return receiver{}, err
	}
	rc := receiver{dst: netip.AddrPortFrom(addr, matrixPort), linkDev: e.bed.TAPName, close: func() { st.Close(); untunnel() }}
	cpu := e.readerCPU[cell.Core]
	var trains *stack.TrainConn
	switch {
	case !cell.Proto.UDP:
		l, err := st.ListenTCP(rc.dst)
		if err == nil {
			sk.serve(l, cpu, readViews(row.Policy))
		}
	case row.Stock:
		var pc net.PacketConn
		if pc, err = st.ListenUDP(rc.dst); err == nil {
			sk.add(pc)
			sk.read(cpu, func(b []byte) (int, error) { n, _, err := pc.ReadFrom(b); return n, err })
		}
	default:
		if trains, err = st.ListenUDPTrains(rc.dst); err == nil {
			trains.SetReadBuffer(benchUDPReadBuffer)
			sk.add(trains)
			read := func(b []byte) (int, error) { n, _, _, err := trains.ReadTrain(b, time.Time{}); return n, err }
			if readViews(row.Policy) {
				read = trainTaker(trains)
			}
			sk.read(cpu, read)
		}
	}
	if err != nil {
		rc.close()
		return receiver{}, err
	}
	// The pools' peak, for the memory a policy costs (page-order's, say).
	var peak int64
	stopSampling := sync.OnceFunc(samplePool(st, &peak))
	closeRx := rc.close
	rc.close = func() { stopSampling(); closeRx() }
	rc.counters = func(r *matrixRun) {
		st.EachCounter(func(name string, v uint64) { addCounter(r, name, v) })
		if trains != nil {
			addCounter(r, "udp_train_drops", trains.Drops())
		}
		if st.Driver() != nil {
			stopSampling() // the run is over; peak is ours to read
			addCounter(r, "bench_pool_peak_bytes", uint64(peak))
		}
	}
	return rc, nil
}

// ustack builds a ustack stack with policy pol on the bed's TAP, as
// openTarget does, and in a tunnel cell with the tunnel (setupTunnel). It
// returns the address to send to and the tunnel's cleanup, for after the
// stack's Close.
func (e *matrixEnv) ustack(pol Policy, tunnel string) (st *target, dst netip.Addr, untunnel func(), err error) {
	cfg, err := pol.StackConfig()
	if err != nil {
		return nil, dst, nil, err
	}
	cfg.Addrs = []netip.Prefix{e.bed.StackAddr4, e.bed.StackAddr6}
	dst, untunnel = e.bed.StackAddr4.Addr(), func() {}
	if tunnel != "off" {
		setup := setupVXLAN
		if tunnel == "ip6tnl" {
			setup = setupTunnel
		}
		var cleanup func()
		if dst, cleanup, err = setup(e.bed, &cfg, false); err != nil {
			return nil, dst, nil, fmt.Errorf("tunnel: %w", err)
		}
		if cleanup != nil {
			untunnel = cleanup
		}
	}
	if err := openWire(e.bed, pol, &cfg, 0); err != nil {
		untunnel()
		return nil, dst, nil, err
	}
	s, err := stack.New(cfg) // closes the TAP on error
	if err != nil {
		untunnel()
		return nil, dst, nil, err
	}
	return &target{Stack: s}, dst, untunnel, nil
}

// kernelReceiver opens the kernel peer's socket in its namespace, across
// the veth pair: a TCP listener, or a UDP socket with UDP_GRO.
func (e *matrixEnv) kernelReceiver(cell matrixCell, sk *sink) (receiver, error) {
	rc := receiver{dst: netip.AddrPortFrom(vethRecv.Addr(), matrixPort), linkDev: "umx0", close: func() {}}
	cpu := e.readerCPU[cell.Core]
	proto := "Tcp"
	if cell.Proto.UDP {
		proto = "Udp"
		uc, err := e.rx.ListenUDP(rc.dst)
		if err != nil {
			return rc, err
		}
		sk.add(uc)
		if err := kernelUDPGRO(uc); err != nil {
			return rc, err
		}
		sk.read(cpu, uc.Read)
	} else {
		l, err := e.rx.ListenTCP(rc.dst)
		if err != nil {
			return rc, err
		}
		sk.serve(l, cpu, false)
	}
	snmp0, err := e.rx.SNMP(proto)
	if err != nil {
		return rc, err
	}
	rc.counters = func(r *matrixRun) {
		snmp1, err := e.rx.SNMP(proto)
		if err != nil {
			return
		}
		for _, k := range slices.Sorted(maps.Keys(snmp1)) {
			addCounter(r, "snmp_"+strings.ToLower(proto)+"_"+k, snmp1[k]-snmp0[k])
		}
	}
	return rc, nil
}

// linkStats returns the kernel's counters of dev in ns (`ip -s link`):
// link_rx_packets, link_tx_dropped and the like.
func linkStats(ns *testbed.Netns, dev string) (map[string]uint64, error) {
	out, err := ns.Output("-j", "-s", "link", "show", "dev", dev)
	if err != nil {
		return nil, err
	}
	var links []struct {
		Stats64 map[string]map[string]uint64 `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		return nil, fmt.Errorf("ip -s link show dev %s: %q: %v", dev, out, err)
	}
	m := map[string]uint64{}
	for dir, st := range links[0].Stats64 {
		for k, v := range st {
			m["link_"+dir+"_"+k] = v
		}
	}
	return m, nil
}

// udpGSO is the number of datagrams of size bytes the sender writes at
// once with UDP_SEGMENT: as many as fit an IPv4 datagram, at most 64 (the
// kernel's UDP_MAX_SEGMENTS before Linux 6.11, 128 since; 64 keeps the
// figures comparable with those taken before).
func udpGSO(size int) int { return min(64, (65535-20-8)/size) }

// benchUDPReadBuffer is the receive buffer every UDP receiver of the bench
// asks for (SO_RCVBUF semantics: the kernel, and ustack's TrainConn, double
// it), the kernel's and ustack's alike.
const benchUDPReadBuffer = 8 << 20

// kernelUDPGRO turns UDP_GRO on for the kernel peer's socket, so that it
// takes GSO trains whole as ustack's train socket does, and gives it a
// receive buffer of benchUDPReadBuffer.
func kernelUDPGRO(c *net.UDPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, benchUDPReadBuffer))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("kernel peer: UDP_GRO, SO_RCVBUFFORCE: %w", serr)
	}
	return nil
}

// sink is the receiving end of a run: sockets read by goroutines pinned to
// the reader's CPU, counting the bytes read.
type sink struct {
	n  atomic.Uint64
	wg sync.WaitGroup
	mu sync.Mutex
	// +checklocks:mu
	closers []io.Closer
	// +checklocks:mu
	closed bool
}

// add registers a socket for close; after close it is closed at once.
func (s *sink) add(c io.Closer) {
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.closers = append(s.closers, c)
	}
	s.mu.Unlock()
	if closed {
		c.Close()
	}
}

// read runs read on a new goroutine locked to its OS thread and pinned to
// cpu (unless cpu < 0) until read fails. The pinned thread exits with the
// goroutine, so its affinity goes nowhere else.
func (s *sink) read(cpu int, read func([]byte) (int, error)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if cpu >= 0 {
			driver.PinThread([]int{cpu})
		}
		buf := make([]byte, 256<<10)
		for {
			m, err := read(buf)
			if m > 0 {
				s.n.Add(uint64(m))
			}
			if err != nil {
				return
			}
		}
	}()
}

// serve accepts connections on l and reads each as read does: with
// TCPConn.ReadViews, in place, if views is set and the connection is
// ustack's.
func (s *sink) serve(l net.Listener, cpu int, views bool) {
	s.add(l)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.add(c)
			read := c.Read
			if tc, ok := c.(*stack.TCPConn); ok && views {
				read = viewReader(tc)
			}
			s.read(cpu, read)
		}
	}()
}

// viewReader returns a read function for sink.read that takes tc's bytes
// with ReadViews, at most len(b) at a time, and touches the first byte of
// each view before releasing it, as serve.DiscardViews does.
func viewReader(tc *stack.TCPConn) func([]byte) (int, error) {
	vs := make([]stack.View, 0, 256)
	return func(b []byte) (int, error) {
		var m int
		var err error
		vs, m, err = tc.ReadViews(vs[:0], len(b))
		for i := range vs {
			b[0] ^= vs[i].Bytes()[0]
			vs[i].Release()
		}
		return m, err
	}
}

// trainTaker returns a read function for sink.read that takes c's trains
// in place with TakeTrain and touches the first byte of each of their
// slices before releasing them, as viewReader does for TCP.
func trainTaker(c *stack.TrainConn) func([]byte) (int, error) {
	var t stack.Train
	slices := make([][]byte, 0, 64)
	return func(b []byte) (int, error) {
		if err := c.TakeTrain(&t, time.Time{}); err != nil {
			return 0, err
		}
		slices = t.Slices(slices[:0])
		for _, s := range slices {
			b[0] ^= s[0]
		}
		n := t.Len()
		t.Release()
		return n, nil
	}
}

// settle waits until the byte count has not moved for 100 ms, at most max.
func (s *sink) settle(max time.Duration) {
	deadline := time.Now().Add(max)
	last := s.n.Load()
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		n := s.n.Load()
		if n == last {
			return
		}
		last = n
	}
}

// close closes the sockets and waits for the readers to finish.
func (s *sink) close() {
	s.mu.Lock()
	cs := s.closers
	s.closers, s.closed = nil, true
	s.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i].Close()
	}
	s.wg.Wait()
}

// allowedCPUs lists the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var out []int
	for c := 0; c < 1024 && len(out) < set.Count(); c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("sched_getaffinity: no CPU")
	}
	return out, nil
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// printMatrixHeader says how the matrix is measured.
func printMatrixHeader(w io.Writer, env *matrixEnv, rep *matrixReport, dims Dims) {
	cells, skipped := len(rep.Cells), 0
	for _, c := range rep.Cells {
		if c.Skip != "" {
			skipped++
		}
	}
	var names []string
	for _, s := range rep.Sides {
		names = append(names, s.Name)
	}
	fmt.Fprintf(w, "ustack bench -matrix: %d cells (%d skipped), %v per run, %d round(s), sides interleaved per cell (%s)\n",
		cells, skipped, env.dur, rep.Meta.Rounds, strings.Join(names, " "))
	fmt.Fprintf(w, "sender: ustack send in netns %s (kernel sockets), TCP congestion control %s (asked per socket; the cc column is what the socket reported), UDP with UDP_SEGMENT (%d per write at 64 B, %d at 1400 B)\n",
		env.bed.NS.Name, env.cc, udpGSO(64), udpGSO(1400))
	fmt.Fprintf(w, "receiver: a fresh stack per run on TAP %s; poll loop pinned to CPU %d, application reader (TCP discard, UDP train socket) locked to its thread on CPU %d (core same) or %d (core adjacent); TCP in Mbit/s, UDP in datagrams/s received; medians (min-max); CPU s/GB: this process (rx) and the machine\n",
		env.bed.TAPName, env.pollCPU, env.readerCPU["same"], env.readerCPU["adjacent"])
	if len(env.base) > 0 {
		fmt.Fprintf(w, "every ustack side: %s\n", strings.Join(env.base, " "))
	}
	for _, s := range rep.Sides {
		switch s.Kind {
		case "ustack":
			if rep.AB {
				fmt.Fprintf(w, "%s: %s\n", s.Name, strings.Join(s.Settings, " "))
			}
		case "stock":
			fmt.Fprintln(w, "stock: gVisor's stock fdbased endpoint on the same TAP (no vnet header, no offloads); reader pinned, its dispatcher not")
		case "kernel":
			fmt.Fprintf(w, "kernel: the kernel's TCP/UDP (UDP_GRO) receiver in netns %s over a veth pair from the sender's namespace; reader pinned, softirq not; its tcp_rmem %s\n", env.rx.Name, sysctlLine(env.rx, "net.ipv4.tcp_rmem"))
		}
	}
	fmt.Fprintf(w, "TCP receive buffers: ustack's grow to %d bytes unless -tcp-rmem-max says otherwise; the sender's tcp_wmem %s\n\n",
		stack.DefaultTCPReceiveBufferMax, sysctlLine(env.bed.NS, "net.ipv4.tcp_wmem"))
}

// sysctlLine returns a sysctl's value as ns sees it (its /proc/sys file,
// read from inside ns), its whitespace collapsed, or "?".
func sysctlLine(ns *testbed.Netns, name string) string {
	var b []byte
	err := ns.Do(func() (err error) {
		b, err = os.ReadFile("/proc/sys/" + strings.ReplaceAll(name, ".", "/"))
		return err
	})
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b)), " ")
}
