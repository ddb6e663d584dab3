package driver

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// directCase is one frame of TestDirectRead's sequence and whether a
// direct read may leave it in the ring (a TCP super-frame with its headers
// in the first directHead bytes); every other frame is gathered.
type directCase struct {
	name   string
	wire   []byte
	direct bool
	drop   bool // dropped by the NIC model: nothing delivered
}

// directSequence returns frames that go every way a direct read can: TCP
// super-frames of many sizes (so that some spill past the end of a WQE),
// IPv4 and IPv6, one whose IPv6 extension headers end past directHead, a
// UDP super-frame (cut into segments), a single TCP frame, one shorter
// than directHead, and a super-frame with a bad IPv4 header checksum.
func directSequence(t *testing.T) []directCase {
	var cs []directCase
	super := func(l3 L3Type, payload int, direct bool) {
		h, f, _ := tcpSuper(t, l3, payload)
		cs = append(cs, directCase{name: fmt.Sprintf("tcp-%v-%d", l3, payload), wire: wireFrame(h, f), direct: direct})
	}
	// From the first WQE's start (256 KB, 64-byte strides): three frames
	// of 65066 bytes (65088 with their strides) and one of 2066 (2112)
	// leave 64768 bytes; the next frame's 65066 do not fit, and a WQE
	// with room for a frame of the last one's size is not retired: its
	// tail spills past the WQE, and it is gathered and placed in a new one.
	for range 3 {
		super(L3IPv4, 65000, true)
	}
	super(L3IPv4, 2000, true)
	super(L3IPv4, 65000, false)
	// 200 bytes of payload: most of the frame lies in the first directHead
	// bytes, only the rest in the ring.
	for i, p := range []int{65000, 1000, 30000, 65000, 200, 65000, 40000, 65000, 12000, 65000} {
		l3 := L3IPv4
		if i%3 == 2 {
			l3 = L3IPv6
		}
		super(l3, p, true)
	}
	// Headers that end past directHead: gathered, then placed whole.
	long := pkSpec{l3: L3IPv6, proto: protoTCP, ext: []uint8{0, 60}, extOpts: 40, tcpTS: true, tcpFlags: header.TCPFlagAck, seq: 7, ack: 1, payload: pkPayload(20000)}
	h, f, fi := pkSuperFrame(t, long, VirtioNetHdrGSOTCPv6, mss6)
	if fi.HeaderLen() <= directHead {
		t.Fatalf("long headers: %d bytes, want more than %d", fi.HeaderLen(), directHead)
	}
	cs = append(cs, directCase{name: "tcp-v6-long-headers", wire: wireFrame(h, f)})
	super(L3IPv4, 65000, true)
	// A UDP super-frame: segmented, never left in the ring.
	udp := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(20000)}
	h, f, _ = pkSuperFrame(t, udp, VirtioNetHdrGSOUDPL4, 1400)
	cs = append(cs, directCase{name: "udp-gso", wire: wireFrame(h, f)})
	super(L3IPv6, 65000, true)
	// A single frame, as the sender's pure ACKs and small writes.
	one := pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh, seq: 9, ack: 1, payload: pkPayload(1000)}
	cs = append(cs, directCase{name: "tcp-single", wire: wireFrame(VirtioNetHdr{}, one.build())})
	super(L3IPv4, 65000, true)
	// A bad IPv4 header checksum: dropped after the direct read.
	h, f, fi = tcpSuper(t, L3IPv4, 50000)
	f[fi.L2Len+10] ^= 0xff
	cs = append(cs, directCase{name: "tcp-bad-ip-csum", wire: wireFrame(h, f), direct: true, drop: true})
	super(L3IPv4, 65000, true)
	return cs
}

