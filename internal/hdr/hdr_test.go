package hdr

import (
	"math/rand/v2"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// TestIPv6ExtLen pins the length rules against gVisor's extension header
// serializer: a hop-by-hop header with 14 bytes of padding options is 16
// bytes long (Hdr Ext Len 1).
func TestIPv6ExtLen(t *testing.T) {
	s := header.IPv6ExtHdrSerializer{header.IPv6SerializableHopByHopExtHdr{
		&header.IPv6RouterAlertOption{Value: header.IPv6RouterAlertMLD},
	}}
	b := make([]byte, s.Length())
	s.Serialize(header.TCPProtocolNumber, b)
	e := IPv6Ext(b)
	if got, want := e.Len(), len(b); got != want {
		t.Errorf("Len() = %d, want %d", got, want)
	}
	if got, want := e.NextHeader(), uint8(header.TCPProtocolNumber); got != want {
		t.Errorf("NextHeader() = %d, want %d", got, want)
	}
	// RFC 4302 section 2.2: an AH with a 96-bit ICV is 24 bytes, Payload
	// Len 4.
	if got := IPv6Ext([]byte{6, 4}).AHLen(); got != 24 {
		t.Errorf("AHLen() = %d, want 24", got)
	}
}

func TestVLANTag(t *testing.T) {
	tag := VLANTag([]byte{0x20, 0x05, 0x08, 0x00})
	if got, want := tag.TCI(), uint16(0x2005); got != want {
		t.Errorf("TCI() = %#x, want %#x", got, want)
	}
	if got, want := tag.EtherType(), uint16(header.IPv4ProtocolNumber); got != want {
		t.Errorf("EtherType() = %#x, want %#x", got, want)
	}
}

func TestIsIPv4Fragment(t *testing.T) {
	for _, tc := range []struct {
		flags  uint8
		offset uint16
		want   bool
	}{
		{0, 0, false},
		{header.IPv4FlagDontFragment, 0, false},
		{header.IPv4FlagMoreFragments, 0, true},
		{0, 8, true},
		{header.IPv4FlagDontFragment, 65528, true},
	} {
		ip := header.IPv4(make([]byte, header.IPv4MinimumSize))
		ip.SetFlagsFragmentOffset(tc.flags, tc.offset)
		if got := IsIPv4Fragment(ip); got != tc.want {
			t.Errorf("flags %#x offset %d: got %v, want %v", tc.flags, tc.offset, got, tc.want)
		}
	}
	ip := header.IPv4(make([]byte, header.IPv4MinimumSize))
	ip[6] = 0x80 // the reserved flag alone
	if IsIPv4Fragment(ip) {
		t.Error("reserved flag: got a fragment")
	}
}

// TestIPv4HeaderSum checks IPv4HeaderSum against gVisor's checksum over
// headers gVisor encodes, and over arbitrary bytes.
func TestIPv4HeaderSum(t *testing.T) {
	ip := header.IPv4(make([]byte, header.IPv4MinimumSize))
	ip.Encode(&header.IPv4Fields{
		TotalLength: 1500, ID: 7, Flags: header.IPv4FlagDontFragment, TTL: 64,
		Protocol: uint8(header.TCPProtocolNumber),
		SrcAddr:  tcpip.AddrFrom4([4]byte{10, 0, 0, 1}), DstAddr: tcpip.AddrFrom4([4]byte{10, 0, 0, 2}),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	if got := IPv4HeaderSum(ip); got != 0xffff {
		t.Errorf("valid header: got %#x, want 0xffff", got)
	}
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, header.IPv4MinimumSize)
	for range 10000 {
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if r.IntN(8) == 0 {
			clear(b) // the all-zero sum
		}
		if got, want := IPv4HeaderSum(b), checksum.Checksum(b, 0); got != want {
			t.Fatalf("% x: got %#x, want %#x", b, got, want)
		}
	}
}
