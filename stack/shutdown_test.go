package stack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// lingerWire is one end of an in-memory link whose Close closes only its
// own end: what it wrote before is still read at the other end, as frames
// on a real wire outlive their sender's close. (MemWire's Close closes
// both ends and drops what is queued, which would hide whether a RST
// written just before left.) Frames that find the queue full, or that are
// written after the other end closed, are lost.
type lingerWire struct {
	rx, tx chan []byte
	closed chan struct{}
	once   sync.Once
}

// newLingerPair returns two joined lingerWires, each direction queueing
// depth frames.
func newLingerPair(depth int) (a, b *lingerWire) {
	ab, ba := make(chan []byte, depth), make(chan []byte, depth)
	return &lingerWire{rx: ba, tx: ab, closed: make(chan struct{})},
		&lingerWire{rx: ab, tx: ba, closed: make(chan struct{})}
}

func (w *lingerWire) Read(b []byte, block bool) (int, error) {
	select {
	case <-w.closed:
		return 0, os.ErrClosed
	case f := <-w.rx:
		return copy(b, f), nil
	default:
	}
	if !block {
		return 0, driver.ErrNoFrame
	}
	select {
	case <-w.closed:
		return 0, os.ErrClosed
	case f := <-w.rx:
		return copy(b, f), nil
	}
}

func (w *lingerWire) Write(b []byte) error {
	select {
	case <-w.closed:
		return os.ErrClosed
	default:
	}
	select {
	case w.tx <- append([]byte(nil), b...):
	default: // full: lost, as on a link
	}
	return nil
}

func (w *lingerWire) Close() error {
	w.once.Do(func() { close(w.closed) })
	return nil
}

// shutdownPair builds the stack under test, srv at 192.0.2.1 (its pool
// poisons; closeAll checks every page came back), and a peer at 192.0.2.2,
// on a lingerWire pair. closeAll closes both (peer last, so that it reads
// what srv's Close sent); cleanup calls it too.
func shutdownPair(t *testing.T) (srv, peer *Stack, closeAll func()) {
	t.Helper()
	a, b := newLingerPair(4096)
	pool := testutil.NewPool(t, bufpool.Config{Poison: true, RingSize: 1 << 15})
	srv, err := New(Config{Wire: a, MAC: [6]byte{2, 0, 0, 0, 0, 1}, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}, Driver: driver.Config{Pool: pool}})
	if err != nil {
		b.Close()
		t.Fatal(err)
	}
	peer, err = New(Config{Wire: b, MAC: [6]byte{2, 0, 0, 0, 0, 2}, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
	if err != nil {
		srv.Close()
		t.Fatal(err)
	}
	var once sync.Once
	closeAll = func() {
		once.Do(func() {
			srv.Close()
			peer.Close()
			if n := pool.InUse(); n != 0 {
				t.Errorf("pages in use after Close: got %d, want 0", n)
			}
		})
	}
	t.Cleanup(closeAll)
	return srv, peer, closeAll
}

var shutdownAddr = netip.MustParseAddrPort("192.0.2.1:80")

// streamSum returns the SHA-256 of the first n bytes of seed's stream.
func streamSum(seed uint64, n int64) [32]byte {
	h := sha256.New()
	r := newStream(seed)
	buf := make([]byte, 64<<10)
	for n > 0 {
		b := buf[:min(int64(len(buf)), n)]
		r.Read(b)
		h.Write(b)
		n -= int64(len(b))
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

func newStream(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	s[0], s[1] = byte(seed), byte(seed>>8)
	return rand.NewChaCha8(s)
}

// written is what the server's writer got accepted: n bytes of the
// stream, then err.
type written struct {
	n   int64
	err error
}

// download accepts one connection on l and writes up to total bytes of
// seed's stream to it in 64 KiB writes, until a write fails. The
// connection is left open (closed at the test's end), so that only the
// stack moves it on.
func download(t *testing.T, l net.Listener, total int64, seed uint64) (<-chan written, <-chan net.Conn) {
	res := make(chan written, 1)
	conns := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			res <- written{err: err}
			return
		}
		conns <- c
		r := newStream(seed)
		buf := make([]byte, 64<<10)
		var w written
		for w.n < total {
			b := buf[:min(int64(len(buf)), total-w.n)]
			r.Read(b)
			m, err := c.Write(b)
			w.n += int64(m)
			if err != nil {
				w.err = err
				break
			}
		}
		res <- w
	}()
	t.Cleanup(func() {
		select {
		case c := <-conns:
			c.Close()
		default:
		}
	})
	return res, conns
}

// rawConn is a peer's TCP socket as a bare gVisor endpoint, so that the
// tests see gVisor's own errors (*tcpip.ErrConnectionReset for a RST,
// *tcpip.ErrClosedForReceive for a FIN) whatever the stack's net.Conn
// makes of them.
type rawConn struct {
	ep tcpip.Endpoint
	wq waiter.Queue
}

// hangGuard bounds every wait of a rawConn: only a failure (a FIN or RST
// that never comes) waits that long.
const hangGuard = 60 * time.Second

// errHung stands for a wait that hangGuard ended.
type errHung struct{ tcpip.ErrTimeout }

func (*errHung) String() string { return "no segment within the hang guard" }

// dialRaw connects a raw endpoint of s to addr and returns it, or the
// connect's error.
func dialRaw(t *testing.T, s *Stack, addr netip.AddrPort) (*rawConn, tcpip.Error) {
	t.Helper()
	c := &rawConn{}
	ep, e := s.ip.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, &c.wq)
	if e != nil {
		t.Fatalf("new endpoint: %v", e)
	}
	c.ep = ep
	t.Cleanup(ep.Close)
	entry, ready := waiter.NewChannelEntry(waiter.WritableEvents | waiter.EventHUp | waiter.EventErr)
	c.wq.EventRegister(&entry)
	defer c.wq.EventUnregister(&entry)
	fa, _ := s.fullAddr(addr)
	e = ep.Connect(fa)
	if _, ok := e.(*tcpip.ErrConnectStarted); ok {
		select {
		case <-ready:
		case <-time.After(hangGuard):
			return nil, &errHung{}
		}
		e = ep.LastError()
	}
	if e != nil {
		return nil, e
	}
	return c, nil
}

