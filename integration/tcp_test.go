//go:build linux

package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack/serve"
)

// TestTCPBulk sends a bulk stream from the kernel to a hashing receiver on
// ustack over a covering set of receive-path configurations.
//
// The eight rows are a fractional factorial of the five dimensions (family,
// MTU, LRO, HDS, RQ type): every value of every dimension appears in four
// rows and every LRO x HDS pair in two. The first row is the base case
// (IPv4, MTU 1500, LRO on, hds auto, striding RQ: ustack run's defaults).
// Every row moves 256 MiB: about 90 seconds for all eight under the race
// detector on a 2-CPU machine, 8 seconds without. Should the suite outgrow
// its time budget, keep 256 MiB for the base case and give the other rows
// 64 MiB (enough to see every counter move).
func TestTCPBulk(t *testing.T) {
	needRoot(t)
	const n = 256 << 20
	tests := []struct {
		v6  bool
		mtu int
		lro bool
		hds int
		rq  driver.RQMode
	}{
		{false, 1500, true, driver.HDSAuto, driver.RQStriding},
		{false, 1500, false, 256, driver.RQCyclic},
		{false, 9000, true, 256, driver.RQCyclic},
		{false, 9000, false, driver.HDSAuto, driver.RQStriding},
		{true, 1500, true, 256, driver.RQStriding},
		{true, 1500, false, driver.HDSAuto, driver.RQCyclic},
		{true, 9000, true, driver.HDSAuto, driver.RQCyclic},
		{true, 9000, false, 256, driver.RQStriding},
	}
	for i, tt := range tests {
		lro := "off"
		if tt.lro {
			lro = "on"
		}
		name := fmt.Sprintf("%s/mtu-%d/lro-%s/hds-%s/%s", family(tt.v6), tt.mtu, lro, driver.FormatHDS(tt.hds), tt.rq)
		t.Run(name, func(t *testing.T) {
			r := newRig(t, fmt.Sprintf("usit-bulk%d", i), tt.mtu, driver.Config{LRO: tt.lro, HDS: tt.hds, RQ: tt.rq})
			elapsed := kernelToStack(t, r, tt.v6, 9, n, uint64(i+1))
			logRate(t, "kernel -> ustack", n, elapsed)

			c := counters(r.st)
			t.Logf("rx_packets %d rx_lro_packets %d rx_gso_frames %d rx_gso_segs %d rx_hds_payload_bytes %d tcp_retransmits %d",
				c["rx_packets"], c["rx_lro_packets"], c["rx_gso_frames"], c["rx_gso_segs"], c["rx_hds_payload_bytes"], c["tcp_retransmits"])
			if tt.lro && counter(t, r.st, "rx_lro_packets") == 0 {
				t.Errorf("rx_lro_packets with LRO on: got 0, want > 0")
			}
			if !tt.lro && counter(t, r.st, "rx_gso_segs") == 0 {
				t.Errorf("rx_gso_segs with LRO off: got 0, want > 0")
			}
			if tt.hds == driver.HDSAuto {
				if got := counter(t, r.st, "rx_hds_payload_bytes"); got != 0 {
					t.Errorf("rx_hds_payload_bytes with hds auto: got %d, want 0", got)
				}
			} else if counter(t, r.st, "rx_hds_payload_bytes") == 0 {
				t.Errorf("rx_hds_payload_bytes with hds %d: got 0, want > 0", tt.hds)
			}
			checkFlowDrops(t, r.st)
			r.close(t) // checks that every page is back in the pool
		})
	}
}

// TestTCPEcho has the kernel send a stream to ustack's echo server while
// reading the echo back concurrently: both ustack's receive path and its
// transmit path (TSO super-frames written to the TAP) carry it.
func TestTCPEcho(t *testing.T) {
	needRoot(t)
	const n = 32 << 20
	i := 0
	for _, v6 := range []bool{false, true} {
		for _, lro := range []bool{true, false} {
			i++
			name := fmt.Sprintf("%s/lro-%v", family(v6), map[bool]string{true: "on", false: "off"}[lro])
			seed := uint64(100 + i)
			t.Run(name, func(t *testing.T) {
				r := newRig(t, fmt.Sprintf("usit-echo%d", seed), 1500, driver.Config{LRO: lro})
				tcpEcho(t, r, v6, n, seed)
			})
		}
	}
}

