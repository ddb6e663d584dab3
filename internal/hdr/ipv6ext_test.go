package hdr

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// ipv6Chain returns an IPv6 header followed by the extension headers ext,
// each 8 bytes long (a 12-byte AH), and an upper-layer protocol of last.
func ipv6Chain(last uint8, ext ...uint8) []byte {
	b := make([]byte, header.IPv6MinimumSize)
	header.IPv6(b).Encode(&header.IPv6Fields{HopLimit: 64, SrcAddr: tcpip.AddrFrom16([16]byte{15: 1}), DstAddr: tcpip.AddrFrom16([16]byte{15: 2})})
	next := func(i int) uint8 {
		if i+1 < len(ext) {
			return ext[i+1]
		}
		return last
	}
	if len(ext) > 0 {
		b[6] = ext[0]
	} else {
		b[6] = last
	}
	for i, id := range ext {
		switch id {
		case uint8(header.IPv6AuthenticationExtHdrIdentifier):
			b = append(b, next(i), 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) // Payload Len 1: 12 bytes
		default: // hop-by-hop, routing, destination options, fragment: 8 bytes
			b = append(b, next(i), 0, 0, 0, 0, 0, 0, 0)
		}
	}
	return append(b, make([]byte, 20)...)
}

// TestIPv6SkipExtHdrs walks chains as ipv6_skip_exthdr does, stopping at a
// Fragment header wherever it is, and refuses chains cut short or too long.
func TestIPv6SkipExtHdrs(t *testing.T) {
	const (
		hbh  = uint8(header.IPv6HopByHopOptionsExtHdrIdentifier)
		rt   = uint8(header.IPv6RoutingExtHdrIdentifier)
		frag = uint8(header.IPv6FragmentExtHdrIdentifier)
		dst  = uint8(header.IPv6DestinationOptionsExtHdrIdentifier)
		ah   = uint8(header.IPv6AuthenticationExtHdrIdentifier)
		tcp  = uint8(header.TCPProtocolNumber)
		esp  = 50
	)
	many := make([]uint8, MaxIPv6ExtHdrs)
	for i := range many {
		many[i] = dst
	}
	for _, tc := range []struct {
		name   string
		ip     []byte
		wantNH uint8
		wantAt int
		wantOK bool
	}{
		{"no extension header", ipv6Chain(tcp), tcp, 40, true},
		{"fragment first", ipv6Chain(tcp, frag), frag, 40, true},
		{"fragment behind hop-by-hop", ipv6Chain(tcp, hbh, frag), frag, 48, true},
		{"fragment behind hop-by-hop, routing, AH, destination options", ipv6Chain(tcp, hbh, rt, ah, dst, frag), frag, 76, true},
		{"hop-by-hop, destination options, TCP", ipv6Chain(tcp, hbh, dst), tcp, 56, true},
		{"ESP ends the walk", ipv6Chain(tcp, hbh, esp), esp, 48, true},
		{"the bound", ipv6Chain(tcp, many...), tcp, 40 + 8*MaxIPv6ExtHdrs, true},
		{"past the bound", ipv6Chain(tcp, append(many, dst)...), 0, 0, false},
		{"shorter than the fixed header", ipv6Chain(tcp)[:39], 0, 0, false},
		{"a chain cut in a header", ipv6Chain(tcp, hbh, frag)[:44], 0, 0, false},
		{"a chain cut before a header's length", ipv6Chain(tcp, hbh)[:41], 0, 0, false},
		{"a chain ending at the cut", ipv6Chain(tcp, hbh, frag)[:48], frag, 48, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nh, at, ok := IPv6SkipExtHdrs(tc.ip)
			if nh != tc.wantNH || at != tc.wantAt || ok != tc.wantOK {
				t.Errorf("got (%d, %d, %v), want (%d, %d, %v)", nh, at, ok, tc.wantNH, tc.wantAt, tc.wantOK)
			}
		})
	}
}

// FuzzIPv6SkipExtHdrs: any input, no panic; an offset it reports is within
// the input.
func FuzzIPv6SkipExtHdrs(f *testing.F) {
	f.Add(ipv6Chain(6, 0, 44))
	f.Add(ipv6Chain(6, 0, 43, 51, 60))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, at, ok := IPv6SkipExtHdrs(b); ok && (at < header.IPv6MinimumSize || at > len(b)) {
			t.Fatalf("offset %d of %d bytes", at, len(b))
		}
	})
}
