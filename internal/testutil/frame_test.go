package testutil

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

func TestMain(m *testing.M) { Main(m) }

// TestFrameBuild decodes what Build encodes with gVisor's header views:
// lengths, addresses, ports, payload and each checksum mode.
func TestFrameBuild(t *testing.T) {
	v4s, v4d := tcpip.AddrFrom4([4]byte{192, 0, 2, 2}), tcpip.AddrFrom4([4]byte{192, 0, 2, 1})
	v6s, v6d := tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 2}), tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 1})
	payload := []byte("0123456789abcdefg")
	for _, tc := range []struct {
		name string
		f    Frame
	}{
		{"tcp4", Frame{Src: v4s, Dst: v4d, SrcPort: 1, DstPort: 2, Seq: 7, Flags: header.TCPFlagAck, TCPOptions: []byte{1, 1, 1, 1}}},
		{"udp4", Frame{Src: v4s, Dst: v4d, Proto: header.UDPProtocolNumber, SrcPort: 1, DstPort: 2}},
		{"tcp6", Frame{Src: v6s, Dst: v6d, SrcPort: 1, DstPort: 2, Headroom: 10}},
		{"udp6", Frame{Src: v6s, Dst: v6d, Proto: header.UDPProtocolNumber, SrcPort: 1, DstPort: 2}},
		{"udp4-partial", Frame{Src: v4s, Dst: v4d, Proto: header.UDPProtocolNumber, Csum: CsumPartial}},
		{"tcp6-zero", Frame{Src: v6s, Dst: v6d, Csum: CsumZero}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.f
			f.Payload = payload
			b := f.Build()
			if got, want := len(b), f.L4Off()+f.L4HeaderLen()+len(payload); got != want {
				t.Fatalf("length: got %d, want %d", got, want)
			}
			ip := b[f.L3Off():]
			var src, dst tcpip.Address
			if f.v6() {
				h := header.IPv6(ip)
				if !h.IsValid(len(ip)) || h.TransportProtocol() != f.Proto && !(f.Proto == 0 && h.TransportProtocol() == header.TCPProtocolNumber) {
					t.Fatalf("IPv6 header invalid: % x", ip[:40])
				}
				src, dst = h.SourceAddress(), h.DestinationAddress()
			} else {
				h := header.IPv4(ip)
				if !h.IsValid(len(ip)) || !h.IsChecksumValid() {
					t.Fatalf("IPv4 header invalid: % x", ip[:20])
				}
				src, dst = h.SourceAddress(), h.DestinationAddress()
			}
			if src != f.Src || dst != f.Dst {
				t.Errorf("addresses: got %v -> %v, want %v -> %v", src, dst, f.Src, f.Dst)
			}
			seg := b[f.L4Off():]
			if !bytes.Equal(seg[f.L4HeaderLen():], payload) {
				t.Errorf("payload: got %q, want %q", seg[f.L4HeaderLen():], payload)
			}
			proto := f.Proto
			if proto == 0 {
				proto = header.TCPProtocolNumber
			}
			pseudo := header.PseudoHeaderChecksum(proto, f.Src, f.Dst, uint16(len(seg)))
			stored := uint16(seg[f.CsumOffset()])<<8 | uint16(seg[f.CsumOffset()+1])
			switch f.Csum {
			case CsumFull:
				if got := checksum.Checksum(seg, pseudo); got != 0xffff {
					t.Errorf("full checksum does not verify: sum %#04x", got)
				}
			case CsumPartial:
				if stored != pseudo {
					t.Errorf("partial checksum: got %#04x, want %#04x", stored, pseudo)
				}
			case CsumZero:
				if stored != 0 {
					t.Errorf("zero checksum: got %#04x", stored)
				}
			}
		})
	}
}
