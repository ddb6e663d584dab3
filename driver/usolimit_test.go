package driver

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/ustack/ustack/internal/testutil"
)

// TestUSOSegmentLimit: a UDP super-frame of more datagrams than
// UDP_MAX_SEGMENTS (128), a tiny gso_size on a large payload among them,
// is dropped as rx_drop_bad_gso, as virtio_net_hdr_to_skb refuses its
// header, whether RxUSO would hand it up whole or the NIC model would cut
// it; 128 datagrams pass, and padding after the IP packet does not count.
// Each super-frame is followed by a plain datagram: when that arrives, the
// super-frame has been dealt with.
func TestUSOSegmentLimit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		gso      int
		payload  int
		pad      int
		dropped  bool
		segments int // what arrives with RxUSO off
	}{
		{"gso-1-60k", 1, 60000, 0, true, 0},
		{"129-segments", 100, 129 * 100, 0, true, 0},
		{"128-segments-and-a-byte", 100, 128*100 + 1, 0, true, 0},
		{"128-segments", 100, 128 * 100, 0, false, 128},
		{"128-segments-padded", 100, 128 * 100, 40, false, 128},
	} {
		for _, on := range []bool{true, false} {
			for _, l3 := range []L3Type{L3IPv4, L3IPv6} {
				t.Run(fmt.Sprintf("%s/rx-uso=%v/ipv%d", tc.name, on, map[L3Type]int{L3IPv4: 4, L3IPv6: 6}[l3]), func(t *testing.T) {
					c := &collector{keep: true}
					d, w := newTestDriverDepth(t, Config{RxUSO: on}, c, 4)
					spec := pkSpec{l3: l3, proto: protoUDP, payload: pkPayload(tc.payload)}
					h, frame, _ := pkSuperFrame(t, spec, VirtioNetHdrGSOUDPL4, uint16(tc.gso))
					frame = append(frame, bytes.Repeat([]byte{'X'}, tc.pad)...)
					lastSpec := pkSpec{l3: l3, proto: protoUDP, payload: []byte("the last one")}
					last := lastSpec.build()
					for _, b := range [][]byte{wireFrame(h, frame), wireFrame(VirtioNetHdr{}, last)} {
						if err := w.Write(b); err != nil {
							t.Fatal(err)
						}
					}
					testutil.WaitFor(t, "the plain datagram after the super-frame", func() bool {
						c.mu.Lock()
						defer c.mu.Unlock()
						return len(c.frames) > 0 && bytes.Equal(c.frames[len(c.frames)-1], last)
					})
					want := 0 // packets before the last
					switch {
					case tc.dropped:
					case on:
						want = 1
					default:
						want = tc.segments
					}
					c.mu.Lock()
					got := len(c.frames) - 1
					c.mu.Unlock()
					drops := d.Stats().Dropped[DropBadGSO].Load()
					if got != want || (drops == 1) != tc.dropped {
						t.Errorf("packets from the super-frame: %d, want %d; rx_drop_bad_gso %d, want dropped %v (drops: %v)", got, want, drops, tc.dropped, dropList(d.Stats()))
					}
				})
			}
		}
	}
}
