package driver

import (
	"bytes"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// TestHeaderPull sends frames whose headers the header copy does not cover
// (a fixed copy under the Ethernet header, the estimate of hds auto, which
// leaves IP options and IPv6 extension headers out) through the nonlinear
// RQs and checks that each packet comes up byte for byte with its headers
// (FrameInfo.HeaderLen) in the linear part, as pskb_may_pull leaves them:
// rx_hds_bytes counts the copy, rx_hds_pull_bytes what was pulled after it.
func TestHeaderPull(t *testing.T) {
	opts := header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}
	frames := []pkSpec{
		{l3: L3ARP},
		{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck, payload: pkPayload(1000)},
		{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagAck}, // headers only
		{l3: L3IPv4, proto: protoUDP, payload: pkPayload(30)},
		{l3: L3IPv4, proto: protoUDP, ipv4Opts: opts, payload: pkPayload(300)},
		{l3: L3IPv4, proto: protoICMPv4, payload: pkPayload(56)},
		{l3: L3IPv6, proto: protoTCP, tcpTS: true, ext: []uint8{protoHopByHop, protoDestOpts}, tcpFlags: header.TCPFlagAck, payload: pkPayload(1200)},
		{l3: L3IPv6, proto: protoUDP, ext: []uint8{protoHopByHop, protoFragment}, ipFlags: header.IPv4FlagMoreFragments, payload: pkPayload(512)},
	}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"striding/lro/hds-8", Config{LRO: true, HDS: 8}},
		{"striding/mtu-9000/hds-20", Config{MTU: 9000, HDS: 20}},
		{"striding/lro/hds-auto", Config{LRO: true}},
		{"cyclic/hds-1", Config{RQ: RQCyclic, HDS: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{keep: true}
			d, w := newTestDriver(t, tc.cfg, c)
			var sent [][]byte
			var wantCopy, wantPull uint64
			for _, spec := range frames {
				f := spec.build()
				var fi FrameInfo
				if drop := ParseFrame(f, &fi); drop != DropNone {
					t.Fatalf("test frame does not parse: %v", drop)
				}
				cp := min(tc.cfg.HDS, len(f))
				if tc.cfg.HDS == HDSAuto {
					cp = min(MinHeaderLen(&fi), len(f))
				}
				wantCopy += uint64(cp)
				wantPull += uint64(max(fi.HeaderLen()-cp, 0))
				if err := w.Write(wireFrame(VirtioNetHdr{Flags: VirtioNetHdrFDataValid}, f)); err != nil {
					t.Fatal(err)
				}
				sent = append(sent, f)
			}
			c.waitFor(t, int64(len(sent)))
			c.mu.Lock()
			defer c.mu.Unlock()
			for i, f := range sent {
				if !bytes.Equal(c.frames[i], f) {
					t.Errorf("packet %d differs from the frame sent:\ngot  %x\nwant %x", i, c.frames[i], f)
				}
				var fi FrameInfo
				ParseFrame(f, &fi)
				if want := max(fi.HeaderLen(), min(tc.cfg.HDS, len(f))); tc.cfg.HDS != HDSAuto && c.linears[i] != want {
					t.Errorf("packet %d linear part: got %d bytes, want %d (its headers, or the copy if longer)", i, c.linears[i], want)
				}
				if c.linears[i] < fi.HeaderLen() {
					t.Errorf("packet %d linear part: got %d bytes, want at least the %d of its headers", i, c.linears[i], fi.HeaderLen())
				}
			}
			st := d.Stats()
			// The poll loop adds its counters after it handed the batch
			// up, rx_skb_nonlinear last: wait for it.
			for end := time.Now().Add(10 * time.Second); st.SKBNonlinear.Load() < uint64(len(sent)) && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			if got := st.HDSBytes.Load(); got != wantCopy {
				t.Errorf("rx_hds_bytes: got %d, want %d (the copies)", got, wantCopy)
			}
			if got := st.HDSPull.Load(); got != wantPull {
				t.Errorf("rx_hds_pull_bytes: got %d, want %d", got, wantPull)
			}
		})
	}
}
