package stack

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// The receive path's own UDP checks (headers.go, localaddr.go, train.go,
// udpsplit.go): what a TrainConn or the split of a UDP train takes is the
// datagram the IP and UDP headers describe, for the stack's own
// addresses, never a fragment, and never more datagrams than
// UDP_MAX_SEGMENTS.

var (
	peer4 = netip.MustParseAddrPort("192.0.2.2:5000")
	peer6 = netip.MustParseAddrPort("[2001:db8::2]:5000")
)

// peerWire builds a stack of cfg at 192.0.2.1/24 and 2001:db8::1/64 (MAC
// 02:00:00:00:00:01) over an in-memory wire, and returns it with the
// wire's other end, into which a test writes frames (peerFrame). Cleanup
// closes both and checks that every page came back.
func peerWire(t testing.TB, cfg Config) (*Stack, *driver.MemWire) {
	t.Helper()
	a, w := driver.NewMemPair(64, driver.VirtioNetHdrLen+65535+18)
	pool := testutil.NewPool(t, bufpool.Config{RingSize: 1 << 15, Poison: true})
	cfg.Wire, cfg.MAC, cfg.Driver.Pool = a, [6]byte{2, 0, 0, 0, 0, 1}, pool
	cfg.Addrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64")}
	st, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		w.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("pages still in use after Close: got %d, want 0", n)
		}
	})
	return st, w
}

// datagram describes a UDP datagram from src to dst for peerFrame.
func datagram(src, dst netip.AddrPort, payload []byte) testutil.Frame {
	return testutil.Frame{
		Src: tcpip.AddrFromSlice(src.Addr().AsSlice()), Dst: tcpip.AddrFromSlice(dst.Addr().AsSlice()),
		Proto: header.UDPProtocolNumber, SrcPort: src.Port(), DstPort: dst.Port(), Payload: payload,
	}
}

// peerFrame returns f as the peer sends it to the stack over the wire:
// after a virtio-net header without flags (the NIC model verifies the
// checksums), in an Ethernet frame from the peer's MAC to the stack's (or
// to the broadcast or multicast MAC of f.Dst), followed by pad bytes 'X'
// that are no part of the IP packet.
func peerFrame(f testutil.Frame, pad int) []byte {
	f.Headroom = driver.VirtioNetHdrLen
	f.SrcMAC = "\x02\x00\x00\x00\x00\x02"
	f.DstMAC = "\x02\x00\x00\x00\x00\x01"
	switch d := f.Dst.AsSlice(); {
	case len(d) == 4 && d[0]&0xf0 == 0xe0:
		f.DstMAC = tcpip.LinkAddress([]byte{0x01, 0x00, 0x5e, d[1] & 0x7f, d[2], d[3]})
	case len(d) == 4 && d[3] == 255:
		f.DstMAC = "\xff\xff\xff\xff\xff\xff"
	case len(d) == 16 && d[0] == 0xff:
		f.DstMAC = tcpip.LinkAddress([]byte{0x33, 0x33, d[12], d[13], d[14], d[15]})
	}
	return append(f.Build(), bytes.Repeat([]byte{'X'}, pad)...)
}

// usoPeerFrame is peerFrame for a UDP GSO super-frame
// (VIRTIO_NET_HDR_GSO_UDP_L4 of seg bytes, checksum partial) of payload
// from src to dst.
func usoPeerFrame(src, dst netip.AddrPort, payload []byte, seg, pad int) []byte {
	f := datagram(src, dst, payload)
	f.Csum = testutil.CsumPartial
	b := peerFrame(f, pad)
	f.Headroom = driver.VirtioNetHdrLen
	l4 := f.L4Off() - driver.VirtioNetHdrLen
	h := driver.VirtioNetHdr{
		Flags: driver.VirtioNetHdrFNeedsCsum, GSOType: driver.VirtioNetHdrGSOUDPL4,
		HdrLen: uint16(l4 + header.UDPMinimumSize), GSOSize: uint16(seg),
		CsumStart: uint16(l4), CsumOffset: udpChecksumOffset,
	}
	h.Encode(b)
	return b
}

