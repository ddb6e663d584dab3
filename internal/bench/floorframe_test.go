package bench

import (
	"bytes"
	"encoding/binary"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

var (
	floorTestIP   = [4]byte{10, 77, 0, 2}
	floorTestPeer = [4]byte{10, 77, 0, 1}
	floorTestMAC  = [6]byte{2, 0x75, 0x73, 0x74, 0x6b, 1}
	peerTestMAC   = [6]byte{2, 0, 0, 0, 0, 0x42}
)

// testSeg describes a frame from the kernel's side for the floor tests.
type testSeg struct {
	dst            [4]byte // default floorTestIP
	sport, dport   uint16
	seq, ack       uint32
	flags          header.TCPFlags
	payload        []byte
	udp            bool
	frag           bool // MF set
	optMSS         bool // a SYN's MSS option, as Linux sends it
	zeroTotalLenIP bool // BIG TCP's tot_len 0
}

// frame builds the segment's Ethernet frame with gVisor's header encoders
// and full checksums.
func (s testSeg) frame() []byte {
	dst := s.dst
	if dst == ([4]byte{}) {
		dst = floorTestIP
	}
	l4len := header.TCPMinimumSize
	if s.optMSS {
		l4len += 4
	}
	proto := header.TCPProtocolNumber
	if s.udp {
		l4len, proto = header.UDPMinimumSize, header.UDPProtocolNumber
	}
	l4len += len(s.payload)
	b := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+l4len)
	header.Ethernet(b).Encode(&header.EthernetFields{SrcAddr: tcpip.LinkAddress(peerTestMAC[:]), DstAddr: tcpip.LinkAddress(floorTestMAC[:]), Type: header.IPv4ProtocolNumber})
	ip := header.IPv4(b[header.EthernetMinimumSize:])
	var fl uint8
	if s.frag {
		fl = header.IPv4FlagMoreFragments
	}
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(ip)), TTL: 64, Protocol: uint8(proto), Flags: fl,
		SrcAddr: tcpip.AddrFrom4(floorTestPeer), DstAddr: tcpip.AddrFrom4(dst)})
	ip.SetChecksum(^ip.CalculateChecksum())
	l4 := ip[header.IPv4MinimumSize:]
	src, dsta := tcpip.AddrFrom4(floorTestPeer), tcpip.AddrFrom4(dst)
	if s.udp {
		u := header.UDP(l4)
		u.Encode(&header.UDPFields{SrcPort: s.sport, DstPort: s.dport, Length: uint16(len(l4))})
		copy(u.Payload(), s.payload)
		u.SetChecksum(^u.CalculateChecksum(checksum.Combine(header.PseudoHeaderChecksum(proto, src, dsta, uint16(len(l4))), checksumOf(s.payload))))
	} else {
		hlen := header.TCPMinimumSize
		if s.optMSS {
			hlen += 4
		}
		t := header.TCP(l4)
		t.Encode(&header.TCPFields{SrcPort: s.sport, DstPort: s.dport, SeqNum: s.seq, AckNum: s.ack, DataOffset: uint8(hlen), Flags: s.flags, WindowSize: 64240})
		if s.optMSS {
			header.EncodeMSSOption(1460, t[header.TCPMinimumSize:])
		}
		copy(l4[hlen:], s.payload)
		t.SetChecksum(^t.CalculateChecksum(checksum.Combine(header.PseudoHeaderChecksum(proto, src, dsta, uint16(len(l4))), checksumOf(s.payload))))
	}
	if s.zeroTotalLenIP {
		ip.SetTotalLength(0)
		ip.SetChecksum(0)
		ip.SetChecksum(^ip.CalculateChecksum())
	}
	return b
}

func checksumOf(b []byte) uint16 { return refSum(b, 0) }

