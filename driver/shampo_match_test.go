package driver

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// hwSeg describes one TCP segment of a hardware GRO match test: one flow,
// sequence numbers in order, the IPv4 ID going up by one per segment
// unless id is set; zero values are the defaults.
type hwSeg struct {
	n        int // payload bytes (default 1000)
	flags    header.TCPFlags
	tos      uint8
	ttl      uint8 // default 64
	df       bool
	id       int // IPv4 ID + 1; 0: the segment's index
	noTS     bool
	tsval    uint32 // default 0x11223344
	ack      uint32 // default 1
	window   uint16 // 0: the builder's
	ipOpts   int    // bytes of IPv4 options (NOPs)
	label    uint32 // IPv6 flow label
	hopLimit uint8  // IPv6, default 64
}

// build encodes segment i at seq as a wire read: a single frame with a
// partial TCP checksum, as a TSO sender's segments reach the NIC model.
func (g hwSeg) build(t *testing.T, v6 bool, i int, seq uint32) []byte {
	t.Helper()
	l3 := L3IPv4
	if v6 {
		l3 = L3IPv6
	}
	if g.n == 0 {
		g.n = 1000
	}
	if g.flags == 0 {
		g.flags = header.TCPFlagAck
	}
	spec := pkSpec{l3: l3, proto: protoTCP, tcpTS: !g.noTS, tcpFlags: g.flags, seq: seq, ack: 1, payload: pkPayload(g.n), csum: pkCsumPartial}
	if g.ack != 0 {
		spec.ack = g.ack
	}
	spec.ipID = uint16(i)
	if g.id != 0 {
		spec.ipID = uint16(g.id - 1)
	}
	if g.df {
		spec.ipFlags = header.IPv4FlagDontFragment
	}
	for range g.ipOpts {
		spec.ipv4Opts = append(spec.ipv4Opts, &header.IPv4SerializableNOPOption{})
	}
	f := spec.build()
	var fi FrameInfo
	if d := ParseFrame(f, &fi); d != DropNone {
		t.Fatalf("segment %d does not parse: %v", i, d)
	}
	if v6 {
		ip := header.IPv6(f[14:])
		ip.SetTOS(g.tos, g.label)
		if g.hopLimit != 0 {
			ip.SetHopLimit(g.hopLimit)
		}
	} else {
		ip := header.IPv4(f[14:])
		ip.SetTOS(g.tos, 0)
		if g.ttl != 0 {
			ip.SetTTL(g.ttl)
		}
		pkFixIPv4Csum(f)
	}
	tcp := header.TCP(f[fi.L2Len+fi.L3Len:])
	if g.window != 0 {
		tcp.SetWindowSize(g.window)
	}
	if !g.noTS && g.tsval != 0 {
		binary.BigEndian.PutUint32(tcp[24:], g.tsval)
	}
	return wireFrame(VirtioNetHdr{Flags: VirtioNetHdrFNeedsCsum, CsumStart: uint16(fi.L2Len + fi.L3Len), CsumOffset: header.TCPChecksumOffset}, f)
}

// hwView is what a test reads back from a frame or a delivered packet.
type hwView struct {
	seq          uint32
	payload      []byte
	flags        header.TCPFlags
	tos, ttl     uint8
	label        uint32
	ack          uint32
	window       uint16
	opts         string
	ipLen, frLen int
}

func viewOf(t *testing.T, b []byte) hwView {
	t.Helper()
	var fi FrameInfo
	if d := ParseFrame(b, &fi); d != DropNone {
		t.Fatalf("frame does not parse: %v", d)
	}
	var v hwView
	if fi.L3 == L3IPv6 {
		ip := header.IPv6(b[14:])
		v.tos, v.label = ip.TOS()
		v.ttl = ip.HopLimit()
		v.ipLen = int(ip.PayloadLength()) + 40
	} else {
		ip := header.IPv4(b[14:])
		v.tos, _ = ip.TOS()
		v.ttl = ip.TTL()
		v.ipLen = int(ip.TotalLength())
	}
	tcp := header.TCP(b[fi.L2Len+fi.L3Len:])
	v.seq, v.ack, v.flags, v.window = tcp.SequenceNumber(), tcp.AckNumber(), tcp.Flags(), tcp.WindowSize()
	v.opts = string(tcp[20:tcp.DataOffset()])
	v.payload = b[fi.HeaderLen() : fi.L2Len+fi.IPLen]
	v.frLen = len(b) - 14
	return v
}

