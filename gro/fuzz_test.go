package gro

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Fuzz program: the first byte configures the engine; then each op byte
// (op%8) picks an action and reads its arguments from the next bytes.
const (
	opSegMin   = 0 // 0..4: a segment of real flow (op>>3)%len(fuzzFlows)
	opSegMax   = 4
	opEndBatch = 5 // EndBatch, then the clock moves on by arg/8 ms
	opGarbage  = 6 // a garbage frame: raw bytes, or a real frame with one header byte changed
	opOlder    = 7 // FlushOlderThan(arg*100 us)

	fuzzMaxOps = 400
)

// fuzzFlows are the real flows: a stream each, named by its source MAC.
var fuzzFlows = []struct {
	v6, udp bool
	sport   uint16
	mss     int
}{
	{false, false, 1000, 1448},
	{true, false, 1000, 1428},
	{false, true, 2000, 1000},
	{true, true, 2000, 64},
	{false, false, 1001, 536},
	{false, true, 1000, 1472}, // same ports as flow 0, other protocol
}

var (
	fuzzPoolOnce sync.Once
	fuzzPool     *bufpool.Pool
)

// fuzzReader hands out the fuzz input a byte at a time; zeros when spent.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) next() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) take(n int) []byte {
	n = min(n, len(r.b))
	b := r.b[:n]
	r.b = r.b[n:]
	return b
}

// fuzzSink checks every packet the engine hands up against what went in:
// real streams (by source MAC) must see their payload bytes exactly once,
// in order; garbage frames must come out exactly once, unchanged.
type fuzzSink struct {
	t       *testing.T
	got     map[byte][]byte // real stream -> payload bytes handed up
	segs    map[byte]int    // real stream -> frames handed up
	garbage map[uint32][]byte
	// garbageSegs is the most segments a garbage frame may come out
	// counted as: 1, or, when the test gave it a GSOSize, as many as its
	// bytes make at that size (dev_gro_receive counts a GSO packet's
	// gso_segs even when it merges with nothing).
	garbageSegs map[uint32]int
	short       [][]byte // garbage frames too short to carry a tag, in order
}

// garbageTag marks a garbage frame's source MAC: fe fe <id, 4 bytes>.
const garbageTag = 0xfe

func (s *fuzzSink) Deliver(p *bufpool.Packet) {
	defer p.Release()
	head := frameOf(p)
	if len(head) < 12 {
		if len(s.short) == 0 || !bytes.Equal(s.short[0], head) || p.Next != nil {
			s.t.Errorf("short garbage frame: got %x, not the next one in", head)
			return
		}
		s.short = s.short[1:]
		return
	}
	if head[6] == garbageTag && head[7] == garbageTag {
		id := binary.BigEndian.Uint32(head[8:])
		want, ok := s.garbage[id]
		if !ok || !bytes.Equal(want, head) || p.Next != nil || int(p.Segs) > max(1, s.garbageSegs[id]) {
			s.t.Errorf("garbage frame %d: got %x (Segs %d), want %x once, unchanged", id, head, p.Segs, want)
			return
		}
		delete(s.garbage, id)
		delete(s.garbageSegs, id)
		return
	}
	mac := head[11]
	pl := payloadOf(p)
	s.got[mac] = append(s.got[mac], pl...)
	s.segs[mac] += int(max(p.Segs, 1))
	if p.Segs > 1 {
		if err := checkHeaders(p, len(pl)); err != nil {
			s.t.Errorf("stream %d: merged packet of %d segments: %v", mac, p.Segs, err)
		}
	}
}

