package gro

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
)

// fuzzVXFlows are FuzzGROVXLAN's real flows, a stream each, named by its
// (outer) source MAC: TCP in VXLAN over each family, with and without an
// outer checksum, UDP in VXLAN (never merged), and plain TCP and UDP of the
// same inner ports beside them.
var fuzzVXFlows = []struct {
	vx, ov6, v6, udp, ocsum0 bool
	sport                    uint16
	mss                      int
}{
	{true, false, false, false, false, 1000, 1400},
	{true, true, true, false, false, 1000, 1360},
	{true, true, false, false, true, 1001, 1380},
	{true, false, true, false, true, 1002, 1380},
	{true, false, false, true, false, 2000, 1000}, // inner UDP
	{false, false, false, false, false, 1000, 1448},
	{false, false, false, true, false, 2000, 1000},
	{true, true, false, false, false, 1003, 536},
}

// FuzzGROVXLAN is FuzzGRO with VXLAN traffic (Config.VXLANPorts): random
// sequences of real tunnelled and plain frames, with header changes at
// either level, and garbage frames cut from them. Nothing may panic, every
// payload byte of each stream must come out exactly once and in order,
// garbage unchanged, merged packets with consistent lengths at both levels,
// and every page must go back to the pool.
func FuzzGROVXLAN(f *testing.F) {
	for _, seed := range fuzzVXSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzPoolOnce.Do(func() {
			fuzzPool, _ = bufpool.New(bufpool.Config{Poison: true})
		})
		runFuzzVX(t, fuzzPool, data)
	})
}

// vxFuzzSink is fuzzSink that also checks a merged VXLAN packet's outer
// UDP and inner IP lengths.
type vxFuzzSink struct {
	*fuzzSink
	cfg Config
}

func (s vxFuzzSink) Deliver(p *bufpool.Packet) {
	if en, ok := s.cfg.Encap(p); ok && p.Segs > 1 && en.InnerProto == protoTCP {
		if err := checkTunnelHeaders(p, en); err != nil {
			s.t.Errorf("merged VXLAN packet of %d segments: %v", p.Segs, err)
		}
	}
	s.fuzzSink.Deliver(p)
}

// checkTunnelHeaders checks the lengths of a merged VXLAN packet after its
// outer IP header (which checkHeaders checks).
func checkTunnelHeaders(p *bufpool.Packet, en Encap) error {
	l := p.Linear
	total := p.TotalLen()
	for q := p.Next; q != nil; q = q.Next {
		total -= q.HdrLen
	}
	if got, want := int(header.UDP(l[en.OuterTransport:]).Length()), total-en.OuterTransport; got != want {
		return fmt.Errorf("outer UDP length: got %d, want %d", got, want)
	}
	if en.InnerIPv6 {
		if got, want := int(header.IPv6(l[en.InnerNetwork:]).PayloadLength()), total-en.InnerNetwork-ipv6HdrLen; got != want {
			return fmt.Errorf("inner IPv6 payload length: got %d, want %d", got, want)
		}
		return nil
	}
	ip := header.IPv4(l[en.InnerNetwork:])
	if got, want := int(ip.TotalLength()), total-en.InnerNetwork; got != want || !ip.IsChecksumValid() {
		return fmt.Errorf("inner IPv4 total length: got %d, want %d; checksum valid %v", got, want, ip.IsChecksumValid())
	}
	if !p.CsumVerified {
		return fmt.Errorf("not CsumVerified")
	}
	return nil
}

