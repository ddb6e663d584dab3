package stack

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// batchMsgs returns n messages, each with its room split into two buffers
// (a short first one), so that every read also scatters.
func batchMsgs(n, room int) []Message {
	ms := make([]Message, n)
	for i := range ms {
		b := make([]byte, room)
		ms[i].Buffers = [][]byte{b[:7], b[7:]}
	}
	return ms
}

// joined returns m's first N bytes gathered from its buffers.
func joined(m *Message) []byte {
	var out []byte
	for _, b := range m.Buffers {
		out = append(out, b...)
	}
	return out[:m.N]
}

// queuedDatagrams waits until count datagrams sent to c are queued.
func queuedDatagrams(t *testing.T, c *TrainConn, count int) {
	t.Helper()
	testutil.WaitFor(t, "every datagram queued", func() bool { return c.segs.Load()+int64(c.Drops()) >= int64(count) })
	if d := c.Drops(); d != 0 {
		t.Fatalf("drops: got %d, want 0", d)
	}
}

// TestReadBatch reads bursts that GRO merged into trains one datagram per
// message, in batches of 8 messages scattered over two buffers each, and
// checks every datagram byte for byte and in order, with its sender and
// size; a batch takes several datagrams at once.
func TestReadBatch(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9990")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const bursts, count, size = 4, 64, 700
	ms := batchMsgs(8, 2048)
	most, got := 0, 0
	for range bursts {
		sent := udpBurst(t, peer, dst, count, size)
		queuedDatagrams(t, c, count)
		for i := 0; i < count; {
			n, err := c.ReadBatch(ms, time.Now().Add(30*time.Second))
			if err != nil {
				t.Fatalf("after %d datagrams: %v", got, err)
			}
			most = max(most, n)
			for j := range n {
				m := &ms[j]
				if !bytes.Equal(joined(m), sent[i]) {
					t.Fatalf("datagram %d: got %d bytes %x..., want %d bytes %x...", got, m.N, joined(m)[:min(4, m.N)], size, sent[i][:4])
				}
				if m.SegSize != size || m.Flags != 0 || m.Addr != netipAP("192.0.2.2:5555") {
					t.Fatalf("datagram %d: got SegSize %d Flags %#x Addr %v, want %d 0 192.0.2.2:5555", got, m.SegSize, m.Flags, m.Addr, size)
				}
				i++
				got++
			}
		}
	}
	if most < 2 {
		t.Errorf("largest batch: got %d messages, want several", most)
	}
	if r := c.segs.Load(); r != 0 {
		t.Errorf("queue charge after reading everything: got %d, want 0", r)
	}
}

// TestReadBatchGRO reads with SetGRO: each message holds as many whole
// datagrams of a train as its buffers do (here up to 3), SegSize their
// size, and the messages together are the datagrams sent, in order.
func TestReadBatchGRO(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9991")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetGRO(true)
	const count, size = 64, 500
	sent := udpBurst(t, peer, dst, count, size)
	queuedDatagrams(t, c, count)
	ms := batchMsgs(4, 3*size+10)
	var all []byte
	most := 0
	for len(all) < count*size {
		n, err := c.ReadBatch(ms, time.Now().Add(30*time.Second))
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(all), err)
		}
		for j := range n {
			m := &ms[j]
			if m.SegSize != size || m.N%size != 0 || m.N > 3*size || m.Flags != 0 {
				t.Fatalf("message: got N %d SegSize %d Flags %#x, want a multiple of %d up to %d, SegSize %d, no flags", m.N, m.SegSize, m.Flags, size, 3*size, size)
			}
			most = max(most, m.N/size)
			all = append(all, joined(m)...)
		}
	}
	if want := bytes.Join(sent, nil); !bytes.Equal(all, want) {
		t.Errorf("the trains read differ from the datagrams sent")
	}
	if most < 2 {
		t.Errorf("most datagrams in one message: got %d, want several", most)
	}
}

