//go:build linux

package integration

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

const (
	// writeSize is the size of every write of a bulk sender.
	writeSize = 64 << 10
	// stallTimeout bounds every single read and write of a transfer (see
	// progressConn): a transfer that makes no progress for this long has
	// stalled, which fails it long before its overall deadline.
	stallTimeout = 30 * time.Second
	// cc is the congestion control of the kernel's senders.
	cc = "cubic"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for TAP and netns; run go test as root")
	}
}

// transferTimeout bounds a transfer of n bytes: generous enough for the
// race detector on a slow machine (it assumes 1 MiB/s), tight enough that a
// stalled transfer fails instead of hanging the suite.
func transferTimeout(n int64) time.Duration {
	return 60*time.Second + time.Duration(n>>20)*time.Second
}

// rig is a TAPBed with a ustack stack on its TAP, at the bed's StackAddr4
// and StackAddr6, whose RX pages come from a poisoning pool.
type rig struct {
	bed *testbed.TAPBed
	st  *stack.Stack
	// views makes kernelToStack's receiver read with ReadViews.
	views bool

	closeOnce sync.Once
}

// newRig builds a bed (namespace prefix unique to the calling test) with a
// TAP of the given MTU, opens the TAP with vnet headers and offloads from
// inside the namespace and starts a stack with driver config dc (its MTU
// and Pool are set here). Cleanup closes the stack, checks that every page
// came back, and removes the bed.
func newRig(t *testing.T, prefix string, mtu int, dc driver.Config) *rig {
	t.Helper()
	return newRigConfig(t, prefix, mtu, stack.Config{Driver: dc})
}

// newRigConfig is newRig with a whole stack configuration; its Wire, Addrs
// and Driver.MTU and Driver.Pool are set here, the pool from sc.Pool with
// Poison on.
func newRigConfig(t *testing.T, prefix string, mtu int, sc stack.Config) *rig {
	t.Helper()
	return newBedRig(t, newBed(t, prefix, mtu), mtu, sc)
}

// newBed builds a TAP bed that cleanup removes.
func newBed(t *testing.T, prefix string, mtu int) *testbed.TAPBed {
	t.Helper()
	return newBedConfig(t, testbed.TAPConfig{Prefix: prefix, MTU: mtu})
}

// newTUNRig is newRigConfig on a TUN device (a layer 3 link: IP packets,
// no Ethernet header), opened as wireguard-go opens one: IFF_TUN with the
// virtio-net header and offloads.
func newTUNRig(t *testing.T, prefix string, mtu int, sc stack.Config) *rig {
	t.Helper()
	return newBedRig(t, newBedConfig(t, testbed.TAPConfig{Prefix: prefix, MTU: mtu, TUN: true}), mtu, sc)
}

// newQueuesRig is newRigConfig on n queues of a multi-queue TAP (or TUN,
// with tun): the first is the stack's Wire, the rest its Config.Queues.
func newQueuesRig(t *testing.T, prefix string, n int, tun bool, sc stack.Config) *rig {
	t.Helper()
	bed := newBedConfig(t, testbed.TAPConfig{Prefix: prefix, TUN: tun, MultiQueue: true})
	var qs []*driver.TAP
	if err := bed.Open(func() (err error) {
		qs, err = driver.OpenTAPQueues(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true, TUN: tun}, n)
		return err
	}); err != nil {
		for _, q := range qs {
			q.Close()
		}
		t.Fatal(err)
	}
	for _, q := range qs[1:] {
		sc.Queues = append(sc.Queues, q)
	}
	return newBedRigOn(t, bed, 1500, sc, qs[0])
}

// newBedConfig builds a bed of cfg that cleanup removes.
func newBedConfig(t *testing.T, cfg testbed.TAPConfig) *testbed.TAPBed {
	t.Helper()
	bed, err := testbed.NewTAPBed(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Error(err)
		}
	})
	return bed
}

// newBedRig is newRigConfig on a bed of the caller's.
func newBedRig(t *testing.T, bed *testbed.TAPBed, mtu int, sc stack.Config) *rig {
	t.Helper()
	return newBedRigWire(t, bed, mtu, sc, false)
}

// newBedRigWire is newBedRig on ustack's TAP with offloads, or on water's
// plain wire.
func newBedRigWire(t *testing.T, bed *testbed.TAPBed, mtu int, sc stack.Config, plain bool) *rig {
	t.Helper()
	var w driver.Wire
	if err := bed.Open(func() (err error) {
		if plain {
			var pw *driver.PlainWire
			if pw, err = driver.OpenWater(bed.TAPName, driver.MaxFrameLen(mtu)); err == nil {
				w = pw
			}
			return err
		}
		var tap *driver.TAP
		if tap, err = driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true, TUN: bed.TUN}); err == nil {
			w = tap
		}
		return err
	}); err != nil {
		if w != nil {
			w.Close()
		}
		t.Fatal(err)
	}
	return newBedRigOn(t, bed, mtu, sc, w)
}