// checkHeaders checks a merged packet's length fields against its payload.
func checkHeaders(p *bufpool.Packet, payload int) error {
	l := p.Linear
	chain := 0
	for q := p.Next; q != nil; q = q.Next {
		chain += q.HdrLen
	}
	if got, want := p.TotalLen()-chain, p.HdrLen+payload; got != want {
		return fmt.Errorf("TotalLen minus chained headers: got %d, want %d", got, want)
	}
	var l4 int
	switch header.Ethernet(l).Type() {
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(l[header.EthernetMinimumSize:])
		if got, want := int(ip.TotalLength()), p.HdrLen-header.EthernetMinimumSize+payload; got != want {
			return fmt.Errorf("IPv4 total length: got %d, want %d", got, want)
		}
		if !ip.IsChecksumValid() {
			return fmt.Errorf("IPv4 header checksum invalid")
		}
		l4 = header.EthernetMinimumSize + ipv4HdrLen
	case header.IPv6ProtocolNumber:
		ip := header.IPv6(l[header.EthernetMinimumSize:])
		if got, want := int(ip.PayloadLength()), p.HdrLen-header.EthernetMinimumSize-ipv6HdrLen+payload; got != want {
			return fmt.Errorf("IPv6 payload length: got %d, want %d", got, want)
		}
		l4 = header.EthernetMinimumSize + ipv6HdrLen
	default:
		return fmt.Errorf("merged packet of EtherType %#x", binary.BigEndian.Uint16(l[12:]))
	}
	if p.HdrLen-l4 == udpHdrLen {
		if got, want := int(header.UDP(l[l4:]).Length()), udpHdrLen+payload; got != want {
			return fmt.Errorf("UDP length: got %d, want %d", got, want)
		}
	}
	if p.GSOSize == 0 || int(p.GSOSize)*(int(p.Segs)-1) >= payload || payload > int(p.GSOSize)*int(p.Segs) {
		return fmt.Errorf("GSOSize %d, Segs %d: do not fit %d payload bytes", p.GSOSize, p.Segs, payload)
	}
	return nil
}

// FuzzGRO feeds the engine random sequences of real and garbage frames and
// checks that nothing panics, that every payload byte of each stream comes
// out exactly once and in order, that garbage comes out unchanged, and that
// every page goes back to the pool.
func FuzzGRO(f *testing.F) {
	for _, seed := range fuzzSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzPoolOnce.Do(func() {
			fuzzPool, _ = bufpool.New(bufpool.Config{Poison: true})
		})
		runFuzz(t, fuzzPool, data)
	})
}

