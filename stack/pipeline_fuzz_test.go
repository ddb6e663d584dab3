package stack

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// pipelineConfig restricts FuzzPipeline to one configuration, by name:
// to measure or fuzz it alone.
var pipelineConfig = flag.String("pipeline.config", "", "FuzzPipeline: run every input on this configuration only")

// pipelineExec numbers a configuration's first execution (its sources,
// ports and tags follow from it): to replay an input as the execution a
// failure names.
var pipelineExec = flag.Uint64("pipeline.exec", 1, "FuzzPipeline: the number of each configuration's first execution")

// pipeConfig is one configuration FuzzPipeline runs inputs on.
type pipeConfig struct {
	name   string
	cfg    Config // Wire, MAC, Addrs and Driver.Pool are the rig's
	xdp    bool   // the hash program over a cpumap of two entries (sentinelSteer)
	tunnel bool   // an IPv6 tunnel to 2001:db8::11, inner 10.78.0.2 and fd78::2
}

// pipeConfigs are the configurations: L2 and L3 wires, the linear RQ
// (packets built over their stride) and the nonlinear one (header copy of
// HDS, auto or a fixed size, payload in frags), LRO, rx-uso, hardware GRO,
// zero copy, XDP with a cpumap, the tunnel, the TCP memory limit.
var pipeConfigs = []pipeConfig{
	{name: "l2-linear", cfg: Config{TCPMemLimit: 1}}, // always at the TCP memory hard limit
	{name: "l2-linear-mtu1280-zc", cfg: Config{Driver: driver.Config{MTU: 1280}, ZeroCopy: true}},
	{name: "l2-hds8-zc", cfg: Config{Driver: driver.Config{MTU: 4096, HDS: 8}, ZeroCopy: true}},
	{name: "l2-rxuso-hds20", cfg: Config{Driver: driver.Config{RxUSO: true, HDS: 20}}},
	{name: "l2-rxuso", cfg: Config{Driver: driver.Config{RxUSO: true}}},
	{name: "l2-lro-hds256", cfg: Config{Driver: driver.Config{LRO: true, HDS: 256}}},
	{name: "l2-hwgro", cfg: Config{Driver: driver.Config{HWGRO: driver.HWGROOn}}},
	{name: "l2-hwgro-coalesce-zc", cfg: Config{Driver: driver.Config{HWGRO: driver.HWGROCoalesce}, ZeroCopy: true}},
	{name: "l2-cyclic-hds256-nogro", cfg: Config{Driver: driver.Config{RQ: driver.RQCyclic, HDS: 256}, NoGRO: true, TCPMemLimit: 1}},
	{name: "l2-xdp-cpumap", xdp: true},
	{name: "l2-tunnel", tunnel: true},
	{name: "l3-linear", cfg: Config{Driver: driver.Config{L3: true}}},
	{name: "l3-lro-rxuso-hds20-zc", cfg: Config{Driver: driver.Config{L3: true, LRO: true, RxUSO: true, HDS: 20}, ZeroCopy: true}},
}

// pipeRebuild is how many executions a rig serves before it is closed,
// its pool checked for pages still out, and built again.
const pipeRebuild = 2048

// pipeMaxErrors bounds the wrong reads an execution reports.
const pipeMaxErrors = 8

// pipeWait bounds every wait of an execution: only a stuck pipeline waits
// that long.
const pipeWait = 20 * time.Second

