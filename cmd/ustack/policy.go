package main

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
)

// policy holds the receive-path switches shared by run and bench.
type policy struct {
	mtu      int
	rq       string
	lro      string
	wireRead string
	hds      string
	gro      string
	hwGRO    string
	groFlush time.Duration
	budget   int
	coalesce int
	ring     int
	rqSize   int
	rqFull   string
	order    int
	pageSize string
	nicCPU   string
	pollCPU  string
	recycle  string
	xdp      string
	cpumap   string
	cpuGRO   string
	cpuQueue int
	poison   bool
	poolMem  int64
	rmemMax  int
	poolRing int
	zeroCopy string

	// The tunnel ustack terminates (-tunnel ip6tnl): see tunnelConfig.
	tunnel        string
	tunnelLocal   string
	tunnelRemote  string
	tunnelRemote4 string
	tunnelAddrs   prefixList

	tcpMem tcpMemFlags // -tcp-mem-limit, -tcp-mem-pressure
}

func (p *policy) register(fs *flag.FlagSet) {
	fs.IntVar(&p.mtu, "mtu", 1500, "IP MTU of the link")
	fs.StringVar(&p.rq, "rq", "striding", "receive queue: striding|cyclic")
	fs.StringVar(&p.lro, "lro", "on", "hand GSO super-frames up whole: on|off")
	fs.StringVar(&p.wireRead, "wire-read", "direct", "how the NIC model reads LRO super-frames: direct (readv straight into the ring's pages, as DMA) or bounce (into a buffer, then copied)")
	fs.StringVar(&p.hds, "hds", "auto", "header copy into the linear part: auto (minimal headers)|N bytes")
	fs.StringVar(&p.gro, "gro", "on", "software GRO on the poll loop: on|off")
	fs.StringVar(&p.hwGRO, "hw-gro", "off", "hardware GRO (SHAMPO): off|on|coalesce (coalesce: adjacent payloads extend one frag up to the page, seed 002); needs -lro off")
	fs.DurationVar(&p.groFlush, "gro-flush-timeout", 0, "keep GRO packets across poll batches until this old (gro_flush_timeout); 0 flushes at each batch end")
	fs.IntVar(&p.budget, "budget", driver.DefaultBudget, "NAPI budget: frames per poll batch")
	fs.IntVar(&p.coalesce, "coalesce-bytes", 0, "interrupt moderation by bytes: the NIC model publishes completions once they hold this many bytes, if before -budget frames (0: by frames only)")
	fs.IntVar(&p.ring, "rx-ring", driver.DefaultRingSize, "completion queue entries (power of two)")
	fs.StringVar(&p.rqFull, "rq-full", "stall", "when the RQ is full: stall (the NIC model waits for the poll loop, the wire queues) or drop (rx_drop_out_of_buffer, as a NIC without posted buffers)")
	fs.IntVar(&p.rqSize, "rq-size", 0, "receive queue depth in WQEs: ring memory the NIC model fills ahead of the poll loop (0: 8 striding WQEs, or -rx-ring frames with a buffer per frame)")
	fs.IntVar(&p.order, "page-order", 0, "RX page allocation order 0..4")
	fs.StringVar(&p.pageSize, "page-size", "4k", "base page size: 4k|64k")
	fs.StringVar(&p.recycle, "pool-recycle", "on", "recycle RX pages through the pool's quarantine ring (mlx4, seed 001): on|off (off: a fresh page for every frame)")
	fs.BoolVar(&p.poison, "pool-poison", false, "poison recycled pages and check them when reused (debug)")
	fs.Int64Var(&p.poolMem, "pool-mem", 0, "bytes the page pool may allocate (0: no limit); past it allocations fall back to lower orders, then drop")
	fs.IntVar(&p.poolRing, "pool-ring", 0, "pages the pool's quarantine ring holds (0: default)")
	fs.IntVar(&p.rmemMax, "tcp-rmem-max", 0, fmt.Sprintf("largest TCP receive buffer auto-tuning grows to, in bytes (tcp_rmem's max; 0: %d)", stack.DefaultTCPReceiveBufferMax))
	fs.StringVar(&p.zeroCopy, "zero-copy", "off", "payload to gVisor without a copy: off|on|views (views: the discard server also reads with TCPConn.ReadViews, in place)")
	fs.StringVar(&p.tunnel, "tunnel", "off", "terminate an IPv6 tunnel (IPv4-in-IPv6 and IPv6-in-IPv6, as ip6tnl mode any): off|ip6tnl; the driver decapsulates before GRO")
	fs.StringVar(&p.tunnelLocal, "tunnel-local", "", "with -tunnel ip6tnl: ustack's outer IPv6 address, dedicated to the tunnel (added to the TAP's NIC)")
	fs.StringVar(&p.tunnelRemote, "tunnel-remote", "", "with -tunnel ip6tnl: the peer's outer IPv6 address that encapsulated replies go to")
	fs.StringVar(&p.tunnelRemote4, "tunnel-remote4", "", "with -tunnel ip6tnl: the peer's outer address for IPv4 inside, if not -tunnel-remote")
	fs.Var(&p.tunnelAddrs, "tunnel-addr", "with -tunnel ip6tnl: ustack's inner address with its prefix, routed through the tunnel (repeatable)")
	fs.StringVar(&p.xdp, "xdp", "", "XDP program run on every frame: pass|drop|cpu:N|hash|drop-port:P|xsk:P (xsk:P: TCP/UDP to port P to an AF_XDP socket that run drains; empty: none)")
	fs.StringVar(&p.cpumap, "cpumap", "", "CPU list of the cpumap entries that redirects go to, e.g. 0,1 (empty: no cpumap)")
	fs.StringVar(&p.cpuGRO, "cpumap-gro", "on", "GRO in the cpumap workers: on|off")
	fs.IntVar(&p.cpuQueue, "cpumap-qsize", 0, "ring size of each cpumap entry (0: 2048)")
	fs.StringVar(&p.nicCPU, "nic-cpu", "", "pin the NIC model's thread to this CPU list (e.g. 1 or 0,1)")
	fs.StringVar(&p.pollCPU, "poll-cpu", "", "pin the poll loop's thread to this CPU list")
	p.tcpMem.register(fs)
}

