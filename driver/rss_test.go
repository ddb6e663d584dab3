package driver

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/hdr"
	"github.com/ustack/ustack/internal/rss"
	"github.com/ustack/ustack/internal/testutil"
)

// metaCollector is a Handler that keeps each packet's RxMeta.
type metaCollector struct {
	mu sync.Mutex
	// +checklocks:mu
	metas []bufpool.RxMeta
	c     collector
}

func (m *metaCollector) Deliver(p *Packet) {
	m.mu.Lock()
	m.metas = append(m.metas, p.RxMeta)
	m.mu.Unlock()
	m.c.Deliver(p)
}

func (m *metaCollector) Flush(bool) time.Duration { return 0 }

// rssCase is a frame and the RxMeta a reference parse gives it: the
// header offsets the frame builder laid out, and the RSS specification's
// hash of its addresses (and ports unless it is a fragment), computed by
// rss.Table.Hash from the builder's fields, not from the frame's bytes.
type rssCase struct {
	name string
	f    testutil.Frame
	frag bool
}

func rssCases() []rssCase {
	v4s, v4d := tcpip.AddrFrom4([4]byte{66, 9, 149, 187}), tcpip.AddrFrom4([4]byte{161, 142, 100, 80})
	v6s := tcpip.AddrFrom16([16]byte{0x3f, 0xfe, 0x25, 0x01, 0x02, 0x00, 0x1f, 0xff, 15: 7})
	v6d := tcpip.AddrFrom16([16]byte{0x3f, 0xfe, 0x25, 0x01, 0x02, 0x00, 0x00, 0x03, 15: 1})
	mac := func(f testutil.Frame) testutil.Frame {
		f.SrcMAC, f.DstMAC = tcpip.LinkAddress(pkSrcMAC), tcpip.LinkAddress(pkDstMAC)
		f.SrcPort, f.DstPort = 2794, 1766
		f.Flags = header.TCPFlagAck
		f.Payload = make([]byte, 100)
		return f
	}
	hbh := header.IPv6ExtHdrSerializer{&header.IPv6SerializableHopByHopExtHdr{&header.IPv6RouterAlertOption{Value: header.IPv6RouterAlertMLD}}}
	frag6 := header.IPv6ExtHdrSerializer{&header.IPv6SerializableFragmentExtHdr{M: true, Identification: 7}}
	return []rssCase{
		{"tcp4", mac(testutil.Frame{Src: v4s, Dst: v4d}), false},
		{"udp4", mac(testutil.Frame{Src: v4s, Dst: v4d, Proto: header.UDPProtocolNumber}), false},
		{"tcp4-ip-options", mac(testutil.Frame{Src: v4s, Dst: v4d, IPv4Options: header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}}), false},
		{"tcp6", mac(testutil.Frame{Src: v6s, Dst: v6d}), false},
		{"udp6", mac(testutil.Frame{Src: v6s, Dst: v6d, Proto: header.UDPProtocolNumber}), false},
		{"tcp6-hop-by-hop", mac(testutil.Frame{Src: v6s, Dst: v6d, IPv6Ext: hbh}), false},
		{"udp4-first-fragment", mac(testutil.Frame{Src: v4s, Dst: v4d, Proto: header.UDPProtocolNumber, IPFlags: header.IPv4FlagMoreFragments}), true},
		{"tcp4-later-fragment", mac(testutil.Frame{Src: v4s, Dst: v4d, FragOff: 1480, NoL4Header: true}), true},
		{"udp6-first-fragment", mac(testutil.Frame{Src: v6s, Dst: v6d, Proto: header.UDPProtocolNumber, IPv6Ext: frag6}), true},
	}
}

// want returns the reference RxMeta of tc's frame, its IP header at l3
// (the frame's L3Off, less 14 on a TUN's wire).
func (tc *rssCase) want(l3 int) bufpool.RxMeta {
	f := &tc.f
	src, dst := f.Src.AsSlice(), f.Dst.AsSlice()
	m := bufpool.RxMeta{NetworkHeader: uint16(l3), TransportHeader: uint16(l3 + f.L4Off() - f.L3Off()), HeadersSet: true}
	if tc.frag {
		m.Hash, m.HashType = rss.Default().Hash(src, dst, nil), bufpool.HashL3
		return m
	}
	var ports [4]byte
	binary.BigEndian.PutUint16(ports[:], f.SrcPort)
	binary.BigEndian.PutUint16(ports[2:], f.DstPort)
	m.Hash, m.HashType = rss.Default().Hash(src, dst, ports[:]), bufpool.HashL4
	return m
}