// readResult is what a rawConn read: n bytes with SHA-256 sum, ended by
// end.
type readResult struct {
	n   int64
	sum [32]byte
	end tcpip.Error
}

// read reads c until an error and returns it with the count and hash of
// the bytes. Once pauseAt bytes are in (0: never), it closes paused and
// waits for resume before reading on.
func (c *rawConn) read(pauseAt int64, paused chan<- struct{}, resume <-chan struct{}) readResult {
	entry, ready := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
	c.wq.EventRegister(&entry)
	defer c.wq.EventUnregister(&entry)
	h := sha256.New()
	var res readResult
	finish := func(e tcpip.Error) readResult {
		res.end = e
		h.Sum(res.sum[:0])
		return res
	}
	for {
		lw := &tcpip.LimitedWriter{W: h, N: 1 << 30}
		if pauseAt > 0 {
			lw.N = pauseAt - res.n
		}
		rr, e := c.ep.Read(lw, tcpip.ReadOptions{})
		res.n += int64(rr.Count)
		if pauseAt > 0 && res.n >= pauseAt {
			close(paused)
			select {
			case <-resume:
			case <-time.After(hangGuard):
				return finish(&errHung{})
			}
			pauseAt = 0
			continue
		}
		switch e.(type) {
		case nil:
		case *tcpip.ErrWouldBlock:
			select {
			case <-ready:
			case <-time.After(hangGuard):
				return finish(&errHung{})
			}
		default:
			return finish(e)
		}
	}
}

// startRead runs c.read in a goroutine: the result comes on the channel.
func (c *rawConn) startRead(pauseAt int64, paused chan<- struct{}, resume <-chan struct{}) <-chan readResult {
	out := make(chan readResult, 1)
	go func() { out <- c.read(pauseAt, paused, resume) }()
	return out
}

const (
	shutdownTotal   = 50 << 20 // the download's size
	shutdownPauseAt = 4 << 20  // where the reader stops until told
)

