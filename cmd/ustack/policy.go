package main

import (
	"encoding"
	"errors"
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

// policy holds the receive-path switches shared by run and bench. The
// flags bind straight into cfg, which stack.New takes (a Go user gets what
// the CLI gets: the rules that join packages, such as recycling off
// meaning a page per frame, are stack.New's); the few fields beside it are
// what finish turns into cfg once every flag is parsed.
type policy struct {
	cfg stack.Config

	xdp    string             // -xdp: parsed by finish, which knows -cpumap's entries
	views  bool               // -zero-copy views: the discard server reads with ReadViews
	plain  bool               // -wire plain: water's TAP, no virtio-net header, no offloads
	l3     bool               // the device is a TUN: -xdp's program sees IP packets (set by run)
	tunnel string             // -tunnel off|ip6tnl|vxlan
	tun    stack.TunnelConfig // -tunnel-local, -tunnel-remote, -tunnel-remote4, -tunnel-addr
	vni    int64              // -tunnel-id (vxlan)
}

// policySwitch is one row of the policy table: a flag of ustack run and
// bench, the help text and docs/policies.md come from it (policyTable).
type policySwitch struct {
	name    string // the flag's name
	values  string // its values, as the help and the table show them
	def     string // its default, in the form String prints
	kernel  string // what it models in Linux, or ""
	usage   string // what it does
	summary bool   // always in policy.String (bench row names), even at the default
	// bind returns the flag's variable in p: a textVar bound into p.cfg
	// (or beside it), or a *bool for a boolean flag (-pool-poison).
	bind func(p *policy) any
}

// textVar is what flag.TextVar binds.
type textVar interface {
	encoding.TextMarshaler
	encoding.TextUnmarshaler
}

// policies is the policy table, in the order of the help and the docs.
var policies = []policySwitch{
	{name: "mtu", values: "N", def: "1500", kernel: "ip link set mtu", summary: true,
		usage: "IP MTU of the link; match the TAP's",
		bind:  func(p *policy) any { return &number[int]{p: &p.cfg.Driver.MTU} }},
	{name: "rq", values: "striding|cyclic", def: "striding", kernel: "mlx5 priv flag rx_striding_rq", summary: true,
		usage: "receive queue: multi-packet WQEs cut into 64 B strides, frames back to back (striding), or one buffer per frame (cyclic, the legacy ring)",
		bind:  func(p *policy) any { return &p.cfg.Driver.RQ }},
	{name: "lro", values: "on|off", def: "on", kernel: "ethtool -K lro", summary: true,
		usage: "hand GSO super-frames from the TAP up whole, as hardware LRO; off: cut them into the MTU-sized frames the wire would have carried",
		bind:  func(p *policy) any { return (*onOff)(&p.cfg.Driver.LRO) }},
	{name: "rx-uso", values: "on|off", def: "off", kernel: "virtio-net guest USO (VIRTIO_NET_F_GUEST_USO4/6)",
		usage: "hand UDP GSO super-frames from the TAP up whole, one packet per super-frame (up to 128 datagrams, UDP_MAX_SEGMENTS), as virtio-net does (a UDP_GRO socket takes the train, others get it split); off: cut into datagrams, as a NIC receives them",
		bind:  func(p *policy) any { return (*onOff)(&p.cfg.Driver.RxUSO) }},
	{name: "wire", values: "offload|plain", def: "offload", kernel: "tun IFF_VNET_HDR and TUNSETOFFLOAD (CSUM, TSO, USO)",
		usage: "the TAP's wire: ustack's own, with the virtio-net header and offloads (offload), or water's bare frames, one per read, no offloads: the NIC model verifies every checksum and the stack segments and checksums what it sends (plain; the only wire outside Linux)",
		bind:  func(p *policy) any { return &choice{p: &p.plain, off: "offload", on: "plain"} }},
	{name: "wire-read", values: "direct|bounce", def: "direct", kernel: "NIC DMA (direct) or a bounce buffer",
		usage: "how the NIC model reads LRO super-frames: readv straight into the ring's pages, as DMA (direct), or into a buffer, then copied (bounce)",
		bind:  func(p *policy) any { return &choice{p: &p.cfg.Driver.BounceRead, off: "direct", on: "bounce"} }},
	{name: "hds", values: "auto|N", def: "auto", kernel: "mlx5 header copy (MLX5E_RX_MAX_HEAD)", summary: true,
		usage: fmt.Sprintf("header/data split on the nonlinear RQ path (LRO or hw-gro on, or an MTU whose frame does not fit a linear stride; MTU 1500 with LRO off builds the packet over the stride, mlx5e_rx_mpwqe_is_linear_skb): copy only the headers into the linear part (auto, the mlx5 header-copy patch) or N bytes in 1..%d (256: the old mlx5 copy)", driver.MaxHDS),
		bind:  func(p *policy) any { return (*driver.HDS)(&p.cfg.Driver.HDS) }},
	{name: "gro", values: "on|off", def: "on", kernel: "ethtool -K gro", summary: true,
		usage: "software GRO on the poll loop",
		bind:  func(p *policy) any { return (*offOn)(&p.cfg.NoGRO) }},
	{name: "hw-gro", values: "off|on|coalesce", def: "off", kernel: "ethtool -K rx-gro-hw (mlx5 SHAMPO)",
		usage: "hardware GRO; coalesce: adjacent payloads extend one frag up to the page (the SHAMPO coalescing patch); needs -lro off",
		bind:  func(p *policy) any { return &p.cfg.Driver.HWGRO }},
	{name: "gro-flush-timeout", values: "D", def: "0s", kernel: "gro_flush_timeout",
		usage: "keep GRO packets across poll batches until this old; 0 flushes at each batch end",
		bind:  func(p *policy) any { return &duration{p: &p.cfg.GROFlushTimeout} }},
	{name: "budget", values: "N", def: strconv.Itoa(driver.DefaultBudget), kernel: "NAPI weight (NAPI_POLL_WEIGHT)",
		usage: "NAPI budget: frames per poll batch; the NIC model also raises its interrupt (wakes a sleeping poll loop) every N frames",
		bind:  func(p *policy) any { return &number[int]{p: &p.cfg.Driver.Budget} }},
	{name: "coalesce-bytes", values: "N", def: "0", kernel: "ethtool -C (interrupt moderation)",
		usage: "interrupt moderation by bytes: the NIC model raises its interrupt once the completions since the last one hold this many bytes, if before -budget frames (0: by frames only); a running poll loop sees every completion at once",
		bind:  func(p *policy) any { return &number[int]{p: &p.cfg.Driver.CoalesceBytes} }},
	{name: "rx-usecs", values: "N", def: "0", kernel: "ethtool -C rx-usecs (mlx5 CQE-based moderation)",
		usage: fmt.Sprintf("interrupt moderation timer in microseconds, restarted by each completion: a sleeping poll loop is woken at the wire read that comes this long after the one before (0: none, only -budget frames, -coalesce-bytes and a dry wire wake it; mlx5 starts at %d, but the NIC model's read gaps include its own stalls: off by default)", driver.KernelCoalesceUsecs),
		bind:  func(p *policy) any { return &number[int]{p: &p.cfg.Driver.CoalesceUsecs} }},
	{name: "busy-poll", values: "D", def: "0s", kernel: "net.core.busy_poll, SO_BUSY_POLL (napi_busy_loop)",
		usage: fmt.Sprintf("the poll loop spins on an empty completion queue for up to D before it sleeps for the NIC's interrupt, yielding to other goroutines (0: sleep at once; at most %v); its CPU shows in poll_cpu_ns", driver.MaxBusyPoll),
		bind:  func(p *policy) any { return &duration{p: &p.cfg.Driver.BusyPoll} }},
	{name: "busy-read", values: "D", def: "0s", kernel: "net.core.busy_read, SO_BUSY_POLL (sk_busy_loop)",
		usage: fmt.Sprintf("a read that finds its socket empty spins for up to D before it parks, processing the ring itself while the poll loop sleeps, yielding to other goroutines (0: park at once; at most %v). Off by default, as in Linux: a spinning reader holds a core for as long as a peer keeps it waiting", driver.MaxBusyPoll),
		bind:  func(p *policy) any { return &duration{p: &p.cfg.BusyRead} }},
	{name: "run-to-completion", values: "on|off", def: "off", kernel: "NAPI polled in the softirq of the CPU that took the interrupt (not threaded NAPI)",
		usage: "the NIC model and the poll loop on one goroutine per queue: it reads a budget of frames from the wire, polls them, yields to the goroutines it readied and sleeps on the wire only when it is dry and the ring drained (off: two goroutines, the NIC model waking the poll loop); pinned with -poll-cpu",
		bind:  func(p *policy) any { return (*onOff)(&p.cfg.Driver.RunToCompletion) }},
	{name: "rx-ring", values: "N", def: strconv.Itoa(driver.DefaultRingSize), kernel: "mlx5 completion queue size",
		usage: "completion queue entries (power of two; at most 65536 with -hw-gro)",
		bind:  func(p *policy) any { return &number[int]{p: &p.cfg.Driver.RingSize} }},
	{name: "rq-size", values: "N", def: "0", kernel: "ethtool -G rx",
		usage: fmt.Sprintf("receive queue depth in WQEs: ring memory the NIC model fills ahead of the poll loop (0: %d striding WQEs, or -rx-ring frames with a buffer per frame)", driver.DefaultRQSizeStriding),
		bind:  func(p *policy) any { return &number[int]{p: &p.cfg.Driver.RQSize} }},
	{name: "rq-full", values: "stall|drop", def: "stall", kernel: "mlx5 rx_out_of_buffer",
		usage: "when the RQ is full: the NIC model waits for the poll loop, the wire queues (stall), or drops the frame (drop: rx_drop_out_of_buffer, as a NIC without posted buffers)",
		bind:  func(p *policy) any { return &choice{p: &p.cfg.Driver.RQDrop, off: "stall", on: "drop"} }},
	{name: "page-order", values: "N", def: "0", kernel: "page_pool order",
		usage: "highest RX page allocation order 0..4",
		bind:  func(p *policy) any { return &number[int]{p: &p.cfg.Pool.Order} }},
	{name: "page-size", values: "4k|64k", def: "4k", kernel: "PAGE_SIZE",
		usage: "base page size (64k: a PowerPC-style machine)",
		bind:  func(p *policy) any { return (*pageSize)(&p.cfg.Pool.PageSize) }},
	{name: "pool-recycle", values: "on|off", def: "on", kernel: "mlx4 page recycling, page_pool",
		usage: "recycle RX pages (mlx4's page-recycling patch); cyclic RQ: on packs frames into pages with a quarantine half (the patch), off is an order-0 page per RX slot reused when free (mlx4 before it); striding RQ: on recycles through the pool's quarantine ring, off takes a fresh page for every frame",
		bind:  func(p *policy) any { return (*offOn)(&p.cfg.Pool.NoRecycle) }},
	{name: "pool-poison", values: "", def: "false", kernel: "CONFIG_PAGE_POISONING",
		usage: "poison recycled pages and check them when reused (debug)",
		bind:  func(p *policy) any { return &p.cfg.Pool.Poison }},
	{name: "pool-mem", values: "BYTES", def: "0",
		usage: "bytes the page pool may allocate (0: no limit); past it allocations fall back to lower orders, then drop",
		bind:  func(p *policy) any { return &number[int64]{p: &p.cfg.Pool.MaxBytes, nonNeg: true} }},
	{name: "pool-ring", values: "N", def: "0", kernel: "page_pool ptr_ring size",
		usage: "pages the pool's quarantine ring holds (0: every page the RQ can span)",
		bind:  func(p *policy) any { return &number[int]{p: &p.cfg.Pool.RingSize, nonNeg: true} }},
	{name: "delayed-ack", values: "D", def: "0s", kernel: "TCP delayed ACK in pingpong mode (tcp_send_delayed_ack)",
		usage: "hold the pure ACK gVisor sends after a segment with data for up to D on flows that send data, so the reply carries it (0: every ACK at once). 1ms in -config service: one TAP write per request/response exchange instead of two; a bulk receiver's ACKs are never held",
		bind:  func(p *policy) any { return &duration{p: &p.cfg.DelayedACK} }},
	{name: "inline-tcp", values: "on|off", def: "off", kernel: "TCP in softirq (tcp_v4_rcv, the socket backlog)",
		usage: "gVisor's TCP processes a segment for a connected socket in the goroutine that delivers it (the poll loop, a cpumap worker, a busy reader) instead of waking one of its processor goroutines; a socket the application holds keeps it queued for the processor, as the backlog release_sock processes (off: every segment goes through a processor, as upstream gVisor; needs the patched gVisor of internal/gvisor). Each connection a poll batch reached is processed once at the batch's end, and so acknowledged once per batch, as the socket backlog defers its ACK (TCP_ACK_DEFERRED). On in -config service",
		bind:  func(p *policy) any { return (*onOff)(&p.cfg.InlineTCP) }},
	{name: "tcp-rmem-max", values: "BYTES", def: "0", kernel: "net.ipv4.tcp_rmem (max)",
		usage: fmt.Sprintf("largest TCP receive buffer auto-tuning grows to (0: %d)", stack.DefaultTCPReceiveBufferMax),
		bind:  func(p *policy) any { return &number[int]{p: &p.cfg.TCPReceiveBufferMax, nonNeg: true} }},
	{name: "tcp-rmem", values: "truesize|bytes", def: "truesize", kernel: "sk_rmem_alloc charged skb->truesize (skb_set_owner_r), tcp_measure_rcv_mss's scaling_ratio",
		usage: "what a TCP connection's received segments are charged against its receive buffer: truesize, the memory the RX layout pins for each (the skb struct, the header buffer, each frag's stride or page), the window being the free buffer times the len/truesize ratio measured from received segments, auto-tuning growing the buffer by it (tcp_rcvbuf_grow), and in-order data past the buffer growing it to -tcp-rmem-max, then collapsing the queue into compact copies, then dropping (tcp_prune_queue: gvisor_tcp_prune_called, _rcv_collapsed, _ofo_pruned, _rcv_pruned, _rcv_q_drop); bytes: their payload and gVisor's struct estimate, half the free buffer advertised, as stock gVisor (and always in a build against it)",
		bind:  func(p *policy) any { return &choice{p: &p.cfg.TCPRmemBytes, off: "truesize", on: "bytes"} }},
	{name: "tcp-mem-limit", values: "BYTES", def: "0", kernel: "net.ipv4.tcp_mem (high)",
		usage: fmt.Sprintf("bytes the TCP connections' receive buffers may commit in all: past it, with every buffer at its %d-byte floor, the segments of connections holding more are dropped (rx_tcp_mem_drops; 0: 3/32 of the machine's memory, as Linux's tcp_init_mem, 512 MiB if unknown; negative: no bound)", stack.TCPMemFloor),
		bind:  func(p *policy) any { return &number[int64]{p: &p.cfg.TCPMemLimit} }},
	{name: "tcp-mem-pressure", values: "BYTES", def: "0", kernel: "net.ipv4.tcp_mem (pressure)",
		usage: "bytes committed at which memory pressure begins: auto-tuning stops at a fair share of -tcp-mem-limit and larger buffers are shrunk to it; it ends below half of this (0: 3/4 of -tcp-mem-limit)",
		bind:  func(p *policy) any { return &number[int64]{p: &p.cfg.TCPMemPressure, nonNeg: true} }},
	{name: "zero-copy", values: "off|on|views", def: "off", kernel: "TCP_ZEROCOPY_RECEIVE (tcp_mmap)",
		usage: "payload to gVisor without a copy (packets under 1 KB of payload, IP fragments and, past Config.ZeroCopyMaxLent lent pages, new pages are copied, so that a peer cannot make gVisor pin pages without bound); views: the discard server also reads with TCPConn.ReadViews, in place, and the bench's UDP reader takes trains with TrainConn.TakeTrain, in place",
		bind:  func(p *policy) any { return &zeroCopy{on: &p.cfg.ZeroCopy, views: &p.views} }},
	{name: "tunnel", values: "off|ip6tnl|vxlan", def: "off", kernel: "ip -6 tunnel add mode any (ip6tnl); ip link add type vxlan dstport 4789 (vxlan)",
		usage: "terminate a tunnel in ustack. ip6tnl: IPv4-in-IPv6 and IPv6-in-IPv6, decapsulated by the driver before GRO; the peer's kernel segments its GSO packets before the TAP (a TAP carries no IP-in-IP GSO), so each segment costs a read. The kernel runs GRO on the encapsulated packet (ip4ip6_gro_receive, ip6ip6_gro_receive) before ip6_tnl_rcv; merging after decapsulation merges the same segments, as a flow's outer headers do not change, so the order does not matter for it. vxlan: VXLAN over IPv6, port 4789; the TAP carries the peer's tunnel super-frames whole (UDP tunnel GSO, a 24-byte virtio-net header), the NIC model cuts them, GRO merges inside the tunnel and the VXLAN device decapsulates after GRO, as vxlan_rcv",
		bind:  func(p *policy) any { return &enum{p: &p.tunnel, values: []string{"off", "ip6tnl", "vxlan"}} }},
	{name: "tunnel-local", values: "ADDR", def: "", kernel: "ip6tnl local; vxlan local",
		usage: "with -tunnel: ustack's outer IPv6 address (added to the TAP's NIC); for ip6tnl dedicated to the tunnel",
		bind:  func(p *policy) any { return (*ip6Addr)(&p.tun.Local) }},
	{name: "tunnel-remote", values: "ADDR", def: "", kernel: "ip6tnl remote; vxlan remote",
		usage: "with -tunnel: the peer's outer IPv6 address that encapsulated replies go to",
		bind:  func(p *policy) any { return (*ip6Addr)(&p.tun.Remote) }},
	{name: "tunnel-id", values: "N", def: "42", kernel: "vxlan id",
		usage: "with -tunnel vxlan: the VXLAN network identifier, 1..16777215",
		bind:  func(p *policy) any { return &number[int64]{p: &p.vni, nonNeg: true} }},
	{name: "tunnel-remote4", values: "ADDR", def: "",
		usage: "with -tunnel ip6tnl: the peer's outer address for IPv4 inside, if not -tunnel-remote",
		bind:  func(p *policy) any { return (*ip6Addr)(&p.tun.Remote4) }},
	{name: "tunnel-addr", values: "CIDR", def: "", kernel: "ip addr add dev ip6tnl|vxlan",
		usage: "with -tunnel: ustack's inner address with its prefix, routed through the tunnel (repeatable)",
		bind:  func(p *policy) any { return (*prefixList)(&p.tun.Addrs) }},
	{name: "xdp", values: "PROG", def: "", kernel: "ip link set xdp",
		usage: "XDP program run on every frame: pass|drop|cpu:N|hash|drop-port:P|xsk:P (xsk:P: TCP/UDP to port P to an AF_XDP socket that run drains; empty: none). Needs -lro off and -hw-gro off (mlx5e_xdp_allowed); the linear RQ then gives each frame a 4 KB page with 256 bytes of headroom, as mlx5 with XDP",
		bind:  func(p *policy) any { return (*text)(&p.xdp) }},
	{name: "cpumap", values: "LIST", def: "", kernel: "BPF_MAP_TYPE_CPUMAP",
		usage: "CPU list of the cpumap entries that redirects go to, e.g. 0,1 (empty: no cpumap)",
		bind:  func(p *policy) any { return (*cpuList)(&p.cfg.CPUMap) }},
	{name: "cpumap-gro", values: "on|off", def: "on", kernel: "cpumap GRO (cpu_map_kthread_run)",
		usage: "GRO in the cpumap workers, flushed of what is older than 1 ms every 64 frames while the ring holds frames and in full when it is empty (cpu_map_gro_flush); off: each round goes to the stack as one list (netif_receive_skb_list). Either way the worker verifies a redirected frame's checksums in software (CHECKSUM_NONE)",
		bind:  func(p *policy) any { return (*offOn)(&p.cfg.NoCPUMapGRO) }},
	{name: "cpumap-qsize", values: "N", def: "0", kernel: "bpf_cpumap_val.qsize",
		usage: "ring size of each cpumap entry (0: 2048)",
		bind:  func(p *policy) any { return &number[int]{p: &p.cfg.CPUMapQueue, nonNeg: true} }},
	{name: "nic-cpu", values: "LIST", def: "", kernel: "/proc/irq/N/smp_affinity",
		usage: "pin the NIC model's thread to this CPU list (e.g. 1 or 0,1)",
		bind:  func(p *policy) any { return (*cpuList)(&p.cfg.Driver.NICCPUs) }},
	{name: "poll-cpu", values: "LIST", def: "", kernel: "threaded NAPI's CPU affinity",
		usage: "pin the poll loop's thread to this CPU list",
		bind:  func(p *policy) any { return (*cpuList)(&p.cfg.Driver.PollCPUs) }},
}

// policySwitchNamed returns the table's row for a flag name.
func policySwitchNamed(name string) (policySwitch, bool) {
	for _, e := range policies {
		if e.name == name {
			return e, true
		}
	}
	return policySwitch{}, false
}

// help is the flag's usage line: what it does and what it models.
func (e policySwitch) help() string {
	if e.kernel == "" {
		return e.usage
	}
	return e.usage + " [Linux: " + e.kernel + "]"
}

// policyDoc returns docs/policies.md: the policy table in Markdown, for
// the README's `ustack run` section (TestPolicyTableDocs keeps the file
// in step).
func policyDoc() string {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	var b strings.Builder
	b.WriteString("<!-- Generated from cmd/ustack/policy.go (policies): go test ./cmd/ustack -run TestPolicyTableDocs -update. Do not edit. -->\n\n")
	b.WriteString("The receive-path switches of `ustack run`, also those of `ustack bench -a`/`-b` as name=value.\n\n")
	b.WriteString("| flag | default | Linux analogue | meaning |\n| --- | --- | --- | --- |\n")
	for _, e := range policies {
		flag := "-" + e.name
		if e.values != "" {
			flag += " " + e.values
		}
		def, kernel := e.def, e.kernel
		switch def {
		case "false":
			def = "off"
		case "":
			def = "none"
		}
		if kernel == "" {
			kernel = "-"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", cell(flag), cell(def), cell(kernel), cell(e.usage))
	}
	return b.String()
}

// register binds every policy flag into p on fs and sets p to the
// defaults.
func (p *policy) register(fs *flag.FlagSet) {
	for _, e := range policies {
		switch v := e.bind(p).(type) {
		case *bool:
			fs.BoolVar(v, e.name, e.def == "true", e.help())
		case textVar:
			if err := v.UnmarshalText([]byte(e.def)); err != nil {
				panic(fmt.Sprintf("policy -%s: default %q: %v", e.name, e.def, err))
			}
			fs.TextVar(v, e.name, v, e.help())
		default:
			panic(fmt.Sprintf("policy -%s: cannot bind %T", e.name, v))
		}
	}
}

// value returns e's value in p, in the form the flag takes.
func (e policySwitch) value(p *policy) string {
	switch v := e.bind(p).(type) {
	case *bool:
		return strconv.FormatBool(*v)
	case textVar:
		b, err := v.MarshalText()
		if err != nil {
			return fmt.Sprintf("%%!(%v)", err)
		}
		return string(b)
	}
	return ""
}

// defaultPolicy returns the policy of a command line without policy
// flags.
func defaultPolicy() policy {
	var p policy
	p.register(flag.NewFlagSet("policy", flag.ContinueOnError))
	return p
}

// serviceSettings are stack.ServiceConfig's changes to the defaults, as
// name=value settings of the policy switches (in the table's order), so
// that run's -config service and the bench's service row apply exactly
// what the library's ServiceConfig holds.
func serviceSettings() []string {
	def := defaultPolicy()
	svc := defaultPolicy()
	svc.cfg = stack.ServiceConfig()
	// Zero means the driver's default for these; the switches spell it out.
	d := &svc.cfg.Driver
	if d.MTU == 0 {
		d.MTU = def.cfg.Driver.MTU
	}
	if d.Budget == 0 {
		d.Budget = driver.DefaultBudget
	}
	if d.RingSize == 0 {
		d.RingSize = driver.DefaultRingSize
	}
	var out []string
	for _, e := range policies {
		if v := e.value(&svc); v != e.value(&def) {
			out = append(out, e.name+"="+v)
		}
	}
	return out
}

// Configurations of -config: where the policy switches start from.
const (
	configService = "service" // stack.ServiceConfig
	configMLX5    = "mlx5"    // the switches' defaults: mlx5 as shipped, LRO on
)

// applyConfig applies the named configuration's settings to the switches
// of fs that the command line did not set.
func applyConfig(fs *flag.FlagSet, name string) error {
	switch name {
	case configMLX5:
		return nil
	case configService:
	default:
		return fmt.Errorf("-config %q: want %s or %s", name, configService, configMLX5)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, s := range serviceSettings() {
		name, value, _ := strings.Cut(s, "=")
		if set[name] {
			continue
		}
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("-config service: %s: %w", s, err)
		}
	}
	return nil
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

// finish returns the stack's configuration: the flags' cfg with the XDP
// program and the tunnel, which depend on several flags, filled in.
// Tunnel addresses not given stay invalid, for setupBenchTunnel to fill in
// (ustack bench); stack.New rejects a tunnel without them.
func (p *policy) finish() (stack.Config, error) {
	c := p.cfg
	if c.TCPMemLimit > 0 && c.TCPMemPressure > c.TCPMemLimit {
		return c, fmt.Errorf("tcp-mem-pressure %d: want 0..-tcp-mem-limit", c.TCPMemPressure)
	}
	switch p.tunnel {
	case "ip6tnl":
		t := p.tun
		t.Addrs = append([]netip.Prefix(nil), t.Addrs...)
		c.Tunnel = &t
	case "vxlan":
		if p.vni < 1 || p.vni >= 1<<24 {
			return c, fmt.Errorf("tunnel-id %d: want 1..%d", p.vni, 1<<24-1)
		}
		c.VXLAN = &stack.VXLANConfig{Local: p.tun.Local, Remote: p.tun.Remote, VNI: uint32(p.vni),
			Addrs: append([]netip.Prefix(nil), p.tun.Addrs...)}
	}
	if p.xdp != "" {
		if c.Driver.LRO || c.Driver.HWGRO != driver.HWGROOff {
			return c, errors.New("-xdp needs -lro off and -hw-gro off: mlx5 refuses an XDP program while LRO or hardware GRO is on (mlx5e_xdp_allowed)")
		}
		var err error
		if c.XDP, err = cpumap.ParseProgramLink(p.xdp, max(1, len(c.CPUMap)), p.l3); err != nil {
			return c, err
		}
	}
	return c, nil
}

// String describes the policy in flag form: the summary switches, then
// every other one that differs from its default.
func (p *policy) String() string {
	var b strings.Builder
	add := func(e policySwitch) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(e.name + "=" + e.value(p))
	}
	for _, name := range []string{"lro", "hds", "gro", "rq", "mtu"} {
		e, _ := policySwitchNamed(name)
		add(e)
	}
	for _, e := range policies {
		if !e.summary && e.value(p) != e.def {
			add(e)
		}
	}
	return b.String()
}

// discardWith is discard with the servers' bounds.
func (p *policy) discardWith(c serve.Config) func(net.Listener, *atomic.Uint64) error {
	if p.views {
		return c.DiscardViews
	}
	return c.Discard
}

// The flag types of the policy table. Each binds a flag (flag.TextVar)
// to a field of stack.Config, or of policy beside it; UnmarshalText
// parses the flag's value, MarshalText returns its canonical form.

// onOff is a bool as on or off (any case, as driver.ParseOnOff).
type onOff bool

func (b onOff) MarshalText() ([]byte, error) {
	if b {
		return []byte("on"), nil
	}
	return []byte("off"), nil
}

func (b *onOff) UnmarshalText(t []byte) error {
	v, err := driver.ParseOnOff("value", string(t))
	*b = onOff(v)
	return err
}

// offOn is a negative bool (stack.Config.NoGRO, bufpool.Config.NoRecycle)
// as its feature's on or off: "off" sets it.
type offOn bool

func (b offOn) MarshalText() ([]byte, error) { return onOff(!b).MarshalText() }

func (b *offOn) UnmarshalText(t []byte) error {
	var on onOff
	err := on.UnmarshalText(t)
	*b = offOn(!on)
	return err
}

// enum is a string flag that takes one of values ("" is the first).
type enum struct {
	p      *string
	values []string
}

func (e *enum) MarshalText() ([]byte, error) {
	if *e.p == "" {
		return []byte(e.values[0]), nil
	}
	return []byte(*e.p), nil
}

func (e *enum) UnmarshalText(t []byte) error {
	s := string(t)
	if s == "" {
		s = e.values[0]
	}
	for _, v := range e.values {
		if s == v {
			*e.p = s
			return nil
		}
	}
	return fmt.Errorf("want one of %s", strings.Join(e.values, ", "))
}

// choice is a bool as one of two words, off's (or empty) for false.
type choice struct {
	p       *bool
	off, on string
}

func (c *choice) MarshalText() ([]byte, error) {
	if *c.p {
		return []byte(c.on), nil
	}
	return []byte(c.off), nil
}

func (c *choice) UnmarshalText(t []byte) error {
	switch string(t) {
	case "", c.off:
		*c.p = false
	case c.on:
		*c.p = true
	default:
		return fmt.Errorf("want %s or %s", c.off, c.on)
	}
	return nil
}

// number is an integer; with nonNeg, one >= 0 (the fields the command
// checks; the driver and the pool check theirs).
type number[T int | int64] struct {
	p      *T
	nonNeg bool
}

func (n *number[T]) MarshalText() ([]byte, error) {
	return []byte(strconv.FormatInt(int64(*n.p), 10)), nil
}

func (n *number[T]) UnmarshalText(t []byte) error {
	v, err := strconv.ParseInt(string(t), 0, 64)
	switch {
	case err != nil || int64(T(v)) != v:
		return errors.New("want an integer")
	case n.nonNeg && v < 0:
		return errors.New("want an integer >= 0")
	}
	*n.p = T(v)
	return nil
}

// duration is a time.Duration of at least 0.
type duration struct{ p *time.Duration }

func (d *duration) MarshalText() ([]byte, error) { return []byte(d.p.String()), nil }

func (d *duration) UnmarshalText(t []byte) error {
	v, err := time.ParseDuration(string(t))
	if err != nil || v < 0 {
		return errors.New("want a duration >= 0")
	}
	*d.p = v
	return nil
}

// pageSize is bufpool.Config.PageSize as 4k or 64k.
type pageSize int

func (s pageSize) MarshalText() ([]byte, error) {
	switch s {
	case 0, bufpool.PageSize4K:
		return []byte("4k"), nil
	case bufpool.PageSize64K:
		return []byte("64k"), nil
	}
	return []byte(strconv.Itoa(int(s))), nil
}

func (s *pageSize) UnmarshalText(t []byte) error {
	switch string(t) {
	case "4k":
		*s = bufpool.PageSize4K
	case "64k":
		*s = bufpool.PageSize64K
	default:
		return errors.New("want 4k or 64k")
	}
	return nil
}

// zeroCopy is -zero-copy: off, on (stack.Config.ZeroCopy), or views
// (ZeroCopy, and the discard server reads with ReadViews).
type zeroCopy struct{ on, views *bool }

func (z *zeroCopy) MarshalText() ([]byte, error) {
	switch {
	case *z.views:
		return []byte("views"), nil
	case *z.on:
		return []byte("on"), nil
	}
	return []byte("off"), nil
}

func (z *zeroCopy) UnmarshalText(t []byte) error {
	switch string(t) {
	case "", "off":
		*z.on, *z.views = false, false
	case "on":
		*z.on, *z.views = true, false
	case "views":
		*z.on, *z.views = true, true
	default:
		return errors.New("want off, on or views")
	}
	return nil
}

// ip6Addr is an IPv6 address (not IPv4-mapped), or empty for none.
type ip6Addr netip.Addr

func (a ip6Addr) MarshalText() ([]byte, error) { return netip.Addr(a).MarshalText() }

func (a *ip6Addr) UnmarshalText(t []byte) error {
	if len(t) == 0 {
		*a = ip6Addr{}
		return nil
	}
	v, err := netip.ParseAddr(string(t))
	if err != nil || !v.Is6() || v.Is4In6() {
		return errors.New("want an IPv6 address")
	}
	*a = ip6Addr(v)
	return nil
}

// text is a string taken as it is.
type text string

func (s text) MarshalText() ([]byte, error) { return []byte(s), nil }
func (s *text) UnmarshalText(t []byte) error {
	*s = text(t)
	return nil
}

// cpuList is a comma-separated list of CPU numbers; empty for none.
type cpuList []int

func (l cpuList) MarshalText() ([]byte, error) {
	var b []byte
	for i, n := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(n), 10)
	}
	return b, nil
}

