// Package stack joins ustack's parts into a gVisor network stack: the
// driver's NIC model and poll loop feed a link endpoint of ours, behind which
// gVisor runs IPv4, IPv6 (with ARP and NDP), TCP, UDP and ICMP. It exposes
// the stack to Go code as net.Listener, net.Conn and net.PacketConn (its own
// TCPListener, TCPConn and UDPConn over gVisor's endpoints, whose errors
// are Go's net errors: errors.go), and its counters in `ethtool -S` form.
// Dial, Listen and LookupHost take Go's network and address strings
// (netdial.go), names resolved on the stack (resolve.go); beside the wire's
// NIC there is a loopback interface (loopback.go), and Config.Routes reach
// past the wire's subnets (route.go).
//
// A Stack is safe for concurrent use. Close resets every connection, stops
// the driver and returns every RX page to the pool; Shutdown first lets
// every connection deliver what was written and its FIN (shutdown.go).
//
// The receive path is one pipeline, the link endpoint's Deliver
// (endpoint.go, whose doc lists the stages in order with their Config
// switches): XDP and cpumap (xdp.go, xsk.go), GRO, UDP trains (train.go)
// and their split (udpsplit.go), zero-window ACKs (zerowindow.go), the TCP
// memory limit (tcpmem_governor.go), copy or zero-copy lending
// (zerocopy.go), pcap (pcap.go) and the tunnel's NIC (tunnel.go). The
// header reads these stages share are in headers.go, on gVisor's header
// views.
package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/gro"
)

// DefaultMAC is the station address used when Config.MAC is zero: a locally
// administered unicast address.
var DefaultMAC = [6]byte{0x02, 0x75, 0x73, 0x74, 0x6b, 0x01}

const nicID tcpip.NICID = 1

