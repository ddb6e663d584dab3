package stack

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
)

// queueBridge stands for a multi-queue TAP's kernel side between a peer's
// wire and a stack's queues: a frame from the peer goes to the queue its
// flow hashes to (symmetric in the addresses and ports, as
// __skb_get_hash_symmetric), and a frame from any queue goes to the peer.
type queueBridge struct {
	peer   *driver.MemWire
	queues []*driver.MemWire
	wg     sync.WaitGroup
}

func flowQueue(frame []byte, n int) int {
	var fi driver.FrameInfo
	if driver.ParseFrame(frame, &fi) != driver.DropNone || fi.L4 != driver.L4TCP && fi.L4 != driver.L4UDP {
		return 0
	}
	ip := frame[fi.L2Len:]
	var a, b []byte
	if fi.L3 == driver.L3IPv4 {
		a, b = ip[12:16], ip[16:20]
	} else {
		a, b = ip[8:24], ip[24:40]
	}
	l4 := frame[fi.L2Len+fi.L3Len:]
	return hashQueue(n, a, l4[0:2], b, l4[2:4])
}

// hashQueue is flowQueue's hash: the sum of the addresses' and ports'
// bytes, the same either way round, modulo n.
func hashQueue(n int, parts ...[]byte) int {
	var h uint32
	for _, p := range parts {
		for _, c := range p {
			h += uint32(c)
		}
	}
	return int(h) % n
}

// connQueue returns the queue of n the bridge gives c's flow.
func connQueue(c net.Conn, n int) int {
	var parts [][]byte
	for _, a := range []net.Addr{c.LocalAddr(), c.RemoteAddr()} {
		ap := a.(*net.TCPAddr).AddrPort()
		parts = append(parts, ap.Addr().Unmap().AsSlice(), binary.BigEndian.AppendUint16(nil, ap.Port()))
	}
	return hashQueue(n, parts...)
}

func (br *queueBridge) start() {
	forward := func(from *driver.MemWire, to func([]byte) *driver.MemWire) {
		defer br.wg.Done()
		buf := make([]byte, driver.VirtioNetHdrLen+65535+18)
		for {
			n, err := from.Read(buf, true)
			if err != nil {
				return
			}
			to(buf[driver.VirtioNetHdrLen:n]).Write(buf[:n])
		}
	}
	br.wg.Add(1 + len(br.queues))
	go forward(br.peer, func(f []byte) *driver.MemWire { return br.queues[flowQueue(f, len(br.queues))] })
	for _, q := range br.queues {
		go forward(q, func([]byte) *driver.MemWire { return br.peer })
	}
}

// TestQueues: a stack on two queues (Config.Queues) gets each flow on the
// queue the bridge's hash picks, every byte of every flow, and counts each
// queue's packets under ethtool's names (rx0_packets, rx1_packets, their
// sum rx_packets); its replies leave on both queues (txQueue). Also with an
// XDP program redirecting every frame to a cpumap worker from both queues'
// poll loops (a producer each), and with zero copy (pages lent from both
// queues' pools).
func TestQueues(t *testing.T) {
	prog, err := cpumap.ParseProgram("cpu:0", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // a counter that must move
	}{
		{"plain", Config{}, "rx_gro_skbs"},
		{"xdp-cpumap", Config{XDP: prog, CPUMap: []int{0}, Driver: driver.Config{LRO: false}}, "cpumap_worker_built"},
		{"zero-copy", Config{ZeroCopy: true}, "zc_views_lent"},
	} {
		t.Run(tc.name, func(t *testing.T) { testQueues(t, tc.cfg, tc.want) })
	}
	for _, bad := range []Config{
		{Wire: &driver.MemWire{}, Queues: []driver.Wire{nil}},
		{Wire: &driver.MemWire{}, Queues: make([]driver.Wire, driver.MaxQueues)},
	} {
		for i := range bad.Queues {
			if i > 0 {
				bad.Queues[i] = &driver.MemWire{}
			}
		}
		if err := checkQueues(&bad); err == nil {
			t.Errorf("checkQueues(%d queues): no error", 1+len(bad.Queues))
		}
	}
}