// runFuzzVX runs program data and returns the engine's counters.
func runFuzzVX(t *testing.T, pool *bufpool.Pool, data []byte) *Stats {
	r := &fuzzReader{b: data}
	w := newWire(t, pool)
	fs := &fuzzSink{t: t, got: map[byte][]byte{}, segs: map[byte]int{}, garbage: map[uint32][]byte{}, garbageSegs: map[uint32]int{}}
	want := map[byte][]byte{}
	wantSegs := map[byte]int{}

	c0 := r.next()
	cfg := Config{VXLANPorts: []uint16{VXLANPort}}
	if c0&1 != 0 {
		cfg.FlushTimeout = time.Duration(c0>>1&7) * time.Millisecond
	}
	if m := int(c0 >> 4); m > 0 {
		cfg.MaxSize = m * 4500
	}
	e := New(cfg, vxFuzzSink{fs, cfg})
	bd := newBuilder()
	var now int64
	var garbageID uint32
	defLayout := layout(c0>>1) % numLayouts
	receive := func(p *bufpool.Packet) {
		e.Receive(p, now)
		now += 100
	}
	flowSeg := func(fi int) seg {
		ff := fuzzVXFlows[fi]
		return seg{vx: ff.vx, ov6: ff.ov6, v6: ff.v6, udp: ff.udp, ocsum0: ff.ocsum0, sport: ff.sport, mac: byte(1 + fi)}
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
				s := flowSeg(int(kind>>1) % len(fuzzVXFlows))
				s.n = int(r.next()) * 8
				b := bd.build(s)
				frame = b.frame
				at := header.EthernetMinimumSize + int(r.next())%(b.hlen-header.EthernetMinimumSize)
				frame[at] ^= max(r.next(), 1)
				hdrLen = b.hlen + int(int8(kind&0xe0))/32
			}
			if len(frame) >= 12 {
				frame[6], frame[7] = garbageTag, garbageTag
				binary.BigEndian.PutUint32(frame[8:], garbageID)
				fs.garbage[garbageID] = bytes.Clone(frame)
				garbageID++
			} else {
				fs.short = append(fs.short, bytes.Clone(frame))
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
					fs.garbageSegs[garbageID-1] = (len(frame) + gso - 1) / gso
				}
			}
			receive(p)
		default:
			fi := int(op>>3) % len(fuzzVXFlows)
			ff := fuzzVXFlows[fi]
			size, tw, arg := r.next(), r.next(), r.next()
			s := flowSeg(fi)
			switch size % 8 {
			case 0, 1, 2, 3:
				s.n = ff.mss
			case 4:
				s.n = ff.mss/2 + int(arg)
			case 5:
				s.n = ff.mss + 1 + int(arg)*32
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
				if arg&1 == 0 {
					s.ttl = 1 + arg%3
				} else {
					s.ottl = 1 + arg%3
				}
			}
			if tw&0x10 != 0 {
				l = layout(arg) % numLayouts
			}
			if tw&0x20 != 0 {
				s.unver = arg&0x80 != 0
				s.tos = arg & 0x03
				s.otos = arg >> 2 & 0x03
			}
			if tw&0xc0 != 0 {
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
					s.mac = byte(1+fi) + 100 // a twin stream
				case 12:
					s.label = uint32(arg) + 1
				case 13:
					s.osetID, s.oid = true, uint16(arg)
				case 14:
					s.onoDF = true
				case 15:
					s.obadL4 = true
				case 16:
					s.ocsum0 = !s.ocsum0
				// Cases 17 to 21 move the segment to another flow, a
				// stream of its own (below). The value is fixed, as the
				// inner flow label's is: segments of two values would
				// be two flows in one stream, whose order the kernel
				// does not keep (a PSH segment of one goes up at once,
				// past what is held of the other), and a value that
				// happened to be the default would be the base flow.
				case 17:
					s.vni = 0x5a5a5
				case 18:
					s.oport = 40000
				case 19:
					s.olabel = 0x54321
				case 20:
					s.imac = 0x77
				case 21:
					s.vxFlags = 0x08a50000
				case 22:
					s.oipOpts = true
				case 23:
					s.ofrag = true
				case 24:
					s.obadSum = true
				case 25:
					s.badSum = true
				case 26:
					s.noOpts = true
				case 27:
					s.src, s.mac = 9, byte(1+fi)+200 // another flow
				}
			}
			if !s.vx {
				// The outer fields mean nothing to a plain frame.
				s.ottl, s.otos, s.osetID, s.onoDF, s.obadL4, s.ocsum0 = 0, 0, false, false, false, false
				s.vni, s.oport, s.olabel, s.imac, s.vxFlags, s.oipOpts, s.ofrag, s.obadSum = 0, 0, 0, 0, 0, false, false, false
			}
			if !s.ov6 {
				s.olabel = 0
			} else {
				s.oipOpts, s.ofrag, s.obadSum, s.onoDF, s.osetID = false, false, false, false, false
			}
			if s.v6 {
				s.badSum = false
			}
			base := byte(1 + fi)
			switch {
			case s.v6 && s.ipOpts:
				// Another flow for ipv6_gro_receive, held beside.
				s.mac = base + 50
			case s.v6 && s.label != 0:
				s.mac, s.label = base+60, 0x54321
			case s.frag || (!s.v6 && (s.ipOpts || s.badSum)) || (!s.vx && s.udp && (s.csum0 || s.n == 0 || s.pad > 0 || s.short > 4)),
				s.oipOpts || s.ofrag || s.obadSum,
				s.vx && s.unver && s.obadL4 && !s.ocsum0,
				s.vx && s.unver && s.pad > 0 && !s.ocsum0:
				// Handed up ahead of what GRO holds of the flow (the
				// inner or outer IP header, a bad outer checksum, an
				// unverified padded frame that udp_gro_receive does not
				// check): a stream of its own.
				s.mac = base + 70
			case s.vx && s.ocsum0 != ff.ocsum0:
				s.mac = base + 80 // another flow: the outer checksum's zeroness
			case s.vni != 0:
				s.mac = base + 90
			case s.oport != 0:
				s.mac = base + 110
			case s.olabel != 0:
				s.mac = base + 120
			case s.imac != 0:
				s.mac = base + 130
			case s.vxFlags != 0:
				s.mac = base + 140
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
	fs.check(t, e, want, wantSegs, w, pool)
	return e.Stats()
}