// Config configures a Stack.
type Config struct {
	// Wire is the link: a driver.TAP, a driver.PlainWire (driver.OpenWater:
	// no offloads, so the stack computes checksums and segments itself) or
	// one end of driver.NewMemPair. The Stack owns it from New on and
	// closes it. A wire that bounds its frames says so with a method
	// MaxFrame() int (the virtio-net header included; driver.MemWire has
	// it), and New refuses it if the stack's frames would not fit: with
	// offloads a 64 KB GSO super-frame, its link header and the
	// virtio-net header; without (Offloads() false), the MTU's frame.
	Wire driver.Wire
	// Queues are the further queues of a multi-queue device, whose first
	// is Wire (driver.OpenTAPQueues): each gets a driver of its own (NIC
	// model, ring, page pool of Pool's configuration, poll loop, GRO), all
	// delivering to the one gVisor NIC; a flow's packets leave on the
	// queue its hash picks. The Stack owns them. With XDP each queue's poll
	// loop has its own cpumap producer; the AF_XDP socket (BindXSK) is
	// queue 0's. Driver.NICCPUs and PollCPUs pin queue i to their i-th CPU
	// (round robin) when there are several queues.
	Queues []driver.Wire
	// Addrs are the stack's addresses with their subnets; a route to each
	// subnet is added. New refuses an invalid prefix and an unspecified,
	// multicast or loopback address (the stack's loopback interface owns
	// 127.0.0.1/8 and ::1, so that 127.0.0.1, ::1 and "localhost" reach
	// its own listeners).
	Addrs []netip.Prefix
	// Routes are further routes on the wire, past the subnets of Addrs:
	// a default route is {Dst: 0.0.0.0/0 (or ::/0), Gateway: a router on
	// one of those subnets}. The most specific route to a destination is
	// taken, the subnets' own before a route of Routes of the same length.
	// New refuses what `ip route add` refuses (see Route). None: only the
	// subnets are reached, and a dial past them fails at once.
	Routes []Route
	// DNSServers are the name servers LookupHost, Dial and Listen ask, in
	// order, over the stack itself (UDP port 53, TCP when an answer is
	// truncated). None: only IP literals and localhost resolve. The
	// host's /etc/resolv.conf and /etc/hosts are never read.
	DNSServers []netip.Addr
	// MAC is the station address (DefaultMAC if zero).
	MAC [6]byte
	// Driver configures the NIC model; its MAC and Multicast are set from
	// this Config.
	Driver driver.Config
	// Pool configures the RX page pool (used when Driver.Pool is nil).
	// Pool.NoRecycle also sets Driver.PagePerFrame: a driver without page
	// recycling starts every frame on a fresh page (mlx4's page-recycling patch's "before",
	// as mlx4 did before its page cache), so recycling off is the whole
	// of that behaviour, not only the pool's half.
	Pool bufpool.Config
	// Pcap, if set, records both directions, as tcpdump on the interface
	// does: every packet as it is handed to gVisor (after GRO: a merged
	// packet is one large frame), every train a TrainConn receives (once,
	// whole), and every frame the stack writes to the wire, without the
	// virtio-net header (a GSO super-frame as one frame, its checksum
	// left partial; XDP_TX frames are not recorded, as the kernel's taps
	// do not see them). PcapWire records the frames as read from the wire
	// (received only). The Stack does not close them.
	Pcap, PcapWire *PcapWriter
	// DelayedACK, if positive, holds the pure ACKs gVisor sends right after
	// a segment with data, on flows that send data themselves, for up to
	// this long, so that the application's reply carries the ACK, as
	// Linux's delayed ACK in pingpong mode (delack.go). 0: every ACK at once.
	DelayedACK time.Duration
	// BusyRead, if positive, has a read that finds its socket empty spin
	// for up to this long before it parks, processing the receive rings
	// itself while their poll loops sleep, as net.core.busy_read and
	// SO_BUSY_POLL do (busyread.go); at most driver.MaxBusyPoll. Applies to
	// TCPConn's Read and ReadViews, UDPConn's and PingConn's reads and
	// TrainConn's ReadTrain and TakeTrain. 0 (the default, as Linux's):
	// park at once; a spinning reader holds a core for as long as a peer
	// keeps it waiting.
	BusyRead time.Duration
	// InlineTCP has gVisor's TCP process a segment for a connected socket
	// in the goroutine that delivers it, as Linux runs TCP in softirq
	// (tcp_v4_rcv calls tcp_v4_do_rcv): the poll loop, a cpumap worker, a
	// busy reader polling the ring (BusyRead), or the sender of a packet
	// over the loopback interface, instead of handing every segment to one
	// of gVisor's processor goroutines. A socket the application holds
	// (a read or write in progress in gVisor) keeps the segment queued,
	// and a processor takes it once the application lets go, as
	// release_sock processes the socket backlog; a socket another
	// goroutine is processing, and listening and connecting sockets and
	// TIME_WAIT, leave it to a processor too. It needs the patched gVisor
	// of internal/gvisor (New fails in a build with the stockgvisor tag).
	// Off by default: gVisor's processors, as upstream.
	InlineTCP bool
	// NoGRO turns the GRO engine off (on by default, as `ethtool -K gro`).
	NoGRO bool
	// GROFlushTimeout is gro_flush_timeout: 0 flushes GRO at the end of
	// every poll batch; more keeps packets across batches until that old.
	GROFlushTimeout time.Duration
	// XDP is the program run on every frame in the poll loop (nil: none);
	// cpumap.ParseProgram builds the built-in ones.
	XDP cpumap.Program
	// CPUMap lists the OS CPUs of the cpumap's entries, the targets of the
	// program's redirects (nil: no cpumap; redirects are dropped).
	CPUMap []int
	// NoCPUMapGRO turns the cpumap workers' GRO off (the cpumap GRO patch's "before").
	NoCPUMapGRO bool
	// CPUMapQueue is the ring size of each cpumap entry (0: default).
	CPUMapQueue int
	// NoSACK turns TCP selective acknowledgements off (on by default).
	NoSACK bool
	// NoModerateReceiveBuffer turns receive-buffer auto-tuning off.
	NoModerateReceiveBuffer bool
	// TCPReceiveBufferMax is the largest TCP receive buffer auto-tuning
	// may grow a connection's to (the third value of Linux's tcp_rmem);
	// 0 means DefaultTCPReceiveBufferMax. It bounds the receive window,
	// and with it a stream's rate: window / round-trip time.
	TCPReceiveBufferMax int
	// TCPRmemBytes charges a TCP connection's received segments to its
	// receive buffer by their bytes, as stock gVisor does, instead of by
	// the memory the driver's RX layout pins for them (driver.Truesize),
	// as Linux charges skb->truesize to sk_rmem_alloc: with truesizes, the
	// advertised window is the free buffer times the len/truesize ratio
	// measured from received segments (tcp_measure_rcv_mss,
	// tcp_win_from_space), auto-tuning grows the buffer by that ratio
	// (tcp_rcvbuf_grow), and in-order data past the buffer makes gVisor
	// grow the buffer to the maximum, then copy the queue into compact
	// segments, then drop (tcp_prune_queue, tcp_collapse: counters
	// gvisor_tcp_prune_called, _rcv_collapsed, _ofo_pruned, _rcv_pruned,
	// _rcv_q_drop). Truesizes need the patched gVisor of
	// internal/gvisor; the stock build charges bytes.
	TCPRmemBytes bool
	// Tunnel, if set, terminates an IPv6 tunnel (IPv4-in-IPv6 and
	// IPv6-in-IPv6) in ustack: see TunnelConfig. Driver.Tunnel is set
	// from it.
	Tunnel *TunnelConfig
	// VXLAN, if set, terminates a VXLAN tunnel over IPv6 in ustack: see
	// VXLANConfig. Driver.VXLANPorts and GRO's VXLAN ports are set from
	// it. With a TAP, open it with driver.TAPConfig.UDPTunnel so that the
	// peer's tunnel super-frames arrive whole.
	VXLAN *VXLANConfig
	// ZeroCopy hands payload to gVisor without copying it: the RX pages
	// are gVisor buffer chunks and each frag becomes a view of its page;
	// the pool reuses a page once gVisor let go of it. TCPConn.ReadViews
	// can then give the application the pages themselves. Off: payload is
	// copied once into gVisor. With Driver.Pool set, that pool must have
	// been made with Memory: NewChunkMemory() (New does it otherwise); the
	// further queues' pools (Queues) use the first pool's chunk memory
	// unless Pool.Memory is set.
	ZeroCopy bool
	// ZeroCopyMaxLent bounds the pages zero copy lends to gVisor at once
	// (rx_pp_lent_current): past it, frags of pages not lent yet are
	// copied (zc_frags_copied_over_limit), so that what a peer makes
	// gVisor hold (out-of-order segments, fragments, unread data) cannot
	// pin more pages. 0: as many as the pool's ring holds (lent pages wait
	// in the ring, or on the pool's parked list of the same size).
	ZeroCopyMaxLent int
	// TCPMemLimit bounds the stack's TCP receive memory, the sum of its
	// connections' receive buffers, as Linux's tcp_mem[2] (in bytes):
	// past TCPMemPressure buffers are shrunk to a fair share, and past
	// the limit with every buffer at TCPMemFloor, the segments of
	// connections holding more than that are dropped (see
	// tcpMemGovernor). 0 means DefaultTCPMemLimit; negative, no bound.
	TCPMemLimit int64
	// TCPMemPressure is where memory pressure begins (tcp_mem[1]); it
	// ends below half of it (tcp_mem[0]). 0 means 3/4 of TCPMemLimit.
	TCPMemPressure int64
}

