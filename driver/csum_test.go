package driver

import (
	"math"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

func TestVerifyChecksums(t *testing.T) {
	// Offsets into frames without a VLAN tag, IP options or IPv6
	// extension headers.
	const (
		ip4    = header.EthernetMinimumSize
		ip6    = header.EthernetMinimumSize
		l4v4   = ip4 + header.IPv4MinimumSize
		l4v6   = ip6 + header.IPv6MinimumSize
		tcpCs  = 16
		udpCs  = 6
		icmpCs = 2
	)
	// flip corrupts byte off of the frame.
	flip := func(off int) func([]byte) {
		return func(b []byte) { b[off] ^= 0x40 }
	}
	flipLast := func(b []byte) { b[len(b)-1] ^= 0x01 }
	tests := []struct {
		name   string
		spec   pkSpec
		mut    func([]byte)
		l4     bool
		want   Drop
		wantL3 Drop // result with l4 false; defaults to DropNone
	}{
		{name: "ipv4 tcp", spec: pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, payload: pkPayload(1000)}, l4: true},
		{name: "ipv4 tcp odd length", spec: pkSpec{l3: L3IPv4, proto: protoTCP, payload: pkPayload(333)}, l4: true},
		{name: "ipv4 tcp bad payload", spec: pkSpec{l3: L3IPv4, proto: protoTCP, payload: pkPayload(333)}, mut: flipLast, l4: true, want: DropBadL4Csum},
		{name: "ipv4 tcp bad checksum", spec: pkSpec{l3: L3IPv4, proto: protoTCP}, mut: flip(l4v4 + tcpCs), l4: true, want: DropBadL4Csum},
		{name: "ipv4 tcp bad pseudo-header address", spec: pkSpec{l3: L3IPv4, proto: protoTCP, payload: pkPayload(8)},
			mut: func(b []byte) { b[ip4+15] ^= 1; pkFixIPv4Csum(b) }, l4: true, want: DropBadL4Csum},
		{name: "ipv4 bad header checksum", spec: pkSpec{l3: L3IPv4, proto: protoTCP}, mut: flip(ip4 + 10), l4: true, want: DropBadIPCsum, wantL3: DropBadIPCsum},
		{name: "ipv4 bad ttl", spec: pkSpec{l3: L3IPv4, proto: protoUDP}, mut: flip(ip4 + 8), want: DropBadIPCsum, wantL3: DropBadIPCsum},
		{name: "ipv4 options bad header checksum", spec: pkSpec{l3: L3IPv4, ipv4Opts: header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}, proto: protoUDP},
			mut: flip(ip4 + 22), l4: true, want: DropBadIPCsum, wantL3: DropBadIPCsum},
		{name: "ipv4 udp", spec: pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(51)}, l4: true},
		{name: "ipv4 udp bad", spec: pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(51)}, mut: flipLast, l4: true, want: DropBadL4Csum},
		{name: "ipv4 udp zero checksum", spec: pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(51), csum: pkCsumZero}, l4: true},
		{name: "ipv4 udp padding ignored", spec: pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(2), pad: 16}, mut: flipLast, l4: true},
		{name: "ipv4 icmp", spec: pkSpec{l3: L3IPv4, proto: protoICMPv4, payload: pkPayload(56)}, l4: true},
		{name: "ipv4 icmp bad", spec: pkSpec{l3: L3IPv4, proto: protoICMPv4, payload: pkPayload(56)}, mut: flip(l4v4 + icmpCs), l4: true, want: DropBadL4Csum},
		{name: "ipv4 fragment l4 not checked", spec: pkSpec{l3: L3IPv4, proto: protoUDP, ipFlags: header.IPv4FlagMoreFragments, payload: pkPayload(64)}, mut: flipLast, l4: true},
		{name: "ipv4 fragment bad header checksum", spec: pkSpec{l3: L3IPv4, proto: protoUDP, fragOff: 8, payload: pkPayload(64)}, mut: flip(ip4 + 11), l4: true, want: DropBadIPCsum, wantL3: DropBadIPCsum},
		{name: "ipv4 other l4 not checked", spec: pkSpec{l3: L3IPv4, proto: 47, payload: pkPayload(64)}, mut: flipLast, l4: true},
		{name: "ipv6 tcp", spec: pkSpec{l3: L3IPv6, proto: protoTCP, payload: pkPayload(1001)}, l4: true},
		{name: "ipv6 tcp bad", spec: pkSpec{l3: L3IPv6, proto: protoTCP, payload: pkPayload(1001)}, mut: flip(l4v6 + tcpCs + 1), l4: true, want: DropBadL4Csum},
		{name: "ipv6 extension headers tcp", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoHopByHop, protoDestOpts}, proto: protoTCP, payload: pkPayload(77)}, l4: true},
		{name: "ipv6 extension headers tcp bad", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoHopByHop, protoDestOpts}, proto: protoTCP, payload: pkPayload(77)}, mut: flipLast, l4: true, want: DropBadL4Csum},
		{name: "ipv6 tcp bad pseudo-header address", spec: pkSpec{l3: L3IPv6, proto: protoTCP}, mut: flip(ip6 + 39), l4: true, want: DropBadL4Csum},
		{name: "ipv6 udp", spec: pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(10)}, l4: true},
		{name: "ipv6 udp bad", spec: pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(10)}, mut: flip(l4v6 + udpCs), l4: true, want: DropBadL4Csum},
		{name: "ipv6 udp zero checksum", spec: pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(10), csum: pkCsumZero}, l4: true, want: DropBadL4Csum},
		{name: "ipv6 udp zero checksum l3 only", spec: pkSpec{l3: L3IPv6, proto: protoUDP, payload: pkPayload(10), csum: pkCsumZero}},
		{name: "ipv6 icmpv6", spec: pkSpec{l3: L3IPv6, proto: protoICMPv6, payload: pkPayload(32)}, l4: true},
		{name: "ipv6 icmpv6 bad", spec: pkSpec{l3: L3IPv6, proto: protoICMPv6, payload: pkPayload(32)}, mut: flipLast, l4: true, want: DropBadL4Csum},
		{name: "ipv6 icmpv6 without pseudo-header", spec: pkSpec{l3: L3IPv6, proto: protoICMPv6, payload: pkPayload(32)},
			mut: func(b []byte) {
				m := header.ICMPv6(b[l4v6:])
				m.SetChecksum(0)
				m.SetChecksum(^checksum.Checksum(m, 0)) // ICMPv4 style

			}, l4: true, want: DropBadL4Csum},
		{name: "ipv6 fragment l4 not checked", spec: pkSpec{l3: L3IPv6, ext: []uint8{protoFragment}, proto: protoTCP, payload: pkPayload(20)}, mut: flipLast, l4: true},
		{name: "vlan ipv4 tcp", spec: pkSpec{vlanType: etherTypeVLAN, l3: L3IPv4, proto: protoTCP, payload: pkPayload(20)}, l4: true},
		{name: "vlan ipv4 tcp bad", spec: pkSpec{vlanType: etherTypeVLAN, l3: L3IPv4, proto: protoTCP, payload: pkPayload(20)}, mut: flipLast, l4: true, want: DropBadL4Csum},
		{name: "arp", spec: pkSpec{l3: L3ARP}, l4: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame := tt.spec.build()
			var fi FrameInfo
			if d := ParseFrame(frame, &fi); d != DropNone {
				t.Fatalf("ParseFrame: got %v, want %v", d, DropNone)
			}
			if tt.mut != nil {
				tt.mut(frame)
			}
			if got := VerifyChecksums(frame, &fi, tt.l4); got != tt.want {
				t.Errorf("VerifyChecksums(l4 %v): got %v, want %v", tt.l4, got, tt.want)
			}
			if got := VerifyChecksums(frame, &fi, false); got != tt.wantL3 {
				t.Errorf("VerifyChecksums(l4 false): got %v, want %v", got, tt.wantL3)
			}
		})
	}
}

