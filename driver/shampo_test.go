package driver

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/internal/testutil"
)

// sessionsOf sends super-frames through a driver with hardware GRO and
// returns what the handler got.
func hwGRORun(t *testing.T, mode HWGROMode, frames ...[]byte) (*collector, *Driver) {
	t.Helper()
	c := &collector{keep: true}
	// A long session timer: the sessions depend on the frames, not on how
	// fast the test machine writes them.
	d, w := newTestDriver(t, Config{HWGRO: mode, HWGROTimeout: time.Second}, c)
	for _, f := range frames {
		if err := w.Write(f); err != nil {
			t.Fatal(err)
		}
	}
	return c, d
}

// payloadOf returns a delivered packet's TCP payload and its parse.
func payloadOf(t *testing.T, b []byte) ([]byte, FrameInfo) {
	t.Helper()
	var fi FrameInfo
	if drop := ParseFrame(b, &fi); drop != DropNone {
		t.Fatalf("delivered packet does not parse: %v", drop)
	}
	return b[fi.HeaderLen() : fi.L2Len+fi.IPLen], fi
}

func TestHWGROSession(t *testing.T) {
	const payload = 60000
	for _, mode := range []HWGROMode{HWGROOn, HWGROCoalesce} {
		t.Run(mode.String(), func(t *testing.T) {
			h, frame, fi := tcpSuper(t, L3IPv4, payload)
			c, d := hwGRORun(t, mode, wireFrame(h, frame))
			// mlx5e_hw_gro_skb_has_enough_space: with hw-gro on, a
			// packet ends once PAGE_SIZE * nr_frags + the next payload
			// would pass 64 KB: at 16 or 17 frags (a payload crossing a
			// page takes two), so the 60000 bytes take 4 packets.
			// Coalesced, 60000 bytes are 15 page-sized frags: one.
			wantPkts := 1
			if mode == HWGROOn {
				wantPkts = 4
			}
			c.waitFor(t, int64(wantPkts))
			c.mu.Lock()
			defer c.mu.Unlock()
			if len(c.frames) != wantPkts {
				t.Fatalf("packets: got %d, want %d", len(c.frames), wantPkts)
			}
			var got []byte
			for i, f := range c.frames {
				p, _ := payloadOf(t, f)
				got = append(got, p...)
				if i < len(c.frames)-1 && mode == HWGROOn && (c.nfrags[i] < 16 || c.nfrags[i] > 17) {
					t.Errorf("packet %d: got %d frags, want 16 or 17 (has_enough_space ends it)", i, c.nfrags[i])
				}
			}
			if !bytes.Equal(got, frame[fi.HeaderLen():]) {
				t.Errorf("session payload differs from what was sent (%d vs %d bytes)", len(got), payload)
			}
			_, pfi := payloadOf(t, c.frames[0])
			if pfi.HeaderLen() != c.linears[0] {
				t.Errorf("linear part: got %d bytes, want exactly the headers (%d)", c.linears[0], pfi.HeaderLen())
			}
			tcp := header.TCP(c.frames[len(c.frames)-1][pfi.L2Len+pfi.L3Len:])
			if tcp.Flags()&header.TCPFlagPsh == 0 {
				t.Errorf("merged TCP flags %v: want PSH from the last segment", tcp.Flags())
			}
			var frags, mappable, total uint64
			d.EachHWGRO(func(name string, v uint64) {
				switch name {
				case "rx_gro_hw_frags":
					frags = v
				case "rx_gro_hw_mappable_bytes":
					mappable = v
				case "rx_gro_hw_payload_bytes":
					total = v
				}
			})
			segs := uint64((payload + mss4 - 1) / mss4)
			switch mode {
			case HWGROOn:
				if frags < segs {
					t.Errorf("frags with hw-gro on: got %d, want one per payload (>= %d)", frags, segs)
				}
				if mappable != 0 {
					t.Errorf("mappable bytes with hw-gro on: got %d, want 0", mappable)
				}
			case HWGROCoalesce:
				if max := uint64(payload/4096 + 2); frags > max {
					t.Errorf("frags with coalesce: got %d, want <= %d (page-sized)", frags, max)
				}
				if share := float64(mappable) / float64(total); share < 0.8 {
					t.Errorf("mappable share with coalesce: got %.2f, want >= 0.8", share)
				}
			}
		})
	}
}

