package stack

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// FuzzPipeline's input and the frames it makes. An input is a header
// (configuration, template count, connection options) and up to
// pipeMaxTmpls templates; each template is a valid frame, or a few (a
// fragmented datagram, a burst of one flow), built with gVisor's header
// encoders (testutil.Frame) from its fields, then given a virtio-net header
// (the one a kernel sender writes, or fields of the input), and then
// mutated: bytes flipped, the frame cut short, checksums made right again.
// Payloads are 8-byte tags unique to the execution, padding after the IP
// packet tags of its own, so that bytes a socket reads tell where they came
// from.

// Template kinds (pipeTmpl.kind modulo pipeKinds).
const (
	tmplUDP      = iota // one datagram
	tmplUDPGSO          // a USO super-frame (VIRTIO_NET_HDR_GSO_UDP_L4)
	tmplUDPFrag         // a datagram in IPv4 or IPv6 fragments
	tmplTCP             // a segment of the execution's connection
	tmplTCPGSO          // a TSO super-frame of the connection
	tmplTunnel          // a UDP datagram or TCP segment in an IPv6 tunnel
	tmplRaw             // bytes of the input after an Ethernet header
	tmplUDPBurst        // datagrams of one flow and size, for GRO trains
	pipeKinds
)

// pipeMaxTmpls bounds the templates of an input.
const pipeMaxTmpls = 8

// Input header bits (pipeInput.conn).
const (
	connV6    = 1 << iota // the TCP connection is IPv6
	connSmall             // its receive buffer is small: zero windows
	connViews             // it is read with ReadViews, else TryRead
	connNoTS              // no timestamps negotiated
)

// The addresses and ports of the test: the stack under test, its peer
// (the test, writing frames), and the sockets' ports.
var (
	pipeRxMAC    = tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 1})
	pipePeerMAC  = tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 2})
	pipeBcastMAC = tcpip.LinkAddress([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	pipeMcastMAC = tcpip.LinkAddress([]byte{0x33, 0x33, 0, 0, 0, 1}) // ff02::1

	pipeRx4, pipeRx6     = tcpip.AddrFrom4([4]byte{192, 0, 2, 1}), tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 1})
	pipePeer4, pipePeer6 = tcpip.AddrFrom4([4]byte{192, 0, 2, 2}), tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 2})
	pipeFar4, pipeFar6   = tcpip.AddrFrom4([4]byte{192, 0, 2, 77}), tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 0x77})
	pipeInner4           = tcpip.AddrFrom4([4]byte{10, 78, 0, 2})
	pipeInner6           = tcpip.AddrFrom16([16]byte{0xfd, 0x78, 15: 2})
	pipeTunLocal         = tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 0x11})
	pipeTunRemote        = tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 0x12})
	pipeBcast4           = tcpip.AddrFrom4([4]byte{255, 255, 255, 255})
	pipeSubnetBcast4     = tcpip.AddrFrom4([4]byte{192, 0, 2, 255})
	pipeAllNodes6        = tcpip.AddrFrom16([16]byte{0xff, 0x02, 15: 1})
)

const (
	pipeUDPPort      = 7001 // a gVisor UDP socket, dual stack
	pipeTrainPort    = 7002 // TrainConns on 7002 to 7006
	pipeBoundPort    = 7006 // the TrainConn bound to 192.0.2.1
	pipeClosedPort   = 7007 // no socket
	pipeTCPPort      = 7100 // the listener
	pipeSentinelPort = 7999 // the sentinels' socket
)

// pipePorts are the ports a template's port selector picks.
var pipePorts = [8]uint16{pipeUDPPort, 7002, 7003, 7004, 7005, pipeBoundPort, pipeClosedPort, 7002}

// pipeInput reads an input; past its end it reads zeros.
type pipeInput struct {
	b []byte
	i int
}

func (in *pipeInput) u8() uint8 {
	if in.i >= len(in.b) {
		return 0
	}
	c := in.b[in.i]
	in.i++
	return c
}

