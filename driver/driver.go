// Package driver is ustack's NIC model and its driver: it reads frames from a
// Wire (a TAP device or an in-memory peer), writes them into an RX ring of
// pages from bufpool as an mlx5 NIC would (striding or cyclic receive queue,
// LRO, header/data split), and runs a NAPI-like poll loop that hands the
// frames up as Packets in batches. With LRO, on a Wire that is a VecReader
// (the TAP is), a TCP super-frame is read with one readv straight into the
// ring's pages, as DMA writes it, its first bytes into the NIC model's own
// buffer to be parsed (Config.BounceRead turns that off).
//
// Receive paths, as mlx5 picks them (mlx5e_rq_set_handlers):
//
//   - Linear (mlx5e_skb_from_cqe_mpwrq_linear): when
//     mlx5e_rx_mpwqe_is_linear_skb holds (LRO and hardware GRO off, and
//     MLX5_SKB_FRAG_SZ(headroom + MTU + 22) within a page: MTU up to 3690
//     with 4 KB pages; Config.LinearStride), every frame gets one stride of
//     mlx5e_rx_get_linear_stride_sz bytes (2 KB at MTU 1500: two frames a
//     page), written after LinearHeadroom bytes, with room left for
//     skb_shared_info. The packet is built over it without a copy
//     (napi_build_skb): its linear part is the frame in the page, a head
//     frag (bufpool.Packet.Head), and it has no frags; HDS does not apply.
//     GRO moves a merged head's payload into a frag, as skb_gro_receive
//     does with a head_frag skb. Counted as rx_skb_linear.
//   - Nonlinear (mlx5e_skb_from_cqe_mpwrq_nonlinear): otherwise (LRO on, a
//     larger MTU), frames go back to back on 64-byte strides, the HDS
//     header copy goes into the packet's own linear buffer and the rest
//     stays in the pages as frags; headers a short copy missed are pulled
//     from them (pskb_may_pull, rx_hds_pull_bytes). Counted as
//     rx_skb_nonlinear.
//   - SHAMPO (mlx5e_skb_from_cqe_shampo, hardware GRO): headers from the
//     header buffer, payloads as frags; a session packet closes when the
//     CQE does not match, or when mlx5e_hw_gro_skb_has_enough_space fails
//     (PAGE_SIZE * nr_frags + the next payload > 64 KB), in both modes, at
//     a CQE with the flush bit (the NIC ended the session with that frame:
//     PSH, FIN and the other flags tcp_gro_receive ends a train on), and
//     at the end of a poll (mlx5e_poll_rx_cq). A bulk sender's TSO frames
//     end with PSH, so a session never spans two of them.
//     Frames SHAMPO does not take are built the nonlinear way.
//
// Where the model differs from mlx5 on these paths: the cyclic RQ and
// PagePerFrame always build the nonlinear way (mlx5's cyclic RQ has a
// linear path too, mlx5e_skb_from_cqe_linear); the linear check assumes a
// NIC with ext_stride_num_range (ConnectX-6 Dx and later: at least 8
// strides a WQE); skb->truesize is not modelled, so
// a linear packet's stride (2 KB for a 1.5 KB frame) is not charged
// downstream, as the kernel charges it to the socket; a frame whose
// stride would cross a page (it cannot: strides are powers of two no
// larger than a page) would fall back to the nonlinear build.
//
// XDP (Config.XDP, set by the stack when a program is attached): as mlx5
// with a program, LRO and hardware GRO are refused (mlx5e_xdp_allowed),
// and the linear RQ gives every frame a whole page, XDPHeadroom (256)
// bytes in (mlx5e_rx_get_linear_stride_sz, mlx5e_get_linear_rq_headroom):
// at MTU 1500 one frame per 4 KB page instead of two. A frame too large
// for that takes the nonlinear path, as with mlx5's multi-buffer XDP. The
// program runs on the packet the driver built (the stack's Deliver, as
// do_xdp_generic), not on the raw stride before the build as mlx5's
// mlx5e_xdp_handle does; on the linear path the two are the same bytes.
//
// LRO sessions: ustack's LRO packet is the sender's TSO frame as one wire
// read brings it (rx_lro_packets = rx_gso_frames), with the sender's MSS
// as gso_size. mlx5 ends a session at lro_max_ip_payload_size (65280 B),
// after lro_timeout (32 us), at a frame that does not match and at its
// MPWQE's end, and may join two bursts; a 64 KB TSO frame (65192 B of IP
// payload) fits one either way. GRO merges almost no LRO packets in both:
// two full ones pass 64 KB (skb_gro_receive: -E2BIG), and mlx5's gso_size
// is DIV_ROUND_UP(cqe_bcnt, lro_num_seg) (mlx5e_build_rx_skb), so pieces
// of different segment counts differ and tcp_gro_receive keeps them apart,
// where ustack's, all at the MSS, could merge.
//
// Threading: the NIC model runs in its own goroutine locked to an OS thread
// (the hardware); it posts one CQE per frame into a single-producer,
// single-consumer completion queue, makes them visible after each wire read
// (a running poll loop takes them at once, as mlx5e_poll_rx_cq takes every
// CQE the NIC has written), and interrupts a sleeping poll loop after
// Budget frames, CoalesceBytes bytes, the moderation timer CoalesceUsecs
// (restarted by each CQE, as mlx5's CQE-based moderation) or when the wire
// runs dry. The poll loop runs in a second
// goroutine (the softirq) and calls the Handler for each packet, in ring
// order, then Flush once per batch of at most Budget packets. Transmit may
// be called from any goroutine.
//
// Truesize is not modelled. The kernel charges a GRO frag_list packet more
// socket memory than a frags one of the same length (skb_gro_receive adds
// each chained skb's whole truesize, its head included), and
// tcp_try_rmem_schedule and the advertised window see it. ustack hands such
// a packet to gVisor with the skb's structure (a view per chained packet,
// stack's toGVisor), but gVisor charges a segment its bytes plus fixed
// struct sizes (segMemSize: segSize + PacketBuffer.MemSize), not its views'
// capacity; the one lever from outside, ReserveHeaderBytes, would allocate
// and zero the memory it makes gVisor count. So a frag_list packet costs
// here what it costs in ustack (a view and a copy per chained packet,
// rx_gro_frag_list), not the kernel's rmem.
package driver

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/rrtrace"
)

