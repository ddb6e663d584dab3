package stack

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/internal/testutil"
)

var (
	zwLocal4  = tcpip.AddrFrom4([4]byte{10, 0, 0, 2})
	zwRemote4 = tcpip.AddrFrom4([4]byte{10, 0, 0, 1})
	zwLocal6  = tcpip.AddrFrom16([16]byte{0xfd, 0, 15: 2})
	zwRemote6 = tcpip.AddrFrom16([16]byte{0xfd, 0, 15: 1})
)

// zwSegment builds an Ethernet frame with a TCP segment from src:sport to
// dst:dport, with a timestamp option, and payload bytes of data.
func zwSegment(src, dst tcpip.Address, sport, dport uint16, seq, ack uint32, flags header.TCPFlags, wnd uint16, opts []byte, payload int) []byte {
	data := make([]byte, payload)
	for i := range data {
		data[i] = byte(i)
	}
	return testutil.Frame{
		Src: src, Dst: dst, SrcPort: sport, DstPort: dport, Seq: seq, Ack: ack,
		Flags: flags, Window: wnd, TCPOptions: opts, Payload: data,
	}.Build()
}

// zwSend records frame b as sent by ustack.
func zwSend(z *zeroWindow, b []byte) {
	ip, tcp, _, _, ok := tcpHeaders(b, ethLen)
	if !ok {
		panic("zwSend: not a TCP frame")
	}
	z.sent(b[ip:tcp], b[tcp:])
}