// policyFromSettings returns the default policy with each name=value
// setting applied through the switch's own flag (registered on a throwaway
// FlagSet), so that every switch of run and bench works; later settings win.
// A leading "-" on a name is allowed.
func policyFromSettings(settings []string) (policy, error) {
	var p policy
	fs := flag.NewFlagSet("policy", flag.ContinueOnError)
	p.register(fs)
	for _, s := range settings {
		name, value, ok := strings.Cut(s, "=")
		name = strings.TrimLeft(strings.TrimSpace(name), "-")
		if !ok || fs.Lookup(name) == nil {
			return p, fmt.Errorf("policy %q: want name=value with a switch of ustack run", s)
		}
		if err := fs.Set(name, strings.TrimSpace(value)); err != nil {
			return p, fmt.Errorf("policy %q: %w", s, err)
		}
	}
	return p, nil
}

// splitSettings splits a list of name=value settings separated by commas
// or spaces ("hds=256, gro=off"). A piece without "=" continues the
// previous value, so list values keep their commas ("cpumap=0,1").
func splitSettings(s string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || unicode.IsSpace(r) }) {
		if !strings.Contains(f, "=") && len(out) > 0 {
			out[len(out)-1] += "," + f
			continue
		}
		out = append(out, f)
	}
	return out
}