// newBedRigOn starts the rig's stack on the wire w (and sc.Queues),
// opened on bed, with queue 0's pool of sc.Pool poisoning.
func newBedRigOn(t *testing.T, bed *testbed.TAPBed, mtu int, sc stack.Config, w driver.Wire) *rig {
	t.Helper()
	dc := sc.Driver
	// The pool of sc.Pool (limits, recycling), always poisoning.
	pc := sc.Pool
	pc.Poison = true
	if sc.ZeroCopy && pc.Memory == nil {
		// Lent pages wait in the ring while gVisor holds them.
		pc.Memory = stack.NewChunkMemory()
		if pc.RingSize == 0 {
			pc.RingSize = stack.ZeroCopyRingPages
		}
	}
	pool, err := bufpool.New(pc)
	if err != nil {
		w.Close()
		t.Fatal(err)
	}
	dc.MTU = mtu
	dc.Pool = pool
	sc.Pool.Poison = true // the further queues' pools
	sc.Wire = w           // closed by New on error, by the stack's Close otherwise
	sc.Addrs = []netip.Prefix{bed.StackAddr4, bed.StackAddr6}
	sc.Driver = dc
	st, err := stack.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{bed: bed, st: st}
	// Registered after the bed's cleanup, so it runs before it: the TAP
	// must be closed before the namespace is deleted.
	t.Cleanup(func() { r.close(t) })
	return r
}

// close closes the stack (and with it the TAP) and checks that every RX
// page went back to the pool. Later calls do nothing.
func (r *rig) close(t *testing.T) {
	t.Helper()
	r.closeOnce.Do(func() {
		if t.Failed() {
			t.Logf("counters at failure: %s", allCounters(r.st))
		}
		if err := r.st.Close(); err != nil {
			t.Errorf("stack Close: %v", err)
		}
		for q := range r.st.Queues() {
			if n := r.st.QueueDriver(q).Pool().InUse(); n != 0 {
				t.Errorf("queue %d: pages in use after stack Close: got %d, want 0", q, n)
			}
		}
	})
}

// stackAP and kernelAP are the stack's and the kernel's address of the
// chosen family with a port.
func (r *rig) stackAP(v6 bool, port uint16) netip.AddrPort {
	if v6 {
		return netip.AddrPortFrom(r.bed.StackAddr6.Addr(), port)
	}
	return netip.AddrPortFrom(r.bed.StackAddr4.Addr(), port)
}

func (r *rig) kernelAP(v6 bool, port uint16) netip.AddrPort {
	if v6 {
		return netip.AddrPortFrom(r.bed.KernelAddr6.Addr(), port)
	}
	return netip.AddrPortFrom(r.bed.KernelAddr4.Addr(), port)
}

func family(v6 bool) string {
	if v6 {
		return "ipv6"
	}
	return "ipv4"
}

// counters returns every counter of st by name.
func counters(st *stack.Stack) map[string]uint64 {
	m := map[string]uint64{}
	st.EachCounter(func(name string, v uint64) { m[name] = v })
	return m
}

// counter returns the counter called name; a name the stack does not have
// fails the test (a renamed counter must not make a check vacuous).
func counter(t *testing.T, st *stack.Stack, name string) uint64 {
	t.Helper()
	v, ok := counters(st)[name]
	if !ok {
		t.Fatalf("stack has no counter %q", name)
	}
	return v
}

// allCounters lists every non-zero counter, for failure messages.
func allCounters(st *stack.Stack) string {
	var out []string
	st.EachCounter(func(name string, v uint64) {
		if v != 0 {
			out = append(out, fmt.Sprintf("%s=%d", name, v))
		}
	})
	return strings.Join(out, " ")
}

// dropReasons lists the non-zero per-reason drop counters, for failure
// messages.
func dropReasons(st *stack.Stack) string {
	var out []string
	for name, v := range counters(st) {
		if v != 0 && (strings.HasPrefix(name, "rx_drop_") || name == "rx_dropped") {
			out = append(out, fmt.Sprintf("%s=%d", name, v))
		}
	}
	sort.Strings(out)
	if len(out) == 0 {
		return "(none)"
	}
	return strings.Join(out, " ")
}

