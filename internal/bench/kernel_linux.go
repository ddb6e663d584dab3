package bench

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack/serve"
)

// The kernel peer's veth link for the TCP bulk bench: the sender's end in
// the bed's namespace, the receiver's in a namespace of its own.
var (
	kernelVethSend = netip.MustParsePrefix("10.76.0.1/24")
	kernelVethRecv = netip.MustParsePrefix("10.76.0.2/24")
)

// KernelPeer is the kernel's TCP receiver for `ustack bench`'s kernel row:
// a namespace of its own joined to the bed's by a veth pair, so that the
// same sender (`ustack send` in the bed's namespace) measures the kernel's
// receive path as it measures ustack's over the TAP.
type KernelPeer struct {
	ns *testbed.Netns
}

// NewKernelPeer builds the peer's namespace and the veth pair at mtu.
// Close removes them.
func NewKernelPeer(bed *testbed.TAPBed, mtu int) (*KernelPeer, error) {
	ns, err := testbed.NewNetns("ustack-bench-rx")
	if err != nil {
		return nil, err
	}
	k := &KernelPeer{ns: ns}
	if err := testbed.NewVethPair(bed.NS, ns, "ubk0", "ubk1", mtu); err != nil {
		k.Close()
		return nil, err
	}
	if err := bed.NS.IP("addr", "add", kernelVethSend.String(), "dev", "ubk0"); err != nil {
		k.Close()
		return nil, err
	}
	if err := ns.IP("addr", "add", kernelVethRecv.String(), "dev", "ubk1"); err != nil {
		k.Close()
		return nil, err
	}
	return k, nil
}

// Netns is the peer's namespace (for a signal handler's cleanup).
func (k *KernelPeer) Netns() *testbed.Netns { return k.ns }

// Close removes the peer's namespace and with it the veth pair.
func (k *KernelPeer) Close() error { return k.ns.Close() }

// measureKernel is Measure's kernel row: the same sender against the Go
// discard server on a kernel socket across the veth pair. The receiver's
// CPU column is this process's (the discard goroutines' recvmsg copies);
// the kernel's softirq work shows in the machine column only.
func measureKernel(bed *testbed.TAPBed, k *KernelPeer, exe string, row Row, dur time.Duration, cc string, wsize int) (Sample, error) {
	var s Sample
	if k == nil {
		return s, fmt.Errorf("kernel row without a kernel peer")
	}
	ap := netip.AddrPortFrom(kernelVethRecv.Addr(), benchPort)
	l, err := k.ns.ListenTCP(ap)
	if err != nil {
		return s, err
	}
	var received atomic.Uint64
	served := make(chan error, 1)
	go func() { served <- serve.Discard(l, &received) }()
	defer func() { l.Close(); <-served }()
	ru0, sys0 := rusage(), machineCPU()
	res, err := sendBuiltin(bed, exe, ap, row, dur, cc, wsize)
	if err != nil {
		return s, err
	}
	if err := waitReceived(&received, uint64(res.Bytes)); err != nil {
		return s, err
	}
	s.fill(res, rusage()-ru0, machineCPU()-sys0)
	return s, nil
}

// fill sets s's throughput, CPU per GB and congestion control from the
// sender's result and the receiver's and the machine's CPU over the run.
func (s *Sample) fill(res SendResult, rx time.Duration, machine float64) {
	gb := float64(res.Bytes) / 1e9
	s.gbps = float64(res.Bytes) * 8 / res.Seconds / 1e9
	s.rxCPUPerGB = rx.Seconds() / gb
	s.sysCPUPerGB = machine / gb
	s.congestion = res.Congestion
}

// sendBuiltin runs `exe send` in the bed's namespace against ap for dur
// with row's streams and returns its result.
func sendBuiltin(bed *testbed.TAPBed, exe string, ap netip.AddrPort, row Row, dur time.Duration, cc string, wsize int) (SendResult, error) {
	var res SendResult
	ctx, cancel := context.WithTimeout(context.Background(), dur+30*time.Second)
	defer cancel()
	out, err := runSender(bed.NS.Exec(ctx, exe, "send", "-addr", ap.String(),
		"-t", dur.String(), "-cc", cc, "-w", fmt.Sprint(wsize), "-P", fmt.Sprint(max(1, row.Streams))))
	if err != nil {
		return res, err
	}
	return res, parseSendResult(out, &res)
}

// waitReceived waits until the receiver has read want bytes, what the
// sender wrote, for at most 10 s.
func waitReceived(received *atomic.Uint64, want uint64) error {
	deadline := time.Now().Add(10 * time.Second)
	for received.Load() < want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := received.Load(); got != want {
		return fmt.Errorf("received %d bytes, sender wrote %d", got, want)
	}
	return nil
}