// startDownload starts a download of shutdownTotal bytes from srv to a raw
// connection of peer, whose reader stops at shutdownPauseAt: when
// startDownload returns, the reader has stopped mid-transfer and the
// server's writer is held by the window. Closing resume lets the reader
// go on.
func startDownload(t *testing.T, srv, peer *Stack, seed uint64) (l net.Listener, wrote <-chan written, got <-chan readResult, resume chan struct{}, c *rawConn) {
	t.Helper()
	l, err := srv.ListenTCP(shutdownAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	wrote, _ = download(t, l, shutdownTotal, seed)
	c, e := dialRaw(t, peer, shutdownAddr)
	if e != nil {
		t.Fatalf("dial: %v", e)
	}
	paused := make(chan struct{})
	resume = make(chan struct{})
	got = c.startRead(shutdownPauseAt, paused, resume)
	select {
	case <-paused:
	case r := <-got:
		t.Fatalf("reader ended after %d bytes with %v before it paused", r.n, r.end)
	case w := <-wrote:
		t.Fatalf("writer ended after %d bytes with %v before the reader paused", w.n, w.err)
	}
	return l, wrote, got, resume, c
}

// waitWindowClosed waits until c's receive queue has stopped growing
// with its reader paused: the window it advertises is then closed, and
// the sender's remaining megabytes cannot go. Under -race the queue can
// still be filling long after the reader paused. (gVisor's window is not
// its buffer size less the queue, so the queue's standing still, for ten
// looks 20 ms apart, is the sign.)
func waitWindowClosed(t *testing.T, c *rawConn) {
	t.Helper()
	last, still := -1, 0
	testutil.WaitFor(t, "the peer's receive queue to stop growing", func() bool {
		q, e := c.ep.GetSockOptInt(tcpip.ReceiveQueueSizeOption)
		if e != nil || q != last || q == 0 {
			last, still = q, 0
		} else {
			still++
		}
		time.Sleep(20 * time.Millisecond)
		return still >= 10
	})
}

// checkPrefix fails t unless r's bytes are the first r.n of seed's stream.
func checkPrefix(t *testing.T, r readResult, seed uint64) {
	t.Helper()
	if want := streamSum(seed, r.n); r.sum != want {
		t.Errorf("sha256 of the %d bytes received: got %x, want %x (the stream's first %d bytes)", r.n, r.sum, want, r.n)
	}
}

// TestShutdownDeliversThenFIN cuts a 50 MB download with Shutdown while
// the peer's reader has stopped (the server's writes held by the window):
// the peer must then read every byte the server's writes took, and EOF
// (the FIN), not a reset; Shutdown must return nil once the FIN is
// acknowledged; a SYN to the listener after Shutdown began must be
// refused; and no goroutine may be left once the stacks are closed.
func TestShutdownDeliversThenFIN(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	const seed = 1
	srv, peer, closeAll := shutdownPair(t)
	_, wrote, got, resume, _ := startDownload(t, srv, peer, seed)

	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(ctx) }()
	// The writer's next write fails once its connection's FIN is queued,
	// after the listener was shut down (finishTCP's order).
	w := <-wrote
	if w.err == nil || w.n >= shutdownTotal {
		t.Fatalf("server writer: wrote %d bytes, err %v; want cut by Shutdown before %d", w.n, w.err, shutdownTotal)
	}
	if _, e := dialRaw(t, peer, shutdownAddr); !isErr[*tcpip.ErrConnectionRefused](e) {
		t.Errorf("dial during Shutdown: got %v, want connection refused (RST)", e)
	}
	close(resume)
	r := <-got
	if !isErr[*tcpip.ErrClosedForReceive](r.end) {
		t.Errorf("peer read after %d bytes: got %v, want EOF (the FIN)", r.n, r.end)
	}
	if r.n != w.n {
		t.Errorf("peer received %d bytes, want the %d the server wrote before Shutdown", r.n, w.n)
	}
	checkPrefix(t, r, seed)
	t.Logf("the server wrote %d of %d bytes before Shutdown; the peer received %d, then %v", w.n, shutdownTotal, r.n, r.end)
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: got %v, want nil", err)
	}
	if err := srv.Shutdown(context.Background()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Shutdown after Shutdown: got %v, want net.ErrClosed", err)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("Close after Shutdown: got %v, want nil", err)
	}
	closeAll()
	goleak.VerifyNone(t, leaks)
}