func writeFrames(t *testing.T, w *driver.MemWire, frames ...[]byte) {
	t.Helper()
	for _, f := range frames {
		if err := w.Write(f); err != nil {
			t.Fatal(err)
		}
	}
}

// readTrain reads c's next train with ReadTrain.
func readTrain(t *testing.T, c *TrainConn) (payload []byte, seg int) {
	t.Helper()
	buf := make([]byte, 65536)
	n, seg, _, err := c.ReadTrain(buf, time.Now().Add(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n], seg
}

// TestTrainConnPadding: bytes after a datagram's IP packet (Ethernet
// padding, or what a sender appends) are no payload: ReadTrain, ReadBatch
// and TakeTrain return the datagrams alone, of a plain datagram and of an
// rx-uso super-frame, IPv4 and IPv6, as ip_rcv_core trims an skb to its IP
// length.
func TestTrainConnPadding(t *testing.T) {
	deadline := func() time.Time { return time.Now().Add(30 * time.Second) }
	for _, r := range []struct {
		name string
		read func(t *testing.T, c *TrainConn) ([]byte, int)
	}{
		{"ReadTrain", readTrain},
		{"ReadBatch", func(t *testing.T, c *TrainConn) ([]byte, int) {
			c.SetGRO(true)
			ms := batchMsgs(1, 65536)
			if n, err := c.ReadBatch(ms, deadline()); n != 1 || err != nil {
				t.Fatalf("ReadBatch: %d, %v", n, err)
			}
			return joined(&ms[0]), ms[0].SegSize
		}},
		{"TakeTrain", func(t *testing.T, c *TrainConn) ([]byte, int) {
			var tr Train
			if err := c.TakeTrain(&tr, deadline()); err != nil {
				t.Fatal(err)
			}
			defer tr.Release()
			return bytes.Join(tr.Slices(nil), nil), tr.SegSize()
		}},
	} {
		for _, v6 := range []bool{false, true} {
			for _, uso := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/uso=%v", r.name, famName(v6), uso), func(t *testing.T) {
					st, w := peerWire(t, Config{Driver: driver.Config{RxUSO: uso}})
					src, dst := peer4, netip.MustParseAddrPort("192.0.2.1:9970")
					if v6 {
						src, dst = peer6, netip.MustParseAddrPort("[2001:db8::1]:9970")
					}
					c, err := st.ListenUDPTrains(dst)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					want, wantSeg := []byte("hello"), 5
					frame := peerFrame(datagram(src, dst, want), 200)
					if uso {
						want, wantSeg = []byte("0123456789abcdefghijABCDEFGHIJ"), 10
						frame = usoPeerFrame(src, dst, want, wantSeg, 25)
					}
					writeFrames(t, w, frame)
					if got, seg := r.read(t, c); !bytes.Equal(got, want) || seg != wantSeg {
						t.Errorf("read %q in segments of %d, want %q in %d", got, seg, want, wantSeg)
					}
				})
			}
		}
	}
}

func famName(v6 bool) string {
	if v6 {
		return "ipv6"
	}
	return "ipv4"
}

// TestUSOPaddingSplit: an rx-uso super-frame with bytes after its IP
// packet is split into exactly its datagrams for an ordinary gVisor
// socket: the padding makes none.
func TestUSOPaddingSplit(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(famName(v6), func(t *testing.T) {
			st, w := peerWire(t, Config{NoGRO: true, Driver: driver.Config{RxUSO: true}})
			src, dst := peer4, netip.MustParseAddrPort("192.0.2.1:9971")
			if v6 {
				src, dst = peer6, netip.MustParseAddrPort("[2001:db8::1]:9971")
			}
			u, err := st.ListenUDP(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			writeFrames(t, w, usoPeerFrame(src, dst, []byte("abcdefghijklmnopqrst"), 10, 25),
				peerFrame(datagram(src, dst, []byte("end")), 0))
			buf := make([]byte, 2048)
			for _, want := range []string{"abcdefghij", "klmnopqrst", "end"} {
				u.SetReadDeadline(time.Now().Add(30 * time.Second))
				n, _, err := u.ReadFrom(buf)
				if err != nil {
					t.Fatal(err)
				}
				if got := string(buf[:n]); got != want {
					t.Fatalf("datagram: got %q, want %q", got, want)
				}
			}
		})
	}
}