func runFuzz(t *testing.T, pool *bufpool.Pool, data []byte) {
	r := &fuzzReader{b: data}
	w := newWire(t, pool)
	sink := &fuzzSink{t: t, got: map[byte][]byte{}, segs: map[byte]int{}, garbage: map[uint32][]byte{}, garbageSegs: map[uint32]int{}}
	want := map[byte][]byte{}
	wantSegs := map[byte]int{}

	c0 := r.next()
	cfg := Config{}
	if c0&1 != 0 {
		cfg.FlushTimeout = time.Duration(c0>>1&7) * time.Millisecond
	}
	if m := int(c0 >> 4); m > 0 {
		cfg.MaxSize = m * 4500
	}
	e := New(cfg, sink)
	bd := newBuilder()
	var now int64
	var garbageID uint32
	defLayout := layout(c0>>1) % numLayouts

	receive := func(p *bufpool.Packet) {
		if p.Next != nil {
			t.Fatalf("test packet with a chain")
		}
		e.Receive(p, now)
		now += 100
	}

	for ops := 0; len(r.b) > 0 && ops < fuzzMaxOps; ops++ {
		op := r.next()
		switch op % 8 {
		case opEndBatch:
			e.EndBatch(now)
			now += int64(r.next()) * int64(time.Millisecond) / 8
		case opOlder:
			e.FlushOlderThan(time.Duration(r.next())*100*time.Microsecond, now)
		case opGarbage:
			kind := r.next()
			var frame []byte
			hdrLen := int(r.next())
			if kind&1 == 0 {
				frame = bytes.Clone(r.take(int(r.next()) + int(kind>>5)*256))
			} else {
				fi := int(kind>>1) % len(fuzzFlows)
				ff := fuzzFlows[fi]
				b := bd.build(seg{v6: ff.v6, udp: ff.udp, sport: ff.sport, n: int(r.next()) * 8})
				frame = b.frame
				at := header.EthernetMinimumSize + int(r.next())%(b.hlen-header.EthernetMinimumSize)
				frame[at] ^= max(r.next(), 1)
				hdrLen = b.hlen + int(int8(kind&0xe0))/32
			}
			if len(frame) >= 12 {
				frame[6], frame[7] = garbageTag, garbageTag
				binary.BigEndian.PutUint32(frame[8:], garbageID)
				sink.garbage[garbageID] = bytes.Clone(frame)
				garbageID++
			} else {
				sink.short = append(sink.short, bytes.Clone(frame))
			}
			l := layout(kind>>3) % numLayouts
			linear := max(hdrLen, 0)
			if l == layout256 {
				linear = 256
			}
			p := w.packet(frame, max(hdrLen, 0), linear, l)
			p.CsumVerified = kind&4 != 0
			if kind&0x10 != 0 {
				p.GSOSize = uint16(hdrLen) * 4
				if gso := int(p.GSOSize); gso > 0 && len(frame) >= 12 {
					sink.garbageSegs[garbageID-1] = (len(frame) + gso - 1) / gso
				}
			}
			receive(p)
		default:
			fi := int(op>>3) % len(fuzzFlows)
			ff := fuzzFlows[fi]
			size, tw, arg := r.next(), r.next(), r.next()
			s := seg{v6: ff.v6, udp: ff.udp, sport: ff.sport, mac: byte(1 + fi)}
			switch size % 8 {
			case 0, 1, 2, 3:
				s.n = ff.mss
			case 4:
				s.n = ff.mss/2 + int(arg)
			case 5:
				s.n = ff.mss + 1 + int(arg)*32 // up to jumbo frames
			case 6:
				s.n = 0
			case 7:
				s.n = int(arg)
			}
			l := defLayout
			if tw&0x01 != 0 {
				s.flags |= header.TCPFlagPsh
			}
			if tw&0x02 != 0 {
				s.flags |= []header.TCPFlags{header.TCPFlagSyn, header.TCPFlagRst, header.TCPFlagUrg,
					header.TCPFlagCwr, header.TCPFlagEce, header.TCPFlagFin, 0, 0}[arg%8]
			}
			if tw&0x04 != 0 {
				s.seqOff = int32(int8(arg)) * 100
			}
			if tw&0x08 != 0 {
				s.ttl = 1 + arg%3
			}
			if tw&0x10 != 0 {
				l = layout(arg) % numLayouts
			}
			if tw&0x20 != 0 {
				s.unver = arg&0x80 != 0
				s.tos = arg & 0x03
			}
			if tw&0xc0 != 0 {
				// One rarer header change, chosen by size's high bits.
				switch size >> 3 {
				case 0:
					s.ipOpts = true
				case 1:
					s.frag = true
				case 2:
					s.pad = int(arg%8) + 1
				case 3:
					s.short = int(arg%8) + 1
				case 4:
					s.hdrAdj = int(arg%9) - 4
				case 5:
					s.lro = uint16(ff.mss)
				case 6:
					s.setID, s.id = true, uint16(arg)
				case 7:
					s.noDF = true
				case 8:
					s.window = uint16(arg) + 1
				case 9:
					s.ackOff = uint32(arg)
				case 10:
					s.tsval = uint32(arg) + 1
				case 11:
					s.mac = byte(1+fi) + 100 // a twin stream of the same flow
				case 12:
					s.label = uint32(arg) + 1
				case 13:
					s.csum0 = true
				case 14:
					s.badSum = true
				case 15:
					s.noOpts = true
				case 16:
					// Another flow: another stream, as streams are
					// only ordered within a flow.
					s.src, s.mac = 9, byte(1+fi)+200
				}
			}
			switch {
			case s.v6 && s.ipOpts:
				// A hop-by-hop header: another flow for the kernel's
				// GRO (ipv6_gro_receive), held beside the first.
				s.mac = byte(1+fi) + 50
			case s.v6 && s.label != 0:
				// Another flow label: the same.
				s.mac, s.label = byte(1+fi)+60, 0x54321
			case s.frag || (!s.v6 && (s.ipOpts || s.badSum)) || (s.udp && (s.csum0 || s.n == 0 || s.pad > 0 || s.short > 4)):
				// Handed up ahead of what GRO holds of the flow (IP
				// options, a fragment, a bad checksum, an empty or
				// checksum-less or padded datagram, ports beyond the
				// header copy): a stream of its own.
				s.mac = byte(1+fi) + 70
			}
			b := bd.build(s)
			p := b.packet(w, l)
			if p.HdrLen < 0 {
				p.HdrLen = 0
			}
			want[s.mac] = append(want[s.mac], payloadOf(p)...)
			wantSegs[s.mac] += int(p.Segs)
			receive(p)
		}
	}
	sink.check(t, e, want, wantSegs, w, pool)
}

