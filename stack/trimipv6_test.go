package stack

import (
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/internal/testutil"
)

// TestTrimIPv6: a frame handed to gVisor ends where its IPv6 packet does,
// padding cut off, so that gVisor's parser, which caps the payload at the
// payload length after it took the extension headers off, reads none of
// it as TCP payload; an IPv4 frame (gVisor trims it itself), a frame
// without padding and one too short to tell are left as they are; and the
// cut allocates nothing.
func TestTrimIPv6(t *testing.T) {
	v4s, v4d := tcpip.AddrFrom4([4]byte{192, 0, 2, 2}), tcpip.AddrFrom4([4]byte{192, 0, 2, 1})
	v6s, v6d := tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 2}), tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 1})
	hbh := header.IPv6ExtHdrSerializer{&header.IPv6SerializableHopByHopExtHdr{&header.IPv6RouterAlertOption{Value: header.IPv6RouterAlertMLD}}}
	for _, tc := range []struct {
		name string
		f    testutil.Frame
		l3   bool
		cut  bool // the padding goes
	}{
		{"ipv6 hop-by-hop padded", testutil.Frame{Src: v6s, Dst: v6d, IPv6Ext: hbh, Payload: make([]byte, 48), Pad: 48}, false, true},
		{"ipv6 padded", testutil.Frame{Src: v6s, Dst: v6d, Payload: make([]byte, 10), Pad: 6}, false, true},
		{"ipv6 hop-by-hop padded tun", testutil.Frame{Src: v6s, Dst: v6d, IPv6Ext: hbh, Payload: make([]byte, 48), Pad: 48}, true, true},
		{"ipv6 unpadded", testutil.Frame{Src: v6s, Dst: v6d, IPv6Ext: hbh, Payload: make([]byte, 48)}, false, false},
		{"ipv4 padded", testutil.Frame{Src: v4s, Dst: v4d, Payload: make([]byte, 4), Pad: 20}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.f.Build()
			l2 := header.EthernetMinimumSize
			if tc.l3 {
				b, l2 = b[header.EthernetMinimumSize:], 0
			}
			want := len(b)
			if tc.cut {
				want -= tc.f.Pad
			}
			orig := buffer.MakeWithData(b)
			defer orig.Release()
			buf := orig.Clone()
			trimIPv6(&buf, l2)
			if got := int(buf.Size()); got != want {
				t.Errorf("size after trimIPv6: got %d, want %d", got, want)
			}
			buf.Release()
			clone := testing.AllocsPerRun(100, func() { c := orig.Clone(); c.Release() })
			trim := testing.AllocsPerRun(100, func() { c := orig.Clone(); trimIPv6(&c, l2); c.Release() })
			if trim != clone {
				t.Errorf("trimIPv6: got %v allocations a run, want 0 (%v with the clone, %v for the clone alone)", trim-clone, trim, clone)
			}
		})
	}
	short := buffer.MakeWithData(make([]byte, header.EthernetMinimumSize+3))
	defer short.Release()
	trimIPv6(&short, header.EthernetMinimumSize)
	if got := short.Size(); got != header.EthernetMinimumSize+3 {
		t.Errorf("a frame too short to tell: size %d after trimIPv6, want %d", got, header.EthernetMinimumSize+3)
	}
}