// Driver is one RX queue and one TX queue of the NIC model over a Wire.
type Driver struct {
	cfg     Config
	wire    Wire
	handler Handler
	xdp     XDPHandler // handler, when it is one and Config.XDP is set
	stats   Stats
	pool    *bufpool.Pool

	// Completion queue: written by the NIC goroutine at prod, read by the
	// poll loop at cons. Slots between cons and prod belong to the poll loop.
	cq    []CQE
	mask  uint32
	prod  atomic.Uint32
	cons  atomic.Uint32
	irq   chan struct{} // NIC -> poll loop: work posted while it slept
	space chan struct{} // poll loop -> NIC: CQEs consumed while it waited

	pollSleeping atomic.Bool
	nicWaiting   atomic.Bool

	// napi says who may process the ring: the poll loop or a busy reader
	// (busyread.go), one at a time, as NAPI_STATE_SCHED.
	napi napiOwner

	nic nicState // owned by the NIC goroutine (with RunToCompletion, by the ring's holder)

	// RunToCompletion: the wire's Waiter, nil when the NIC model and the
	// poll loop run on goroutines of their own; the CPU time of batches
	// polled for ring space inside the NIC's reads (the ring's holder's).
	waiter        Waiter
	roomPollNanos int64
	split         rtcSplitState

	// Hardware GRO (SHAMPO): the header buffer, one entry per CQE, written
	// by the NIC and read by the poll loop like the CQE itself; the poll
	// loop's session builder; counters.
	headers []byte
	hwb     shampoBuilder
	shampo  shampoStats
	epoch   time.Time

	txMu sync.Mutex
	// +checklocks:txMu
	txBuf []byte
	txHdr int // +checklocksignore: the virtio-net header's length on the wire (wireVnetHdrLen), set by New, read-only after

	startOnce sync.Once
	closeOnce sync.Once
	stop      chan struct{}
	closing   chan struct{} // closed when Close begins: the NIC model stops waiting
	nicDone   chan struct{}
	pollDone  chan struct{}
	nicErr    error        // set before nicDone is closed (wireFailed)
	nicCPU    atomic.Int32 // NICCPU
	pollCPU   atomic.Int32 // PollCPU
}

