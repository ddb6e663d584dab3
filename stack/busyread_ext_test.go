package stack_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/stacktest"
)

// cpuHog keeps every P busy with goroutines that spin until the test
// ends, so that a busy reader competes for the CPU as beside a loaded
// machine's other work.
func cpuHog(t *testing.T) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for x := 0; !stop.Load(); x++ {
				if x%(1<<14) == 0 {
					runtime.Gosched()
				}
			}
		}()
	}
	t.Cleanup(func() { stop.Store(true); wg.Wait() })
}

// busyPair is a receiver with Config.BusyRead spin and a peer, and a TCP
// connection from the receiver to a listener of the peer's: the
// receiver's end (whose reads spin) and the peer's.
func busyPair(t *testing.T, spin time.Duration) (rx *stack.Stack, peer *stack.Stack, c, p net.Conn) {
	t.Helper()
	rx, peer = stacktest.NewPair(t, stack.Config{Addrs: delackAddrs, BusyRead: spin},
		stack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
	c, p = connectPair(t, rx, peer, netip.MustParseAddrPort("192.0.2.2:7400"))
	return rx, peer, c, p
}

// TestBusyReadStream: a reader with BusyRead gets every byte of a stream
// in order, by Read and by ReadViews, beside a CPU hog.
func TestBusyReadStream(t *testing.T) {
	for _, views := range []bool{false, true} {
		name := map[bool]string{false: "Read", true: "ReadViews"}[views]
		t.Run(name, func(t *testing.T) {
			cpuHog(t)
			rx, _, c, p := busyPair(t, 50*time.Microsecond)
			c.SetDeadline(time.Now().Add(60 * time.Second))
			want := make([]byte, 2<<20)
			for i := range want {
				want[i] = byte(i*7 + i>>11)
			}
			go func() {
				// Writes of odd sizes, so reads find partial data.
				for b := want; len(b) > 0; {
					n := min(len(b), 1000+len(b)%7777)
					if _, err := p.Write(b[:n]); err != nil {
						return
					}
					b = b[n:]
				}
			}()
			got := make([]byte, 0, len(want))
			tc := c.(*stack.TCPConn)
			buf := make([]byte, 3000)
			var vs []stack.View
			for len(got) < len(want) {
				if views {
					var n int
					var err error
					vs, n, err = tc.ReadViews(vs[:0], 5000)
					if err != nil {
						t.Fatalf("ReadViews after %d bytes: %v", len(got), err)
					}
					for i := range vs {
						got = append(got, vs[i].Bytes()...)
						vs[i].Release()
					}
					if n == 0 {
						t.Fatalf("ReadViews returned nothing after %d bytes", len(got))
					}
					continue
				}
				n, err := c.Read(buf)
				if err != nil {
					t.Fatalf("Read after %d bytes: %v", len(got), err)
				}
				got = append(got, buf[:n]...)
			}
			if !bytes.Equal(got, want) {
				i := 0
				for i < len(got) && got[i] == want[i] {
					i++
				}
				t.Fatalf("stream differs from byte %d on", i)
			}
			if n := counter(rx, "busy_reads"); n == 0 {
				t.Errorf("busy_reads 0: no read spun")
			}
		})
	}
}

// TestBusyReadRR: many short request/response exchanges over TCP and UDP
// complete with busy reads, beside a CPU hog; readers processed rings
// themselves (busy_read_polls) and reads were satisfied while spinning.
func TestBusyReadRR(t *testing.T) {
	const exchanges = 500
	cpuHog(t)
	rx, peer, c, p := busyPair(t, 200*time.Microsecond)
	start := time.Now()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	go io.Copy(p, p) // the peer echoes
	req, resp := make([]byte, 64), make([]byte, 64)
	for i := range exchanges {
		req[0], req[1] = byte(i), byte(i>>8)
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, resp); err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
		if !bytes.Equal(resp, req) {
			t.Fatalf("exchange %d: reply %x, want %x", i, resp[:2], req[:2])
		}
	}
	t.Logf("tcp: %v", time.Since(start))
	// UDP, the same way.
	pu, err := peer.ListenUDP(netip.MustParseAddrPort("192.0.2.2:7401"))
	if err != nil {
		t.Fatal(err)
	}
	defer pu.Close()
	go func() {
		b := make([]byte, 100)
		for {
			n, a, err := pu.ReadFrom(b)
			if err != nil {
				return
			}
			pu.WriteTo(b[:n], a)
		}
	}()
	u, err := rx.ListenUDP(netip.MustParseAddrPort("192.0.2.1:7402"))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.SetDeadline(time.Now().Add(60 * time.Second))
	to := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.2:7401"))
	for i := range exchanges {
		req[0], req[1] = byte(i), byte(i>>8)
		if _, err := u.WriteTo(req, to); err != nil {
			t.Fatal(err)
		}
		n, _, err := u.ReadFrom(resp)
		if err != nil {
			t.Fatalf("udp exchange %d: %v", i, err)
		}
		if !bytes.Equal(resp[:n], req) {
			t.Fatalf("udp exchange %d: reply %x, want %x", i, resp[:2], req[:2])
		}
	}
	ctr := stacktest.Counters(rx.EachCounter)
	t.Logf("busy_reads %d, busy_read_hits %d, busy_read_loops %d, busy_read_polls %d, busy_read_packets %d, rx_napi_polls %d",
		ctr["busy_reads"], ctr["busy_read_hits"], ctr["busy_read_loops"], ctr["busy_read_polls"], ctr["busy_read_packets"], ctr["rx_napi_polls"])
	if ctr["busy_reads"] == 0 || ctr["busy_read_hits"] == 0 {
		t.Errorf("busy_reads %d, busy_read_hits %d: want both above 0", ctr["busy_reads"], ctr["busy_read_hits"])
	}
	if ctr["busy_read_polls"] == 0 || ctr["busy_read_packets"] < ctr["busy_read_polls"] {
		t.Errorf("busy_read_polls %d, busy_read_packets %d: want polls above 0 and a packet each at least", ctr["busy_read_polls"], ctr["busy_read_packets"])
	}
}