// TestRxMetaDelivered checks the header offsets and the RSS hash of each
// delivered packet against a reference parse: IPv4 and IPv6, TCP and UDP,
// IP options and IPv6 extension headers, fragments (hashed on their
// addresses only, HashL3), on the linear RQ (head frag, XDP-less build),
// the nonlinear RQ (header copy), the cyclic RQ and a TUN's wire.
func TestRxMetaDelivered(t *testing.T) {
	for _, rc := range []struct {
		name string
		cfg  Config
	}{
		{"linear", Config{}},
		{"hds-256", Config{HDS: 256, MTU: 9000}},
		{"cyclic", Config{RQ: RQCyclic}},
		{"tun", Config{L3: true}},
	} {
		t.Run(rc.name, func(t *testing.T) {
			m := &metaCollector{}
			_, w := newTestDriver(t, rc.cfg, m)
			cases := rssCases()
			for i := range cases {
				frame := cases[i].f.Build()
				if rc.cfg.L3 {
					frame = frame[header.EthernetMinimumSize:]
				}
				if err := w.Write(wireFrame(VirtioNetHdr{}, frame)); err != nil {
					t.Fatal(err)
				}
				m.c.waitFor(t, int64(i+1))
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			for i := range cases {
				tc := &cases[i]
				l3 := tc.f.L3Off()
				if rc.cfg.L3 {
					l3 = 0
				}
				if got, want := m.metas[i], tc.want(l3); got != want {
					t.Errorf("%s: got %+v, want %+v", tc.name, got, want)
				}
			}
		})
	}
}

// TestRxMetaVLAN checks the offsets and hash of a VLAN-tagged frame, which
// the NIC model parses (L2Len 18) but drops (Stats.DroppedVLAN), so no
// packet of it is delivered: the CQE's RxMeta as the driver would build it.
func TestRxMetaVLAN(t *testing.T) {
	for _, tc := range rssCases() {
		t.Run(tc.name, func(t *testing.T) {
			plain := tc.f.Build()
			frame := make([]byte, 0, len(plain)+hdr.VLANTagLen)
			frame = append(frame, plain[:12]...)
			frame = binary.BigEndian.AppendUint16(frame, hdr.EtherTypeVLAN)
			frame = binary.BigEndian.AppendUint16(frame, 42) // TCI
			frame = append(frame, plain[12:]...)
			var cqe CQE
			if d := ParseFrame(frame, &cqe.Info); d != DropNone {
				t.Fatalf("ParseFrame: got %v, want DropNone", d)
			}
			setRSS(&cqe, frame)
			want := tc.want(tc.f.L3Off() + hdr.VLANTagLen)
			if got := cqeMeta(&cqe); got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

// TestRxMetaNotIP checks that a frame that is not IP (ARP) has no offsets
// and no hash, as mlx5e_skb_set_hash's PKT_HASH_TYPE_NONE.
func TestRxMetaNotIP(t *testing.T) {
	var cqe CQE
	cqe.Info = FrameInfo{L2Len: 14, L3: L3ARP, L3Len: arpLen}
	setRSS(&cqe, make([]byte, 14+arpLen))
	if got := cqeMeta(&cqe); got != (bufpool.RxMeta{}) {
		t.Errorf("got %+v, want the zero RxMeta", got)
	}
}

func TestRSSHashNoAllocs(t *testing.T) {
	tc := rssCases()[3]
	frame := tc.f.Build()
	var cqe CQE
	if d := ParseFrame(frame, &cqe.Info); d != DropNone {
		t.Fatalf("ParseFrame: %v", d)
	}
	if a := testing.AllocsPerRun(100, func() { setRSS(&cqe, frame) }); a != 0 {
		t.Errorf("allocations per hash: got %v, want 0", a)
	}
}
