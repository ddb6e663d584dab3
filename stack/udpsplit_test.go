package stack

import (
	"bytes"
	"fmt"
	"github.com/ustack/ustack/internal/testutil"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
)

// udpFrameSpec describes the headers of a UDP packet for udpHeaderFrame.
type udpFrameSpec struct {
	v6       bool
	ipOpts   bool                          // IPv4: a router alert option (IHL 6)
	proto    tcpip.TransportProtocolNumber // 0: UDP
	src, dst netip.AddrPort
	payload  int  // the UDP length field's payload
	hbh      bool // IPv6: a hop-by-hop options header (PadN) before the UDP header
}

// hbhLen is the length of udpFrameSpec.hbh's header.
const hbhLen = 8

var (
	udpSrc4 = netip.MustParseAddrPort("192.0.2.2:5555")
	udpDst4 = netip.MustParseAddrPort("192.0.2.1:9")
	udpSrc6 = netip.MustParseAddrPort("[2001:db8::2]:5555")
	udpDst6 = netip.MustParseAddrPort("[2001:db8::1]:9")
)

// udpHeaderFrame builds the Ethernet, IP and UDP headers of s with gVisor's
// encoders, with lengths for s.payload bytes of payload (not included).
func udpHeaderFrame(s udpFrameSpec) []byte {
	proto := s.proto
	if proto == 0 {
		proto = header.UDPProtocolNumber
	}
	var opts header.IPv4OptionsSerializer
	if s.ipOpts {
		opts = header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}
	}
	ipLen := header.IPv6MinimumSize
	if s.hbh {
		ipLen += hbhLen
	}
	et := header.IPv6ProtocolNumber
	if !s.v6 {
		ipLen = header.IPv4MinimumSize + int(opts.Length())
		et = header.IPv4ProtocolNumber
	}
	l4 := header.EthernetMinimumSize + ipLen
	b := make([]byte, l4+header.UDPMinimumSize)
	header.Ethernet(b).Encode(&header.EthernetFields{
		SrcAddr: "\x02\x00\x00\x00\x00\x02", DstAddr: "\x02\x00\x00\x00\x00\x01", Type: et,
	})
	ulen := header.UDPMinimumSize + s.payload
	src, dst := tcpip.AddrFromSlice(s.src.Addr().AsSlice()), tcpip.AddrFromSlice(s.dst.Addr().AsSlice())
	if s.v6 {
		header.IPv6(b[header.EthernetMinimumSize:]).Encode(&header.IPv6Fields{
			PayloadLength: uint16(ipLen - header.IPv6MinimumSize + ulen), TransportProtocol: proto, HopLimit: 64,
			SrcAddr: src, DstAddr: dst,
		})
		if s.hbh {
			ext := b[header.EthernetMinimumSize+header.IPv6MinimumSize : l4]
			copy(ext, []byte{uint8(proto), 0, 1, 4}) // PadN of 4 bytes
			header.IPv6(b[header.EthernetMinimumSize:]).SetNextHeader(uint8(header.IPv6HopByHopOptionsExtHdrIdentifier))
		}
	} else {
		ip := header.IPv4(b[header.EthernetMinimumSize:l4])
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(ipLen + ulen), TTL: 64, Protocol: uint8(proto),
			SrcAddr: src, DstAddr: dst, Options: opts,
		})
		ip.SetChecksum(^ip.CalculateChecksum())
	}
	header.UDP(b[l4:]).Encode(&header.UDPFields{
		SrcPort: s.src.Port(), DstPort: s.dst.Port(), Length: uint16(ulen),
	})
	return b
}