// FuzzPipeline feeds frames made from the input (pipeline_frames_test.go)
// with virtio-net headers of its own through the whole receive path of a
// stack on an in-memory wire, for each of pipeConfigs (the input's first
// byte picks one), and checks that nothing panics, that every page comes
// back when the stack closes, and that the sockets read only what the
// frames could deliver (pipeline_ref_test.go): a gVisor UDP socket, and
// TrainConns read with ReadTrain, ReadBatch (one datagram per message, and
// GRO trains) and TakeTrain, each datagram of a train checked; and a TCP
// connection, set up by the execution's own handshake, read with TryRead or
// ReadViews, every byte checked at its sequence number.
//
// The stacks are built once per configuration (and again every pipeRebuild
// executions): an execution ends with a sentinel datagram, which the
// pipeline delivers only after every frame before it (or in the same GRO
// flush), drains every socket, and gives its datagrams and fragments
// sources of its own, so that no input's frames meet another's. A page
// still out when a stack closes fails the execution that closed it, and
// names the input since the stack was built that leaves one out alone.
//
// -pipeline.config=NAME runs every input on one configuration;
// -pipeline.exec=N numbers the first execution N, to replay an input as
// the execution a failure names (the failure says how). Fuzzing:
// go test ./stack -run '^$' -fuzz FuzzPipeline -fuzztime 20000x.
func FuzzPipeline(f *testing.F) {
	for _, s := range pipeSeeds() {
		f.Add(s)
	}
	rigs := make([]*pipeRig, len(pipeConfigs))
	last := make([]pipeTally, len(pipeConfigs)) // of the rigs closed
	for i := range last {
		last[i].execs = *pipelineExec - 1
	}
	f.Cleanup(func() {
		for i, r := range rigs {
			if r != nil {
				if err := r.close(f); err != nil {
					f.Errorf("%s: %v%s", r.pc.name, err, pipeCulprit(r.pc, r.inputs))
				}
				last[i] = r.tally
			}
			if testing.Verbose() && last[i].execs >= *pipelineExec {
				f.Logf("%s: %d executions, %d datagrams and %d TCP bytes read and checked", pipeConfigs[i].name, last[i].execs, last[i].dgrams, last[i].tcpBytes)
			}
		}
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		ci, err := pipeConfigIndex(data)
		if err != nil {
			t.Fatal(err)
		}
		r := rigs[ci]
		if r == nil {
			if r, err = newPipeRig(&pipeConfigs[ci], last[ci]); err != nil {
				t.Fatal(err)
			}
			rigs[ci] = r
		}
		defer func() {
			if t.Failed() || r.exec%pipeRebuild == 0 {
				rigs[ci], last[ci] = nil, r.tally
				if err := r.close(t); err != nil {
					t.Errorf("%s: %v%s", r.pc.name, err, pipeCulprit(r.pc, r.inputs))
				}
			}
		}()
		r.run(t, data)
	})
}

// pipeConfigIndex returns the configuration an input runs on.
func pipeConfigIndex(data []byte) (int, error) {
	if *pipelineConfig != "" {
		for i := range pipeConfigs {
			if pipeConfigs[i].name == *pipelineConfig {
				return i, nil
			}
		}
		return 0, fmt.Errorf("-pipeline.config %q: no such configuration", *pipelineConfig)
	}
	if len(data) == 0 {
		return 0, nil
	}
	return int(data[0]) % len(pipeConfigs), nil
}

// pipeCulprit runs each of inputs alone on a fresh stack of pc and
// returns, for a failure message, the first that leaves a page out, in the
// corpus file format, or that none does alone.
func pipeCulprit(pc *pipeConfig, inputs [][]byte) string {
	if len(inputs) == 0 {
		return ""
	}
	for _, in := range inputs {
		r, err := newPipeRig(pc, pipeTally{})
		if err != nil {
			return ""
		}
		func() {
			defer func() {
				if p := recover(); p != nil && p != (pipeQuiet{}) {
					panic(p)
				}
			}()
			r.run(pipeQuiet{}, in) // the checks' failures do not matter here
		}()
		if err := r.close(pipeQuiet{}); err != nil {
			return fmt.Sprintf("\nthe input that leaves pages out alone (save it as testdata/fuzz/FuzzPipeline/<name>):\ngo test fuzz v1\n[]byte(%q)\n", in)
		}
	}
	return fmt.Sprintf("\nno one of the %d inputs since the stack was built leaves a page out alone", len(inputs))
}

