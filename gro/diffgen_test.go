package gro

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// This file generates the random segment sequences of the differential test
// against the kernel (kernel_diff_linux_test.go) and runs them through the
// engine. It is OS-neutral so that TestDiffEngineSelf runs everywhere.

// diffSeq is one generated sequence: the segments of several flows in
// wire order (after reordering and duplication), and the MTU they were cut
// for.
type diffSeq struct {
	seed int64
	mtu  int
	segs []seg // built in this order (sequence numbers follow it)
	// order lists the built frames in wire order: indices into segs,
	// possibly repeated (duplicates) or swapped (reordering).
	order []int
}

// diffFlow is a generated flow's fixed and running state.
type diffFlow struct {
	v6, noOpts, noDF, fixedID bool
	sport                     uint16
	mss                       int
	id                        uint16
	tsval                     uint32
	ack                       uint32
	tos, ttl                  uint8
	label                     uint32
	dst6                      byte
	window                    uint16
}

// genDiffSeq generates sequence seed: 1 to 3 TCP flows over IPv4 and IPv6,
// up to maxFrames frames, with the variations the brief lists.
func genDiffSeq(seed int64, maxFrames int) diffSeq {
	r := rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
	d := diffSeq{seed: seed, mtu: 1500}
	if r.IntN(3) == 0 {
		d.mtu = 9000
	}
	flows := make([]diffFlow, 1+r.IntN(3))
	for i := range flows {
		f := &flows[i]
		f.v6 = r.IntN(2) == 0
		f.noOpts = r.IntN(4) == 0
		f.noDF = r.IntN(4) == 0
		f.fixedID = r.IntN(3) == 0
		f.sport = uint16(2000 + i)
		f.id = uint16(r.IntN(65536))
		f.tsval = uint32(1 + r.IntN(1000))
		f.ttl = 64
		f.label = 0x12345
		f.window = 4096
		if f.v6 && r.IntN(4) == 0 {
			f.dst6 = byte(1 + r.IntN(3))
		}
		hdr := header.IPv4MinimumSize + header.TCPMinimumSize
		if f.v6 {
			hdr = header.IPv6MinimumSize + header.TCPMinimumSize
			if f.dst6 != 0 {
				hdr += 8
			}
		}
		if !f.noOpts {
			hdr += 12
		}
		f.mss = d.mtu - hdr - 24 // room for IP options, a fragment header or padding
		if r.IntN(4) == 0 {
			f.mss = 1 + r.IntN(f.mss)
		}
	}
	n := 2 + r.IntN(maxFrames-1)
	for range n {
		fi := r.IntN(len(flows))
		f := &flows[fi]
		p := r.IntN(1000) // per-mille rolls
		s := seg{v6: f.v6, sport: f.sport, n: f.mss, noOpts: f.noOpts, noDF: f.noDF,
			tsval: f.tsval, ackOff: f.ack, tos: f.tos, ttl: f.ttl, label: f.label,
			dst6: f.dst6, window: f.window}
		switch {
		case p < 120:
			s.n = 1 + r.IntN(f.mss)
		case p < 170:
			s.n = 0
		}
		switch p := r.IntN(1000); {
		case p < 25:
			s.flags |= header.TCPFlagPsh
		case p < 40:
			s.flags |= header.TCPFlagUrg
		case p < 65:
			s.flags |= header.TCPFlagCwr
		case p < 90:
			s.flags |= header.TCPFlagEce
		case p < 105:
			s.flags |= header.TCPFlagFin
		case p < 115:
			s.flags |= header.TCPFlagRst
		case p < 120:
			s.flags |= header.TCPFlagSyn
		}
		// Changes that stay with the flow.
		switch p := r.IntN(1000); {
		case p < 80:
			f.tsval++
			s.tsval = f.tsval
		case p < 110:
			f.ack += 1000
			s.ackOff = f.ack
		case p < 130:
			f.window++
			s.window = f.window
		case p < 150:
			f.tos ^= 1 << uint(r.IntN(8))
			s.tos = f.tos
		case p < 170:
			f.ttl--
			s.ttl = f.ttl
		case p < 190 && f.v6:
			f.label ^= 1 << uint(r.IntN(20))
			s.label = f.label
		case p < 210 && f.v6 && f.dst6 != 0:
			f.dst6 = byte(1 + r.IntN(3))
			s.dst6 = f.dst6
		case p < 225 && !f.v6:
			f.noDF = !f.noDF
			s.noDF = f.noDF
		}
		if !f.v6 {
			s.setID = true
			s.id = f.id
			switch p := r.IntN(1000); {
			case p < 30:
				f.id += uint16(2 + r.IntN(100)) // a jump
			case p < 60:
				f.fixedID = !f.fixedID
			}
			if !f.fixedID {
				f.id++
			}
		}
		// Faults of this segment only.
		switch p := r.IntN(1000); {
		case p < 30:
			s.badL4 = true
		case p < 45 && !f.v6:
			s.badSum = true
		case p < 60:
			s.ipOpts = true
		case p < 70:
			s.frag = true
		case p < 85:
			s.pad = 1 + r.IntN(20)
		case p < 95 && !f.v6:
			s.evil = true
		case p < 110:
			s.seqOff = int32(1 + r.IntN(1000)) // a hole
		}
		if s.frag || s.ipOpts {
			s.dst6 = 0
		}
		d.segs = append(d.segs, s)
	}
	d.order = make([]int, len(d.segs))
	for i := range d.order {
		d.order[i] = i
	}
	for i := 0; i < len(d.order); i++ {
		switch p := r.IntN(1000); {
		case p < 40 && i+1 < len(d.order):
			d.order[i], d.order[i+1] = d.order[i+1], d.order[i]
			i++
		case p < 70 && len(d.order) < maxFrames:
			d.order = slices.Insert(d.order, i+1, d.order[i])
			i++
		}
	}
	return d
}