// check flushes e and asserts that every stream arrived whole and in order
// (want, wantSegs: the payload and frames sent per stream), that nothing
// else and no garbage frame came up, and that w's pages all came back.
func (sink *fuzzSink) check(t *testing.T, e *Engine, want map[byte][]byte, wantSegs map[byte]int, w *wire, pool *bufpool.Pool) {
	e.Flush()
	if got := e.Held(); got != 0 {
		t.Errorf("Held after Flush: got %d, want 0", got)
	}
	for mac, wb := range want {
		if gb := sink.got[mac]; !bytes.Equal(gb, wb) {
			t.Errorf("stream %d: got %d payload bytes, want %d (or their order differs)", mac, len(gb), len(wb))
		}
		if sink.segs[mac] != wantSegs[mac] {
			t.Errorf("stream %d: got %d frames, want %d", mac, sink.segs[mac], wantSegs[mac])
		}
	}
	for mac := range sink.got {
		if _, ok := want[mac]; !ok {
			t.Errorf("stream %d: got bytes of a stream never sent", mac)
		}
	}
	if len(sink.garbage) != 0 || len(sink.short) != 0 {
		t.Errorf("garbage frames not handed up: %d, %d short", len(sink.garbage), len(sink.short))
	}
	w.close()
	if got := pool.InUse(); got != 0 {
		t.Errorf("pages in use after release: got %d, want 0", got)
	}
}

// fuzzSeeds returns programs of real traffic: TCP trains in both IP
// versions, UDP trains, interleaved flows, flag and header changes, batch
// ends and timeouts, and garbage frames cut from real ones.
func fuzzSeeds() [][]byte {
	sg := func(flow int, size, tw, arg byte) []byte { return []byte{byte(flow<<3 | opSegMin), size, tw, arg} }
	var seeds [][]byte
	// A 64 KB TCP write in 45 segments with PSH on the last, per family.
	for _, flow := range []int{0, 1} {
		p := []byte{0}
		for i := range 45 {
			tw := byte(0)
			if i == 44 {
				tw = 1
			}
			p = append(p, sg(flow, 0, tw, 0)...)
		}
		p = append(p, opEndBatch, 0)
		seeds = append(seeds, p)
	}
	// UDP trains with a short datagram ending one; a batch end; timeout.
	{
		p := []byte{1<<1 | 1}
		for range 10 {
			p = append(p, sg(2, 0, 0, 0)...)
			p = append(p, sg(3, 0, 0, 0)...)
		}
		p = append(p, sg(2, 7, 0, 10)...)
		p = append(p, opEndBatch, 40, opOlder, 1)
		seeds = append(seeds, p)
	}
	// Interleaved TCP flows with a gap, a TTL change, a CWR, and hds 256.
	{
		p := []byte{2 << 1}
		for i := range 20 {
			p = append(p, sg(i%2*4, 0, 0, 0)...)
		}
		p = append(p, sg(0, 0, 0x04, 3)...)
		p = append(p, sg(0, 0, 0x08, 1)...)
		p = append(p, sg(4, 0, 0x02, 3)...)
		p = append(p, sg(1, 0, 0x10, 2)...)
		p = append(p, sg(1, 0, 0x10, 2)...)
		p = append(p, opEndBatch, 0)
		seeds = append(seeds, p)
	}
	// Rarer header changes, one each, between regular segments.
	{
		p := []byte{0x30}
		for k := range 17 {
			p = append(p, sg(k%2, 0, 0, 0)...)
			p = append(p, sg(k%2, byte(k<<3), 0x40, byte(k))...)
			p = append(p, sg(k%2, 0, 0, 0)...)
		}
		seeds = append(seeds, p)
	}
	// Garbage: real frames with one header byte changed, and raw bytes of
	// a real TCP frame.
	{
		p := []byte{0}
		p = append(p, sg(0, 0, 0, 0)...)
		for k := range 8 {
			p = append(p, opGarbage, byte(k<<1|1), 0, 100, byte(k*5), 0x40)
		}
		bd := newBuilder()
		frame := bd.build(seg{n: 40, flags: header.TCPFlagPsh}).frame
		p = append(p, opGarbage, 0x04, 66, byte(len(frame)))
		p = append(p, frame...)
		p = append(p, sg(0, 0, 0, 0)...)
		seeds = append(seeds, p)
	}
	return seeds
}
