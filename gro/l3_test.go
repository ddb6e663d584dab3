package gro

import (
	"bytes"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// TestL3Equivalent: an engine for a TUN's packets (Config.L3, no Ethernet
// header) merges a sequence exactly as the Ethernet engine merges the same
// frames: the same packets handed up, each with the same segments, gso_size,
// headers (IP length and checksum fixed at offset 0 instead of 14) and
// payload. TCP and UDP, IPv4 and IPv6, several flows, with segments that
// flush (PSH, a gap, IP options) between them.
func TestL3Equivalent(t *testing.T) {
	for _, l := range []layout{layoutSplit, layout256} {
		t.Run(l.String(), func(t *testing.T) {
			pool := newPool(t)
			we, w3 := newWire(t, pool), newWire(t, pool)
			defer we.close()
			defer w3.close()
			ce, c3 := &collect{}, &collect{}
			defer ce.release()
			defer c3.release()
			eth, l3 := New(Config{}, ce), New(Config{L3: true}, c3)
			bd := newBuilder()
			var segs []seg
			for i := range 40 {
				s := seg{v6: i%3 == 1, udp: i%5 == 4, sport: uint16(1000 + i%4), n: 1000}
				switch i % 11 {
				case 6:
					s.flags = header.TCPFlagPsh
				case 9:
					s.seqOff = 7 // a gap: the flow is flushed
				case 10:
					s.ipOpts = true
				}
				segs = append(segs, s)
			}
			for _, s := range segs {
				b := bd.build(s)
				eth.Receive(b.packet(we, l), 1)
				linear := -1
				if l == layout256 {
					linear = 256 - header.EthernetMinimumSize
				}
				p := w3.packet(b.frame[header.EthernetMinimumSize:], b.hlen-header.EthernetMinimumSize, linear, layoutSplit)
				l3.Receive(p, 1)
			}
			eth.Flush()
			l3.Flush()
			if len(ce.got) != len(c3.got) || len(ce.got) == 0 {
				t.Fatalf("packets handed up: Ethernet %d, L3 %d", len(ce.got), len(c3.got))
			}
			// Flows leave in bucket order at Flush (all in bucket 0
			// here, with no RSS hash); compare flow by flow, in order
			// within each, which holds whatever the buckets.
			byFlow := func(ps []*bufpool.Packet, l2 int) map[string][]*bufpool.Packet {
				m := map[string][]*bufpool.Packet{}
				for _, p := range ps {
					b := frameOf(p)[l2:]
					var k string // addresses, protocol and ports (no extension headers here)
					if b[0]>>4 == 4 {
						k = string(b[12:20]) + string(b[9:10]) + string(b[20:24])
					} else {
						k = string(b[8:40]) + string(b[6:7]) + string(b[40:44])
					}
					m[k] = append(m[k], p)
				}
				return m
			}
			fe, f3 := byFlow(ce.got, header.EthernetMinimumSize), byFlow(c3.got, 0)
			if len(fe) != len(f3) {
				t.Fatalf("flows: Ethernet %d, L3 %d", len(fe), len(f3))
			}
			merged := 0
			for k, pes := range fe {
				p3s := f3[k]
				if len(pes) != len(p3s) {
					t.Errorf("a flow: Ethernet %d packets, L3 %d", len(pes), len(p3s))
					continue
				}
				for i := range pes {
					pe, p3 := pes[i], p3s[i]
					if pe.Segs != p3.Segs || pe.GSOSize != p3.GSOSize {
						t.Errorf("packet %d of a flow: Ethernet %d segments of %d, L3 %d of %d", i, pe.Segs, pe.GSOSize, p3.Segs, p3.GSOSize)
					}
					if pe.Segs > 1 {
						merged++
					}
					if !bytes.Equal(frameOf(pe)[header.EthernetMinimumSize:], frameOf(p3)) {
						t.Errorf("packet %d of a flow: the L3 packet's bytes differ from the Ethernet packet's after its Ethernet header", i)
					}
					if !bytes.Equal(payloadOf(pe), payloadOf(p3)) {
						t.Errorf("packet %d of a flow: payloads differ", i)
					}
				}
			}
			if merged == 0 {
				t.Errorf("no packet merged: the sequence tests nothing")
			}
			es, ls := eth.Stats(), l3.Stats()
			if es.Packets.Load() != ls.Packets.Load() || es.Bytes.Load() != ls.Bytes.Load()+uint64(header.EthernetMinimumSize)*es.SKBs.Load() {
				t.Errorf("stats: Ethernet %d packets %d bytes, L3 %d packets %d bytes", es.Packets.Load(), es.Bytes.Load(), ls.Packets.Load(), ls.Bytes.Load())
			}
		})
	}
}