// TestDirectRead sends the same sequence through a driver reading
// super-frames straight into the ring and through one bouncing every
// frame through its own buffer, and checks that both deliver the same
// packets, byte for byte, that the direct one left exactly the eligible
// frames in the ring, and that the bouncing one left none.
func TestDirectRead(t *testing.T) {
	seq := directSequence(t)
	run := func(bounce bool) ([][]byte, *Stats) {
		c := &collector{keep: true}
		d, w := newTestDriver(t, Config{LRO: true, BounceRead: bounce, Budget: 4}, c)
		var want int64
		for _, fc := range seq {
			before := d.Stats().DirectReads.Load()
			if err := w.Write(fc.wire); err != nil {
				t.Fatal(err)
			}
			if !fc.drop {
				want++
				if fc.name == "udp-gso" {
					want = want - 1 + (20000+1399)/1400 // its segments
				}
				c.waitFor(t, want)
			} else {
				waitDropped(t, d, DropBadIPCsum, 1)
			}
			got := d.Stats().DirectReads.Load() - before
			switch {
			case bounce && got != 0:
				t.Errorf("bounce read, %s: rx_wire_direct went up by %d", fc.name, got)
			case !bounce && fc.direct && !fc.drop && got != 1:
				t.Errorf("%s: rx_wire_direct went up by %d, want 1", fc.name, got)
			case !bounce && !fc.direct && got != 0:
				t.Errorf("%s: rx_wire_direct went up by %d, want 0 (gathered)", fc.name, got)
			}
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.frames, d.Stats()
	}
	bounced, _ := run(true)
	direct, st := run(false)
	if len(direct) != len(bounced) {
		t.Fatalf("packets: direct %d, bounce %d", len(direct), len(bounced))
	}
	for i := range direct {
		if !bytes.Equal(direct[i], bounced[i]) {
			t.Errorf("packet %d differs between direct and bounce reads (%d and %d bytes)", i, len(direct[i]), len(bounced[i]))
		}
	}
	// Against what was sent: each TCP super-frame comes up whole.
	var sent [][]byte
	for _, fc := range seq {
		if fc.direct && !fc.drop {
			sent = append(sent, fc.wire[VirtioNetHdrLen:])
		}
	}
	k := 0
	for _, p := range direct {
		if k < len(sent) && bytes.Equal(p, sent[k]) {
			k++
		}
	}
	if k != len(sent) {
		t.Errorf("TCP super-frames delivered unchanged, in order: %d of %d", k, len(sent))
	}
	if st.DirectBytes.Load() == 0 || st.DirectBytes.Load() >= st.WireBytes.Load() {
		t.Errorf("rx_wire_direct_bytes %d of rx_wire_bytes %d: want some, not all", st.DirectBytes.Load(), st.WireBytes.Load())
	}
}

// waitDropped waits until d has counted n drops for reason r.
func waitDropped(t *testing.T, d *Driver, r Drop, n uint64) {
	t.Helper()
	for i := 0; d.Stats().Dropped[r].Load() < n; i++ {
		if i == 10000 {
			t.Fatalf("drops for %v: got %d, want %d", r, d.Stats().Dropped[r].Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCoalesceBytes checks when the NIC model interrupts a sleeping poll
// loop with LRO super-frames, the moderation timer off: after Budget frames
// by default, and as soon as CoalesceBytes are pending with interrupt
// moderation by bytes. The NIC's receive is driven by hand, without the
// driver's goroutines; the poll loop is made to look asleep.
func TestCoalesceBytes(t *testing.T) {
	h, f, _ := tcpSuper(t, L3IPv4, 60000)
	frame := wireFrame(h, f)
	for _, tc := range []struct {
		coalesce int
		want     int // frames received when first due
	}{
		{0, 8},
		{100_000, 2},
		{150_000, 3},
	} {
		t.Run(fmt.Sprint(tc.coalesce), func(t *testing.T) {
			d := handDriver(t, len(frame), Config{LRO: true, Budget: 8, CoalesceBytes: tc.coalesce})
			d.pollSleeping.Store(true)
			n := &d.nic
			got := 0
			for got < 20 && !n.due() {
				n.receive(frame, 0)
				n.expose()
				got++
			}
			if got != tc.want {
				t.Errorf("due after %d frames of %d bytes, want %d", got, len(f), tc.want)
			}
			n.publish()
			if n.due() || d.prod.Load() != uint32(got) {
				t.Errorf("after publish: due %v, published %d, want false, %d", n.due(), d.prod.Load(), got)
			}
		})
	}
}

// TestCoalesceUsecs checks the moderation timer (Config.CoalesceUsecs,
// mlx5's CQE mode): a sleeping poll loop is interrupted at the wire read
// that returns CoalesceUsecs or more after the one before it, not earlier
// by the timer alone; without the timer only Budget does it; a running poll
// loop is not interrupted and its CQEs are not counted. Only lower bounds
// of time are relied on (a sleep between reads), never an upper one.
func TestCoalesceUsecs(t *testing.T) {
	h, f, _ := tcpSuper(t, L3IPv4, 60000)
	frame := wireFrame(h, f)
	for _, tc := range []struct {
		name     string
		usecs    int
		sleeping bool
		want     bool // due after the second read
	}{
		{"timer", 50, true, true},
		{"no timer", 0, true, false},
		{"poll loop running", 50, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := handDriver(t, len(frame), Config{LRO: true, Budget: 8, CoalesceUsecs: tc.usecs})
			d.pollSleeping.Store(tc.sleeping)
			n := &d.nic
			n.receive(frame, 0)
			n.expose()
			if n.due() {
				t.Fatal("due after the first read: the timer starts with it")
			}
			time.Sleep(time.Duration(max(tc.usecs, 50)) * 2 * time.Microsecond)
			n.receive(frame, 0)
			n.expose()
			if got := n.due(); got != tc.want {
				t.Errorf("due after a read %d us after the first: got %v, want %v", max(tc.usecs, 50)*2, got, tc.want)
			}
			if want := 2; tc.sleeping && n.pending != want {
				t.Errorf("pending: got %d, want %d", n.pending, want)
			}
			if !tc.sleeping && n.pending != 0 {
				t.Errorf("pending with the poll loop running: got %d, want 0", n.pending)
			}
			if d.prod.Load() != 2 {
				t.Errorf("exposed: got %d CQEs, want 2", d.prod.Load())
			}
		})
	}
}

// handDriver returns a driver over a memory wire whose NIC is driven by
// hand (receive, expose, due), closed when the test ends.
func handDriver(t *testing.T, frameLen int, cfg Config) *Driver {
	t.Helper()
	a, b := NewMemPair(4, frameLen)
	t.Cleanup(func() { b.Close() })
	copy(cfg.MAC[:], pkDstMAC)
	d, err := New(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// FuzzDirectRead feeds a wire read (virtio-net header and frame) to a
// driver that reads super-frames straight into its ring and to one that
// bounces every frame through its own buffer, and requires the same
// packets, byte for byte, and the same drops from both: what a direct read
// decides from a frame's first directHead bytes (its tail is not in the
// NIC's buffer) must agree with what the whole frame says.
func FuzzDirectRead(f *testing.F) {
	seed := func(h VirtioNetHdr, frame []byte) { f.Add(wireFrame(h, frame)) }
	for _, l3 := range []L3Type{L3IPv4, L3IPv6} {
		for _, p := range []int{300, 3000, 65000} {
			h, fr, _ := tcpSuper(f, l3, p)
			seed(h, fr)
		}
	}
	long := pkSpec{l3: L3IPv6, proto: protoTCP, ext: []uint8{0, 60}, extOpts: 40, tcpTS: true, tcpFlags: header.TCPFlagAck, payload: pkPayload(3000)}
	h, fr, _ := pkSuperFrame(f, long, VirtioNetHdrGSOTCPv6, mss6)
	seed(h, fr)
	udp := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(5000)}
	h, fr, _ = pkSuperFrame(f, udp, VirtioNetHdrGSOUDPL4, 1400)
	seed(h, fr)
	sentinel := wireFrame(VirtioNetHdr{}, (&pkSpec{l3: L3IPv4, proto: protoUDP, payload: []byte("direct-read fuzz sentinel")}).build())
	f.Fuzz(func(t *testing.T, wire []byte) {
		if len(wire) > VirtioNetHdrLen+maxLROFrame {
			return
		}
		stuck := time.AfterFunc(10*time.Second, func() { panic("FuzzDirectRead: stuck for 10 s") })
		t.Cleanup(func() { stuck.Stop() }) // after the drivers' cleanups
		run := func(bounce bool) ([][]byte, [NumDrops]uint64) {
			c := &collector{keep: true}
			d, w := newTestDriverDepth(t, Config{LRO: true, BounceRead: bounce}, c, 2)
			if err := w.Write(wire); err != nil {
				t.Fatal(err)
			}
			if err := w.Write(sentinel); err != nil {
				t.Fatal(err)
			}
			// The sentinel comes up last: everything before it is done.
			want := sentinel[VirtioNetHdrLen:]
			for i := 0; ; i++ {
				c.mu.Lock()
				n := len(c.frames)
				done := n > 0 && bytes.Equal(c.frames[n-1], want)
				c.mu.Unlock()
				if done {
					break
				}
				if i == 10000 {
					t.Fatal("the sentinel frame did not come up")
				}
				time.Sleep(100 * time.Microsecond)
			}
			var drops [NumDrops]uint64
			for i := range drops {
				drops[i] = d.Stats().Dropped[i].Load()
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.frames, drops
		}
		direct, dd := run(false)
		bounced, bd := run(true)
		if dd != bd {
			t.Errorf("drops: direct %v, bounce %v", dd, bd)
		}
		if len(direct) != len(bounced) {
			t.Fatalf("packets: direct %d, bounce %d", len(direct), len(bounced))
		}
		for i := range direct {
			if !bytes.Equal(direct[i], bounced[i]) {
				t.Fatalf("packet %d differs: direct %d bytes, bounce %d", i, len(direct[i]), len(bounced[i]))
			}
		}
	})
}