// DefaultTCPReceiveBufferMax is Config.TCPReceiveBufferMax's default, 32
// MiB: what this project's test machines set in tcp_rmem (Linux's own
// default is 6 MiB). gVisor's own maximum, 4 MiB, caps a single stream
// at about 19 Gbit/s on them: a window of 4 MiB drains in 1.7 ms at that
// rate, about the round trip of a full receive path under load.
const DefaultTCPReceiveBufferMax = 32 << 20

// Stack is a running ustack: driver, link endpoint and gVisor stack.
type Stack struct {
	cfg    Config
	drv    *driver.Driver
	queues []*rxQueue // Config.Queues' (nil: one queue)
	ep     *linkEndpoint
	ip     *gstack.Stack
	close  sync.Once
	shut   shutdownState // Close's and Shutdown's (shutdown.go)
	views  viewTotals
	busy   busyReadStats
	// mem bounds the TCP receive memory (nil: no bound).
	mem *tcpMemGovernor
	// dnsTimeout is the resolver's time per server and query (0:
	// resolve.go's dnsTimeout); tests shorten it.
	dnsTimeout time.Duration
}

// New builds and starts a stack on cfg.Wire. On error the wire is closed.
func New(cfg Config) (s *Stack, err error) {
	if cfg.Wire == nil {
		return nil, errors.New("stack: no wire")
	}
	defer func() {
		if err != nil {
			cfg.Wire.Close()
			for _, w := range cfg.Queues {
				if w != nil {
					w.Close() // again if a driver closed it: wires allow that
				}
			}
		}
	}()
	if err := checkQueues(&cfg); err != nil {
		return nil, err
	}
	if err := checkNetConfig(&cfg); err != nil {
		return nil, err
	}
	if err := checkBusyRead(&cfg); err != nil {
		return nil, err
	}
	memLimit, memPressure, memOn, err := tcpMemLimits(&cfg)
	if err != nil {
		return nil, err
	}
	if cfg.MAC == ([6]byte{}) {
		cfg.MAC = DefaultMAC
	}
	if cfg.MAC[0]&1 != 0 {
		return nil, fmt.Errorf("stack: MAC %x is a multicast address", cfg.MAC)
	}
	dc := cfg.Driver
	dc.MAC = cfg.MAC
	dc.XDP = cfg.XDP != nil
	if w, ok := cfg.Wire.(interface{ L3() bool }); ok && w.L3() {
		dc.L3 = true // a TUN device: IP packets, no Ethernet header
	}
	for _, p := range []*PcapWriter{cfg.Pcap, cfg.PcapWire} {
		if p != nil && p.raw != dc.L3 {
			return nil, errors.New("stack: a pcap of a TUN's packets is raw IP (CreateRawPcap), of a TAP's Ethernet (CreatePcap)")
		}
	}
	dc.Multicast = multicastMACs(cfg.Addrs)
	if t := cfg.Tunnel; t != nil {
		if err := t.validate(cfg.Addrs); err != nil {
			return nil, err
		}
		dc.Tunnel = t.driverConfig()
		dc.Multicast = multicastMACs(append(cfg.Addrs[:len(cfg.Addrs):len(cfg.Addrs)], netip.PrefixFrom(t.Local, 128)))
	}
	if v := cfg.VXLAN; v != nil {
		if dc.L3 {
			return nil, errors.New("stack: a VXLAN tunnel needs an Ethernet wire (a TAP), not a TUN")
		}
		vc := *v
		if err := vc.validate(dc.MAC); err != nil {
			return nil, err
		}
		cfg.VXLAN = &vc
		dc.VXLANPorts = []uint16{vc.Port}
		dc.Multicast = append(dc.Multicast, multicastMACs([]netip.Prefix{netip.PrefixFrom(vc.Local, 128)})...)
	}
	if err := checkMaxFrame(&cfg, dc.MTU, dc.L3); err != nil {
		return nil, err
	}
	if cfg.PcapWire != nil {
		dc.WireTap = cfg.PcapWire
	}
	nq := 1 + len(cfg.Queues)
	pins := [2][]int{dc.NICCPUs, dc.PollCPUs}
	dc.NICCPUs, dc.PollCPUs = queuePin(pins[0], 0, nq), queuePin(pins[1], 0, nq)
	if dc.Pool == nil {
		if cfg.Pool.NoRecycle {
			dc.PagePerFrame = true // before ringPages: it sizes the RQ's WQEs
		}
		if dc.Pool, err = newPool(&cfg, &dc); err != nil {
			return nil, err
		}
	}
	drv, err := driver.New(cfg.Wire, dc)
	if err != nil {
		return nil, err
	}
	// The further queues: a driver each, on a pool of its own, pinned to
	// its CPUs. A failure closes what was made (and New's defer the wires).
	var queues []*rxQueue
	closeDrivers := func() { // on a failure from here on
		drv.Close()
		for _, q := range queues {
			q.drv.Close()
		}
	}
	// With zero copy their pools share the first pool's chunk memory, so
	// that its one address index (viewMemory.mapPage) finds every queue's
	// pages for ReadViews.
	qcfg := cfg
	if m, ok := dc.Pool.Memory().(*viewMemory); ok && cfg.ZeroCopy && cfg.Pool.Memory == nil {
		qcfg.Pool.Memory = m
	}
	for i, w := range cfg.Queues {
		qc := dc
		qc.NICCPUs, qc.PollCPUs = queuePin(pins[0], i+1, nq), queuePin(pins[1], i+1, nq)
		if qc.Pool, err = newPool(&qcfg, &qc); err == nil {
			var qd *driver.Driver
			if qd, err = driver.New(w, qc); err == nil {
				queues = append(queues, &rxQueue{drv: qd})
				continue
			}
		}
		closeDrivers()
		return nil, fmt.Errorf("stack: queue %d: %w", i+1, err)
	}
	dc = drv.Config()
	ep := newLinkEndpoint(drv, dc.MTU, tcpip.LinkAddress(cfg.MAC[:]))
	if o, ok := cfg.Wire.(interface{ Offloads() bool }); ok && !o.Offloads() {
		ep.noOffloads = true
	}
	ep.pcap, ep.trains.pcap = cfg.Pcap, cfg.Pcap
	ep.truesize = truesizeAvailable && !cfg.TCPRmemBytes
	if cfg.ZeroCopy {
		ep.lend = newLendStats(drv.Pool(), cfg.ZeroCopyMaxLent)
		ep.lend.l3 = ep.l3
	}
	ep.epoch = time.Now()
	if cfg.DelayedACK < 0 {
		closeDrivers()
		return nil, fmt.Errorf("stack: delayed ack %v < 0", cfg.DelayedACK)
	}
	if cfg.DelayedACK > 0 {
		ep.startDelayedACK(cfg.DelayedACK)
	}
	if !cfg.NoGRO {
		if cfg.GROFlushTimeout < 0 {
			closeDrivers()
			return nil, fmt.Errorf("stack: gro flush timeout %v < 0", cfg.GROFlushTimeout)
		}
		ep.gro = gro.New(groConfig(&cfg, ep.l3), &groSink{e: ep, inl: &ep.inl})
		ep.groTimeout = cfg.GROFlushTimeout
	}
	if cfg.Tunnel != nil {
		ep.tunnel = newTunnelEndpoint(cfg.Tunnel, dc.MTU)
	}
	if cfg.VXLAN != nil {
		ep.vxlan = newVXLANEndpoint(cfg.VXLAN, dc.MTU)
	}
	ep.xdp = cfg.XDP
	if len(cfg.CPUMap) > 0 {
		if err := ep.startCPUMap(&cfg); err != nil {
			closeDrivers()
			return nil, err
		}
	}
	ip, err := newGVisor(ep, ep.tunnel, ep.vxlan, &cfg)
	if err != nil {
		closeDrivers()
		if ep.cpumap != nil {
			ep.cpumap.Close()
		}
		return nil, err
	}
	ep.txDrvs = []*driver.Driver{drv}
	for _, q := range queues {
		q.ep = ep
		if ep.cpumap != nil {
			q.cpuProd = ep.cpumap.NewProducer() // a bulk queue set per poll loop
		}
		if ep.lend != nil {
			ep.lend.addPool(q.drv.Pool())
		}
		if ep.gro != nil {
			q.gro = gro.New(groConfig(&cfg, ep.l3), &groSink{e: ep, inl: &q.inl})
			q.groTimeout = cfg.GROFlushTimeout
		}
		ep.txDrvs = append(ep.txDrvs, q.drv)
	}
	drv.Start(ep)
	for _, q := range queues {
		q.drv.Start(q)
	}
	s = &Stack{cfg: cfg, drv: drv, ep: ep, ip: ip, queues: queues}
	if memOn {
		s.mem = startTCPMem(ip, &ep.mem, memLimit, memPressure)
	}
	return s, nil
}