func testQueues(t *testing.T, rxCfg Config, want string) {
	rx, peer := newQueuePair(t, rxCfg)
	// 16 flows: their ports are the peer's ephemeral ones, so each
	// queue gets none of them with odds 2^-16 (with 6, 1 in 32 runs put
	// every flow on one queue).
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			bulkTo(t, rx, peer, netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(5001+i)), 512<<10)
		})
	}
	wg.Wait()
	peer.Close()
	rx.Close() // the counters stop moving: totals and queues add up
	c := counterMap(rx)
	if c["rx0_packets"] == 0 || c["rx1_packets"] == 0 || c["rx0_packets"]+c["rx1_packets"] != c["rx_packets"] {
		t.Errorf("rx0_packets %d, rx1_packets %d, rx_packets %d: want both queues used and their sum", c["rx0_packets"], c["rx1_packets"], c["rx_packets"])
	}
	if c["tx0_packets"] == 0 || c["tx1_packets"] == 0 {
		t.Errorf("tx0_packets %d, tx1_packets %d: want replies on both queues", c["tx0_packets"], c["tx1_packets"])
	}
	if _, ok := c["q1_poll_cpu_ns"]; !ok {
		t.Errorf("no q1_poll_cpu_ns: want queue 1's other counters too")
	}
	if c[want] == 0 {
		t.Errorf("%s: 0, want > 0", want)
	}
	for q := range rx.Queues() {
		if n := rx.QueueDriver(q).Pool().InUse(); n != 0 {
			t.Errorf("queue %d: %d pages in use after Close", q, n)
		}
	}
}

// newQueuePair builds a receiver rxCfg on two queues of a queueBridge
// (192.0.2.1, pools made by New) and a peer on its other side
// (192.0.2.2). Cleanup closes both and the bridge.
func newQueuePair(t *testing.T, rxCfg Config) (rx, peer *Stack) {
	t.Helper()
	a0, a0p := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535+18)
	a1, a1p := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535+18)
	b, bp := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65535+18)
	br := &queueBridge{peer: bp, queues: []*driver.MemWire{a0p, a1p}}
	br.start()
	t.Cleanup(func() {
		for _, w := range []*driver.MemWire{a0p, a1p, bp} {
			w.Close()
		}
		br.wg.Wait()
	})
	rxCfg.Wire, rxCfg.Queues, rxCfg.MAC = a0, []driver.Wire{a1}, [6]byte{2, 0, 0, 0, 0, 1}
	rxCfg.Addrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}
	rxCfg.Pool.Poison = true
	rx, err := New(rxCfg)
	if err != nil {
		t.Fatal(err)
	}
	peer, err = New(Config{Wire: b, MAC: [6]byte{2, 0, 0, 0, 0, 2}, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
	if err != nil {
		rx.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close(); rx.Close() })
	if rx.Queues() != 2 {
		t.Fatalf("Queues: %d, want 2", rx.Queues())
	}
	return rx, peer
}