func (in *pipeInput) u16() uint16 { return uint16(in.u8())<<8 | uint16(in.u8()) }

// pipeTmpl is one template of an input, field by field in input order.
// Bits of flags: 0 IPv6; 1 IP options (IPv4 router alert, IPv6 hop-by-hop
// header); 2 a TCP segment at offset size2, not the next; 3 no TCP
// timestamp, fragments in reverse order, the tunnel's TCP; 4-7 the UDP
// source port's offset; 5-6 TCP's FIN, RST or SYN. Bits of dst: 0-1 own
// address, broadcast (5: the subnet's) or all-nodes, another host's, the
// tunnel's inner; 2-4 the port (pipePorts). vnet's bits 0-1: the natural
// virtio-net header, its gso_size and hdr_len from vraw, its flags and
// gso_type from vraw, or all of vraw; bit 2: csum_start and csum_offset
// from vraw. trunc's bit 7: the first frame cut short by bits 0-5 bytes;
// bit 6: checksums made right after the mutations. Each mutation XORs a
// byte (at an offset, of a frame of the template) with a value.
type pipeTmpl struct {
	kind        uint8
	flags, dst  uint8
	size, size2 uint16
	pad         uint8 // bytes of padding after the IP packet
	csum        uint8 // modulo 3: a full checksum, NEEDS_CSUM, DATA_VALID
	vnet        uint8
	vraw        [driver.VirtioNetHdrLen]byte
	trunc       uint8
	muts        [][4]byte // frame, offset (2 bytes), value
	raw         []byte    // tmplRaw's bytes
}

// pipeInputHdr is an input's header.
type pipeInputHdr struct {
	config, ntmpl, conn uint8
}

// decode reads an input's header and templates.
func (in *pipeInput) decode() (pipeInputHdr, []pipeTmpl) {
	h := pipeInputHdr{config: in.u8(), ntmpl: in.u8(), conn: in.u8()}
	n := int(h.ntmpl) % (pipeMaxTmpls + 1)
	ts := make([]pipeTmpl, 0, n)
	for range n {
		var t pipeTmpl
		t.kind, t.flags, t.dst = in.u8()%pipeKinds, in.u8(), in.u8()
		t.size, t.size2 = in.u16(), in.u16()
		t.pad, t.csum, t.vnet = in.u8(), in.u8(), in.u8()
		for i := range t.vraw {
			t.vraw[i] = in.u8()
		}
		t.trunc = in.u8()
		for range in.u8() % 4 {
			t.muts = append(t.muts, [4]byte{in.u8(), in.u8(), in.u8(), in.u8()})
		}
		if t.kind == tmplRaw {
			for range in.u8() {
				t.raw = append(t.raw, in.u8())
			}
		}
		ts = append(ts, t)
	}
	return h, ts
}

// encodePipeInput is decode's inverse, for the seeds.
func encodePipeInput(h pipeInputHdr, ts []pipeTmpl) []byte {
	b := []byte{h.config, uint8(len(ts)), h.conn}
	for _, t := range ts {
		b = append(b, t.kind, t.flags, t.dst, byte(t.size>>8), byte(t.size), byte(t.size2>>8), byte(t.size2), t.pad, t.csum, t.vnet)
		b = append(b, t.vraw[:]...)
		b = append(b, t.trunc, uint8(len(t.muts)))
		for _, m := range t.muts {
			b = append(b, m[:]...)
		}
		if t.kind == tmplRaw {
			b = append(b, uint8(len(t.raw)))
			b = append(b, t.raw...)
		}
	}
	return b
}

// pipeFrames builds an execution's frames.
type pipeFrames struct {
	l3     bool
	mtu    int
	exec   uint64
	conn   *pipeConn // the execution's connection, nil if none
	tcpEnd int       // the connection's stream bytes made so far
	tag    uint32
	frames [][]byte
}

// tagged returns n bytes of tags: the marker, the execution, a counter.
func (fb *pipeFrames) tagged(marker uint64, n int) []byte {
	b := make([]byte, n+7)
	for i := 0; i < n; i += 8 {
		binary.BigEndian.PutUint64(b[i:], marker<<56|(fb.exec&0xffffff)<<32|uint64(fb.tag))
		fb.tag++
	}
	return b[:n:n]
}

