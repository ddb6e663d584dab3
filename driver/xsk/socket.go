package xsk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Wire is where a Socket writes its packets: each Write carries a
// virtio-net header (vnetHdrLen bytes, struct virtio_net_hdr without
// num_buffers) followed by the Ethernet frame, and must not retain b.
// driver.TAP (opened with VnetHdr) and driver.MemWire satisfy it.
type Wire interface {
	Write(b []byte) error
}

// vnetHdrLen is the length of struct virtio_net_hdr without num_buffers,
// the header driver.Wire frames start with: gVisor's
// header.VirtioNetHeaderSize, as driver.VirtioNetHdrLen is.
const vnetHdrLen = header.VirtioNetHeaderSize

// virtio-net header fields the socket sets (include/uapi/linux/virtio_net.h).
const (
	vnetFNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
)

// MaxFrags is the kernel's MAX_SKB_FRAGS default: the frags a multi-buffer
// TX packet may have after its first descriptor, which xsk_build_skb copies
// into the skb's linear part. A packet thus spans at most MaxFrags+1
// descriptors (maxTxDescs); at a further OptPktContd xsk_build_skb fails
// with -EOVERFLOW and the packet is dropped.
const MaxFrags = 17

// maxTxDescs is the most descriptors one TX packet may span: the linear
// part and MaxFrags frags (xsk_build_skb; struct xsk_addrs holds
// MAX_SKB_FRAGS + 1 addresses).
const maxTxDescs = MaxFrags + 1

// kickBatch is how many TX descriptors Kick peeks at a time, so that it
// releases them (and publishes completions) in batches. It exceeds
// maxTxDescs, so a whole multi-buffer packet always fits in one batch.
const kickBatch = 64

// ErrBadMetadata is Kick's error, in copy mode, for a packet whose TX
// metadata the kernel's xsk_skb_metadata rejects with -EINVAL (no metadata
// reserved, an unknown flag, a checksum field outside the first
// descriptor's data): the descriptor stays at the head of the TX ring and
// every Kick fails the same way until the application repairs the
// metadata. errors.Is(err, syscall.EINVAL) holds for it, as sendto's errno.
var ErrBadMetadata = fmt.Errorf("xsk: invalid TX metadata: %w", syscall.EINVAL)

// Defaults of Config.
const (
	DefaultNumFrames = 4096 // libxdp's examples' NUM_FRAMES: 16 MiB of UMEM with the default frame size
	DefaultFrameSize = 4096 // XSK_UMEM__DEFAULT_FRAME_SIZE
	DefaultRingSize  = 2048 // XSK_RING_PROD__DEFAULT_NUM_DESCS
)

// Limits of Config.
const (
	MinFrameSize     = 2048    // XDP_UMEM_MIN_CHUNK_SIZE
	MaxFrameSize     = 1 << 16 // keeps every in-frame offset within the uint16 checksum fields
	maxTxMetadataLen = 256     // the kernel rejects tx_metadata_len >= 256
	maxRingSize      = 1 << 24
)

// ErrConfig is wrapped by New's errors for an invalid Config.
var ErrConfig = errors.New("xsk: invalid config")