// refSum is RFC 1071's sum, written out as the RFC's example does: the
// reference the floor's checksums are checked against.
func refSum(b []byte, initial uint16) uint16 {
	s := uint32(initial)
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// checkReply checks the reply frame's Ethernet and IPv4 headers and its
// L4 checksum against refSum and gVisor's validators, and returns the L4
// bytes.
func checkReply(t *testing.T, b []byte, proto tcpip.TransportProtocolNumber) []byte {
	t.Helper()
	eth := header.Ethernet(b)
	if got, want := eth.DestinationAddress(), tcpip.LinkAddress(peerTestMAC[:]); got != want {
		t.Errorf("dst MAC: got %v, want %v", got, want)
	}
	if got, want := eth.SourceAddress(), tcpip.LinkAddress(floorTestMAC[:]); got != want {
		t.Errorf("src MAC: got %v, want %v", got, want)
	}
	ip := header.IPv4(b[header.EthernetMinimumSize:])
	if !ip.IsValid(len(ip)) || int(ip.TotalLength()) != len(ip) {
		t.Fatalf("IPv4 header not valid for %d bytes: total length %d", len(ip), ip.TotalLength())
	}
	if !ip.IsChecksumValid() || refSum(ip[:header.IPv4MinimumSize], 0) != 0xffff {
		t.Errorf("IPv4 checksum %#04x not valid", ip.Checksum())
	}
	if ip.SourceAddress() != tcpip.AddrFrom4(floorTestIP) || ip.DestinationAddress() != tcpip.AddrFrom4(floorTestPeer) ||
		ip.TransportProtocol() != proto || ip.TTL() != 64 || ip.Flags() != header.IPv4FlagDontFragment {
		t.Errorf("IPv4 header: src %v dst %v proto %d ttl %d flags %d", ip.SourceAddress(), ip.DestinationAddress(), ip.TransportProtocol(), ip.TTL(), ip.Flags())
	}
	l4 := ip.Payload()
	// The pseudo-header (RFC 793 section 3.1) with the segment sums to
	// all ones when the checksum is right.
	var pseudo [12]byte
	copy(pseudo[0:], floorTestIP[:])
	copy(pseudo[4:], floorTestPeer[:])
	pseudo[9] = uint8(proto)
	binary.BigEndian.PutUint16(pseudo[10:], uint16(len(l4)))
	if got := refSum(l4, refSum(pseudo[:], 0)); got != 0xffff {
		t.Errorf("L4 checksum: the segment sums to %#04x, want 0xffff", got)
	}
	src, dst := ip.SourceAddress(), ip.DestinationAddress()
	switch proto {
	case header.TCPProtocolNumber:
		tcp := header.TCP(l4)
		if !tcp.IsChecksumValid(src, dst, checksumOf(tcp.Payload()), uint16(len(tcp.Payload()))) {
			t.Errorf("gVisor: TCP checksum %#04x not valid", tcp.Checksum())
		}
	case header.UDPProtocolNumber:
		u := header.UDP(l4)
		if u.Checksum() == 0 {
			t.Errorf("UDP checksum 0: the floor always computes one")
		}
		if !u.IsChecksumValid(src, dst, checksumOf(u.Payload())) {
			t.Errorf("gVisor: UDP checksum %#04x not valid", u.Checksum())
		}
	}
	return l4
}

func arpRequest(target [4]byte, op uint16) []byte {
	b := make([]byte, header.EthernetMinimumSize+header.ARPSize)
	header.Ethernet(b).Encode(&header.EthernetFields{SrcAddr: tcpip.LinkAddress(peerTestMAC[:]), DstAddr: "\xff\xff\xff\xff\xff\xff", Type: header.ARPProtocolNumber})
	a := header.ARP(b[header.EthernetMinimumSize:])
	a.SetIPv4OverEthernet()
	a.SetOp(header.ARPOp(op))
	copy(a.HardwareAddressSender(), peerTestMAC[:])
	copy(a.ProtocolAddressSender(), floorTestPeer[:])
	copy(a.ProtocolAddressTarget(), target[:])
	return b
}

func TestFloorReflectARP(t *testing.T) {
	tests := []struct {
		name   string
		target [4]byte
		op     uint16
		want   bool
	}{
		{"request for us", floorTestIP, 1, true},
		{"request for another", floorTestPeer, 1, false},
		{"reply", floorTestIP, 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := make([]byte, 128)
			n := floorReflect(arpRequest(tt.target, tt.op), out, floorTestIP, floorTestMAC, 1460)
			if (n > 0) != tt.want {
				t.Fatalf("got length %d, want a reply %v", n, tt.want)
			}
			if n == 0 {
				return
			}
			if n != 42 {
				t.Fatalf("got length %d, want 42", n)
			}
			a := header.ARP(out[header.EthernetMinimumSize:n])
			if !a.IsValid() || a.Op() != header.ARPReply || !bytes.Equal(a.HardwareAddressSender(), floorTestMAC[:]) ||
				!bytes.Equal(a.ProtocolAddressSender(), floorTestIP[:]) || !bytes.Equal(a.HardwareAddressTarget(), peerTestMAC[:]) ||
				!bytes.Equal(a.ProtocolAddressTarget(), floorTestPeer[:]) {
				t.Errorf("ARP reply %x", out[:n])
			}
			if got := header.Ethernet(out).DestinationAddress(); got != tcpip.LinkAddress(peerTestMAC[:]) {
				t.Errorf("dst MAC: got %v, want the requester's", got)
			}
		})
	}
}