func (fb *pipeFrames) payload(n int) []byte { return fb.tagged(0xa5, n) }

// src returns the execution's source address for UDP and raw frames
// (IPv4 from 198.18.0.0/15, IPv6 from 2001:db8:1::/48), so that no
// datagram, fragment or GRO flow of one execution meets another's. (TCP
// segments, from the peer's address, carry the execution in their IP ID.)
func (fb *pipeFrames) src(v6 bool) tcpip.Address {
	if v6 {
		e := fb.exec & 0xffffffff
		return tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 12: byte(e >> 24), 13: byte(e >> 16), 14: byte(e >> 8), 15: byte(e)})
	}
	e := fb.exec & 0x1ffff
	return tcpip.AddrFrom4([4]byte{198, 18 + byte(e>>16), byte(e >> 8), byte(e)})
}

// ipID returns the IP ID of a template's packets: with the source, unique
// to the execution over 2^29 of them.
func (fb *pipeFrames) ipID(i int) uint32 { return uint32(fb.exec>>17)<<4 | uint32(i) }

// dst returns a template's destination address and MAC.
func (t *pipeTmpl) dstAddr(v6 bool) (tcpip.Address, tcpip.LinkAddress) {
	switch t.dst & 3 {
	case 1:
		if v6 {
			return pipeAllNodes6, pipeMcastMAC
		}
		if t.dst&32 != 0 {
			return pipeSubnetBcast4, pipeBcastMAC
		}
		return pipeBcast4, pipeBcastMAC
	case 2:
		if v6 {
			return pipeFar6, pipeRxMAC
		}
		return pipeFar4, pipeRxMAC
	case 3:
		if v6 {
			return pipeInner6, pipeRxMAC
		}
		return pipeInner4, pipeRxMAC
	}
	if v6 {
		return pipeRx6, pipeRxMAC
	}
	return pipeRx4, pipeRxMAC
}

func (t *pipeTmpl) port() uint16  { return pipePorts[(t.dst>>2)&7] }
func (t *pipeTmpl) sport() uint16 { return 30000 + uint16(t.flags>>4) }

// ipFrame is the IP part of a template's frame: addresses, options.
func (fb *pipeFrames) ipFrame(t *pipeTmpl, v6 bool, src, dst tcpip.Address, dmac tcpip.LinkAddress) testutil.Frame {
	f := testutil.Frame{Headroom: driver.VirtioNetHdrLen, SrcMAC: pipePeerMAC, DstMAC: dmac, Src: src, Dst: dst}
	if t.flags&2 != 0 {
		if v6 {
			f.IPv6Ext = header.IPv6ExtHdrSerializer{&header.IPv6SerializableHopByHopExtHdr{&header.IPv6RouterAlertOption{Value: header.IPv6RouterAlertMLD}}}
		} else {
			f.IPv4Options = header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}
		}
	}
	return f
}

// csumMode sets f's checksum as the template's csum asks and returns the
// natural virtio-net header for it.
func (fb *pipeFrames) csumMode(t *pipeTmpl, f *testutil.Frame) driver.VirtioNetHdr {
	switch t.csum % 3 {
	case 1:
		f.Csum = testutil.CsumPartial
		return driver.VirtioNetHdr{Flags: driver.VirtioNetHdrFNeedsCsum, CsumStart: uint16(fb.l4Off(f)), CsumOffset: uint16(f.CsumOffset())}
	case 2:
		return driver.VirtioNetHdr{Flags: driver.VirtioNetHdrFDataValid}
	}
	return driver.VirtioNetHdr{}
}

// l4Off is the offset of f's L4 header in the frame as written (without
// the virtio-net header; from the IP header on a TUN's wire).
func (fb *pipeFrames) l4Off(f *testutil.Frame) int {
	off := f.L4Off() - f.Headroom
	if fb.l3 {
		off -= header.EthernetMinimumSize
	}
	return off
}

