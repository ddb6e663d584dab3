package stack

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// DefaultTCPMemLimit is Config.TCPMemLimit's default: 3/32 of the
// machine's memory, as Linux sizes tcp_mem's high value at boot
// (tcp_init_mem: pressure at 1/16 of the free buffer pages, high at 3/2
// of that): 2.25 GiB on a 24 GiB machine, so that a thousand connections
// at gVisor's default 1 MiB buffer are no pressure, as they are none on
// Linux. Where the memory size is unknown, 512 MiB: 4096 connections (one
// built-in server's limit) at 128 KiB each.
var DefaultTCPMemLimit = defaultTCPMemLimit(totalRAM())

func defaultTCPMemLimit(ram int64) int64 {
	if ram <= 0 {
		return 512 << 20
	}
	return ram / 32 * 3
}

// TCPMemFloor is the receive buffer every connection keeps under memory
// pressure, and the in-order queue below which it still gets memory at
// the hard limit: Linux's tcp_rmem[0] (sk_get_rmem0). Linux's is 4 KiB;
// 64 KiB is the largest window without scaling and one GRO segment, so a
// connection at the floor still moves whole segments.
const TCPMemFloor = 64 << 10

// tcpMemInterval is how often the governor sums the buffers. Linux
// accounts at every allocation (__sk_mem_raise_allocated); gVisor keeps
// its accounting private, so ustack samples it: between two ticks the
// memory can pass the bound by what auto-tuning grows meanwhile.
const tcpMemInterval = 50 * time.Millisecond

// tcpMemLimits resolves cfg's TCPMemLimit and TCPMemPressure: on is false
// when the governor is off (a negative limit).
func tcpMemLimits(cfg *Config) (limit, pressure int64, on bool, err error) {
	limit, pressure = cfg.TCPMemLimit, cfg.TCPMemPressure
	if limit < 0 {
		return 0, 0, false, nil
	}
	if limit == 0 {
		limit = DefaultTCPMemLimit
	}
	if pressure == 0 {
		pressure = limit / 4 * 3
	}
	if pressure < 0 || pressure > limit {
		return 0, 0, false, fmt.Errorf("stack: TCPMemPressure %d: want 0..TCPMemLimit (%d)", cfg.TCPMemPressure, limit)
	}
	return limit, pressure, true, nil
}

// tcpMemGovernor bounds the stack's TCP receive memory as Linux's tcp_mem
// does (net.ipv4.tcp_mem: low, pressure, high), with the committed memory
// (tcpCommitted: the sum of the connections' receive buffers, which is
// what gVisor lets each hold) in place of sk_memory_allocated.
//
// A goroutine samples it every tcpMemInterval. Above pressure the stack
// enters memory pressure (tcp_enter_memory_pressure; counted as Linux's
// TCPMemoryPressures): auto-tuning may grow no buffer past the fair share
// max(limit/connections, TCPMemFloor) (the stack-wide
// TCPReceiveBufferSizeRangeOption's Max and Default, which gVisor reads
// at each ModerateRecvBuf and for each new connection), and every buffer
// above it is shrunk to it, as tcp_clamp_window does under
// tcp_under_memory_pressure. gVisor keeps the right edge it advertised
// (receiver.getSendParams never shrinks the window) but opens none past
// the smaller buffer, and drops what arrives beyond it. Pressure ends
// below half of it (tcp_mem[0], low), which restores the configured
// range.
//
// If the committed memory is still above the limit at the floor (too
// many connections), the stack is at the hard limit: as
// __sk_mem_raise_allocated refuses memory then but to a socket under
// tcp_rmem[0], the link endpoint drops the payload of the segments of
// every connection whose in-order queue exceeds TCPMemFloor
// (rx_tcp_mem_drops), handing gVisor their ACK alone.
//
// A side effect of the lower Max: a connection opened under pressure
// offers the window scale of that Max (gVisor's rcvWndScaleForHandshake),
// which caps its window at 65535 << scale for its life.
type tcpMemGovernor struct {
	ip              *gstack.Stack
	gate            *tcpMemGate
	limit, pressure int64
	rmem            tcpip.TCPReceiveBufferSizeRangeOption // as configured
	stop, done      chan struct{}

	// The goroutine's own.
	under bool
	max   int // the Max set under pressure
	eps   []tcpMemEndpoint

	pressureOn atomic.Bool   // tcp_mem_pressure
	entered    atomic.Uint64 // tcp_mem_pressure_entered
	shrinks    atomic.Uint64 // tcp_mem_rcvbuf_shrinks
}

// tcpMemEndpoint is a connection sampled by a tick: its receive buffer.
type tcpMemEndpoint struct {
	t   *tcp.Endpoint
	buf int64
}

// tcpMemGate is what the receive path reads of the governor: whether the
// stack is at the hard limit, and then the flows refused memory, sorted
// flowHash keys replaced as a whole at each tick.
type tcpMemGate struct {
	hard  atomic.Bool
	over  atomic.Pointer[[]uint64]
	drops atomic.Uint64 // rx_tcp_mem_drops
}

// startTCPMem starts the governor of ip's TCP memory, publishing to gate.
func startTCPMem(ip *gstack.Stack, gate *tcpMemGate, limit, pressure int64) *tcpMemGovernor {
	g := &tcpMemGovernor{ip: ip, gate: gate, limit: limit, pressure: pressure, stop: make(chan struct{}), done: make(chan struct{})}
	ip.TransportProtocolOption(tcp.ProtocolNumber, &g.rmem)
	go g.run()
	return g
}

// close stops the governor and waits for its goroutine. Safe on nil.
func (g *tcpMemGovernor) close() {
	if g == nil {
		return
	}
	close(g.stop)
	<-g.done
}