func TestFloorReflectTCP(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789abcdefg"), 7) // 119 B: odd, for the checksum's tail
	tests := []struct {
		name      string
		seg       testSeg
		want      bool
		seq, ack  uint32
		flags     header.TCPFlags
		mss       uint16 // 0: no option
		payload   []byte
		headerLen int
	}{
		{"SYN", testSeg{sport: 40000, dport: 7, seq: 1000, flags: header.TCPFlagSyn, optMSS: true}, true,
			floorISN(1000), 1001, header.TCPFlagSyn | header.TCPFlagAck, 1460, nil, 24},
		{"data", testSeg{sport: 40000, dport: 7, seq: 1001, ack: 77, flags: header.TCPFlagAck | header.TCPFlagPsh, payload: payload}, true,
			77, 1001 + 119, header.TCPFlagAck | header.TCPFlagPsh, 0, payload, 20},
		{"data with FIN", testSeg{sport: 40000, dport: 7, seq: 5, ack: 9, flags: header.TCPFlagAck | header.TCPFlagFin, payload: payload[:64]}, true,
			9, 5 + 64 + 1, header.TCPFlagAck | header.TCPFlagPsh | header.TCPFlagFin, 0, payload[:64], 20},
		{"FIN", testSeg{sport: 40000, dport: 7, seq: 0xffffffff, ack: 9, flags: header.TCPFlagAck | header.TCPFlagFin}, true,
			9, 0, header.TCPFlagAck | header.TCPFlagFin, 0, nil, 20},
		{"pure ACK", testSeg{sport: 40000, dport: 7, seq: 5, ack: 9, flags: header.TCPFlagAck}, false, 0, 0, 0, 0, nil, 0},
		{"RST", testSeg{sport: 40000, dport: 7, seq: 5, flags: header.TCPFlagRst | header.TCPFlagAck}, false, 0, 0, 0, 0, nil, 0},
		{"SYN-ACK", testSeg{sport: 40000, dport: 7, seq: 5, flags: header.TCPFlagSyn | header.TCPFlagAck}, false, 0, 0, 0, 0, nil, 0},
		{"data without ACK", testSeg{sport: 40000, dport: 7, seq: 5, payload: payload}, false, 0, 0, 0, 0, nil, 0},
		{"to another address", testSeg{dst: floorTestPeer, sport: 40000, dport: 7, seq: 5, ack: 9, flags: header.TCPFlagAck, payload: payload}, false, 0, 0, 0, 0, nil, 0},
		{"fragment", testSeg{sport: 40000, dport: 7, seq: 5, ack: 9, flags: header.TCPFlagAck, payload: payload, frag: true}, false, 0, 0, 0, 0, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.seg.frame()
			out := make([]byte, len(in)+8)
			n := floorReflect(in, out, floorTestIP, floorTestMAC, 1460)
			if (n > 0) != tt.want {
				t.Fatalf("got length %d, want an answer %v", n, tt.want)
			}
			if n == 0 {
				return
			}
			tcp := header.TCP(checkReply(t, out[:n], header.TCPProtocolNumber))
			if tcp.SourcePort() != tt.seg.dport || tcp.DestinationPort() != tt.seg.sport {
				t.Errorf("ports: got %d -> %d, want %d -> %d", tcp.SourcePort(), tcp.DestinationPort(), tt.seg.dport, tt.seg.sport)
			}
			if tcp.SequenceNumber() != tt.seq || tcp.AckNumber() != tt.ack || tcp.Flags() != tt.flags {
				t.Errorf("got seq %d ack %d flags %v, want %d %d %v", tcp.SequenceNumber(), tcp.AckNumber(), tcp.Flags(), tt.seq, tt.ack, tt.flags)
			}
			if int(tcp.DataOffset()) != tt.headerLen || tcp.WindowSize() != 0xffff {
				t.Errorf("got data offset %d window %d, want %d 65535", tcp.DataOffset(), tcp.WindowSize(), tt.headerLen)
			}
			if opts := header.ParseSynOptions(tcp.Options(), true); tt.mss != 0 && opts.MSS != tt.mss {
				t.Errorf("MSS option: got %d, want %d", opts.MSS, tt.mss)
			}
			if !bytes.Equal(tcp.Payload(), tt.payload) {
				t.Errorf("payload: got %d bytes, want %d echoed", len(tcp.Payload()), len(tt.payload))
			}
		})
	}
}