// frame builds f into a frame as written to the wire: the virtio-net
// header vh (the template's vnet fields applied to it), the frame (its
// Ethernet header dropped on a TUN's wire) and pad bytes of padding tags.
func (fb *pipeFrames) frame(t *pipeTmpl, f testutil.Frame, vh driver.VirtioNetHdr) []byte {
	b := f.Build()
	if fb.l3 {
		b = append(b[:driver.VirtioNetHdrLen], b[driver.VirtioNetHdrLen+header.EthernetMinimumSize:]...)
	}
	b = append(b, fb.tagged(0xee, int(t.pad))...)
	switch t.vnet & 3 {
	case 1:
		vh.HdrLen = binary.NativeEndian.Uint16(t.vraw[2:])
		vh.GSOSize = binary.NativeEndian.Uint16(t.vraw[4:])
	case 2:
		vh.Flags, vh.GSOType = t.vraw[0], t.vraw[1]
	case 3:
		vh.Decode(t.vraw[:])
	}
	if t.vnet&4 != 0 {
		vh.CsumStart = binary.NativeEndian.Uint16(t.vraw[6:])
		vh.CsumOffset = binary.NativeEndian.Uint16(t.vraw[8:])
	}
	vh.Encode(b)
	return b
}

// build appends template i's frames, mutated, to fb.frames.
func (fb *pipeFrames) build(i int, t *pipeTmpl) {
	start := len(fb.frames)
	switch t.kind {
	case tmplUDP:
		fb.udp(i, t, 1)
	case tmplUDPBurst:
		fb.udp(i, t, 2+int(t.size2%7))
	case tmplUDPGSO:
		fb.udpGSO(i, t)
	case tmplUDPFrag:
		fb.udpFrags(i, t)
	case tmplTCP:
		fb.tcp(t, false)
	case tmplTCPGSO:
		fb.tcp(t, true)
	case tmplTunnel:
		fb.tunnel(i, t)
	case tmplRaw:
		fb.raw(t)
	}
	made := fb.frames[start:]
	if len(made) == 0 {
		return
	}
	for _, m := range t.muts {
		b := made[int(m[0])%len(made)]
		if len(b) > driver.VirtioNetHdrLen {
			off := driver.VirtioNetHdrLen + int(binary.BigEndian.Uint16(m[1:]))%(len(b)-driver.VirtioNetHdrLen)
			b[off] ^= m[3] | 1
		}
	}
	for j, b := range made {
		if t.trunc&0x80 != 0 && j == 0 {
			b = b[:max(driver.VirtioNetHdrLen, len(b)-int(t.trunc&0x3f))]
		}
		if t.trunc&0x40 != 0 {
			pipeFixChecksums(b[driver.VirtioNetHdrLen:], fb.l3)
		}
		made[j] = b
	}
}

// udp makes n datagrams of one flow, each of the template's size.
func (fb *pipeFrames) udp(i int, t *pipeTmpl, n int) {
	v6 := t.flags&1 != 0
	dst, dmac := t.dstAddr(v6)
	size := int(t.size) % (fb.mtu + 100)
	for range n {
		f := fb.ipFrame(t, v6, fb.src(v6), dst, dmac)
		f.Proto, f.SrcPort, f.DstPort, f.ID = header.UDPProtocolNumber, t.sport(), t.port(), uint16(fb.ipID(i))
		f.Payload = fb.payload(size)
		vh := fb.csumMode(t, &f)
		fb.frames = append(fb.frames, fb.frame(t, f, vh))
	}
}