// TestHWGROSessionBreaks checks the match criteria: another flow, a gap in
// the sequence, or a non-TCP frame end a session; each flow's bytes arrive
// intact.
func TestHWGROSessionBreaks(t *testing.T) {
	mk := func(sport uint16, seq uint32, n int, flags header.TCPFlags) []byte {
		// The IP ID goes up by one per segment, as a sender's does.
		spec := pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: flags, seq: seq, ack: 1, payload: pkPayload(n), csum: pkCsumPartial, ipID: uint16(seq / 1000)}
		f := spec.build()
		// The partial checksum leaves the ports out: changing one is fine.
		header.TCP(f[14+20:]).SetSourcePort(sport)
		return wireFrame(VirtioNetHdr{Flags: VirtioNetHdrFNeedsCsum, CsumStart: 14 + 20, CsumOffset: header.TCPChecksumOffset}, f)
	}
	ack := header.TCPFlagAck
	frames := [][]byte{
		mk(1000, 1, 1000, ack), mk(1000, 1001, 1000, ack), // one session
		mk(2000, 1, 1000, ack),                      // another flow
		mk(1000, 2001, 1000, ack),                   // back: new session
		mk(1000, 5001, 1000, ack),                   // gap: new session
		mk(1000, 6001, 1000, ack|header.TCPFlagPsh), // continues, PSH ends it
		mk(1000, 7001, 1000, ack),                   // new session
	}
	c, d := hwGRORun(t, HWGROCoalesce, frames...)
	// The NIC's decisions are exact: five sessions start. The poll loop
	// also hands a session up at the end of each poll, so a session may
	// arrive in more than one packet, never fewer.
	deadline := time.Now().Add(5 * time.Second)
	var starts uint64
	for time.Now().Before(deadline) {
		var total int
		c.mu.Lock()
		for _, f := range c.frames {
			p, _ := payloadOf(t, f)
			total += len(p)
		}
		c.mu.Unlock()
		if total == 7000 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	var hdrEntries, hdrBytes uint64
	d.EachHWGRO(func(name string, v uint64) {
		switch name {
		case "rx_gro_hw_session_starts":
			starts = v
		case "rx_gro_hw_hdr_entries":
			hdrEntries = v
		case "rx_gro_hw_hdr_bytes":
			hdrBytes = v
		}
	})
	if hdrEntries != 7 || hdrBytes != 7*66 {
		t.Errorf("header buffer: %d entries, %d bytes; want 7 and 7*66 (Ethernet, IPv4, TCP with timestamps per frame)", hdrEntries, hdrBytes)
	}
	if starts != 5 {
		t.Errorf("sessions started: got %d, want 5 (flow change, flow back, gap, after PSH, and the first)", starts)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.frames) < 5 || len(c.frames) > 7 {
		t.Fatalf("packets: got %d, want 5..7", len(c.frames))
	}
	var total int
	for i, f := range c.frames {
		got, _ := payloadOf(t, f)
		if len(got)%1000 != 0 || len(got) == 0 {
			t.Errorf("packet %d payload: got %d bytes, want whole 1000-byte segments", i, len(got))
		}
		if !bytes.Equal(got, bytes.Repeat(pkPayload(1000), len(got)/1000)) {
			t.Errorf("packet %d payload bytes differ from the segments sent", i)
		}
		total += len(got)
	}
	if total != 7000 {
		t.Errorf("payload delivered: got %d, want 7000", total)
	}
}

// TestHWGROManySessions pushes more frames than the ring has header
// entries and reservations, and checks every byte and every frag: never
// beyond its page.
func TestHWGROManySessions(t *testing.T) {
	c := &collector{keep: true}
	d, w := newTestDriver(t, Config{HWGRO: HWGROCoalesce, RingSize: 64, Budget: 16}, c)
	var want []byte
	var got []byte
	seq := uint32(1)
	for i := 0; i < 40; i++ {
		spec := pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck, seq: seq, ack: 1, payload: pkPayload(20000 + i*7)}
		h, frame, fi := pkSuperFrame(t, spec, VirtioNetHdrGSOTCPv4, mss4)
		if err := w.Write(wireFrame(h, frame)); err != nil {
			t.Fatal(err)
		}
		want = append(want, frame[fi.HeaderLen():]...)
		seq += uint32(len(frame) - fi.HeaderLen())
	}
	// Drain what has arrived until every byte is in; waiting on the
	// delivery count instead races with the collector's append.
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < len(want) {
		c.mu.Lock()
		for _, f := range c.frames {
			p, _ := payloadOf(t, f)
			got = append(got, p...)
		}
		c.frames = c.frames[:0]
		c.mu.Unlock()
		if len(got) >= len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("payload delivered: got %d bytes, want %d", len(got), len(want))
		}
		time.Sleep(time.Millisecond)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("bytes through %d sessions differ from what was sent", c.n.Load())
	}
	var used uint64
	d.EachHWGRO(func(name string, v uint64) {
		if name == "rx_gro_hw_packets" {
			used = v
		}
	})
	if used <= 64 {
		t.Errorf("hardware GRO frames: got %d, want more than the 64 header entries (wrap-around)", used)
	}
}

