package driver

import "testing"

// TestDriverDropsOversizeFrames checks that a frame that is not a
// super-frame is held to the MTU with LRO on as with LRO off: LRO merges
// what the wire carried, it does not let the wire carry more.
func TestDriverDropsOversizeFrames(t *testing.T) {
	for _, lro := range []bool{false, true} {
		c := &collector{}
		d, w := newTestDriver(t, Config{LRO: lro}, c)
		bigSpec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(DefaultMTU)}
		goodSpec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(100)}
		big, good := bigSpec.build(), goodSpec.build()
		for _, f := range [][]byte{big, good} {
			if err := w.Write(wireFrame(VirtioNetHdr{}, f)); err != nil {
				t.Fatal(err)
			}
		}
		c.waitFor(t, 1)
		if got := d.Stats().Dropped[DropTooBig].Load(); got != 1 {
			t.Errorf("lro %v: %s for a %d-byte frame at MTU %d: got %d, want 1", lro, DropTooBig, len(big), DefaultMTU, got)
		}
	}
}