// Config configures New. The zero value is usable: 4096 frames of 4096
// bytes, rings of 2048 entries, no headroom, no TX metadata, software
// checksums.
type Config struct {
	// NumFrames is the number of UMEM frames; default DefaultNumFrames.
	NumFrames int
	// FrameSize is the size of a UMEM frame, a power of two in
	// [MinFrameSize, MaxFrameSize]; default DefaultFrameSize.
	FrameSize int
	// Headroom is reserved at the start of every frame (struct
	// xdp_umem_reg's headroom); TX data must start after it.
	Headroom int
	// TxMetadata reserves TX metadata of TxMetadataSize bytes before every
	// packet unless TxMetadataLen says otherwise.
	TxMetadata bool
	// TxMetadataLen is the bytes reserved for TX metadata before every
	// packet's data (tx_metadata_len): 0 for none, or a multiple of 8 in
	// [TxMetadataSize, 256). Non-zero implies TxMetadata.
	TxMetadataLen int
	// FillSize, CompSize, RxSize and TxSize are the rings' numbers of
	// entries, powers of two; default DefaultRingSize each.
	FillSize, CompSize, RxSize, TxSize int
	// CsumOffload says that the wire completes partial checksums: a TAP
	// opened with VnetHdr, whose kernel side finishes a frame marked
	// VIRTIO_NET_HDR_F_NEEDS_CSUM from csum_start and csum_offset. Without
	// it the socket completes requested checksums itself, like a UMEM
	// registered with XDP_UMEM_TX_SW_CSUM.
	CsumOffload bool
	// MultiBuffer accepts TX packets spanning several descriptors chained
	// with OptPktContd (the XDP_USE_SG bind flag), up to MaxFrags+1. Without
	// it OptPktContd makes a descriptor invalid. It needs TxSize and
	// CompSize of at least 2*MaxFrags.
	MultiBuffer bool
	// ZeroCopy selects the TX semantics of a zero-copy driver (the
	// XDP_ZEROCOPY bind flag: the driver reads descriptors with
	// xsk_tx_peek_desc and their metadata with xsk_buff_get_metadata)
	// instead of the copy path's (XDP_COPY, __xsk_generic_xmit). They
	// differ for bad metadata only: the copy path fails the send with
	// ErrBadMetadata and leaves the descriptor in the TX ring, a zero-copy
	// driver sends the packet without the offloads (tx_bad_metadata
	// either way). Packets are copied into the scratch buffer in both.
	ZeroCopy bool
	// Clock returns the nanoseconds written as TX timestamps; default the
	// TAI clock as the kernel's copy path reads it at completion
	// (ktime_get_tai_fast_ns in xsk_destruct_skb): CLOCK_TAI read at New
	// plus the monotonic time since. It must be safe to call from Kick's
	// goroutines.
	Clock func() uint64

	// ringStart is the initial producer and consumer index of every ring;
	// tests set it near 2^32 to exercise the wrap-around.
	ringStart uint32
}

// Socket is an AF_XDP-style socket over a Wire; see the package comment
// for its roles and threading model.
type Socket struct {
	umem        UMEM
	frameMask   uint64 // FrameSize-1
	csumOffload bool   // +checklocksignore: set by New, read-only after
	multiBuffer bool   // +checklocksignore: set by New, read-only after
	zeroCopy    bool   // +checklocksignore: set by New, read-only after
	clock       func() uint64
	w           Wire // +checklocksignore: set by New, read-only after
	stats       Stats

	// Application sides.
	fill Producer[uint64]
	comp Consumer[uint64]
	rx   Consumer[Desc]
	tx   Producer[Desc]

	txMu sync.Mutex
	// txc consumes the TX ring.
	// +checklocks:txMu
	txc Consumer[Desc]
	// cqp produces on the completion ring.
	// +checklocks:txMu
	cqp Producer[uint64]
	// scratch holds the virtio-net header and the packet being written.
	// +checklocks:txMu
	scratch []byte

	rxMu sync.Mutex
	// fqc consumes the fill ring.
	// +checklocks:rxMu
	fqc Consumer[uint64]
	// rxp produces on the RX ring.
	// +checklocks:rxMu
	rxp Producer[Desc]
}

func isPow2(n int) bool { return n > 0 && n&(n-1) == 0 }

