package gro

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"github.com/ustack/ustack/internal/testutil"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// layout is how a test packet is cut, after the driver's header/data split
// settings.
type layout int

const (
	// layoutSplit: hds auto. Frames are written back to back into pages
	// on 64-byte strides (headers between payloads), the headers copied
	// into Linear, the payload left as frags.
	layoutSplit layout = iota
	// layoutShampo: hds auto with hardware GRO placement: payloads
	// written back to back, so consecutive payloads are adjacent.
	layoutShampo
	// layout256: hds 256. Linear holds the first 256 bytes of the frame.
	layout256
	numLayouts
)

func (l layout) String() string {
	return [...]string{"split", "shampo", "hds256"}[l]
}

// strideLen is the stride frames are aligned to in layoutSplit and layout256.
const strideLen = 64

// wire writes frames into pages of a pool and cuts them into packets, as
// the NIC model and the driver's poll loop do. It holds one reference on
// its current page until close.
type wire struct {
	t    testing.TB
	pool *bufpool.Pool
	page *bufpool.Page
	off  int
}

// newPool returns a poisoning pool whose pages testutil's TestMain checks
// came back.
func newPool(t testing.TB) *bufpool.Pool { return testutil.NewPoisonPool(t) }

func newWire(t testing.TB, pool *bufpool.Pool) *wire { return &wire{t: t, pool: pool} }

func (w *wire) newPage() {
	if w.page != nil {
		w.page.DecRef()
	}
	pg, err := w.pool.Get()
	if err != nil {
		w.t.Fatalf("pool.Get: %v", err)
	}
	w.page, w.off = pg, 0
}

// close drops the wire's reference on its current page.
func (w *wire) close() {
	if w.page != nil {
		w.page.DecRef()
		w.page = nil
	}
}

// put writes data at the wire's position, continuing on new pages as
// needed, and appends to p frags for data[from:].
func (w *wire) put(p *bufpool.Packet, data []byte, from int) {
	for pos := 0; pos < len(data); {
		if w.page == nil || w.off == len(w.page.Bytes()) {
			w.newPage()
		}
		n := min(len(data)-pos, len(w.page.Bytes())-w.off)
		copy(w.page.Bytes()[w.off:], data[pos:pos+n])
		if s := max(pos, from); s < pos+n {
			w.page.IncRef()
			p.Frags = append(p.Frags, bufpool.Frag{Page: w.page, Off: uint32(w.off + s - pos), Len: uint32(pos + n - s)})
		}
		w.off += n
		pos += n
	}
}

// packet cuts frame into a packet per l: linear bytes of it copied, the
// rest in frags. linear < 0 uses the layout's header copy (hlen or 256).
func (w *wire) packet(frame []byte, hlen, linear int, l layout) *bufpool.Packet {
	p := bufpool.NewPacket()
	if linear < 0 {
		linear = hlen
		if l == layout256 {
			linear = 256
		}
	}
	linear = min(linear, len(frame))
	p.Linear = append(p.Linear[:0], frame[:linear]...)
	if l == layoutShampo {
		w.put(p, frame[linear:], 0)
	} else {
		if w.page != nil {
			w.off = min((w.off+strideLen-1)/strideLen*strideLen, len(w.page.Bytes()))
		}
		w.put(p, frame, linear)
	}
	p.Len = len(frame)
	p.HdrLen = hlen
	p.CsumVerified = true
	return p
}

// collect is a Sink that keeps what it is handed.
type collect struct{ got []*bufpool.Packet }

func (c *collect) Deliver(p *bufpool.Packet) { c.got = append(c.got, p) }

func (c *collect) release() {
	for _, p := range c.got {
		p.Release()
	}
	c.got = nil
}

// releaser is a Sink that releases what it is handed.
type releaser struct{ n int }

func (r *releaser) Deliver(p *bufpool.Packet) { r.n++; p.Release() }