// NewWithEndpoint builds a stack with the same gVisor options over another
// link endpoint, such as gVisor's own fdbased one, for comparisons. It has
// no driver: Driver returns nil and the counters are gVisor's only.
// cfg.Wire and cfg.Driver are ignored.
func NewWithEndpoint(ep gstack.LinkEndpoint, cfg Config) (*Stack, error) {
	if err := checkNetConfig(&cfg); err != nil {
		return nil, err
	}
	if err := checkBusyRead(&cfg); err != nil {
		return nil, err
	}
	if cfg.Tunnel != nil || cfg.VXLAN != nil {
		return nil, errors.New("stack: a tunnel needs ustack's own driver")
	}
	memLimit, memPressure, memOn, err := tcpMemLimits(&cfg)
	if err != nil {
		return nil, err
	}
	ip, err := newGVisor(ep, nil, nil, &cfg)
	if err != nil {
		return nil, err
	}
	s := &Stack{cfg: cfg, ip: ip}
	if memOn {
		s.mem = startTCPMem(ip, new(tcpMemGate), memLimit, memPressure)
	}
	return s, nil
}

// checkNetConfig checks cfg's addresses, routes and name servers.
func checkNetConfig(cfg *Config) error {
	if len(cfg.Addrs) == 0 {
		return errors.New("stack: no address")
	}
	if err := checkAddrs(cfg.Addrs); err != nil {
		return err
	}
	if err := checkRoutes(cfg.Routes, cfg.Addrs); err != nil {
		return err
	}
	for _, a := range cfg.DNSServers {
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("stack: DNS server %s: want a unicast address", a)
		}
	}
	cfg.DNSServers = slices.Clone(cfg.DNSServers) // the resolver's, read-only
	return nil
}