// New returns a socket with a fresh UMEM and rings, writing to w. The
// socket borrows w for its whole life; the caller closes w after the last
// Kick.
func New(cfg Config, w Wire) (*Socket, error) {
	if w == nil {
		return nil, fmt.Errorf("%w: nil Wire", ErrConfig)
	}
	if cfg.NumFrames == 0 {
		cfg.NumFrames = DefaultNumFrames
	}
	if cfg.FrameSize == 0 {
		cfg.FrameSize = DefaultFrameSize
	}
	if cfg.TxMetadata && cfg.TxMetadataLen == 0 {
		cfg.TxMetadataLen = TxMetadataSize
	}
	for _, p := range []*int{&cfg.FillSize, &cfg.CompSize, &cfg.RxSize, &cfg.TxSize} {
		if *p == 0 {
			*p = DefaultRingSize
		}
		if !isPow2(*p) || *p > maxRingSize {
			return nil, fmt.Errorf("%w: ring size %d: want a power of two up to %d", ErrConfig, *p, maxRingSize)
		}
	}
	if cfg.MultiBuffer && (cfg.TxSize < 2*MaxFrags || cfg.CompSize < 2*MaxFrags) {
		// A packet waits in the TX ring until its last chunk is there and
		// the completion ring has room for all its chunks: both rings
		// must hold a whole packet, with room to spare.
		return nil, fmt.Errorf("%w: MultiBuffer needs TxSize and CompSize of at least %d", ErrConfig, 2*MaxFrags)
	}
	if !isPow2(cfg.FrameSize) || cfg.FrameSize < MinFrameSize || cfg.FrameSize > MaxFrameSize {
		return nil, fmt.Errorf("%w: FrameSize %d: want a power of two in [%d, %d]", ErrConfig, cfg.FrameSize, MinFrameSize, MaxFrameSize)
	}
	if cfg.NumFrames < 0 || cfg.NumFrames > (1<<40)/cfg.FrameSize {
		return nil, fmt.Errorf("%w: NumFrames %d", ErrConfig, cfg.NumFrames)
	}
	if l := cfg.TxMetadataLen; l != 0 && (l < TxMetadataSize || l%8 != 0 || l >= maxTxMetadataLen) {
		return nil, fmt.Errorf("%w: TxMetadataLen %d: want 0 or a multiple of 8 in [%d, %d)", ErrConfig, l, TxMetadataSize, maxTxMetadataLen)
	}
	// At least a minimal Ethernet frame (60 bytes without FCS) must fit
	// after the headroom and metadata.
	if cfg.Headroom < 0 || cfg.Headroom+cfg.TxMetadataLen > cfg.FrameSize-60 {
		return nil, fmt.Errorf("%w: Headroom %d with TxMetadataLen %d leaves less than 60 bytes of a %d-byte frame", ErrConfig, cfg.Headroom, cfg.TxMetadataLen, cfg.FrameSize)
	}
	s := &Socket{
		umem: UMEM{
			buf:       make([]byte, cfg.NumFrames*cfg.FrameSize),
			frameSize: uint64(cfg.FrameSize),
			numFrames: cfg.NumFrames,
			headroom:  cfg.Headroom,
			mdLen:     cfg.TxMetadataLen,
			dataOff:   uint64(cfg.Headroom + cfg.TxMetadataLen),
		},
		frameMask:   uint64(cfg.FrameSize - 1),
		csumOffload: cfg.CsumOffload,
		multiBuffer: cfg.MultiBuffer,
		zeroCopy:    cfg.ZeroCopy,
		clock:       cfg.Clock,
		w:           w,
	}
	if s.clock == nil {
		s.clock = newTAIClock()
	}
	fillR := newRing[uint64](uint32(cfg.FillSize), cfg.ringStart)
	compR := newRing[uint64](uint32(cfg.CompSize), cfg.ringStart)
	rxR := newRing[Desc](uint32(cfg.RxSize), cfg.ringStart)
	txR := newRing[Desc](uint32(cfg.TxSize), cfg.ringStart)
	s.fill, s.fqc = newProducer(fillR), newConsumer(fillR)
	s.comp, s.cqp = newConsumer(compR), newProducer(compR)
	s.rx, s.rxp = newConsumer(rxR), newProducer(rxR)
	s.tx, s.txc = newProducer(txR), newConsumer(txR)
	frags := 1
	if cfg.MultiBuffer {
		frags = maxTxDescs
	}
	// A TX descriptor may start anywhere past the metadata (validDesc:
	// the kernel reserves headroom on RX only), so it may hold up to a
	// frame less its metadata, more than DataRoom.
	s.scratch = make([]byte, vnetHdrLen+frags*int(s.umem.frameSize-uint64(s.umem.mdLen)))
	return s, nil
}

