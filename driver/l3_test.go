package driver

import (
	"bytes"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// l3Super returns tcpSuper's super-frame without its Ethernet header, as a
// TUN device hands it up: the virtio-net header's offsets are the IP
// packet's.
func l3Super(t testing.TB, l3 L3Type, payload int) (VirtioNetHdr, []byte) {
	h, frame, _ := tcpSuper(t, l3, payload)
	h.CsumStart -= header.EthernetMinimumSize
	h.HdrLen -= header.EthernetMinimumSize
	return h, frame[header.EthernetMinimumSize:]
}

// TestL3Rx: on a TUN's wire (Config.L3) the NIC model takes frames that
// start at the IP header, for IPv4 and IPv6, cut into MTU-sized frames or
// handed up whole by LRO; every packet it delivers starts at its IP header
// (ParseL3Frame) and the payloads are the super-frame's. An Ethernet frame
// on that wire is not IP (rx_drop_bad_ip_version), and the MAC filter does
// not apply.
func TestL3Rx(t *testing.T) {
	const payload = 20000
	for _, tc := range []struct {
		name string
		l3   L3Type
		lro  bool
	}{
		{"ipv4/lro-off", L3IPv4, false},
		{"ipv4/lro-on", L3IPv4, true},
		{"ipv6/lro-off", L3IPv6, false},
		{"ipv6/lro-on", L3IPv6, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{keep: true}
			d, w := newTestDriver(t, Config{L3: true, LRO: tc.lro}, c)
			h, frame := l3Super(t, tc.l3, payload)
			if err := w.Write(wireFrame(h, frame)); err != nil {
				t.Fatal(err)
			}
			var fi FrameInfo
			if ParseL3Frame(frame, &fi) != DropNone {
				t.Fatal("the test's super-frame does not parse")
			}
			want := int64(1)
			if !tc.lro {
				mss := mss4
				if tc.l3 == L3IPv6 {
					mss = mss6
				}
				want = int64((payload + mss - 1) / mss)
			}
			c.waitFor(t, want)
			c.mu.Lock()
			var got []byte
			for i, f := range c.frames {
				var pfi FrameInfo
				if d := ParseL3Frame(f, &pfi); d != DropNone || pfi.L2Len != 0 {
					t.Fatalf("packet %d: %v, L2Len %d: want an IP packet", i, d, pfi.L2Len)
				}
				got = append(got, f[pfi.HeaderLen():pfi.IPLen]...)
			}
			c.mu.Unlock()
			if !bytes.Equal(got, frame[fi.HeaderLen():]) {
				t.Errorf("payload reassembled differs from the payload sent")
			}
			// An Ethernet frame is no IP packet here.
			eh, eth, _ := tcpSuper(t, tc.l3, 100)
			eh.GSOType, eh.GSOSize = VirtioNetHdrGSONone, 0
			if err := w.Write(wireFrame(eh, eth)); err != nil {
				t.Fatal(err)
			}
			st := d.Stats()
			for end := time.Now().Add(30 * time.Second); st.Dropped[DropBadIPVersion].Load() == 0 && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			if got := st.Dropped[DropBadIPVersion].Load(); got != 1 {
				t.Errorf("rx_drop_bad_ip_version: got %d, want 1 (the Ethernet frame)", got)
			}
			if got := st.Dropped[DropOtherHost].Load() + st.Dropped[DropMulticast].Load(); got != 0 {
				t.Errorf("MAC filter drops on a TUN's wire: %d, want 0", got)
			}
		})
	}
	if err := (&Config{L3: true, XDP: true}).setDefaults(); err != nil {
		t.Errorf("L3 with XDP: %v; want it allowed (generic XDP sees the IP header)", err)
	}
}