// stackConfig turns the switches into a stack configuration.
func (p *policy) stackConfig() (stack.Config, error) {
	var c stack.Config
	var err error
	c.Driver.MTU = p.mtu
	if c.Driver.RQ, err = driver.ParseRQMode(p.rq); err != nil {
		return c, err
	}
	if c.Driver.RQDrop, err = choice("rq-full", p.rqFull, "stall", "drop"); err != nil {
		return c, err
	}
	if c.Driver.BounceRead, err = choice("wire-read", p.wireRead, "direct", "bounce"); err != nil {
		return c, err
	}
	if c.Driver.LRO, err = driver.ParseOnOff("lro", p.lro); err != nil {
		return c, err
	}
	if c.Driver.HDS, err = driver.ParseHDS(p.hds); err != nil {
		return c, err
	}
	gro, err := driver.ParseOnOff("gro", p.gro)
	if err != nil {
		return c, err
	}
	c.NoGRO = !gro
	if p.hwGRO == "" {
		p.hwGRO = "off"
	}
	if c.Driver.HWGRO, err = driver.ParseHWGRO(p.hwGRO); err != nil {
		return c, err
	}
	if p.groFlush < 0 {
		return c, fmt.Errorf("gro-flush-timeout %v: want >= 0", p.groFlush)
	}
	c.GROFlushTimeout = p.groFlush
	c.Driver.Budget = p.budget
	c.Driver.CoalesceBytes = p.coalesce
	c.Driver.RingSize = p.ring
	c.Driver.RQSize = p.rqSize
	c.Pool.Order = p.order
	switch p.pageSize {
	case "4k":
		c.Pool.PageSize = bufpool.PageSize4K
	case "64k":
		c.Pool.PageSize = bufpool.PageSize64K
	default:
		return c, fmt.Errorf("page-size %q: want 4k or 64k", p.pageSize)
	}
	recycle, err := driver.ParseOnOff("pool-recycle", p.recycle)
	if err != nil {
		return c, err
	}
	c.Pool.NoRecycle = !recycle
	c.Driver.PagePerFrame = !recycle
	c.Pool.Poison = p.poison
	if p.poolMem < 0 || p.poolRing < 0 {
		return c, fmt.Errorf("pool-mem and pool-ring: want >= 0")
	}
	c.Pool.MaxBytes = p.poolMem
	if p.rmemMax < 0 {
		return c, fmt.Errorf("tcp-rmem-max %d: want >= 0", p.rmemMax)
	}
	c.TCPReceiveBufferMax = p.rmemMax
	c.Pool.RingSize = p.poolRing
	switch p.zeroCopy {
	case "", "off":
	case "on", "views":
		c.ZeroCopy = true
	default:
		return c, fmt.Errorf("zero-copy %q: want off, on or views", p.zeroCopy)
	}
	if c.Tunnel, err = p.tunnelConfig(); err != nil {
		return c, err
	}
	if c.CPUMap, err = parseCPUs(p.cpumap); err != nil {
		return c, fmt.Errorf("cpumap: %w", err)
	}
	if p.xdp != "" {
		if c.XDP, err = cpumap.ParseProgram(p.xdp, max(1, len(c.CPUMap))); err != nil {
			return c, err
		}
	}
	cpuGRO, err := driver.ParseOnOff("cpumap-gro", p.cpuGRO)
	if err != nil {
		return c, err
	}
	c.NoCPUMapGRO = !cpuGRO
	if p.cpuQueue < 0 {
		return c, fmt.Errorf("cpumap-qsize %d: want >= 0", p.cpuQueue)
	}
	c.CPUMapQueue = p.cpuQueue
	if c.Driver.NICCPUs, err = parseCPUs(p.nicCPU); err != nil {
		return c, fmt.Errorf("nic-cpu: %w", err)
	}
	if c.Driver.PollCPUs, err = parseCPUs(p.pollCPU); err != nil {
		return c, fmt.Errorf("poll-cpu: %w", err)
	}
	if err := p.tcpMem.apply(&c); err != nil {
		return c, err
	}
	return c, nil
}

// choice parses the value of a two-way switch: false for off (or empty),
// true for on.
func choice(name, value, off, on string) (bool, error) {
	switch value {
	case "", off:
		return false, nil
	case on:
		return true, nil
	}
	return false, fmt.Errorf("%s %q: want %s or %s", name, value, off, on)
}