// TestZeroWindowAckFirst checks when the link endpoint hands gVisor a pure
// ACK before a received segment: exactly when gVisor's header.Acceptable
// rejects it at the window ustack last advertised and Linux's tcp_sequence
// takes it; and that the pure ACK is a valid segment at rcv_nxt.
func TestZeroWindowAckFirst(t *testing.T) {
	const (
		lport, rport = 7, 40000
		rcvNxt       = 1000000
		ackOfPeer    = 5000
		scale        = 7
	)
	tsOpt := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2}
	synOpts := []byte{2, 4, 0x05, 0xb4, 3, 3, scale, 1} // MSS 1460, WS 7, NOP
	tests := []struct {
		name    string
		v6      bool
		noSyn   bool   // the flow's SYN-ACK was not seen: scale unknown
		prevWnd uint16 // raw window of an earlier ACK, 536 bytes before rcv_nxt
		wnd     uint16 // raw window ustack last advertised
		seq     uint32
		payload int
		flags   header.TCPFlags
		want    bool
	}{
		{name: "zero window, data at rcv_nxt", wnd: 0, seq: rcvNxt, payload: 1448, want: true},
		{name: "zero window, data at rcv_nxt, ipv6", v6: true, wnd: 0, seq: rcvNxt, payload: 1448, want: true},
		{name: "zero window, FIN at rcv_nxt", wnd: 0, seq: rcvNxt, flags: header.TCPFlagFin, want: true},
		{name: "zero window, scale unknown", noSyn: true, wnd: 0, seq: rcvNxt, payload: 100, want: true},
		{name: "zero window, pure ACK", wnd: 0, seq: rcvNxt, payload: 0},
		{name: "zero window, pure ACK inside an earlier edge", prevWnd: 8, wnd: 0, seq: rcvNxt + 488, payload: 0, want: true},
		{name: "zero window, data inside an earlier edge", prevWnd: 8, wnd: 0, seq: rcvNxt, payload: 488, want: true},
		{name: "zero window, pure ACK past an earlier edge", prevWnd: 8, wnd: 0, seq: rcvNxt + 489, payload: 0},
		{name: "zero window, pure ACK past rcv_nxt", wnd: 0, seq: rcvNxt + 1, payload: 0},
		{name: "zero window, data past the edge", wnd: 0, seq: rcvNxt + 1, payload: 100},
		{name: "zero window, old data", wnd: 0, seq: rcvNxt - 200, payload: 100},
		{name: "zero window, old data ending at rcv_nxt", wnd: 0, seq: rcvNxt - 100, payload: 100, want: true},
		{name: "open window, data in it", wnd: 10, seq: rcvNxt, payload: 1448},
		{name: "open window, data at the right edge", wnd: 10, seq: rcvNxt + 10<<scale, payload: 1448},
		{name: "open window, data past the edge", wnd: 10, seq: rcvNxt + 10<<scale + 1, payload: 1448},
		{name: "open window, scale unknown", noSyn: true, wnd: 10, seq: rcvNxt, payload: 1448},
		{name: "zero window, RST", wnd: 0, seq: rcvNxt, payload: 10, flags: header.TCPFlagRst},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			local, remote := zwLocal4, zwRemote4
			if tt.v6 {
				local, remote = zwLocal6, zwRemote6
			}
			var z zeroWindow
			if !tt.noSyn {
				zwSend(&z, zwSegment(local, remote, lport, rport, ackOfPeer-1, rcvNxt-100000, header.TCPFlagSyn|header.TCPFlagAck, 65535, synOpts, 0))
			}
			if tt.prevWnd != 0 {
				zwSend(&z, zwSegment(local, remote, lport, rport, ackOfPeer, rcvNxt-536, header.TCPFlagAck, tt.prevWnd, tsOpt, 0))
			}
			zwSend(&z, zwSegment(local, remote, lport, rport, ackOfPeer, rcvNxt, header.TCPFlagAck, tt.wnd, tsOpt, 0))
			in := zwSegment(remote, local, rport, lport, tt.seq, ackOfPeer+100, header.TCPFlagAck|header.TCPFlagPsh|tt.flags, 1234, tsOpt, tt.payload)
			buf, got := z.ackFirst(in, ethLen)
			if got != tt.want {
				t.Fatalf("pure ACK first: got %v, want %v", got, tt.want)
			}
			if !got {
				if n := z.acks.Load(); n != 0 {
					t.Errorf("rx_tcp_zero_window_acks: got %d, want 0", n)
				}
				return
			}
			defer buf.Release()
			if n := z.acks.Load(); n != 1 {
				t.Errorf("rx_tcp_zero_window_acks: got %d, want 1", n)
			}
			b := buf.Flatten()
			ip, tcp, tcpLen, segLen, ok := tcpHeaders(b, ethLen)
			if !ok || segLen != 0 || len(b) != tcp+tcpLen {
				t.Fatalf("pure ACK: headers ok %v, sequence length %d, frame %d bytes: want a segment without payload", ok, segLen, len(b))
			}
			th := header.TCP(b[tcp:])
			if th.SequenceNumber() != rcvNxt || th.AckNumber() != ackOfPeer+100 || th.WindowSize() != 1234 || th.Flags() != header.TCPFlagAck {
				t.Errorf("pure ACK: seq %d ack %d window %d flags %v, want %d %d 1234 %v", th.SequenceNumber(), th.AckNumber(), th.WindowSize(), th.Flags(), rcvNxt, ackOfPeer+100, header.TCPFlagAck)
			}
			if string(th.Options()) != string(tsOpt) {
				t.Errorf("pure ACK options: got %x, want %x", th.Options(), tsOpt)
			}
			var src, dst tcpip.Address
			if tt.v6 {
				h := header.IPv6(b[ip:])
				src, dst = h.SourceAddress(), h.DestinationAddress()
			} else {
				h := header.IPv4(b[ip:])
				if !h.IsChecksumValid() {
					t.Errorf("pure ACK: bad IPv4 checksum")
				}
				src, dst = h.SourceAddress(), h.DestinationAddress()
			}
			if !th.IsChecksumValid(src, dst, 0, 0) {
				t.Errorf("pure ACK: bad TCP checksum")
			}
		})
	}
}