// waitCounter waits until rx's counter name reaches n.
func waitCounter(t *testing.T, rx *stack.Stack, name string, n uint64) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); counter(rx, name) < n; {
		if time.Now().After(end) {
			t.Fatalf("%s: got %d, want %d", name, counter(rx, name), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBusyReadLateData: a read whose data comes after its spin ended
// parks and is woken by it, over TCP and UDP.
func TestBusyReadLateData(t *testing.T) {
	cpuHog(t)
	rx, peer, c, p := busyPair(t, time.Millisecond)
	c.SetDeadline(time.Now().Add(60 * time.Second))
	got := make(chan error, 1)
	go func() {
		b := make([]byte, 10)
		n, err := c.Read(b)
		if err == nil && string(b[:n]) != "late" {
			err = errors.New("read " + string(b[:n]) + ", want late")
		}
		got <- err
	}()
	waitCounter(t, rx, "busy_reads", 1) // the spin is over: the read parks
	if _, err := p.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("tcp: %v", err)
	}

	pu, err := peer.ListenUDP(netip.MustParseAddrPort("192.0.2.2:7403"))
	if err != nil {
		t.Fatal(err)
	}
	defer pu.Close()
	u, err := rx.ListenUDP(netip.MustParseAddrPort("192.0.2.1:7404"))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.SetDeadline(time.Now().Add(60 * time.Second))
	before := counter(rx, "busy_reads")
	go func() {
		b := make([]byte, 10)
		n, _, err := u.ReadFrom(b)
		if err == nil && string(b[:n]) != "late" {
			err = errors.New("read " + string(b[:n]) + ", want late")
		}
		got <- err
	}()
	waitCounter(t, rx, "busy_reads", before+1)
	if _, err := pu.WriteTo([]byte("late"), net.UDPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.1:7404"))); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("udp: %v", err)
	}

	// A train socket, by ReadTrain and TakeTrain.
	tc, err := rx.ListenUDPTrains(netip.MustParseAddrPort("192.0.2.1:7406"))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	for _, take := range []bool{false, true} {
		before := counter(rx, "busy_reads")
		go func() {
			b := make([]byte, 10)
			var n int
			var err error
			if take {
				var tr stack.Train
				if err = tc.TakeTrain(&tr, time.Now().Add(60*time.Second)); err == nil {
					n = copy(b, tr.Slices(nil)[0])
					tr.Release()
				}
			} else {
				n, _, _, err = tc.ReadTrain(b, time.Now().Add(60*time.Second))
			}
			if err == nil && string(b[:n]) != "late" {
				err = errors.New("read " + string(b[:n]) + ", want late")
			}
			got <- err
		}()
		waitCounter(t, rx, "busy_reads", before+1)
		if _, err := pu.WriteTo([]byte("late"), net.UDPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.1:7406"))); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("train (take %v): %v", take, err)
		}
	}
}

// TestBusyReadCloseDeadline: a read spinning for up to a second returns
// net.ErrClosed soon after Close, and os.ErrDeadlineExceeded soon after
// its deadline, not when the spin would have ended.
func TestBusyReadCloseDeadline(t *testing.T) {
	const spin, soon = time.Second, 500 * time.Millisecond
	t.Run("deadline", func(t *testing.T) {
		_, _, c, _ := busyPair(t, spin)
		c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		start := time.Now()
		_, err := c.Read(make([]byte, 10))
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past its deadline: %v, want os.ErrDeadlineExceeded", err)
		}
		if d := time.Since(start); d > soon {
			t.Errorf("Read returned %v after it began, for a deadline 20ms on: the spin ran on", d)
		}
	})
	t.Run("close", func(t *testing.T) {
		rx, _, c, _ := busyPair(t, spin)
		got := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 10))
			got <- err
		}()
		time.Sleep(20 * time.Millisecond) // the read spins by now; if not, it finds the socket closed
		closed := time.Now()
		c.Close()
		err := <-got
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read across Close: %v, want net.ErrClosed", err)
		}
		if d := time.Since(closed); d > soon {
			t.Errorf("Read returned %v after Close: the spin ran on", d)
		}
		if n := counter(rx, "busy_read_hits"); n != 0 {
			t.Errorf("busy_read_hits %d, want 0", n)
		}
	})
	t.Run("udp deadline", func(t *testing.T) {
		rx, _, _, _ := busyPair(t, spin)
		u, err := rx.ListenUDP(netip.MustParseAddrPort("192.0.2.1:7405"))
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		u.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		start := time.Now()
		_, _, err = u.ReadFrom(make([]byte, 10))
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("ReadFrom past its deadline: %v, want os.ErrDeadlineExceeded", err)
		}
		if d := time.Since(start); d > soon {
			t.Errorf("ReadFrom returned %v after it began, for a deadline 20ms on: the spin ran on", d)
		}
	})
}