// String describes the policy in flag form.
func (p *policy) String() string {
	s := fmt.Sprintf("lro=%s hds=%s gro=%s rq=%s mtu=%d", p.lro, p.hds, p.gro, p.rq, p.mtu)
	if p.hwGRO != "" && p.hwGRO != "off" {
		s += " hw-gro=" + p.hwGRO
	}
	if p.zeroCopy != "" && p.zeroCopy != "off" {
		s += " zero-copy=" + p.zeroCopy
	}
	if p.coalesce != 0 {
		s += fmt.Sprintf(" coalesce-bytes=%d", p.coalesce)
	}
	if p.wireRead == "bounce" {
		s += " wire-read=bounce"
	}
	if p.rqSize != 0 {
		s += fmt.Sprintf(" rq-size=%d", p.rqSize)
	}
	if p.rqFull == "drop" {
		s += " rq-full=drop"
	}
	if p.rmemMax != 0 {
		s += fmt.Sprintf(" tcp-rmem-max=%d", p.rmemMax)
	}
	if p.tunnelOn() {
		s += " tunnel=" + p.tunnel
	}
	if p.xdp != "" {
		s += fmt.Sprintf(" xdp=%s cpumap=%s cpumap-gro=%s", p.xdp, p.cpumap, p.cpuGRO)
	}
	if p.recycle == "off" || p.pageSize == "64k" || p.order != 0 {
		s += fmt.Sprintf(" recycle=%s page=%s order=%d", p.recycle, p.pageSize, p.order)
	}
	return s
}

// tunnelOn reports whether -tunnel asks for a tunnel.
func (p *policy) tunnelOn() bool { return p.tunnel == "ip6tnl" }

// tunnelConfig turns the -tunnel flags into the stack's tunnel: nil with
// -tunnel off. Addresses not given stay invalid, for setupBenchTunnel to
// fill in (ustack bench); stack.New rejects a tunnel without them.
func (p *policy) tunnelConfig() (*stack.TunnelConfig, error) {
	switch p.tunnel {
	case "", "off":
		return nil, nil
	case "ip6tnl":
	default:
		return nil, fmt.Errorf("tunnel %q: want off or ip6tnl", p.tunnel)
	}
	t := &stack.TunnelConfig{Addrs: p.tunnelAddrs}
	for _, a := range []struct {
		name, v string
		dst     *netip.Addr
	}{{"tunnel-local", p.tunnelLocal, &t.Local}, {"tunnel-remote", p.tunnelRemote, &t.Remote}, {"tunnel-remote4", p.tunnelRemote4, &t.Remote4}} {
		if a.v == "" {
			continue
		}
		addr, err := netip.ParseAddr(a.v)
		if err != nil || !addr.Is6() || addr.Is4In6() {
			return nil, fmt.Errorf("-%s %q: want an IPv6 address", a.name, a.v)
		}
		*a.dst = addr
	}
	return t, nil
}

// discard returns the TCP discard server the policy's reader uses: Read,
// or ReadViews with -zero-copy views.
func (p *policy) discard() func(net.Listener, *atomic.Uint64) error {
	if p.zeroCopy == "views" {
		return serve.DiscardViews
	}
	return serve.Discard
}

