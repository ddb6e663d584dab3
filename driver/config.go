package driver

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/hdr"
)

// RQMode is the receive queue type, as mlx5's rx_striding_rq private flag
// selects it.
type RQMode uint8

const (
	// RQStriding is the multi-packet WQE ring: each WQE is a large buffer cut
	// into strides, and frames are written back to back into it.
	RQStriding RQMode = iota
	// RQCyclic is the legacy ring: every frame gets a buffer of its own,
	// sized for the largest frame.
	RQCyclic
)

// String returns the flag value for m.
func (m RQMode) String() string {
	if m == RQCyclic {
		return "cyclic"
	}
	return "striding"
}

// ParseRQMode parses "striding" or "cyclic".
func ParseRQMode(s string) (RQMode, error) {
	switch s {
	case "striding":
		return RQStriding, nil
	case "cyclic":
		return RQCyclic, nil
	}
	return 0, fmt.Errorf("rq %q: want striding or cyclic", s)
}

// MarshalText returns the flag value for m, as String.
func (m RQMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText sets m from a flag value, as ParseRQMode parses it: m
// binds a flag with flag.TextVar.
func (m *RQMode) UnmarshalText(b []byte) error {
	v, err := ParseRQMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// MarshalText returns the flag value for m, as String.
func (m HWGROMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText sets m from a flag value, as ParseHWGRO parses it; empty
// is off, the zero value.
func (m *HWGROMode) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*m = HWGROOff
		return nil
	}
	v, err := ParseHWGRO(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// HDSAuto selects the minimal header copy of the mlx5 header-copy patch: only the bytes the
// CQE's L3/L4 types say are headers go into the linear part.
const HDSAuto = 0

// MaxHDS bounds a fixed header copy size (the linear part's capacity).
const MaxHDS = 4096

// ParseHDS parses "auto" or a byte count in 1..MaxHDS.
func ParseHDS(s string) (int, error) {
	if s == "auto" {
		return HDSAuto, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxHDS {
		return 0, fmt.Errorf("hds %q: want auto or 1..%d", s, MaxHDS)
	}
	return n, nil
}

// FormatHDS is the inverse of ParseHDS.
func FormatHDS(n int) string {
	if n == HDSAuto {
		return "auto"
	}
	return strconv.Itoa(n)
}

// HDS is a header copy size in its flag form: "auto" (HDSAuto) or a byte
// count. Config.HDS stays a plain int; (*HDS)(&cfg.HDS) binds a flag to it
// with flag.TextVar.
type HDS int

// String returns "auto" or the byte count, as FormatHDS.
func (h HDS) String() string { return FormatHDS(int(h)) }

// MarshalText returns h's flag form, as String.
func (h HDS) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText sets h from "auto" or a byte count, as ParseHDS.
func (h *HDS) UnmarshalText(b []byte) error {
	n, err := ParseHDS(string(b))
	if err != nil {
		return err
	}
	*h = HDS(n)
	return nil
}

// ParseOnOff parses "on" or "off".
func ParseOnOff(name, s string) (bool, error) {
	switch strings.ToLower(s) {
	case "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("%s %q: want on or off", name, s)
}

// FrameTap receives copies of frames for capture. WriteFrame must not
// retain the parts.
type FrameTap interface {
	WriteFrame(t time.Time, parts ...[]byte)
}

// Defaults.
const (
	DefaultMTU    = 1500
	DefaultBudget = 64 // NAPI_POLL_WEIGHT
	// KernelCoalesceUsecs is the moderation timer mlx5 starts with: net
	// DIM's default RX profile in CQE mode (NET_DIM_DEF_PROFILE_CQE, index
	// 1 of NET_DIM_RX_CQE_PROFILES: 8 us, 128 frames), adaptive RX
	// moderation being on by default. Not Config.CoalesceUsecs's default
	// (see there).
	KernelCoalesceUsecs = 8
	DefaultRingSize     = 1024
	DefaultStrideSize   = 64      // mlx5's smallest stride: no space wasted between frames
	DefaultWQEBytes     = 1 << 18 // 256 KB, mlx5's MPWQE size with LRO
	// DefaultRQSizeStriding is the striding RQ's depth in WQEs: mlx5's
	// MLX5E_PARAMS_DEFAULT_LOG_RQ_SIZE_MPW (2^3), 2 MB of 256 KB WQEs.
	DefaultRQSizeStriding = 8
	// maxCoalesceUsecs bounds Config.CoalesceUsecs: mlx5's largest CQ
	// period (MLX5E_MAX_COAL_TIME, 12 bits of microseconds).
	maxCoalesceUsecs = 4095
	// MaxBusyPoll bounds Config.BusyPoll.
	MaxBusyPoll = time.Second
	// maxLROFrame is the largest frame LRO hands up: an IP packet of 64 KB
	// behind an Ethernet header and a VLAN tag.
	maxLROFrame = 65535 + 14 + 4
	// maxHWGRORing is the largest ring hardware GRO can run with: one
	// header buffer entry per CQE, named by the CQE's 16-bit header
	// index (CQE.HeaderIndex, mlx5_cqe64's shampo.header_entry_index).
	maxHWGRORing = 1 << 16
)

// Config configures a Driver. The zero value of each field selects its
// default.
type Config struct {
	// MTU is the IP MTU of the link (default 1500).
	MTU int
	// MAC is the station address: unicast frames for any other address are
	// dropped (rx_drop_other_host).
	MAC [6]byte
	// Multicast lists the multicast MAC addresses accepted besides
	// broadcast (the groups the stack joined).
	Multicast [][6]byte
	// RQ selects the striding (default) or cyclic receive queue.
	RQ RQMode
	// LRO hands GSO super-frames up whole instead of cutting them into the
	// frames the wire would have carried.
	LRO bool
	// RxUSO hands UDP GSO super-frames (VIRTIO_NET_HDR_GSO_UDP_L4) up
	// whole, as one packet with its segment size, as virtio-net does with
	// VIRTIO_NET_F_GUEST_USO4/6 (virtio_net_hdr_to_skb: SKB_GSO_UDP_L4), so
	// that a UDP_GRO socket takes the whole train and any other socket gets
	// it split (udp_rcv_segment). Off: cut into the datagrams the wire
	// would have carried, as a NIC receives them (mlx5 has no UDP LRO).
	RxUSO bool
	// HDS is the header copy size: HDSAuto (minimal headers, the mlx5 header-copy patch) or a
	// fixed byte count (256 is the old mlx5 behaviour).
	HDS int
	// Budget is the NAPI budget: frames per poll batch (default 64). The
	// NIC model also raises an interrupt, which wakes the poll loop if it
	// sleeps, every Budget frames (and whenever the wire runs dry): its
	// interrupt moderation. A poll loop that runs sees each completion as
	// soon as the wire read that made it is done, as a driver polling its
	// CQ sees a CQE once the NIC has written it.
	Budget int
	// CoalesceBytes makes the NIC model raise its interrupt as soon as the
	// completions since the last one hold this many bytes, if that comes
	// before Budget frames: interrupt moderation by bytes. 0 moderates by
	// frames only. It matters only to a poll loop that sleeps: one that
	// runs sees every completion at once.
	CoalesceBytes int
	// CoalesceUsecs is the interrupt moderation timer in microseconds
	// (ethtool -C rx-usecs), in mlx5's default mode, restarted by each
	// completion (MLX5_CQ_PERIOD_MODE_START_FROM_CQE): a sleeping poll
	// loop is woken once the NIC has written no completion for this long,
	// which the NIC model sees when a wire read returns this long after
	// the one before it. 0: no timer; only Budget frames, CoalesceBytes and
	// a dry wire raise the interrupt.
	//
	// mlx5 starts at 8 us (KernelCoalesceUsecs), but the NIC model's gaps
	// are not the wire's: its reads also stall when the sender or the
	// poll loop takes its core, which a NIC never does, so on a machine
	// whose cores the sender shares the timer fires on the model's own
	// stalls. Off by default for that reason (docs/figures-2026-12.md,
	// run 12).
	CoalesceUsecs int
	// BusyPoll makes the poll loop spin on an empty completion queue for up
	// to this long before it sleeps waiting for the NIC's interrupt (0:
	// sleep at once; at most MaxBusyPoll): busy polling, as SO_BUSY_POLL's
	// napi_busy_loop and threaded NAPI's busy-poll mode poll a NAPI
	// instead of waiting for its IRQ. A completion that arrives during the
	// spin is processed without an interrupt or a wake-up; the spin's CPU
	// time counts in poll_cpu_ns. The loop yields to other goroutines while
	// it spins.
	BusyPoll time.Duration
	// RingSize is the number of completion queue entries, a power of two
	// (default 1024). It bounds the frames in flight between the NIC model
	// and the poll loop.
	RingSize int
	// RQSize is the receive queue's depth in WQEs (ethtool -G rx): the
	// ring memory the NIC model may fill before the poll loop has taken
	// the completions out of it, RQSize times WQEBytes with the striding
	// RQ, RQSize frames with the cyclic one or PagePerFrame, each WQE in
	// the whole pages it takes (a 1518-byte buffer holds a page) (default
	// DefaultRQSizeStriding, or RingSize for a WQE per frame; at least
	// 2, so that a frame always fits beside an unused WQE tail). When it is
	// full the NIC model stalls (rx_rq_stalls) until the poll loop
	// catches up, as it does on a full completion queue: a burst as wide
	// as the sender's window waits in the wire, not in the ring's pages.
	RQSize int
	// RQDrop makes the NIC model drop a frame that finds the RQ full
	// (rx_drop_out_of_buffer, mlx5's rx_out_of_buffer), as a NIC whose
	// driver has not posted buffers in time does, instead of stalling
	// until the poll loop frees room. A full completion queue still
	// stalls.
	RQDrop bool
	// StrideSize is the striding RQ's stride in bytes (default 64).
	StrideSize int
	// WQEBytes is the size of one striding WQE (default 256 KB).
	WQEBytes int
	// HWGRO is hardware GRO (SHAMPO): off, on, or coalesce (the SHAMPO coalescing patch).
	HWGRO HWGROMode
	// XDP says an XDP program is attached (the stack's Config.XDP or an
	// AF_XDP socket's program). As mlx5 with a program: LRO and hardware
	// GRO are refused (mlx5e_xdp_allowed: "can't set XDP while HW-GRO/LRO
	// is on"), and the linear RQ gives each frame a whole page with
	// XDPHeadroom before it (mlx5e_rx_get_linear_stride_sz: "XDP in mlx5e
	// doesn't support multiple packets per page"; mlx5e_get_linear_rq_headroom).
	XDP bool
	// L3 says the wire's frames start at their IP header: a TUN device
	// (IFF_TUN|IFF_NO_PI). The NIC model then parses frames without an
	// Ethernet header (ParseL3Frame: FrameInfo.L2Len 0), has no MAC
	// address to filter on, and its completions carry no L2; header split,
	// LRO, hardware GRO, GSO and the tunnel's decapsulation work on the
	// IP packet; an XDP program sees the IP header first (generic XDP on
	// an ARPHRD_NONE device).
	L3 bool
	// Reservation is the data reservation of one hardware GRO session
	// (default DefaultReservation).
	Reservation int
	// HWGROTimeout ends a hardware GRO session that has seen no frame for
	// this long (default DefaultHWGROTimeout).
	HWGROTimeout time.Duration
	// PagePerFrame starts every frame on a fresh page, as a driver without
	// page recycling does (the behaviour mlx4's page-recycling patch fixes): a 64 KB GRO packet
	// of 1500-byte frames then spans 45 pages.
	PagePerFrame bool
	// FillChecksum makes the NIC model write full checksums into the
	// segments it cuts from a super-frame instead of the partial form.
	FillChecksum bool
	// BounceRead makes the NIC model read every frame into a buffer of its
	// own and copy it into the ring's pages. Without it, on a wire that is
	// a VecReader, an LRO super-frame is read straight into the ring (its
	// headers into the NIC's buffer first, to be looked at), as a NIC's
	// DMA writes it: no copy. Frames that turn out not to be TCP
	// super-frames are gathered and take the copying path either way.
	BounceRead bool
	// NICCPUs and PollCPUs pin the NIC model's thread and the poll loop's
	// thread to these CPUs (nil: not pinned). With RunToCompletion, the
	// one goroutine is pinned to PollCPUs and NICCPUs is not used.
	NICCPUs, PollCPUs []int
	// RunToCompletion runs the NIC model and the poll loop on one
	// goroutine, on a wire that is a Waiter (the TAP, MemWire; on other
	// wires it is ignored): it reads up to Budget frames from the wire
	// into the ring, polls a batch, yields to the goroutines the batch
	// readied (runtime.Gosched, as ksoftirqd's cond_resched), and sleeps
	// in the wire's Wait only when the wire is dry and the ring drained.
	// An exchange's frame then reaches the handler with no hand-off
	// between goroutines, as a NIC's interrupt runs NAPI on the CPU that
	// took it. The model keeps its semantics: after a sleep the NIC part
	// reads until its interrupt is due (Budget, CoalesceBytes,
	// CoalesceUsecs, a dry wire) before the first poll; a full ring has
	// it poll a batch instead of waiting; busy readers take the ring, and
	// the wire, while it sleeps (BusyReadPoll); BusyPoll spins on the
	// wire. nic_cpu_ns is clocked per batch of wire reads, apart from
	// poll_cpu_ns.
	RunToCompletion bool
	// WireTap, if set, is given every frame read from the wire (without its
	// virtio-net header, before the NIC model looks at it), on the NIC
	// model's goroutine: `ustack run -pcap-wire`.
	WireTap FrameTap
	// Pool supplies the RX pages. If nil, a 4 KB order-0 pool is made.
	Pool *bufpool.Pool
	// Tunnel terminates IPv6 tunnels (IPv4-in-IPv6, IPv6-in-IPv6) to its
	// local addresses: such frames are handed up decapsulated. Off when
	// it lists no address.
	Tunnel TunnelConfig
	// VXLANPorts are the UDP destination ports the NIC parses as VXLAN
	// (RFC 7348), as mlx5 learns them from udp_tunnel_nic
	// (mlx5e_vxlan_set_port): for such a frame the CQE's L3 and L4 types
	// describe the inner packet, so the header copy estimate counts the
	// inner headers (MinHeaderLen), and the driver pulls the whole header
	// stack (outer through inner L4) into the linear part for GRO. With a
	// wire that carries UDP tunnel GSO (TAPConfig.UDPTunnel) the NIC
	// model cuts a tunnel super-frame into the frames the wire would have
	// carried. The tunnel itself is terminated above GRO (the stack's
	// VXLAN device), not here.
	VXLANPorts []uint16
}

func (c *Config) setDefaults() error {
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.MTU < 68 || c.MTU > 65535-14 {
		return fmt.Errorf("mtu %d: want 68..65521", c.MTU)
	}
	if c.Budget == 0 {
		c.Budget = DefaultBudget
	}
	if c.RingSize == 0 {
		c.RingSize = DefaultRingSize
	}
	if c.RingSize < 2 || c.RingSize&(c.RingSize-1) != 0 {
		return fmt.Errorf("ring size %d: want a power of two >= 2", c.RingSize)
	}
	if c.BusyPoll < 0 || c.BusyPoll > MaxBusyPoll {
		return fmt.Errorf("busy poll %v: want 0..%v", c.BusyPoll, MaxBusyPoll)
	}
	if c.CoalesceUsecs < 0 || c.CoalesceUsecs > maxCoalesceUsecs {
		return fmt.Errorf("coalesce usecs %d: want 0..%d", c.CoalesceUsecs, maxCoalesceUsecs)
	}
	if c.CoalesceBytes < 0 {
		return fmt.Errorf("coalesce bytes %d: want >= 0", c.CoalesceBytes)
	}
	if c.Budget < 1 || c.Budget > c.RingSize {
		return fmt.Errorf("budget %d: want 1..ring size (%d)", c.Budget, c.RingSize)
	}
	if c.StrideSize == 0 {
		c.StrideSize = DefaultStrideSize
	}
	if c.StrideSize < 64 || c.StrideSize > 8192 || c.StrideSize&(c.StrideSize-1) != 0 {
		return fmt.Errorf("stride %d: want a power of two in 64..8192", c.StrideSize)
	}
	if c.WQEBytes == 0 {
		c.WQEBytes = DefaultWQEBytes
	}
	if c.RQSize == 0 {
		c.RQSize, _ = c.RQDepth()
	}
	if c.RQSize < 2 {
		return fmt.Errorf("rq size %d: want >= 2 WQEs", c.RQSize)
	}
	if c.HDS < 0 || c.HDS > MaxHDS {
		return fmt.Errorf("hds %d: want auto or 1..%d", c.HDS, MaxHDS)
	}
	if c.Reservation == 0 {
		c.Reservation = DefaultReservation
	}
	if c.HWGROTimeout == 0 {
		c.HWGROTimeout = DefaultHWGROTimeout
	}
	if c.HWGRO > HWGROCoalesce || c.Reservation < 4096 || c.HWGROTimeout < 0 {
		return fmt.Errorf("hw-gro %v, reservation %d, timeout %v: want off/on/coalesce, >= 4096, >= 0", c.HWGRO, c.Reservation, c.HWGROTimeout)
	}
	if c.HWGRO != HWGROOff && c.LRO {
		return fmt.Errorf("hw-gro and lro: the hardware does one or the other")
	}
	if c.XDP && (c.LRO || c.HWGRO != HWGROOff) {
		return fmt.Errorf("xdp with lro or hw-gro on: can't set XDP while HW-GRO/LRO is on, disable them first (mlx5e_xdp_allowed)")
	}
	if c.HWGRO != HWGROOff && c.RingSize > maxHWGRORing {
		return fmt.Errorf("hw-gro with ring size %d: a CQE's header index is 16 bits (mlx5's header_entry_index), want a ring of at most %d", c.RingSize, maxHWGRORing)
	}
	if err := c.Tunnel.validate(); err != nil {
		return err
	}
	for _, p := range c.VXLANPorts {
		if p == 0 {
			return fmt.Errorf("vxlan port 0: want a UDP port")
		}
	}
	if c.RQ != RQStriding && c.RQ != RQCyclic {
		return fmt.Errorf("rq mode %d unknown", c.RQ)
	}
	if c.Pool == nil {
		p, err := bufpool.New(bufpool.Config{})
		if err != nil {
			return err
		}
		c.Pool = p
	}
	if c.WQEBytes < c.maxFrame() {
		return fmt.Errorf("wqe size %d: want room for a %d-byte frame", c.WQEBytes, c.maxFrame())
	}
	return nil
}

// RQDepth returns the receive queue's depth with c's settings, defaults
// applied: its WQEs (Config.RQSize) and the bytes of each. The NIC model
// fills at most wqes*wqeBytes of ring ahead of the poll loop.
func (c Config) RQDepth() (wqes, wqeBytes int) {
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.RingSize == 0 {
		c.RingSize = DefaultRingSize
	}
	wqes, wqeBytes = c.RQSize, c.WQEBytes
	if wqeBytes == 0 {
		wqeBytes = DefaultWQEBytes
	}
	perFrame := c.RQ == RQCyclic || c.PagePerFrame
	if perFrame {
		wqeBytes = c.maxFrame() // one buffer per frame
	}
	if wqes == 0 {
		wqes = DefaultRQSizeStriding
		if perFrame {
			wqes = c.RingSize
		}
	}
	return wqes, wqeBytes
}

// maxFrame is the largest frame the RX queue accepts.
// WholeSuperFrames reports whether some super-frames go up whole (LRO, or
// RxUSO for UDP), so that frames of up to 64 KB reach the RQ: mlx5's
// packet_merge, which also rules out the linear RQ.
func (c *Config) WholeSuperFrames() bool { return c.LRO || c.RxUSO }

func (c *Config) maxFrame() int {
	if c.WholeSuperFrames() {
		return maxLROFrame
	}
	return c.MTU + 14 + 4
}

// mlx5's linear striding RQ, with the x86-64 values of the kernel's
// constants.
const (
	// LinearHeadroom is the headroom before a frame in a linear stride:
	// mlx5e_get_linear_rq_headroom without XDP, NET_IP_ALIGN (0 on x86)
	// plus MLX5_RX_HEADROOM (NET_SKB_PAD, 64 with 64-byte cache lines).
	LinearHeadroom = 64
	// XDPHeadroom is that headroom with an XDP program attached:
	// NET_IP_ALIGN plus XDP_PACKET_HEADROOM.
	XDPHeadroom = 256
	// skbSharedInfoSize is sizeof(struct skb_shared_info) on x86-64 with
	// MAX_SKB_FRAGS 17: 48 bytes of fields and 17 16-byte frags.
	skbSharedInfoSize = 320
	// smpCacheBytes is SMP_CACHE_BYTES, SKB_DATA_ALIGN's unit.
	smpCacheBytes = 64
	// hardMTU is MLX5E_ETH_HARD_MTU, what MLX5E_SW2HW_MTU adds to the
	// MTU: ETH_HLEN, VLAN_HLEN and ETH_FCS_LEN (4).
	hardMTU = header.EthernetMinimumSize + hdr.VLANTagLen + 4
	// mpwqeLogStrideMax and mpwqeLogStridesMin bound a striding WQE's
	// geometry (mlx5e_verify_rx_mpwqe_strides): strides of at most 8 KB
	// (MLX5_MPWQE_LOG_STRIDE_SZ_MAX 13), at least 8 per WQE
	// (MLX5_MPWQE_LOG_NUM_STRIDES_EXT_BASE 3: ConnectX-6 Dx and later
	// have ext_stride_num_range).
	mpwqeLogStrideMax  = 13
	mpwqeLogStridesMin = 3
)

// skbDataAlign is SKB_DATA_ALIGN.
func skbDataAlign(n int) int { return (n + smpCacheBytes - 1) &^ (smpCacheBytes - 1) }

// LinearStride returns the stride of mlx5's linear striding RQ for these
// settings, or 0 where mlx5 takes the nonlinear path. It is
// mlx5e_rx_mpwqe_is_linear_skb and mlx5e_rx_get_linear_stride_sz without
// XDP: no packet merge (LRO off, hardware GRO off), a frame with its
// headroom and skb_shared_info that fits a page (mlx5e_rx_get_linear_sz_skb:
// MLX5_SKB_FRAG_SZ(headroom + hw_mtu) <= PAGE_SIZE), and a stride, that
// size rounded up to a power of two, that a WQE of wqeBytes can be cut
// into. pageSize is the kernel's PAGE_SIZE (the pool's base page). At MTU
// 1500 with 4 KB pages: 64 + 1522 aligned to 1600, plus 320, is 1920, a
// 2 KB stride, two frames a page; at MTU 4096 or 9000 the frame does not
// fit a 4 KB page.
func LinearStride(mtu, pageSize, wqeBytes int, lro bool, hwgro HWGROMode) int {
	return linearStride(mtu, pageSize, wqeBytes, lro, hwgro, false)
}

// linearStride is LinearStride, with an XDP program attached when xdp:
// the headroom is XDPHeadroom and a stride smaller than a page becomes a
// page (mlx5e_rx_get_linear_stride_sz), so one frame per page: at MTU 1500
// with 4 KB pages, 256 + 1522 aligned to 1792, plus 320, is 2112, a 4 KB
// stride. A frame that does not fit takes the nonlinear path, as mlx5's
// multi-buffer XDP does.
func linearStride(mtu, pageSize, wqeBytes int, lro bool, hwgro HWGROMode, xdp bool) int {
	if lro || hwgro != HWGROOff {
		return 0 // params->packet_merge.type != MLX5E_PACKET_MERGE_NONE
	}
	hr := LinearHeadroom
	if xdp {
		hr = XDPHeadroom
	}
	sz := skbDataAlign(hr+mtu+hardMTU) + skbDataAlign(skbSharedInfoSize) // MLX5_SKB_FRAG_SZ
	if sz > pageSize {
		return 0
	}
	stride := 1
	for stride < sz {
		stride <<= 1 // roundup_pow_of_two
	}
	if xdp && stride < pageSize {
		stride = pageSize
	}
	logStride, logWQE := 0, 0
	for 1<<logStride < stride {
		logStride++
	}
	for 1<<(logWQE+1) <= wqeBytes {
		logWQE++
	}
	if logStride > mpwqeLogStrideMax || logWQE-logStride < mpwqeLogStridesMin {
		return 0
	}
	return stride
}

// LinearStride returns the stride of the linear RQ the driver runs with
// c's settings, defaults applied, or 0 when it builds packets the
// nonlinear way (mlx5e_skb_from_cqe_mpwrq_nonlinear): LinearStride of
// the MTU, the pool's base page and the WQE size. Only the striding RQ
// with frames packed into pages takes the linear path here: the cyclic RQ
// and PagePerFrame build every packet the nonlinear way (see the package
// doc).
func (c Config) LinearStride() int {
	if c.RQ != RQStriding || c.PagePerFrame {
		return 0
	}
	mtu, wqe, page := c.MTU, c.WQEBytes, bufpool.PageSize4K
	if mtu == 0 {
		mtu = DefaultMTU
	}
	if wqe == 0 {
		wqe = DefaultWQEBytes
	}
	if c.Pool != nil {
		page = c.Pool.PageSize()
	}
	return linearStride(mtu, page, wqe, c.WholeSuperFrames(), c.HWGRO, c.XDP)
}

// LinearHeadroom returns the headroom before a frame in a linear stride
// with c's settings: XDPHeadroom with a program attached, else
// LinearHeadroom.
func (c Config) LinearHeadroom() int {
	if c.XDP {
		return XDPHeadroom
	}
	return LinearHeadroom
}

// RXPath names the way the driver builds packets with c's settings, as
// the kernel function mlx5 uses: "linear" (mlx5e_skb_from_cqe_mpwrq_linear,
// the frame is the packet's linear part, in its stride), "nonlinear"
// (mlx5e_skb_from_cqe_mpwrq_nonlinear: the header copy of HDS, payload in
// frags) or "shampo" (mlx5e_skb_from_cqe_shampo, hardware GRO; frames it
// does not take are built the nonlinear way).
func (c Config) RXPath() string {
	switch {
	case c.HWGRO != HWGROOff:
		return "shampo"
	case c.LinearStride() > 0:
		return "linear"
	}
	return "nonlinear"
}
