//go:build !stockgvisor

package stack

import (
	"bytes"
	"io"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/driver"
)

// The receive memory by truesize (Config.TCPRmemBytes off; the patched
// gVisor's patch 0004): each test plays the peer on the inline rig, whose
// segments gVisor processes in the delivering call, and hands each one to
// the link endpoint with the truesize and segment size the driver would
// give it.

// deliverTS delivers payload as the test's next segment, charged truesize
// and aggregating segments of gso bytes (0: one segment).
func (r *inlineRig) deliverTS(payload []byte, truesize, gso int) {
	r.s.ep.dispatch(buffer.MakeWithData(r.frame(header.TCPFlagAck|header.TCPFlagPsh, r.seq, r.ack, payload)),
		rxMeta{truesize: truesize, gsoSize: gso})
	r.seq += uint32(len(payload))
}

// gvisorTCP returns the stack's gVisor TCP counters this patch adds.
func gvisorTCP(s *Stack) map[string]uint64 {
	st := s.ip.Stats().TCP
	return map[string]uint64{
		"PruneCalled":  st.PruneCalled.Value(),
		"RcvCollapsed": st.RcvCollapsed.Value(),
		"OFOPruned":    st.OFOPruned.Value(),
		"RcvPruned":    st.RcvPruned.Value(),
		"RcvQDrop":     st.RcvQDrop.Value(),
	}
}

func wantCounters(t *testing.T, s *Stack, want map[string]uint64) {
	t.Helper()
	got := gvisorTCP(s)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
}

