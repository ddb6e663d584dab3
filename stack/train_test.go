package stack

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// udpBurst sends count datagrams of size bytes from the peer to dst, each
// filled with its index, and returns them.
func udpBurst(t *testing.T, peer *Stack, dst netip.AddrPort, count, size int) [][]byte {
	t.Helper()
	resolveNeighbors(peer, dst.Addr())
	pu, err := peer.ListenUDP(netip.MustParseAddrPort("192.0.2.2:5555"))
	if err != nil {
		t.Fatal(err)
	}
	defer pu.Close()
	var sent [][]byte
	to := net.UDPAddrFromAddrPort(dst)
	for i := range count {
		b := bytes.Repeat([]byte{byte(i), byte(i >> 8)}, size/2)
		if _, err := pu.WriteTo(b, to); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, b)
	}
	return sent
}

// resolveNeighbors makes from and the stack at to know each other's link
// addresses before a test sends a burst: gVisor queues only a few packets
// while it waits for ARP, and sends the first one after later ones. A
// connection refused by a closed port does it, both ways.
func resolveNeighbors(from *Stack, to netip.Addr) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := from.DialTCP(ctx, netip.AddrPortFrom(to, 1)); err == nil {
		c.Close()
	}
}

func TestUDPTrains(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9999")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rx.ListenUDPTrains(dst); err == nil {
		t.Errorf("second ListenUDPTrains on one port: got nil error, want one")
	}
	// Bursts no larger than the train queue, each read before the next:
	// a TrainConn drops when its queue is full, as a socket does.
	const bursts, count, size = 12, 32, 1000
	var sent [][]byte
	var got []byte
	maxSegs := 0
	buf := make([]byte, 65536)
	for range bursts {
		sent = append(sent, udpBurst(t, peer, dst, count, size)...)
		for len(got) < len(sent)*size {
			n, seg, from, err := c.ReadTrain(buf, time.Now().Add(5*time.Second))
			if err != nil {
				t.Fatalf("after %d of %d bytes (drops %d): %v", len(got), len(sent)*size, c.Drops(), err)
			}
			if seg != size {
				t.Fatalf("segment size: got %d, want %d", seg, size)
			}
			if from != netip.MustParseAddrPort("192.0.2.2:5555") {
				t.Errorf("from: got %v, want 192.0.2.2:5555", from)
			}
			maxSegs = max(maxSegs, n/seg)
			got = append(got, buf[:n]...)
		}
	}
	if want := bytes.Join(sent, nil); !bytes.Equal(got, want) {
		t.Errorf("train payloads differ from the datagrams sent")
	}
	if maxSegs < 2 {
		t.Errorf("largest train: got %d datagrams, want several", maxSegs)
	}
	if d := c.Drops(); d != 0 {
		t.Errorf("drops: got %d, want 0", d)
	}
	c.Close()
	if _, _, _, err := c.ReadTrain(buf, time.Time{}); err != net.ErrClosed {
		t.Errorf("ReadTrain after Close: got %v, want net.ErrClosed", err)
	}
}

// TestUDPGROSplit sends a burst that GRO merges into trains and checks that
// a gVisor socket still gets every datagram as sent.
func TestUDPGROSplit(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9")
	u, err := rx.ListenUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	const count, size = 200, 600
	sent := udpBurst(t, peer, dst, count, size)
	buf := make([]byte, 2048)
	for i := range count {
		u.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := u.ReadFrom(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], sent[i]) {
			t.Fatalf("datagram %d: got %d bytes %x..., want %d bytes %x...", i, n, buf[:4], len(sent[i]), sent[i][:4])
		}
	}
	var skbs uint64
	rx.EachCounter(func(name string, v uint64) {
		if name == "rx_gro_skbs" {
			skbs = v
		}
	})
	if skbs == 0 {
		t.Errorf("rx_gro_skbs: got 0, want > 0 (the burst should have been merged)")
	}
}