// TestQueuesReadViews: with zero copy on two queues and coalescing hw-gro,
// ReadViews maps whole pages of a flow on queue 1 as it does of one on
// queue 0: every queue's pool hands out chunks of the one index mapPage
// looks in.
func TestQueuesReadViews(t *testing.T) {
	const size = 4 << 20
	rx, peer := newQueuePair(t, Config{ZeroCopy: true, Driver: driver.Config{HWGRO: driver.HWGROCoalesce}})
	addr := netip.MustParseAddrPort("192.0.2.1:10")
	l, err := rx.ListenTCP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, q := range []int{1, 0} {
		// Dial until the peer's ephemeral port puts the flow on queue q
		// (each try does with odds 1/2).
		var pc net.Conn
		var c *TCPConn
		for try := 0; pc == nil; try++ {
			if try == 64 {
				t.Fatalf("no flow on queue %d in 64 connections", q)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			d, err := peer.DialTCP(ctx, addr)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			ac := acceptTCP(t, l)
			if connQueue(d, 2) != q {
				d.Close()
				ac.Close()
				continue
			}
			pc, c = d, ac
		}
		before := counterMap(rx)[queueCounterName("rx_packets", q)]
		pc.SetDeadline(time.Now().Add(60 * time.Second))
		want := make(chan [32]byte, 1)
		go func() {
			defer pc.Close()
			sum, err := sendAndHash(pc, size, 64<<10, 7)
			if err != nil {
				sum = [32]byte{} // matches nothing: the receiver reports it
			}
			want <- sum
		}()
		h := sha256.New()
		total := 0
		vs := make([]View, 0, 64)
		for {
			var n int
			vs, n, err = c.ReadViews(vs[:0], 1<<20)
			for i := range vs {
				h.Write(vs[i].Bytes())
				vs[i].Release()
			}
			total += n
			if err != nil {
				break
			}
		}
		if !errors.Is(err, io.EOF) {
			t.Fatalf("queue %d: ReadViews: %v after %d bytes", q, err, total)
		}
		var got [32]byte
		h.Sum(got[:0])
		if w := <-want; got != w || total != size {
			t.Fatalf("queue %d: %d bytes read, sha256 %x; want %d, %x", q, total, got, size, w)
		}
		if after := counterMap(rx)[queueCounterName("rx_packets", q)]; after-before < size/65536 {
			t.Errorf("queue %d: rx%d_packets grew by %d during the transfer: the flow is not on it", q, q, after-before)
		}
		st := c.ViewStats()
		t.Logf("queue %d: mapped %d, copied %d bytes", q, st.MappedBytes, st.CopiedBytes)
		if st.MappedBytes < size/2 {
			t.Errorf("queue %d: mapped %d of %d bytes with coalescing, want at least half", q, st.MappedBytes, size)
		}
	}
}

func TestSplitQueueCounter(t *testing.T) {
	for _, tc := range []struct {
		name, base string
		q          int
		ok         bool
	}{
		{"rx3_packets", "rx_packets", 3, true},
		{"tx12_gso_packets", "tx_gso_packets", 12, true},
		{"q1_nic_cpu_ns", "nic_cpu_ns", 1, true},
		{"rx_packets", "", 0, false},
		{"rx_pkt_pages_1", "", 0, false},
		{"rx3", "", 0, false},
		{"queue_x", "", 0, false},
	} {
		base, q, ok := SplitQueueCounter(tc.name)
		if base != tc.base || q != tc.q || ok != tc.ok {
			t.Errorf("SplitQueueCounter(%q): got %q %d %v, want %q %d %v", tc.name, base, q, ok, tc.base, tc.q, tc.ok)
		}
		if ok && queueCounterName(base, q) != tc.name {
			t.Errorf("queueCounterName(%q, %d) = %q, want %q", base, q, queueCounterName(base, q), tc.name)
		}
	}
}

func TestQueuePin(t *testing.T) {
	for _, tc := range []struct {
		cpus    []int
		i, n    int
		want    []int
		comment string
	}{
		{[]int{0, 1}, 0, 1, []int{0, 1}, "one queue: the whole set"},
		{[]int{0, 1}, 0, 2, []int{0}, "queue 0 of 2"},
		{[]int{0, 1}, 1, 2, []int{1}, "queue 1 of 2"},
		{[]int{3}, 2, 4, []int{3}, "round robin over a short list"},
		{[]int{0, 1}, 3, 4, []int{1}, "round robin"},
		{nil, 1, 2, nil, "unpinned"},
	} {
		if got := queuePin(tc.cpus, tc.i, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("%s: queuePin(%v, %d, %d) = %v, want %v", tc.comment, tc.cpus, tc.i, tc.n, got, tc.want)
		}
	}
}

// TestTxQueueSpreads: flows that differ only in a source port of one
// parity (Linux's connect() ports) still spread over two and four queues.
func TestTxQueueSpreads(t *testing.T) {
	for _, n := range []int{2, 4} {
		counts := make([]int, n)
		for port := 40000; port < 40000+2*64; port += 2 {
			pkt := tcpPacketTo(t, uint16(port))
			counts[txQueue(pkt, n)]++
			pkt.DecRef()
		}
		for q, c := range counts {
			if c < 64/n/2 {
				t.Errorf("%d queues: queue %d got %d of 64 flows: %v", n, q, c, counts)
			}
		}
	}
}

// tcpPacketTo returns an outgoing TCP packet's buffer with its network and
// transport headers set, from 192.0.2.1:9 to 192.0.2.2:port.
func tcpPacketTo(t *testing.T, port uint16) *gstack.PacketBuffer {
	t.Helper()
	pkt := gstack.NewPacketBuffer(gstack.PacketBufferOptions{ReserveHeaderBytes: header.IPv4MinimumSize + header.TCPMinimumSize})
	tcp := header.TCP(pkt.TransportHeader().Push(header.TCPMinimumSize))
	tcp.Encode(&header.TCPFields{SrcPort: 9, DstPort: port, DataOffset: header.TCPMinimumSize})
	ip := header.IPv4(pkt.NetworkHeader().Push(header.IPv4MinimumSize))
	ip.Encode(&header.IPv4Fields{TotalLength: header.IPv4MinimumSize + header.TCPMinimumSize, Protocol: uint8(header.TCPProtocolNumber),
		SrcAddr: tcpip.AddrFrom4([4]byte{192, 0, 2, 1}), DstAddr: tcpip.AddrFrom4([4]byte{192, 0, 2, 2})})
	return pkt
}