// newGVisor builds the gVisor stack over ep: protocols, TCP options, the NIC,
// addresses and subnet routes, Config.Routes, the loopback interface, and
// the tunnel's NIC, addresses and routes when tun is not nil, and the VXLAN
// device's when vx is not nil.
func newGVisor(ep gstack.LinkEndpoint, tun *tunnelEndpoint, vx *vxlanEndpoint, cfg *Config) (*gstack.Stack, error) {
	ip := gstack.New(gstack.Options{
		NetworkProtocols:   []gstack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol, arp.NewProtocol},
		TransportProtocols: []gstack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
		HandleLocal:        true,
	})
	fail := func(err error) (*gstack.Stack, error) {
		ip.Close()
		ip.Wait()
		return nil, err
	}
	sack := tcpip.TCPSACKEnabled(!cfg.NoSACK)
	if e := ip.SetTransportProtocolOption(tcp.ProtocolNumber, &sack); e != nil {
		return fail(fmt.Errorf("stack: tcp sack: %s", e))
	}
	mod := tcpip.TCPModerateReceiveBufferOption(!cfg.NoModerateReceiveBuffer)
	if e := ip.SetTransportProtocolOption(tcp.ProtocolNumber, &mod); e != nil {
		return fail(fmt.Errorf("stack: tcp moderate receive buffer: %s", e))
	}
	rmem := tcpip.TCPReceiveBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: tcp.DefaultReceiveBufferSize, Max: cfg.TCPReceiveBufferMax}
	if rmem.Max == 0 {
		rmem.Max = DefaultTCPReceiveBufferMax
	}
	if rmem.Max < rmem.Default {
		return fail(fmt.Errorf("stack: TCPReceiveBufferMax %d: want at least %d", rmem.Max, rmem.Default))
	}
	if e := ip.SetTransportProtocolOption(tcp.ProtocolNumber, &rmem); e != nil {
		return fail(fmt.Errorf("stack: tcp receive buffer range: %s", e))
	}
	if cfg.InlineTCP {
		if err := setInlineTCP(ip); err != nil {
			return fail(err)
		}
	}
	if e := ip.CreateNIC(nicID, ep); e != nil {
		return fail(fmt.Errorf("stack: create NIC: %s", e))
	}
	var routes []tcpip.Route
	for _, p := range cfg.Addrs {
		pa := protocolAddress(p)
		if e := ip.AddProtocolAddress(nicID, pa, gstack.AddressProperties{}); e != nil {
			return fail(fmt.Errorf("stack: add address %s: %s", p, e))
		}
		routes = append(routes, tcpip.Route{Destination: pa.AddressWithPrefix.Subnet(), NIC: nicID})
	}
	if tun != nil {
		r, err := tun.setup(ip, cfg.Tunnel)
		if err != nil {
			return fail(err)
		}
		// The tunnel's subnets first: gVisor takes the first matching
		// route, and an inner subnet may lie inside a wire subnet.
		routes = append(r, routes...)
	}
	if vx != nil {
		r, err := vx.setup(ip, cfg.VXLAN, cfg.Addrs)
		if err != nil {
			return fail(err)
		}
		routes = append(r, routes...) // first, as the tunnel's
	}
	routes = append(routes, gvisorRoutes(cfg.Routes)...)
	if err := addLoopback(ip); err != nil {
		return fail(err)
	}
	ip.SetRouteTable(routes)
	return ip, nil
}