// frameOf returns the bytes of p alone (Linear, then frags; Next excluded).
func frameOf(p *bufpool.Packet) []byte {
	b := append([]byte(nil), p.Linear...)
	for _, f := range p.Frags {
		b = append(b, f.Bytes()...)
	}
	return b
}

// payloadOf returns a delivered packet's payload: its bytes after HdrLen,
// then each chained packet's bytes after its own HdrLen.
func payloadOf(p *bufpool.Packet) []byte {
	var out []byte
	for q := p; q != nil; q = q.Next {
		b := frameOf(q)
		if q.HdrLen <= len(b) {
			out = append(out, b[q.HdrLen:]...)
		}
	}
	return out
}

// seg describes a test frame. The zero value is a TCP segment with ACK, the
// timestamp option and no payload, of flow 1000 -> 80, IPv4 ID incrementing,
// DF set.
type seg struct {
	v6     bool
	udp    bool
	arp    bool
	icmp   bool
	sport  uint16 // 0: 1000
	src    byte   // last byte of the source address; 0: 1
	mac    byte   // last byte of the source MAC; 0: 1
	n      int    // payload bytes
	seqOff int32  // added to the flow's next sequence number
	ackOff uint32
	flags  header.TCPFlags // besides ACK
	window uint16          // 0: 4096
	tsval  uint32          // 0: 1
	noOpts bool            // no TCP options
	ttl    uint8           // TTL or hop limit; 0: 64
	tos    uint8           // TOS or traffic class
	id     uint16          // IPv4 ID, with setID
	setID  bool
	noDF   bool
	label  uint32 // IPv6 flow label; 0: 0x12345
	ipOpts bool   // IPv4 router alert option, or an IPv6 hop-by-hop header
	frag   bool   // IPv4 MF, or an IPv6 fragment header with M
	badSum bool   // IPv4 header checksum wrong
	evil   bool   // IPv4 reserved flag (RFC 3514)
	csum0  bool   // UDP checksum 0
	pad    int    // Ethernet padding bytes
	linear int    // header copy length override (0: the layout's)
	short  int    // header copy this many bytes shorter than the headers
	hdrAdj int    // added to HdrLen
	lro    uint16 // GSOSize of an LRO super-frame
	unver  bool   // checksums not verified
	badL4  bool   // TCP or UDP checksum wrong
	dst6   byte   // IPv6: a destination options header whose option data is this byte (0: none)

	// vx carries the frame described above (its Ethernet header's source
	// MAC then imac) in VXLAN (RFC 7348) over UDP over an outer IP header
	// (IPv6 with ov6) in an outer Ethernet frame whose source MAC is mac;
	// pad pads the outer frame. The outer fields:
	vx      bool
	ov6     bool
	plain   bool   // a rule's segment that the VXLAN runner leaves unwrapped
	imac    byte   // inner source MAC; 0: 1
	vni     uint32 // 0: 42
	oport   uint16 // outer UDP source port; 0: 50000
	dport   uint16 // outer UDP destination port; 0: VXLANPort
	vxFlags uint32 // VXLAN flags word; 0: 0x08000000 (I)
	ottl    uint8  // outer TTL or hop limit; 0: 64
	otos    uint8  // outer TOS or traffic class
	oid     uint16 // outer IPv4 ID, with osetID (else incrementing per flow)
	osetID  bool
	onoDF   bool   // outer IPv4 DF clear
	olabel  uint32 // outer IPv6 flow label; 0: 0x6789a
	ocsum0  bool   // outer UDP checksum 0
	obadL4  bool   // outer UDP checksum wrong
	obadSum bool   // outer IPv4 header checksum wrong
	oevil   bool   // outer IPv4 reserved flag
	ofrag   bool   // outer IPv4 MF
	oipOpts bool   // outer IPv4 router alert option
	hash    uint32 // an RSS hash (HashL4) the packet carries, if not 0
}

