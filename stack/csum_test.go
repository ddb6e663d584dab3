package stack

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/bufpool"
)

// csumFrame builds an Ethernet/IPv4 frame of a TCP segment or UDP datagram
// with 100 bytes of payload and right checksums.
func csumFrame(udp bool) []byte {
	const n = 100
	l4Len := header.TCPMinimumSize
	proto := header.TCPProtocolNumber
	if udp {
		l4Len, proto = header.UDPMinimumSize, header.UDPProtocolNumber
	}
	f := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+l4Len+n)
	header.Ethernet(f).Encode(&header.EthernetFields{Type: header.IPv4ProtocolNumber})
	src, dst := tcpip.AddrFrom4([4]byte{10, 0, 0, 1}), tcpip.AddrFrom4([4]byte{10, 0, 0, 2})
	ip := header.IPv4(f[header.EthernetMinimumSize:])
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(f) - header.EthernetMinimumSize), TTL: 64,
		Protocol: uint8(proto), SrcAddr: src, DstAddr: dst})
	ip.SetChecksum(^ip.CalculateChecksum())
	l4 := f[header.EthernetMinimumSize+header.IPv4MinimumSize:]
	for i := range n {
		l4[l4Len+i] = byte(i)
	}
	xsum := header.PseudoHeaderChecksum(proto, src, dst, uint16(len(l4)))
	xsum = checksum.Checksum(l4[l4Len:], xsum)
	if udp {
		u := header.UDP(l4)
		u.Encode(&header.UDPFields{SrcPort: 1, DstPort: 2, Length: uint16(len(l4))})
		u.SetChecksum(^u.CalculateChecksum(xsum))
	} else {
		t := header.TCP(l4)
		t.Encode(&header.TCPFields{SrcPort: 1, DstPort: 2, DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagAck, WindowSize: 100})
		t.SetChecksum(^t.CalculateChecksum(xsum))
	}
	return f
}

// TestBadChecksumDropped: a packet nobody verified (the NIC model found a
// checksum bad and handed it up as CHECKSUM_NONE, and GRO found it bad
// too) is dropped before gVisor and counted as TcpInCsumErrors,
// UdpInCsumErrors or a bad IPv4 header; it still shows in the pcap. A good
// unverified packet, and a verified one whatever its bytes, go to gVisor.
func TestBadChecksumDropped(t *testing.T) {
	var held []*gstack.PacketBuffer
	var pcap bytes.Buffer
	pw, err := NewPcapWriter(&pcap)
	if err != nil {
		t.Fatal(err)
	}
	ep := &linkEndpoint{pcap: pw}
	ep.Attach(&keepDispatcher{keep: &held})
	defer func() {
		for _, pb := range held {
			pb.DecRef()
		}
	}()
	send := func(f []byte, verified bool) {
		p := bufpool.NewPacket()
		p.Linear = append(p.Linear, f...)
		p.Len, p.HdrLen, p.CsumVerified = len(f), len(f)-100, verified
		ep.Deliver(p)
	}
	badTCP, badUDP, badIP := csumFrame(false), csumFrame(true), csumFrame(true)
	badTCP[len(badTCP)-1] ^= 1
	badUDP[len(badUDP)-1] ^= 1
	badIP[header.EthernetMinimumSize+8]-- // the TTL
	for _, f := range [][]byte{badTCP, badUDP, badIP} {
		send(f, false)
	}
	if len(held) != 0 {
		t.Errorf("bad packets delivered to gVisor: got %d, want 0", len(held))
	}
	if got := [3]uint64{ep.csum.tcp.Load(), ep.csum.udp.Load(), ep.csum.ip.Load()}; got != [3]uint64{1, 1, 1} {
		t.Errorf("tcp, udp, ip checksum errors: got %v, want [1 1 1]", got)
	}
	// pcap: the 24-byte file header, then a 16-byte record header and
	// the frame, each.
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	ep.pcap = nil
	if got, want := pcap.Len(), 24+3*16+len(badTCP)+len(badUDP)+len(badIP); got != want {
		t.Errorf("pcap bytes for the dropped packets: got %d, want %d", got, want)
	}
	send(csumFrame(false), false)
	send(csumFrame(true), false)
	send(badTCP, true) // vouched for: not looked at
	if len(held) != 3 {
		t.Errorf("good or verified packets delivered to gVisor: got %d, want 3", len(held))
	}
	if got := ep.csum.tcp.Load() + ep.csum.udp.Load() + ep.csum.ip.Load(); got != 3 {
		t.Errorf("checksum errors after good packets: got %d, want 3", got)
	}
}