// UMEM returns the socket's packet memory.
func (s *Socket) UMEM() *UMEM { return &s.umem }

// Fill returns the application's side of the fill ring: UMEM addresses of
// frames Receive may fill (any address in a frame stands for the frame).
func (s *Socket) Fill() *Producer[uint64] { return &s.fill }

// Completion returns the application's side of the completion ring: the
// Addr of every consumed TX descriptor, in TX order.
func (s *Socket) Completion() *Consumer[uint64] { return &s.comp }

// RX returns the application's side of the RX ring.
func (s *Socket) RX() *Consumer[Desc] { return &s.rx }

// TX returns the application's side of the TX ring.
func (s *Socket) TX() *Producer[Desc] { return &s.tx }

// Stats returns the socket's counters.
func (s *Socket) Stats() *Stats { return &s.stats }

// Now returns the socket clock's reading, the time base of TX timestamps.
func (s *Socket) Now() uint64 { return s.clock() }

// Kick is the sendto() wakeup: it consumes the TX ring (at most one ring's
// worth of descriptors, so that it returns even while the application keeps
// producing) and returns how many descriptors it consumed.
//
// Each descriptor is validated as xp_aligned_validate_desc does (see
// validDesc). An invalid one is consumed and counted (tx_invalid_descs, as
// XDP_STATISTICS reports it) but not completed: its address never reaches
// the completion ring. A multi-buffer packet with an invalid descriptor is
// dropped up to it, as xsk_drop_skb drops the skb being built (each of
// those descriptors counted, none completed), and the descriptor after it
// begins a new packet; either way Kick stops there, as __xsk_generic_xmit
// ends its pass at an invalid descriptor. A packet with more than
// maxTxDescs descriptors is dropped at the first one past the limit (-EOVERFLOW:
// all counted, none completed) and Kick goes on with the next.
//
// The metadata of a packet's first descriptor is read if it carries
// OptTxMetadata (later descriptors' metadata is ignored, as xsk_build_skb
// reads it for the first only). In copy mode bad metadata (see request)
// fails the Kick with ErrBadMetadata, the descriptor left at the head of
// the TX ring (xsk_skb_metadata's -EINVAL: __xsk_generic_xmit returns
// without releasing it); with Config.ZeroCopy the packet is sent without
// the offloads it asked for (xsk_buff_get_metadata returns no metadata).
// Both count tx_bad_metadata.
//
// A valid packet is copied with its virtio-net header into the socket's
// scratch buffer, has a requested checksum offloaded (NEEDS_CSUM) or
// completed in software and goes to the wire in one Write; then, per
// packet, a requested timestamp is read from the clock and written into
// the metadata's completion area (xsk_destruct_skb), and the packet's
// descriptors are completed. Completions are published on the completion
// ring in TX order. Kick stops when the completion ring is full
// (tx_cq_full) or a multi-buffer packet's last descriptor is not submitted
// yet.
//
// A failed Write is counted (tx_errors), its descriptors are completed,
// and Kick stops and returns the error. Kick may be called from several
// goroutines; it does not allocate.
func (s *Socket) Kick() (int, error) {
	s.txMu.Lock()
	defer s.txMu.Unlock()
	var c txCounts
	var total uint32
	var err error
	limit := s.txc.Size()
	for total < limit {
		n, idx := s.txc.Peek(min(kickBatch, limit-total))
		if n == 0 {
			break
		}
		free := s.cqp.Free(n)
		if free == 0 {
			s.txc.Cancel(n)
			c.cqFull++
			break
		}
		cut := free < n
		if cut {
			s.txc.Cancel(n - free)
			n = free
		}
		_, cidx := s.cqp.Reserve(n) // cannot fail: Free said n
		var used, done uint32
		var stop bool
		used, done, stop, err = s.txBatch(idx, n, cidx, &c)
		if used < n {
			s.txc.Cancel(n - used)
			if cut && !stop {
				c.cqFull++ // a multi-buffer packet did not fit
			}
		}
		s.cqp.Cancel(n - done)
		s.cqp.Submit(done)
		s.txc.Release(used)
		total += used
		if stop || used < n {
			break
		}
	}
	c.flush(&s.stats)
	if err != nil && err != ErrBadMetadata {
		err = fmt.Errorf("xsk: write: %w", err)
	}
	return int(total), err
}

