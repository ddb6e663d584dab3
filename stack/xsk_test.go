package stack

import (
	"bytes"
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/driver/xsk"
	"github.com/ustack/ustack/internal/testutil"
)

// nullWire is an xsk.Wire that discards: the tests' sockets only receive.
type nullWire struct{}

func (nullWire) Write([]byte) error { return nil }

var (
	xskRxMAC   = [6]byte{2, 0, 0, 0, 0, 1}
	xskPeerMAC = [6]byte{2, 0, 0, 0, 0, 2}
)

// xskBed is a stack running the xsk:port program on one end of an
// in-memory wire whose other end the test writes raw frames into, with an
// AF_XDP socket bound whose fill ring holds fill frames.
type xskBed struct {
	rx   *Stack
	wire *driver.MemWire // the peer's end: raw frames go in here
	sock *xsk.Socket
}

func newXSKBed(t testing.TB, port uint16, sc xsk.Config, fill int) *xskBed {
	t.Helper()
	a, b := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535+18)
	t.Cleanup(func() { b.Close() })
	prog, err := cpumap.ParseProgram(fmt.Sprint("xsk:", port), 1)
	if err != nil {
		t.Fatal(err)
	}
	pool := testutil.NewPool(t, bufpool.Config{RingSize: 1 << 12})
	rx, err := New(Config{
		Wire:   a,
		Addrs:  []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64")},
		MAC:    xskRxMAC,
		XDP:    prog,
		Driver: driver.Config{Pool: pool},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rx.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("pages still in use after Close: got %d, want 0", n)
		}
	})
	sock, err := xsk.New(sc, nullWire{})
	if err != nil {
		t.Fatal(err)
	}
	got, idx := sock.Fill().Reserve(uint32(fill))
	if int(got) != fill {
		t.Fatalf("fill ring: reserved %d of %d", got, fill)
	}
	for i := range got {
		*sock.Fill().Entry(idx + i) = sock.UMEM().FrameAddr(int(i))
	}
	sock.Fill().Submit(got)
	if err := rx.BindXSK(sock); err != nil {
		t.Fatal(err)
	}
	return &xskBed{rx: rx, wire: b, sock: sock}
}

// send writes frame to the stack with an empty virtio-net header.
func (bed *xskBed) send(t testing.TB, frame []byte) {
	t.Helper()
	b := make([]byte, driver.VirtioNetHdrLen+len(frame))
	copy(b[driver.VirtioNetHdrLen:], frame)
	if err := bed.wire.Write(b); err != nil {
		t.Fatal(err)
	}
}

// waitCounters waits, at most 10 s, until every counter in want has
// reached its value, and fails the test otherwise.
func waitCounters(t *testing.T, s *Stack, want map[string]uint64) {
	t.Helper()
	var c map[string]uint64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		c = counterMap(s)
		done := true
		for name, v := range want {
			if c[name] < v {
				done = false
			}
		}
		if done {
			break
		}
	}
	for name, v := range want {
		if c[name] != v {
			t.Errorf("%s: got %d, want %d", name, c[name], v)
		}
	}
}

// xskFrameSpec describes a frame built by frame: TCP or UDP over IPv4 or
// IPv6 to dport, from the peer to the stack, with a full checksum.
type xskFrameSpec struct {
	tcp, v6 bool
	dport   uint16
	payload []byte
}

func (s xskFrameSpec) frame() []byte {
	f := testutil.Frame{
		SrcMAC: tcpip.LinkAddress(xskPeerMAC[:]), DstMAC: tcpip.LinkAddress(xskRxMAC[:]),
		Src: tcpip.AddrFrom4([4]byte{192, 0, 2, 2}), Dst: tcpip.AddrFrom4([4]byte{192, 0, 2, 1}),
		Proto: header.UDPProtocolNumber, SrcPort: 40000, DstPort: s.dport, Payload: s.payload,
	}
	if s.v6 {
		f.Src = tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 2})
		f.Dst = tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 1})
	}
	if s.tcp {
		f.Proto, f.Seq, f.Ack, f.Flags, f.Window = header.TCPProtocolNumber, 1, 1, header.TCPFlagAck|header.TCPFlagPsh, 1000
	}
	return f.Build()
}