func (l *cpuList) UnmarshalText(t []byte) error {
	v, err := parseCPUs(string(t))
	*l = v
	return err
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

// prefixList is a repeatable address flag (-addr, -tunnel-addr): each Set
// adds one; as text, a comma-separated list that UnmarshalText adds.
type prefixList []netip.Prefix

func (l *prefixList) String() string {
	b, _ := l.MarshalText()
	return string(b)
}

func (l *prefixList) Set(s string) error {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return fmt.Errorf("address %q: want CIDR like 10.0.0.2/24", s)
	}
	*l = append(*l, p)
	return nil
}

func (l prefixList) MarshalText() ([]byte, error) {
	var b []byte
	for i, p := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = p.AppendTo(b)
	}
	return b, nil
}

func (l *prefixList) UnmarshalText(t []byte) error {
	if len(t) == 0 {
		return nil
	}
	for _, f := range strings.Split(string(t), ",") {
		if err := l.Set(strings.TrimSpace(f)); err != nil {
			return err
		}
	}
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
	fs.IntVar(&f.perSource, "server-conns-per-source", serve.DefaultConnsPerSource, "discard, echo and sockperf: connections at once from one source address (and twice that from one /24 or /64: server_conns_prefix_refused); one more is closed at once (server_conns_source_refused). One client's parallel test fits (bench opens up to 64), and one source holds at most half of the echo budget")
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
