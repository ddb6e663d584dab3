package stack

import (
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// fragFrame builds an Ethernet frame from 192.0.2.2 or 2001:db8::2 to the
// test stack's address (wireStack), headroom bytes first, carrying payload
// as UDP with the IPv6 extension headers ext: with a Fragment header among
// them, payload is the fragment's (no UDP header is written).
func fragFrame(headroom int, v6 bool, ext header.IPv6ExtHdrSerializer, ipFlags uint8, payload []byte) []byte {
	f := testutil.Frame{
		Headroom: headroom,
		SrcMAC:   tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 2}), DstMAC: tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 1}),
		Src: tcpip.AddrFrom4([4]byte{192, 0, 2, 2}), Dst: tcpip.AddrFrom4([4]byte{192, 0, 2, 1}),
		IPFlags: ipFlags, ID: 7,
		Proto: header.UDPProtocolNumber, SrcPort: 5000, DstPort: 5002,
		Payload: payload,
	}
	if v6 {
		f.Src = tcpip.AddrFrom16(netip.MustParseAddr("2001:db8::2").As16())
		f.Dst = tcpip.AddrFrom16(netip.MustParseAddr("2001:db8::1").As16())
		f.IPv6Ext = ext
		for _, e := range ext {
			if _, ok := e.(*header.IPv6SerializableFragmentExtHdr); ok {
				f.NoL4Header = true
			}
		}
	}
	return f.Build()
}

func hopByHop() header.IPv6SerializableHopByHopExtHdr {
	return header.IPv6SerializableHopByHopExtHdr{&header.IPv6RouterAlertOption{Value: header.IPv6RouterAlertMLD}}
}

func fragHdr() *header.IPv6SerializableFragmentExtHdr {
	return &header.IPv6SerializableFragmentExtHdr{M: true, Identification: 0x01020304}
}

// TestIsIPFragment: IPv4 fragments by MF or offset, IPv6 fragments by a
// Fragment header anywhere in the chain; frames too short for their
// headers say no without a panic (a linear part of a short header copy),
// an IPv6 chain cut by the linear part's end says yes (copied, never lent).
func TestIsIPFragment(t *testing.T) {
	p := make([]byte, 64)
	v4 := fragFrame(0, false, nil, 0, p)
	v4mf := fragFrame(0, false, nil, header.IPv4FlagMoreFragments, p)
	v6 := fragFrame(0, true, nil, 0, p)
	v6frag := fragFrame(0, true, header.IPv6ExtHdrSerializer{fragHdr()}, 0, p)
	v6hbhFrag := fragFrame(0, true, header.IPv6ExtHdrSerializer{hopByHop(), fragHdr()}, 0, p)
	v6hbhDst := fragFrame(0, true, header.IPv6ExtHdrSerializer{hopByHop(), header.IPv6SerializableHopByHopExtHdr(hopByHop())}, 0, p)
	v6hbhDst[ethLen+header.IPv6MinimumSize] = uint8(header.IPv6DestinationOptionsExtHdrIdentifier) // the second header is destination options
	// An 802.1Q tag left in place before an IPv4 fragment's header.
	vlan := append(append(append([]byte(nil), v4mf[:12]...), 0x81, 0x00, 0, 5), v4mf[12:]...)
	for _, tc := range []struct {
		name  string
		frame []byte
		l2    int
		want  bool
	}{
		{"empty", nil, ethLen, false},
		{"8 bytes of a header copy", v4mf[:8], ethLen, false},
		{"the Ethernet header only", v4mf[:ethLen], ethLen, false},
		{"IPv4 header cut", v4mf[:ethLen+19], ethLen, false},
		{"IPv4", v4, ethLen, false},
		{"IPv4 MF", v4mf, ethLen, true},
		{"IPv4 MF behind a VLAN tag", vlan, ethLen, true},
		{"IPv6 header cut", v6frag[:ethLen+39], ethLen, false},
		{"IPv6", v6, ethLen, false},
		{"IPv6 fragment first", v6frag, ethLen, true},
		{"IPv6 fragment behind hop-by-hop", v6hbhFrag, ethLen, true},
		{"IPv6 fragment behind hop-by-hop, headers only", v6hbhFrag[:ethLen+48+8], ethLen, true},
		{"IPv6 hop-by-hop and destination options", v6hbhDst, ethLen, false},
		{"IPv6 chain cut in hop-by-hop", v6hbhFrag[:ethLen+44], ethLen, true},
		{"TUN: empty", nil, 0, false},
		{"TUN: IPv4 MF", v4mf[ethLen:], 0, true},
		{"TUN: IPv6 fragment behind hop-by-hop", v6hbhFrag[ethLen:], 0, true},
		{"TUN: IPv6", v6[ethLen:], 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := isIPFragment(tc.frame, tc.l2); got != tc.want {
				t.Errorf("isIPFragment(%d bytes, l2 %d): got %v, want %v", len(tc.frame), tc.l2, got, tc.want)
			}
		})
	}
}

// TestIPv6FragBehindHopByHopCopied: with zero copy, an IPv6 fragment whose
// Fragment header follows a hop-by-hop header is copied into gVisor
// (zc_frags_copied_ipfrag), as one whose Fragment header comes first, since
// gVisor may hold it for reassembly; a packet with a hop-by-hop header and
// no Fragment header is lent. Each is long enough to be lent by size.
func TestIPv6FragBehindHopByHopCopied(t *testing.T) {
	for _, tc := range []struct {
		name         string
		ext          header.IPv6ExtHdrSerializer
		wantFrag     bool
		wantFragDesc string
	}{
		{"fragment first", header.IPv6ExtHdrSerializer{fragHdr()}, true, "copied"},
		{"fragment behind hop-by-hop", header.IPv6ExtHdrSerializer{hopByHop(), fragHdr()}, true, "copied"},
		{"hop-by-hop, no fragment", header.IPv6ExtHdrSerializer{hopByHop()}, false, "lent"},
	} {
		for _, dc := range []struct {
			name string
			cfg  driver.Config
		}{
			{"linear", driver.Config{}},
			{"lro/hds-auto", driver.Config{LRO: true}},
		} {
			t.Run(tc.name+"/"+dc.name, func(t *testing.T) {
				st, w := wireStack(t, Config{Driver: dc.cfg, ZeroCopy: true})
				payload := make([]byte, 1232) // a multiple of 8, over lendMinBytes
				for i := range payload {
					payload[i] = byte(i)
				}
				if err := w.Write(fragFrame(driver.VirtioNetHdrLen, true, tc.ext, 0, payload)); err != nil {
					t.Fatal(err)
				}
				var c map[string]uint64
				for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
					c = counterMap(st)
					if c["zc_frags_copied_ipfrag"]+c["zc_views_lent"] > 0 {
						break
					}
				}
				frag, lent := c["zc_frags_copied_ipfrag"], c["zc_views_lent"]
				if tc.wantFrag && (frag == 0 || lent != 0) || !tc.wantFrag && (frag != 0 || lent == 0) {
					t.Errorf("zc_frags_copied_ipfrag %d, zc_views_lent %d: want the payload %s", frag, lent, tc.wantFragDesc)
				}
			})
		}
	}
}