// TestReadBatchGROShortLast: with SetGRO and messages smaller than a
// datagram, each datagram of a train is cut and flagged, and the train's
// shorter last datagram, which fits, comes whole. The train is a USO
// super-frame (rx-uso) of three datagrams of 500 bytes and one of 100.
func TestReadBatchGROShortLast(t *testing.T) {
	st, w := usoStack(t, true)
	dst := netip.MustParseAddrPort("192.0.2.1:9988")
	c, err := st.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetGRO(true)
	const size = 500
	payload := make([]byte, 3*size+100)
	for i := range payload {
		payload[i] = byte(i * 13)
	}
	if err := w.Write(usoFrame(payload, size, dst)); err != nil {
		t.Fatal(err)
	}
	queuedDatagrams(t, c, 4)
	ms := batchMsgs(4, 200)
	for got := 0; got < 4; {
		n, err := c.ReadBatch(ms, time.Now().Add(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms[:n] {
			want, flags := payload[got*size:min((got+1)*size, len(payload))], 0
			if len(want) > 200 {
				want, flags = want[:200], MsgTrunc
			}
			if !bytes.Equal(joined(&m), want) || m.Flags != flags {
				t.Fatalf("datagram %d: got %d bytes, flags %#x, want %d, %#x", got, m.N, m.Flags, len(want), flags)
			}
			got++
		}
	}
}

// TestReadBatchPartial reads a train one message at a time, then the rest
// with ReadTrain, and checks a datagram longer than its message is cut and
// flagged while the next one is whole.
func TestReadBatchPartial(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9992")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const count, size = 16, 400
	sent := udpBurst(t, peer, dst, count, size)
	queuedDatagrams(t, c, count)
	one := batchMsgs(1, size)
	short := []Message{{Buffers: [][]byte{make([]byte, 100)}}}
	deadline := time.Now().Add(30 * time.Second)
	for i := range 4 {
		if n, err := c.ReadBatch(one, deadline); n != 1 || err != nil {
			t.Fatalf("datagram %d: got %d, %v, want 1, nil", i, n, err)
		}
		if !bytes.Equal(joined(&one[0]), sent[i]) {
			t.Fatalf("datagram %d differs", i)
		}
	}
	if n, err := c.ReadBatch(short, deadline); n != 1 || err != nil {
		t.Fatalf("short message: got %d, %v, want 1, nil", n, err)
	}
	if m := &short[0]; m.N != 100 || m.Flags != MsgTrunc || !bytes.Equal(joined(m), sent[4][:100]) {
		t.Errorf("short message: got N %d Flags %#x, want 100 %#x with the datagram's first bytes", m.N, m.Flags, MsgTrunc)
	}
	// What is queued, without waiting for more: at most the 11 left.
	more := batchMsgs(32, size)
	n, err := c.ReadBatch(more[:2], time.Time{})
	if n != 2 || err != nil {
		t.Fatalf("two messages: got %d, %v, want 2, nil", n, err)
	}
	for j := range n {
		if !bytes.Equal(joined(&more[j]), sent[5+j]) {
			t.Fatalf("datagram %d differs", 5+j)
		}
	}
	n, err = c.ReadBatch(more[:3], time.Time{})
	if n != 3 || err != nil {
		t.Fatalf("three messages: got %d, %v, want 3, nil", n, err)
	}
	n, err = c.ReadBatch(more, time.Time{}) // returns what is queued, does not wait for 32
	if n != count-10 || err != nil {
		t.Fatalf("32 messages with %d queued: got %d, %v", count-10, n, err)
	}
	for j := range n {
		if !bytes.Equal(joined(&more[j]), sent[10+j]) {
			t.Fatalf("datagram %d differs", 10+j)
		}
	}
	// A second burst: five datagrams by ReadBatch, then the rest by
	// ReadTrain, which continues where ReadBatch stopped in the train.
	sent = udpBurst(t, peer, dst, count, size)
	queuedDatagrams(t, c, count)
	if n, err := c.ReadBatch(more[:5], deadline); n != 5 || err != nil {
		t.Fatalf("five messages: got %d, %v, want 5, nil", n, err)
	}

	var rest []byte
	buf := make([]byte, 65536)
	for len(rest) < (count-5)*size {
		n, seg, _, err := c.ReadTrain(buf, deadline)
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(rest), err)
		}
		if seg != size {
			t.Fatalf("segment size: got %d, want %d", seg, size)
		}
		rest = append(rest, buf[:n]...)
	}
	if want := bytes.Join(sent[5:], nil); !bytes.Equal(rest, want) {
		t.Errorf("the trains after a partial read differ from the datagrams sent")
	}
}