// TestUDPHeaders pins udpHeaders, udpSource and udpDest on frames built by
// gVisor's encoders: the offsets of a UDP packet's IP and UDP headers, and
// no offsets for anything else.
func TestUDPHeaders(t *testing.T) {
	for _, tc := range []struct {
		name   string
		frame  []byte
		l4     int // 0: not a UDP packet
		src    netip.AddrPort
		dstIP  netip.Addr
		dstPrt uint16
	}{
		{"ipv4", udpHeaderFrame(udpFrameSpec{src: udpSrc4, dst: udpDst4}), 34, udpSrc4, udpDst4.Addr(), 9},
		{"ipv4-options", udpHeaderFrame(udpFrameSpec{ipOpts: true, src: udpSrc4, dst: udpDst4}), 38, udpSrc4, udpDst4.Addr(), 9},
		{"ipv6", udpHeaderFrame(udpFrameSpec{v6: true, src: udpSrc6, dst: udpDst6}), 54, udpSrc6, udpDst6.Addr(), 9},
		{"ipv4-tcp", udpHeaderFrame(udpFrameSpec{proto: header.TCPProtocolNumber, src: udpSrc4, dst: udpDst4}), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv6-tcp", udpHeaderFrame(udpFrameSpec{v6: true, proto: header.TCPProtocolNumber, src: udpSrc6, dst: udpDst6}), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv6-ext-header", udpHeaderFrame(udpFrameSpec{v6: true, proto: tcpip.TransportProtocolNumber(header.IPv6RoutingExtHdrIdentifier), src: udpSrc6, dst: udpDst6}), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv4-first-fragment", ipv4Fragment(header.IPv4FlagMoreFragments, 0), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv4-later-fragment", ipv4Fragment(0, 24), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv6-fragment", udpHeaderFrame(udpFrameSpec{v6: true, proto: tcpip.TransportProtocolNumber(header.IPv6FragmentExtHdrIdentifier), src: udpSrc6, dst: udpDst6}), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv4-padded", append(udpHeaderFrame(udpFrameSpec{src: udpSrc4, dst: udpDst4}), make([]byte, 20)...), 34, udpSrc4, udpDst4.Addr(), 9},
		{"ipv4-ip-length-past-frame", udpHeaderFrame(udpFrameSpec{src: udpSrc4, dst: udpDst4, payload: 1}), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv6-ip-length-past-frame", udpHeaderFrame(udpFrameSpec{v6: true, src: udpSrc6, dst: udpDst6, payload: 1}), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv6-hop-by-hop", udpHeaderFrame(udpFrameSpec{v6: true, hbh: true, src: udpSrc6, dst: udpDst6}), 62, udpSrc6, udpDst6.Addr(), 9},
		{"ipv6-hop-by-hop-drop-option", ipv6Ext(header.IPv6HopByHopOptionsExtHdrIdentifier, 2, 0x41), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv6-dest-opts", ipv6Ext(header.IPv6DestinationOptionsExtHdrIdentifier, 2, 1), 62, udpSrc6, udpDst6.Addr(), 9},
		{"ipv6-dest-opts-drop-option", ipv6Ext(header.IPv6DestinationOptionsExtHdrIdentifier, 2, 0x81), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv6-routing-no-segment-left", ipv6Ext(header.IPv6RoutingExtHdrIdentifier, 3, 0), 62, udpSrc6, udpDst6.Addr(), 9},
		{"ipv6-routing-segment-left", ipv6Ext(header.IPv6RoutingExtHdrIdentifier, 3, 1), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv4-short-udp", udpHeaderFrame(udpFrameSpec{src: udpSrc4, dst: udpDst4})[:34+7], 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv4-short-ip", udpHeaderFrame(udpFrameSpec{src: udpSrc4, dst: udpDst4})[:14+19], 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"ipv6-short-ip", udpHeaderFrame(udpFrameSpec{v6: true, src: udpSrc6, dst: udpDst6})[:14+39], 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"short-ether", make([]byte, 13), 0, netip.AddrPort{}, netip.Addr{}, 0},
		{"arp", func() []byte {
			b := make([]byte, 64)
			header.Ethernet(b).Encode(&header.EthernetFields{Type: header.ARPProtocolNumber})
			return b
		}(), 0, netip.AddrPort{}, netip.Addr{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := bufpool.NewPacket()
			defer p.Release()
			p.Linear = append(p.Linear, tc.frame...)
			p.Len = len(p.Linear)
			l3, l4, ok := udpHeaders(p, ethLen)
			if want := tc.l4 != 0; ok != want {
				t.Fatalf("ok: got %v, want %v (l3 %d, l4 %d)", ok, want, l3, l4)
			}
			if !ok {
				return
			}
			if l3 != header.EthernetMinimumSize || l4 != tc.l4 {
				t.Errorf("offsets: got l3 %d l4 %d, want %d %d", l3, l4, header.EthernetMinimumSize, tc.l4)
			}
			if got := udpSource(p.Linear, l3, l4); got != tc.src {
				t.Errorf("udpSource: got %v, want %v", got, tc.src)
			}
			if got := udpDest(p.Linear, l3); got != tc.dstIP {
				t.Errorf("udpDest: got %v, want %v", got, tc.dstIP)
			}
			if got := header.UDP(p.Linear[l4:]).DestinationPort(); got != tc.dstPrt {
				t.Errorf("destination port: got %d, want %d", got, tc.dstPrt)
			}
		})
	}
}

// ipv4Fragment returns the headers of a UDP datagram as udpHeaderFrame
// builds them, made an IPv4 fragment with flags and offset (in bytes).
func ipv4Fragment(flags uint8, off uint16) []byte {
	b := udpHeaderFrame(udpFrameSpec{src: udpSrc4, dst: udpDst4})
	ip := header.IPv4(b[header.EthernetMinimumSize:])
	ip.SetFlagsFragmentOffset(flags, off)
	ip.SetChecksum(0)
	ip.SetChecksum(^ip.CalculateChecksum())
	return b
}

// ipv6Ext returns the headers of an IPv6 UDP datagram with an 8-byte
// extension header id before the UDP header, its byte at (of the header)
// set to v: an option's type at 2, a routing header's Segments Left at 3.
func ipv6Ext(id header.IPv6ExtensionHeaderIdentifier, at int, v byte) []byte {
	b := udpHeaderFrame(udpFrameSpec{v6: true, hbh: true, src: udpSrc6, dst: udpDst6})
	const ext = header.EthernetMinimumSize + header.IPv6MinimumSize
	header.IPv6(b[header.EthernetMinimumSize:]).SetNextHeader(uint8(id))
	if id != header.IPv6HopByHopOptionsExtHdrIdentifier && id != header.IPv6DestinationOptionsExtHdrIdentifier {
		clear(b[ext+2 : ext+hbhLen]) // no options
	}
	b[ext+at] = v
	return b
}

// TestUDPPayloadLen pins udpPayloadLen: the payload by the IP and UDP
// lengths, whatever follows the IP packet; a UDP length past the IP
// payload, or under 8, is malformed.
func TestUDPPayloadLen(t *testing.T) {
	for _, tc := range []struct {
		name      string
		v6, hbh   bool
		payload   int // the IP header's payload after the UDP header
		ulen      int // the UDP length field: 0 for 8+payload
		pad       int // bytes after the IP packet
		n         int
		malformed bool
	}{
		{name: "exact", payload: 100, n: 100},
		{name: "padded", payload: 100, pad: 46, n: 100},
		{name: "ipv6-padded", v6: true, payload: 5, pad: 200, n: 5},
		{name: "empty-padded", payload: 0, pad: 18, n: 0},
		{name: "udp-length-short", payload: 100, ulen: 8 + 60, n: 60},
		{name: "udp-length-past", payload: 100, ulen: 8 + 101, malformed: true},
		{name: "ipv6-udp-length-past", v6: true, payload: 100, ulen: 8 + 101, malformed: true},
		{name: "ipv6-hop-by-hop", v6: true, hbh: true, payload: 100, pad: 30, n: 100},
		{name: "ipv6-hop-by-hop-udp-length-past", v6: true, hbh: true, payload: 100, ulen: 8 + 101, malformed: true},
		{name: "udp-length-past-into-padding", payload: 100, ulen: 8 + 120, pad: 40, malformed: true},
		{name: "udp-length-under-8", payload: 100, ulen: 7, malformed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := udpFrameSpec{v6: tc.v6, hbh: tc.hbh, src: udpSrc4, dst: udpDst4, payload: tc.payload}
			if tc.v6 {
				spec.src, spec.dst = udpSrc6, udpDst6
			}
			p := bufpool.NewPacket()
			defer p.Release()
			p.Linear = append(p.Linear, udpHeaderFrame(spec)...)
			l4 := len(p.Linear) - header.UDPMinimumSize
			if tc.ulen != 0 {
				header.UDP(p.Linear[l4:]).SetLength(uint16(tc.ulen))
			}
			p.Linear = append(p.Linear, make([]byte, tc.payload+tc.pad)...)
			p.Len = len(p.Linear)
			l3, gotL4, ok := udpHeaders(p, ethLen)
			if !ok || gotL4 != l4 {
				t.Fatalf("udpHeaders: l4 %d, ok %v; want %d, true", gotL4, ok, l4)
			}
			n, ok := udpPayloadLen(p, l3, l4)
			if ok == tc.malformed || (ok && n != tc.n) {
				t.Errorf("udpPayloadLen: %d, ok %v; want %d, malformed %v", n, ok, tc.n, tc.malformed)
			}
		})
	}
}

// TestUDPHeadersNoAllocs pins the train lookup's header reads and checks
// (udpHeaders, udpPayloadLen, localAddrs), which every UDP packet meets
// while a TrainConn is bound, at no allocation.
func TestUDPHeadersNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	for _, s := range []udpFrameSpec{{src: udpSrc4, dst: udpDst4}, {v6: true, src: udpSrc6, dst: udpDst6}} {
		p := bufpool.NewPacket()
		p.Linear = append(p.Linear, udpHeaderFrame(s)...)
		p.Len = len(p.Linear)
		local := newLocalAddrs(map[tcpip.NICID][]tcpip.ProtocolAddress{nicID: {
			{Protocol: header.IPv4ProtocolNumber, AddressWithPrefix: tcpip.AddrFrom4(udpDst4.Addr().As4()).WithPrefix()},
			{Protocol: header.IPv6ProtocolNumber, AddressWithPrefix: tcpip.AddrFrom16(udpDst6.Addr().As16()).WithPrefix()},
		}})
		if a := testing.AllocsPerRun(500, func() {
			l3, l4, ok := udpHeaders(p, ethLen)
			if !ok || udpDest(p.Linear, l3) != s.dst.Addr() || udpSource(p.Linear, l3, l4) != s.src {
				t.Fatal("headers misread")
			}
			if _, ok := udpPayloadLen(p, l3, l4); !ok || !local.has(ipAddrs(p.Linear[l3:])) {
				t.Fatal("payload length or local address misread")
			}
		}); a != 0 {
			t.Errorf("v6 %v: allocations per packet: got %v, want 0", s.v6, a)
		}
		p.Release()
	}
}