// New returns a driver for wire. It does not start reading until Start.
func New(wire Wire, cfg Config) (*Driver, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	d := &Driver{
		cfg:      cfg,
		wire:     wire,
		pool:     cfg.Pool,
		cq:       make([]CQE, cfg.RingSize),
		mask:     uint32(cfg.RingSize - 1),
		irq:      make(chan struct{}, 1),
		space:    make(chan struct{}, 1),
		stop:     make(chan struct{}),
		closing:  make(chan struct{}),
		nicDone:  make(chan struct{}),
		pollDone: make(chan struct{}),
		txHdr:    wireVnetHdrLen(wire),
	}
	// The header's bytes past struct virtio_net_hdr (a 24-byte header's
	// num_buffers, hash and tunnel fields) stay zero: ustack sends no
	// tunnel GSO.
	d.txBuf = make([]byte, d.txHdr+maxLROFrame)
	if cfg.HWGRO != HWGROOff {
		d.headers = make([]byte, cfg.RingSize*shampoHeaderEntry)
	}
	if w, ok := wire.(Waiter); ok && cfg.RunToCompletion {
		d.waiter = w
		d.split.give = make(chan struct{}, 1)
		d.split.back = make(chan struct{}, 1)
	}
	d.epoch = time.Now()
	d.nic.init(d)
	d.nicCPU.Store(-1)
	d.pollCPU.Store(-1)
	return d, nil
}

// NICCPU returns the CPU the NIC model's thread started on, after pinning
// it to Config.NICCPUs, or -1 before it started, if its pinning failed, or
// where the CPU is not known (outside Linux). An unpinned thread may have
// moved since. Safe to call from any goroutine.
func (d *Driver) NICCPU() int { return int(d.nicCPU.Load()) }

// PollCPU returns the CPU the poll loop's thread started on, after pinning
// it to Config.PollCPUs (or unpinned, if that failed), or -1 before it
// started or where the CPU is not known (outside Linux). An unpinned
// thread may have moved since. Safe to call from any goroutine.
func (d *Driver) PollCPU() int { return int(d.pollCPU.Load()) }

// Config returns the driver's configuration with defaults filled in.
func (d *Driver) Config() Config { return d.cfg }

// Stats returns the driver's counters.
func (d *Driver) Stats() *Stats { return &d.stats }

// Pool returns the page pool the RX ring uses.
func (d *Driver) Pool() *bufpool.Pool { return d.pool }

// Start starts the NIC model and the poll loop, which delivers to h.
func (d *Driver) Start(h Handler) {
	d.startOnce.Do(func() {
		d.handler = h
		if x, ok := h.(XDPHandler); ok && d.cfg.XDP {
			d.xdp = x
		}
		if d.waiter != nil {
			go d.runLoop()
			return
		}
		go d.nicLoop()
		go d.pollLoop()
	})
}