// TestZeroWindowSlots checks that another flow's open window does not take
// a flow's slot, and that its zero window or SYN does.
func TestZeroWindowSlots(t *testing.T) {
	var z zeroWindow
	// Find two ports whose flows share a slot.
	slotOf := func(port uint16) uint64 {
		return flowHash(zwLocal4.AsSlice(), zwRemote4.AsSlice(), 7, port) & (zwSlots - 1)
	}
	a, b := uint16(40000), uint16(40001)
	for slotOf(b) != slotOf(a) {
		b++
	}
	zwSend(&z, zwSegment(zwLocal4, zwRemote4, 7, a, 1, 100, header.TCPFlagAck, 0, nil, 0))
	dataFrom := func(port uint16) []byte {
		return zwSegment(zwRemote4, zwLocal4, port, 7, 100, 2, header.TCPFlagAck, 100, nil, 10)
	}
	if _, ok := z.ackFirst(dataFrom(a), ethLen); !ok {
		t.Fatal("flow a at a zero window: no pure ACK")
	}
	zwSend(&z, zwSegment(zwLocal4, zwRemote4, 7, b, 1, 100, header.TCPFlagAck, 1000, nil, 0))
	if _, ok := z.ackFirst(dataFrom(a), ethLen); !ok {
		t.Error("flow b's open window took flow a's slot")
	}
	zwSend(&z, zwSegment(zwLocal4, zwRemote4, 7, b, 1, 100, header.TCPFlagAck, 0, nil, 0))
	if _, ok := z.ackFirst(dataFrom(a), ethLen); ok {
		t.Error("flow b's zero window did not take the slot: flow a still matches")
	}
	if _, ok := z.ackFirst(dataFrom(b), ethLen); !ok {
		t.Error("flow b at a zero window: no pure ACK")
	}
}

// TestZeroWindowNoAllocs pins the per-packet cost of the record: sending a
// segment and receiving one that needs no pure ACK allocate nothing.
func TestZeroWindowNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	var z zeroWindow
	out := zwSegment(zwLocal4, zwRemote4, 7, 40000, 1, 100, header.TCPFlagAck, 1000, nil, 0)
	in := zwSegment(zwRemote4, zwLocal4, 40000, 7, 100, 2, header.TCPFlagAck, 100, nil, 1448)
	ip, tcp, _, _, _ := tcpHeaders(out, ethLen)
	if a := testing.AllocsPerRun(500, func() {
		z.sent(out[ip:tcp], out[tcp:])
		if _, ok := z.ackFirst(in, ethLen); ok {
			t.Fatal("pure ACK for a segment in the window")
		}
	}); a != 0 {
		t.Errorf("allocations per segment: got %v, want 0", a)
	}
}

// BenchmarkZeroWindow measures the record's cost per segment: one sent
// (an ACK) and one received data segment that needs no pure ACK.
func BenchmarkZeroWindow(b *testing.B) {
	var z zeroWindow
	out := zwSegment(zwLocal4, zwRemote4, 7, 40000, 1, 100, header.TCPFlagAck, 1000, nil, 0)
	in := zwSegment(zwRemote4, zwLocal4, 40000, 7, 100, 2, header.TCPFlagAck, 100, nil, 1448)
	ip, tcp, _, _, _ := tcpHeaders(out, ethLen)
	b.ReportAllocs()
	for b.Loop() {
		z.sent(out[ip:tcp], out[tcp:])
		z.ackFirst(in, ethLen)
	}
}