// TestHWGROMixedSlots interleaves hardware GRO TCP frames with frames the
// hardware does not aggregate (UDP, pure ACKs) on a small ring, so that
// completion entries are reused by both kinds: a whole frame must never be
// taken for a SHAMPO payload.
func TestHWGROMixedSlots(t *testing.T) {
	c := &collector{keep: true}
	_, w := newTestDriver(t, Config{HWGRO: HWGROOn, RingSize: 16, Budget: 8, HWGROTimeout: time.Second}, c)
	udp := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(300)}
	udpFrame := udp.build()
	var wantTCP []byte
	seq := uint32(1)
	const rounds = 30
	for i := 0; i < rounds; i++ {
		spec := pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck, seq: seq, ack: 1, payload: pkPayload(5000)}
		h, frame, fi := pkSuperFrame(t, spec, VirtioNetHdrGSOTCPv4, mss4)
		for _, f := range [][]byte{wireFrame(h, frame), wireFrame(VirtioNetHdr{}, udpFrame)} {
			if err := w.Write(f); err != nil {
				t.Fatal(err)
			}
		}
		wantTCP = append(wantTCP, frame[fi.HeaderLen():]...)
		seq += 5000
		// Let the driver keep up: the in-memory wire drops when full.
		c.waitFor(t, int64(i+1))
	}
	deadline := time.Now().Add(5 * time.Second)
	var gotTCP []byte
	udps := 0
	for time.Now().Before(deadline) && (udps < rounds || len(gotTCP) < len(wantTCP)) {
		c.mu.Lock()
		frames := c.frames
		c.frames = nil
		c.mu.Unlock()
		for _, f := range frames {
			p, fi := payloadOf(t, f)
			if fi.L4 == L4UDP {
				if !bytes.Equal(f[:len(udpFrame)], udpFrame) {
					t.Fatalf("UDP frame %d changed on its way", udps)
				}
				udps++
				continue
			}
			gotTCP = append(gotTCP, p...)
		}
		time.Sleep(time.Millisecond)
	}
	if udps != rounds {
		t.Errorf("UDP frames: got %d, want %d", udps, rounds)
	}
	if !bytes.Equal(gotTCP, wantTCP) {
		t.Errorf("TCP payload: got %d bytes, want %d, or the bytes differ", len(gotTCP), len(wantTCP))
	}
}

// TestHWGROSessionIPLength: a session ends before its packet's IP length
// would pass 65535, even when the reservation has room: a 64 KB
// reservation filled exactly would wrap the 16-bit length and lose the
// payload (gVisor trims a packet to its IP length).
func TestHWGROSessionIPLength(t *testing.T) {
	for _, mode := range []HWGROMode{HWGROOn, HWGROCoalesce} {
		c := &collector{keep: true}
		_, w := newTestDriver(t, Config{HWGRO: mode, HWGROTimeout: time.Hour}, c)
		// 46 segments of 1420 bytes, then one of 216: exactly 64 KB.
		const mss = 1420
		var want []byte
		seq := uint32(1)
		for _, n := range []int{46 * mss, 216} {
			spec := pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck, seq: seq, ack: 1, payload: pkPayload(n)}
			h, frame, fi := pkSuperFrame(t, spec, VirtioNetHdrGSOTCPv4, mss)
			if n <= mss {
				h.GSOType, h.GSOSize = VirtioNetHdrGSONone, 0
			}
			if err := w.Write(wireFrame(h, frame)); err != nil {
				t.Fatal(err)
			}
			want = append(want, frame[fi.HeaderLen():]...)
			seq += uint32(n)
		}
		var got []byte
		deadline := time.Now().Add(10 * time.Second)
		for len(got) < len(want) {
			c.mu.Lock()
			for _, f := range c.frames {
				ipLen := int(binary.BigEndian.Uint16(f[14+2:]))
				if ipLen != len(f)-14 {
					t.Fatalf("%v: packet of %d bytes says IP length %d", mode, len(f), ipLen)
				}
				p, _ := payloadOf(t, f)
				got = append(got, p...)
			}
			c.frames = c.frames[:0]
			c.mu.Unlock()
			if time.Now().After(deadline) {
				t.Fatalf("%v: payload delivered: got %d bytes, want %d", mode, len(got), len(want))
			}
			time.Sleep(time.Millisecond)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%v: payload differs from what was sent", mode)
		}
	}
}

