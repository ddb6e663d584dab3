package xsk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"time"

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

// MaxFrags is the most descriptors one multi-buffer TX packet may span: the
// kernel's MAX_SKB_FRAGS default, beyond which xsk_build_skb fails with
// -EOVERFLOW.
const MaxFrags = 17

// kickBatch is how many TX descriptors Kick peeks at a time, so that it
// releases them (and publishes completions) in batches. It exceeds MaxFrags,
// so a whole multi-buffer packet always fits in one batch.
const kickBatch = 64

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
	// with OptPktContd (the XDP_USE_SG bind flag), up to MaxFrags. Without
	// it OptPktContd makes a descriptor invalid. It needs TxSize and
	// CompSize of at least 2*MaxFrags.
	MultiBuffer bool
	// Clock returns monotonic nanoseconds for TX timestamps; default the
	// time since New. It must be safe to call from Kick's goroutines.
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
	// dropRest is dropping while Kick discards the remaining descriptors
	// of a multi-buffer packet that had more than MaxFrags, 0 otherwise:
	// a bit no valid descriptor carries, so that txBatch tells the common
	// cases apart with one test of Options|dropRest.
	// +checklocks:txMu
	dropRest uint32

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
		clock:       cfg.Clock,
		w:           w,
	}
	if s.clock == nil {
		start := time.Now()
		s.clock = func() uint64 { return uint64(time.Since(start)) }
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
		frags = MaxFrags
	}
	s.scratch = make([]byte, vnetHdrLen+frags*s.umem.DataRoom())
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
// Each descriptor is validated; an invalid one (see validDesc and
// checkMetadata) is counted (tx_invalid_descs or tx_bad_metadata, once per
// packet) and completed without being sent, together with the rest of its
// multi-buffer packet. A valid packet is copied with its virtio-net header
// into the socket's scratch buffer, has a requested checksum offloaded
// (NEEDS_CSUM) or completed in software, goes to the wire in one Write,
// and then gets a requested timestamp. Every consumed descriptor's Addr is
// then published on the completion ring, in order. Kick stops when the
// completion ring is full (tx_cq_full) or a multi-buffer packet's last
// descriptor is not submitted yet.
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
	for total < limit && err == nil {
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
		var used uint32
		used, err = s.txBatch(idx, n, cidx, &c)
		s.stamp(cidx, c.stamps)
		c.stamps = 0
		if used < n {
			s.txc.Cancel(n - used)
			s.cqp.Cancel(n - used)
			if cut && err == nil {
				c.cqFull++ // a multi-buffer packet did not fit
			}
		}
		if used == 0 {
			break
		}
		s.cqp.Submit(used)
		s.txc.Release(used)
		total += used
	}
	c.flush(&s.stats)
	if err != nil {
		err = fmt.Errorf("xsk: write: %w", err)
	}
	return int(total), err
}

// dropping is dropRest's value while Kick discards the rest of an
// oversized multi-buffer packet: an option bit outside the UAPI's.
const dropping = 1 << 31

// stamp writes one completion time, read after the batch's last write,
// into the metadata of every packet of the batch that asked for a TX
// timestamp: those whose completion slot, counted from cidx, has its bit
// set in mask. A slot holds the packet's first descriptor's Addr, which
// Kick validated, so its metadata lies right before it. The mask lives in
// Kick's counters, on its stack and touched for every packet anyway, not in
// the socket: after each wire write the socket's own lines may have left
// the cache.
//
// +checklocks:s.txMu
func (s *Socket) stamp(cidx uint32, mask uint64) {
	if mask == 0 {
		return
	}
	now := s.clock()
	buf := s.umem.buf // locals: the stores into buf need not reload them
	md := uint64(s.umem.mdLen)
	for mask != 0 {
		i := uint32(bits.TrailingZeros64(mask))
		mask &= mask - 1
		off := *s.cqp.Entry(cidx + i) - md + 8 // completion.tx_timestamp
		binary.NativeEndian.PutUint64(buf[off:off+8], now)
	}
}

