package driver

import "errors"

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
