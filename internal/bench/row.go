package bench

import (
	"net"
	"sync/atomic"

	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
)

// Policy is one configuration of ustack's receive path under measurement,
// as cmd/ustack builds it from its switches (-lro, -hds, ...). The bench
// only builds stacks with it; parsing the switches stays with the command.
type Policy interface {
	// StackConfig returns the stack's configuration; the bench sets its
	// Wire and Addrs.
	StackConfig() (stack.Config, error)
	// ReadViews reports whether the readers take the payload in place
	// (-zero-copy views): TCP with stack.TCPConn.ReadViews rather than
	// Read, UDP trains with TrainConn.TakeTrain rather than ReadTrain.
	ReadViews() bool
	// PlainWire reports whether the stack's wire is water's plain TAP (no
	// virtio-net header, no offloads: -wire plain) rather than ustack's
	// own with offloads.
	PlainWire() bool
}

// ParsePolicy builds the Policy of name=value switch settings, later ones
// winning; the matrix calls it for every ustack side of every run.
type ParsePolicy func(settings []string) (Policy, error)

// Row is one configuration of the bench table.
type Row struct {
	Name    string
	Streams int    // parallel TCP streams (0 or 1: one)
	Policy  Policy // ustack's; nil with Stock
	MTU     int    // the link's MTU, which the Stock endpoint uses
	Stock   bool   // gVisor's stock fdbased endpoint instead of ustack's driver
	Kernel  bool   // the kernel's TCP over a veth pair (KernelPeer) instead of a stack
	Floor   bool   // the TAP floor's sink on the TAP (MeasureFloorSink) instead of a stack
	TUN     bool   // ustack on a TUN device (the caller's TUN bed) instead of the TAP
	Queues  int    // > 0: ustack on that many queues of a multi-queue TAP (the caller's multi-queue bed)
	Client  string // the sender on a TAP: ClientBuiltin or ClientIPerf3; "": builtin
}

// readViews reports whether p's reader uses ReadViews; the stock
// endpoint's (p nil) reads.
func readViews(p Policy) bool { return p != nil && p.ReadViews() }

// discard returns the TCP discard server for a policy's reader: Read, or
// ReadViews when readViews(p).
func discard(p Policy) func(net.Listener, *atomic.Uint64) error {
	if readViews(p) {
		return serve.DiscardViews
	}
	return serve.Discard
}