// pipeT is what an execution reports its failures to: a *testing.T, or
// pipeQuiet.
type pipeT interface {
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

// pipeQuiet is a pipeT that ignores failures (Fatalf panics with
// pipeQuiet{}, which its caller recovers).
type pipeQuiet struct{}

func (pipeQuiet) Errorf(string, ...any) {}
func (pipeQuiet) Logf(string, ...any)   {}
func (pipeQuiet) Fatalf(string, ...any) { panic(pipeQuiet{}) }

// pipeRig is one configuration's stack under test, with its sockets and
// the state the executions on it share.
type pipeRig struct {
	pc    *pipeConfig
	s     *Stack
	far   *driver.MemWire // the wire's other end: the test writes frames into it
	pool  *bufpool.Pool
	l3    bool
	mtu   int
	addrs refAddrs

	udp      tcpip.Endpoint // a gVisor UDP socket on [::]:7001
	udpWQ    waiter.Queue
	trains   [5]*TrainConn // 7002 (ReadTrain), 7003 (ReadBatch), 7004 (ReadBatch, GRO), 7005 (TakeTrain), 192.0.2.1:7006 (ReadTrain)
	sentinel net.PacketConn
	lis      *TCPListener
	nsent    int         // sentinels per execution: one per cpumap entry
	conns    []*pipeConn // the connections still open: the last execution's and this one's

	tally  pipeTally
	bad    int    // wrong reads this execution
	exec   uint64 // the execution's number (tally.execs)
	win    refWindow
	inputs [][]byte // the inputs run since the rig was built
	input  []byte   // this execution's
	rbuf   []byte
	fbuf   []byte
	msgs   []Message
	views  []View
}

// pipeConn is an execution's TCP connection: the test is its client
// (the peer), the stack under test accepted it.
type pipeConn struct {
	v6           bool
	lport, pport uint16
	irs, iss     uint32 // the client's and the server's initial sequence numbers
	ts           bool
	tsVal, tsEcr uint32
	views        bool
	tc           *TCPConn
	stream       refStream
	read         int // stream bytes read so far
	done         bool
}

func (c *pipeConn) local() netip.Addr {
	if c.v6 {
		return netip.AddrFrom16(pipeRx6.As16())
	}
	return netip.AddrFrom4(pipeRx4.As4())
}

func (c *pipeConn) peer() netip.Addr {
	if c.v6 {
		return netip.AddrFrom16(pipePeer6.As16())
	}
	return netip.AddrFrom4(pipePeer4.As4())
}

// sentinelSteer is the XDP program of the cpumap configuration: the hash
// program, but a sentinel (UDP to pipeSentinelPort from port 1 or 2) goes
// to entry port-1, so that each entry's worker gets one.
type sentinelSteer struct {
	hash cpumap.Program
	l3   bool
}

func (p sentinelSteer) Run(b []byte) (cpumap.Action, int) {
	l2 := header.EthernetMinimumSize
	if p.l3 {
		l2 = 0
	}
	if len(b) >= l2+header.IPv4MinimumSize+header.UDPMinimumSize && b[l2]>>4 == 4 && b[l2+9] == uint8(header.UDPProtocolNumber) {
		l4 := l2 + int(b[l2]&0xf)*4
		if len(b) >= l4+header.UDPMinimumSize {
			sport, dport := binary.BigEndian.Uint16(b[l4:]), binary.BigEndian.Uint16(b[l4+2:])
			if dport == pipeSentinelPort && (sport == 1 || sport == 2) {
				return cpumap.Redirect, int(sport - 1)
			}
		}
	}
	return p.hash.Run(b)
}

// pipeTally counts what a configuration's rigs did: executions (the last
// one's number), and the datagrams and TCP bytes they checked.
type pipeTally struct {
	execs, dgrams, tcpBytes uint64
}

// newPipeRig builds pc's stack on an in-memory wire, with a poisoning
// pool, and its sockets; its executions continue tally, the last rig's.
func newPipeRig(pc *pipeConfig, tally pipeTally) (*pipeRig, error) {
	cfg := pc.cfg
	a, far := driver.NewMemPair(32, driver.VirtioNetHdrLen+65535+18)
	bc := bufpool.Config{Poison: true, RingSize: 1 << 14}
	if cfg.ZeroCopy {
		bc.Memory = NewChunkMemory()
	}
	pool, err := bufpool.New(bc)
	if err != nil {
		return nil, err
	}
	r := &pipeRig{pc: pc, far: far, pool: pool, l3: cfg.Driver.L3, nsent: 1, tally: tally,
		rbuf: make([]byte, 1<<17), fbuf: make([]byte, driver.VirtioNetHdrLen+65535+18)}
	cfg.Wire, cfg.MAC, cfg.Driver.Pool = a, [6]byte([]byte(pipeRxMAC)), pool
	cfg.Addrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64")}
	r.addrs.own = []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}
	r.addrs.bcast = []netip.Addr{netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("192.0.2.255")}
	if pc.xdp {
		h, err := cpumap.ParseProgramLink("hash", 2, r.l3)
		if err != nil {
			return nil, err
		}
		cfg.XDP, cfg.CPUMap = sentinelSteer{hash: h, l3: r.l3}, []int{0, 1}
		r.nsent = 2
	}
	if pc.tunnel {
		cfg.Tunnel = &TunnelConfig{Local: netip.MustParseAddr("2001:db8::11"), Remote: netip.MustParseAddr("2001:db8::12"),
			Addrs: []netip.Prefix{netip.MustParsePrefix("10.78.0.2/24"), netip.MustParsePrefix("fd78::2/64")}}
		r.addrs.own = append(r.addrs.own, netip.MustParseAddr("10.78.0.2"), netip.MustParseAddr("fd78::2"), netip.MustParseAddr("2001:db8::11"))
		r.addrs.bcast = append(r.addrs.bcast, netip.MustParseAddr("10.78.0.255"))
		r.addrs.tunnel = netip.MustParseAddr("2001:db8::11")
	}
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	r.s = s
	r.mtu = s.Driver().Config().MTU
	if err := r.sockets(); err != nil {
		r.close(pipeQuiet{})
		return nil, err
	}
	return r, nil
}