// TestReadBatchDeadlineClose: an empty socket waits until the deadline; a
// deadline in the past returns at once; Close wakes a waiting reader and a
// train read in part goes back to the pool (the pair's cleanup checks).
func TestReadBatchDeadlineClose(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9993")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	ms := batchMsgs(2, 2048)
	if n, err := c.ReadBatch(ms, time.Now().Add(10*time.Millisecond)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("empty socket: got %d, %v, want 0, os.ErrDeadlineExceeded", n, err)
	}
	if n, err := c.ReadBatch(ms, time.Now().Add(-time.Second)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("past deadline: got %d, %v, want 0, os.ErrDeadlineExceeded", n, err)
	}
	if n, err := c.ReadBatch(nil, time.Time{}); n != 0 || err != nil {
		t.Errorf("no messages: got %d, %v, want 0, nil", n, err)
	}
	// A train left in part: 8 datagrams, 1 read.
	udpBurst(t, peer, dst, 8, 300)
	queuedDatagrams(t, c, 8)
	if n, err := c.ReadBatch(ms[:1], time.Now().Add(30*time.Second)); n != 1 || err != nil {
		t.Fatalf("first datagram: got %d, %v", n, err)
	}
	// Drain what else is queued, then wait in a reader and close.
	for {
		n, err := c.ReadBatch(ms, time.Now().Add(-time.Second))
		if err != nil || n == 0 {
			break
		}
	}
	udpBurst(t, peer, dst, 8, 300)
	queuedDatagrams(t, c, 8)
	if n, err := c.ReadBatch(ms[:1], time.Now().Add(30*time.Second)); n != 1 || err != nil {
		t.Fatalf("first datagram of the second burst: got %d, %v", n, err)
	}
	if c.b.cur == nil {
		t.Logf("the second burst was not merged into a train; Close releases only the queue")
	}
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Takes the rest of the second burst, then waits on the empty
		// queue until Close.
		for {
			if _, err := c.ReadBatch(ms, time.Time{}); err != nil {
				errc <- err
				return
			}
		}
	}()
	testutil.WaitFor(t, "the reader drained the queue", func() bool { return c.segs.Load() == 0 })
	c.Close()
	wg.Wait()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Errorf("blocked reader at Close: got %v, want net.ErrClosed", err)
	}
	if _, err := c.ReadBatch(ms, time.Time{}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("ReadBatch after Close: got %v, want net.ErrClosed", err)
	}
	if _, err := c.WriteBatch([]Message{{Buffers: [][]byte{{1}}, Addr: netipAP("192.0.2.2:5555")}}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("WriteBatch after Close: got %v, want net.ErrClosed", err)
	}
}

// TestReadBatchCloseReleasesPartial closes a TrainConn holding a train read
// in part, with nobody reading: its pages go back to the pool.
func TestReadBatchCloseReleasesPartial(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9994")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	ms := batchMsgs(1, 2048)
	for c.b.cur == nil {
		udpBurst(t, peer, dst, 16, 300)
		queuedDatagrams(t, c, 16)
		if n, err := c.ReadBatch(ms, time.Now().Add(30*time.Second)); n != 1 || err != nil {
			t.Fatalf("got %d, %v, want 1, nil", n, err)
		}
	}
	c.Close()
	if c.b.cur != nil {
		t.Errorf("Close left the train read in part")
	}
	// The pair's cleanup fails if a page is still out.
}