// trainPacket builds a UDP train of segs datagrams of gso bytes (the last
// one last bytes, if not 0) as GRO leaves it: the headers in the linear
// part, the payload in frags of whole pages from pool (the last one
// partly), filled with a pattern.
// It returns the packet and its payload.
func trainPacket(t testing.TB, pool *bufpool.Pool, s udpFrameSpec, segs, gso, last int) (*bufpool.Packet, []byte) {
	t.Helper()
	total := (segs-1)*gso + last
	if last == 0 {
		total += gso
	}
	s.payload = total
	hdr := udpHeaderFrame(s)
	p := bufpool.NewPacket()
	p.Linear = append(p.Linear, hdr...)
	p.HdrLen = len(hdr)
	p.Len = len(hdr) + total
	var payload []byte
	for len(payload) < total {
		pg, err := pool.Get()
		if err != nil {
			t.Fatal(err)
		}
		b := pg.Bytes()[:min(len(pg.Bytes()), total-len(payload))]
		for i := range b {
			j := len(payload) + i
			b[i] = byte(j*7 + j>>8)
		}
		p.Frags = append(p.Frags, bufpool.Frag{Page: pg, Len: uint32(len(b))})
		payload = append(payload, b...)
	}
	p.GSOSize, p.Segs = uint16(gso), uint16(segs)
	p.CsumVerified = true // GRO merges only verified segments
	return p, payload
}