// txBatch consumes TX descriptors among the n peeked from idx (at most
// kickBatch), writing the completions of the packets it sends to the
// reserved completion slots from cidx. It returns how many descriptors it
// consumed (used) and completed (done <= used), and whether Kick must stop
// (an invalid descriptor, bad metadata in copy mode, a write error, with
// err set for the last two). It consumes fewer than n without stop when it
// meets a multi-buffer packet whose last descriptor is not among them.
//
// +checklocks:s.txMu
func (s *Socket) txBatch(idx, n, cidx uint32, c *txCounts) (used, done uint32, stop bool, err error) {
	for used < n {
		d := *s.txc.Entry(idx + used)
		switch d.Options {
		case 0:
			// The common case: one descriptor, no metadata. Nothing here
			// reads the metadata area. The completion slot is written
			// first and counted only if d is valid (an unpublished slot
			// is overwritten or cancelled).
			*s.cqp.Entry(cidx + done) = d.Addr
			used++
			if !s.validDesc(d) {
				c.invalid++
				return used, done, true, nil
			}
			done++
			b := s.scratch[:vnetHdrLen+int(d.Len)]
			clear(b[:vnetHdrLen]) // no offload requested
			copy(b[vnetHdrLen:], s.umem.buf[d.Addr:d.Addr+uint64(d.Len)])
			if err := s.w.Write(b); err != nil {
				c.errors++
				return used, done, true, err
			}
			c.packets++
			c.bytes += uint64(d.Len)
		case OptTxMetadata:
			// One descriptor with metadata.
			if !s.validDesc(d) {
				c.invalid++
				return used + 1, done, true, nil
			}
			b, stamp := s.txMeta(d, c)
			if b == nil {
				return used, done, true, ErrBadMetadata // d stays in the ring
			}
			used++
			*s.cqp.Entry(cidx + done) = d.Addr
			done++
			// The write here, as in the case above, not in txMeta: a
			// return after the system call costs a misprediction (the
			// kernel leaves the return stack buffer filled), and the
			// metadata path should not pay one more than the plain one.
			err := s.w.Write(b)
			if stamp {
				s.stamp(d.Addr)
				c.timestamps++
			}
			if err != nil {
				c.errors++
				return used, done, true, err
			}
			c.packets++
			c.bytes += uint64(d.Len)
		default:
			k, kd, stop, err := s.txPacket(idx+used, n-used, cidx+done, c)
			used += k
			done += kd
			if k == 0 || stop {
				return used, done, stop, err
			}
		}
	}
	return used, done, false, nil
}

// stamp writes the clock's reading into the completion.tx_timestamp of the
// packet whose first descriptor's data is at addr, which Kick validated, so
// its metadata lies right before it: xsk_destruct_skb's
// *compl->tx_timestamp = ktime_get_tai_fast_ns(), once per packet after
// its write and before its completion is published.
//
// +checklocks:s.txMu
func (s *Socket) stamp(addr uint64) {
	off := addr - uint64(s.umem.mdLen) + 8
	binary.NativeEndian.PutUint64(s.umem.buf[off:off+8], s.clock())
}

// validDesc reports whether d's data is not empty and lies in the UMEM,
// inside one frame, at least TxMetadataLen bytes into it, so that its
// metadata lies in the same frame: the kernel's xp_aligned_validate_desc
// (a frame is a chunk of an aligned UMEM). The headroom is not enforced:
// the kernel reserves it on RX only. Since the UMEM is whole frames, Addr
// inside it and Addr+Len within Addr's frame imply Addr+Len inside it.
func (s *Socket) validDesc(d Desc) bool {
	off := d.Addr & s.frameMask
	return d.Len != 0 && d.Addr < s.umem.Size() && off >= uint64(s.umem.mdLen) && off+uint64(d.Len) <= s.umem.frameSize
}