// TestReadBatchConcurrent: two readers share the socket; every datagram is
// read exactly once.
func TestReadBatchConcurrent(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9995")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const count, size = 256, 200
	sent := udpBurst(t, peer, dst, count, size)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ms := batchMsgs(5, 1024)
			for {
				n, err := c.ReadBatch(ms, time.Time{})
				if err != nil {
					return // closed
				}
				mu.Lock()
				for j := range n {
					seen[string(joined(&ms[j]))]++
				}
				mu.Unlock()
			}
		}()
	}
	testutil.WaitFor(t, "every datagram read", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == count
	})
	c.Close()
	wg.Wait()
	for i, s := range sent {
		if n := seen[string(s)]; n != 1 {
			t.Errorf("datagram %d: read %d times, want once", i, n)
		}
	}
}

// TestWriteBatch sends a batch from a TrainConn's port to a gVisor socket
// on the peer, each message gathered from three buffers, and checks every
// datagram, its order and its source.
func TestWriteBatch(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	c, err := rx.ListenUDPTrains(netip.MustParseAddrPort("192.0.2.1:9996"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pu, err := peer.ListenUDP(netip.MustParseAddrPort("192.0.2.2:6000"))
	if err != nil {
		t.Fatal(err)
	}
	defer pu.Close()
	resolveNeighbors(rx, netip.MustParseAddr("192.0.2.2")) // else the first datagram leaves after ARP, behind others
	const count, size = 40, 300
	ms := make([]Message, count)
	var sent [][]byte
	for i := range ms {
		d := bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5a}, size/3)
		sent = append(sent, d)
		ms[i] = Message{Buffers: [][]byte{d[:1], d[1:100], d[100:]}, Addr: netipAP("192.0.2.2:6000")}
	}
	if n, err := c.WriteBatch(ms); n != count || err != nil {
		t.Fatalf("WriteBatch: got %d, %v, want %d, nil", n, err, count)
	}
	for i := range ms {
		if ms[i].N != size {
			t.Errorf("message %d: N %d, want %d", i, ms[i].N, size)
		}
	}
	buf := make([]byte, 2048)
	for i := range count {
		pu.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, from, err := pu.ReadFrom(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], sent[i]) {
			t.Fatalf("datagram %d: got %d bytes %x..., want %d bytes %x...", i, n, buf[:4], size, sent[i][:4])
		}
		if got := from.(*net.UDPAddr).AddrPort(); got != netipAP("192.0.2.1:9996") {
			t.Fatalf("datagram %d from %v, want 192.0.2.1:9996", i, got)
		}
	}
	// SegSize: one message of 100 bytes is datagrams of 30, 30, 30 and 10
	// bytes (UDP_SEGMENT), gathered across its buffers' boundaries.
	d := make([]byte, 100)
	for i := range d {
		d[i] = byte(i)
	}
	gso := []Message{{Buffers: [][]byte{d[:45], d[45:]}, Addr: netipAP("192.0.2.2:6000"), SegSize: 30}}
	if n, err := c.WriteBatch(gso); n != 1 || err != nil || gso[0].N != 100 {
		t.Fatalf("WriteBatch with SegSize: got %d, %v, N %d, want 1, nil, 100", n, err, gso[0].N)
	}
	for off := 0; off < len(d); off += 30 {
		pu.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, _, err := pu.ReadFrom(buf)
		if err != nil {
			t.Fatalf("segment at %d: %v", off, err)
		}
		if want := d[off:min(off+30, len(d))]; !bytes.Equal(buf[:n], want) {
			t.Fatalf("segment at %d: got %x, want %x", off, buf[:n], want)
		}
	}
	big := []Message{{Buffers: [][]byte{make([]byte, 129*10)}, Addr: netipAP("192.0.2.2:6000"), SegSize: 10}}
	if n, err := c.WriteBatch(big); n != 0 || err == nil {
		t.Errorf("129 segments (UDP_MAX_SEGMENTS is 128 since Linux 6.11): got %d, %v, want 0 and an error", n, err)
	}
}