// TestHWGROMatchRules: hardware GRO merges a segment into a session only
// where the kernel's software GRO would (tcp_gro_receive, inet_gro_flush,
// ipv6_gro_flush; gro.mergeTCP): the number of sessions started is exact,
// and every packet delivered describes each segment merged into it by its
// headers: TOS/traffic class (ECN CE included), TTL/hop limit, ACK,
// window, options (timestamps) those of each segment, PSH and FIN if any
// segment had them, CWR only on the first, and an IP length that is the
// packet's (never wrapped).
func TestHWGROMatchRules(t *testing.T) {
	rep := func(n int, g hwSeg) []hwSeg {
		s := make([]hwSeg, n)
		for i := range s {
			s[i] = g
		}
		return s
	}
	ce := uint8(0x03) // ECN CE (RFC 3168 section 5)
	ipLenSegs := append([]hwSeg{{n: 1400, ipOpts: 40}}, rep(45, hwSeg{n: 1400})...)
	ipLenSegs = append(ipLenSegs, hwSeg{n: 65535 - 52 - 1400 - 45*1400})
	for _, tc := range []struct {
		name   string
		v6     bool
		segs   []hwSeg
		starts uint64
	}{
		{name: "same headers", segs: rep(3, hwSeg{}), starts: 1},
		{name: "tos differs", segs: []hwSeg{{}, {tos: 0x10}, {}}, starts: 3},
		{name: "ecn ce", segs: []hwSeg{{}, {tos: ce}, {tos: ce}, {}}, starts: 3},
		{name: "ttl differs", segs: []hwSeg{{}, {ttl: 63}, {}}, starts: 3},
		{name: "df differs", segs: []hwSeg{{}, {df: true}, {}}, starts: 3},
		{name: "id jumps", segs: []hwSeg{{}, {id: 10}, {id: 11}}, starts: 2},
		{name: "fixed id with df", segs: rep(3, hwSeg{df: true, id: 8}), starts: 1},
		{name: "fixed id without df", segs: rep(3, hwSeg{id: 8}), starts: 3},
		{name: "ip options", segs: rep(3, hwSeg{ipOpts: 4}), starts: 3},
		{name: "header length differs", segs: []hwSeg{{}, {noTS: true}, {}}, starts: 3},
		{name: "later timestamp", segs: []hwSeg{{}, {tsval: 0x11223345}, {tsval: 0x11223345}}, starts: 2},
		{name: "ack differs", segs: []hwSeg{{}, {ack: 2}, {ack: 2}}, starts: 2},
		{name: "window differs", segs: []hwSeg{{}, {window: 1234}, {}}, starts: 3},
		{name: "ece differs", segs: []hwSeg{{}, {flags: header.TCPFlagAck | header.TCPFlagEce}, {}}, starts: 3},
		{name: "cwr starts a packet", segs: []hwSeg{{}, {flags: header.TCPFlagAck | header.TCPFlagCwr}, {}, {}}, starts: 2},
		{name: "psh merges and ends", segs: []hwSeg{{}, {flags: header.TCPFlagAck | header.TCPFlagPsh}, {}}, starts: 2},
		{name: "fin merges and ends", segs: []hwSeg{{}, {}, {flags: header.TCPFlagAck | header.TCPFlagFin}}, starts: 1},
		{name: "psh after ip options", segs: []hwSeg{{ipOpts: 4}, {flags: header.TCPFlagAck | header.TCPFlagPsh}}, starts: 2},
		{name: "longer than the first", segs: []hwSeg{{n: 800}, {}, {n: 900}}, starts: 2},
		{name: "shorter ends", segs: []hwSeg{{}, {n: 500}, {}}, starts: 2},
		{name: "ip length with a longer first header", segs: ipLenSegs, starts: 2},
		{name: "ipv6 same", v6: true, segs: rep(3, hwSeg{}), starts: 1},
		{name: "ipv6 traffic class differs", v6: true, segs: []hwSeg{{}, {tos: ce}, {}}, starts: 3},
		{name: "ipv6 flow label differs", v6: true, segs: []hwSeg{{}, {label: 7}, {}}, starts: 3},
		{name: "ipv6 hop limit differs", v6: true, segs: []hwSeg{{}, {hopLimit: 1}, {}}, starts: 3},
		{name: "ipv6 later timestamp", v6: true, segs: []hwSeg{{}, {tsval: 9}, {tsval: 9}}, starts: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, w := NewMemPair(1024, VirtioNetHdrLen+maxLROFrame)
			pool := testutil.NewPool(t, bufpool.Config{Poison: true, RingSize: 1 << 12})
			cfg := Config{HWGRO: HWGROOn, HWGROTimeout: time.Hour}
			copy(cfg.MAC[:], pkDstMAC)
			cfg.Pool = pool
			d, err := New(a, cfg)
			if err != nil {
				t.Fatal(err)
			}
			// The segments are queued before the driver starts, so that
			// the NIC model reads them in one go and the poll loop sees
			// whole sessions (it also hands a session up at each poll's
			// end).
			var sent []hwView
			var want []byte
			seq := uint32(1)
			for i, g := range tc.segs {
				f := g.build(t, tc.v6, i, seq)
				if err := w.Write(f); err != nil {
					t.Fatal(err)
				}
				v := viewOf(t, f[VirtioNetHdrLen:])
				sent = append(sent, v)
				want = append(want, v.payload...)
				seq += uint32(len(v.payload))
			}
			c := &collector{keep: true}
			d.Start(c)
			t.Cleanup(func() {
				closeWithin(t, d)
				w.Close()
				if n := pool.InUse(); n != 0 {
					t.Errorf("pages in use after Close: got %d, want 0", n)
				}
			})
			deadline := time.Now().Add(30 * time.Second)
			for c.bytes.Load() < int64(len(want)) {
				if time.Now().After(deadline) {
					t.Fatalf("payload delivered: %d of %d bytes", c.bytes.Load(), len(want))
				}
				time.Sleep(time.Millisecond)
			}
			var starts uint64
			d.EachHWGRO(func(name string, v uint64) {
				if name == "rx_gro_hw_session_starts" {
					starts = v
				}
			})
			if starts != tc.starts {
				t.Errorf("sessions started: got %d, want %d", starts, tc.starts)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			var got []byte
			for k, f := range c.frames {
				p := viewOf(t, f)
				got = append(got, p.payload...)
				if p.ipLen != p.frLen {
					t.Errorf("packet %d: IP length %d, want %d (the packet's)", k, p.ipLen, p.frLen)
				}
				// The segments merged into packet k.
				var in []hwView
				for _, s := range sent {
					if s.seq-p.seq < uint32(len(p.payload)) {
						in = append(in, s)
					}
				}
				if len(in) == 0 {
					t.Errorf("packet %d (seq %d, %d bytes) holds no segment sent", k, p.seq, len(p.payload))
					continue
				}
				var push header.TCPFlags
				for j, s := range in {
					if s.tos != p.tos || s.ttl != p.ttl || s.label != p.label || s.ack != p.ack || s.window != p.window || s.opts != p.opts {
						t.Errorf("packet %d: segment seq %d merged with other headers: tos %#x/%#x ttl %d/%d label %d/%d ack %d/%d window %d/%d options %x/%x (segment/packet)",
							k, s.seq, s.tos, p.tos, s.ttl, p.ttl, s.label, p.label, s.ack, p.ack, s.window, p.window, s.opts, p.opts)
					}
					if j > 0 && s.flags&header.TCPFlagCwr != 0 {
						t.Errorf("packet %d: segment seq %d with CWR merged behind another", k, s.seq)
					}
					if s.flags&^(header.TCPFlagPsh|header.TCPFlagFin|header.TCPFlagCwr) != p.flags&^(header.TCPFlagPsh|header.TCPFlagFin|header.TCPFlagCwr) {
						t.Errorf("packet %d: segment seq %d flags %v merged under flags %v", k, s.seq, s.flags, p.flags)
					}
					push |= s.flags & (header.TCPFlagPsh | header.TCPFlagFin)
				}
				if p.flags&(header.TCPFlagPsh|header.TCPFlagFin) != push {
					t.Errorf("packet %d: PSH/FIN %v, want %v (those of its segments)", k, p.flags&(header.TCPFlagPsh|header.TCPFlagFin), push)
				}
				if p.flags&header.TCPFlagCwr != in[0].flags&header.TCPFlagCwr {
					t.Errorf("packet %d: CWR %v, want the first segment's (%v)", k, p.flags&header.TCPFlagCwr, in[0].flags&header.TCPFlagCwr)
				}
			}
			if !bytes.Equal(got, want) {
				t.Errorf("payload delivered: %d bytes, want %d, or they differ", len(got), len(want))
			}
		})
	}
}