// setUDPLen sets the UDP length field of the packet whose UDP header is at
// l4 of its linear part.
func setUDPLen(p *bufpool.Packet, l4, n int) { header.UDP(p.Linear[l4:]).SetLength(uint16(n)) }

// TestSplitUDPLength: a UDP train whose UDP length is past its IP payload
// or under 8 is dropped and counted (udp_rcv's short_packet), not split;
// one whose UDP length is shorter than the IP payload is split up to it,
// as __udp4_lib_rcv trims to it.
func TestSplitUDPLength(t *testing.T) {
	pool := testutil.NewPool(t, bufpool.Config{Poison: true})
	for _, tc := range []struct {
		name  string
		spec  udpFrameSpec
		ulen  int   // the UDP length field set
		sizes []int // the datagrams delivered
	}{
		{"ipv4-past", udpFrameSpec{src: udpSrc4, dst: udpDst4}, 8 + 4000 + 1, nil},
		{"ipv6-past", udpFrameSpec{v6: true, src: udpSrc6, dst: udpDst6}, 8 + 4000 + 1, nil},
		{"ipv4-under-8", udpFrameSpec{src: udpSrc4, dst: udpDst4}, 7, nil},
		{"ipv4-short", udpFrameSpec{src: udpSrc4, dst: udpDst4}, 8 + 2500, []int{1000, 1000, 500}},
		{"ipv6-short", udpFrameSpec{v6: true, src: udpSrc6, dst: udpDst6}, 8 + 2500, []int{1000, 1000, 500}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, payload := trainPacket(t, pool, tc.spec, 4, 1000, 0)
			hdr := len(p.Linear)
			setUDPLen(p, hdr-header.UDPMinimumSize, tc.ulen)
			var c captureDispatcher
			ep := &linkEndpoint{}
			ep.Attach(&c)
			ep.Deliver(p)
			if len(c.got) != len(tc.sizes) {
				t.Fatalf("datagrams delivered: got %d, want %d", len(c.got), len(tc.sizes))
			}
			off := 0
			for i, d := range c.got {
				if got := d[len(d)-min(len(d), tc.sizes[i]):]; len(d) != hdr+tc.sizes[i] || !bytes.Equal(got, payload[off:off+tc.sizes[i]]) {
					t.Errorf("datagram %d: %d bytes, want %d of headers and the %d of payload at %d", i, len(d), hdr, tc.sizes[i], off)
				}
				off += tc.sizes[i]
			}
			if got, want := ep.trains.malformed.Load(), uint64(0); tc.sizes == nil {
				if got != 1 {
					t.Errorf("malformed count: got %d, want 1", got)
				}
			} else if got != want {
				t.Errorf("malformed count: got %d, want %d", got, want)
			}
		})
	}
}

// TestSplitUDPSegmentLimit: splitUDP never cuts a train into more than
// UDP_MAX_SEGMENTS (128) datagrams, however the train came: one more is
// dropped and counted; 128 are delivered.
func TestSplitUDPSegmentLimit(t *testing.T) {
	pool := testutil.NewPool(t, bufpool.Config{Poison: true})
	for _, segs := range []int{driver.UDPMaxSegments, driver.UDPMaxSegments + 1, 4000} {
		t.Run(fmt.Sprint(segs), func(t *testing.T) {
			p, _ := trainPacket(t, pool, udpFrameSpec{src: udpSrc4, dst: udpDst4}, segs, 10, 0)
			var c captureDispatcher
			ep := &linkEndpoint{}
			ep.Attach(&c)
			ep.Deliver(p)
			want, wantDrops := segs, uint64(0)
			if segs > driver.UDPMaxSegments {
				want, wantDrops = 0, 1
			}
			if len(c.got) != want || ep.trains.malformed.Load() != wantDrops {
				t.Errorf("datagrams delivered: %d, dropped trains %d; want %d, %d", len(c.got), ep.trains.malformed.Load(), want, wantDrops)
			}
		})
	}
}

