package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ustack/ustack/internal/bench"
	"golang.org/x/sys/unix"
)

// sendCmd is the kernel sender of `ustack bench`: a separate process (run
// inside the bench's namespace) so that its CPU time is not counted as the
// receiver's. It writes to a TCP address for a bounded time and byte count.
func sendCmd(args []string) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	addr := fs.String("addr", "", "TCP address to send to")
	dur := fs.Duration("t", 3*time.Second, "how long to send")
	max := fs.Int64("max", 64<<30, "stop after this many bytes")
	wsize := fs.Int("w", 64<<10, "write size")
	cc := fs.String("cc", "cubic", "congestion control of the sending socket")
	mode := fs.String("mode", "tcp", "tcp (bulk), udp (datagrams of -size, -gso per write with UDP_SEGMENT; 0: one per write) or rr (request/response of -size bytes)")
	size := fs.Int("size", 64, "udp datagram or rr message size")
	gso := fs.Int("gso", 64, "udp: datagrams per write with UDP_SEGMENT (0 or 1: plain writes)")
	blocking := fs.Bool("blocking", false, "rr: blocking read(2) and write(2) on a locked thread per flow, as a C client does, instead of Go's network poller")
	streams := fs.Int("P", 1, "tcp: parallel connections; rr: flows, each a connection with one transaction in flight (neper's tcp_rr -F)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dur <= 0 || *dur > 10*time.Minute || *wsize <= 0 || *streams < 1 || *streams > 64 {
		return usageError{errors.New("want 0 < -t <= 10m, -w > 0 and 1 <= -P <= 64")}
	}
	switch *mode {
	case "udp":
		return sendUDP(*addr, *dur, *max, *size, *gso)
	case "rr":
		return sendRR(*addr, *dur, *size, *streams, *blocking)
	case "tcp":
	default:
		return usageError{fmt.Errorf("mode %q: want tcp, udp or rr", *mode)}
	}
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, *cc) }); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("set congestion control %q: %w", *cc, serr)
		}
		return nil
	}}
	conns := make([]net.Conn, *streams)
	for i := range conns {
		c, err := d.Dial("tcp", *addr)
		if err != nil {
			return err
		}
		defer c.Close()
		conns[i] = c
	}
	rc, err := conns[0].(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var got string
	rc.Control(func(fd uintptr) { got, _ = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION) })
	buf := make([]byte, *wsize)
	for i := range buf {
		buf[i] = byte(i)
	}
	start := time.Now()
	deadline := start.Add(*dur)
	var total atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		c.SetWriteDeadline(deadline)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sent int64
			for total.Load() < *max && time.Now().Before(deadline) {
				n, err := c.Write(buf)
				sent += int64(n)
				total.Add(int64(n))
				if err != nil {
					break
				}
			}
		}()
	}
	wg.Wait()
	sent := total.Load()
	el := time.Since(start)
	return json.NewEncoder(os.Stdout).Encode(bench.SendResult{Bytes: sent, Seconds: el.Seconds(), Congestion: got})
}

// sendUDP sends datagrams of size bytes, unpaced, for dur: with gso > 1,
// gso of them per write with UDP_SEGMENT, so that the TAP's USO offload
// hands ustack super-frames, as a real NIC's wire would not be the
// bottleneck.
func sendUDP(addr string, dur time.Duration, max int64, size, gso int) error {
	if size < 1 || size > 1472 || gso < 0 || gso > 64 {
		return usageError{errors.New("want 1 <= -size <= 1472 and 0 <= -gso <= 64")}
	}
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	per := max1(gso)
	if per > 1 {
		rc, err := c.(*net.UDPConn).SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT, size) })
		if serr != nil {
			return fmt.Errorf("UDP_SEGMENT: %w", serr)
		}
	}
	buf := make([]byte, size*per)
	for i := range buf {
		buf[i] = byte(i)
	}
	start := time.Now()
	deadline := start.Add(dur)
	var sent, dgrams int64
	for i := 0; sent < max; i++ {
		if i%64 == 0 && time.Now().After(deadline) {
			break
		}
		n, err := c.Write(buf)
		if err != nil {
			if errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ECONNREFUSED) {
				continue
			}
			return err
		}
		sent += int64(n)
		dgrams += int64(per)
	}
	return json.NewEncoder(os.Stdout).Encode(bench.SendResult{Bytes: sent, Datagrams: dgrams, Seconds: time.Since(start).Seconds()})
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}

// sendRR runs request/response transactions of size bytes on one TCP
// connection for dur, as neper's TCP_RR does, and counts them with their
// latencies (median and 99th percentile in the result).
func sendRR(addr string, dur time.Duration, size, flows int, blocking bool) error {
	if size < 1 || size > 65536 {
		return usageError{errors.New("want 1 <= -size <= 65536")}
	}
	conns := make([]net.Conn, flows)
	for i := range conns {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.(*net.TCPConn).SetNoDelay(true)
		conns[i] = c
	}
	start := time.Now()
	deadline := start.Add(dur)
	type result struct {
		n   int64
		lat *bench.LatencyHist
		err error
	}
	results := make(chan result, flows)
	for _, c := range conns {
		go func() {
			r := result{lat: new(bench.LatencyHist)}
			if blocking {
				r.n, r.err = rrFlowBlocking(c, deadline, size, r.lat)
			} else {
				r.n, r.err = rrFlow(c, deadline, size, r.lat)
			}
			results <- r
		}()
	}
	var n int64
	lat := new(bench.LatencyHist)
	var errs []error
	for range conns {
		r := <-results
		n += r.n
		lat.Merge(r.lat)
		errs = append(errs, r.err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(bench.SendResult{Transactions: n, Bytes: n * int64(size), Seconds: time.Since(start).Seconds(),
		P50Us: lat.Quantile(0.5), P99Us: lat.Quantile(0.99)})
}

// rrFlow runs transactions of size bytes on c, one at a time, until
// deadline, recording each one's latency in lat, and returns their count.
func rrFlow(c net.Conn, deadline time.Time, size int, lat *bench.LatencyHist) (int64, error) {
	c.SetDeadline(deadline.Add(5 * time.Second))
	req := make([]byte, size)
	resp := make([]byte, size)
	var n int64
	for t0 := time.Now(); t0.Before(deadline); n++ {
		if _, err := c.Write(req); err != nil {
			return n, err
		}
		if _, err := io.ReadFull(c, resp); err != nil {
			return n, err
		}
		t1 := time.Now()
		lat.Add(t1.Sub(t0))
		t0 = t1
	}
	return n, nil
}

// rrFlowBlocking is rrFlow the way a C client (tcprr.c) runs it: on a
// locked thread, blocking write(2) and read(2) on the descriptor. A
// connection whose peer stops answering blocks the read; the bench's
// timeout ends the process.
func rrFlowBlocking(c net.Conn, deadline time.Time, size int, lat *bench.LatencyHist) (int64, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fd, err := bench.BlockingFD(c.(*net.TCPConn))
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	req := make([]byte, size)
	resp := make([]byte, size)
	var n int64
	for t0 := time.Now(); t0.Before(deadline); n++ {
		if err := bench.WriteFullFD(fd, req); err != nil {
			return n, err
		}
		if err := bench.ReadFullFD(fd, resp); err != nil {
			return n, err
		}
		t1 := time.Now()
		lat.Add(t1.Sub(t0))
		t0 = t1
	}
	return n, nil
}