// TestSplitUDP checks the datagrams splitUDP hands gVisor for a UDP train:
// the train's headers with each datagram's lengths and a valid IPv4 header
// checksum, and each datagram's part of the payload, for IPv4 (with and
// without options) and IPv6, a short last datagram or not.
func TestSplitUDP(t *testing.T) {
	for _, tc := range []struct {
		name           string
		spec           udpFrameSpec
		segs, gso, end int
	}{
		{"ipv4", udpFrameSpec{src: udpSrc4, dst: udpDst4}, 4, 1000, 0},
		{"ipv4-short-last", udpFrameSpec{src: udpSrc4, dst: udpDst4}, 5, 600, 17},
		{"ipv4-options", udpFrameSpec{ipOpts: true, src: udpSrc4, dst: udpDst4}, 3, 1200, 0},
		{"ipv6", udpFrameSpec{v6: true, src: udpSrc6, dst: udpDst6}, 4, 1000, 0},
		{"ipv6-short-last", udpFrameSpec{v6: true, src: udpSrc6, dst: udpDst6}, 3, 1400, 1},
		{"ipv6-hop-by-hop", udpFrameSpec{v6: true, hbh: true, src: udpSrc6, dst: udpDst6}, 4, 1000, 0},
		{"ipv4-pages", udpFrameSpec{src: udpSrc4, dst: udpDst4}, 16, 1200, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := bufpool.New(bufpool.Config{Poison: true})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			p, payload := trainPacket(t, pool, tc.spec, tc.segs, tc.gso, tc.end)
			hdr := append([]byte(nil), p.Linear...)
			var c captureDispatcher
			ep := &linkEndpoint{}
			ep.Attach(&c)
			ep.Deliver(p)
			if got := len(c.got); got != tc.segs {
				t.Fatalf("datagrams delivered: got %d, want %d", got, tc.segs)
			}
			l4 := len(hdr) - header.UDPMinimumSize
			for i, d := range c.got {
				n := min(tc.gso, len(payload)-i*tc.gso)
				want := payload[i*tc.gso : i*tc.gso+n]
				if len(d) != len(hdr)+n || !bytes.Equal(d[len(hdr):], want) {
					t.Fatalf("datagram %d: got %d bytes, want %d of headers and %d of payload (the train's at %d)", i, len(d), len(hdr), n, i*tc.gso)
				}
				if !bytes.Equal(d[:header.EthernetMinimumSize], hdr[:header.EthernetMinimumSize]) {
					t.Errorf("datagram %d: Ethernet header % x, want % x", i, d[:header.EthernetMinimumSize], hdr[:header.EthernetMinimumSize])
				}
				if tc.spec.v6 {
					ip := header.IPv6(d[header.EthernetMinimumSize:])
					if got, want := int(ip.PayloadLength()), l4-header.EthernetMinimumSize-header.IPv6MinimumSize+header.UDPMinimumSize+n; got != want {
						t.Errorf("datagram %d: IPv6 payload length %d, want %d", i, got, want)
					}
				} else {
					ip := header.IPv4(d[header.EthernetMinimumSize:])
					if got, want := int(ip.TotalLength()), l4-header.EthernetMinimumSize+header.UDPMinimumSize+n; got != want {
						t.Errorf("datagram %d: IPv4 total length %d, want %d", i, got, want)
					}
					if !ip.IsChecksumValid() {
						t.Errorf("datagram %d: IPv4 header checksum %#x is not valid", i, ip.Checksum())
					}
				}
				u := header.UDP(d[l4:])
				if got, want := int(u.Length()), header.UDPMinimumSize+n; got != want {
					t.Errorf("datagram %d: UDP length %d, want %d", i, got, want)
				}
				if u.SourcePort() != tc.spec.src.Port() || u.DestinationPort() != tc.spec.dst.Port() {
					t.Errorf("datagram %d: ports %d -> %d, want %d -> %d", i, u.SourcePort(), u.DestinationPort(), tc.spec.src.Port(), tc.spec.dst.Port())
				}
			}
			if n := pool.InUse(); n != 0 {
				t.Errorf("pages in use after Deliver: got %d, want 0", n)
			}
		})
	}
}