// TestBusyReadConfig: New refuses a BusyRead outside 0..driver.MaxBusyPoll.
func TestBusyReadConfig(t *testing.T) {
	for _, d := range []time.Duration{-1, 2 * time.Second} {
		_, err := stack.NewWithEndpoint(nil, stack.Config{Addrs: delackAddrs, BusyRead: d})
		if err == nil {
			t.Errorf("BusyRead %v: no error", d)
		}
	}
}

// TestBusyPoll: TCPConn.BusyPoll spins for data that comes while it
// spins (a busy read, counted as one, a hit), reports false when the
// spin ends without any, and true at once after Close (a read would not
// block: it fails); without BusyRead it only looks.
func TestBusyPoll(t *testing.T) {
	cpuHog(t)
	rx, _, c, p := busyPair(t, 500*time.Millisecond)
	tc := c.(*stack.TCPConn)
	if tc.Readable() {
		t.Fatal("readable before the peer wrote")
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		p.Write([]byte("x"))
	}()
	if !tc.BusyPoll() {
		t.Fatal("BusyPoll: false, want the byte written while it spun")
	}
	if counter(rx, "busy_reads") != 1 || counter(rx, "busy_read_hits") != 1 {
		t.Errorf("busy_reads %d, busy_read_hits %d: want 1 and 1", counter(rx, "busy_reads"), counter(rx, "busy_read_hits"))
	}
	b := make([]byte, 1)
	if n, err := tc.TryRead(b); n != 1 || err != nil {
		t.Fatalf("TryRead: %d, %v", n, err)
	}
	tc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if tc.BusyPoll() {
		t.Error("BusyPoll with nothing sent: true")
	}
	reads := counter(rx, "busy_reads")
	tc.Close()
	if !tc.BusyPoll() || counter(rx, "busy_reads") != reads {
		t.Errorf("BusyPoll after Close: false or spun (busy_reads %d, was %d)", counter(rx, "busy_reads"), reads)
	}

	// Without BusyRead: a look, no spin counted.
	rx2, _, c2, _ := busyPair(t, 0)
	if c2.(*stack.TCPConn).BusyPoll() || counter(rx2, "busy_reads") != 0 {
		t.Errorf("BusyPoll without BusyRead: spun (busy_reads %d)", counter(rx2, "busy_reads"))
	}
}