// sockets binds the rig's sockets and tells gVisor the peer's MAC.
func (r *pipeRig) sockets() error {
	ip := r.s.GVisor()
	if !r.l3 {
		for _, n := range []struct {
			proto tcpip.NetworkProtocolNumber
			addr  tcpip.Address
		}{{ipv4.ProtocolNumber, pipePeer4}, {ipv6.ProtocolNumber, pipePeer6}} {
			if e := ip.AddStaticNeighbor(nicID, n.proto, n.addr, pipePeerMAC); e != nil {
				return fmt.Errorf("static neighbour %s: %s", n.addr, e)
			}
		}
	}
	ep, e := ip.NewEndpoint(udp.ProtocolNumber, ipv6.ProtocolNumber, &r.udpWQ)
	if e != nil {
		return fmt.Errorf("udp socket: %s", e)
	}
	r.udp = ep
	if e := ep.Bind(tcpip.FullAddress{Port: pipeUDPPort}); e != nil {
		return fmt.Errorf("udp socket: bind: %s", e)
	}
	for i := range r.trains {
		ap := netip.AddrPortFrom(netip.IPv6Unspecified(), pipeTrainPort+uint16(i))
		if ap.Port() == pipeBoundPort {
			ap = netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), pipeBoundPort)
		}
		c, err := r.s.ListenUDPTrains(ap)
		if err != nil {
			return err
		}
		r.trains[i] = c
	}
	r.trains[2].SetGRO(true)
	var err error
	if r.sentinel, err = r.s.ListenUDP(netip.AddrPortFrom(netip.IPv4Unspecified(), pipeSentinelPort)); err != nil {
		return err
	}
	l, err := r.s.ListenTCP(netip.AddrPortFrom(netip.IPv6Unspecified(), pipeTCPPort))
	if err != nil {
		return err
	}
	r.lis = l.(*TCPListener)
	r.msgs = make([]Message, 8)
	for i := range r.msgs {
		r.msgs[i].Buffers = [][]byte{make([]byte, 1<<16)}
	}
	return nil
}

// close closes the rig's connections, sockets and stack, and reports pages
// of its pool still in use. t gets the last reads' failures.
func (r *pipeRig) close(t pipeT) error {
	for _, c := range r.conns {
		r.settle(t, c)
		r.readConn(t, c)
		c.tc.Close()
	}
	r.conns = nil
	if r.udp != nil {
		r.udp.Close()
	}
	if r.sentinel != nil {
		r.sentinel.Close()
	}
	if r.lis != nil {
		r.lis.Close()
	}
	if r.s != nil {
		r.s.Close() // closes the TrainConns
	}
	r.far.Close()
	r.pool.Close()
	if n := r.pool.InUse(); n != 0 {
		return fmt.Errorf("pages still in use after Close: got %d, want 0", n)
	}
	return nil
}

// run runs one input on the rig.
func (r *pipeRig) run(t pipeT, data []byte) {
	r.tally.execs++
	r.exec, r.bad = r.tally.execs, 0
	r.inputs, r.input = append(r.inputs, data), data
	if len(r.inputs) > pipeRebuild {
		r.inputs = r.inputs[1:]
	}
	ref := &refExec{id: r.exec, dgrams: map[string]struct{}{}, frags: map[netip.Addr][]refFrag{}}
	r.win.push(ref)
	in := &pipeInput{b: data}
	h, ts := in.decode()

	r.drainFar()
	fb := &pipeFrames{l3: r.l3, mtu: r.mtu, exec: r.exec}
	for _, tm := range ts {
		if tm.kind == tmplTCP || tm.kind == tmplTCPGSO || tm.kind == tmplTunnel && tm.flags&8 != 0 {
			fb.conn = r.connect(t, h.conn)
			break
		}
	}
	for i := range ts {
		fb.build(i, &ts[i])
	}
	var out refOut
	for _, b := range fb.frames {
		refParse(b, r.l3, &r.addrs, &out)
	}
	for _, d := range out.dgrams {
		if r.accepts(d.dport, d.dst) {
			ref.dgrams[refKey(d.dport, netip.AddrPortFrom(d.src, d.sport), d.payload)] = struct{}{}
		}
	}
	for _, f := range out.frags {
		ref.frags[f.src.Unmap()] = append(ref.frags[f.src.Unmap()], f)
	}
	for _, sg := range out.segs {
		for _, c := range r.conns {
			if sg.src.Unmap() == c.peer() && sg.dst.Unmap() == c.local() && sg.sport == c.pport && sg.dport == c.lport {
				c.stream.segs = append(c.stream.segs, sg)
			}
		}
	}
	for _, b := range fb.frames {
		r.write(t, b)
	}
	r.sendSentinels(t)
	r.waitSentinels(t)
	r.readUDP(t)
	r.readTrains(t)
	// The last execution's connection is read a last time and aborted;
	// this one's stays open for the next, for the segments that TCP's
	// processing (goroutines of gVisor's) has not taken yet.
	keep := r.conns[:0]
	for _, c := range r.conns {
		if c == fb.conn {
			r.settle(t, c)
		}
		r.readConn(t, c)
		if c == fb.conn {
			keep = append(keep, c)
		} else {
			c.tc.Close()
		}
	}
	r.conns = keep
	if r.bad > pipeMaxErrors {
		t.Errorf("%s exec %d: %d wrong reads more", r.pc.name, r.exec, r.bad-pipeMaxErrors)
	}
	if err := r.s.Err(); err != nil {
		t.Fatalf("%s exec %d: the stack's receive stopped: %v", r.pc.name, r.exec, err)
	}
}