// TestTrainConnUDPLength: a datagram or train for a TrainConn whose UDP
// length is past the IP payload, or that holds more than UDP_MAX_SEGMENTS
// datagrams, is dropped and counted in udp_malformed, never queued; one
// whose UDP length is shorter than the IP payload is read up to it. (The
// NIC model drops such lengths itself, rx_drop_bad_udp_len: these packets
// are handed to the link endpoint directly.)
func TestTrainConnUDPLength(t *testing.T) {
	st, _ := peerWire(t, Config{NoGRO: true})
	dst := netip.MustParseAddrPort("192.0.2.1:9960")
	c, err := st.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	datagramPacket := func(ulen int) *bufpool.Packet {
		p := bufpool.NewPacket()
		p.Linear = append(p.Linear, udpHeaderFrame(udpFrameSpec{src: udpSrc4, dst: dst, payload: 5})...)
		setUDPLen(p, len(p.Linear)-header.UDPMinimumSize, ulen)
		p.Linear = append(p.Linear, "hello"...)
		p.Len, p.HdrLen, p.CsumVerified = len(p.Linear), len(p.Linear)-5, true
		return p
	}
	pool := testutil.NewPool(t, bufpool.Config{Poison: true})
	big, _ := trainPacket(t, pool, udpFrameSpec{src: udpSrc4, dst: dst}, driver.UDPMaxSegments+1, 10, 0)
	for i, p := range []*bufpool.Packet{datagramPacket(8 + 50), datagramPacket(7), big} {
		st.ep.toGVisor(p, nil)
		if q, m := len(c.ready), counterMap(st)["udp_malformed"]; q != 0 || m != uint64(i+1) {
			t.Fatalf("packet %d: %d queued, udp_malformed %d; want 0, %d", i, q, m, i+1)
		}
	}
	st.ep.toGVisor(datagramPacket(8+3), nil)
	if got, seg := readTrain(t, c); string(got) != "hel" || seg != 3 {
		t.Errorf("UDP length shorter than the IP payload: read %q in segments of %d, want \"hel\" in 3", got, seg)
	}
}

// fragments returns the frames of the UDP datagram f cut into two IP
// fragments, the first carrying the UDP header and the first 16 bytes of
// f.Payload (RFC 791 section 2.3; RFC 8200 section 4.5).
func fragments(f testutil.Frame, id uint16) [][]byte {
	f.Proto, f.Csum = header.UDPProtocolNumber, testutil.CsumFull
	full := f.Build()
	udp := full[f.L4Off():]
	const cut = header.UDPMinimumSize + 16 // a multiple of 8
	var out [][]byte
	for _, part := range []struct {
		off, end int
	}{{0, cut}, {cut, len(udp)}} {
		g := f
		g.NoL4Header, g.Payload = true, udp[part.off:part.end]
		more := part.end < len(udp)
		if f.Src.Len() == 4 {
			g.ID, g.FragOff = id, uint16(part.off)
			if more {
				g.IPFlags = header.IPv4FlagMoreFragments
			}
		} else {
			g.IPv6Ext = header.IPv6ExtHdrSerializer{&header.IPv6SerializableFragmentExtHdr{
				FragmentOffset: uint16(part.off / 8), M: more, Identification: uint32(id),
			}}
		}
		out = append(out, peerFrame(g, 0))
	}
	return out
}