// Close closes the wire, stops both goroutines, drops the frames still in
// the ring and returns every page the driver held to the pool. Packets
// already delivered stay valid until their owners release them.
func (d *Driver) Close() error {
	var err error
	d.closeOnce.Do(func() {
		close(d.closing)
		err = d.wire.Close()
		started := d.handler != nil
		if !started {
			d.startOnce.Do(func() {}) // never start after Close
			close(d.nicDone)          // for Done: the NIC will never read
			d.nic.retire()
			d.nic.closeSession()
			d.nic.closeCyclic()
			d.pool.Close()
			return
		}
		<-d.nicDone
		close(d.stop)
		<-d.pollDone
		d.nic.retire()
		d.nic.closeSession()
		d.nic.closeCyclic()
		// Drop the pool's hold on the pages in its quarantine; pages of
		// packets still held elsewhere go when those are released.
		d.pool.Close()
		if d.nicErr != nil && !errors.Is(d.nicErr, os.ErrClosed) {
			err = errors.Join(err, d.nicErr)
		}
	})
	return err
}

// Done returns a channel that is closed when the NIC model has stopped
// reading the wire: after Close, or on its own when a read from the wire
// failed (Err says why) or its thread could not be pinned (Config.NICCPUs).
// Receive is then dead until Close; transmit may still work.
func (d *Driver) Done() <-chan struct{} { return d.nicDone }

// Err returns the error that stopped the NIC model before Close: a failed
// wire read (counted as rx_wire_errors and logged) or a failure to pin its
// thread. It returns nil while the NIC model runs, and after it stopped
// because the wire was closed (Close, or an in-memory wire's peer closed).
// Safe to call from any goroutine.
func (d *Driver) Err() error {
	select {
	case <-d.nicDone:
	default:
		return nil
	}
	if errors.Is(d.nicErr, os.ErrClosed) {
		return nil
	}
	return d.nicErr
}

// wireFailed ends the NIC goroutine's reading with the error err from
// Wire.Read: a closed wire is how Close stops it; anything else (a TAP
// whose device was deleted reads EBADFD, as tun_chr_read_iter returns when
// the tun_file has no device) is counted and logged, once, since the NIC
// goroutine stops. Called by the NIC goroutine only, before nicDone closes.
func (d *Driver) wireFailed(err error) {
	d.nicErr = err
	if errors.Is(err, os.ErrClosed) {
		return
	}
	d.stats.WireErrors.Add(1)
	slog.Error("driver: wire read failed; receive stopped until Close", "err", err)
}

// clock is the NIC model's time in ns.
func (d *Driver) clock() int64 { return int64(time.Since(d.epoch)) }

// EachHWGRO calls fn for every hardware GRO counter.
func (d *Driver) EachHWGRO(fn func(name string, v uint64)) { d.shampo.each(fn) }

// Transmit writes one frame to the wire behind the virtio-net header h. The
// frame is the concatenation of parts; the caller keeps ownership of them.
func (d *Driver) Transmit(h *VirtioNetHdr, parts [][]byte) error {
	d.txMu.Lock()
	defer d.txMu.Unlock()
	h.Encode(d.txBuf)
	n := d.txHdr
	for _, p := range parts {
		if n+len(p) > len(d.txBuf) {
			d.stats.TxErrors.Add(1)
			return fmt.Errorf("transmit: frame longer than %d bytes", len(d.txBuf)-d.txHdr)
		}
		n += copy(d.txBuf[n:], p)
	}
	// rrtrace follows replies: a bare ACK (at most 86 bytes, IPv6 with
	// timestamps) is not one.
	reply := n-d.txHdr > 100
	if reply {
		rrtrace.Mark(rrtrace.TxStart)
	}
	if err := d.wire.Write(d.txBuf[:n]); err != nil {
		d.stats.TxErrors.Add(1)
		return err
	}
	if reply {
		rrtrace.Mark(rrtrace.TxEnd)
	}
	d.stats.TxPackets.Add(1)
	d.stats.TxBytes.Add(uint64(n - d.txHdr))
	if h.GSOType != VirtioNetHdrGSONone {
		d.stats.TxGSO.Add(1)
	}
	return nil
}