// accepts reports whether the socket on port takes a datagram to dst.
func (r *pipeRig) accepts(port uint16, dst netip.Addr) bool {
	if port == pipeBoundPort {
		return dst.Unmap() == netip.MustParseAddr("192.0.2.1")
	}
	return r.addrs.accepts(dst)
}

// write writes one frame into the wire, waiting while its queue is full
// (a frame longer than the wire takes is dropped).
func (r *pipeRig) write(t pipeT, b []byte) {
	deadline := time.Now().Add(pipeWait)
	for {
		drops := r.far.Dropped()
		if err := r.far.Write(b); err != nil {
			t.Fatalf("%s exec %d: write: %v", r.pc.name, r.exec, err)
		}
		if r.far.Dropped() == drops || len(b) > len(r.fbuf) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s exec %d: the wire's queue stays full (the pipeline is stuck)\n%s", r.pc.name, r.exec, r.counters())
		}
		runtime.Gosched()
	}
}

// drainFar reads and drops what the stack sent.
func (r *pipeRig) drainFar() {
	for {
		if _, err := r.far.Read(r.fbuf, false); err != nil {
			return
		}
	}
}

// sentinelFrame is the frame of the execution's sentinel for cpumap entry
// cpu: a datagram to pipeSentinelPort from port cpu+1 carrying the
// execution and cpu.
func (r *pipeRig) sentinelFrame(cpu int) []byte {
	p := make([]byte, 9)
	binary.BigEndian.PutUint64(p, r.exec)
	p[8] = byte(cpu)
	b := testutil.Frame{Headroom: driver.VirtioNetHdrLen, SrcMAC: pipePeerMAC, DstMAC: pipeRxMAC, Src: pipePeer4, Dst: pipeRx4,
		Proto: header.UDPProtocolNumber, SrcPort: uint16(cpu + 1), DstPort: pipeSentinelPort, Payload: p}.Build()
	if r.l3 {
		b = append(b[:driver.VirtioNetHdrLen], b[driver.VirtioNetHdrLen+header.EthernetMinimumSize:]...)
	}
	return b
}

func (r *pipeRig) sendSentinels(t pipeT) {
	for cpu := range r.nsent {
		r.write(t, r.sentinelFrame(cpu))
	}
}

// waitSentinels waits for the execution's sentinels.
func (r *pipeRig) waitSentinels(t pipeT) {
	got := 0
	r.sentinel.SetReadDeadline(time.Now().Add(pipeWait))
	for got < r.nsent {
		n, _, err := r.sentinel.ReadFrom(r.rbuf)
		if err != nil {
			t.Fatalf("%s exec %d: sentinel: %v (the pipeline is stuck)\n%s", r.pc.name, r.exec, err, r.counters())
		}
		if n == 9 && binary.BigEndian.Uint64(r.rbuf) == r.exec {
			got++
		}
	}
}

// counters returns the stack's non-zero counters, for a failure.
func (r *pipeRig) counters() string {
	var b strings.Builder
	r.s.EachCounter(func(name string, v uint64) {
		if v != 0 {
			fmt.Fprintf(&b, "%s=%d ", name, v)
		}
	})
	return b.String()
}

// replay logs, at an execution's first wrong read, how to run it again.
func (r *pipeRig) replay(t pipeT) {
	if r.bad == 1 {
		t.Logf("%s exec %d: to run it again: go test ./stack -run FuzzPipeline/<its file> -pipeline.config=%s -pipeline.exec=%d; the input: %q",
			r.pc.name, r.exec, r.pc.name, r.exec, r.input)
	}
}