// flowID names a test flow for running sequence numbers and IDs.
type flowID struct {
	v6, udp, icmp, arp bool
	sport              uint16
	src                byte
	// A VXLAN flow's outer identity.
	vx, ov6, ocsum0 bool
	vni             uint32
	oport           uint16
	mac, imac       byte
}

type flowState struct {
	seq uint32
	id  uint16
	oid uint16 // outer IPv4 ID
}

// builder builds the frames of one test, keeping each flow's next sequence
// number and IPv4 ID.
type builder struct {
	flows map[flowID]*flowState
	n     int // frames built, for payload patterns
}

func newBuilder() *builder { return &builder{flows: make(map[flowID]*flowState)} }

// built is one built frame.
type built struct {
	frame   []byte
	hlen    int
	payload []byte
	seg     seg
	seq     uint32
	// A VXLAN frame's offsets: the outer UDP header, the inner IP header,
	// the inner L4 header.
	ol4, inner, l4 int
}

// payloadPattern fills b with bytes unique to frame k, so that misordered or
// duplicated bytes show.
func payloadPattern(b []byte, k int) {
	for j := range b {
		b[j] = byte(k*131 + j*7 + j>>8)
	}
}

func (s *seg) proto() tcpip.TransportProtocolNumber {
	switch {
	case s.icmp && s.v6:
		return header.ICMPv6ProtocolNumber
	case s.icmp:
		return header.ICMPv4ProtocolNumber
	case s.udp:
		return header.UDPProtocolNumber
	}
	return header.TCPProtocolNumber
}

func (s *seg) addrs() (src, dst tcpip.Address) {
	sb := s.src
	if sb == 0 {
		sb = 1
	}
	if s.v6 {
		return tcpip.AddrFrom16([16]byte{0xfd, 15: sb}), tcpip.AddrFrom16([16]byte{0xfd, 15: 2})
	}
	return tcpip.AddrFrom4([4]byte{10, 0, 0, sb}), tcpip.AddrFrom4([4]byte{10, 0, 0, 2})
}

// build encodes s with gVisor's header encoders.
func (bd *builder) build(s seg) built {
	if s.sport == 0 {
		s.sport = 1000
	}
	fid := flowID{v6: s.v6, udp: s.udp, icmp: s.icmp, arp: s.arp, sport: s.sport, src: s.src}
	if s.vx {
		fid.vx, fid.ov6, fid.ocsum0, fid.vni, fid.oport, fid.mac, fid.imac = true, s.ov6, s.ocsum0, s.vni, s.oport, s.mac, s.imac
	}
	fs := bd.flows[fid]
	if fs == nil {
		fs = &flowState{seq: 1_000_000, id: 100, oid: 3000}
		bd.flows[fid] = fs
	}
	if s.vx {
		in := s
		in.vx, in.mac, in.pad = false, s.imac, 0
		return bd.wrapVXLAN(bd.buildFlow(in, fs), s, fs)
	}
	return bd.buildFlow(s, fs)
}