// txMeta prepares a packet of one valid descriptor, d, whose only option
// is OptTxMetadata (d's completion and the write are the caller's): it
// does what request does for a multi-buffer packet, and what xmit does
// before the write, in one function and with the metadata read once: this
// is the per-packet cost of a metadata request (xskgen's -m). Keep them
// in step with it. It returns the virtio-net header and the packet in the
// scratch buffer and whether the packet asked for a TX timestamp, or nil
// if the metadata is bad in copy mode (counted: the caller fails the Kick
// with ErrBadMetadata).
//
// +checklocks:s.txMu
func (s *Socket) txMeta(d Desc, c *txCounts) ([]byte, bool) {
	b := s.scratch[:vnetHdrLen+int(d.Len)]
	var flags uint64
	var md []byte
	if s.umem.mdLen != 0 {
		// validDesc put d.Addr at least mdLen into its frame.
		mdOff := d.Addr - uint64(s.umem.mdLen)
		md = s.umem.buf[mdOff : mdOff+TxMetadataSize : mdOff+TxMetadataSize]
		flags = binary.NativeEndian.Uint64(md[0:8])
	}
	if s.umem.mdLen == 0 || flags&^txmdValid != 0 {
		c.badMetadata++
		if !s.zeroCopy {
			return nil, false
		}
		// xsk_buff_get_metadata: no metadata, no offload.
		clear(b[:vnetHdrLen])
		copy(b[vnetHdrLen:], s.umem.buf[d.Addr:d.Addr+uint64(d.Len)])
		return b, false
	}
	swCsum := false
	switch {
	case flags&TxmdChecksum == 0:
		clear(b[:vnetHdrLen])
	case int(binary.NativeEndian.Uint16(md[8:10]))+int(binary.NativeEndian.Uint16(md[10:12]))+2 > int(d.Len):
		c.badMetadata++
		if !s.zeroCopy {
			return nil, false
		}
		clear(b[:vnetHdrLen]) // a checksum outside the packet: none
	case s.csumOffload:
		// virtio_net_hdr's csum_start and csum_offset (bytes 6 to 10)
		// are the metadata's bytes 8 to 12, both in host byte order: two
		// stores (see xmit).
		binary.LittleEndian.PutUint64(b[0:8], vnetFNeedsCsum|uint64(binary.LittleEndian.Uint16(md[8:10]))<<48)
		binary.LittleEndian.PutUint16(b[8:10], binary.LittleEndian.Uint16(md[10:12]))
		c.csumOffload++
	default:
		clear(b[:vnetHdrLen])
		swCsum = true
	}
	copy(b[vnetHdrLen:], s.umem.buf[d.Addr:d.Addr+uint64(d.Len)])
	if swCsum {
		completeChecksum(b[vnetHdrLen:], int(binary.NativeEndian.Uint16(md[8:10])), int(binary.NativeEndian.Uint16(md[10:12])))
		c.csumSW++
	}
	return b, flags&TxmdTimestamp != 0
}

// txRequest is what a packet's metadata asks for, once checked by
// Socket.request; the zero value asks for nothing.
type txRequest struct {
	flags uint64 // Txmd* flags
	// csum is request.csum_start and request.csum_offset as they lie in
	// memory (host byte order), read as a little-endian word: written
	// back little-endian, the same four bytes land in virtio_net_hdr's
	// csum_start and csum_offset, which are in host byte order too.
	csum uint32
}

// csumFields returns the checksum request's csum_start and csum_offset as
// numbers.
func (r txRequest) csumFields() (start, offset int) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], r.csum)
	return int(binary.NativeEndian.Uint16(b[0:2])), int(binary.NativeEndian.Uint16(b[2:4]))
}