// TestReadBatchAllocs pins ReadBatch at zero allocations per call while
// datagrams are queued.
func TestReadBatchAllocs(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, tc := range []struct {
		name  string
		noGRO bool
		gro   bool
	}{{"trains", false, false}, {"trains-gro", false, true}, {"nogro", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			rx, peer := pairConfig(t, Config{NoGRO: tc.noGRO})
			dst := netip.MustParseAddrPort("192.0.2.1:9989")
			c, err := rx.ListenUDPTrains(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetGRO(tc.gro)
			const runs, batch = 50, 8
			count := (runs + 1) * batch
			udpBurst(t, peer, dst, count, 64)
			queuedDatagrams(t, c, count)
			ms := batchMsgs(batch, 64) // one datagram per message, with SetGRO too
			deadline := time.Now().Add(30 * time.Second)
			allocs := testing.AllocsPerRun(runs, func() {
				if n, err := c.ReadBatch(ms, deadline); n != batch || err != nil {
					t.Fatalf("got %d, %v, want %d, nil", n, err, batch)
				}
			})
			if allocs != 0 {
				t.Errorf("allocations per ReadBatch: got %v, want 0", allocs)
			}
		})
	}
}

// TestEncodeUDPGSO checks the headers of WriteBatch's UDP GSO super-frame:
// completing the checksum as NEEDS_CSUM asks (the sum from CsumStart to
// the end, the seeded field included) gives the super-packet a valid UDP
// checksum, which is what __udp_gso_segment adjusts for each datagram; the
// lengths and the IPv4 header checksum are right.
func TestEncodeUDPGSO(t *testing.T) {
	payload := make([]byte, 1000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		name     string
		src, dst tcpip.Address
	}{
		{"ipv4", tcpip.AddrFrom4([4]byte{192, 0, 2, 1}), tcpip.AddrFrom4([4]byte{192, 0, 2, 2})},
		{"ipv6", tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 1}), tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 2})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var scratch [header.EthernetMinimumSize + header.IPv6MinimumSize + header.UDPMinimumSize]byte
			h, vh := encodeUDPGSO(scratch[:], "\x02\x00\x00\x00\x00\x01", "\x02\x00\x00\x00\x00\x02", tc.src, tc.dst, 4433, 5000, len(payload), 300, 7)
			frame := append(append([]byte(nil), h...), payload...)
			l4 := int(vh.CsumStart)
			if vh.GSOType != driver.VirtioNetHdrGSOUDPL4 || vh.GSOSize != 300 || vh.Flags != driver.VirtioNetHdrFNeedsCsum || int(vh.HdrLen) != len(h) || l4 != len(h)-header.UDPMinimumSize || vh.CsumOffset != 6 {
				t.Fatalf("virtio-net header: got %+v", vh)
			}
			u := header.UDP(frame[l4:])
			if got, want := int(u.Length()), header.UDPMinimumSize+len(payload); got != want {
				t.Errorf("UDP length: got %d, want %d", got, want)
			}
			u.SetChecksum(^checksum.Checksum(frame[l4:], 0)) // what the device completes
			if !u.IsChecksumValid(tc.src, tc.dst, checksum.Checksum(payload, 0)) {
				t.Errorf("completed UDP checksum %#x is not valid", u.Checksum())
			}
			if tc.dst.Len() == 4 {
				ip := header.IPv4(frame[header.EthernetMinimumSize:l4])
				if !ip.IsChecksumValid() || int(ip.TotalLength()) != len(frame)-header.EthernetMinimumSize || ip.ID() != 7 {
					t.Errorf("IPv4 header: checksum valid %v, total length %d (want %d), ID %d", ip.IsChecksumValid(), ip.TotalLength(), len(frame)-header.EthernetMinimumSize, ip.ID())
				}
			} else if got, want := int(header.IPv6(frame[header.EthernetMinimumSize:l4]).PayloadLength()), len(frame)-l4; got != want {
				t.Errorf("IPv6 payload length: got %d, want %d", got, want)
			}
		})
	}
}