// checkDgram fails t if the socket on port must not have read payload from
// from.
func (r *pipeRig) checkDgram(t pipeT, how string, port uint16, from netip.AddrPort, payload []byte) {
	r.tally.dgrams++
	if r.win.datagram(port, from, payload, func(dst netip.Addr) bool { return r.accepts(port, dst) }) {
		return
	}
	if r.bad++; r.bad > pipeMaxErrors {
		return
	}
	r.replay(t)
	t.Errorf("%s exec %d, %s on port %d: read a datagram of %d bytes from %s that no frame could deliver: % x",
		r.pc.name, r.exec, how, port, len(payload), from, payload[:min(len(payload), 48)])
}

// checkTrain checks each datagram of a train: payload in datagrams of seg
// bytes (the last may be shorter; seg 0: one datagram).
func (r *pipeRig) checkTrain(t pipeT, how string, port uint16, from netip.AddrPort, payload []byte, seg int) {
	if seg <= 0 || seg >= len(payload) {
		r.checkDgram(t, how, port, from, payload)
		return
	}
	for len(payload) > 0 {
		n := min(seg, len(payload))
		r.checkDgram(t, how, port, from, payload[:n])
		payload = payload[n:]
	}
}

// readUDP drains the gVisor UDP socket.
func (r *pipeRig) readUDP(t pipeT) {
	for {
		w := tcpip.SliceWriter(r.rbuf)
		res, err := r.udp.Read(&w, tcpip.ReadOptions{NeedRemoteAddr: true})
		if _, ok := err.(*tcpip.ErrWouldBlock); ok {
			return
		}
		if err != nil {
			t.Fatalf("%s exec %d: gVisor UDP socket: %s", r.pc.name, r.exec, err)
		}
		a, _ := netip.AddrFromSlice(res.RemoteAddr.Addr.AsSlice())
		if res.Total > res.Count {
			t.Errorf("%s exec %d: gVisor UDP socket: a datagram of %d bytes", r.pc.name, r.exec, res.Total)
		}
		r.checkDgram(t, "gVisor UDP socket", pipeUDPPort, netip.AddrPortFrom(a.Unmap(), res.RemoteAddr.Port), r.rbuf[:res.Count])
	}
}

// readTrains drains the TrainConns, each with its read call.
func (r *pipeRig) readTrains(t pipeT) {
	past := time.Now()
	done := func(how string, err error) bool {
		if err == nil {
			return false
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s exec %d: %s: %v", r.pc.name, r.exec, how, err)
		}
		return true
	}
	for _, i := range []int{0, 4} { // ReadTrain
		c := r.trains[i]
		for {
			n, seg, from, err := c.ReadTrain(r.rbuf, past)
			if done("ReadTrain", err) {
				break
			}
			if n == len(r.rbuf) {
				t.Fatalf("%s exec %d: ReadTrain: a train longer than %d bytes", r.pc.name, r.exec, n)
			}
			r.checkTrain(t, "ReadTrain", c.port, from, r.rbuf[:n], seg)
		}
	}
	for _, i := range []int{1, 2} { // ReadBatch, without and with GRO
		c := r.trains[i]
		how := map[int]string{1: "ReadBatch", 2: "ReadBatch with GRO"}[i]
		for {
			n, err := c.ReadBatch(r.msgs, past)
			if done(how, err) {
				break
			}
			for _, m := range r.msgs[:n] {
				if m.Flags&MsgTrunc != 0 {
					t.Errorf("%s exec %d: %s: a datagram longer than %d bytes", r.pc.name, r.exec, how, len(m.Buffers[0]))
					continue
				}
				r.checkTrain(t, how, c.port, m.Addr, m.Buffers[0][:m.N], m.SegSize)
			}
		}
	}
	c := r.trains[3] // TakeTrain
	for {
		var tr Train
		if done("TakeTrain", c.TakeTrain(&tr, past)) {
			break
		}
		var p []byte
		for _, s := range tr.Slices(nil) {
			p = append(p, s...)
		}
		if len(p) != tr.Len() {
			t.Errorf("%s exec %d: TakeTrain: slices of %d bytes, Len %d", r.pc.name, r.exec, len(p), tr.Len())
		}
		r.checkTrain(t, "TakeTrain", c.port, tr.From(), p, tr.SegSize())
		tr.Release()
	}
}