// request reads and checks the metadata of a valid first descriptor d that
// carries OptTxMetadata. The kernel's copy path (xsk_skb_metadata) rejects
// it with -EINVAL unless the socket reserves metadata, only known flags are
// set (xsk_buff_valid_tx_metadata) and a requested checksum field lies
// within d's data (csum_start + csum_offset + 2 <= len, d being the first
// descriptor only); request then reports false. In zero-copy mode it
// reports true with what a driver would do instead: no request at all for
// missing metadata or an unknown flag (xsk_buff_get_metadata returns
// NULL), the timestamp alone for a checksum field outside the data. Bad
// metadata is counted (tx_bad_metadata) in both modes.
func (s *Socket) request(d Desc, c *txCounts) (txRequest, bool) {
	if s.umem.mdLen == 0 {
		c.badMetadata++
		return txRequest{}, s.zeroCopy
	}
	// validDesc put d.Addr at least mdLen into its frame.
	off := d.Addr - uint64(s.umem.mdLen)
	md := TxMetadata(s.umem.buf[off : off+TxMetadataSize : off+TxMetadataSize])
	r := txRequest{flags: md.Flags()}
	if r.flags&^txmdValid != 0 {
		c.badMetadata++
		return txRequest{}, s.zeroCopy
	}
	if r.flags&TxmdChecksum != 0 {
		if int(md.CsumStart())+int(md.CsumOffset())+2 > int(d.Len) {
			c.badMetadata++
			r.flags &^= TxmdChecksum
			return r, s.zeroCopy
		}
		r.csum = binary.LittleEndian.Uint32(md[8:12])
	}
	return r, true
}

// xmit writes b's virtio-net header (and completes the checksum, in
// software mode) as r asks and writes b to the wire. b is the scratch
// buffer: vnetHdrLen bytes of header to fill, then the packet.
//
// +checklocks:s.txMu
func (s *Socket) xmit(b []byte, r txRequest, c *txCounts) error {
	switch {
	case r.flags&TxmdChecksum == 0:
		clear(b[:vnetHdrLen])
	case s.csumOffload:
		// struct virtio_net_hdr: flags at 0, gso_type at 1, hdr_len at 2,
		// gso_size at 4, csum_start at 6 and csum_offset at 8, in host
		// byte order (driver.VirtioNetHdr). Two stores.
		_ = b[vnetHdrLen-1]
		binary.LittleEndian.PutUint64(b[0:8], vnetFNeedsCsum|uint64(r.csum)<<48)
		binary.LittleEndian.PutUint16(b[8:10], uint16(r.csum>>16))
		c.csumOffload++
	default:
		clear(b[:vnetHdrLen])
		start, offset := r.csumFields()
		completeChecksum(b[vnetHdrLen:], start, offset)
		c.csumSW++
	}
	err := s.w.Write(b)
	if err != nil {
		c.errors++
	} else {
		c.packets++
		c.bytes += uint64(len(b) - vnetHdrLen)
	}
	return err
}