func parseCPUs(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n > 1023 {
			return nil, fmt.Errorf("cpu %q: want a CPU number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// prefixList is a repeatable -addr flag.
type prefixList []netip.Prefix

func (l *prefixList) String() string { return fmt.Sprint(*l) }

func (l *prefixList) Set(s string) error {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return fmt.Errorf("address %q: want CIDR like 10.0.0.2/24", s)
	}
	*l = append(*l, p)
	return nil
}

// serverFlags are run's bounds on its built-in servers (discard, echo,
// iperf3): see serve.Config and serve.IPerf3Config, whose defaults
// they show. A timeout of 0 means none.
type serverFlags struct {
	perSource    int
	idle, write  time.Duration
	echoConnMem  int
	iperf3Rate   float64
	iperf3MaxDur time.Duration
	iperf3Idle   time.Duration
}

func (f *serverFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.perSource, "server-conns-per-source", serve.DefaultConnsPerSource, "discard and echo: connections at once from one source address; one more is closed at once (server_conns_source_refused). One client's parallel test fits (bench opens up to 64), and one source holds at most half of the echo budget")
	fs.DurationVar(&f.idle, "server-idle-timeout", serve.DefaultIdleTimeout, "discard and echo: close a connection whose peer sent nothing for this long, the read deadline (server_idle_timeouts; 0: never). Far beyond a live peer's pauses, short enough that silent peers give their slots back")
	fs.DurationVar(&f.write, "server-write-timeout", serve.DefaultWriteTimeout, "echo: close a connection whose peer took none of its echo for this long, the write deadline (server_write_timeouts; 0: never)")
	fs.IntVar(&f.echoConnMem, "echo-conn-mem", serve.DefaultEchoConnMemory, "echo: bytes of buffers one connection may hold, its share of the 256 MiB budget (128 connections to take it all)")
	fs.Float64Var(&f.iperf3Rate, "iperf3-max-rate", serve.DefaultIPerf3MaxRate, "iperf3: bits per second the server sends at most in a test (-R, --bidir), shared by its streams whatever -b asks (0: no cap). Above what ustack sends here, so no measurement is capped")
	fs.DurationVar(&f.iperf3MaxDur, "iperf3-max-duration", serve.DefaultIPerf3MaxDuration, "iperf3: longest test: a longer -t (with -O) is refused as by iperf3 --server-max-duration, a -n/-k test ends there. One test runs at a time: this is how long one client can hold the server")
	fs.DurationVar(&f.iperf3Idle, "iperf3-idle-timeout", serve.DefaultIPerf3IdleTimeout, "iperf3: end a running test in which no stream moved a byte for this long (iperf3_idle_timeouts; 0: never), so a silent client gives the test slot back")
}

// config checks the flags and returns the servers' configurations.
func (f *serverFlags) config() (serve.Config, serve.IPerf3Config, error) {
	var sc serve.Config
	var ic serve.IPerf3Config
	if f.perSource <= 0 || f.echoConnMem <= 0 {
		return sc, ic, fmt.Errorf("-server-conns-per-source and -echo-conn-mem: want > 0")
	}
	if f.idle < 0 || f.write < 0 || f.iperf3MaxDur <= 0 || f.iperf3Idle < 0 || f.iperf3Rate < 0 {
		return sc, ic, fmt.Errorf("server timeouts and -iperf3-max-rate: want >= 0 (-iperf3-max-duration > 0)")
	}
	none := func(d time.Duration) time.Duration { // 0 on the command line: none
		if d == 0 {
			return -1
		}
		return d
	}
	sc = serve.Config{MaxConnsPerSource: f.perSource, IdleTimeout: none(f.idle), WriteTimeout: none(f.write), EchoConnMemory: f.echoConnMem}
	ic = serve.IPerf3Config{MaxDuration: f.iperf3MaxDur, IdleTimeout: none(f.iperf3Idle), MaxRate: f.iperf3Rate}
	if f.iperf3Rate == 0 {
		ic.MaxRate = -1
	}
	return sc, ic, nil
}

// discardWith is discard with the servers' bounds.
func (p *policy) discardWith(c serve.Config) func(net.Listener, *atomic.Uint64) error {
	if p.zeroCopy == "views" {
		return c.DiscardViews
	}
	return c.Discard
}

// tcpMemFlags bound the stack's TCP receive memory, as Linux's tcp_mem:
// see stack.Config.TCPMemLimit.
type tcpMemFlags struct {
	limit, pressure int64
}

func (f *tcpMemFlags) register(fs *flag.FlagSet) {
	fs.Int64Var(&f.limit, "tcp-mem-limit", 0, fmt.Sprintf("bytes the TCP connections' receive buffers may commit in all, tcp_mem's high: past it, with every buffer at its %d-byte floor, the segments of connections holding more are dropped (rx_tcp_mem_drops; 0: %d, negative: no bound)", stack.TCPMemFloor, stack.DefaultTCPMemLimit))
	fs.Int64Var(&f.pressure, "tcp-mem-pressure", 0, "bytes committed at which memory pressure begins, tcp_mem's pressure: auto-tuning stops at a fair share of -tcp-mem-limit and larger buffers are shrunk to it; it ends below half of this (0: 3/4 of -tcp-mem-limit)")
}

// apply sets c's TCP memory bounds from the flags.
func (f *tcpMemFlags) apply(c *stack.Config) error {
	if f.pressure < 0 || f.limit > 0 && f.pressure > f.limit {
		return fmt.Errorf("tcp-mem-pressure %d: want 0..-tcp-mem-limit", f.pressure)
	}
	c.TCPMemLimit, c.TCPMemPressure = f.limit, f.pressure
	return nil
}