// TestShutdownCloseResets cuts the same download with Close: the peer's
// read, once it drained what it had, must end with a reset, which Close
// sends before it stops the driver (with the driver stopped first, no
// segment leaves and the peer waits forever).
func TestShutdownCloseResets(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	const seed = 2
	srv, peer, closeAll := shutdownPair(t)
	_, wrote, got, resume, _ := startDownload(t, srv, peer, seed)
	if err := srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	close(resume)
	r := <-got
	if !isErr[*tcpip.ErrConnectionReset](r.end) {
		t.Errorf("peer read after %d bytes: got %v, want connection reset", r.n, r.end)
	}
	checkPrefix(t, r, seed)
	if w := <-wrote; w.err == nil {
		t.Errorf("server writer: wrote %d bytes with no error, want cut by Close", w.n)
	}
	if err := srv.Shutdown(context.Background()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Shutdown after Close: got %v, want net.ErrClosed", err)
	}
	closeAll()
	goleak.VerifyNone(t, leaks)
}

// TestShutdownZeroWindowDeadline shuts down while the peer has stopped
// reading for good (its window closed): the FIN cannot go, so Shutdown
// must return at ctx's deadline with context.DeadlineExceeded, having
// reset the connection: the peer, reading again, drains its buffer and
// gets the reset.
func TestShutdownZeroWindowDeadline(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	const seed = 3
	srv, peer, closeAll := shutdownPair(t)
	_, wrote, got, resume, c := startDownload(t, srv, peer, seed)
	waitWindowClosed(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown with the peer's window closed: got %v, want context.DeadlineExceeded", err)
	}
	close(resume)
	r := <-got
	if !isErr[*tcpip.ErrConnectionReset](r.end) {
		t.Errorf("peer read after %d bytes: got %v, want connection reset", r.n, r.end)
	}
	checkPrefix(t, r, seed)
	if w := <-wrote; r.n > w.n {
		t.Errorf("peer received %d bytes, more than the %d written", r.n, w.n)
	}
	closeAll()
	goleak.VerifyNone(t, leaks)
}

// TestShutdownHalfClosedPeer shuts down a connection whose peer sent data
// the server never read, and sends more after the server's FIN without
// ever closing its side: the unread data must not turn the FIN into a
// reset (the peer reads everything, then EOF), and Shutdown must return
// nil once the FIN is acknowledged rather than wait for the peer's.
func TestShutdownHalfClosedPeer(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	const seed, size = 4, 1 << 20
	srv, peer, closeAll := shutdownPair(t)
	l, err := srv.ListenTCP(shutdownAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	wrote, _ := download(t, l, size, seed)
	c, e := dialRaw(t, peer, shutdownAddr)
	if e != nil {
		t.Fatalf("dial: %v", e)
	}
	send := func() tcpip.Error {
		_, e := c.ep.Write(bytes.NewReader(make([]byte, 32<<10)), tcpip.WriteOptions{})
		return e
	}
	if e := send(); e != nil { // unread by the server
		t.Fatalf("peer write: %v", e)
	}
	if w := <-wrote; w.err != nil || w.n != size {
		t.Fatalf("server writer: wrote %d bytes, err %v; want %d", w.n, w.err, size)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(ctx) }()
	r := c.read(0, nil, nil)
	if !isErr[*tcpip.ErrClosedForReceive](r.end) || r.n != size {
		t.Errorf("peer read: got %d bytes then %v, want %d then EOF (the FIN)", r.n, r.end, size)
	}
	checkPrefix(t, r, seed)
	// After the FIN: half-closed, the peer may still send. Shutdown may
	// already be over (the FIN was acknowledged) and the stack closed,
	// its reset (unread data) ending the peer's side: that write fails.
	if e := send(); e != nil && !isErr[*tcpip.ErrClosedForSend](e) && !isErr[*tcpip.ErrConnectionReset](e) {
		t.Errorf("peer write after the FIN: %v", e)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown with a half-closed peer: got %v, want nil", err)
	}
	closeAll()
	goleak.VerifyNone(t, leaks)
}

// TestShutdownIdle: Shutdown of a stack with no connection returns nil at
// once and closes the stack; Close after it returns nil.
func TestShutdownIdle(t *testing.T) {
	srv, _, closeAll := shutdownPair(t)
	l, err := srv.ListenTCP(shutdownAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: got %v, want nil", err)
	}
	if _, err := l.Accept(); err == nil {
		t.Error("Accept after Shutdown: got a connection, want an error")
	}
	if err := srv.Close(); err != nil {
		t.Errorf("Close after Shutdown: got %v, want nil", err)
	}
	closeAll()
}

// isErr reports whether e is a tcpip error of type T.
func isErr[T tcpip.Error](e tcpip.Error) bool {
	_, ok := e.(T)
	return ok
}