// udpGSO makes a USO super-frame: size bytes in datagrams of size2.
func (fb *pipeFrames) udpGSO(i int, t *pipeTmpl) {
	v6 := t.flags&1 != 0
	dst, dmac := t.dstAddr(v6)
	f := fb.ipFrame(t, v6, fb.src(v6), dst, dmac)
	f.Proto, f.SrcPort, f.DstPort, f.ID = header.UDPProtocolNumber, t.sport(), t.port(), uint16(fb.ipID(i))
	room := 0xffff - header.UDPMinimumSize - (f.L4Off() - f.L3Off())
	if v6 {
		room = 0xffff - header.UDPMinimumSize - f.IPv6Ext.Length()
	}
	f.Payload = fb.payload(int(t.size) % room)
	f.Csum = testutil.CsumPartial
	l4 := fb.l4Off(&f)
	fb.frames = append(fb.frames, fb.frame(t, f, driver.VirtioNetHdr{
		Flags: driver.VirtioNetHdrFNeedsCsum, GSOType: driver.VirtioNetHdrGSOUDPL4,
		HdrLen: uint16(l4 + header.UDPMinimumSize), GSOSize: t.size2,
		CsumStart: uint16(l4), CsumOffset: udpChecksumOffset,
	}))
}

// udpFrags makes a datagram of size bytes in at most 4 fragments of
// 8*(1+size2%190) bytes, in order or (flags 8) reversed.
func (fb *pipeFrames) udpFrags(i int, t *pipeTmpl) {
	v6 := t.flags&1 != 0
	dst, dmac := t.dstAddr(v6)
	src := fb.src(v6)
	whole := fb.ipFrame(t, v6, src, dst, dmac)
	whole.Proto, whole.SrcPort, whole.DstPort = header.UDPProtocolNumber, t.sport(), t.port()
	whole.Payload = fb.payload(int(t.size) % 4000)
	b := whole.Build()
	ipPayload := b[whole.L4Off():] // the UDP header and the data
	fs := 8 * (1 + int(t.size2)%190)
	if n := (len(ipPayload) + fs - 1) / fs; n > 4 {
		fs = (len(ipPayload)/4 + 8) &^ 7
	}
	var frames [][]byte
	for off := 0; off < len(ipPayload); off += fs {
		piece := ipPayload[off:min(off+fs, len(ipPayload))]
		more := off+fs < len(ipPayload)
		f := fb.ipFrame(t, v6, src, dst, dmac)
		f.Proto, f.NoL4Header, f.Payload = header.UDPProtocolNumber, true, piece
		if v6 {
			f.IPv6Ext = append(f.IPv6Ext, &header.IPv6SerializableFragmentExtHdr{FragmentOffset: uint16(off / 8), M: more, Identification: fb.ipID(i)})
		} else {
			f.ID, f.FragOff = uint16(fb.ipID(i)), uint16(off)
			if more {
				f.IPFlags = header.IPv4FlagMoreFragments
			}
		}
		var vh driver.VirtioNetHdr
		if t.csum%3 != 0 {
			vh.Flags = driver.VirtioNetHdrFDataValid // a sender puts no NEEDS_CSUM on a fragment
		}
		frames = append(frames, fb.frame(t, f, vh))
	}
	if t.flags&8 != 0 {
		for l, r := 0, len(frames)-1; l < r; l, r = l+1, r-1 {
			frames[l], frames[r] = frames[r], frames[l]
		}
	}
	fb.frames = append(fb.frames, frames...)
}

// tcpOptsTS returns the timestamp option of a data segment.
func (c *pipeConn) tcpOptsTS() []byte {
	if !c.ts {
		return nil
	}
	o := []byte{1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0}
	c.tsVal++
	binary.BigEndian.PutUint32(o[4:], c.tsVal)
	binary.BigEndian.PutUint32(o[8:], c.tsEcr)
	return o
}

// tcpFrame is a segment of the execution's connection carrying stream
// bytes [off, off+n).
func (fb *pipeFrames) tcpFrame(t *pipeTmpl, off, n int) testutil.Frame {
	c := fb.conn
	src, dst := pipePeer4, pipeRx4
	if c.v6 {
		src, dst = pipePeer6, pipeRx6
	}
	f := fb.ipFrame(t, c.v6, src, dst, pipeRxMAC)
	f.SrcPort, f.DstPort, f.ID = c.pport, c.lport, uint16(fb.exec)
	f.Seq, f.Ack, f.Window = c.irs+1+uint32(off), c.iss+1, 0xffff
	f.Flags = header.TCPFlagAck | header.TCPFlagPsh
	switch (t.flags >> 5) & 3 {
	case 1:
		f.Flags |= header.TCPFlagFin
	case 2:
		f.Flags |= header.TCPFlagRst
	case 3:
		f.Flags |= header.TCPFlagSyn
	}
	if t.flags&8 == 0 {
		f.TCPOptions = c.tcpOptsTS()
	}
	f.Payload = fb.payload(n)
	return f
}

