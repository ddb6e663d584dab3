// Package stacktest provides utilities for testing code that runs on a
// ustack stack, as net/http/httptest does for HTTP: two stacks joined by
// an in-memory wire (Pair, NewPair; no root needed), a stack on a fresh TAP
// device in a fresh network namespace whose kernel side is the peer
// (NewTAP; root and Linux, skipped otherwise), and Counters to read a
// stack's counters into a map.
//
// Everything a constructor builds is removed by the test's cleanup
// (testing.TB.Cleanup), also when the test fails: the stacks are closed,
// the TAP device and the namespace deleted. Namespaces are named
// stacktest-PID-N and get no default route, so nothing a test sends can
// leave them.
//
// The stacks' RX pages come from pools that poison what comes back, so that
// a use after release reads garbage, and cleanup fails the test if a page
// is still out after the stack closed.
package stacktest

import (
	"net/netip"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
	"github.com/ustack/ustack/stack"
)

// Pair builds two stacks joined by an in-memory wire: rx (the stack under
// test, its driver configured by dc) at 192.0.2.1/24 and 2001:db8::1/64,
// and a peer at 192.0.2.2/24 and 2001:db8::2/64. Cleanup closes both.
func Pair(t testing.TB, dc driver.Config) (rx, peer *stack.Stack) {
	t.Helper()
	return NewPair(t,
		stack.Config{Driver: dc, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64")}},
		stack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24"), netip.MustParsePrefix("2001:db8::2/64")}})
}

// NewPair builds the receiver rxCfg and the peer peerCfg on the two ends of
// an in-memory wire (MACs ...:01 and ...:02). The receiver's pool poisons
// (its pages are chunks with ZeroCopy); cleanup closes both stacks and
// checks that every page came back.
func NewPair(t testing.TB, rxCfg, peerCfg stack.Config) (rx, peer *stack.Stack) {
	t.Helper()
	a, b := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535+18)
	pc := bufpool.Config{Poison: true, RingSize: 1 << 15}
	if rxCfg.ZeroCopy {
		pc.Memory = stack.NewChunkMemory()
	}
	pool := testutil.NewPool(t, pc)
	rxCfg.Driver.Pool = pool
	rxCfg.Wire, rxCfg.MAC = a, [6]byte{2, 0, 0, 0, 0, 1}
	rx, err := stack.New(rxCfg)
	if err != nil {
		t.Fatal(err)
	}
	peerCfg.Wire, peerCfg.MAC = b, [6]byte{2, 0, 0, 0, 0, 2}
	peer, err = stack.New(peerCfg)
	if err != nil {
		rx.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		peer.Close()
		rx.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("pages still in use after Close: got %d, want 0", n)
		}
	})
	return rx, peer
}

// Counters returns every counter fns enumerate (such as
// (*stack.Stack).EachCounter), by name.
func Counters(fns ...func(func(name string, v uint64))) map[string]uint64 {
	m := map[string]uint64{}
	for _, each := range fns {
		each(func(name string, v uint64) { m[name] = v })
	}
	return m
}