// txPacket consumes one packet's descriptors, starting at TX index idx with
// avail peeked, and writes the completions of a sent packet from cidx. It
// returns how many descriptors it consumed (0 if the packet's last
// descriptor is not among them, or its metadata is bad in copy mode) and
// completed, and whether Kick must stop, with the error of a failed write
// or ErrBadMetadata. It is __xsk_generic_xmit's loop over one packet: the
// first descriptor is validated, then its metadata read (xsk_build_skb),
// then the next ones validated one by one; an invalid one drops the
// packet so far (xsk_drop_skb) and stops the Kick; an OptPktContd on the
// maxTxDescs-th drops the packet (-EOVERFLOW) and the Kick goes on.
//
// +checklocks:s.txMu
func (s *Socket) txPacket(idx, avail, cidx uint32, c *txCounts) (k, done uint32, stop bool, err error) {
	allowed := uint32(OptTxMetadata)
	if s.multiBuffer {
		allowed |= OptPktContd
	}
	first := *s.txc.Entry(idx)
	if first.Options&^allowed != 0 || !s.validDesc(first) {
		c.invalid++
		return 1, 0, true, nil
	}
	var r txRequest
	if first.Options&OptTxMetadata != 0 {
		var ok bool
		if r, ok = s.request(first, c); !ok {
			return 0, 0, true, ErrBadMetadata // the packet stays in the ring
		}
	}
	total := int(first.Len)
	k = 1
	end := first.Options&OptPktContd == 0
	for !end && k < avail && k < maxTxDescs {
		d := *s.txc.Entry(idx + k)
		k++
		if d.Options&^allowed != 0 || !s.validDesc(d) {
			c.invalid += uint64(k)
			return k, 0, true, nil
		}
		total += int(d.Len)
		end = d.Options&OptPktContd == 0
	}
	if !end {
		if k < maxTxDescs {
			return 0, 0, false, nil // the rest is not submitted yet
		}
		c.invalid += uint64(k) // -EOVERFLOW
		return k, 0, false, nil
	}

	b := s.scratch[:vnetHdrLen+total]
	off := vnetHdrLen
	for i := range k {
		d := *s.txc.Entry(idx + i)
		off += copy(b[off:], s.umem.buf[d.Addr:d.Addr+uint64(d.Len)])
		*s.cqp.Entry(cidx + i) = d.Addr
	}
	err = s.xmit(b, r, c)
	if r.flags&TxmdTimestamp != 0 {
		s.stamp(first.Addr)
		c.timestamps++
	}
	return k, k, err != nil, err
}

// Receive copies frame into a UMEM frame taken from the fill ring, at that
// frame's DataAddr, and posts an RX descriptor for it: XDP_REDIRECT into
// the socket in copy mode (XDP_COPY). It returns false, dropping the frame,
// when the frame is empty or longer than UMEM.DataRoom (rx_dropped), the
// fill ring is empty (rx_fill_ring_empty_descs and rx_dropped) or the RX
// ring is full (rx_ring_full), checked in that order as the kernel's
// xsk_rcv_check and __xsk_rcv do. A frame dropped for a full RX ring leaves
// its fill entry on the fill ring (the kernel puts the buffer back on its
// free list). Fill addresses outside the UMEM are consumed and skipped
// (rx_invalid_fill).
//
// Receive borrows frame for the call only. It never waits for the
// application, may be called from several goroutines, concurrently with
// Kick, and does not allocate.
func (s *Socket) Receive(frame []byte) bool {
	return s.ReceiveVec([][]byte{frame})
}

// ReceiveVec is Receive of the frame made of parts, in order (a packet's
// linear part and then its frags), copied into one UMEM frame. It borrows
// parts and their bytes for the call only.
func (s *Socket) ReceiveVec(parts [][]byte) bool {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n == 0 || n > s.umem.DataRoom() {
		s.stats.RxDropped.Add(1)
		return false
	}
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	for {
		k, idx := s.fqc.Peek(1)
		if k == 0 {
			s.stats.RxFillEmpty.Add(1)
			s.stats.RxDropped.Add(1)
			return false
		}
		base := *s.fqc.Entry(idx) &^ s.frameMask
		if base >= s.umem.Size() {
			s.fqc.Release(1)
			s.stats.RxInvalidFill.Add(1)
			continue // bounded: each pass consumes a fill entry
		}
		if s.rxp.Free(1) == 0 {
			s.fqc.Cancel(1)
			s.stats.RxRingFull.Add(1)
			return false
		}
		s.fqc.Release(1)
		addr := base + s.umem.dataOff
		dst := s.umem.buf[addr : addr+uint64(n)]
		off := 0
		for _, p := range parts {
			off += copy(dst[off:], p)
		}
		_, ridx := s.rxp.Reserve(1)
		*s.rxp.Entry(ridx) = Desc{Addr: addr, Len: uint32(n)}
		s.rxp.Submit(1)
		s.stats.RxPackets.Add(1)
		s.stats.RxBytes.Add(uint64(n))
		return true
	}
}