// tcp makes a segment (or, gso, a TSO super-frame) of the connection, at
// the next stream offset or (flags 4) at offset size2.
func (fb *pipeFrames) tcp(t *pipeTmpl, gso bool) {
	if fb.conn == nil {
		return
	}
	off := fb.tcpEnd
	if t.flags&4 != 0 {
		off = int(t.size2)
	}
	n := int(t.size) % (fb.mtu + 100)
	if gso {
		n = int(t.size) % 65000
	}
	f := fb.tcpFrame(t, off, n)
	fb.tcpEnd = max(fb.tcpEnd, off+n)
	if !gso {
		vh := fb.csumMode(t, &f)
		fb.frames = append(fb.frames, fb.frame(t, f, vh))
		return
	}
	f.Csum = testutil.CsumPartial
	l4 := fb.l4Off(&f)
	gt := uint8(driver.VirtioNetHdrGSOTCPv4)
	if fb.conn.v6 {
		gt = driver.VirtioNetHdrGSOTCPv6
	}
	mss := t.size2
	if t.flags&4 != 0 || mss == 0 {
		mss = uint16(fb.mtu - 80) // an out-of-order super-frame: size2 was its offset
	}
	fb.frames = append(fb.frames, fb.frame(t, f, driver.VirtioNetHdr{
		Flags: driver.VirtioNetHdrFNeedsCsum, GSOType: gt,
		HdrLen: uint16(l4 + f.L4HeaderLen()), GSOSize: mss,
		CsumStart: uint16(l4), CsumOffset: header.TCPChecksumOffset,
	}))
}

// tunnel makes a UDP datagram, or (flags 8) a segment of the connection,
// inside an IPv6 packet from the tunnel's remote end to its local one.
func (fb *pipeFrames) tunnel(i int, t *pipeTmpl) {
	var inner testutil.Frame
	if t.flags&8 != 0 && fb.conn != nil {
		inner = fb.tcpFrame(t, fb.tcpEnd, int(t.size)%(fb.mtu-100))
		fb.tcpEnd += len(inner.Payload)
	} else {
		v6 := t.flags&1 != 0
		dst, _ := t.dstAddr(v6)
		inner = fb.ipFrame(t, v6, fb.src(v6), dst, pipeRxMAC)
		inner.Proto, inner.SrcPort, inner.DstPort, inner.ID = header.UDPProtocolNumber, t.sport(), t.port(), uint16(fb.ipID(i))
		inner.Payload = fb.payload(int(t.size) % (fb.mtu - 100))
	}
	inner.Headroom = 0
	var vh driver.VirtioNetHdr
	switch t.csum % 3 {
	case 1:
		inner.Csum = testutil.CsumPartial
		vh = driver.VirtioNetHdr{Flags: driver.VirtioNetHdrFNeedsCsum, CsumOffset: uint16(inner.CsumOffset())}
	case 2:
		vh.Flags = driver.VirtioNetHdrFDataValid
	}
	innerL4 := inner.L4Off() - header.EthernetMinimumSize // from the inner IP header
	pkt := inner.Build()[header.EthernetMinimumSize:]
	proto := tcpip.TransportProtocolNumber(4)
	if inner.Src.Len() == header.IPv6AddressSize {
		proto = 41
	}
	outer := testutil.Frame{Headroom: driver.VirtioNetHdrLen, SrcMAC: pipePeerMAC, DstMAC: pipeRxMAC,
		Src: pipeTunRemote, Dst: pipeTunLocal, Proto: proto, Payload: pkt}
	if vh.Flags&driver.VirtioNetHdrFNeedsCsum != 0 {
		vh.CsumStart = uint16(fb.l4Off(&outer) + innerL4)
	}
	fb.frames = append(fb.frames, fb.frame(t, outer, vh))
}