// TestVerifyChecksumsBadInfo checks that an fi that does not describe the
// frame is reported, not trusted.
func TestVerifyChecksumsBadInfo(t *testing.T) {
	frame := (&pkSpec{l3: L3IPv4, proto: protoTCP, payload: pkPayload(20)}).build()
	var good FrameInfo
	if d := ParseFrame(frame, &good); d != DropNone {
		t.Fatalf("ParseFrame: got %v, want %v", d, DropNone)
	}
	tests := []struct {
		name string
		mut  func(fi *FrameInfo)
	}{
		{"ip length beyond frame", func(fi *FrameInfo) { fi.IPLen = len(frame) }},
		{"negative l2", func(fi *FrameInfo) { fi.L2Len = -1 }},
		{"l3 too short", func(fi *FrameInfo) { fi.L3Len = 8 }},
		{"headers beyond ip packet", func(fi *FrameInfo) { fi.L4Len = 60 }},
		{"ipv6 on ipv4 frame", func(fi *FrameInfo) { fi.L3 = L3IPv6 }},
		{"tcp shorter than a header", func(fi *FrameInfo) { fi.IPLen = 30; fi.L4Len = 0 }},
		{"huge l2", func(fi *FrameInfo) { fi.L2Len = math.MaxInt }},
		{"huge l3", func(fi *FrameInfo) { fi.L3Len = math.MaxInt }},
		{"huge l3 and l4", func(fi *FrameInfo) { fi.L3Len, fi.L4Len = math.MaxInt-10, math.MaxInt-10 }},
		{"negative ip length", func(fi *FrameInfo) { fi.IPLen = -1 }},
		{"huge ip length", func(fi *FrameInfo) { fi.L2Len, fi.IPLen = -math.MaxInt, math.MaxInt }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fi := good
			tt.mut(&fi)
			if got := VerifyChecksums(frame, &fi, true); got != DropBadIPLen {
				t.Errorf("VerifyChecksums: got %v, want %v", got, DropBadIPLen)
			}
		})
	}
}

func TestVerifyChecksumsAllocs(t *testing.T) {
	specs := []pkSpec{
		{l3: L3IPv4, proto: protoTCP, tcpTS: true, payload: pkPayload(1448)},
		{l3: L3IPv4, proto: protoUDP, payload: pkPayload(100)},
		{l3: L3IPv4, proto: protoICMPv4, payload: pkPayload(56)},
		{l3: L3IPv6, ext: []uint8{protoHopByHop}, proto: protoTCP, payload: pkPayload(1448)},
		{l3: L3IPv6, proto: protoUDP, payload: pkPayload(100)},
		{l3: L3IPv6, proto: protoICMPv6, payload: pkPayload(56)},
	}
	for _, s := range specs {
		frame := s.build()
		var fi FrameInfo
		if d := ParseFrame(frame, &fi); d != DropNone {
			t.Fatalf("ParseFrame: got %v, want %v", d, DropNone)
		}
		var d Drop
		if got := testing.AllocsPerRun(100, func() { d = VerifyChecksums(frame, &fi, true) }); got != 0 {
			t.Errorf("VerifyChecksums allocations: got %v, want 0", got)
		}
		if d != DropNone {
			t.Errorf("VerifyChecksums: got %v, want %v", d, DropNone)
		}
	}
}