// readAll reads n bytes from the rig's connection.
func (r *inlineRig) readAll(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(r.c, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTruesizeScalingRatio: the connection is charged each segment's
// truesize, and its scaling ratio is set, as tcp_measure_rcv_mss sets it,
// by a segment at least as large as rcv_mss (536 at first, then the
// segment size seen, at most the advertised MSS 1460) whose size differs
// from it: payload<<8 / truesize.
func TestTruesizeScalingRatio(t *testing.T) {
	r := newInlineRigWith(t, Config{InlineTCP: true}, nil)
	ep := r.ep
	var sent []byte
	step := func(n, truesize, gso, ratio int) {
		t.Helper()
		p := bytes.Repeat([]byte{byte('a' + len(sent)%26)}, n)
		r.deliverTS(p, truesize, gso)
		sent = append(sent, p...)
		if got := ep.ScalingRatio(); got != ratio {
			t.Fatalf("after %d bytes (truesize %d, gso %d): scaling ratio %d, want %d", n, truesize, gso, got, ratio)
		}
	}
	step(100, 1000, 0, 128)    // below rcv_mss (536): the default, 50%
	step(1460, 4352, 0, 85)    // 1460<<8/4352 = 85.9; rcv_mss becomes 1460
	step(1460, 2000, 0, 85)    // the size rcv_mss has: not measured
	step(2920, 3000, 1460, 85) // an aggregate of 1460-byte segments: the same
	step(2920, 4000, 0, 186)   // 2920 > rcv_mss: 2920<<8/4000 = 186.9
	if rmem, _ := ep.ReceiveMemory(); rmem != 1000+4352+2000+3000+4000 {
		t.Errorf("receive memory %d, want the truesizes' sum %d", rmem, 1000+4352+2000+3000+4000)
	}
	if got := r.readAll(t, len(sent)); !bytes.Equal(got, sent) {
		t.Fatal("the bytes read differ from those sent")
	}
	if rmem, _ := ep.ReceiveMemory(); rmem != 0 {
		t.Errorf("receive memory %d after reading everything, want 0", rmem)
	}
}

// TestTruesizeBytes: with Config.TCPRmemBytes the same segments are
// charged gVisor's way (bytes and its structs) and the ratio stays 128.
func TestTruesizeBytes(t *testing.T) {
	r := newInlineRigWith(t, Config{InlineTCP: true, TCPRmemBytes: true}, nil)
	// The link endpoint sets no truesize: dispatch as the endpoint would.
	r.s.ep.dispatch(buffer.MakeWithData(r.frame(header.TCPFlagAck|header.TCPFlagPsh, r.seq, r.ack, bytes.Repeat([]byte{'x'}, 1460))),
		r.s.ep.rxMetaOf(fakePacket(1460), nil))
	r.seq += 1460
	if got := r.ep.ScalingRatio(); got != 128 {
		t.Errorf("scaling ratio %d, want 128", got)
	}
	if rmem, _ := r.ep.ReceiveMemory(); rmem == 0 || rmem == r.s.ep.drv.Truesize(fakePacket(1460)) {
		t.Errorf("receive memory %d: want gVisor's estimate, not 0 or the truesize", rmem)
	}
}

// TestTruesizeWindow: the window advertised is the free buffer at the
// measured ratio (tcp_win_from_space): with the ratio at 186, a 1 MiB
// buffer holding one 100-byte segment charged 1000 bytes advertises
// min((1048576-1000)*186>>8, (1048576*186>>8)-100) = 761129 bytes, scaled
// by the window scale the stack chose.
func TestTruesizeWindow(t *testing.T) {
	// MSS 1460, window scale 7 (the test's: the stack's own it announces).
	r := newInlineRigWith(t, Config{InlineTCP: true, NoModerateReceiveBuffer: true},
		[]byte{2, 4, 0x05, 0xb4, 1, 3, 3, 7})
	ws := header.ParseSynOptions(r.synAck.Options(), true).WS
	if ws <= 0 {
		t.Fatalf("SYN-ACK window scale %d", ws)
	}
	if _, rcvbuf := r.ep.ReceiveMemory(); rcvbuf != 1<<20 {
		t.Fatalf("receive buffer %d, want 1 MiB", rcvbuf)
	}
	r.deliverTS(bytes.Repeat([]byte{'a'}, 1460), 4352, 0)
	r.deliverTS(bytes.Repeat([]byte{'b'}, 2920), 4000, 0) // ratio 186
	r.readAll(t, 1460+2920)
	r.drain()
	r.deliverTS(bytes.Repeat([]byte{'c'}, 100), 1000, 0)
	var last header.TCP
	for seg := r.next(); seg != nil; seg = r.next() {
		last = seg
	}
	if last == nil || last.AckNumber() != r.seq {
		t.Fatalf("no ACK of the segment (last %v)", last)
	}
	want := min((1<<20-1000)*186>>8, (1<<20*186>>8)-100) >> ws
	if got := int(last.WindowSize()); got != want {
		t.Errorf("window %d (scaled by %d), want %d", got, ws, want)
	}
}

// TestTruesizeCollapse: with the buffer set by the application (8 KiB, so
// that auto-tuning may not grow it, tcp_clamp_window), in-order data that
// arrives with the memory past the buffer makes the queue compact
// (tcp_prune_queue, tcp_collapse): four 100-byte segments charged 2304
// bytes each (9216 > 8192) become one segment of 400 bytes, charged
// collapsedTruesize(400) = 256 + 1024, before the fifth is queued. The
// bytes read are those sent, in order.
func TestTruesizeCollapse(t *testing.T) {
	r := newInlineRigWith(t, Config{InlineTCP: true}, nil)
	r.ep.SocketOptions().SetReceiveBufferSize(8192, true)
	if _, rcvbuf := r.ep.ReceiveMemory(); rcvbuf != 8192 {
		t.Fatalf("receive buffer %d, want 8192", rcvbuf)
	}
	var sent []byte
	seg := func() {
		p := bytes.Repeat([]byte{byte('a' + len(sent)/100)}, 100)
		r.deliverTS(p, 2304, 0)
		sent = append(sent, p...)
	}
	for range 4 {
		seg()
	}
	wantCounters(t, r.s, map[string]uint64{"PruneCalled": 0, "RcvCollapsed": 0})
	if rmem, _ := r.ep.ReceiveMemory(); rmem != 4*2304 {
		t.Fatalf("receive memory %d, want %d", rmem, 4*2304)
	}
	seg()
	wantCounters(t, r.s, map[string]uint64{"PruneCalled": 1, "RcvCollapsed": 4, "RcvPruned": 0, "RcvQDrop": 0})
	if rmem, _ := r.ep.ReceiveMemory(); rmem != 1280+2304 {
		t.Errorf("receive memory %d, want %d (the collapsed segment and the fifth)", rmem, 1280+2304)
	}
	if got := r.readAll(t, len(sent)); !bytes.Equal(got, sent) {
		t.Fatalf("read %q, want %q", got, sent)
	}
}

// TestTruesizeCollapseDrop: when even the compact copy does not fit, the
// segment is dropped (tcp_prune_queue returns -1: RcvPruned, then
// TCPRcvQDrop in tcp_data_queue) and not acknowledged; what was queued
// stays, and the peer's retransmission, once the application has read,
// is taken. A ratio of 255 (a 1460-byte segment charged 1461) lets the
// window reach the whole 16 KiB buffer; 28 segments of 500 bytes charged
// 4352 each then need 14000 bytes of compact copies, three of 3776 bytes
// (4352 each) and one of 2672 (4352): 17408 > 16384.
func TestTruesizeCollapseDrop(t *testing.T) {
	r := newInlineRigWith(t, Config{InlineTCP: true}, []byte{2, 4, 0x05, 0xb4, 1, 3, 3, 0})
	r.ep.SocketOptions().SetReceiveBufferSize(16384, true)
	first := bytes.Repeat([]byte{'A'}, 1460)
	r.deliverTS(first, 1461, 0)
	if got := r.ep.ScalingRatio(); got != 255 {
		t.Fatalf("scaling ratio %d, want 255", got)
	}
	r.readAll(t, len(first))
	var sent []byte
	dropped := -1
	for i := 0; i < 28; i++ {
		p := bytes.Repeat([]byte{byte('a' + i%26)}, 500)
		before := gvisorTCP(r.s)["RcvQDrop"]
		r.deliverTS(p, 4352, 0)
		if gvisorTCP(r.s)["RcvQDrop"] != before {
			r.seq -= 500 // not taken: the peer sends it again
			dropped = i
			break
		}
		sent = append(sent, p...)
	}
	if dropped < 0 {
		t.Fatalf("no segment dropped; counters %v", gvisorTCP(r.s))
	}
	c := gvisorTCP(r.s)
	if c["RcvPruned"] != 1 || c["RcvQDrop"] != 1 || c["PruneCalled"] == 0 || c["RcvCollapsed"] == 0 {
		t.Errorf("counters %v: want RcvPruned 1, RcvQDrop 1, some collapsed", c)
	}
	t.Logf("dropped segment %d; counters %v", dropped, c)
	if got := r.readAll(t, len(sent)); !bytes.Equal(got, sent) {
		t.Fatal("the bytes read differ from those queued")
	}
	p := bytes.Repeat([]byte{'z'}, 500)
	r.deliverTS(p, 4352, 0)
	if got := r.readAll(t, len(p)); !bytes.Equal(got, p) {
		t.Fatal("the retransmission was not taken")
	}
}

// fakePacket is a received packet of n bytes in its linear part.
func fakePacket(n int) *driver.Packet {
	p := &driver.Packet{Linear: make([]byte, n)}
	p.Len = n
	return p
}

// TestTruesizeMeta: with truesizes on, a delivered packet's rxMeta
// carries the driver's truesize (a 1460-byte linear part: the sk_buff's
// 256, the 64-byte-aligned 1472 and the skb_shared_info's 320) and its GRO
// segment size, and rx_truesize_bytes sums the truesizes; with
// Config.TCPRmemBytes it carries neither.
func TestTruesizeMeta(t *testing.T) {
	r := newInlineRigWith(t, Config{InlineTCP: true}, nil)
	counter := func() (v uint64) {
		r.s.EachCounter(func(n string, c uint64) {
			if n == "rx_truesize_bytes" {
				v = c
			}
		})
		return v
	}
	before := counter() // the handshake's frames
	p := fakePacket(1460)
	p.GSOSize = 1448
	m := r.s.ep.rxMetaOf(p, nil)
	if m.truesize != 256+1472+320 || m.gsoSize != 1448 {
		t.Errorf("rxMeta truesize %d, gso %d; want %d, 1448", m.truesize, m.gsoSize, 256+1472+320)
	}
	r.s.ep.rxMetaOf(p, nil)
	if got := counter() - before; got != 2*(256+1472+320) {
		t.Errorf("rx_truesize_bytes %d, want %d", got, 2*(256+1472+320))
	}
	b := newInlineRigWith(t, Config{InlineTCP: true, TCPRmemBytes: true}, nil)
	if m := b.s.ep.rxMetaOf(p, nil); m.truesize != 0 || m.gsoSize != 0 {
		t.Errorf("TCPRmemBytes: rxMeta %+v, want no truesize", m)
	}
}
