//go:build linux

package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// resetPeakRSS returns the memory the Go runtime holds free to the OS and
// resets the process's peak resident set size (VmHWM) to what is left, so
// that the next peakRSS reads the peak since now, not an earlier test's.
func resetPeakRSS() {
	debug.FreeOSMemory()
	os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// peakRSS returns the process's peak resident set size in bytes (VmHWM),
// or 0 if it cannot be read.
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// poolWatch samples a stack's page pool until stopped and keeps the peaks.
type poolWatch struct {
	stop, done           chan struct{}
	peakPages, peakBytes atomic.Int64
}

// watchPool resets the peak RSS and starts sampling st's pool every 2 ms.
func watchPool(st *stack.Stack) *poolWatch {
	resetPeakRSS()
	w := &poolWatch{stop: make(chan struct{}), done: make(chan struct{})}
	pool := st.Driver().Pool()
	go func() {
		defer close(w.done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			s := pool.Stats()
			if s.InUse > w.peakPages.Load() {
				w.peakPages.Store(s.InUse)
			}
			if s.BytesHeld > w.peakBytes.Load() {
				w.peakBytes.Store(s.BytesHeld)
			}
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// end stops the sampling, logs the peaks (RSS of the whole test process,
// noisy: the race detector's shadow memory, memory the Go runtime has not
// returned yet; the pool's pages and bytes) and books them in tl.
func (w *poolWatch) end(t *testing.T, tl *tally) (pages, bytes int64) {
	t.Helper()
	close(w.stop)
	<-w.done
	rss := peakRSS()
	t.Logf("peak RSS %d MB; pool peak %d pages, %d KB held", rss>>20, w.peakPages.Load(), w.peakBytes.Load()>>10)
	tl.notePeaks(rss, w.peakPages.Load())
	return w.peakPages.Load(), w.peakBytes.Load()
}

// udpPour sends count datagrams of size bytes from a kernel socket to ap,
// count bounded and paced by a sleep every burst datagrams, until stop is
// closed.
func udpPour(t *testing.T, r *rig, ap netip.AddrPort, count, size, burst int, stop <-chan struct{}) (sent *atomic.Int64, done <-chan struct{}) {
	t.Helper()
	k, err := r.bed.NS.DialUDP(ap)
	if err != nil {
		t.Fatal(err)
	}
	sent = &atomic.Int64{}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		defer k.Close()
		msg := make([]byte, size)
		k.SetWriteDeadline(time.Now().Add(5 * time.Minute))
		for seq := uint32(0); seq < uint32(count); seq++ {
			select {
			case <-stop:
				return
			default:
			}
			fillDatagram(msg, seq)
			if _, err := k.Write(msg); err != nil {
				return
			}
			sent.Add(1)
			if int(seq)%burst == burst-1 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	return sent, ch
}

// TestExhaustPagePool limits the RX page pool to a few pages under two TCP
// flows and a UDP flow: frames are dropped for want of a buffer and
// counted, the pool never holds more than its limit, and the flows recover
// through TCP's retransmissions, intact, with no deadlock.
func TestExhaustPagePool(t *testing.T) {
	needRoot(t)
	for i, tc := range []struct {
		name string
		dc   driver.Config
		pc   bufpool.Config
	}{
		{"cyclic/max-pages-24", driver.Config{RQ: driver.RQCyclic}, bufpool.Config{MaxPages: 24}},
		{"striding/max-bytes-1M/order-2", driver.Config{}, bufpool.Config{MaxBytes: 1 << 20, Order: 2}},
		{"hw-gro/no-recycle/max-pages-96", driver.Config{HWGRO: driver.HWGROCoalesce}, bufpool.Config{NoRecycle: true, MaxPages: 96}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := record("TestExhaustPagePool")
			r := newRigConfig(t, fmt.Sprintf("usit-pool%d", i), 1500, stack.Config{Driver: tc.dc, Pool: tc.pc})
			w := watchPool(r.st)
			const n = 24 << 20
			deadline := time.Now().Add(transferTimeout(2*n) + time.Minute)
			a := startBulk(t, r, false, 7001, n, uint64(900+2*i), deadline)
			b := startBulk(t, r, true, 7002, n, uint64(901+2*i), deadline)
			u, err := r.st.ListenUDP(r.stackAP(false, 5353))
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			var done atomic.Bool
			udpRes := make(chan udpResult, 1)
			go func() { udpRes <- readDatagrams(u, 1<<30, 1000, deadline, nil, &done) }()
			stop := make(chan struct{})
			sent, poured := udpPour(t, r, r.stackAP(false, 5353), 20000, 1000, 8, stop)
			a.wait(t, r, tl, deadline)
			b.wait(t, r, tl, deadline)
			close(stop)
			<-poured
			time.Sleep(300 * time.Millisecond)
			done.Store(true)
			ur := <-udpRes
			// UDP may lose what the pool had no room for; nothing may be
			// corrupted.
			checkUDPResult(t, "udp flow", ur, int(sent.Load()), 0)
			tl.checked.Add(ur.bytes)
			pages, bytes := w.end(t, tl)
			c := counters(r.st)
			t.Logf("rx_drop_no_buffer %d rx_pp_alloc_empty %d rx_pp_order_fallbacks %d rx_pp_order_recoveries %d tcp_retransmits %d; udp %d of %d arrived",
				c["rx_drop_no_buffer"], c["rx_pp_alloc_empty"], c["rx_pp_order_fallbacks"], c["rx_pp_order_recoveries"], c["tcp_retransmits"], len(ur.seen), sent.Load())
			if c["rx_pp_alloc_empty"] == 0 {
				t.Errorf("rx_pp_alloc_empty: got 0, want > 0 (the pool's limit was never reached: the test tests nothing)")
			}
			if c["rx_drop_no_buffer"] == 0 {
				t.Errorf("rx_drop_no_buffer: got 0, want > 0")
			}
			tl.faults.Add(int64(c["rx_drop_no_buffer"]))
			if tc.pc.MaxPages > 0 && pages > int64(tc.pc.MaxPages) {
				t.Errorf("pool peak: %d pages, limit %d", pages, tc.pc.MaxPages)
			}
			if tc.pc.MaxBytes > 0 && bytes > tc.pc.MaxBytes {
				t.Errorf("pool peak: %d bytes, limit %d", bytes, tc.pc.MaxBytes)
			}
			// Only buffer shortage, and the kernel's multicast chatter.
			if got := c["rx_dropped"] - c["rx_drop_no_buffer"] - c["rx_drop_multicast"]; got != 0 {
				t.Errorf("drops other than no_buffer and multicast: %d: %s", got, dropReasons(r.st))
			}
			// Recovery: with the load gone the pool has room again, and a
			// fresh transfer goes through.
			kernelToStack(t, r, false, 7003, 1<<20, uint64(950+i))
			tl.checked.Add(1 << 20)
		})
	}
}

// TestExhaustRQDrop runs bulk TCP through an RQ of two WQEs that drops
// what finds it full (-rq-full drop), as a NIC whose driver falls behind:
// frames are lost at the NIC, TCP retransmits them, and every byte arrives
// intact; the ring holds no more than its two WQEs.
func TestExhaustRQDrop(t *testing.T) {
	needRoot(t)
	tl := record("TestExhaustRQDrop")
	// WQEs just large enough for an LRO super-frame: two of them in the
	// ring ahead of the poll loop.
	dc := driver.Config{LRO: true, RQSize: 2, RQDrop: true, WQEBytes: 72 << 10}
	r := newRig(t, "usit-rqdrop", 1500, dc)
	w := watchPool(r.st)
	const n = 48 << 20
	kernelToStack(t, r, false, 7001, n, 1201)
	kernelToStack(t, r, true, 7002, n, 1202)
	tl.checked.Add(2 * n)
	pages, _ := w.end(t, tl)
	c := counters(r.st)
	drops := c["rx_drop_out_of_buffer"]
	t.Logf("rx_drop_out_of_buffer %d rx_rq_stalls %d rx_lro_packets %d; pool peak %d pages",
		drops, c["rx_rq_stalls"], c["rx_lro_packets"], pages)
	tl.faults.Add(int64(drops))
	if drops == 0 {
		t.Errorf("rx_drop_out_of_buffer: got 0, want > 0 (an RQ of two super-frames never overflowed: the test tests nothing)")
	}
	if c["rx_rq_stalls"] != 0 {
		t.Errorf("rx_rq_stalls: got %d, want 0 (with -rq-full drop the NIC model does not wait)", c["rx_rq_stalls"])
	}
	if _, peak := pagesBound(r); pages > peak {
		t.Errorf("pool peak %d pages, want at most %d", pages, peak)
	}
}

// TestExhaustAppStopsReading has the stack's application stop reading a
// TCP flow for a while: the window closes and the kernel stops sending,
// memory stays bounded (pool and RSS), and the flow resumes and completes
// intact when the application reads again. Meanwhile a UDP socket nobody
// reads overflows: its drops are counted, not buffered.
func TestExhaustAppStopsReading(t *testing.T) {
	needRoot(t)
	tl := record("TestExhaustAppStopsReading")
	r := newRig(t, "usit-stopread", 1500, driver.Config{LRO: true})
	w := watchPool(r.st)
	const n = 48 << 20
	deadline := time.Now().Add(transferTimeout(n) + time.Minute)
	f := startBulk(t, r, false, 7001, n, 990, deadline)
	u, err := r.st.ListenUDP(r.stackAP(true, 5353))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	stop := make(chan struct{})
	sent, poured := udpPour(t, r, r.stackAP(true, 5353), 20000, 1200, 32, stop)

	if !waitUntil(time.Minute, func() bool { return f.got.Load() >= 8<<20 }) {
		diagnose(t, r)
		t.Fatal("flow did not reach 8 MB within a minute")
	}
	f.pause.Store(true)
	tl.faults.Add(1)
	// Once the window is closed, the kernel's writes stop moving (for a
	// whole second: a half-second pause was seen to end when gVisor's
	// receive-buffer auto-tuning opened the window a little more).
	var stalled int64
	if !waitUntil(20*time.Second, func() bool {
		s := f.sent.Load()
		time.Sleep(time.Second)
		stalled = f.sent.Load()
		return s == stalled
	}) {
		t.Errorf("the kernel kept sending for 20s while the application did not read (sent %d, read %d)", f.sent.Load(), f.got.Load())
	}
	time.Sleep(time.Second)
	inFlight := f.sent.Load() - f.got.Load()
	poolNow := r.st.Driver().Pool().Stats()
	t.Logf("paused: kernel wrote %d MB, application read %d MB: %d KB between them (the stack's receive buffer and the kernel's send buffer); pool %d pages",
		f.sent.Load()>>20, f.got.Load()>>20, inFlight>>10, poolNow.InUse)
	// Bound: the kernel's send buffer (tcp_wmem max, 4 MB) and the stack's
	// receive buffer (stack.DefaultTCPReceiveBufferMax, 32 MB, as the
	// kernel's tcp_rmem here); far less than the flow.
	if inFlight > 40<<20 {
		t.Errorf("bytes written but not read while paused: %d MB, want at most 40", inFlight>>20)
	}
	if more := f.sent.Load() - stalled; more > 4<<20 {
		t.Errorf("the kernel sent on after the window closed: %d then %d bytes", stalled, f.sent.Load())
	}
	// A reader that stops does not pin RX pages (gVisor holds copies):
	// with nothing in flight the pool holds its quarantine ring and the
	// WQE being filled, however much is unread.
	idle, peak := pagesBound(r)
	if poolNow.InUse > idle {
		t.Errorf("pool pages while paused: %d, want at most %d (the ring and one WQE; %d KB unread)", poolNow.InUse, idle, inFlight>>10)
	}
	close(stop)
	<-poured
	f.pause.Store(false)
	f.wait(t, r, tl, deadline)
	pages, _ := w.end(t, tl)
	// At any time, whatever the window: the ring, the RQ's WQEs the NIC
	// model may fill ahead of the poll loop and the one being filled, and
	// what GRO holds.
	if pages > peak {
		t.Errorf("pool peak %d pages, want at most %d", pages, peak)
	}
	// The UDP socket was never read: what did not fit was dropped and
	// counted; what fit is intact.
	var dgDone atomic.Bool
	dgDone.Store(true)
	ur := readDatagrams(u, 1<<30, 1200, time.Now().Add(10*time.Second), nil, &dgDone)
	checkUDPResult(t, "unread udp socket", ur, 0, 0)
	tl.checked.Add(ur.bytes)
	errs := counter(t, r.st, "udp_receive_buffer_errors")
	t.Logf("udp: %d sent to an unread socket, %d queued, udp_receive_buffer_errors %d", sent.Load(), len(ur.seen), errs)
	if errs == 0 {
		t.Errorf("udp_receive_buffer_errors: got 0, want > 0 (%d datagrams to a socket nobody read)", sent.Load())
	}
	tl.faults.Add(int64(errs))
}

// pagesBound returns the most pages r's pool may hold with nothing in
// flight (its quarantine ring and the WQE being filled) and at any time (the
// RQ's WQEs too, which the NIC model fills ahead of the poll loop, and 64
// pages for packets GRO holds). A stack that kept RX pages in its receive
// buffers would go past both with megabytes unread.
func pagesBound(r *rig) (idle, peak int64) {
	wqes, wqeBytes := r.st.Driver().Config().RQDepth()
	wqePages := int64(wqeBytes/bufpool.PageSize4K + 2)
	idle = int64(r.st.Driver().Pool().RingSize()) + wqePages
	return idle, idle + int64(wqes)*wqePages + 64
}

// listenBacklog listens on ap with gVisor's TCP and a listen backlog of
// backlog (stack.ListenTCP's is 4096), so that a flood reaches it soon.
func listenBacklog(t *testing.T, st *stack.Stack, ap netip.AddrPort, backlog int) net.Listener {
	t.Helper()
	var wq waiter.Queue
	ep, e := st.GVisor().NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if e != nil {
		t.Fatal(e)
	}
	if e := ep.Bind(tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(ap.Addr().As4()), Port: ap.Port()}); e != nil {
		ep.Close()
		t.Fatal(e)
	}
	if e := ep.Listen(backlog); e != nil {
		ep.Close()
		t.Fatal(e)
	}
	return gonet.NewTCPListener(st.GVisor(), &wq, ep)
}

// TestExhaustSYNFlood floods a listener with SYNs from an address nobody
// answers for while an established flow continues: the flow completes
// intact, the listener's half-open queue fills, gVisor answers with SYN
// cookies, and a real client still connects (by cookie) and is served.
func TestExhaustSYNFlood(t *testing.T) {
	needRoot(t)
	tl := record("TestExhaustSYNFlood")
	r := newRig(t, "usit-synflood", 1500, driver.Config{LRO: true})
	w := watchPool(r.st)
	const (
		n       = 32 << 20
		port    = 80
		backlog = 16
		flood   = 20000
	)
	deadline := time.Now().Add(transferTimeout(n) + time.Minute)
	f := startBulk(t, r, false, 7001, n, 1000, deadline)
	ap := r.stackAP(false, port)
	l := listenBacklog(t, r.st, ap, backlog)
	defer l.Close()
	// The listener's server: read each connection to EOF, check its hash.
	var served, servedOK atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(deadline)
				got := recvHashed(progressConn{c, deadline})
				served.Add(1)
				if got.err == nil && got.n == 1<<20 && got.sum == streamSum(1001, 1<<20) {
					servedOK.Add(1)
				}
			}()
		}
	}()

	inj, err := r.bed.NS.NewInjector(testbed.InjectorConfig{Dev: r.bed.TAPName, MaxFrames: flood, Deadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	defer inj.Close()
	spoof := r.bed.StackAddr4.Masked().Addr()
	for range 200 {
		spoof = spoof.Next() // .200: in the subnet, nobody's
	}
	rng := rand.New(rand.NewPCG(1, 2))
	synsSent := 0
	floodOne := func() {
		src := netip.AddrPortFrom(spoof, uint16(1024+rng.IntN(60000)))
		if inj.Write(tcpFrame(stack.DefaultMAC, hostileSrcMAC, src, ap, rng.Uint32(), 0, header.TCPFlagSyn, 65535, nil)) == nil {
			synsSent++
			tl.faults.Add(1)
		}
	}
	// Fill the half-open queue, then keep flooding while a real client
	// connects.
	for range 2000 {
		floodOne()
		if synsSent%50 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	cookiesBefore := gvisorCounter(r.st, "gvisor_tcp_listen_overflow_syn_cookie_sent")
	clientDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		c, err := r.bed.NS.DialTCP(ctx, ap, cc)
		if err != nil {
			clientDone <- err
			return
		}
		defer c.Close()
		c.SetDeadline(deadline)
		if _, err := sendHashed(progressConn{c, deadline}, 1<<20, writeSize, 1001); err != nil {
			clientDone <- err
			return
		}
		clientDone <- c.Close()
	}()
	var clientErr error
	clientFinished := false
	for !clientFinished && synsSent < flood-100 && time.Now().Before(deadline) {
		select {
		case clientErr = <-clientDone:
			clientFinished = true
		default:
			for range 20 {
				floodOne()
			}
			time.Sleep(time.Millisecond)
		}
	}
	if !clientFinished {
		clientErr = <-clientDone
	}
	if clientErr != nil {
		t.Errorf("client during the flood: %v", clientErr)
	}
	f.wait(t, r, tl, deadline)
	l.Close()
	wg.Wait()
	w.end(t, tl)
	sent := gvisorCounter(r.st, "gvisor_tcp_listen_overflow_syn_cookie_sent")
	rcvd := gvisorCounter(r.st, "gvisor_tcp_listen_overflow_syn_cookie_rcvd")
	t.Logf("%d SYNs flooded; SYN cookies sent %d (%d before the client), valid cookies received %d; SYNs dropped for a full accept queue %d; connections served %d",
		synsSent, sent, cookiesBefore, rcvd, gvisorCounter(r.st, "gvisor_tcp_listen_overflow_syn_drop"), served.Load())
	if sent == 0 {
		t.Errorf("SYN cookies sent: got 0, want > 0 (%d SYNs on a backlog of %d)", synsSent, backlog)
	}
	if rcvd == 0 {
		t.Errorf("valid SYN cookies received: got 0, want > 0 (the client connected during the flood)")
	}
	if servedOK.Load() != 1 {
		t.Errorf("client's 1 MB served intact: got %d of %d connections, want 1", servedOK.Load(), served.Load())
	} else {
		recordTransfer(tl, 1<<20, true)
	}
}

// gvisorCounter returns one of gVisor's own counters (EachGVisorCounter).
func gvisorCounter(st *stack.Stack, name string) uint64 {
	var v uint64
	st.EachGVisorCounter(func(n string, c uint64) {
		if n == name {
			v = c
		}
	})
	return v
}

// TestExhaustManyConnections opens 1,000 concurrent connections from the
// kernel to one listener, each sending its own 64 KB at once, with LRO off
// so that the software GRO table sees a thousand flows: every connection's
// bytes arrive intact.
func TestExhaustManyConnections(t *testing.T) {
	needRoot(t)
	tl := record("TestExhaustManyConnections")
	const (
		conns = 1000
		size  = 64 << 10
	)
	// A thousand flows start at once, each with its initial window: with
	// the TAP's default queue of 500 frames the kernel drops a quarter of
	// them under -race and load (TX dropped on the TAP), and a flow whose
	// retransmissions are dropped again backs off past stallTimeout. The
	// test is about the stack's tables, not loss recovery: a queue that
	// holds the burst, as a NIC's ring and a switch's buffer would.
	r := newBedRig(t, newBedConfig(t, testbed.TAPConfig{Prefix: "usit-conns", MTU: 1500, TxQueueLen: 8192}), 1500, stack.Config{})
	w := watchPool(r.st)
	deadline := time.Now().Add(3 * time.Minute)
	ap := r.stackAP(false, 7001)
	l, err := r.st.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var ok, bad atomic.Int64
	var firstBad atomic.Value // the first bad connection's error, for the log
	var srv sync.WaitGroup
	srv.Add(1)
	go func() {
		defer srv.Done()
		for i := 0; i < conns; i++ {
			c, err := l.Accept()
			if err != nil {
				return
			}
			srv.Add(1)
			go func() {
				defer srv.Done()
				defer c.Close()
				c.SetDeadline(deadline)
				pc := progressConn{c, deadline}
				var id [8]byte
				if _, err := io.ReadFull(pc, id[:]); err != nil {
					bad.Add(1)
					firstBad.CompareAndSwap(nil, fmt.Sprintf("reading the id: %v", err))
					return
				}
				seed := binary.BigEndian.Uint64(id[:])
				// A small buffer: a thousand of recvHashed's would be
				// most of the process's memory.
				h := sha256.New()
				m, err := io.CopyBuffer(h, pc, make([]byte, 16<<10))
				if want := streamSum(seed, size); err == nil && m == size && bytes.Equal(h.Sum(nil), want[:]) {
					ok.Add(1)
				} else {
					bad.Add(1)
					firstBad.CompareAndSwap(nil, fmt.Sprintf("%d of %d bytes, err %v", m, size, err))
				}
			}()
		}
	}()
	// Dial all, then let them all send at once.
	start := make(chan struct{})
	var cli sync.WaitGroup
	var dialErrs, sendErrs atomic.Int64
	for i := range conns {
		cli.Add(1)
		go func() {
			defer cli.Done()
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			c, err := r.bed.NS.DialTCP(ctx, ap, cc)
			if err != nil {
				dialErrs.Add(1)
				return
			}
			defer c.Close()
			c.SetDeadline(deadline)
			<-start
			seed := uint64(20000 + i)
			var id [8]byte
			binary.BigEndian.PutUint64(id[:], seed)
			if _, err := c.Write(id[:]); err != nil {
				sendErrs.Add(1)
				return
			}
			if _, err := sendHashed(progressConn{c, deadline}, size, 16<<10, seed); err != nil {
				sendErrs.Add(1)
				return
			}
			if err := c.CloseWrite(); err != nil {
				sendErrs.Add(1)
			}
			// Wait for the server's close before closing: the stack has
			// read everything then.
			c.Read(make([]byte, 1))
		}()
	}
	established := waitUntil(time.Minute, func() bool {
		return counter(t, r.st, "tcp_established") >= conns || dialErrs.Load() > 0
	})
	t.Logf("tcp_established %d of %d (dial errors %d)", counter(t, r.st, "tcp_established"), conns, dialErrs.Load())
	if !established {
		t.Errorf("connections established: got %d, want %d", counter(t, r.st, "tcp_established"), conns)
	}
	began := time.Now()
	close(start)
	cli.Wait()
	l.Close()
	srv.Wait()
	elapsed := time.Since(began)
	w.end(t, tl)
	c := counters(r.st)
	ls, _ := r.bed.NS.LinkStats(r.bed.TAPName)
	t.Logf("%d connections x %d KB: %d intact, %d bad, in %v; rx_gro_skbs %d rx_gro_flush_evict %d rx_gro_held_max %d tcp_retransmits %d; TAP TX dropped %d of %d",
		conns, size>>10, ok.Load(), bad.Load(), elapsed.Round(time.Millisecond), c["rx_gro_skbs"], c["rx_gro_flush_evict"], c["rx_gro_held_max"], c["tcp_retransmits"], ls.TxDropped, ls.TxPackets+ls.TxDropped)
	// A thousand flows at once fill the GRO table (8 buckets of 8): it
	// must evict, not grow.
	if c["rx_gro_flush_evict"] == 0 {
		t.Errorf("rx_gro_flush_evict: got 0, want > 0 (%d flows at once; rx_gro_held_max %d)", conns, c["rx_gro_held_max"])
	}
	if c["rx_gro_held_max"] > 64 {
		t.Errorf("rx_gro_held_max: got %d, want at most 64 (the table's size)", c["rx_gro_held_max"])
	}
	if dialErrs.Load() != 0 || sendErrs.Load() != 0 {
		t.Errorf("kernel side: %d dial errors, %d send errors, want 0", dialErrs.Load(), sendErrs.Load())
	}
	if ok.Load() != conns {
		t.Errorf("connections intact: got %d, want %d; first bad: %v", ok.Load(), conns, firstBad.Load())
		tl.lost.Add((conns - ok.Load()) * size)
	}
	tl.load.Add(ok.Load())
	tl.checked.Add(ok.Load() * size)
	checkFlowDrops(t, r.st)
}

// TestExhaustCPUMapRing redirects every frame to one cpumap entry whose
// ring holds only 16 frames: the ring overflows and its drops are counted
// (cpumap_dropped), and the TCP flow still arrives intact.
func TestExhaustCPUMapRing(t *testing.T) {
	needRoot(t)
	tl := record("TestExhaustCPUMapRing")
	prog, err := cpumap.ParseProgram("cpu:0", 1)
	if err != nil {
		t.Fatal(err)
	}
	r := newRigConfig(t, "usit-cpuring", 1500, stack.Config{
		Driver: driver.Config{}, XDP: prog, CPUMap: []int{0}, CPUMapQueue: 16,
	})
	w := watchPool(r.st)
	const n = 32 << 20
	deadline := time.Now().Add(transferTimeout(n))
	f := startBulk(t, r, false, 7001, n, 1100, deadline)
	f.wait(t, r, tl, deadline)
	w.end(t, tl)
	c := counters(r.st)
	t.Logf("cpumap_dropped %d rx_xdp_redirect %d tcp_retransmits %d", c["cpumap_dropped"], c["rx_xdp_redirect"], c["tcp_retransmits"])
	if c["cpumap_dropped"] == 0 {
		t.Errorf("cpumap_dropped: got 0, want > 0 (a 16-frame ring under a bulk flow)")
	}
	tl.faults.Add(int64(c["cpumap_dropped"]))
}
