package driver

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// csumSink keeps each packet's bytes and CsumVerified.
type csumSink struct {
	mu       sync.Mutex
	frames   [][]byte // +checklocks:mu
	verified []bool   // +checklocks:mu
}

func (c *csumSink) Deliver(p *Packet) {
	b := make([]byte, p.TotalLen())
	b = b[:p.CopyTo(b)]
	c.mu.Lock()
	c.frames = append(c.frames, b)
	c.verified = append(c.verified, p.CsumVerified)
	c.mu.Unlock()
	p.Release()
}

func (c *csumSink) Flush(bool) time.Duration { return 0 }

func (c *csumSink) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.frames)
}

// TestBadChecksumUpAsNone: a frame whose IPv4 header, TCP or UDP checksum
// the NIC model finds bad is not dropped but handed up as CHECKSUM_NONE
// (CsumVerified false, rx_csum_none), as mlx5e_handle_csum does, for GRO
// and the stack to check again, drop and count; a good frame after it is
// verified as before.
func TestBadChecksumUpAsNone(t *testing.T) {
	build := func(s pkSpec) []byte { return s.build() }
	badTCP := build(pkSpec{l3: L3IPv4, proto: protoTCP, payload: pkPayload(200)})
	badTCP[len(badTCP)-1] ^= 0xff
	badUDP6 := build(pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(100)})
	badUDP6[len(badUDP6)-1] ^= 0xff
	badIP := build(pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(100)})
	badIP[14+8]-- // the TTL, under the header checksum
	badInner := pkTunnel(func() []byte {
		b := pkInner(L3IPv4, 100).build()
		b[len(b)-1] ^= 0xff
		return b
	}(), pkTunLocal, protoIPIP, false)
	good := build(pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(100)})
	for _, tc := range []struct {
		name   string
		tunnel bool
		frame  []byte
		handed []byte // the frame as handed up (decapsulated)
	}{
		{"tcp", false, badTCP, badTCP},
		{"udp over ipv6", false, badUDP6, badUDP6},
		{"ipv4 header", false, badIP, badIP},
		{"inner of a tunnel", true, badInner, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &csumSink{}
			cfg, goodFrame, handed := Config{}, good, tc.handed
			if tc.tunnel {
				inner := pkInner(L3IPv4, 100).build()
				cfg, goodFrame = tunnelConfig(cfg), pkTunnel(inner, pkTunLocal, protoIPIP, false)
				handed = append([]byte(nil), inner...)
				handed[len(handed)-1] ^= 0xff
			}
			d, w := newTestDriver(t, cfg, c)
			if err := w.Write(wireFrame(VirtioNetHdr{}, tc.frame)); err != nil {
				t.Fatal(err)
			}
			if err := w.Write(wireFrame(VirtioNetHdr{}, goodFrame)); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for c.count() < 2 {
				if time.Now().After(deadline) {
					t.Fatalf("got %d packets, want 2 (drops: %v)", c.count(), dropList(d.Stats()))
				}
				time.Sleep(time.Millisecond)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if !bytes.Equal(c.frames[0], handed) {
				t.Errorf("frame handed up: got %x, want %x", c.frames[0], handed)
			}
			if c.verified[0] || !c.verified[1] {
				t.Errorf("CsumVerified: got %v, want [false true]", c.verified)
			}
			st := d.Stats()
			if got := st.CsumNone.Load(); got != 1 {
				t.Errorf("rx_csum_none: got %d, want 1", got)
			}
			if got := st.CsumComplete.Load(); got != 1 {
				t.Errorf("rx_csum_complete: got %d, want 1", got)
			}
			if l := dropList(st); len(l) != 0 {
				t.Errorf("drops: got %v, want none", l)
			}
		})
	}
}
