package driver

import (
	"bytes"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// usoCollector keeps each packet's bytes, segment size and count.
type usoCollector struct {
	collector
	gso chan [2]int // GSOSize, Segs of each packet
}

func (c *usoCollector) Deliver(p *Packet) {
	c.gso <- [2]int{int(p.GSOSize), int(p.Segs)}
	c.collector.Deliver(p)
}

// TestRxUSO: with RxUSO a UDP super-frame goes up whole, as virtio-net's
// guest USO (one packet, its segment size, its datagram count, the frame's
// bytes exactly); without it, the NIC model cuts it into datagrams; TCP
// super-frames are not RxUSO's (LRO's).
func TestRxUSO(t *testing.T) {
	const payload, gso = 64 * 64, 64
	for _, l3 := range []L3Type{L3IPv4, L3IPv6} {
		spec := pkSpec{l3: l3, proto: protoUDP, payload: pkPayload(payload)}
		h, frame, _ := pkSuperFrame(t, spec, VirtioNetHdrGSOUDPL4, gso)
		for _, on := range []bool{true, false} {
			c := &usoCollector{collector: collector{keep: true}, gso: make(chan [2]int, 128)}
			d, w := newTestDriver(t, Config{RxUSO: on}, c)
			if err := w.Write(wireFrame(h, frame)); err != nil {
				t.Fatal(err)
			}
			want := int64(1)
			if !on {
				want = payload / gso
			}
			c.waitFor(t, want)
			if on {
				g := <-c.gso
				if g != [2]int{gso, payload / gso} {
					t.Errorf("%v on: gso size, segs %v, want %d, %d", l3, g, gso, payload/gso)
				}
				c.mu.Lock()
				got := c.frames[0]
				c.mu.Unlock()
				if !bytes.Equal(got, frame) {
					t.Errorf("%v on: the packet is not the super-frame (%d vs %d bytes)", l3, len(got), len(frame))
				}
			}
			st := map[string]uint64{}
			d.Stats().Each(func(name string, v uint64) { st[name] = v })
			if on && (st["rx_uso_packets"] != 1 || st["rx_uso_bytes"] != uint64(len(frame)) || st["rx_gso_segs"] != 0) {
				t.Errorf("%v on: rx_uso_packets %d, rx_uso_bytes %d (want %d), rx_gso_segs %d", l3, st["rx_uso_packets"], st["rx_uso_bytes"], len(frame), st["rx_gso_segs"])
			}
			if on && st["rx_wire_direct"] != 1 {
				t.Errorf("%v on: rx_wire_direct %d, want the super-frame read straight into the ring", l3, st["rx_wire_direct"])
			}
			if !on && (st["rx_uso_packets"] != 0 || st["rx_gso_segs"] != payload/gso) {
				t.Errorf("%v off: rx_uso_packets %d, rx_gso_segs %d", l3, st["rx_uso_packets"], st["rx_gso_segs"])
			}
		}
	}
	// A TCP super-frame with RxUSO and LRO off is still cut.
	c := &collector{}
	_, w := newTestDriver(t, Config{RxUSO: true}, c)
	h, frame, _ := tcpSuper(t, L3IPv4, 10*mss4)
	if err := w.Write(wireFrame(h, frame)); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, 10)
}

// TestRxUSONoAllocs: a UDP super-frame handed up whole allocates nothing.
func TestRxUSONoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	c := &collector{}
	_, w := startTestDriver(t, Config{RxUSO: true}, bufpool.Config{}, c, 1024)
	h, frame, _ := pkSuperFrame(t, pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(46 * 1400)}, VirtioNetHdrGSOUDPL4, 1400)
	b := wireFrame(h, frame)
	var sent int64
	send := func() {
		if err := w.Write(b); err != nil {
			t.Fatal(err)
		}
		sent++
		c.waitFor(t, sent)
	}
	for range 200 {
		send()
	}
	if allocs := testing.AllocsPerRun(200, send); allocs != 0 {
		t.Errorf("allocations per UDP super-frame: got %v, want 0", allocs)
	}
}
