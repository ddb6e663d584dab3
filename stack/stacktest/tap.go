package stacktest

import (
	"context"
	"net/netip"
	"os/exec"
	"sync"

	"github.com/ustack/ustack/stack"
)

// SkipMessage is how NewTAP skips a test run without root: the message
// ustack's integration tests skip with.
const SkipMessage = "needs root for TAP and netns; run go test as root"

// TAPConfig configures NewTAP. The zero value is usable: a TAP (not a TUN)
// with MTU 1500 on 10.77.0.0/24 and fd77::/64.
type TAPConfig struct {
	// Stack configures the stack under test. NewTAP sets its Wire and
	// Addrs (the rig's StackAddr4 and StackAddr6) and Driver.MTU, and
	// makes its pool poison (Pool.Poison); everything else is the
	// caller's (Routes, ZeroCopy, Driver policies, ...).
	Stack stack.Config
	// MTU is the link's MTU on both sides; 0 means 1500.
	MTU int
	// TUN makes the device a TUN: IP packets with no Ethernet header, no
	// ARP or NDP (the stack runs on it with driver.Config.L3).
	TUN bool
	// Subnet4 and Subnet6 are the link's subnets, at most /30 and /126; the
	// kernel peer gets the first address of each, the stack the second.
	// Zero means 10.77.0.0/24 and fd77::/64.
	Subnet4, Subnet6 netip.Prefix
}

// TAPRig is a stack on a TAP (or TUN) device whose kernel side is the peer:
// the device is alone in a network namespace this test created (with lo),
// holding the peer's addresses; the stack, in this process, owns the
// device's descriptor. Traffic between them crosses the kernel's TAP
// driver with virtio-net headers and offloads, as in `ustack run`.
//
// The exported fields are set by NewTAP and must not be changed. Its
// methods are safe for concurrent use; Close may be called any number of
// times, the test's cleanup calls it.
type TAPRig struct {
	// Stack is the stack under test. Close (and the test's cleanup)
	// closes it; close it earlier to test what follows a Close.
	Stack *stack.Stack
	// Netns labels the peer namespace in messages. The namespace is
	// held by a descriptor and has no name in the kernel: run programs in
	// it with Command, not `ip netns exec`.
	Netns string
	// Device is the TAP (or TUN) device's name inside Netns.
	Device string
	// PeerAddr4 and PeerAddr6 are the kernel peer's addresses on the
	// link, with the subnet's prefix length.
	PeerAddr4, PeerAddr6 netip.Prefix
	// StackAddr4 and StackAddr6 are the stack's addresses, with the
	// subnet's prefix length.
	StackAddr4, StackAddr6 netip.Prefix

	ns        nsDoer
	closeOnce sync.Once
	closeFn   func() error
	closeErr  error
}

// Close closes the stack (resetting its connections) and then deletes the
// device and the namespace, and returns the first error. Later calls
// return the first call's result.
func (r *TAPRig) Close() error {
	r.closeOnce.Do(func() { r.closeErr = r.closeFn() })
	return r.closeErr
}

// Counters returns the stack's counters by name (Stack.EachCounter).
func (r *TAPRig) Counters() map[string]uint64 {
	return Counters(r.Stack.EachCounter)
}

// nsDoer is the peer namespace (a *testbed.Netns on Linux).
type nsDoer interface {
	Do(fn func() error) error
	Exec(ctx context.Context, name string, args ...string) *exec.Cmd
}