// tcpEcho streams n bytes of seed's stream from the kernel to ustack's echo
// server on r while reading the echo back, and checks every byte.
func tcpEcho(t *testing.T, r *rig, v6 bool, n int64, seed uint64) {
	ap := r.stackAP(v6, 7)
	l, err := r.st.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve.Echo(l) }()
	defer func() {
		l.Close()
		if err := <-served; err != nil {
			t.Errorf("Echo: %v", err)
		}
	}()

	deadline := time.Now().Add(transferTimeout(2 * n))
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	c, err := r.bed.NS.DialTCP(ctx, ap, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	pc := progressConn{c, deadline}
	win := &echoWindow{limit: echoOutstanding, end: deadline}
	res := make(chan hashResult, 1)
	go func() { res <- recvHashed(io.LimitReader(win.reader(pc), n)) }()
	start := time.Now()
	want, err := sendHashed(win.writer(pc), n, writeSize, seed)
	if err != nil {
		diagnose(t, r)
		// Unblock the reader before failing.
		c.Close()
		<-res
		t.Fatalf("kernel sender: %v", err)
	}
	got := waitHash(t, r, res, deadline)
	elapsed := time.Since(start)
	if !checkHash(t, got, n, want) {
		diagnose(t, r)
	}
	logRate(t, "kernel -> ustack echo -> kernel", n, elapsed)
	t.Logf("tx_packets %d tx_gso_packets %d tx_errors %d tcp_retransmits %d",
		counter(t, r.st, "tx_packets"), counter(t, r.st, "tx_gso_packets"), counter(t, r.st, "tx_errors"), counter(t, r.st, "tcp_retransmits"))
	checkFlowDrops(t, r.st)
}

// echoOutstanding bounds the bytes the echo client has sent but not yet
// read back, as a real echo client bounds its requests in flight. Without a
// bound the client pushes data faster than the echo can return it and
// ustack's receive window closes (TestTCPCopyEcho covers that case: the
// link endpoint hands gVisor the acknowledgements it would drop at a closed
// window); this test is about ustack's data path.
const echoOutstanding = 4 << 20

// echoWindow makes a writer wait while more than limit bytes written have
// not yet been read back through its reader.
type echoWindow struct {
	limit      int64
	end        time.Time
	sent, read atomic.Int64
}

func (w *echoWindow) writer(c io.Writer) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		for w.sent.Load()-w.read.Load() > w.limit {
			if time.Now().After(w.end) {
				return 0, os.ErrDeadlineExceeded
			}
			time.Sleep(100 * time.Microsecond)
		}
		n, err := c.Write(b)
		w.sent.Add(int64(n))
		return n, err
	})
}

func (w *echoWindow) reader(c io.Reader) io.Reader {
	return readerFunc(func(b []byte) (int, error) {
		n, err := c.Read(b)
		w.read.Add(int64(n))
		return n, err
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(b []byte) (int, error) { return f(b) }

// TestTCPStackToKernel has ustack dial a kernel listener in the namespace
// and send a stream to it, which exercises ustack's transmit path with TSO
// (GSO super-frames written to the TAP, segmented by the kernel).
func TestTCPStackToKernel(t *testing.T) {
	needRoot(t)
	const n = 64 << 20
	for i, v6 := range []bool{false, true} {
		seed := uint64(200 + i)
		t.Run(family(v6), func(t *testing.T) {
			r := newRig(t, fmt.Sprintf("usit-tx%d", i), 1500, driver.Config{LRO: true})
			l, err := r.bed.NS.ListenTCP(r.kernelAP(v6, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			deadline := time.Now().Add(transferTimeout(n))
			l.SetDeadline(deadline)
			res := acceptOne(l, deadline)

			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			kap := l.Addr().(*net.TCPAddr).AddrPort()
			kap = netip.AddrPortFrom(kap.Addr().Unmap(), kap.Port())
			c, err := r.st.DialTCP(ctx, kap)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(deadline)
			start := time.Now()
			want, err := sendHashed(progressConn{c, deadline}, n, writeSize, seed)
			if err != nil {
				diagnose(t, r)
				t.Fatalf("ustack sender: %v", err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("ustack sender close: %v", err)
			}
			got := waitHash(t, r, res, deadline)
			elapsed := time.Since(start)
			if !checkHash(t, got, n, want) {
				diagnose(t, r)
			}
			logRate(t, "ustack -> kernel", n, elapsed)
			c2 := counters(r.st)
			t.Logf("tx_packets %d tx_bytes %d tx_gso_packets %d tx_errors %d tcp_retransmits %d",
				c2["tx_packets"], c2["tx_bytes"], c2["tx_gso_packets"], c2["tx_errors"], c2["tcp_retransmits"])
			if c2["tx_gso_packets"] == 0 {
				t.Errorf("tx_gso_packets: got 0, want > 0 (TSO through the TAP)")
			}
			checkFlowDrops(t, r.st)
		})
	}
}