// buildFlow encodes s, a frame of the flow whose state is fs.
func (bd *builder) buildFlow(s seg, fs *flowState) built {
	k := bd.n
	bd.n++
	payload := make([]byte, s.n)
	payloadPattern(payload, k)
	mac := s.mac
	if mac == 0 {
		mac = 1
	}
	src, dst := s.addrs()
	if s.arp {
		f := make([]byte, header.EthernetMinimumSize+header.ARPSize+s.n)
		header.Ethernet(f).Encode(&header.EthernetFields{
			SrcAddr: tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, mac}),
			DstAddr: tcpip.LinkAddress([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}),
			Type:    header.ARPProtocolNumber,
		})
		a := header.ARP(f[header.EthernetMinimumSize:])
		a.SetIPv4OverEthernet()
		a.SetOp(header.ARPRequest)
		copy(a.ProtocolAddressSender(), src.AsSlice())
		copy(f[header.EthernetMinimumSize+header.ARPSize:], payload)
		return built{frame: f, hlen: header.EthernetMinimumSize + header.ARPSize, payload: payload, seg: s}
	}

	// Header lengths.
	var ipOpts header.IPv4OptionsSerializer
	var ext header.IPv6ExtHdrSerializer
	ipLen := header.IPv4MinimumSize
	if s.v6 {
		ipLen = header.IPv6MinimumSize
		if s.ipOpts || s.dst6 != 0 {
			// A destination options header is written as a hop-by-hop
			// one of the same size, then retyped below.
			ext = append(ext, header.IPv6SerializableHopByHopExtHdr{&header.IPv6RouterAlertOption{Value: header.IPv6RouterAlertMLD}})
		}
		if s.frag {
			ext = append(ext, &header.IPv6SerializableFragmentExtHdr{M: true, Identification: 7})
		}
		ipLen += ext.Length()
	} else if s.ipOpts {
		ipOpts = header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}
		ipLen += int(ipOpts.Length())
	}
	var opts []byte
	if !s.udp && !s.icmp && !s.noOpts {
		tsval := s.tsval
		if tsval == 0 {
			tsval = 1
		}
		opts = make([]byte, 12)
		header.EncodeNOP(opts)
		header.EncodeNOP(opts[1:])
		header.EncodeTSOption(tsval, 2, opts[2:])
	}
	l4Len := header.TCPMinimumSize + len(opts)
	switch {
	case s.icmp:
		l4Len = 8
	case s.udp:
		l4Len = header.UDPMinimumSize
	}
	hlen := header.EthernetMinimumSize + ipLen + l4Len
	f := make([]byte, hlen+s.n+s.pad)
	copy(f[hlen:], payload)

	ethType := header.IPv4ProtocolNumber
	if s.v6 {
		ethType = header.IPv6ProtocolNumber
	}
	header.Ethernet(f).Encode(&header.EthernetFields{
		SrcAddr: tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, mac}),
		DstAddr: tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 0xee}),
		Type:    ethType,
	})
	ip := f[header.EthernetMinimumSize:]
	l4 := f[header.EthernetMinimumSize+ipLen : hlen+s.n]
	ttl := s.ttl
	if ttl == 0 {
		ttl = 64
	}
	if s.v6 {
		label := s.label
		if label == 0 {
			label = 0x12345
		}
		header.IPv6(ip).Encode(&header.IPv6Fields{
			TrafficClass:      s.tos,
			FlowLabel:         label,
			PayloadLength:     uint16(ipLen - header.IPv6MinimumSize + l4Len + s.n),
			TransportProtocol: s.proto(),
			HopLimit:          ttl,
			SrcAddr:           src,
			DstAddr:           dst,
			ExtensionHeaders:  ext,
		})
		if s.dst6 != 0 {
			// Next Header 60; one experimental option (RFC 4727, type
			// 0x1e: skip if unknown) of 4 bytes of s.dst6.
			ip[6] = protoDestOpts
			copy(ip[header.IPv6MinimumSize+2:header.IPv6MinimumSize+8], []byte{0x1e, 4, s.dst6, s.dst6, s.dst6, s.dst6})
		}
	} else {
		id := fs.id
		if s.setID {
			id = s.id
		}
		fs.id = id + 1
		var flags uint8
		if !s.noDF {
			flags |= header.IPv4FlagDontFragment
		}
		if s.frag {
			flags |= header.IPv4FlagMoreFragments
		}
		if s.evil {
			flags |= 4 // the reserved bit, above DF
		}
		h := header.IPv4(ip)
		h.Encode(&header.IPv4Fields{
			TOS:         s.tos,
			TotalLength: uint16(ipLen + l4Len + s.n),
			ID:          id,
			Flags:       flags,
			TTL:         ttl,
			Protocol:    uint8(s.proto()),
			SrcAddr:     src,
			DstAddr:     dst,
			Options:     ipOpts,
		})
		h.SetChecksum(^h.CalculateChecksum())
		if s.badSum {
			h.SetChecksum(h.Checksum() ^ 0x0101)
		}
	}
	xsum := header.PseudoHeaderChecksum(s.proto(), src, dst, uint16(len(l4)))
	xsum = checksum.Checksum(payload, xsum)
	var seq uint32
	switch {
	case s.icmp:
		if s.v6 {
			header.ICMPv6(l4).SetType(header.ICMPv6EchoRequest)
		} else {
			header.ICMPv4(l4).SetType(header.ICMPv4Echo)
		}
	case s.udp:
		u := header.UDP(l4)
		u.Encode(&header.UDPFields{SrcPort: s.sport, DstPort: 80, Length: uint16(len(l4))})
		if !s.csum0 {
			c := ^u.CalculateChecksum(xsum)
			if c == 0 {
				c = 0xffff
			}
			if s.badL4 {
				c ^= 0x0100
			}
			u.SetChecksum(c)
		}
	default:
		seq = fs.seq + uint32(s.seqOff)
		win := s.window
		if win == 0 {
			win = 4096
		}
		t := header.TCP(l4)
		t.Encode(&header.TCPFields{
			SrcPort:    s.sport,
			DstPort:    80,
			SeqNum:     seq,
			AckNum:     5000 + s.ackOff,
			DataOffset: uint8(l4Len),
			Flags:      header.TCPFlagAck | s.flags,
			WindowSize: win,
		})
		copy(t[header.TCPMinimumSize:], opts)
		t.SetChecksum(^t.CalculateChecksum(xsum))
		if s.badL4 {
			t.SetChecksum(t.Checksum() - 1) // as gro.c's send_changed_checksum
		}
		fs.seq = seq + uint32(s.n)
		if s.flags&(header.TCPFlagSyn|header.TCPFlagFin) != 0 {
			fs.seq++
		}
	}
	return built{frame: f, hlen: hlen, payload: payload, seg: s, seq: seq,
		inner: header.EthernetMinimumSize, l4: header.EthernetMinimumSize + ipLen}
}