// connect opens the execution's TCP connection: SYN, the stack's
// SYN-ACK, ACK, accepted.
func (r *pipeRig) connect(t pipeT, flags uint8) *pipeConn {
	c := &pipeConn{v6: flags&connV6 != 0, lport: pipeTCPPort, pport: uint16(20000 + r.exec%40000),
		irs: uint32(r.exec) * 2654435761, ts: flags&connNoTS == 0, views: flags&connViews != 0, tsVal: uint32(r.exec) << 8}
	mss := uint16(r.mtu - 40)
	if c.v6 {
		mss -= 20
	}
	opts := []byte{2, 4, byte(mss >> 8), byte(mss), 4, 2, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 3, 7} // Linux's: MSS, SACK_PERM, TS, NOP, WS 7
	binary.BigEndian.PutUint32(opts[8:], c.tsVal)
	if !c.ts {
		opts = []byte{2, 4, byte(mss >> 8), byte(mss), 1, 1, 4, 2, 1, 3, 3, 7}
	}
	syn := r.tcpSegment(c, c.irs, 0, header.TCPFlagSyn, opts)
	r.write(t, syn)
	deadline := time.Now().Add(pipeWait)
	for got := false; !got; {
		n, err := r.far.Read(r.fbuf, false)
		if errors.Is(err, driver.ErrNoFrame) {
			if time.Now().After(deadline) {
				t.Fatalf("%s exec %d: no SYN-ACK (the pipeline is stuck)\n%s", r.pc.name, r.exec, r.counters())
			}
			runtime.Gosched()
			continue
		}
		if err != nil {
			t.Fatalf("%s exec %d: reading the stack's frames: %v", r.pc.name, r.exec, err)
		}
		got = r.synAck(c, r.fbuf[driver.VirtioNetHdrLen:n])
	}
	var ack []byte
	if c.ts {
		ack = c.tcpOptsTS()
	}
	r.write(t, r.tcpSegment(c, c.irs+1, c.iss+1, header.TCPFlagAck, ack))
	for {
		ep, wq, e := r.lis.ep.Accept(nil)
		if _, ok := e.(*tcpip.ErrWouldBlock); ok {
			if time.Now().After(deadline) {
				t.Fatalf("%s exec %d: the connection is not accepted (the pipeline is stuck)\n%s", r.pc.name, r.exec, r.counters())
			}
			runtime.Gosched()
			continue
		}
		if e != nil {
			t.Fatalf("%s exec %d: accept: %s", r.pc.name, r.exec, e)
		}
		ep.SocketOptions().SetLinger(tcpip.LingerOption{Enabled: true}) // Close resets
		tc := newTCPConn(r.s, wq, ep)
		if ra, err := ep.GetRemoteAddress(); err != nil || ra.Port != c.pport {
			tc.Close() // an older execution's, late
			continue
		}
		if flags&connSmall != 0 {
			ep.SocketOptions().SetReceiveBufferSize(4096, true)
		}
		c.tc = tc
		break
	}
	r.conns = append(r.conns, c)
	return c
}

// connSegment returns the TCP header of frame (as the stack sent it) if it
// is a segment of c's, from the stack.
func (r *pipeRig) connSegment(c *pipeConn, frame []byte) (header.TCP, bool) {
	if !r.l3 {
		if len(frame) < header.EthernetMinimumSize {
			return nil, false
		}
		frame = frame[header.EthernetMinimumSize:]
	}
	var l4 []byte
	switch {
	case len(frame) >= header.IPv4MinimumSize && frame[0]>>4 == 4 && !c.v6:
		ip := header.IPv4(frame)
		if ip.Protocol() != uint8(header.TCPProtocolNumber) || int(ip.HeaderLength()) > len(frame) {
			return nil, false
		}
		l4 = frame[ip.HeaderLength():]
	case len(frame) >= header.IPv6MinimumSize && frame[0]>>4 == 6 && c.v6:
		if header.IPv6(frame).NextHeader() != uint8(header.TCPProtocolNumber) {
			return nil, false
		}
		l4 = frame[header.IPv6MinimumSize:]
	default:
		return nil, false
	}
	if len(l4) < header.TCPMinimumSize {
		return nil, false
	}
	tcp := header.TCP(l4)
	if tcp.SourcePort() != c.lport || tcp.DestinationPort() != c.pport || int(tcp.DataOffset()) > len(l4) {
		return nil, false
	}
	return tcp, true
}

// synAck reports whether frame (as the stack sent it) is c's SYN-ACK, and
// if so takes its sequence number and timestamp.
func (r *pipeRig) synAck(c *pipeConn, frame []byte) bool {
	tcp, ok := r.connSegment(c, frame)
	if !ok || tcp.Flags() != header.TCPFlagSyn|header.TCPFlagAck {
		return false
	}
	c.iss = tcp.SequenceNumber()
	if o := header.ParseSynOptions(tcp.Options(), true); o.TS {
		c.tsEcr = o.TSVal
	}
	return true
}

// pipeProbeWait bounds the wait for a probe's answer: a probe that PAWS
// drops (the input's frames raised the timestamp to echo) gets none.
const pipeProbeWait = 20 * time.Millisecond