// TestFuzzVXSeeds: the seeds merge tunnelled segments, hand up tunnelled
// packets unmerged, and verify checksums, so that the fuzzer starts from
// programs that reach the tunnel code.
func TestFuzzVXSeeds(t *testing.T) {
	pool := newPool(t)
	var merged, passed, sw uint64
	for i, seed := range fuzzVXSeeds() {
		st := runFuzzVX(t, pool, seed)
		if i < 5 && st.TunnelPackets.Load() != 45 {
			t.Errorf("seed %d: rx_gro_tunnel_packets %d, want 45", i, st.TunnelPackets.Load())
		}
		merged += st.TunnelSKBs.Load()
		passed += st.TunnelPassthrough.Load()
		sw += st.CsumSoftware.Load()
	}
	if merged == 0 || passed == 0 || sw == 0 {
		t.Errorf("seeds: %d tunnel merges, %d tunnel passthrough, %d software checksums; want each > 0", merged, passed, sw)
	}
}

// fuzzVXSeeds returns programs of real VXLAN traffic: 64 KB writes in each
// tunnelled flow, interleaved with plain flows, outer and inner header
// changes one each, checksums to verify, and garbage cut from VXLAN frames.
func fuzzVXSeeds() [][]byte {
	sg := func(flow int, size, tw, arg byte) []byte { return []byte{byte(flow<<3 | opSegMin), size, tw, arg} }
	var seeds [][]byte
	for _, flow := range []int{0, 1, 2, 3, 7} {
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
	// Tunnelled, inner UDP and plain flows interleaved, unverified
	// checksums, a gap, outer TTL change, hds256.
	{
		p := []byte{2 << 1}
		for i := range 30 {
			p = append(p, sg(i%len(fuzzVXFlows), 0, 0, 0)...)
		}
		p = append(p, sg(0, 0, 0x20, 0x80)...)
		p = append(p, sg(1, 0, 0x20, 0x80)...)
		p = append(p, sg(0, 0, 0x04, 3)...)
		p = append(p, sg(0, 0, 0x08, 1)...)
		p = append(p, sg(3, 0, 0x10, 2)...)
		p = append(p, opEndBatch, 0)
		seeds = append(seeds, p)
	}
	// Rarer header changes, one each, between regular segments.
	{
		p := []byte{0x30}
		for k := range 28 {
			p = append(p, sg(k%4, 0, 0, 0)...)
			p = append(p, sg(k%4, byte(k<<3), 0x40, byte(k))...)
			p = append(p, sg(k%4, 0, 0, 0)...)
		}
		seeds = append(seeds, p)
	}
	// Garbage: VXLAN frames with one header byte changed.
	{
		p := []byte{0}
		p = append(p, sg(0, 0, 0, 0)...)
		for k := range 16 {
			p = append(p, opGarbage, byte(k%4<<1|1), 0, 100, byte(k*7), 0x40)
		}
		p = append(p, sg(0, 0, 0, 0)...)
		seeds = append(seeds, p)
	}
	return seeds
}