// frames builds d's frames in wire order.
func (d *diffSeq) frames() []built {
	bd := newBuilder()
	all := make([]built, len(d.segs))
	for i, s := range d.segs {
		all[i] = bd.build(s)
	}
	out := make([]built, len(d.order))
	for i, k := range d.order {
		out[i] = all[k]
	}
	return out
}

// String prints d as the minimal reproducer a failure shows.
func (d *diffSeq) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, mtu %d, %d frames:\n", d.seed, d.mtu, len(d.order))
	for i, k := range d.order {
		s := d.segs[k]
		fmt.Fprintf(&b, "  %2d: seg %2d %s\n", i, k, segString(s))
	}
	return b.String()
}

func segString(s seg) string {
	var b strings.Builder
	v := "v4"
	if s.v6 {
		v = "v6"
	}
	fmt.Fprintf(&b, "%s sport %d len %d", v, s.sport, s.n)
	if s.flags != 0 {
		fmt.Fprintf(&b, " flags %s", s.flags)
	}
	add := func(cond bool, f string, a ...any) {
		if cond {
			fmt.Fprintf(&b, " "+f, a...)
		}
	}
	add(s.setID, "id %d", s.id)
	add(s.noDF, "DF=0")
	add(s.noOpts, "no-opts")
	add(!s.noOpts, "ts %d", s.tsval)
	add(s.ackOff != 0, "ack+%d", s.ackOff)
	add(s.window != 0 && s.window != 4096, "win %d", s.window)
	add(s.tos != 0, "tos %#x", s.tos)
	add(s.ttl != 0 && s.ttl != 64, "ttl %d", s.ttl)
	add(s.label != 0 && s.label != 0x12345, "label %#x", s.label)
	add(s.dst6 != 0, "dstopts %d", s.dst6)
	add(s.badL4, "bad-l4-csum")
	add(s.badSum, "bad-ip-csum")
	add(s.ipOpts, "ip-opts")
	add(s.frag, "frag")
	add(s.pad != 0, "pad %d", s.pad)
	add(s.evil, "evil")
	add(s.seqOff != 0, "seq+%d", s.seqOff)
	return b.String()
}

// flowLens maps a flow, as the kernel's GRO tells flows apart (frameFlow),
// to the payload lengths of the packets of it that came up, in order.
type flowLens map[string][]int

func (f flowLens) String() string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %v\n", k, f[k])
	}
	return b.String()
}

