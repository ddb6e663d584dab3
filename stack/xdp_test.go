package stack

import (
	"context"
	"crypto/sha256"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// pairConfig is pair with a whole stack configuration for the receiver.
func pairConfig(t testing.TB, cfg Config) (rx, peer *Stack) {
	t.Helper()
	cfg.Addrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64")}
	return newPair(t, cfg, Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24"), netip.MustParsePrefix("2001:db8::2/64")}})
}

// newPair builds the receiver rxCfg and the peer peerCfg on the two ends of
// an in-memory wire (MACs ...:01 and ...:02). The receiver's pool poisons
// (its pages are chunks with ZeroCopy); cleanup checks that every page came
// back.
func newPair(t testing.TB, rxCfg, peerCfg Config) (rx, peer *Stack) {
	t.Helper()
	a, b := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535+18)
	return newPairOn(t, a, b, rxCfg, peerCfg)
}

// newPairOn is newPair on the wires a (the receiver's) and b.
func newPairOn(t testing.TB, a, b driver.Wire, rxCfg, peerCfg Config) (rx, peer *Stack) {
	t.Helper()
	pc := bufpool.Config{Poison: true, RingSize: 1 << 15}
	if rxCfg.ZeroCopy {
		pc.Memory = newViewMemory()
	}
	pool := testutil.NewPool(t, pc)
	rxCfg.Driver.Pool = pool
	rxCfg.Wire, rxCfg.MAC = a, [6]byte{2, 0, 0, 0, 0, 1}
	rx, err := New(rxCfg)
	if err != nil {
		t.Fatal(err)
	}
	peerCfg.Wire, peerCfg.MAC = b, [6]byte{2, 0, 0, 0, 0, 2}
	peer, err = New(peerCfg)
	if err != nil {
		rx.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		peer.Close()
		rx.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("pages still in use after Close: got %d, want 0", n)
		}
	})
	return rx, peer
}

func counterMap(s *Stack) map[string]uint64 {
	m := map[string]uint64{}
	s.EachCounter(func(name string, v uint64) { m[name] = v })
	return m
}

// bulkTo sends n pseudo-random bytes over TCP from peer to a listener at
// addr on rx and fails the test unless the SHA-256 of what arrived matches.
func bulkTo(t *testing.T, rx, peer *Stack, addr netip.AddrPort, n int) {
	t.Helper()
	l, err := rx.ListenTCP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan [32]byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(got)
			return
		}
		defer c.Close()
		h := sha256.New()
		io.Copy(h, c)
		var sum [32]byte
		h.Sum(sum[:0])
		got <- sum
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := peer.DialTCP(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	want, err := sendAndHash(c, n, 64<<10, 9)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case sum := <-got:
		if sum != want {
			t.Fatalf("sha256 of received bytes: got %x, want %x", sum, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("receiver did not finish")
	}
}

func TestCPUMapRedirect(t *testing.T) {
	for _, tc := range []struct {
		name          string
		noGRO, inline bool
	}{{"cpumap-gro-on", false, false}, {"cpumap-gro-off", true, false},
		// The workers' inline batches: run at each round's end, or
		// the segments would wait there.
		{"cpumap-gro-on/inline-tcp", false, true}, {"cpumap-gro-off/inline-tcp", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.inline && !inlineTCPAvailable {
				t.Skip("InlineTCP needs the patched gVisor")
			}
			prog, err := cpumap.ParseProgram("hash", 2)
			if err != nil {
				t.Fatal(err)
			}
			rx, peer := pairConfig(t, Config{XDP: prog, CPUMap: []int{0, 1}, NoCPUMapGRO: tc.noGRO, InlineTCP: tc.inline})
			bulkTo(t, rx, peer, netip.MustParseAddrPort("192.0.2.1:5001"), 16<<20)
			bulkTo(t, rx, peer, netip.MustParseAddrPort("[2001:db8::1]:5002"), 4<<20)
			c := counterMap(rx)
			if c["rx_xdp_redirect"] == 0 || c["cpumap_worker_frames"] == 0 {
				t.Errorf("rx_xdp_redirect %d, cpumap_worker_frames %d: want both > 0", c["rx_xdp_redirect"], c["cpumap_worker_frames"])
			}
			if !tc.noGRO && c["cpumap_rx_gro_skbs"] == 0 {
				t.Errorf("cpumap_rx_gro_skbs: got 0, want > 0 with cpumap GRO on")
			}
			if l, r := c["cpumap_worker_lists"], c["cpumap_worker_rounds"]; l == 0 || l < r { // read rounds first: a round adds to lists first
				t.Errorf("cpumap_worker_lists %d, cpumap_worker_rounds %d: want one list per round", l, r)
			}
			if c["cpumap_rx_csum_sw"]+c["cpumap_rx_csum_trusted"] == 0 {
				t.Errorf("cpumap_rx_csum_sw and cpumap_rx_csum_trusted: got 0, want every frame checked")
			}
			if tc.noGRO && c["cpumap_worker_flush_old"] != 0 {
				t.Errorf("cpumap_worker_flush_old: got %d, want 0 with cpumap GRO off (nothing held)", c["cpumap_worker_flush_old"])
			}
			if tc.noGRO && c["cpumap_rx_gro_skbs"] != 0 {
				t.Errorf("cpumap_rx_gro_skbs: got %d, want 0 with cpumap GRO off", c["cpumap_rx_gro_skbs"])
			}
		})
	}
}