// raw makes a frame of the template's raw bytes after an Ethernet header
// (IPv4's, or with flags 1 IPv6's), or alone on a TUN's wire.
func (fb *pipeFrames) raw(t *pipeTmpl) {
	b := make([]byte, driver.VirtioNetHdrLen, driver.VirtioNetHdrLen+header.EthernetMinimumSize+len(t.raw)+int(t.pad))
	if !fb.l3 {
		et := header.IPv4ProtocolNumber
		if t.flags&1 != 0 {
			et = header.IPv6ProtocolNumber
		}
		eth := make([]byte, header.EthernetMinimumSize)
		header.Ethernet(eth).Encode(&header.EthernetFields{SrcAddr: pipePeerMAC, DstAddr: pipeRxMAC, Type: et})
		b = append(b, eth...)
	}
	ip := len(b)
	b = append(b, t.raw...)
	// The execution's source address, so that a fragment the bytes make
	// meets no other execution's in a reassembly.
	switch {
	case len(b) >= ip+header.IPv4MinimumSize && b[ip]>>4 == 4:
		src := fb.src(false).As4()
		copy(b[ip+12:], src[:])
	case len(b) >= ip+header.IPv6MinimumSize && b[ip]>>4 == 6:
		src := fb.src(true).As16()
		copy(b[ip+8:], src[:])
	}
	b = append(b, fb.tagged(0xee, int(t.pad))...)
	var vh driver.VirtioNetHdr
	vh.Decode(t.vraw[:])
	vh.Encode(b)
	fb.frames = append(fb.frames, b)
}

// pipeFixChecksums makes the IPv4 header checksum and the TCP or UDP
// checksum of frame (an Ethernet frame, or with l3 an IP packet) right,
// where its lengths let them be computed.
func pipeFixChecksums(frame []byte, l3 bool) {
	b := frame
	if !l3 {
		if len(b) < header.EthernetMinimumSize {
			return
		}
		b = b[header.EthernetMinimumSize:]
	}
	if len(b) == 0 {
		return
	}
	var src, dst tcpip.Address
	var proto uint8
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		if len(b) < header.IPv4MinimumSize {
			return
		}
		ip := header.IPv4(b)
		ihl, tot := int(ip.HeaderLength()), int(ip.TotalLength())
		if ihl < header.IPv4MinimumSize || ihl > len(b) {
			return
		}
		ip.SetChecksum(0)
		ip.SetChecksum(^checksum.Checksum(b[:ihl], 0))
		if tot < ihl || tot > len(b) || ip.More() || ip.FragmentOffset() != 0 {
			return
		}
		src, dst, proto, l4 = ip.SourceAddress(), ip.DestinationAddress(), ip.Protocol(), b[ihl:tot]
	case 6:
		if len(b) < header.IPv6MinimumSize {
			return
		}
		ip := header.IPv6(b)
		end := header.IPv6MinimumSize + int(ip.PayloadLength())
		if end > len(b) {
			return
		}
		src, dst, proto, l4 = ip.SourceAddress(), ip.DestinationAddress(), ip.NextHeader(), b[header.IPv6MinimumSize:end]
	default:
		return
	}
	var off int
	switch proto {
	case uint8(header.TCPProtocolNumber):
		off = header.TCPChecksumOffset
	case uint8(header.UDPProtocolNumber):
		off = udpChecksumOffset
	default:
		return
	}
	if len(l4) < off+2 {
		return
	}
	l4[off], l4[off+1] = 0, 0
	sum := ^checksum.Checksum(l4, header.PseudoHeaderChecksum(tcpip.TransportProtocolNumber(proto), src, dst, uint16(len(l4))))
	if sum == 0 && proto == uint8(header.UDPProtocolNumber) {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(l4[off:], sum)
}