// frameFlow parses an Ethernet frame of a TCP flow (IPv4 or IPv6, with
// extension headers) and returns its flow as GRO tells flows apart (source
// port, and the source MAC, IPv6 flow label and extension headers where
// they are not the test's defaults) and its payload length by the IP
// length. ok is false for anything else.
func frameFlow(f []byte) (flow string, payload int, ok bool) {
	if len(f) < header.EthernetMinimumSize {
		return "", 0, false
	}
	b := f[header.EthernetMinimumSize:]
	var l4, end int
	var extra string
	switch header.Ethernet(f).Type() {
	case header.IPv4ProtocolNumber:
		if len(b) < header.IPv4MinimumSize || b[9] != protoTCP {
			return "", 0, false
		}
		ip := header.IPv4(b)
		l4, end = int(ip.HeaderLength()), int(ip.TotalLength())
		extra = " v4"
	case header.IPv6ProtocolNumber:
		if len(b) < header.IPv6MinimumSize {
			return "", 0, false
		}
		ip := header.IPv6(b)
		end = header.IPv6MinimumSize + int(ip.PayloadLength())
		nh := ip.NextHeader()
		l4 = header.IPv6MinimumSize
		for nh != protoTCP {
			if len(b) < l4+8 {
				return "", 0, false
			}
			switch nh {
			case protoHopByHop, protoRouting, protoDestOpts:
				nh, l4 = b[l4], l4+8*(1+int(b[l4+1]))
			case protoFragment:
				nh, l4 = b[l4], l4+8
			default:
				return "", 0, false
			}
		}
		extra = fmt.Sprintf(" v6 label %#x", be32(ip)&0xfffff)
		if l4 > header.IPv6MinimumSize && l4 <= len(b) {
			extra += fmt.Sprintf(" ext %x", b[header.IPv6MinimumSize:l4])
		}
	default:
		return "", 0, false
	}
	if len(b) < l4+header.TCPMinimumSize || end > len(b) || end < l4 {
		return "", 0, false
	}
	t := header.TCP(b[l4:])
	if f[11] != 1 {
		extra += fmt.Sprintf(" mac %d", f[11])
	}
	return fmt.Sprintf("sport %d%s", t.SourcePort(), extra), end - l4 - int(t.DataOffset()), true
}

// engineLens runs frames through a fresh engine in one batch, each cut as
// the NIC model cuts a frame with header/data split, with its checksums
// not verified (CHECKSUM_NONE, as a veth hands them to the kernel's GRO),
// and returns what came up per flow.
func engineLens(w *wire, frames []built) flowLens {
	var c collect
	e := New(Config{}, &c)
	for _, b := range frames {
		p := w.packet(b.frame, b.hlen, -1, layoutSplit)
		p.CsumVerified = false
		e.Receive(p, 0)
	}
	e.EndBatch(0)
	out := flowLens{}
	buf := make([]byte, 1<<17)
	for _, p := range c.got {
		if flow, n, ok := frameFlow(buf[:p.CopyTo(buf)]); ok {
			out[flow] = append(out[flow], n)
		}
	}
	c.release()
	return out
}

// engineLensAll is engineLens for frames of one flow (TCP or UDP): the
// payload lengths of what came up, in order.
func engineLensAll(w *wire, frames []built) []int {
	var c collect
	e := New(Config{}, &c)
	for _, b := range frames {
		p := w.packet(b.frame, b.hlen, -1, layoutSplit)
		p.CsumVerified = false
		e.Receive(p, 0)
	}
	e.EndBatch(0)
	var out []int
	for _, p := range c.got {
		out = append(out, len(payloadOf(p)))
	}
	c.release()
	return out
}

// shrinkDiff returns a minimal sequence, by frames removed one at a time,
// for which differs still reports true.
func shrinkDiff(d diffSeq, differs func(diffSeq) bool) diffSeq {
	for changed := true; changed; {
		changed = false
		for i := 0; i < len(d.order) && len(d.order) > 1; i++ {
			c := d
			c.order = slices.Delete(slices.Clone(d.order), i, i+1)
			if differs(c) {
				d, changed = c, true
				i--
			}
		}
	}
	return d
}
