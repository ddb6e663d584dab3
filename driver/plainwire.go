package driver

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

// PlainWire is a Wire over a device that moves bare Ethernet frames, one per
// read and one per write, with no virtio-net header and no offloads: a TAP
// opened without IFF_VNET_HDR, as github.com/songgao/water opens one
// (OpenWater), on any system water supports.
//
// Towards the NIC model it looks like any Wire: each frame read gets a zeroed
// virtio-net header (no flags: the NIC verifies checksums itself, as mlx5
// does with a frame the wire does not vouch for; no GSO: one frame per
// read). A frame written with offload requests in its header is completed in
// software before it leaves, as the kernel's validate_xmit_skb does for a
// device without those features: a NEEDS_CSUM checksum filled in
// (skb_checksum_help), a GSO frame cut into segments with full checksums
// (skb_gso_segment). The stack turns its own transmit offloads off on such a
// wire (Offloads reports false), so those completions are a fallback,
// counted in TxSWCsum and TxSWSegments.
//
// Reads take the device's descriptor when it has one (an *os.File, as water
// gives on Linux and macOS): a non-blocking read is then a read(2) that may
// say EAGAIN, a blocking one waits in Go's poller. A device without a
// descriptor (water on Windows) is read by a goroutine into a queue of
// frames.
type PlainWire struct {
	rw     io.ReadWriteCloser
	name   string
	rd     plainReader
	closed atomic.Bool

	wmu sync.Mutex
	// +checklocks:wmu
	seg Segmenter
	// +checklocks:wmu
	scratch []byte // a frame being completed or a segment, for Write
	// +checklocks:wmu
	fi FrameInfo

	// TxSWCsum counts frames whose NEEDS_CSUM checksum Write filled in,
	// TxSWSegments the segments Write cut GSO frames into.
	TxSWCsum, TxSWSegments atomic.Uint64
}

// plainReader reads one bare frame into b (Read's semantics: ErrNoFrame
// when none is ready and block is false, os.ErrClosed after Close).
type plainReader interface {
	read(b []byte, block bool) (int, error)
	close()
}

// NewPlainWire returns a PlainWire over rw, whose Read returns one whole
// frame and whose Write sends one. maxFrame bounds a frame's length
// (without the virtio-net header); longer frames are truncated on read.
// The wire owns rw: Close closes it.
func NewPlainWire(rw io.ReadWriteCloser, maxFrame int) *PlainWire {
	w := &PlainWire{rw: rw}
	w.wmu.Lock()
	w.seg.FillChecksum = true
	w.scratch = make([]byte, 0, maxGSOFrame)
	w.wmu.Unlock()
	if r := newRawReader(rw); r != nil {
		w.rd = r
	} else {
		w.rd = newQueueReader(rw, maxFrame)
	}
	return w
}

// maxGSOFrame bounds the frames Write completes in software: a 64 KB GSO
// frame and its headers.
const maxGSOFrame = 1<<16 + maxGSOHeaderLen

// Name returns the device's name as water reported it ("" for a wire made
// by NewPlainWire).
func (w *PlainWire) Name() string { return w.name }

// Offloads reports false: the device takes no checksum or segmentation
// offloads, so the stack computes checksums and segments itself.
func (w *PlainWire) Offloads() bool { return false }

// USO reports false: a plain wire carries no UDP segmentation offload.
func (w *PlainWire) USO() bool { return false }

// Read reads one frame into b after a zeroed virtio-net header and returns
// the length of both (Wire).
func (w *PlainWire) Read(b []byte, block bool) (int, error) {
	if len(b) < VirtioNetHdrLen {
		return 0, errors.New("driver: plain wire: buffer shorter than a virtio-net header")
	}
	if w.closed.Load() {
		return 0, os.ErrClosed
	}
	clear(b[:VirtioNetHdrLen])
	n, err := w.rd.read(b[VirtioNetHdrLen:], block)
	if err != nil {
		if w.closed.Load() {
			err = os.ErrClosed
		}
		return 0, err
	}
	return VirtioNetHdrLen + n, nil
}

// Write sends the frame after b's virtio-net header, completing in software
// what the header asks the device to do (Wire). A header it cannot complete
// is an error and the frame is not sent.
func (w *PlainWire) Write(b []byte) error {
	if w.closed.Load() {
		return os.ErrClosed
	}
	var h VirtioNetHdr
	if !h.Decode(b) {
		return errors.New("driver: plain wire: frame shorter than a virtio-net header")
	}
	frame := b[VirtioNetHdrLen:]
	if h.GSOType == VirtioNetHdrGSONone && h.Flags&VirtioNetHdrFNeedsCsum == 0 {
		return w.write(frame)
	}
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if h.GSOType != VirtioNetHdrGSONone {
		return w.segment(&h, frame)
	}
	start, off := int(h.CsumStart), int(h.CsumStart)+int(h.CsumOffset)
	if off+2 > len(frame) || len(frame) > cap(w.scratch) {
		return errors.New("driver: plain wire: NEEDS_CSUM outside the frame")
	}
	f := append(w.scratch[:0], frame...)
	sum := ^checksum.Checksum(f[start:], 0)
	if sum == 0 && ParseFrame(f, &w.fi) == DropNone && w.fi.L4 == L4UDP {
		sum = 0xffff // a UDP checksum of 0 means none (RFC 768)
	}
	binary.BigEndian.PutUint16(f[off:], sum)
	w.TxSWCsum.Add(1)
	return w.write(f)
}