// hwCounters returns d's hardware GRO counters by name.
func hwCounters(d *Driver) map[string]uint64 {
	m := make(map[string]uint64)
	d.EachHWGRO(func(name string, v uint64) { m[name] = v })
	return m
}

// TestHWGROSessionEnds: why sessions end is counted. A PSH frame joins its
// session and its CQE carries the flush bit (cqe->shampo.flush): the
// driver hands the packet up with it (rx_gro_hw_flush_cqe) and the NIC
// counts the flag end (rx_gro_hw_end_flags); a frame that would continue a
// session after the timer starts a new one (rx_gro_hw_end_timeout). Every
// session packet has exactly one reason to go up.
func TestHWGROSessionEnds(t *testing.T) {
	mk := func(seq uint32, flags header.TCPFlags) []byte {
		spec := pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: flags, seq: seq, ack: 1, payload: pkPayload(1000), csum: pkCsumPartial, ipID: uint16(seq / 1000)}
		return wireFrame(VirtioNetHdr{Flags: VirtioNetHdrFNeedsCsum, CsumStart: 14 + 20, CsumOffset: header.TCPChecksumOffset}, spec.build())
	}
	ack, psh := header.TCPFlagAck, header.TCPFlagAck|header.TCPFlagPsh
	for _, tc := range []struct {
		name                       string
		timeout                    time.Duration
		frames                     [][]byte
		starts, endFlags, endTimer uint64
		flushCQE                   uint64
	}{
		{"psh", time.Second, [][]byte{mk(1, ack), mk(1001, psh), mk(2001, ack), mk(3001, psh)}, 2, 2, 0, 2},
		// Each read is its own arrival time: with a 1 ns timer every
		// frame after the first comes too late for its session.
		{"timer", time.Nanosecond, [][]byte{mk(1, ack), mk(1001, ack), mk(2001, ack)}, 3, 0, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{keep: true}
			d, w := newTestDriver(t, Config{HWGRO: HWGROOn, HWGROTimeout: tc.timeout}, c)
			for _, f := range tc.frames {
				if err := w.Write(f); err != nil {
					t.Fatal(err)
				}
			}
			testutil.WaitFor(t, "every payload delivered", func() bool { return c.bytes.Load() == int64(1000*len(tc.frames)) })
			m := hwCounters(d)
			if m["rx_gro_hw_session_starts"] != tc.starts || m["rx_gro_hw_end_flags"] != tc.endFlags || m["rx_gro_hw_end_timeout"] != tc.endTimer || m["rx_gro_hw_flush_cqe"] != tc.flushCQE {
				t.Errorf("starts %d, end_flags %d, end_timeout %d, flush_cqe %d: want %d, %d, %d, %d",
					m["rx_gro_hw_session_starts"], m["rx_gro_hw_end_flags"], m["rx_gro_hw_end_timeout"], m["rx_gro_hw_flush_cqe"],
					tc.starts, tc.endFlags, tc.endTimer, tc.flushCQE)
			}
			if sum := m["rx_gro_hw_flush_cqe"] + m["rx_gro_hw_flush_mismatch"] + m["rx_gro_hw_flush_space"] + m["rx_gro_hw_flush_poll"]; sum != m["rx_gro_hw_sessions"] {
				t.Errorf("flush reasons sum to %d, sessions %d: want one reason per session packet", sum, m["rx_gro_hw_sessions"])
			}
		})
	}
}