// settle waits until gVisor has processed the segments queued for c
// (gVisor's TCP handles them in goroutines of its own, after the poll loop
// queued them): it sends a probe, one byte of data below the window, which
// the connection answers with an ACK (tcp's maybeSendOutOfWindowAck, for
// data always) once it got to it, after the segments before it; the ACK
// echoes the probe's timestamp, which tells it from the others. Without
// timestamps, or if no answer comes (PAWS dropped the probe, the
// connection is gone), it returns after pipeProbeWait: then the reads see
// what is there.
func (r *pipeRig) settle(t pipeT, c *pipeConn) {
	if !c.ts || c.done {
		return
	}
	c.tsVal += 1 << 30 // past the timestamps of the input's segments
	opts := c.tcpOptsTS()
	probe := r.tcpSegment(c, c.irs, c.iss+1, header.TCPFlagAck, opts)
	probe = append(probe, 0) // the byte of data
	l3 := driver.VirtioNetHdrLen
	if !r.l3 {
		l3 += header.EthernetMinimumSize
	}
	l4 := l3 + header.IPv4MinimumSize
	if c.v6 {
		l4 = l3 + header.IPv6MinimumSize
		ip := header.IPv6(probe[l3:])
		ip.SetPayloadLength(ip.PayloadLength() + 1)
	} else {
		ip := header.IPv4(probe[l3:])
		ip.SetTotalLength(ip.TotalLength() + 1)
		ip.SetChecksum(0)
		ip.SetChecksum(^ip.CalculateChecksum())
	}
	// NEEDS_CSUM: the TCP checksum, now wrong, is not checked.
	vh := driver.VirtioNetHdr{Flags: driver.VirtioNetHdrFNeedsCsum, CsumStart: uint16(l4 - driver.VirtioNetHdrLen), CsumOffset: header.TCPChecksumOffset}
	vh.Encode(probe)
	r.write(t, probe)
	ts := binary.BigEndian.Uint32(opts[4:])
	deadline := time.Now().Add(pipeProbeWait)
	for time.Now().Before(deadline) {
		m, err := r.far.Read(r.fbuf, false)
		if err != nil {
			runtime.Gosched()
			continue
		}
		tcp, ok := r.connSegment(c, r.fbuf[driver.VirtioNetHdrLen:m])
		if !ok {
			continue
		}
		if tcp.Flags().Contains(header.TCPFlagRst) {
			return
		}
		if o := header.ParseTCPOptions(tcp.Options()); o.TS && o.TSEcr == ts {
			return
		}
	}
}

// tcpSegment is a segment of c with no payload.
func (r *pipeRig) tcpSegment(c *pipeConn, seq, ack uint32, flags header.TCPFlags, opts []byte) []byte {
	src, dst := pipePeer4, pipeRx4
	if c.v6 {
		src, dst = pipePeer6, pipeRx6
	}
	b := testutil.Frame{Headroom: driver.VirtioNetHdrLen, SrcMAC: pipePeerMAC, DstMAC: pipeRxMAC, Src: src, Dst: dst,
		SrcPort: c.pport, DstPort: c.lport, Seq: seq, Ack: ack, Flags: flags, Window: 0xffff, TCPOptions: opts}.Build()
	if r.l3 {
		b = append(b[:driver.VirtioNetHdrLen], b[driver.VirtioNetHdrLen+header.EthernetMinimumSize:]...)
	}
	return b
}

// readConn reads what c has queued, with TryRead or ReadViews, and checks
// each byte against the segments of its sequence numbers.
func (r *pipeRig) readConn(t pipeT, c *pipeConn) {
	stream := refStream{segs: append(c.stream.segs, r.win.tcpFragSegs(c.peer(), c.local(), c.pport, c.lport)...)}
	check := func(b []byte) {
		if at, ok := stream.check(c.irs+1, c.read, b); !ok && r.bad < pipeMaxErrors {
			r.bad++
			r.replay(t)
			t.Errorf("%s exec %d: TCP connection from port %d read byte %d of the stream (sequence number %d), which no segment carried: % x",
				r.pc.name, r.exec, c.pport, at, c.irs+1+uint32(at), b[at-c.read:min(len(b), at-c.read+32)])
		}
		c.read += len(b)
		r.tally.tcpBytes += uint64(len(b))
	}
	for !c.done && c.tc.Readable() {
		if c.views {
			vs, n, err := c.tc.ReadViews(r.views[:0], 1<<20)
			for i := range vs {
				check(vs[i].Bytes())
				vs[i].Release()
			}
			r.views = vs[:0]
			if err != nil || n == 0 {
				c.done = true
			}
			continue
		}
		n, err := c.tc.TryRead(r.rbuf)
		check(r.rbuf[:n])
		if err != nil || n == 0 {
			c.done = true
		}
	}
}