// checkFlowDrops checks that the driver dropped nothing but multicast
// frames for groups the stack has not joined. Those are the kernel's own
// IPv6 chatter on a link that just got its carrier (MLD reports to
// ff02::16, router solicitations, DAD of its link-local address), which a
// NIC's multicast filter drops by design; every other drop would be a frame
// of the test's traffic.
func checkFlowDrops(t *testing.T, st *stack.Stack) {
	t.Helper()
	c := counters(st)
	if got := c["rx_dropped"] - c["rx_drop_multicast"]; got != 0 {
		t.Errorf("rx_dropped (not counting rx_drop_multicast): got %d, want 0; drop counters: %s", got, dropReasons(st))
	}
	if m := c["rx_drop_multicast"]; m != 0 {
		t.Logf("rx_drop_multicast %d (kernel's multicast chatter, filtered)", m)
	}
}

// logRate logs a transfer's throughput.
func logRate(t *testing.T, what string, n int64, d time.Duration) {
	t.Helper()
	t.Logf("%s: %d MiB in %v: %.1f MB/s", what, n>>20, d.Round(time.Millisecond), float64(n)/d.Seconds()/1e6)
}

// randReader returns the pseudo-random byte stream of seed.
func randReader(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	return rand.NewChaCha8(s)
}

// sendHashed writes n pseudo-random bytes (the stream of seed) to w in
// writes of wsize and returns their SHA-256.
func sendHashed(w io.Writer, n int64, wsize int, seed uint64) ([32]byte, error) {
	h := sha256.New()
	r := randReader(seed)
	buf := make([]byte, wsize)
	for sent := int64(0); sent < n; {
		b := buf[:min(int64(wsize), n-sent)]
		r.Read(b)
		h.Write(b)
		m, err := w.Write(b)
		sent += int64(m)
		if err != nil {
			return [32]byte{}, fmt.Errorf("after %d of %d bytes: %w", sent, n, err)
		}
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, nil
}

// hashResult is what a hashing receiver saw.
type hashResult struct {
	n   int64
	sum [32]byte
	err error
}

// recvHashed reads r to EOF and returns the byte count and SHA-256.
func recvHashed(r io.Reader) hashResult {
	h := sha256.New()
	n, err := io.CopyBuffer(h, r, make([]byte, 256<<10))
	var res hashResult
	res.n, res.err = n, err
	h.Sum(res.sum[:0])
	return res
}

// checkHash compares a receiver's result with what was sent and reports
// whether they agree.
func checkHash(t *testing.T, got hashResult, n int64, want [32]byte) bool {
	t.Helper()
	if got.err != nil {
		t.Errorf("receiver: %v (after %d of %d bytes)", got.err, got.n, n)
		return false
	}
	ok := true
	if got.n != n {
		t.Errorf("bytes received: got %d, want %d", got.n, n)
		ok = false
	}
	if got.sum != want {
		t.Errorf("sha256 of received bytes: got %x, want %x", got.sum, want)
		ok = false
	}
	return ok
}

// acceptOne accepts one connection on l in a goroutine, reads it to EOF
// with the deadline and sends the hash. If nothing connects, closing l
// ends the wait.
func acceptOne(l net.Listener, deadline time.Time) <-chan hashResult {
	return acceptWith(l, deadline, func(c net.Conn) hashResult {
		c.SetDeadline(deadline)
		return recvHashed(progressConn{c, deadline})
	})
}

// acceptViews is acceptOne reading with ReadViews: every view is hashed in
// place, after the next read, then released, so that a page reused too
// early would show in the hash.
func acceptViews(l net.Listener, deadline time.Time) <-chan hashResult {
	return acceptWith(l, deadline, func(c net.Conn) hashResult {
		tc := c.(*stack.TCPConn)
		h := sha256.New()
		var got hashResult
		var prev []stack.View
		vs := make([]stack.View, 0, 64)
		var err error
		for {
			tc.SetReadDeadline(progressConn{c, deadline}.next())
			var n int
			vs, n, err = tc.ReadViews(vs[:0], 1<<20)
			// The previous read's views are hashed only now, after more
			// traffic came in behind them.
			for i := range prev {
				h.Write(prev[i].Bytes())
				prev[i].Release()
			}
			got.n += int64(n)
			prev = append(prev[:0], vs...)
			if err != nil {
				break
			}
		}
		for i := range prev {
			h.Write(prev[i].Bytes())
			prev[i].Release()
		}
		if !errors.Is(err, io.EOF) {
			got.err = err
		}
		h.Sum(got.sum[:0])
		return got
	})
}

// acceptWith accepts one connection on l in the background and hands it to
// recv, whose result it yields.
func acceptWith(l net.Listener, deadline time.Time, recv func(net.Conn) hashResult) <-chan hashResult {
	res := make(chan hashResult, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			res <- hashResult{err: fmt.Errorf("accept: %w", err)}
			return
		}
		defer c.Close()
		res <- recv(c)
	}()
	return res
}