func TestFloorReflectUDP(t *testing.T) {
	for _, size := range []int{0, 1, 64, 1471} {
		payload := make([]byte, size)
		for i := range payload {
			payload[i] = byte(i*7 + 3)
		}
		seg := testSeg{udp: true, sport: 50000, dport: 7, payload: payload}
		in := seg.frame()
		out := make([]byte, len(in)+8)
		n := floorReflect(in, out, floorTestIP, floorTestMAC, 1460)
		if n != len(in) {
			t.Fatalf("%d B: got length %d, want %d", size, n, len(in))
		}
		u := header.UDP(checkReply(t, out[:n], header.UDPProtocolNumber))
		if u.SourcePort() != 7 || u.DestinationPort() != 50000 || !bytes.Equal(u.Payload(), payload) {
			t.Errorf("%d B: got ports %d -> %d and %d bytes, want 7 -> 50000 and the payload", size, u.SourcePort(), u.DestinationPort(), len(u.Payload()))
		}
	}
}

func TestFloorReflectShortOrForeign(t *testing.T) {
	full := testSeg{sport: 1, dport: 7, seq: 1, ack: 1, flags: header.TCPFlagAck, payload: []byte("x")}.frame()
	ipv6 := append([]byte(nil), full...)
	binary.BigEndian.PutUint16(ipv6[12:], 0x86dd)
	for name, in := range map[string][]byte{"empty": nil, "ethernet only": full[:14], "IP header cut": full[:30],
		"TCP header cut": full[:40], "IPv6 ethertype": ipv6, "ARP cut": arpRequest(floorTestIP, 1)[:30]} {
		out := make([]byte, 2048)
		if n := floorReflect(in, out, floorTestIP, floorTestMAC, 1460); n != 0 {
			t.Errorf("%s: got an answer of %d bytes, want none", name, n)
		}
	}
}

