//go:build linux

package integration

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver/xsk"
	"github.com/ustack/ustack/stack"
)

// xskApp is the application side of an AF_XDP socket bound to the stack:
// it consumes the RX ring, checks every frame's headers, hashes the UDP
// payloads per IP family in arrival order, and hands the frames back to
// the fill ring.
type xskApp struct {
	sock *xsk.Socket
	port uint16
	sums [2]hash.Hash // ipv4, ipv6
	got  atomic.Uint64
	err  error // the first bad frame
}

func newXSKApp(sock *xsk.Socket, port uint16) *xskApp {
	a := &xskApp{sock: sock, port: port, sums: [2]hash.Hash{sha256.New(), sha256.New()}}
	fill := sock.Fill()
	n := uint32(min(sock.UMEM().NumFrames(), int(fill.Size())))
	got, idx := fill.Reserve(n)
	for i := range got {
		*fill.Entry(idx + i) = sock.UMEM().FrameAddr(int(i))
	}
	fill.Submit(got)
	return a
}

// run consumes until want frames arrived or stop closes.
func (a *xskApp) run(want uint64, stop <-chan struct{}) {
	rx, fill, u := a.sock.RX(), a.sock.Fill(), a.sock.UMEM()
	for a.got.Load() < want {
		n, idx := rx.Peek(64)
		if n == 0 {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Microsecond):
			}
			continue
		}
		_, fidx := fill.Reserve(n) // cannot fail: the fill ring holds every frame
		for i := range n {
			d := *rx.Entry(idx + i)
			if err := a.frame(u.Data(d.Addr, int(d.Len))); err != nil && a.err == nil {
				a.err = fmt.Errorf("frame %d: %w", a.got.Load()+uint64(i), err)
			}
			*fill.Entry(fidx + i) = d.Addr
		}
		fill.Submit(n)
		rx.Release(n)
		a.got.Add(uint64(n))
	}
}

// frame checks an Ethernet/IP/UDP frame to a.port and hashes its payload.
func (a *xskApp) frame(b []byte) error {
	if len(b) < header.EthernetMinimumSize {
		return fmt.Errorf("%d bytes", len(b))
	}
	l3 := b[header.EthernetMinimumSize:]
	var fam int
	var seg []byte
	switch header.Ethernet(b).Type() {
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(l3)
		if !ip.IsValid(len(l3)) || ip.TransportProtocol() != header.UDPProtocolNumber || !ip.IsChecksumValid() {
			return fmt.Errorf("not a valid IPv4/UDP packet")
		}
		seg = ip.Payload()
	case header.IPv6ProtocolNumber:
		ip := header.IPv6(l3)
		if !ip.IsValid(len(l3)) || ip.TransportProtocol() != header.UDPProtocolNumber {
			return fmt.Errorf("not a valid IPv6/UDP packet")
		}
		fam, seg = 1, ip.Payload()
	default:
		return fmt.Errorf("ethertype %#x", header.Ethernet(b).Type())
	}
	udp := header.UDP(seg)
	if len(seg) < header.UDPMinimumSize || int(udp.Length()) != len(seg) || udp.DestinationPort() != a.port {
		return fmt.Errorf("UDP header %x of a %d-byte segment", seg[:min(len(seg), 8)], len(seg))
	}
	a.sums[fam].Write(udp.Payload())
	return nil
}