// BenchmarkSplitUDP measures splitUDP per train (to a link endpoint
// without a dispatcher, which releases each datagram at once), by
// datagram size, for 16-datagram trains; and udpHeaders alone, which
// every UDP packet meets when a TrainConn is bound.
func BenchmarkSplitUDP(b *testing.B) {
	pool, err := bufpool.New(bufpool.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	for _, v6 := range []bool{false, true} {
		spec := udpFrameSpec{src: udpSrc4, dst: udpDst4}
		name := "ipv4"
		if v6 {
			spec, name = udpFrameSpec{v6: true, src: udpSrc6, dst: udpDst6}, "ipv6"
		}
		b.Run(name+"/headers", func(b *testing.B) {
			p, _ := trainPacket(b, pool, spec, 16, 64, 0)
			defer p.Release()
			b.ReportAllocs()
			for b.Loop() {
				if _, _, ok := udpHeaders(p, ethLen); !ok {
					b.Fatal("not a UDP packet")
				}
			}
		})
		for _, size := range []int{64, 1200} {
			b.Run(fmt.Sprintf("%s/%d", name, size), func(b *testing.B) {
				ep := &linkEndpoint{}
				p, _ := trainPacket(b, pool, spec, 16, size, 0)
				defer p.Release()
				l3, l4, _ := udpHeaders(p, ethLen)
				b.SetBytes(int64(16 * size))
				b.ReportAllocs()
				for b.Loop() {
					ep.splitUDP(p, l3, l4, nil)
				}
			})
		}
	}
}