// txBatch consumes the n TX descriptors peeked from idx (at most
// kickBatch), writing their completions to the reserved completion slots
// from cidx, and returns how many it consumed: fewer than n when it meets a
// multi-buffer packet whose last descriptor is not among them, or a write
// error. It sets bit i of c.stamps if the packet whose first descriptor is
// the i-th asked for a TX timestamp (see stamp).
//
// +checklocks:s.txMu
func (s *Socket) txBatch(idx, n, cidx uint32, c *txCounts) (uint32, error) {
	var used uint32
	for used < n {
		d := *s.txc.Entry(idx + used)
		switch d.Options | s.dropRest {
		case 0:
			// The common case: one descriptor, no metadata. Nothing here
			// reads the metadata area.
			*s.cqp.Entry(cidx + used) = d.Addr
			used++
			if !s.validDesc(d) {
				c.invalid++
				continue
			}
			b := s.scratch[:vnetHdrLen+int(d.Len)]
			clear(b[:vnetHdrLen]) // no offload requested
			copy(b[vnetHdrLen:], s.umem.buf[d.Addr:d.Addr+uint64(d.Len)])
			if err := s.w.Write(b); err != nil {
				c.errors++
				return used, err
			}
			c.packets++
			c.bytes += uint64(d.Len)
		case OptTxMetadata:
			// One descriptor with metadata.
			*s.cqp.Entry(cidx + used) = d.Addr
			used++
			b, stamp := s.txMeta(d, c)
			if b == nil {
				continue
			}
			if stamp {
				c.stamps |= 1 << (used - 1)
			}
			// The write here, as in the case above, not in txMeta: a
			// return after the system call costs a misprediction (the
			// kernel leaves the return stack buffer filled), and the
			// metadata path should not pay one more than the plain one.
			if err := s.w.Write(b); err != nil {
				c.errors++
				return used, err
			}
			c.packets++
			c.bytes += uint64(d.Len)
		default:
			if d.Options&OptPktContd == 0 && s.dropRest == 0 {
				// One descriptor with an unknown option.
				*s.cqp.Entry(cidx + used) = d.Addr
				used++
				c.invalid++
				continue
			}
			k, stamp, err := s.txPacket(idx+used, n-used, cidx+used, c)
			if stamp {
				c.stamps |= 1 << used
			}
			used += k
			if k == 0 || err != nil {
				return used, err
			}
		}
	}
	return used, nil
}

// validDesc reports whether d's data lies in the UMEM, inside one frame,
// after the frame's headroom and TX metadata, and is not empty: the
// kernel's xp_aligned_validate_desc, with the headroom enforced too. Since
// the UMEM is whole frames, Addr inside it and Addr+Len within Addr's frame
// imply Addr+Len inside it and Len <= DataRoom.
func (s *Socket) validDesc(d Desc) bool {
	off := d.Addr & s.frameMask
	return d.Len != 0 && d.Addr < s.umem.Size() && off >= s.umem.dataOff && off+uint64(d.Len) <= s.umem.frameSize
}

