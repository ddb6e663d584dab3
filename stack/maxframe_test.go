package stack

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ustack/ustack/driver"
)

// plainMemWire is a MemWire that takes no transmit offloads, as a
// PlainWire reports.
type plainMemWire struct{ *driver.MemWire }

func (plainMemWire) Offloads() bool { return false }

// TestNewRefusesShortWire: New refuses a wire whose MaxFrame is shorter
// than the stack's frames (with offloads a 64 KB super-frame, else the
// MTU's frame, behind the link and virtio-net headers), naming both
// lengths, and takes one that fits. A MemWire of 1514-byte frames under a
// stack with offloads used to be taken, and then dropped every
// super-frame, counted only in MemWire.Dropped: TCP crawled.
func TestNewRefusesShortWire(t *testing.T) {
	const vnet = driver.VirtioNetHdrLen
	for _, tc := range []struct {
		name     string
		maxFrame int
		plain    bool // the wire takes no offloads
		mtu      int
		queue    int // maxFrame is queue 1's (the wire's fits); 0: the wire's
		want     string
	}{
		{name: "offloads/1514", maxFrame: 1514, want: "at most 1514 bytes, want 65559"},
		{name: "offloads/mtu frame", maxFrame: vnet + 1514, want: "at most 1524 bytes, want 65559"},
		{name: "offloads/one short", maxFrame: vnet + 14 + 65535 - 1, want: "want 65559"},
		{name: "offloads/fits", maxFrame: vnet + 14 + 65535},
		{name: "offloads/default", maxFrame: 0},
		{name: "queue 1 short", maxFrame: 1514, queue: 1, want: "queue 1 carries frames of at most 1514"},
		{name: "plain/mtu frame", maxFrame: vnet + 1514, plain: true},
		{name: "plain/short", maxFrame: vnet + 1513, plain: true, want: "want 1524 (an MTU of 1500"},
		{name: "plain/mtu 9000 short", maxFrame: vnet + 1514, plain: true, mtu: 9000, want: "want 9024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wire := func(maxFrame int) driver.Wire {
				w, peer := driver.NewMemPair(4096, maxFrame)
				t.Cleanup(func() { peer.Close() })
				if tc.plain {
					return plainMemWire{w}
				}
				return w
			}
			cfg := Config{
				Addrs:  []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")},
				Driver: driver.Config{MTU: tc.mtu},
			}
			if tc.queue == 0 {
				cfg.Wire = wire(tc.maxFrame)
			} else {
				cfg.Wire, cfg.Queues = wire(0), []driver.Wire{wire(tc.maxFrame)}
			}
			s, err := New(cfg)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("New: %v, want a stack", err)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("New: got a stack, want an error with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: got %q, want it to say %q", err, tc.want)
			}
		})
	}
}

// TestMemPairDefault: NewMemPair(0, 0) makes a wire a stack with offloads
// takes and that carries its super-frames: a 64 KB TCP transfer arrives
// whole with no frame dropped, and the stack reports the wire's drops
// (rx_wire_dropped, tx_wire_dropped).
func TestMemPairDefault(t *testing.T) {
	a, b := driver.NewMemPair(0, 0)
	rx, peer := newPairOn(t, a, b, Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}},
		Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
	bulkTo(t, rx, peer, netip.MustParseAddrPort("192.0.2.1:9"), 64<<10)
	if rx.Driver().Stats().GSOFrames.Load() == 0 {
		t.Errorf("rx_gso_frames: got 0, want the peer's super-frames")
	}
	c := counterMap(rx)
	for _, name := range []string{"rx_wire_dropped", "tx_wire_dropped"} {
		if v, ok := c[name]; !ok || v != 0 {
			t.Errorf("%s: got %d (reported %v), want 0, reported", name, v, ok)
		}
	}
	// A frame past the wire's limit from the peer is the stack's
	// rx_wire_dropped.
	if err := b.Write(make([]byte, b.MaxFrame()+1)); err != nil {
		t.Fatal(err)
	}
	if got := counterMap(rx)["rx_wire_dropped"]; got != 1 {
		t.Errorf("rx_wire_dropped after an overlong frame: got %d, want 1", got)
	}
}