// segment cuts a GSO frame into segments and writes each.
//
// +checklocks:w.wmu
func (w *PlainWire) segment(h *VirtioNetHdr, frame []byte) error {
	if d := ParseFrame(frame, &w.fi); d != DropNone {
		return errors.New("driver: plain wire: GSO frame: " + d.String())
	}
	var sink plainSegSink
	sink.w = w
	if _, d := w.seg.Segment(h, frame, &w.fi, &sink); d != DropNone {
		return errors.New("driver: plain wire: GSO frame: " + d.String())
	}
	return sink.err
}

// plainSegSink writes each segment a Segmenter cuts.
type plainSegSink struct {
	w   *PlainWire
	err error
}

// WriteSegment implements SegmentSink; it runs under w.wmu, inside Segment.
//
// +checklocksignore
func (s *plainSegSink) WriteSegment(hdr, payload []byte) {
	if s.err != nil {
		return
	}
	f := append(append(s.w.scratch[:0], hdr...), payload...)
	s.w.TxSWSegments.Add(1)
	s.err = s.w.write(f)
}

func (w *PlainWire) write(frame []byte) error {
	_, err := w.rw.Write(frame)
	if err != nil && w.closed.Load() {
		return os.ErrClosed
	}
	return err
}

// EachCounter calls fn with the wire's counters: tx_sw_csum (TxSWCsum) and
// tx_sw_segments (TxSWSegments).
func (w *PlainWire) EachCounter(fn func(name string, v uint64)) {
	fn("tx_sw_csum", w.TxSWCsum.Load())
	fn("tx_sw_segments", w.TxSWSegments.Load())
}

// Close closes the device and wakes a blocked Read.
func (w *PlainWire) Close() error {
	if w.closed.Swap(true) {
		return nil
	}
	err := w.rw.Close()
	w.rd.close()
	return err
}

// queueReader reads the device on a goroutine of its own into a queue of
// frames, for a device whose reads can only block.
type queueReader struct {
	free, full chan []byte
	done       chan struct{}
	// err is the read error that ended the goroutine: written before it
	// closes full, read after a receive from full saw it closed.
	err error
}

// plainQueueDepth is the frames a queueReader holds: about a NIC ring's
// worth, so that one poll batch finds many.
const plainQueueDepth = 256

func newQueueReader(rw io.Reader, maxFrame int) *queueReader {
	q := &queueReader{
		free: make(chan []byte, plainQueueDepth),
		full: make(chan []byte, plainQueueDepth),
		done: make(chan struct{}),
	}
	backing := make([]byte, plainQueueDepth*maxFrame)
	for i := range plainQueueDepth {
		q.free <- backing[i*maxFrame : (i+1)*maxFrame : (i+1)*maxFrame]
	}
	go q.run(rw)
	return q
}

// run reads frames until the device fails (as it does once closed).
func (q *queueReader) run(rw io.Reader) {
	for {
		var buf []byte
		select {
		case buf = <-q.free:
		case <-q.done:
			return
		}
		n, err := rw.Read(buf)
		if err != nil {
			q.err = err
			close(q.full)
			return
		}
		q.full <- buf[:n]
	}
}

func (q *queueReader) read(b []byte, block bool) (int, error) {
	var buf []byte
	var ok bool
	select {
	case buf, ok = <-q.full:
	default:
		if !block {
			return 0, ErrNoFrame
		}
		select {
		case buf, ok = <-q.full:
		case <-q.done:
			return 0, os.ErrClosed
		}
	}
	if !ok {
		return 0, q.err
	}
	n := copy(b, buf)
	q.free <- buf[:cap(buf)]
	return n, nil
}

func (q *queueReader) close() { close(q.done) }

// MaxFrameLen is the longest Ethernet frame a link of IP MTU mtu carries
// (0: DefaultMTU): MLX5E_SW2HW_MTU's hard MTU, the Ethernet header, a VLAN
// tag and the FCS, a little more than needed without the FCS.
func MaxFrameLen(mtu int) int {
	if mtu == 0 {
		mtu = DefaultMTU
	}
	return mtu + hardMTU
}
