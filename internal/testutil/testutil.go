// Package testutil holds what the tests of every ustack package share, as
// wireguard-go's tun/tuntest does for its tun tests: a TestMain that fails
// the run when a test leaves a goroutine running, a pooled page out or a
// testbed network namespace open (Main, Run), pool constructors those checks cover (NewPool), a poll for
// a condition (WaitFor), and test frames built with gVisor's header
// encoders (Frame).
//
// Test code only: no package but a _test.go file imports it. It imports
// bufpool, so bufpool's own TestMain sits in an external test file
// (package bufpool_test). Its helpers are safe for concurrent use.
package testutil

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testbed"
)

// leakWait bounds how long Run waits, after the tests passed, for their
// goroutines to exit and their pages to come back: only a failure waits
// that long (a goroutine on its way out, on a loaded machine, gets there in
// far less).
const leakWait = 30 * time.Second

// Main is a package's TestMain: it runs the tests with Run and exits with
// its code.
//
//	func TestMain(m *testing.M) { testutil.Main(m) }
func Main(m *testing.M, opts ...goleak.Option) { os.Exit(Run(m, opts...)) }

// Run runs the tests (m.Run) and returns the exit code: the tests' own, or
// 1 when they passed but a pool from NewPool still has pages in use, a
// network namespace that testbed made is still open (testbed.OpenNetns:
// they are held by descriptors, so no listing outside the process, such
// as `ip netns list`, shows one a test forgot) or a goroutine is still
// running that was not before the tests (goleak, with opts for the ones a
// package knows to outlive its tests). Both are polled
// until they hold or leakWait passes. It is for a TestMain that has more to
// do than Main (flags before, a summary after).
func Run(m *testing.M, opts ...goleak.Option) int {
	opts = append([]goleak.Option{goleak.IgnoreCurrent()}, opts...)
	code := m.Run()
	if code != 0 {
		return code
	}
	deadline := time.Now().Add(leakWait)
	for {
		err := check(opts)
		if err == nil {
			return code
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "testutil: after the tests passed: %v\n", err)
			return 1
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// check returns what is left behind: pages of tracked pools, testbed's
// namespaces, goroutines.
func check(opts []goleak.Option) error {
	var msgs []string
	if open := testbed.OpenNetns(); len(open) != 0 {
		msgs = append(msgs, fmt.Sprintf("network namespaces still open: %s", strings.Join(open, " ")))
	}
	pools.mu.Lock()
	for i, p := range pools.list {
		if n := p.InUse(); n != 0 {
			msgs = append(msgs, fmt.Sprintf("pool %d (%s): %d pages still in use", i, pools.names[i], n))
		}
	}
	pools.mu.Unlock()
	if err := goleak.Find(opts...); err != nil {
		msgs = append(msgs, err.Error())
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(msgs, "\n"))
}

// pools are the pools NewPool made; Run checks that none has a page out.
var pools struct {
	mu sync.Mutex
	// +checklocks:mu
	list []*bufpool.Pool
	// +checklocks:mu
	names []string // the test that made each
}

// NewPool returns a pool for cfg, failing t on error. Run fails the
// package's tests if, once they passed, any page of it is still in use; it
// is not closed (tests may still hand pages back after t ends, from the
// goroutines they stopped).
func NewPool(t testing.TB, cfg bufpool.Config) *bufpool.Pool {
	t.Helper()
	p, err := bufpool.New(cfg)
	if err != nil {
		t.Fatalf("bufpool.New(%+v): %v", cfg, err)
	}
	pools.mu.Lock()
	pools.list = append(pools.list, p)
	pools.names = append(pools.names, t.Name())
	pools.mu.Unlock()
	return p
}

// NewPoisonPool is NewPool of a default pool that poisons what comes back
// (Config.Poison), so that a use after release reads garbage.
func NewPoisonPool(t testing.TB) *bufpool.Pool {
	t.Helper()
	return NewPool(t, bufpool.Config{Poison: true})
}

// waitLimit bounds WaitFor: only a failure waits that long.
const waitLimit = 60 * time.Second

// WaitFor polls cond until it holds, failing t (naming what) if it does
// not within 60 s. It yields at first and then sleeps a millisecond a
// round, so that short waits stay short and long ones leave the CPU to the
// code under test.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for i := 0; !cond(); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitLimit, what)
		}
		if i < 1000 {
			runtime.Gosched()
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}