// newPool makes a queue's page pool of cfg.Pool's configuration, sized for
// dc's ring.
func newPool(cfg *Config, dc *driver.Config) (*bufpool.Pool, error) {
	pc := cfg.Pool
	if cfg.ZeroCopy && pc.Memory == nil {
		pc.Memory = newViewMemory()
	}
	if pc.RingSize == 0 {
		pc.RingSize = ringPages(dc, &pc)
		if cfg.ZeroCopy {
			pc.RingSize += ZeroCopyRingPages
		}
	}
	return bufpool.New(pc)
}

// ZeroCopyRingPages is what a zero-copy stack adds to its pool's ring: with
// zero copy, pages also wait there while gVisor's socket buffers hold them,
// so the ring holds 16 MiB of 4 KB pages more (a few connections' receive
// buffers). A page that finds the ring full is let go: gVisor keeps it, but
// ReadViews then copies it.
const ZeroCopyRingPages = 4096

// ringPages sizes the pool's quarantine ring for every page the RX ring can
// have in flight: the frames of the RQ's WQEs (driver.Config.RQSize), or of
// the completion entries if those are fewer, each of which may span a page
// more than its length needs, and the WQE being filled. Pages come back to
// the ring only when nothing references them, so a ring smaller than that
// would drop pages still in use and allocate new ones.
func ringPages(dc *driver.Config, pc *bufpool.Config) int {
	page := pc.PageSize
	if page == 0 {
		page = bufpool.PageSize4K
	}
	frame := dc.MTU + 18
	if dc.MTU == 0 {
		frame = driver.DefaultMTU + 18
	}
	if dc.WholeSuperFrames() {
		frame = 65535 + 18
	}
	entries := dc.RingSize
	if entries == 0 {
		entries = driver.DefaultRingSize
	}
	wqes, wqe := dc.RQDepth()
	return min(entries*(frame/page+2), wqes*(wqe/page+2)) + wqe/page + 1
}

// multicastMACs returns the Ethernet groups the stack listens to: IPv4
// all-hosts, and for IPv6 all-nodes and each address's solicited-node group.
func multicastMACs(addrs []netip.Prefix) [][6]byte {
	out := [][6]byte{{0x01, 0x00, 0x5e, 0x00, 0x00, 0x01}}
	has6 := false
	for _, p := range addrs {
		if !p.Addr().Is6() {
			continue
		}
		if !has6 {
			out = append(out, [6]byte{0x33, 0x33, 0, 0, 0, 1})
			has6 = true
		}
		a := p.Addr().As16()
		out = append(out, [6]byte{0x33, 0x33, 0xff, a[13], a[14], a[15]})
	}
	return out
}

// Driver returns the stack's driver (counters, configuration, pool).
func (s *Stack) Driver() *driver.Driver { return s.drv }

// Done returns a channel that is closed when the stack's receive stops:
// after Close, or on its own when reading the wire failed (a TAP whose
// device was deleted, say; counted as rx_wire_errors, and Err says why).
// A stack made by NewWithEndpoint has no driver and returns nil, which
// never becomes ready.
func (s *Stack) Done() <-chan struct{} {
	if s.drv == nil {
		return nil
	}
	return s.drv.Done()
}

// Err returns the error that stopped the stack's receive before Close
// (driver.Driver.Err), or nil.
func (s *Stack) Err() error {
	if s.drv == nil {
		return nil
	}
	return s.drv.Err()
}

// GVisor returns the underlying gVisor stack, for options this package does
// not wrap.
func (s *Stack) GVisor() *gstack.Stack { return s.ip }

// fullAddr converts ap for gVisor's sockets. It binds to no NIC, as a
// socket without SO_BINDTODEVICE: a listener on the unspecified address
// then takes connections from every interface (the wire's, the loopback,
// the tunnel's), a dial goes where the route table (or a local route)
// says, and a bound address must be one the stack owns
// (ErrBadLocalAddress, EADDRNOTAVAIL).
func (s *Stack) fullAddr(ap netip.AddrPort) (tcpip.FullAddress, tcpip.NetworkProtocolNumber) {
	fa := tcpip.FullAddress{Port: ap.Port()}
	if ap.Addr().IsValid() && !ap.Addr().IsUnspecified() {
		fa.Addr = tcpip.AddrFromSlice(ap.Addr().Unmap().AsSlice())
	}
	if ap.Addr().Is6() && !ap.Addr().Is4In6() {
		return fa, ipv6.ProtocolNumber
	}
	return fa, ipv4.ProtocolNumber
}