// TestXSKRedirect sends TCP and UDP frames over IPv4 and IPv6 to the
// xsk:7000 program's port and to another UDP port: the first arrive on the
// socket's RX ring, in order and byte for byte, the others in gVisor's UDP
// socket; a TCP flow through gVisor stays intact meanwhile.
func TestXSKRedirect(t *testing.T) {
	// A headroom of 600 leaves 1448 bytes of data room per frame.
	bed := newXSKBed(t, 7000, xsk.Config{NumFrames: 128, FrameSize: 2048, Headroom: 600, FillSize: 128, RxSize: 128}, 128)
	u, err := bed.rx.ListenUDP(netip.MustParseAddrPort("192.0.2.1:7001"))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()

	var toXSK [][]byte
	wantUDP := map[string]bool{}
	for i := range 40 {
		payload := bytes.Repeat([]byte{byte(i), byte(i * 3)}, 1+i*17)
		f := xskFrameSpec{tcp: i%4 == 1, v6: i%3 == 2, dport: 7000, payload: payload}.frame()
		toXSK = append(toXSK, f)
		bed.send(t, f)
		if i%5 == 0 {
			p := fmt.Appendf(nil, "to gVisor %d", i)
			wantUDP[string(p)] = true
			bed.send(t, xskFrameSpec{dport: 7001, payload: p}.frame())
		}
	}
	// Full-size frames (1514 bytes) do not fit the socket's frames: it
	// drops them.
	bed.send(t, xskFrameSpec{dport: 7000, payload: make([]byte, 1472)}.frame())
	bed.send(t, xskFrameSpec{v6: true, tcp: true, dport: 7000, payload: make([]byte, 1440)}.frame())

	waitCounters(t, bed.rx, map[string]uint64{"rx_xdp_redirect_xsk": 42, "rx_xsk_packets": 40, "rx_xsk_dropped": 2})
	n, idx := bed.sock.RX().Peek(128)
	if int(n) != len(toXSK) {
		t.Fatalf("RX ring: %d descriptors, want %d", n, len(toXSK))
	}
	um := bed.sock.UMEM()
	for i, want := range toXSK {
		d := *bed.sock.RX().Entry(idx + uint32(i))
		if d.Addr&uint64(um.FrameSize()-1) != uint64(um.Headroom()) {
			t.Errorf("frame %d at %#x: not at its UMEM frame's headroom", i, d.Addr)
		}
		if got := um.Data(d.Addr, int(d.Len)); !bytes.Equal(got, want) {
			t.Errorf("frame %d: got %d bytes %x, want %d bytes %x", i, len(got), got[:min(len(got), 64)], len(want), want[:64])
		}
	}
	bed.sock.RX().Release(n)

	buf := make([]byte, 2048)
	for len(wantUDP) > 0 {
		u.SetReadDeadline(time.Now().Add(5 * time.Second))
		m, _, err := u.ReadFrom(buf)
		if err != nil {
			t.Fatalf("gVisor UDP socket: %v; still missing %v", err, wantUDP)
		}
		if !wantUDP[string(buf[:m])] {
			t.Fatalf("gVisor UDP socket: unexpected datagram %q", buf[:m])
		}
		delete(wantUDP, string(buf[:m]))
	}

	// A TCP flow through gVisor, from a peer stack on the same wire.
	peer, err := New(Config{Wire: bed.wire, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}, MAC: xskPeerMAC})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	bulkTo(t, bed.rx, peer, netip.MustParseAddrPort("192.0.2.1:5001"), 4<<20)
	c := counterMap(bed.rx)
	if c["rx_xdp_redirect_xsk"] != 42 || c["rx_xdp_pass"] == 0 {
		t.Errorf("rx_xdp_redirect_xsk %d, rx_xdp_pass %d: want 42 and > 0", c["rx_xdp_redirect_xsk"], c["rx_xdp_pass"])
	}
}

// TestXSKDrops fills the socket's fill ring and then its RX ring: the
// frames that find no fill entry or no RX slot are dropped and counted by
// the kernel's names, and a frame dropped for a full RX ring leaves its
// fill entry for the next.
func TestXSKDrops(t *testing.T) {
	bed := newXSKBed(t, 7000, xsk.Config{NumFrames: 8, FrameSize: 2048, FillSize: 8, RxSize: 4}, 2)
	f := xskFrameSpec{dport: 7000, payload: []byte("drop me maybe")}.frame()
	for range 3 {
		bed.send(t, f)
	}
	waitCounters(t, bed.rx, map[string]uint64{"rx_xdp_redirect_xsk": 3, "rx_xsk_packets": 2,
		"rx_xsk_fill_ring_empty_descs": 1, "rx_xsk_dropped": 1, "rx_xsk_ring_full": 0})

	// Five fill entries but two RX slots left: two frames in, one
	// dropped for the full ring.
	got, idx := bed.sock.Fill().Reserve(5)
	for i := range got {
		*bed.sock.Fill().Entry(idx + i) = bed.sock.UMEM().FrameAddr(2 + int(i))
	}
	bed.sock.Fill().Submit(got)
	for range 3 {
		bed.send(t, f)
	}
	waitCounters(t, bed.rx, map[string]uint64{"rx_xdp_redirect_xsk": 6, "rx_xsk_packets": 4,
		"rx_xsk_fill_ring_empty_descs": 1, "rx_xsk_dropped": 1, "rx_xsk_ring_full": 1})
	n, _ := bed.sock.RX().Peek(8)
	if n != 4 {
		t.Fatalf("RX ring: %d descriptors, want 4", n)
	}
	bed.sock.RX().Release(n)
	// The three fill entries left serve three more frames.
	for range 3 {
		bed.send(t, f)
	}
	waitCounters(t, bed.rx, map[string]uint64{"rx_xdp_redirect_xsk": 9, "rx_xsk_packets": 7,
		"rx_xsk_fill_ring_empty_descs": 1, "rx_xsk_dropped": 1, "rx_xsk_ring_full": 1})
}