// waitHash waits for a receiver's result until deadline (plus a grace for
// the receiver's own deadline to fire).
func waitHash(t *testing.T, r *rig, res <-chan hashResult, deadline time.Time) hashResult {
	t.Helper()
	timer := time.NewTimer(time.Until(deadline) + 5*time.Second)
	defer timer.Stop()
	select {
	case got := <-res:
		return got
	case <-timer.C:
		diagnose(t, r)
		t.Fatal("receiver did not finish by its deadline")
		return hashResult{}
	}
}

// kernelToStack sends n pseudo-random bytes from a kernel TCP socket in the
// bed's namespace to a hashing receiver on the stack at port and checks
// that the stack received exactly them. It returns the time from the start
// of the sending to the receiver's EOF.
func kernelToStack(t *testing.T, r *rig, v6 bool, port uint16, n int64, seed uint64) time.Duration {
	t.Helper()
	ap := r.stackAP(v6, port)
	l, err := r.st.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	deadline := time.Now().Add(transferTimeout(n))
	var res <-chan hashResult
	if r.views {
		res = acceptViews(l, deadline)
	} else {
		res = acceptOne(l, deadline)
	}

	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	c, err := r.bed.NS.DialTCP(ctx, ap, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	start := time.Now()
	want, err := sendHashed(progressConn{c, deadline}, n, writeSize, seed)
	if err != nil {
		diagnose(t, r)
		t.Fatalf("kernel sender: %v", err)
	}
	// Close (FIN after the queued data); the receiver reads to EOF.
	if err := c.Close(); err != nil {
		t.Fatalf("kernel sender close: %v", err)
	}
	got := waitHash(t, r, res, deadline)
	elapsed := time.Since(start)
	if !checkHash(t, got, n, want) {
		diagnose(t, r)
	}
	return elapsed
}

// progressConn sets a fresh deadline before every Read and Write:
// stallTimeout from now, but never later than end.
type progressConn struct {
	net.Conn
	end time.Time
}

func (c progressConn) next() time.Time {
	d := time.Now().Add(stallTimeout)
	if d.After(c.end) {
		return c.end
	}
	return d
}

func (c progressConn) Read(b []byte) (int, error) {
	c.Conn.SetReadDeadline(c.next())
	return c.Conn.Read(b)
}

func (c progressConn) Write(b []byte) (int, error) {
	c.Conn.SetWriteDeadline(c.next())
	return c.Conn.Write(b)
}

// diagnose logs what helps to understand a stalled or failed transfer: the
// kernel's view of its TCP sockets in the bed's namespace (ss -tinm) and
// every non-zero counter of the stack, if there is one.
func diagnose(t *testing.T, r *rig) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := r.bed.NS.Exec(ctx, "ss", "-tinm").CombinedOutput()
	if err != nil {
		t.Logf("ss -tinm: %v", err)
	}
	t.Logf("kernel TCP sockets (ss -tinm):\n%s", out)
	out, err = r.bed.NS.Exec(ctx, "nstat", "-a").CombinedOutput()
	if err != nil {
		t.Logf("nstat -a: %v", err)
	}
	t.Logf("kernel network counters (nstat -a):\n%s", out)
	if r.st != nil {
		t.Logf("counters: %s", allCounters(r.st))
		t.Logf("gVisor stats: %s", gvisorStats(r.st))
	}
}

// gvisorStats lists the non-zero counters of the gVisor stack
// (EachGVisorCounter) and of each of its endpoints (TCP: zero-window
// states, segment queue drops, ...), named by their field path.
func gvisorStats(st *stack.Stack) string {
	var out []string
	add := func(name string, v uint64) {
		if v != 0 {
			out = append(out, fmt.Sprintf("%s=%d", name, v))
		}
	}
	st.EachGVisorCounter(add)
	counterType := reflect.TypeOf((*tcpip.StatCounter)(nil))
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		switch {
		case v.Type() == counterType:
			if !v.IsNil() {
				add(prefix, v.Interface().(*tcpip.StatCounter).Value())
			}
		case v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface:
			if !v.IsNil() {
				walk(prefix, v.Elem())
			}
		case v.Kind() == reflect.Struct && v.CanAddr() && v.Addr().Type() == counterType:
			add(prefix, v.Addr().Interface().(*tcpip.StatCounter).Value())
		case v.Kind() == reflect.Struct:
			for i := 0; i < v.NumField(); i++ {
				if f := v.Type().Field(i); f.IsExported() {
					walk(prefix+"."+f.Name, v.Field(i))
				}
			}
		}
	}
	for i, ep := range st.GVisor().RegisteredEndpoints() {
		if e, ok := ep.(interface{ Stats() tcpip.EndpointStats }); ok {
			walk(fmt.Sprintf("endpoint%d", i), reflect.ValueOf(e.Stats()))
		}
	}
	return strings.Join(out, " ")
}

// errTimeout reports whether err is a deadline expiry.
func errTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