// ListenTCP listens on addr; the listener is a *TCPListener, whose Accept
// returns *TCPConn connections, and on the closed listener an error
// wrapping net.ErrClosed. An unspecified address listens on every address
// of the stack's family: use netip.IPv6Unspecified() for IPv6 and
// IPv4-mapped, 0.0.0.0 for IPv4 only. Its errors are *net.OpError with Op
// "listen": EADDRINUSE for a port in use, EADDRNOTAVAIL for an address
// the stack does not own, as the kernel's bind.
func (s *Stack) ListenTCP(addr netip.AddrPort) (net.Listener, error) {
	return s.listenTCP("tcp", addr, false)
}

// listenTCP is ListenTCP for Listen's network ("tcp", "tcp4" or "tcp6",
// for its errors); v6only makes an IPv6 listener take no IPv4 connections
// (IPV6_V6ONLY). Its errors are *net.OpError, as net.Listen's.
func (s *Stack) listenTCP(network string, addr netip.AddrPort, v6only bool) (net.Listener, error) {
	fa, proto := s.fullAddr(addr)
	if addr.Addr().IsUnspecified() {
		fa.Addr = tcpip.Address{}
	}
	la := net.TCPAddrFromAddrPort(addr)
	var wq waiter.Queue
	ep, e := s.ip.NewEndpoint(tcp.ProtocolNumber, proto, &wq)
	if e != nil {
		return nil, listenError(network, la, "socket", e)
	}
	if v6only {
		ep.SocketOptions().SetV6Only(true)
	}
	if e := ep.Bind(fa); e != nil {
		ep.Close()
		return nil, listenError(network, la, "bind", e)
	}
	if e := ep.Listen(listenBacklog); e != nil {
		ep.Close()
		return nil, listenError(network, la, "listen", e)
	}
	return newTCPListener(s, network, &wq, ep, proto), nil
}