// TestXSKReceive sends UDP datagrams from kernel sockets in the bed's
// namespace, over IPv4 and IPv6, through the TAP to a stack running the
// xsk:7000 program with an AF_XDP socket bound: every datagram must arrive
// on the socket's RX ring (the SHA-256 of the payloads per family matches
// what was sent), while a kernel TCP flow to the stack on another port
// goes through gVisor intact.
func TestXSKReceive(t *testing.T) {
	needRoot(t)
	const (
		port   = 7000
		count  = 4000 // datagrams per family
		window = 256  // datagrams sent and not yet on the RX ring: the RX and fill rings hold 2048
	)
	prog, err := cpumap.ParseProgram(fmt.Sprint("xsk:", port), 1)
	if err != nil {
		t.Fatal(err)
	}
	r := newRigConfig(t, "usit-xskrx", 1500, stack.Config{XDP: prog})
	sock, err := xsk.New(xsk.Config{NumFrames: 2048, FrameSize: 2048, FillSize: 2048, RxSize: 2048}, discardXSKWire{})
	if err != nil {
		t.Fatal(err)
	}
	app := newXSKApp(sock, port)
	if err := r.st.BindXSK(sock); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		app.run(2*count, stop)
	}()
	var stopOnce sync.Once
	stopApp := func() {
		stopOnce.Do(func() { close(stop) })
		wg.Wait()
	}
	defer stopApp()

	// Resolve the neighbours first, both ways: the kernel queues only a
	// few datagrams while it waits for ARP or ND. A connection refused by
	// a closed port does it.
	for _, v6 := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if c, err := r.bed.NS.DialTCP(ctx, r.stackAP(v6, 1), cc); err == nil {
			c.Close()
		}
		cancel()
	}

	// The kernel UDP senders, paced by what reached the RX ring (not by
	// retries: a lost datagram fails the test).
	type sent struct {
		sums [2][32]byte
		err  error
	}
	res := make(chan sent, 1)
	go func() {
		var s sent
		var conns [2]interface{ Write([]byte) (int, error) }
		for fam, v6 := range []bool{false, true} {
			k, err := r.bed.NS.DialUDP(r.stackAP(v6, port))
			if err != nil {
				s.err = err
				res <- s
				return
			}
			defer k.Close()
			conns[fam] = k
		}
		hs := [2]hash.Hash{sha256.New(), sha256.New()}
		buf := make([]byte, 1472)
		deadline := time.Now().Add(60 * time.Second)
		for i := range 2 * count {
			for uint64(i) >= app.got.Load()+window {
				if time.Now().After(deadline) {
					s.err = fmt.Errorf("after %d datagrams sent, %d on the RX ring: stalled", i, app.got.Load())
					res <- s
					return
				}
				time.Sleep(50 * time.Microsecond)
			}
			fam := i % 2
			size := 16 + (i*37)%(1400-16)
			b := buf[:size]
			fillDatagram(b, uint32(i))
			hs[fam].Write(b)
			if _, err := conns[fam].Write(b); err != nil {
				s.err = fmt.Errorf("datagram %d: %w", i, err)
				res <- s
				return
			}
		}
		hs[0].Sum(s.sums[0][:0])
		hs[1].Sum(s.sums[1][:0])
		res <- s
	}()

	// Meanwhile, a TCP flow to the stack through gVisor.
	kernelToStack(t, r, false, 5001, 16<<20, 7)

	var s sent
	select {
	case s = <-res:
	case <-time.After(90 * time.Second):
		t.Fatal("the UDP senders did not finish")
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	for deadline := time.Now().Add(10 * time.Second); app.got.Load() < 2*count && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	stopApp()
	if app.err != nil {
		t.Error(app.err)
	}
	if got := app.got.Load(); got != 2*count {
		t.Fatalf("RX ring: got %d frames, want %d; counters: %s", got, 2*count, xskCounters(r.st))
	}
	for fam := range 2 {
		var sum [32]byte
		app.sums[fam].Sum(sum[:0])
		if sum != s.sums[fam] {
			t.Errorf("%s: sha256 of the payloads on the RX ring %x, want %x", family(fam == 1), sum, s.sums[fam])
		}
	}
	c := counters(r.st)
	if c["rx_xdp_redirect_xsk"] != 2*count || c["rx_xsk_packets"] != 2*count || c["rx_xsk_dropped"] != 0 || c["rx_xsk_ring_full"] != 0 {
		t.Errorf("counters: %s; want rx_xdp_redirect_xsk and rx_xsk_packets %d, no drops", xskCounters(r.st), 2*count)
	}
	t.Logf("counters: %s", xskCounters(r.st))
}

// discardXSKWire is the receiving socket's unused TX wire.
type discardXSKWire struct{}

func (discardXSKWire) Write([]byte) error { return nil }

// xskCounters lists the XDP and XSK counters, for messages.
func xskCounters(st *stack.Stack) string {
	s := ""
	st.EachCounter(func(name string, v uint64) {
		if v != 0 && (len(name) > 7 && (name[:7] == "rx_xdp_" || name[:7] == "rx_xsk_")) {
			s += fmt.Sprintf(" %s=%d", name, v)
		}
	})
	return s
}