// txMeta prepares a packet of one descriptor, d, whose only option is
// OptTxMetadata (d's completion and the write are the caller's): it does
// what validDesc and request do for a multi-buffer packet, and what xmit
// does before the write, in one function and with the metadata read once:
// this is the per-packet cost of a metadata request (the seed's -m). Keep
// them in step with it. It returns the virtio-net header and the packet in
// the scratch buffer, nil if d was rejected (and counted), and whether the
// packet asked for a TX timestamp.
//
// +checklocks:s.txMu
func (s *Socket) txMeta(d Desc, c *txCounts) ([]byte, bool) {
	if !s.validDesc(d) {
		c.invalid++
		return nil, false
	}
	if s.umem.mdLen == 0 {
		c.badMetadata++
		return nil, false
	}
	// validDesc put d.Addr at least dataOff >= mdLen into its frame.
	mdOff := d.Addr - uint64(s.umem.mdLen)
	md := s.umem.buf[mdOff : mdOff+TxMetadataSize : mdOff+TxMetadataSize]
	flags := binary.NativeEndian.Uint64(md[0:8])
	if flags&^txmdValid != 0 {
		c.badMetadata++
		return nil, false
	}
	b := s.scratch[:vnetHdrLen+int(d.Len)]
	swCsum := false
	if flags&TxmdChecksum == 0 {
		clear(b[:vnetHdrLen])
	} else {
		if int(binary.NativeEndian.Uint16(md[8:10]))+int(binary.NativeEndian.Uint16(md[10:12]))+2 > int(d.Len) {
			c.badMetadata++
			return nil, false
		}
		if s.csumOffload {
			// virtio_net_hdr's csum_start and csum_offset (bytes 6 to
			// 10) are the metadata's bytes 8 to 12, both in host byte
			// order: two stores (see xmit).
			binary.LittleEndian.PutUint64(b[0:8], vnetFNeedsCsum|uint64(binary.LittleEndian.Uint16(md[8:10]))<<48)
			binary.LittleEndian.PutUint16(b[8:10], binary.LittleEndian.Uint16(md[10:12]))
			c.csumOffload++
		} else {
			clear(b[:vnetHdrLen])
			swCsum = true
		}
	}
	copy(b[vnetHdrLen:], s.umem.buf[d.Addr:d.Addr+uint64(d.Len)])
	if swCsum {
		completeChecksum(b[vnetHdrLen:], int(binary.NativeEndian.Uint16(md[8:10])), int(binary.NativeEndian.Uint16(md[10:12])))
		c.csumSW++
	}
	if flags&TxmdTimestamp == 0 {
		return b, false
	}
	// Stamped after the batch's last write (stamp).
	c.timestamps++
	return b, true
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
// carries OptTxMetadata, and reports whether it is acceptable: the socket
// reserves metadata, only known flags are set, and a requested checksum
// field lies within d's data (the kernel's check in xsk_skb_metadata:
// csum_start + csum_offset + 2 <= len).
func (s *Socket) request(d Desc) (txRequest, bool) {
	if s.umem.mdLen == 0 {
		return txRequest{}, false
	}
	// validDesc put d.Addr at least dataOff >= mdLen into its frame.
	off := d.Addr - uint64(s.umem.mdLen)
	md := TxMetadata(s.umem.buf[off : off+TxMetadataSize : off+TxMetadataSize])
	r := txRequest{flags: md.Flags()}
	if r.flags&^txmdValid != 0 {
		return txRequest{}, false
	}
	if r.flags&TxmdChecksum != 0 {
		if int(md.CsumStart())+int(md.CsumOffset())+2 > int(d.Len) {
			return txRequest{}, false
		}
		r.csum = binary.LittleEndian.Uint32(md[8:12])
	}
	return r, true
}

// xmit writes b's virtio-net header (and completes the checksum, in
// software mode) as r asks, writes b to the wire and then, if asked,
// reports that r asked for the completion time (stamp). b is the
// scratch buffer: vnetHdrLen bytes of header to fill, then the packet.
//
// +checklocks:s.txMu
func (s *Socket) xmit(b []byte, r txRequest, c *txCounts) (bool, error) {
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
	if r.flags&TxmdTimestamp == 0 {
		return false, err
	}
	// Stamped after the batch's last write, before Kick publishes the
	// completions (stamp).
	c.timestamps++
	return true, err
}

// txPacket consumes one packet's descriptors, starting at TX index idx with
// avail peeked, and writes their completions from cidx. It returns how
// many it consumed, 0 if the packet's last descriptor is not among them,
// and whether the packet asked for a TX timestamp.
// While dropRest is set it consumes, without sending, descriptors up to
// the end of the oversized packet being dropped.
//
// +checklocks:s.txMu
func (s *Socket) txPacket(idx, avail, cidx uint32, c *txCounts) (uint32, bool, error) {
	if s.dropRest != 0 {
		var k uint32
		for k < avail {
			d := *s.txc.Entry(idx + k)
			*s.cqp.Entry(cidx + k) = d.Addr
			k++
			if d.Options&OptPktContd == 0 {
				s.dropRest = 0
				break
			}
		}
		return k, false, nil
	}

	// The packet's extent: up to the first descriptor without
	// OptPktContd (every descriptor, without MultiBuffer).
	var k uint32
	end := false
	for k < avail && k < MaxFrags {
		d := s.txc.Entry(idx + k)
		k++
		if !s.multiBuffer || d.Options&OptPktContd == 0 {
			end = true
			break
		}
	}
	if !end && k < MaxFrags {
		return 0, false, nil // the rest is not submitted yet
	}
	for i := range k {
		*s.cqp.Entry(cidx + i) = s.txc.Entry(idx + i).Addr
	}
	if !end {
		// More than MaxFrags descriptors: drop this part and the rest.
		c.invalid++
		s.dropRest = dropping
		return k, false, nil
	}

	allowed := uint32(OptTxMetadata)
	if s.multiBuffer {
		allowed |= OptPktContd
	}
	total := 0
	for i := range k {
		d := *s.txc.Entry(idx + i)
		if d.Options&^allowed != 0 || !s.validDesc(d) {
			c.invalid++
			return k, false, nil
		}
		if i > 0 && d.Options&OptTxMetadata != 0 {
			c.badMetadata++
			return k, false, nil
		}
		total += int(d.Len)
	}

	first := *s.txc.Entry(idx)
	var r txRequest
	if first.Options&OptTxMetadata != 0 {
		var ok bool
		if r, ok = s.request(first); !ok {
			c.badMetadata++
			return k, false, nil
		}
	}

	b := s.scratch[:vnetHdrLen+total]
	off := vnetHdrLen
	for i := range k {
		d := *s.txc.Entry(idx + i)
		off += copy(b[off:], s.umem.buf[d.Addr:d.Addr+uint64(d.Len)])
	}
	stamp, err := s.xmit(b, r, c)
	return k, stamp, err
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
