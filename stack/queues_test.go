package stack

import (
	"net/netip"
	"slices"
	"sync"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/bufpool"
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
	var h uint32
	for _, c := range append(append([]byte(nil), a...), l4[0], l4[1]) {
		h += uint32(c)
	}
	for _, c := range append(append([]byte(nil), b...), l4[2], l4[3]) {
		h += uint32(c)
	}
	return int(h) % n
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
	rxCfg.Pool = bufpool.Config{Poison: true}
	rx, err := New(rxCfg)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := New(Config{Wire: b, MAC: [6]byte{2, 0, 0, 0, 0, 2}, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
	if err != nil {
		rx.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close(); rx.Close() })
	if rx.Queues() != 2 {
		t.Fatalf("Queues: %d, want 2", rx.Queues())
	}
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