// Outer addresses of VXLAN test frames.
var (
	outerSrc4, outerDst4 = tcpip.AddrFrom4([4]byte{172, 16, 0, 1}), tcpip.AddrFrom4([4]byte{172, 16, 0, 2})
	outerSrc6            = tcpip.AddrFrom16([16]byte{0xfd, 0, 0, 1, 15: 1})
	outerDst6            = tcpip.AddrFrom16([16]byte{0xfd, 0, 0, 1, 15: 2})
)

// wrapVXLAN encapsulates in, an Ethernet frame, in VXLAN per s's outer
// fields, the next frame of the flow whose state is fs.
func (bd *builder) wrapVXLAN(in built, s seg, fs *flowState) built {
	ipLen := header.IPv4MinimumSize
	var ipOpts header.IPv4OptionsSerializer
	switch {
	case s.ov6:
		ipLen = header.IPv6MinimumSize
	case s.oipOpts:
		ipOpts = header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}
		ipLen += int(ipOpts.Length())
	}
	l2 := header.EthernetMinimumSize
	ol4 := l2 + ipLen
	udpLen := header.UDPMinimumSize + vxlanHdrLen + len(in.frame)
	f := make([]byte, ol4+udpLen+s.pad)
	mac := s.mac
	if mac == 0 {
		mac = 1
	}
	ethType := header.IPv4ProtocolNumber
	if s.ov6 {
		ethType = header.IPv6ProtocolNumber
	}
	header.Ethernet(f).Encode(&header.EthernetFields{
		SrcAddr: tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, mac}),
		DstAddr: tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 0xee}),
		Type:    ethType,
	})
	ttl := s.ottl
	if ttl == 0 {
		ttl = 64
	}
	src, dst := outerSrc4, outerDst4
	if s.ov6 {
		src, dst = outerSrc6, outerDst6
		label := s.olabel
		if label == 0 {
			label = 0x6789a
		}
		header.IPv6(f[l2:]).Encode(&header.IPv6Fields{
			TrafficClass:      s.otos,
			FlowLabel:         label,
			PayloadLength:     uint16(udpLen),
			TransportProtocol: header.UDPProtocolNumber,
			HopLimit:          ttl,
			SrcAddr:           src,
			DstAddr:           dst,
		})
	} else {
		id := fs.oid
		if s.osetID {
			id = s.oid
		}
		fs.oid = id + 1
		var flags uint8
		if !s.onoDF {
			flags |= header.IPv4FlagDontFragment
		}
		if s.ofrag {
			flags |= header.IPv4FlagMoreFragments
		}
		if s.oevil {
			flags |= 4
		}
		h := header.IPv4(f[l2:])
		h.Encode(&header.IPv4Fields{
			TOS: s.otos, TotalLength: uint16(ipLen + udpLen), ID: id, Flags: flags, TTL: ttl,
			Protocol: uint8(header.UDPProtocolNumber), SrcAddr: src, DstAddr: dst, Options: ipOpts,
		})
		h.SetChecksum(^h.CalculateChecksum())
		if s.obadSum {
			h.SetChecksum(h.Checksum() ^ 0x0101)
		}
	}
	oport, dport := s.oport, s.dport
	if oport == 0 {
		oport = 50000
	}
	if dport == 0 {
		dport = VXLANPort
	}
	vxFlags, vni := s.vxFlags, s.vni
	if vxFlags == 0 {
		vxFlags = 0x08000000
	}
	if vni == 0 {
		vni = 42
	}
	vx := f[ol4+header.UDPMinimumSize:]
	binary.BigEndian.PutUint32(vx, vxFlags)
	binary.BigEndian.PutUint32(vx[4:], vni<<8)
	copy(vx[vxlanHdrLen:], in.frame)
	u := header.UDP(f[ol4 : ol4+udpLen])
	u.Encode(&header.UDPFields{SrcPort: oport, DstPort: dport, Length: uint16(udpLen)})
	if !s.ocsum0 {
		xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, src, dst, uint16(udpLen))
		xsum = checksum.Checksum(u[header.UDPMinimumSize:], xsum)
		c := ^u.CalculateChecksum(xsum)
		if c == 0 {
			c = 0xffff
		}
		if s.obadL4 {
			c ^= 0x0100
		}
		u.SetChecksum(c)
	}
	off := ol4 + header.UDPMinimumSize + vxlanHdrLen
	return built{frame: f, hlen: off + in.hlen, payload: in.payload, seg: s, seq: in.seq,
		ol4: ol4, inner: off + in.inner, l4: off + in.l4}
}