func TestXDPDropPort(t *testing.T) {
	prog, err := cpumap.ParseProgram("drop-port:9", 1)
	if err != nil {
		t.Fatal(err)
	}
	rx, peer := pairConfig(t, Config{XDP: prog})
	u, err := rx.ListenUDP(netip.MustParseAddrPort("192.0.2.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	udpBurst(t, peer, netip.MustParseAddrPort("192.0.2.1:9"), 10, 100)
	u.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _, err := u.ReadFrom(make([]byte, 2000)); err == nil {
		t.Errorf("a datagram to the dropped port arrived (%d bytes)", n)
	}
	for deadline := time.Now().Add(5 * time.Second); counterMap(rx)["rx_xdp_drop"] < 10 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	c := counterMap(rx)
	if c["rx_xdp_drop"] < 10 {
		t.Errorf("rx_xdp_drop: got %d, want >= 10", c["rx_xdp_drop"])
	}
	// Other ports still pass.
	bulkTo(t, rx, peer, netip.MustParseAddrPort("192.0.2.1:5001"), 1<<20)
}

// reflector is an XDP program that sends UDP datagrams to port 7 straight
// back out of the wire (XDP_TX), with addresses and ports swapped: the UDP
// checksum stays valid, as the swap does not change the sum.
type reflector struct{}

func (reflector) Run(l []byte) (cpumap.Action, int) {
	if len(l) < 14+20+8 || l[12] != 0x08 || l[13] != 0x00 || l[14+9] != 17 || l[14+20+2] != 0 || l[14+20+3] != 7 {
		return cpumap.Pass, 0
	}
	var mac [6]byte
	copy(mac[:], l[0:6])
	copy(l[0:6], l[6:12])
	copy(l[6:12], mac[:])
	var ip [4]byte
	copy(ip[:], l[26:30])
	copy(l[26:30], l[30:34])
	copy(l[30:34], ip[:])
	u := l[34:]
	u[0], u[1], u[2], u[3] = u[2], u[3], u[0], u[1]
	return cpumap.TX, 0
}

func TestXDPTX(t *testing.T) {
	rx, peer := pairConfig(t, Config{XDP: reflector{}})
	udpBurst(t, peer, netip.MustParseAddrPort("192.0.2.1:1"), 1, 10) // neighbours resolved
	pu, err := peer.ListenUDP(netip.MustParseAddrPort("192.0.2.2:6000"))
	if err != nil {
		t.Fatal(err)
	}
	defer pu.Close()
	msg := []byte("reflect me, XDP")
	if _, err := pu.WriteTo(msg, net.UDPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.1:7"))); err != nil {
		t.Fatal(err)
	}
	pu.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	n, from, err := pu.ReadFrom(buf)
	if err != nil {
		t.Fatalf("reflected datagram: %v (rx_xdp_tx %d)", err, counterMap(rx)["rx_xdp_tx"])
	}
	if string(buf[:n]) != string(msg) || from.String() != "192.0.2.1:7" {
		t.Errorf("reflected datagram: got %q from %v, want %q from 192.0.2.1:7", buf[:n], from, msg)
	}
	if c := counterMap(rx); c["rx_xdp_tx"] != 1 || c["rx_xdp_tx_errors"] != 0 {
		t.Errorf("rx_xdp_tx %d, rx_xdp_tx_errors %d: want 1 and 0", c["rx_xdp_tx"], c["rx_xdp_tx_errors"])
	}
}

// countDispatcher counts the packets gVisor gets, from any goroutine.
type countDispatcher struct{ n atomic.Int64 }

func (d *countDispatcher) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *gstack.PacketBuffer) {
	d.n.Add(1)
}
func (d *countDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *gstack.PacketBuffer) {}

// TestCPUMapChecksumNone: a redirected frame loses the checksum status the
// NIC gave it (an xdp_frame becomes a CHECKSUM_NONE skb), so the worker
// verifies in software what the NIC had verified (cpumap_rx_csum_sw); a
// frame the NIC found bad goes up unverified and is dropped and counted
// (udp_checksum_errors; with GRO on, also cpumap_rx_gro_csum_bad); a frame
// the TAP vouched for with no checksum in its bytes (NEEDS_CSUM) stays
// trusted (cpumap_rx_csum_trusted). With cpumap GRO on and off, for frames
// that carry a packet and for frames the worker builds one for.
func TestCPUMapChecksumNone(t *testing.T) {
	for _, noGRO := range []bool{false, true} {
		prog, err := cpumap.ParseProgram("cpu:0", 1)
		if err != nil {
			t.Fatal(err)
		}
		ep := &linkEndpoint{xdp: prog}
		var d countDispatcher
		ep.Attach(&d)
		if err := ep.startCPUMap(&Config{CPUMap: []int{0}, NoCPUMapGRO: noGRO}); err != nil {
			t.Fatal(err)
		}
		send := func(f []byte, verified bool) {
			p := bufpool.NewPacket()
			p.Linear = append(p.Linear, f...)
			p.Len, p.HdrLen, p.CsumVerified = len(f), len(f)-100, verified
			if !ep.XDP(bufpool.Frame{Pkt: p}) {
				t.Fatal("XDP: the cpu:0 program passed a frame")
			}
		}
		pool := testutil.NewPoisonPool(t)
		sendFrame := func(f []byte, verified bool) { // the linear RQ's: no packet yet
			pg, err := pool.Get()
			if err != nil {
				t.Fatal(err)
			}
			copy(pg.Bytes()[256:], f)
			if !ep.XDP(bufpool.Frame{Head: bufpool.Frag{Page: pg, Off: 256, Len: uint32(len(f))}, CsumVerified: verified}) {
				t.Fatal("XDP: the cpu:0 program passed a frame")
			}
		}
		sendSplit := func(f []byte) { // headers linear, payload in a page frag
			pg, err := pool.Get()
			if err != nil {
				t.Fatal(err)
			}
			p := bufpool.NewPacket()
			hdr := len(f) - 100
			p.Linear = append(p.Linear, f[:hdr]...)
			copy(pg.Bytes()[8:], f[hdr:])
			p.Frags = append(p.Frags, bufpool.Frag{Page: pg, Off: 8, Len: 100})
			p.Len, p.HdrLen, p.CsumVerified = len(f), hdr, true
			if !ep.XDP(bufpool.Frame{Pkt: p}) {
				t.Fatal("XDP: the cpu:0 program passed a frame")
			}
		}
		bad := csumFrame(true)
		bad[len(bad)-1] ^= 1
		partial := csumFrame(false)
		partial[header.EthernetMinimumSize+header.IPv4MinimumSize+16] ^= 0x55 // the TCP checksum
		send(csumFrame(true), true)
		send(csumFrame(false), true)
		send(bad, false)    // the NIC found it bad: CHECKSUM_NONE already
		send(partial, true) // NEEDS_CSUM: no checksum in its bytes
		sendSplit(csumFrame(true))
		sendFrame(csumFrame(true), true)
		sendFrame(bad, false)
		sendFrame(partial, true)
		ep.Flush(false)                           // the bulk queue goes to the ring
		if err := ep.cpumap.Close(); err != nil { // drains the ring, flushes GRO
			t.Fatal(err)
		}
		c := map[string]uint64{}
		ep.eachCPUMapGRO(func(name string, v uint64) { c[name] = v })
		if got := d.n.Load(); got != 6 {
			t.Errorf("gro off %v: packets to gVisor: got %d, want 6 (all but the bad ones)", noGRO, got)
		}
		if got := ep.csum.udp.Load(); got != 2 {
			t.Errorf("gro off %v: udp_checksum_errors: got %d, want 2", noGRO, got)
		}
		if got := c["cpumap_rx_csum_sw"]; got != 4 {
			t.Errorf("gro off %v: cpumap_rx_csum_sw: got %d, want 4", noGRO, got)
		}
		if got := c["cpumap_rx_csum_trusted"]; got != 2 {
			t.Errorf("gro off %v: cpumap_rx_csum_trusted: got %d, want 2", noGRO, got)
		}
		if got := ep.cpumap.Stats().WorkerBuilt(); got != 3 {
			t.Errorf("gro off %v: cpumap_worker_built: got %d, want 3", noGRO, got)
		}
		if got, want := c["cpumap_rx_gro_csum_bad"], map[bool]uint64{false: 2, true: 0}[noGRO]; got != want {
			t.Errorf("gro off %v: cpumap_rx_gro_csum_bad: got %d, want %d", noGRO, got, want)
		}
	}
}