// TestXSKUnbound checks that with no socket bound the xsk program's
// frames pass to gVisor, and that BindXSK(nil) unbinds.
func TestXSKUnbound(t *testing.T) {
	bed := newXSKBed(t, 7000, xsk.Config{NumFrames: 8, FrameSize: 2048, FillSize: 8}, 8)
	if err := bed.rx.BindXSK(nil); err != nil {
		t.Fatal(err)
	}
	u, err := bed.rx.ListenUDP(netip.MustParseAddrPort("192.0.2.1:7000"))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	bed.send(t, xskFrameSpec{dport: 7000, payload: []byte("to gVisor")}.frame())
	u.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	m, _, err := u.ReadFrom(buf)
	if err != nil || string(buf[:m]) != "to gVisor" {
		t.Fatalf("gVisor UDP socket: got %q, %v; want \"to gVisor\"", buf[:m], err)
	}
	if c := counterMap(bed.rx); c["rx_xdp_redirect_xsk"] != 0 || c["rx_xdp_pass"] != 1 {
		t.Errorf("rx_xdp_redirect_xsk %d, rx_xdp_pass %d: want 0 and 1", c["rx_xdp_redirect_xsk"], c["rx_xdp_pass"])
	}
}

// TestXSKRxNoAllocs pins the receive path of a redirected frame, from the
// wire through the NIC model, the poll loop, the XDP program and the copy
// into the socket, at zero allocations, with the application recycling
// the frame through the RX and fill rings.
func TestXSKRxNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	bed := newXSKBed(t, 7000, xsk.Config{NumFrames: 64, FrameSize: 2048, FillSize: 64, RxSize: 64}, 64)
	frame := xskFrameSpec{dport: 7000, payload: make([]byte, 1400)}.frame()
	wf := make([]byte, driver.VirtioNetHdrLen+len(frame))
	copy(wf[driver.VirtioNetHdrLen:], frame)
	rxr, fill := bed.sock.RX(), bed.sock.Fill()
	recv := func() {
		if err := bed.wire.Write(wf); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for rxr.Avail(1) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the frame did not reach the RX ring")
			}
			runtime.Gosched()
		}
		n, idx := rxr.Peek(1)
		addr := rxr.Entry(idx).Addr
		rxr.Release(n)
		got, fidx := fill.Reserve(1)
		*fill.Entry(fidx) = addr
		fill.Submit(got)
	}
	for range 200 {
		recv() // warm up
	}
	if a := testing.AllocsPerRun(500, recv); a != 0 {
		t.Errorf("allocations per redirected frame: got %v, want 0", a)
	}
	if c := counterMap(bed.rx); c["rx_xsk_packets"] != 701 {
		t.Errorf("rx_xsk_packets: got %d, want 701", c["rx_xsk_packets"])
	}
}

// TestBindXSKNilWaitsForReceive holds the poll loop inside the socket's
// receive (the inReceive hook) while BindXSK(nil) runs: BindXSK must not
// return until the poll loop is out, after which the application may free
// the socket. The hook waits until BindXSK has unbound the socket, then
// gives a BindXSK that does not wait half a second to return (it does so
// within microseconds); a BindXSK that waits passes whatever the load.
func TestBindXSKNilWaitsForReceive(t *testing.T) {
	bed := newXSKBed(t, 7000, xsk.Config{NumFrames: 8, FrameSize: 2048, FillSize: 8, RxSize: 8}, 8)
	entered, left := make(chan struct{}), make(chan struct{})
	var returned, returnedInside, stuck atomic.Bool
	bed.rx.ep.xsk.inReceive = func() { // set before any frame is sent
		close(entered) // once: the test sends one frame
		defer close(left)
		for deadline := time.Now().Add(30 * time.Second); bed.rx.ep.xsk.sock.Load() != nil; runtime.Gosched() {
			if time.Now().After(deadline) {
				stuck.Store(true)
				return
			}
		}
		for deadline := time.Now().Add(500 * time.Millisecond); !returned.Load() && time.Now().Before(deadline); {
			runtime.Gosched()
		}
		returnedInside.Store(returned.Load())
	}
	bed.send(t, xskFrameSpec{dport: 7000, payload: []byte("hold")}.frame())
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the poll loop did not reach the socket's receive within 30 s")
	}
	unbound := make(chan error, 1)
	go func() {
		err := bed.rx.BindXSK(nil)
		returned.Store(true)
		unbound <- err
	}()
	select {
	case err := <-unbound:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("BindXSK(nil) did not return within 30 s")
	}
	select {
	case <-left:
	case <-time.After(60 * time.Second):
		t.Fatal("the poll loop did not leave the socket's receive within 60 s")
	}
	if stuck.Load() {
		t.Fatal("BindXSK(nil) did not unbind the socket within 30 s")
	}
	if returnedInside.Load() {
		t.Error("BindXSK(nil) returned while the poll loop was inside the socket's receive")
	}
	// The frame the poll loop held still went to the socket it had loaded.
	waitCounters(t, bed.rx, map[string]uint64{"rx_xdp_redirect_xsk": 1})
}