func (g *tcpMemGovernor) run() {
	defer close(g.done)
	t := time.NewTicker(tcpMemInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
			g.tick()
		}
	}
}

// tick samples the committed memory and enters, adjusts or leaves memory
// pressure and the hard limit.
func (g *tcpMemGovernor) tick() {
	g.eps = g.eps[:0]
	var committed int64
	for _, ep := range g.ip.RegisteredEndpoints() {
		t, ok := ep.(*tcp.Endpoint)
		if !ok || !tcpCanReceive(t.EndpointState()) {
			continue
		}
		buf := t.SocketOptions().GetReceiveBufferSize()
		g.eps = append(g.eps, tcpMemEndpoint{t, buf})
		committed += buf
	}
	switch {
	case !g.under && committed > g.pressure:
		g.under = true // tcp_enter_memory_pressure
		g.entered.Add(1)
		g.pressureOn.Store(true)
	case g.under && committed < g.pressure/2:
		g.leave()
	}
	if !g.under {
		return
	}
	share := max(g.limit/int64(max(len(g.eps), 1)), TCPMemFloor)
	g.setMax(int(min(share, int64(g.rmem.Max))))
	for i := range g.eps {
		e := &g.eps[i]
		if e.buf > share {
			// notify false: a bare store, which leaves auto-tuning
			// on (OnSetReceiveBufferSize would turn it off for
			// good, as SO_RCVBUF does) and capped by the new Max.
			e.t.SocketOptions().SetReceiveBufferSize(share, false)
			g.shrinks.Add(1)
			committed -= e.buf - share
			e.buf = share
		}
	}
	if committed <= g.limit {
		g.gate.hard.Store(false)
		return
	}
	over := make([]uint64, 0, 16)
	for _, e := range g.eps {
		if tcpQueued(e.t) <= TCPMemFloor {
			continue
		}
		info, ok := e.t.Info().(*gstack.TransportEndpointInfo)
		if !ok {
			continue
		}
		id := info.ID
		over = append(over, flowHash(id.LocalAddress.AsSlice(), id.RemoteAddress.AsSlice(), id.LocalPort, id.RemotePort))
	}
	slices.Sort(over)
	g.gate.over.Store(&over)
	g.gate.hard.Store(true)
}

// leave ends memory pressure: the configured range is back.
func (g *tcpMemGovernor) leave() {
	g.under = false
	g.max = 0
	rs := g.rmem
	g.ip.SetTransportProtocolOption(tcp.ProtocolNumber, &rs)
	g.gate.hard.Store(false)
	g.gate.over.Store(nil)
	g.pressureOn.Store(false)
}

// setMax sets the stack's receive buffer range to the configured one with
// Max m (and Default at most m), if it is not already.
func (g *tcpMemGovernor) setMax(m int) {
	if m == g.max {
		return
	}
	rs := g.rmem
	rs.Max = max(m, rs.Min)
	rs.Default = min(rs.Default, rs.Max)
	if g.ip.SetTransportProtocolOption(tcp.ProtocolNumber, &rs) == nil {
		g.max = m
	}
}

// each yields the governor's counters (zeros when it is off: g nil).
func (g *tcpMemGovernor) each(fn func(string, uint64)) {
	var on, hard, entered, shrinks, drops uint64
	if g != nil {
		if g.pressureOn.Load() {
			on = 1
		}
		if g.gate.hard.Load() {
			hard = 1
		}
		entered, shrinks, drops = g.entered.Load(), g.shrinks.Load(), g.gate.drops.Load()
	}
	fn("tcp_mem_pressure", on)
	fn("tcp_mem_pressure_entered", entered)
	fn("tcp_mem_rcvbuf_shrinks", shrinks)
	fn("tcp_mem_hard_limit", hard)
	fn("rx_tcp_mem_drops", drops)
}

// tcpMemRefuse is the receive path's side of the hard limit, called only
// while it holds (gate.hard): it reports whether frame b, whose headers
// are in b, is a TCP segment with payload (and no SYN, FIN or RST) of a
// flow refused memory, which it counts and drops, handing gVisor the
// segment's ACK alone at its sequence number (Linux's tcp_ack still runs
// for a segment tcp_data_queue drops). Pure ACKs, SYN, FIN and RST pass.
func (e *linkEndpoint) tcpMemRefuse(b []byte) bool {
	s := rxTCPOf(b, e.l2Len())
	return e.tcpMemRefuseSeg(b, &s, nil)
}

// tcpMemRefuseSeg is tcpMemRefuse for the segment s found in b (rxTCPOf),
// which Deliver finds once for its stages.
func (e *linkEndpoint) tcpMemRefuseSeg(b []byte, s *rxTCP, vx *vxlanEndpoint) bool {
	over := e.mem.over.Load()
	if over == nil || len(*over) == 0 {
		return false
	}
	ip, tcpOff, tcpLen := s.ip, s.tcp, s.tcpLen
	if !s.ok || s.segLen == 0 {
		return false
	}
	t := header.TCP(b[tcpOff:])
	f := t.Flags()
	if f.Intersects(header.TCPFlagSyn | header.TCPFlagFin | header.TCPFlagRst) {
		return false
	}
	if _, found := slices.BinarySearch(*over, s.flow(b)); !found {
		return false
	}
	e.mem.drops.Add(1)
	if f.Contains(header.TCPFlagAck) {
		e.dispatchTo(vx, pureACK(b[:tcpOff+tcpLen], ip, tcpOff, tcpLen, t.SequenceNumber()), rxMeta{})
	}
	return true
}
