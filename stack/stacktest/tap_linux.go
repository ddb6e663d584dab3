//go:build linux

package stacktest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// NewTAP builds a TAPRig: a namespace named stacktest-PID-N with a TAP
// device (a TUN with cfg.TUN) configured on the kernel side, the device
// opened from inside the namespace with the virtio-net header and
// offloads, and a stack of cfg.Stack on it. It waits until the kernel's
// side of the link can transmit. The test's cleanup closes the rig (the
// stack first, then the device and the namespace) and fails the test if a
// page of the stack's pool is still out.
//
// It needs Linux, root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and ip(8) from
// iproute2; without root it skips the test with SkipMessage. Any other
// failure fails the test (t.Fatal) after removing what was made.
func NewTAP(t testing.TB, cfg TAPConfig) *TAPRig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip(SkipMessage)
	}
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = 1500
	}
	bed, err := testbed.NewTAPBed(testbed.TAPConfig{
		Prefix: "stacktest", TAPName: "stacktest0", MTU: mtu, TUN: cfg.TUN,
		Subnet4: cfg.Subnet4, Subnet6: cfg.Subnet6,
	})
	if err != nil {
		t.Fatal(err)
	}
	var tap *driver.TAP
	if err := bed.Open(func() (err error) {
		tap, err = driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true, TUN: cfg.TUN})
		return err
	}); err != nil {
		if tap != nil {
			tap.Close()
		}
		bed.Close()
		t.Fatal(err)
	}

	sc := cfg.Stack
	pc := sc.Pool
	pc.Poison = true
	if sc.ZeroCopy && pc.Memory == nil {
		// Lent pages wait in the ring while gVisor holds them.
		pc.Memory = stack.NewChunkMemory()
		if pc.RingSize == 0 {
			pc.RingSize = stack.ZeroCopyRingPages
		}
	}
	pool, err := bufpool.New(pc)
	if err != nil {
		tap.Close()
		bed.Close()
		t.Fatal(err)
	}
	sc.Pool.Poison = true
	sc.Driver.MTU = mtu
	sc.Driver.Pool = pool
	sc.Wire = tap // New closes it on error
	sc.Addrs = []netip.Prefix{bed.StackAddr4, bed.StackAddr6}
	st, err := stack.New(sc)
	if err != nil {
		bed.Close()
		t.Fatal(err)
	}
	r := &TAPRig{
		Stack:      st,
		Netns:      bed.NS.Name,
		Device:     bed.TAPName,
		PeerAddr4:  bed.KernelAddr4,
		PeerAddr6:  bed.KernelAddr6,
		StackAddr4: bed.StackAddr4,
		StackAddr6: bed.StackAddr6,
		ns:         bed.NS,
	}
	r.closeFn = func() error {
		// The TAP's descriptor must be closed before the namespace is
		// deleted, or the namespace lives on unseen.
		errs := []error{st.Close()}
		for q := range st.Queues() {
			if n := st.QueueDriver(q).Pool().InUse(); n != 0 {
				errs = append(errs, fmt.Errorf("stacktest: queue %d: %d pages in use after the stack's Close", q, n))
			}
		}
		errs = append(errs, bed.Close())
		return errors.Join(errs...)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// Do runs fn on an OS thread switched into the peer namespace (setns(2) on
// a locked thread) and switches the thread back afterwards. Sockets fn
// creates, with Go's net package, are the kernel peer's and stay in the
// namespace for their whole life; goroutines fn starts run outside it.
func (r *TAPRig) Do(fn func() error) error { return r.ns.Do(fn) }

// Command returns a command that runs name with args in the peer namespace
// (testbed.Netns.Exec), such as a kernel client (iperf3,
// ping) or ss and nstat; ctx bounds its life as in exec.CommandContext. The
// caller starts and waits for it.
func (r *TAPRig) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return r.ns.Exec(ctx, name, args...)
}