// packet cuts b into a packet on w per l and s's metadata overrides.
func (b built) packet(w *wire, l layout) *bufpool.Packet {
	linear := -1
	if b.seg.linear > 0 {
		linear = b.seg.linear
	}
	if b.seg.short > 0 {
		linear = b.hlen - b.seg.short
	}
	p := w.packet(b.frame, b.hlen, linear, l)
	p.HdrLen += b.seg.hdrAdj
	p.CsumVerified = !b.seg.unver
	if b.seg.hash != 0 {
		p.Hash, p.HashType = b.seg.hash, bufpool.HashL4
	}
	if b.seg.lro > 0 {
		// An LRO super-frame, as the driver hands one up: its gso_size
		// and segment count.
		p.GSOSize = b.seg.lro
		p.Segs = uint16(b.segs())
	}
	return p
}

// segs returns the wire frames b stands for: an LRO super-frame's segments.
func (b built) segs() int {
	if l := int(b.seg.lro); l > 0 && b.seg.n > l {
		return (b.seg.n + l - 1) / l
	}
	return 1
}

// checkMerged checks a delivered packet built from the frames ins (in
// order): its payload, segment count, GSO size, lengths and header fields.
// A single frame must come out exactly as it went in.
func checkMerged(p *bufpool.Packet, ins []built) error {
	for q := p; q != nil; q = q.Next {
		if n := frameLen(q); q.Len != n {
			return fmt.Errorf("Len: got %d, want %d (linear + frags)", q.Len, n)
		}
	}
	if len(ins) == 1 {
		if !bytes.Equal(frameOf(p), ins[0].frame) || p.Next != nil {
			return fmt.Errorf("single frame changed")
		}
		if want := ins[0].segs(); int(p.Segs) != want {
			return fmt.Errorf("Segs: got %d, want %d", p.Segs, want)
		}
		return nil
	}
	if ins[0].seg.vx {
		return checkMergedVX(p, ins)
	}
	var want []byte
	for _, in := range ins {
		want = append(want, in.payload...)
	}
	if got := payloadOf(p); !bytes.Equal(got, want) {
		return fmt.Errorf("payload: got %d bytes, want %d (or contents differ)", len(got), len(want))
	}
	first := ins[0]
	wantSegs, wantGSO := 0, len(first.payload)
	for _, in := range ins {
		wantSegs += in.segs()
	}
	if first.segs() > 1 {
		wantGSO = int(first.seg.lro)
	}
	if got, want := int(p.Segs), wantSegs; got != want {
		return fmt.Errorf("Segs: got %d, want %d", got, want)
	}
	if got, want := int(p.GSOSize), wantGSO; got != want {
		return fmt.Errorf("GSOSize: got %d, want %d", got, want)
	}
	chainHdrs := 0
	for q := p.Next; q != nil; q = q.Next {
		chainHdrs += q.HdrLen
	}
	if got, want := p.TotalLen()-chainHdrs, first.hlen+len(want); got != want {
		return fmt.Errorf("TotalLen minus chained headers: got %d, want %d", got, want)
	}
	l := p.Linear
	ipPayload := first.hlen - header.EthernetMinimumSize + len(want)
	if first.seg.v6 {
		ip := header.IPv6(l[header.EthernetMinimumSize:])
		ipPayload -= header.IPv6MinimumSize
		if got := int(ip.PayloadLength()); got != ipPayload {
			return fmt.Errorf("IPv6 payload length: got %d, want %d", got, ipPayload)
		}
	} else {
		ip := header.IPv4(l[header.EthernetMinimumSize:])
		if got := int(ip.TotalLength()); got != ipPayload {
			return fmt.Errorf("IPv4 total length: got %d, want %d", got, ipPayload)
		}
		if !ip.IsChecksumValid() {
			return fmt.Errorf("IPv4 header checksum: got %#04x, invalid", ip.Checksum())
		}
	}
	if first.seg.udp {
		u := header.UDP(l[first.hlen-header.UDPMinimumSize:])
		if got, want := int(u.Length()), header.UDPMinimumSize+len(want); got != want {
			return fmt.Errorf("UDP length: got %d, want %d", got, want)
		}
		return nil
	}
	t := header.TCP(l[first.hlen-header.TCPMinimumSize-tcpOptsLen(first.seg):])
	wantFlags := header.TCPFlagAck | first.seg.flags
	for _, in := range ins[1:] {
		wantFlags |= in.seg.flags & (header.TCPFlagFin | header.TCPFlagPsh)
	}
	if got := t.Flags(); got != wantFlags {
		return fmt.Errorf("TCP flags: got %v, want %v", got, wantFlags)
	}
	if got := t.SequenceNumber(); got != first.seq {
		return fmt.Errorf("TCP seq: got %d, want %d", got, first.seq)
	}
	return nil
}

func tcpOptsLen(s seg) int {
	if s.noOpts {
		return 0
	}
	return 12
}