// TestUnreadTrainKeepsPages leaves trains unread in a train socket while a
// bulk TCP flow cycles the RX ring many times over, then reads them: their
// payload must be intact, because a page referenced by an unread socket
// buffer is never reused (and poisoned pool pages would show any write).
func TestUnreadTrainKeepsPages(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9998")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const count, size = 32, 1200
	sent := udpBurst(t, peer, dst, count, size)
	deadline := time.Now().Add(5 * time.Second)
	for len(c.ready) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	inUse := rx.Driver().Pool().InUse()

	// 32 MiB of TCP through the same RX ring and pool.
	l, err := rx.ListenTCP(netip.MustParseAddrPort("192.0.2.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // discard the flow (stack/serve has the servers)
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(io.Discard, c)
		c.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc, err := peer.DialTCP(ctx, netip.MustParseAddrPort("192.0.2.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sendAndHash(tc, 32<<20, 64<<10, 3); err != nil {
		t.Fatal(err)
	}
	tc.Close()
	if got := rx.Driver().Pool().InUse(); got < 1 || inUse < 1 {
		t.Errorf("pages in use while trains are unread: got %d (before the flow %d), want > 0", got, inUse)
	}

	var got []byte
	buf := make([]byte, 65536)
	for len(got) < count*size {
		n, _, _, err := c.ReadTrain(buf, time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatalf("after %d of %d bytes: %v", len(got), count*size, err)
		}
		got = append(got, buf[:n]...)
	}
	if want := bytes.Join(sent, nil); !bytes.Equal(got, want) {
		t.Errorf("unread trains were overwritten while queued")
	}
}

// TestReadingReleasesPages checks the other half of the quarantine rule: a
// queued train holds references on its pages, and reading it drops them.
func TestReadingReleasesPages(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9997")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	udpBurst(t, peer, dst, 8, 1000)
	// Take the queued trains out, without reading them, until all 8
	// datagrams are in: one arriving after the count below would add
	// references of its own.
	deadline := time.Now().Add(5 * time.Second)
	var queued []queuedTrain
	for datagrams := 0; datagrams < 8; {
		select {
		case q := <-c.ready:
			queued = append(queued, q)
			datagrams += max(1, int(q.p.Segs))
		case <-time.After(time.Until(deadline)):
			t.Fatalf("datagrams queued: got %d, want 8", datagrams)
		}
	}
	refs := map[*bufpool.Page]int32{}
	for _, q := range queued {
		p := q.p
		if p.Head != nil {
			refs[p.Head]++ // the linear RQ's head frag (MTU 1500)
		}
		for _, f := range p.Frags {
			refs[f.Page]++
		}
	}
	if len(refs) == 0 {
		t.Fatal("queued trains hold no page frags")
	}
	for pg, n := range refs {
		if got := pg.Refs(); got < n {
			t.Errorf("page refs while queued: got %d, want >= %d (one per frag)", got, n)
		}
	}
	before := map[*bufpool.Page]int32{}
	for pg := range refs {
		before[pg] = pg.Refs()
	}
	for _, q := range queued {
		c.ready <- q
	}
	buf := make([]byte, 65536)
	for range queued {
		if _, _, _, err := c.ReadTrain(buf, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	for pg, n := range refs {
		if got, was := pg.Refs(), before[pg]; got != was-n {
			t.Errorf("page refs after reading: got %#x, want %#x (the %d frags of the trains dropped)", got, was-n, n)
		}
	}
}

func netipAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// TestTrainQueueCountsDatagrams: with GRO off every datagram is a train of
// one, and the queue still holds as many datagrams as GRO's full trains
// would fill (trainQueueDatagrams), because a train is charged per datagram
// as the kernel charges an skb's truesize against sk_rcvbuf. Bounded at 64
// trains, it dropped all but 64 of these.
func TestTrainQueueCountsDatagrams(t *testing.T) {
	rx, peer := pairConfig(t, Config{NoGRO: true})
	dst := netip.MustParseAddrPort("192.0.2.1:9997")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const count, size = 256, 64
	sent := udpBurst(t, peer, dst, count, size)
	testutil.WaitFor(t, "every datagram queued or dropped", func() bool {
		return len(c.ready)+int(c.Drops()) >= count
	})
	if d := c.Drops(); d != 0 {
		t.Errorf("drops of %d unread one-datagram trains: got %d, want 0", count, d)
	}
	buf := make([]byte, 65536)
	for i, want := range sent {
		n, _, _, err := c.ReadTrain(buf, time.Now().Add(30*time.Second))
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], want) {
			t.Fatalf("datagram %d: got %x, want %x", i, buf[:n], want)
		}
	}
	if got := c.rmem.Load(); got != 0 {
		t.Errorf("queue charge after reading everything: got %d, want 0", got)
	}
}

// TestTrainQueueTruesize: the queue is bounded in bytes of what its trains
// pin (their truesize) against the receive buffer SetReadBuffer sets, as
// __udp_enqueue_schedule_skb bounds sk_rmem_alloc by sk_rcvbuf: a train is
// queued while the queue holds at most the buffer, so the last one may
// overshoot; the rest are dropped and counted, and reading everything
// takes the charge back to zero.
func TestTrainQueueTruesize(t *testing.T) {
	rx, peer := pairConfig(t, Config{NoGRO: true})
	dst := netip.MustParseAddrPort("192.0.2.1:9996")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	const rcvbuf = 32 << 10 // doubled, as SO_RCVBUF
	const count, size = 256, 64
	sent := udpBurst(t, peer, dst, count, size)
	testutil.WaitFor(t, "every datagram queued or dropped", func() bool {
		return len(c.ready)+int(c.Drops()) >= count
	})
	queued := len(c.ready)
	rmem := c.rmem.Load()
	per := rmem / int64(queued)
	if per < 64+256 || rmem != per*int64(queued) {
		t.Fatalf("queue charge %d for %d datagrams: want the same truesize each, at least the struct and the payload", rmem, queued)
	}
	if want := rcvbuf/per + 1; int64(queued) != want {
		t.Errorf("queued %d datagrams of truesize %d under a %d-byte buffer: want %d (queued while the queue holds at most the buffer)", queued, per, rcvbuf, want)
	}
	if int(c.Drops()) != count-queued {
		t.Errorf("drops %d, want the %d not queued", c.Drops(), count-queued)
	}
	buf := make([]byte, 65536)
	for i := range queued {
		n, _, _, err := c.ReadTrain(buf, time.Now().Add(30*time.Second))
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], sent[i]) {
			t.Fatalf("datagram %d: got %x, want %x", i, buf[:n], sent[i])
		}
	}
	if got := c.rmem.Load(); got != 0 {
		t.Errorf("queue charge after reading everything: got %d, want 0", got)
	}
	if err := c.SetReadBuffer(-1); err == nil {
		t.Errorf("SetReadBuffer(-1): no error")
	}
}

// TestTrainDequeueGivesBackItsCharge: a reader takes off rmem the truesize
// the train was charged when queued, kept beside it in the queue, without
// walking the packet again (udp_set_dev_scratch, udp_skb_truesize: the
// kernel reads no frag at dequeue). A train whose layout changes while
// queued (here an extra frag past its payload, which changes what
// Driver.Truesize would say) still brings rmem back to zero.
func TestTrainDequeueGivesBackItsCharge(t *testing.T) {
	rx, peer := pairConfig(t, Config{NoGRO: true})
	dst := netip.MustParseAddrPort("192.0.2.1:9995")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const count, size = 4, 64
	sent := udpBurst(t, peer, dst, count, size)
	testutil.WaitFor(t, "every datagram queued", func() bool { return len(c.ready) >= count })
	var queued []queuedTrain
	for range count {
		queued = append(queued, <-c.ready)
	}
	for _, q := range queued {
		p := q.p
		pg := p.Head
		if pg == nil && len(p.Frags) > 0 {
			pg = p.Frags[0].Page
		}
		if pg == nil {
			t.Fatal("queued train holds no page")
		}
		pg.IncRef() // the extra frag's reference, dropped by Release
		p.Frags = append(p.Frags, bufpool.Frag{Page: pg, Len: 2048})
		c.ready <- q
	}
	buf := make([]byte, 65536)
	for i := range count {
		n, _, _, err := c.ReadTrain(buf, time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], sent[i]) {
			t.Fatalf("datagram %d: got %x, want %x", i, buf[:n], sent[i])
		}
	}
	if got := c.rmem.Load(); got != 0 {
		t.Errorf("queue charge after reading everything: got %d, want 0 (what was charged when queued)", got)
	}
}