// TestTCPHeaders pins tcpHeaders on frames built by gVisor's encoders: the
// offsets and lengths of an unfragmented TCP segment's headers, and ok
// false for anything else.
func TestTCPHeaders(t *testing.T) {
	seg4 := func(payload int, flags header.TCPFlags) []byte {
		return zwSegment(zwRemote4, zwLocal4, 40000, 7, 1, 2, flags, 100, nil, payload)
	}
	with := func(b []byte, f func([]byte)) []byte { f(b); return b }
	const ip4, ip6 = header.EthernetMinimumSize, header.EthernetMinimumSize
	for _, tc := range []struct {
		name                string
		frame               []byte
		ok                  bool
		tcp, tcpLen, segLen int
	}{
		{"ipv4", seg4(100, header.TCPFlagAck), true, ip4 + 20, 20, 100},
		{"ipv4-fin", seg4(100, header.TCPFlagAck|header.TCPFlagFin), true, ip4 + 20, 20, 101},
		{"ipv4-options", zwSegment(zwRemote4, zwLocal4, 40000, 7, 1, 2, header.TCPFlagAck, 100, []byte{1, 1, 1, 1}, 10), true, ip4 + 20, 24, 10},
		{"ipv6", zwSegment(zwRemote6, zwLocal6, 40000, 7, 1, 2, header.TCPFlagAck, 100, nil, 1000), true, ip6 + 40, 20, 1000},
		{"ipv4-more-fragments", with(seg4(100, header.TCPFlagAck), func(b []byte) {
			header.IPv4(b[ip4:]).SetFlagsFragmentOffset(header.IPv4FlagMoreFragments, 0)
		}), false, 0, 0, 0},
		{"ipv4-fragment-offset", with(seg4(100, header.TCPFlagAck), func(b []byte) {
			header.IPv4(b[ip4:]).SetFlagsFragmentOffset(0, 8)
		}), false, 0, 0, 0},
		{"ipv4-udp", with(seg4(100, header.TCPFlagAck), func(b []byte) {
			b[ip4+9] = uint8(header.UDPProtocolNumber)
		}), false, 0, 0, 0},
		{"ipv6-udp", with(zwSegment(zwRemote6, zwLocal6, 40000, 7, 1, 2, header.TCPFlagAck, 100, nil, 0), func(b []byte) {
			header.IPv6(b[ip6:]).SetNextHeader(uint8(header.UDPProtocolNumber))
		}), false, 0, 0, 0},
		{"data-offset-short", with(seg4(0, header.TCPFlagAck), func(b []byte) {
			b[ip4+20+12] = 4 << 4 // 16 bytes
		}), false, 0, 0, 0},
		{"data-offset-past-frame", with(seg4(0, header.TCPFlagAck), func(b []byte) {
			b[ip4+20+12] = 6 << 4 // 24 bytes of a 20-byte header
		}), false, 0, 0, 0},
		{"total-length-short", with(seg4(0, header.TCPFlagAck), func(b []byte) {
			header.IPv4(b[ip4:]).SetTotalLength(30)
		}), false, 0, 0, 0},
		{"short-tcp", seg4(0, header.TCPFlagAck)[:ip4+20+19], false, 0, 0, 0},
		{"short-ipv4", seg4(0, header.TCPFlagAck)[:ip4+19], false, 0, 0, 0},
		{"short-ipv6", zwSegment(zwRemote6, zwLocal6, 40000, 7, 1, 2, header.TCPFlagAck, 100, nil, 0)[:ip6+39], false, 0, 0, 0},
		{"short-ether", make([]byte, 13), false, 0, 0, 0},
		{"arp", with(make([]byte, 64), func(b []byte) {
			header.Ethernet(b).Encode(&header.EthernetFields{Type: header.ARPProtocolNumber})
		}), false, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ip, tcp, tcpLen, segLen, ok := tcpHeaders(tc.frame, ethLen)
			if ok != tc.ok {
				t.Fatalf("ok: got %v, want %v", ok, tc.ok)
			}
			if ok && (ip != header.EthernetMinimumSize || tcp != tc.tcp || tcpLen != tc.tcpLen || segLen != tc.segLen) {
				t.Errorf("got ip %d tcp %d tcpLen %d segLen %d, want %d %d %d %d", ip, tcp, tcpLen, segLen, header.EthernetMinimumSize, tc.tcp, tc.tcpLen, tc.segLen)
			}
			if !ok {
				return
			}
			src, dst := ipAddrs(tc.frame[ip:])
			wantSrc, wantDst := zwRemote4, zwLocal4
			if len(src) == 16 {
				wantSrc, wantDst = zwRemote6, zwLocal6
			}
			if tcpip.AddrFromSlice(src) != wantSrc || tcpip.AddrFromSlice(dst) != wantDst {
				t.Errorf("ipAddrs: got %v -> %v, want %v -> %v", tcpip.AddrFromSlice(src), tcpip.AddrFromSlice(dst), wantSrc, wantDst)
			}
		})
	}
}