// TestTrainConnFragments: the IP fragments of a datagram for a TrainConn's
// port never reach it (not the first, a truncated datagram; not the
// second, whose payload bytes 2-3 read as the port), but gVisor, which
// reassembles them for its socket on that port, as ip_defrag runs before
// udp_rcv; IPv4 and IPv6.
func TestTrainConnFragments(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(famName(v6), func(t *testing.T) {
			st, w := peerWire(t, Config{NoGRO: true})
			src, dst := peer4, netip.MustParseAddrPort("192.0.2.1:9950")
			if v6 {
				src, dst = peer6, netip.MustParseAddrPort("[2001:db8::1]:9950")
			}
			c, err := st.ListenUDPTrains(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			u, err := st.ListenUDP(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			payload := make([]byte, 64)
			for i := range payload {
				payload[i] = byte(i * 3)
			}
			// The second fragment starts 16 bytes into the payload: its
			// bytes 2-3, where a UDP header has its destination port,
			// are the port.
			binary.BigEndian.PutUint16(payload[18:], dst.Port())
			writeFrames(t, w, fragments(datagram(src, dst, payload), 77)...)
			writeFrames(t, w, peerFrame(datagram(src, dst, []byte("end")), 0))
			if got, _ := readTrain(t, c); string(got) != "end" {
				t.Fatalf("the train socket read %d bytes %q first, want \"end\"", len(got), got)
			}
			buf := make([]byte, 2048)
			u.SetReadDeadline(time.Now().Add(30 * time.Second))
			n, _, err := u.ReadFrom(buf)
			if err != nil {
				t.Fatalf("the reassembled datagram: %v", err)
			}
			if !bytes.Equal(buf[:n], payload) {
				t.Errorf("the reassembled datagram: %d bytes, want the %d sent", n, len(payload))
			}
		})
	}
}

// TestTrainConnForeignDest: a TrainConn gets only datagrams for the stack:
// to its addresses, its subnet's broadcast, 255.255.255.255 and the groups
// gVisor joined (224.0.0.1, ff02::1), as ip_route_input and the socket
// lookup decide; not a datagram to another host's address (a TUN has no
// MAC filter, and the NIC model passes its own MAC whatever the IP), nor
// one from a multicast source, whether bound to 0.0.0.0 or to the foreign
// address itself.
func TestTrainConnForeignDest(t *testing.T) {
	st, w := peerWire(t, Config{NoGRO: true})
	const port = 9940
	any4 := netip.AddrPortFrom(netip.IPv4Unspecified(), port)
	c, err := st.ListenUDPTrains(any4)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	foreign := netip.MustParseAddrPort("198.51.100.7:9941")
	cf, err := st.ListenUDPTrains(foreign)
	if err != nil {
		t.Fatal(err)
	}
	defer cf.Close()
	to := func(a string, p uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(a), p) }
	writeFrames(t, w,
		peerFrame(datagram(peer4, to("198.51.100.7", port), []byte("not-for-me")), 0),
		peerFrame(datagram(peer4, foreign, []byte("not-for-me-either")), 0),
		peerFrame(datagram(peer6, to("2001:db8::99", port), []byte("nor-for-me")), 0),
		peerFrame(datagram(netip.MustParseAddrPort("224.0.0.9:5000"), to("192.0.2.1", port), []byte("martian")), 0),
		peerFrame(datagram(peer4, to("192.0.2.255", port), []byte("subnet-broadcast")), 0),
		peerFrame(datagram(peer4, to("255.255.255.255", port), []byte("broadcast")), 0),
		peerFrame(datagram(peer4, to("224.0.0.1", port), []byte("all-systems")), 0),
		peerFrame(datagram(peer6, to("ff02::1", port), []byte("all-nodes")), 0),
		peerFrame(datagram(peer6, to("2001:db8::1", port), []byte("mine6")), 0),
		peerFrame(datagram(peer4, to("192.0.2.1", port), []byte("end")), 0),
	)
	for _, want := range []string{"subnet-broadcast", "broadcast", "all-systems", "all-nodes", "mine6", "end"} {
		if got, _ := readTrain(t, c); string(got) != want {
			t.Fatalf("read %q, want %q", got, want)
		}
	}
	// The frames went through the poll loop in order: the one for the
	// foreign address came before "end".
	if n := cf.segs.Load(); n != 0 {
		t.Errorf("the socket bound to %v: %d datagrams queued, want 0", foreign, n)
	}
}
