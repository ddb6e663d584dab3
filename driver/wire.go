package driver

import (
	"errors"
	"time"
)

// ErrNoFrame is returned by a non-blocking Wire.Read when no frame is ready.
var ErrNoFrame = errors.New("driver: no frame ready")

// ErrNotSupported is returned where the operating system or kernel lacks a
// feature the driver needs (TAP devices outside Linux, for example).
var ErrNotSupported = errors.New("driver: not supported")

// A Wire moves whole frames, each preceded by a virtio-net header
// (VirtioNetHdrLen bytes, see vnet.go), between ustack and its peer: a TAP
// device or an in-memory peer.
//
// Read is called by one goroutine at a time (the NIC model's reader); Write
// may be called concurrently from several goroutines. Close may be called at
// any time from any goroutine and wakes a blocked Read.
type Wire interface {
	// Read reads one frame (virtio-net header followed by the Ethernet
	// frame) into b and returns its length. If no frame is ready it returns
	// ErrNoFrame when block is false, and waits for one otherwise. A frame
	// longer than b is truncated to len(b). After Close it returns
	// os.ErrClosed.
	Read(b []byte, block bool) (int, error)

	// Write sends one frame: b holds the virtio-net header followed by the
	// Ethernet frame. Write does not retain b.
	Write(b []byte) error

	// Close releases the wire and wakes any blocked Read.
	Close() error
}

// VecReader is a Wire that can scatter one frame over several buffers, as
// readv(2) does: iov[0] first, then iov[1], and so on. ReadVec behaves as
// Read does over the buffers' concatenation (a longer frame is truncated),
// and is called by the same single reader. The NIC model uses it to read
// super-frames straight into its ring's pages (Config.BounceRead).
//
// The NIC model hands ReadVec at most maxReadIov buffers.
type VecReader interface {
	ReadVec(iov [][]byte, block bool) (int, error)
}

// A Waiter is a Wire whose reader can sleep until a frame may be ready
// and be woken by another goroutine: the NIC model and the poll loop on one
// goroutine (Config.RunToCompletion) sleep in Wait rather than in a
// blocking Read, so that the handler's flush timer and a busy reader's
// hand-back wake them too. The TAP and MemWire are Waiters.
type Waiter interface {
	// Wait returns when a frame may be ready to read, after timeout (a
	// negative timeout waits without one), when Wake is called (a Wake
	// with nobody waiting makes the next Wait return at once) or when
	// the wire is closed (then with os.ErrClosed). It may return early
	// with no frame: the caller reads without blocking to see. Wait is
	// called by the reader only.
	Wait(timeout time.Duration) error
	// Wake makes a Wait in progress, or the next one, return. Safe to
	// call from any goroutine, also after Close.
	Wake()
}

// maxReadIov bounds the buffers of one ReadVec: a 64 KB super-frame over
// 4 KB pages needs 18, plus the NIC's header and spill buffers.
const maxReadIov = 64

// MaxQueues bounds the queues of one device ustack attaches to: tun's
// MAX_TAP_QUEUES is 256, far more than a stack here spreads over.
const MaxQueues = 16