func TestFloorSink(t *testing.T) {
	s := &floorSink{ip: floorTestIP, mac: floorTestMAC, mss: 8960}
	out := make([]byte, 128)
	type step struct {
		name  string
		seg   testSeg
		ack   uint32 // 0: no answer
		flags header.TCPFlags
		bytes uint64 // counted so far
	}
	data := make([]byte, 3000)
	steps := []step{
		{"SYN", testSeg{sport: 40000, dport: 5001, seq: 100, flags: header.TCPFlagSyn, optMSS: true}, 101, header.TCPFlagSyn | header.TCPFlagAck, 0},
		{"handshake ACK", testSeg{sport: 40000, dport: 5001, seq: 101, ack: floorISN(100) + 1, flags: header.TCPFlagAck}, 0, 0, 0},
		{"data", testSeg{sport: 40000, dport: 5001, seq: 101, ack: floorISN(100) + 1, flags: header.TCPFlagAck, payload: data}, 3101, header.TCPFlagAck, 3000},
		{"GSO frame, tot_len 0", testSeg{sport: 40000, dport: 5001, seq: 3101, ack: 1, flags: header.TCPFlagAck, payload: data, zeroTotalLenIP: true}, 6101, header.TCPFlagAck, 6000},
		{"gap", testSeg{sport: 40000, dport: 5001, seq: 9101, ack: 1, flags: header.TCPFlagAck, payload: data}, 6101, header.TCPFlagAck, 6000},
		{"retransmission, partly new", testSeg{sport: 40000, dport: 5001, seq: 4101, ack: 1, flags: header.TCPFlagAck, payload: data}, 7101, header.TCPFlagAck, 7000},
		{"second flow", testSeg{sport: 40001, dport: 5001, seq: 7, flags: header.TCPFlagSyn}, 8, header.TCPFlagSyn | header.TCPFlagAck, 7000},
		{"second flow data", testSeg{sport: 40001, dport: 5001, seq: 8, ack: 1, flags: header.TCPFlagAck, payload: data[:100]}, 108, header.TCPFlagAck, 7100},
		{"FIN with data", testSeg{sport: 40000, dport: 5001, seq: 7101, ack: 1, flags: header.TCPFlagAck | header.TCPFlagFin, payload: data[:10]}, 7112, header.TCPFlagAck | header.TCPFlagFin, 7110},
		{"RST", testSeg{sport: 40001, dport: 5001, seq: 108, flags: header.TCPFlagRst}, 0, 0, 7110},
	}
	for _, st := range steps {
		in := st.seg.frame()
		n := s.step(in, out)
		if s.bytes != st.bytes {
			t.Errorf("%s: counted %d bytes, want %d", st.name, s.bytes, st.bytes)
		}
		if (n > 0) != (st.ack != 0) {
			t.Fatalf("%s: got an answer of %d bytes, want one %v", st.name, n, st.ack != 0)
		}
		if n == 0 {
			continue
		}
		tcp := header.TCP(checkReply(t, out[:n], header.TCPProtocolNumber))
		if tcp.AckNumber() != st.ack || tcp.Flags() != st.flags || len(tcp.Payload()) != 0 {
			t.Errorf("%s: got ack %d flags %v payload %d B, want ack %d flags %v, no payload", st.name, tcp.AckNumber(), tcp.Flags(), len(tcp.Payload()), st.ack, st.flags)
		}
		if st.flags&header.TCPFlagSyn != 0 {
			opts := header.ParseSynOptions(tcp.Options(), true)
			if opts.MSS != 8960 || opts.WS != floorWScale || tcp.SequenceNumber() != floorISN(st.seg.seq) {
				t.Errorf("%s: got MSS %d wscale %d seq %d, want 8960, %d, %d", st.name, opts.MSS, opts.WS, tcp.SequenceNumber(), floorWScale, floorISN(st.seg.seq))
			}
		} else if tcp.SequenceNumber() != st.seg.ack {
			t.Errorf("%s: got seq %d, want the peer's ack %d", st.name, tcp.SequenceNumber(), st.seg.ack)
		}
	}
	if s.gaps != 1 || s.retrans != 1 || s.segs != 6 {
		t.Errorf("got gaps %d retrans %d segs %d, want 1 1 6", s.gaps, s.retrans, s.segs)
	}
}

func TestFloorSinkFlowsBounded(t *testing.T) {
	s := &floorSink{}
	for p := range uint16(3 * floorSinkFlows) {
		s.flow(p).next = uint32(p)
	}
	if s.nflow != floorSinkFlows {
		t.Fatalf("got %d flows, want %d", s.nflow, floorSinkFlows)
	}
	// The newest flows stay; the oldest made room.
	last := uint16(3*floorSinkFlows - 1)
	if f := s.flow(last); f.next != uint32(last) {
		t.Errorf("flow %d: got next %d, want %d", last, f.next, last)
	}
}

func TestFloorNoAllocs(t *testing.T) {
	data := testSeg{sport: 1, dport: 7, seq: 1, ack: 1, flags: header.TCPFlagAck, payload: make([]byte, 64)}.frame()
	udp := testSeg{udp: true, sport: 1, dport: 7, payload: make([]byte, 64)}.frame()
	syn := testSeg{sport: 1, dport: 5001, seq: 1, flags: header.TCPFlagSyn}.frame()
	out := make([]byte, 2048)
	s := &floorSink{ip: floorTestIP, mac: floorTestMAC, mss: 1460}
	if n := testing.AllocsPerRun(100, func() {
		floorReflect(data, out, floorTestIP, floorTestMAC, 1460)
		floorReflect(udp, out, floorTestIP, floorTestMAC, 1460)
		s.step(syn, out)
		s.step(data, out)
	}); n != 0 {
		t.Errorf("got %v allocations per frame, want 0", n)
	}
}