// DialTCP connects to addr; the connection is a *TCPConn. Its errors are
// *net.OpError with Op "dial" around the errno of Linux's connect
// (ECONNREFUSED, ENETUNREACH, EHOSTUNREACH, ETIMEDOUT), or net's error for
// a cancelled or expired ctx, as net.Dialer.DialContext's. As the kernel
// connects them, 0.0.0.0 and :: are the loopback address, and a multicast
// or broadcast address fails at once (ENETUNREACH); a zero addr fails
// with net's "missing address".
func (s *Stack) DialTCP(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	c, err := s.dialTCP(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ListenUDP binds a UDP socket to addr; the socket is a *UDPConn.
func (s *Stack) ListenUDP(addr netip.AddrPort) (net.PacketConn, error) {
	return s.listenUDPBuffer(addr, 0)
}

// listenUDPBuffer is ListenUDP with a receive buffer of size bytes (0:
// gVisor's default).
func (s *Stack) listenUDPBuffer(addr netip.AddrPort, size int64) (net.PacketConn, error) {
	return s.listenUDP("udp", addr, size, false)
}

// listenUDP is listenUDPBuffer for ListenPacket's network ("udp", "udp4"
// or "udp6", for its errors); v6only makes an IPv6 socket take no IPv4
// datagrams (IPV6_V6ONLY). Its errors are *net.OpError, as
// net.ListenPacket's.
func (s *Stack) listenUDP(network string, addr netip.AddrPort, size int64, v6only bool) (net.PacketConn, error) {
	fa, proto := s.fullAddr(addr)
	if addr.Addr().IsUnspecified() {
		fa.Addr = tcpip.Address{}
	}
	la := net.UDPAddrFromAddrPort(addr)
	var wq waiter.Queue
	ep, e := s.ip.NewEndpoint(udp.ProtocolNumber, proto, &wq)
	if e != nil {
		return nil, listenError(network, la, "socket", e)
	}
	if size > 0 {
		ep.SocketOptions().SetReceiveBufferSize(size, true)
	}
	if v6only {
		ep.SocketOptions().SetV6Only(true)
	}
	if e := ep.Bind(fa); e != nil {
		ep.Close()
		return nil, listenError(network, la, "bind", e)
	}
	return newUDPConn(s, network, &wq, ep, proto), nil
}

// Close resets every TCP connection (RST, as the kernel resets a socket
// closed with unread data), while the driver still runs so that the
// resets leave, then stops the driver and the gVisor stack; Shutdown
// closes gracefully. Every RX page is back in the pool when it returns,
// unless a caller still holds a Packet. Later calls return nil.
func (s *Stack) Close() error {
	var err error
	s.close.Do(func() {
		s.shut.closed.Store(true)
		s.mem.close()
		if s.ep != nil {
			if m := s.ep.trains.m.Load(); m != nil {
				for _, c := range *m {
					c.Close()
				}
			}
		}
		// The RSTs first: what gVisor sends once the driver stopped is lost.
		s.abortTCP()
		if s.ep != nil {
			s.ep.stopDelayedACK()
		}
		if s.drv != nil {
			err = s.drv.Close()
		}
		for _, q := range s.queues {
			err = errors.Join(err, q.drv.Close())
		}
		// The poll loops have stopped: what their GRO holds, and what the
		// cpumap workers have queued, goes to gVisor, which is still up.
		if s.ep != nil && s.ep.gro != nil {
			s.ep.gro.Flush()
		}
		for _, q := range s.queues {
			if q.gro != nil {
				q.gro.Flush()
			}
		}
		if s.ep != nil && s.ep.cpumap != nil {
			s.ep.cpuProd.Flush()
			for _, q := range s.queues {
				q.cpuProd.Flush()
			}
			s.ep.cpumap.Close()
		}
		if s.ep != nil && s.ep.tunnel != nil {
			s.ep.tunnel.release()
		}
		if s.ep != nil && s.ep.vxlan != nil {
			s.ep.vxlan.release()
		}
		s.ip.Close()
		s.ip.Wait()
	})
	return err
}

// Counter is one named counter.
type Counter struct {
	Name  string
	Value uint64
}

// Counters returns every counter: the driver's, the page pool's and the
// gVisor stack's, named as `ethtool -S` and /proc/net/snmp name them where
// they can be.
func (s *Stack) Counters() []Counter {
	var out []Counter
	s.EachCounter(func(name string, v uint64) { out = append(out, Counter{name, v}) })
	return out
}

// EachCounter calls fn for every counter, in a fixed order.
func (s *Stack) EachCounter(fn func(name string, v uint64)) {
	if s.drv != nil {
		s.eachQueued(fn) // the driver's, its pool's, its GRO's: every queue's
		if w, ok := s.cfg.Wire.(interface{ EachCounter(func(string, uint64)) }); ok {
			w.EachCounter(fn) // a plain wire's software offloads
		}
		s.ep.pages.each(fn)
		if s.ep.lend != nil {
			s.ep.lend.each(fn)
		}
		s.views.each(fn)
		s.busy.each(fn)
		s.ep.zw.each(fn)
		fn("rx_truesize_bytes", s.ep.truesizeBytes.Load())
		if s.ep.delack != nil {
			s.ep.delack.each(fn)
		}
		if s.ep.xdp != nil {
			s.ep.xdpStats.each(fn)
			s.ep.eachXSK(fn)
		}
		if s.ep.cpumap != nil {
			s.ep.cpumap.Stats().Each(fn)
			s.ep.eachCPUMapGRO(fn)
		}
		if s.ep.tunnel != nil {
			s.ep.tunnel.stats.each(fn)
		}
		if s.ep.vxlan != nil {
			s.ep.vxlan.stats.each(fn)
		}
	}
	st := s.ip.Stats()
	// The link endpoint's own checksum drops (csum.go); a stack on another
	// endpoint (NewWithEndpoint) has none.
	var csumIP, csumTCP, csumUDP uint64
	if s.ep != nil {
		csumIP, csumTCP, csumUDP = s.ep.csum.ip.Load(), s.ep.csum.tcp.Load(), s.ep.csum.udp.Load()
	}
	fn("ip_packets_received", st.IP.PacketsReceived.Value())
	fn("ip_malformed", st.IP.MalformedPacketsReceived.Value())
	fn("ip_checksum_errors", csumIP)
	fn("ip_invalid_dst", st.IP.InvalidDestinationAddressesReceived.Value())
	fn("tcp_segments_received", st.TCP.ValidSegmentsReceived.Value())
	fn("tcp_segments_sent", st.TCP.SegmentsSent.Value())
	fn("tcp_retransmits", st.TCP.Retransmits.Value())
	fn("tcp_checksum_errors", st.TCP.ChecksumErrors.Value()+csumTCP)
	fn("tcp_invalid_segments", st.TCP.InvalidSegmentsReceived.Value())
	fn("tcp_established", st.TCP.CurrentEstablished.Value())
	fn("tcp_rcv_queued_bytes_current", s.tcpRcvQueued())
	fn("tcp_mem_committed_bytes", s.tcpCommitted())
	eachTCPRmemCounter(&st, fn)
	s.mem.each(fn)
	fn("udp_packets_received", st.UDP.PacketsReceived.Value())
	fn("udp_receive_buffer_errors", st.UDP.ReceiveBufferErrors.Value())
	fn("udp_unknown_port", st.UDP.UnknownPortErrors.Value())
	fn("udp_checksum_errors", st.UDP.ChecksumErrors.Value()+csumUDP)
	var udpMalformed uint64 // the link endpoint's own UDP length drops (train.go)
	if s.ep != nil {
		udpMalformed = s.ep.trains.malformed.Load()
	}
	fn("udp_malformed", st.UDP.MalformedPacketsReceived.Value()+udpMalformed)
	fn("icmp_echo_requests", st.ICMP.V4.PacketsReceived.EchoRequest.Value()+st.ICMP.V6.PacketsReceived.EchoRequest.Value())
	fn("arp_requests_received", st.ARP.RequestsReceived.Value())
	fn("ndp_neighbor_solicits", st.ICMP.V6.PacketsReceived.NeighborSolicit.Value())
}
