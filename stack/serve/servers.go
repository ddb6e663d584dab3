package serve

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ustack/ustack/internal/rrtrace"
	"github.com/ustack/ustack/stack"
)

// Config bounds what the TCP servers (discard, echo) give one peer, so
// that what a server holds stays bounded whatever peers open, and an idle
// or stalled peer gives its connection slot back. The zero value is the
// defaults.
type Config struct {
	// MaxConns bounds the connections the server handles at once; one
	// more is closed as soon as it is accepted (server_conns_refused).
	// 0: 4096.
	MaxConns int
	// MaxConnsPerSource bounds the connections from one source address
	// (IPv4-mapped IPv6 addresses count as IPv4), as iptables connlimit
	// does with its default masks; one more is closed at once
	// (server_conns_source_refused). 0: DefaultConnsPerSource.
	MaxConnsPerSource int
	// MaxConnsPerPrefix bounds the connections from one /24 (IPv4) or
	// one /64 (IPv6: a host's usual allocation, whose addresses it picks
	// freely), beside the per-address bound, as iptables connlimit with
	// --connlimit-mask 24 and 64; one more is closed at once
	// (server_conns_prefix_refused). 0: twice the per-source bound.
	MaxConnsPerPrefix int
	// IdleTimeout closes a connection whose peer sent nothing for this
	// long: the read deadline, re-armed before every read
	// (server_idle_timeouts). 0: DefaultIdleTimeout; < 0: none.
	IdleTimeout time.Duration
	// WriteTimeout closes an echo connection whose peer took none of its
	// echo for this long: the write deadline of every write
	// (server_write_timeouts). 0: DefaultWriteTimeout; < 0: none.
	WriteTimeout time.Duration
	// EchoMemory is the budget echo connections share for their buffers
	// beyond their first. 0: 256 MiB.
	EchoMemory int
	// EchoConnMemory is the most one echo connection holds in buffers,
	// its share of EchoMemory. 0: DefaultEchoConnMemory.
	EchoConnMemory int
	// SockperfMemory is the budget the sockperf server's TCP connections
	// share for their read buffers, one of 64 KiB each while it has data
	// to look at, a reply to write or a partial message.
	// 0: DefaultSockperfMemory.
	SockperfMemory int
	// Stats, if not nil, gets the server's counters; servers may share
	// one. nil: the server counts for itself only.
	Stats *Stats
}

// The Config defaults, as a server operator would pick them:
//   - 64 connections per source: what one client needs for a parallel
//     test (ustack bench opens up to 64 streams), while 64 sources are
//     needed to take all 4096 slots and one source can take at most half
//     of the echo budget (64 x 2 MiB of 256 MiB).
//   - twice that per /24 or /64 (128): two such clients behind one
//     router, while a peer that owns a /64 (or a /24) gets no more than
//     that with many addresses, holds at most the echo budget, and 32 of
//     them are needed to take all 4096 slots.
//   - 60 s idle and write timeouts: far longer than any pause of a live
//     peer (TCP's own retransmission backoff reaches a minute only after
//     a dozen losses), short enough that a peer that went silent or stops
//     reading gives its slot and buffers back within a minute.
//   - 2 MiB of echo backlog per connection: 32 buffers, more than a
//     client's default socket buffers hold in flight, so that a peer that
//     sends a little before it reads still gets its echo; 128 connections
//     are needed to take the whole budget.
//   - 64 MiB of sockperf read buffers: 1024 connections at once in the
//     middle of a message or its reply, far more than sockperf clients
//     keep there (a message arrives whole within microseconds), a
//     quarter of the 256 MiB that 4096 connections would hold without
//     it; 8 prefixes are needed to take it all.
const (
	DefaultConnsPerSource = 64
	DefaultIdleTimeout    = 60 * time.Second
	DefaultWriteTimeout   = 60 * time.Second
	DefaultEchoConnMemory = 2 << 20
	DefaultSockperfMemory = 64 << 20
)

func (c *Config) maxConns() int { return cmpOr(c.MaxConns, maxServerConns) }
func (c *Config) maxPerSource() int {
	return cmpOr(c.MaxConnsPerSource, DefaultConnsPerSource)
}
func (c *Config) maxPerPrefix() int { return cmpOr(c.MaxConnsPerPrefix, 2*c.maxPerSource()) }
func (c *Config) sockperfMemory() int {
	return cmpOr(c.SockperfMemory, DefaultSockperfMemory)
}
func (c *Config) echoMemory() int     { return cmpOr(c.EchoMemory, echoServerMemory) }
func (c *Config) echoConnMemory() int { return cmpOr(c.EchoConnMemory, DefaultEchoConnMemory) }
func (c *Config) idleTimeout() time.Duration {
	return timeoutOr(c.IdleTimeout, DefaultIdleTimeout)
}
func (c *Config) writeTimeout() time.Duration {
	return timeoutOr(c.WriteTimeout, DefaultWriteTimeout)
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// timeoutOr returns v, def if v is 0, and 0 (none) if v < 0.
func timeoutOr(v, def time.Duration) time.Duration {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// Stats are the servers' counters: discard's, echo's, iperf3's and
// sockperf's. The
// servers given the same Stats (in Config.Stats, IPerf3Config.Stats) count
// into it together, as `ustack run` gives all of its servers one. The zero
// value is ready to use.
type Stats struct {
	connsRefused, sourceRefused, prefixRefused atomic.Uint64
	idleTimeouts, writeTimeouts                atomic.Uint64
	echoReaderWrites, echoWriterWrites         atomic.Uint64
	// bufBytes is the memory the discard, echo and sockperf connections
	// hold in read buffers now (a gauge).
	bufBytes atomic.Int64

	iperf3HellosRejected, iperf3IdleTimeouts, iperf3ConnsDropped atomic.Uint64

	sockperfMessages, sockperfReplies, sockperfWarmups            atomic.Uint64
	sockperfBadConns, sockperfBadDatagrams, sockperfUDPSendErrors atomic.Uint64
	sockperfMessageTimeouts, sockperfBufferWaits                  atomic.Uint64
}

// EachCounter calls fn for every counter, in a fixed order, named as the
// docs/counters.md names them; it is safe to call while the servers
// run.
func (st *Stats) EachCounter(fn func(name string, v uint64)) {
	fn("server_conns_refused", st.connsRefused.Load())
	fn("server_conns_source_refused", st.sourceRefused.Load())
	fn("server_conns_prefix_refused", st.prefixRefused.Load())
	fn("server_idle_timeouts", st.idleTimeouts.Load())
	fn("server_write_timeouts", st.writeTimeouts.Load())
	fn("server_buf_bytes_current", uint64(max(0, st.bufBytes.Load())))
	fn("echo_reader_writes", st.echoReaderWrites.Load())
	fn("echo_writer_writes", st.echoWriterWrites.Load())
	fn("iperf3_udp_hellos_rejected", st.iperf3HellosRejected.Load())
	fn("iperf3_idle_timeouts", st.iperf3IdleTimeouts.Load())
	fn("iperf3_conns_dropped", st.iperf3ConnsDropped.Load())
	fn("sockperf_messages", st.sockperfMessages.Load())
	fn("sockperf_replies", st.sockperfReplies.Load())
	fn("sockperf_warmups", st.sockperfWarmups.Load())
	fn("sockperf_bad_conns", st.sockperfBadConns.Load())
	fn("sockperf_bad_datagrams", st.sockperfBadDatagrams.Load())
	fn("sockperf_message_timeouts", st.sockperfMessageTimeouts.Load())
	fn("sockperf_buffer_waits", st.sockperfBufferWaits.Load())
	fn("sockperf_udp_send_errors", st.sockperfUDPSendErrors.Load())
}

// stats returns c.Stats, or fresh counters if it is nil.
func (c *Config) stats() *Stats {
	if c.Stats != nil {
		return c.Stats
	}
	return new(Stats)
}

// serverBufSize is the read size of the discard server: large enough that
// one Read drains several 64 KB segments from a gVisor receive queue.
const serverBufSize = 256 << 10

// discardBufs are the discard servers' read buffers. A connection takes one
// only once data is there to read, reads without blocking and gives it back
// at once, so the buffers out are about one per running reader, not one per
// connection.
var discardBufs = sync.Pool{New: func() any { return new([serverBufSize]byte) }}

// Discard accepts connections on l and reads and discards everything
// they send (RFC 863), adding the byte count to n if n is not nil, with
// the default Config. It returns when l is closed, after every
// connection handler has finished.
func Discard(l net.Listener, n *atomic.Uint64) error {
	return Config{}.Discard(l, n)
}

// Discard is the package's Discard with c's bounds.
func (c Config) Discard(l net.Listener, n *atomic.Uint64) error {
	st := c.stats()
	return serve(l, &c, st, func(conn net.Conn, quit <-chan struct{}) { discard(conn, n, &c, st, quit) })
}

// discard reads c until an error, counting into n. It holds a read buffer
// only while data is there.
func discard(c net.Conn, n *atomic.Uint64, cfg *Config, st *Stats, quit <-chan struct{}) {
	r := newServerReader(c, cfg, st, quit)
	defer r.close()
	for {
		if err := r.wait(); err != nil {
			return
		}
		buf := discardBufs.Get().(*[serverBufSize]byte)
		st.bufBytes.Add(serverBufSize)
		m, err := r.read(buf[:])
		st.bufBytes.Add(-serverBufSize)
		discardBufs.Put(buf)
		if n != nil && m > 0 {
			n.Add(uint64(m))
		}
		if err != nil {
			return
		}
	}
}

// DiscardViews is Discard reading with stack.TCPConn.ReadViews: the
// payload is looked at in place (each view's first byte is touched) and
// released, never copied when the stack runs with zero copy.
func DiscardViews(l net.Listener, n *atomic.Uint64) error {
	return Config{}.DiscardViews(l, n)
}

// DiscardViews is the package's DiscardViews with c's bounds.
func (c Config) DiscardViews(l net.Listener, n *atomic.Uint64) error {
	st := c.stats()
	return serve(l, &c, st, func(conn net.Conn, quit <-chan struct{}) {
		tc, ok := conn.(*stack.TCPConn)
		if !ok {
			discard(conn, n, &c, st, quit)
			return
		}
		r := newServerReader(conn, &c, st, quit)
		defer r.close()
		var vs []stack.View
		var sink byte
		for {
			if err := r.wait(); err != nil {
				return
			}
			if vs == nil {
				vs = make([]stack.View, 0, 256)
			}
			var m int
			var err error
			vs, m, err = tc.ReadViews(vs[:0], serverBufSize)
			for i := range vs {
				sink ^= vs[i].Bytes()[0]
				vs[i].Release()
			}
			if n != nil && m > 0 {
				n.Add(uint64(m))
			}
			if err != nil {
				discardSink.Store(uint32(sink))
				return
			}
		}
	})
}

// discardSink keeps the touched bytes alive for the compiler.
var discardSink atomic.Uint32

// errServerIdle ends a connection whose peer sent nothing for the idle
// timeout.
var errServerIdle = errors.New("serve: connection idle")

// errServerCap ends a connection at its reader's cap.
var errServerCap = errors.New("serve: connection past its deadline")

// serverReader reads a server's connection. For the stack's own
// connections (*stack.TCPConn) it waits until the connection is readable
// before the caller takes a buffer, and then reads what is there without
// blocking, so that a connection whose peer sends nothing holds no buffer.
// Other connections are read with a blocking Read under a read deadline.
type serverReader struct {
	c    net.Conn
	tc   *stack.TCPConn // nil: not the stack's
	idle time.Duration
	st   *Stats
	quit <-chan struct{} // closed when the server shuts down
	// cap, if not zero, is a time no wait or read goes past, however
	// the peer trickles (unlike the idle timeout, which each read
	// re-arms): past it they return errServerCap, which the caller
	// counts. The reading goroutine sets it between reads.
	cap         time.Time
	capDeadline bool // c's read deadline is the cap's (c not the stack's)

	stop       chan struct{} // closed by abort
	stopOnce   sync.Once
	ready      <-chan struct{}
	stopNotify func()
	timer      *time.Timer
}

func newServerReader(c net.Conn, cfg *Config, st *Stats, quit <-chan struct{}) *serverReader {
	r := &serverReader{c: c, idle: cfg.idleTimeout(), st: st, quit: quit, stop: make(chan struct{})}
	if tc, ok := c.(*stack.TCPConn); ok {
		r.tc = tc
		r.ready, r.stopNotify = tc.NotifyReadable()
	}
	return r
}

// close unregisters the reader; call it once reads have stopped.
func (r *serverReader) close() {
	if r.tc != nil {
		r.stopNotify()
	}
	if r.timer != nil {
		r.timer.Stop()
	}
}

// abort makes a wait return an error, from any goroutine.
func (r *serverReader) abort() { r.stopOnce.Do(func() { close(r.stop) }) }

// wait waits until the connection has data (or its end, or an error) to
// read. It returns errServerIdle, counted, once the peer sent nothing for
// the idle timeout, errServerCap once the cap is past (data there or
// not), and net.ErrClosed after abort or the server's shutdown.
func (r *serverReader) wait() error {
	if r.tc == nil {
		return nil // read blocks, under a deadline
	}
	capped := !r.cap.IsZero()
	if capped && !time.Now().Before(r.cap) {
		return errServerCap
	}
	var expired <-chan time.Time
	// With the stack's busy reads the wait spins first (BusyPoll), as
	// epoll_wait does with busy polling.
	for !r.tc.BusyPoll() {
		if (r.idle > 0 || capped) && expired == nil {
			d := r.idle
			if capped {
				if until := time.Until(r.cap); d <= 0 || until < d {
					d = until
				} else {
					capped = false // the idle timeout comes first
				}
			}
			if r.timer == nil {
				r.timer = time.NewTimer(d)
			} else {
				r.timer.Reset(d)
			}
			expired = r.timer.C
		}
		select {
		case <-r.ready:
		case <-expired:
			if capped {
				return errServerCap
			}
			if r.tc.Readable() {
				return nil
			}
			r.st.idleTimeouts.Add(1)
			return errServerIdle
		case <-r.stop:
			return net.ErrClosed
		case <-r.quit:
			return net.ErrClosed
		}
	}
	if expired != nil {
		r.timer.Stop() // Go 1.23 timers: no stale value to drain
	}
	return nil
}

// read reads into buf: what is there without blocking for the stack's
// connections (after wait; (0, nil) if nothing is), else a Read under the
// idle deadline or the cap, whichever comes first (errServerCap at the
// cap). The end of the stream is io.EOF.
func (r *serverReader) read(buf []byte) (int, error) {
	if r.tc == nil {
		var dl time.Time
		if r.idle > 0 {
			dl = time.Now().Add(r.idle)
		}
		capped := !r.cap.IsZero() && (dl.IsZero() || r.cap.Before(dl))
		if capped {
			dl = r.cap
		}
		if !dl.IsZero() || r.capDeadline {
			r.c.SetReadDeadline(dl) // the zero time clears the cap's
		}
		r.capDeadline = capped
		n, err := r.c.Read(buf)
		if isTimeoutErr(err) {
			if capped {
				return n, errServerCap
			}
			r.st.idleTimeouts.Add(1)
		}
		return n, err
	}
	return r.tc.TryRead(buf)
}

func isTimeoutErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Echo accepts connections on l and writes back everything they send
// (RFC 862), with the default Config. It returns when l is closed,
// after every handler has finished.
//
// Each connection reads and writes concurrently through buffers of its
// own, so that it keeps reading while its writes wait on a slow peer;
// when nothing waits to be written, the reading goroutine writes what it
// read itself, as much as the send buffer takes at once
// (echo_reader_writes), so that request/response takes no hand-off. (A
// plain io.Copy(c, c) works too over ustack's own link endpoint: gVisor,
// unlike Linux, drops the acknowledgement of a segment that meets a closed
// receive window, and the endpoint hands it to gVisor first as a pure ACK,
// rx_tcp_zero_window_acks. The buffers remain for throughput, and for
// stacks made by NewWithEndpoint, where that does not happen.) A connection takes a buffer only
// once data is there to read and gives it back once written: an idle one
// holds none. Its first buffer is its own; the ones beyond it come from a
// budget of EchoMemory bytes shared by the server's connections, at most
// EchoConnMemory per connection, so that a few peers that send without
// reading can neither make the server hold more than that nor take the
// whole budget, and WriteTimeout closes them.
func Echo(l net.Listener) error {
	return Config{}.Echo(l)
}

// Echo is the package's Echo with c's bounds.
func (c Config) Echo(l net.Listener) error {
	return newEchoServer(&c, c.stats()).serve(l)
}

const (
	echoBufSize      = 64 << 10
	echoServerMemory = 256 << 20
)

var echoBufs = sync.Pool{New: func() any { return new([echoBufSize]byte) }}

// budget is memory that a server's connections share, in tokens of one
// buffer each: a connection takes a token before it takes a buffer the
// budget covers and gives it back after the buffer, so that what they hold
// is at most cap(b) buffers (len(b) now). Safe for concurrent use.
type budget chan struct{}

// newBudget returns a budget of bytes in buffers of bufSize, and at least
// min buffers.
func newBudget(bytes, bufSize, min int) budget {
	return make(budget, max(min, bytes/bufSize))
}

// tryTake takes a token if one is free, without waiting.
func (b budget) tryTake() bool {
	select {
	case b <- struct{}{}:
		return true
	default:
		return false
	}
}

// take waits for a token; it returns false, holding none, if stop or quit
// is closed first.
func (b budget) take(stop, quit <-chan struct{}) bool {
	select {
	case b <- struct{}{}:
		return true
	case <-stop:
	case <-quit:
	}
	return false
}

// give gives back a token taken by tryTake or take.
func (b budget) give() { <-b }

// echoServer is Echo's state: budget holds a token for each buffer
// its connections hold beyond their first.
type echoServer struct {
	cfg    Config
	st     *Stats
	budget budget
	share  int // buffers one connection may hold
}

func newEchoServer(cfg *Config, st *Stats) *echoServer {
	return &echoServer{
		cfg:    *cfg,
		st:     st,
		budget: newBudget(cfg.echoMemory(), echoBufSize, 0),
		share:  max(2, cfg.echoConnMemory()/echoBufSize),
	}
}

func (e *echoServer) serve(l net.Listener) error {
	return serve(l, &e.cfg, e.st, e.echo)
}

// echoConn is one echo connection's share: held buffers, of which tokens
// (held-1, or 0) carry a budget token, and of which free wait for the
// reader while the writer is busy.
type echoConn struct {
	mu sync.Mutex
	// +checklocks:mu
	held int
	// +checklocks:mu
	tokens int
	// +checklocks:mu
	free  []*[echoBufSize]byte
	freed chan struct{}
}

// echo copies c to itself: a reader goroutine takes a buffer once data is
// there and fills it, this one writes the buffers back in order and
// releases them. When nothing is queued for this one, the reader writes
// what it read itself, as much as the send buffer takes at once
// (TryWrite), and queues only the rest: a request and its echo take no
// hand-off between goroutines.
func (e *echoServer) echo(c net.Conn, quit <-chan struct{}) {
	r := newServerReader(c, &e.cfg, e.st, quit)
	defer r.close()
	ec := &echoConn{freed: make(chan struct{}, 1)}
	full := make(chan echoChunk, e.share)
	var inflight atomic.Int32 // chunks sent to the writer and not yet written
	go func() {
		defer close(full)
		for {
			if err := r.wait(); err != nil {
				return
			}
			buf := e.take(ec, r)
			if buf == nil {
				return
			}
			m, err := r.read(buf[:])
			off := 0
			if m > 0 {
				rrtrace.Mark(rrtrace.AppRead)
				// Nothing queued for the writer: write it here, as a
				// C echo writes what it read, without waking the
				// writer; what the send buffer does not take now
				// goes to the writer, so that reading goes on.
				if r.tc != nil && inflight.Load() == 0 {
					rrtrace.Mark(rrtrace.AppWrite)
					n, werr := r.tc.TryWrite(buf[:m])
					if werr != nil {
						e.release(ec, buf, false)
						r.abort()
						c.Close()
						return
					}
					off = n
					if n > 0 {
						e.st.echoReaderWrites.Add(1)
					}
				}
			}
			if off < m {
				e.st.echoWriterWrites.Add(1)
				inflight.Add(1)
				full <- echoChunk{buf, off, m}
			} else {
				e.release(ec, buf, false)
			}
			if err != nil {
				return
			}
		}
	}()
	wt := e.cfg.writeTimeout()
	failed := false
	for ch := range full {
		if !failed {
			if wt > 0 {
				c.SetWriteDeadline(time.Now().Add(wt))
			}
			rrtrace.Mark(rrtrace.AppWrite)
			if _, err := c.Write(ch.buf[ch.off:ch.n]); err != nil {
				failed = true
				if isTimeoutErr(err) {
					e.st.writeTimeouts.Add(1)
				}
				r.abort() // stops the reader
				c.Close()
			} else if wt > 0 {
				// The reader's TryWrite does not wait: no deadline
				// of this write may fail it later.
				c.SetWriteDeadline(time.Time{})
			}
		}
		e.release(ec, ch.buf, len(full) > 0)
		inflight.Add(-1)
	}
}

// echoChunk is a filled buffer on its way to the writer.
type echoChunk struct {
	buf    *[echoBufSize]byte
	off, n int // what is left to write: buf[off:n]
}

// take returns a buffer for ec's reader: its first without a token, one
// more with a budget token while it holds fewer than its share and the
// budget has room; else it waits for the writer to release one. It returns
// nil if the reader was stopped meanwhile.
func (e *echoServer) take(ec *echoConn, r *serverReader) *[echoBufSize]byte {
	for {
		ec.mu.Lock()
		if n := len(ec.free); n > 0 {
			buf := ec.free[n-1]
			ec.free = ec.free[:n-1]
			ec.mu.Unlock()
			return buf
		}
		ok := ec.held == 0
		if !ok && ec.held < e.share && e.budget.tryTake() {
			ec.tokens++
			ok = true
		}
		if ok {
			ec.held++
		}
		ec.mu.Unlock()
		if ok {
			e.st.bufBytes.Add(echoBufSize)
			return echoBufs.Get().(*[echoBufSize]byte)
		}
		select {
		case <-ec.freed:
		case <-r.stop:
			return nil
		case <-r.quit:
			return nil
		}
	}
}

// release gives buf back. While busy (more is waiting to be written) the
// connection keeps it for its reader, token and all, as a socket keeps
// its memory while it has data queued; otherwise it gives it and every
// buffer its reader did not take back, with their budget tokens, so that
// an idle connection holds none. It wakes a waiting take.
func (e *echoServer) release(ec *echoConn, buf *[echoBufSize]byte, busy bool) {
	ec.mu.Lock()
	if busy {
		ec.free = append(ec.free, buf)
		ec.mu.Unlock()
	} else {
		n := 1 + len(ec.free)
		ec.held -= n
		for ec.tokens > max(0, ec.held-1) {
			ec.tokens--
			e.budget.give()
		}
		for _, b := range ec.free {
			echoBufs.Put(b)
		}
		ec.free = ec.free[:0]
		ec.mu.Unlock()
		e.st.bufBytes.Add(-int64(n) * echoBufSize)
		echoBufs.Put(buf)
	}
	select {
	case ec.freed <- struct{}{}:
	default:
	}
}

// maxServerConns is Config.MaxConns's default. With it, what a
// server holds in buffers is bounded whatever a peer opens: a read buffer
// per running reader for discard, echoBufSize per connection with data
// plus EchoMemory for echo, SockperfMemory for sockperf.
const maxServerConns = 4096

// serve accepts connections on l and runs handle on each, within cfg's
// connection limits, until l is closed. handle gets quit, closed when the
// server shuts down (each connection is also closed then).
func serve(l net.Listener, cfg *Config, st *Stats, handle func(c net.Conn, quit <-chan struct{})) error {
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		conns     = map[net.Conn]struct{}{}
		perSource = map[netip.Addr]int{}
		perPrefix = map[netip.Prefix]int{}
		quit      = make(chan struct{})
	)
	maxConns, maxPerSource, maxPerPrefix := cfg.maxConns(), cfg.maxPerSource(), cfg.maxPerPrefix()
	defer func() {
		close(quit)
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		src := sourceOf(c)
		pfx := prefixOf(src)
		mu.Lock()
		full := len(conns) >= maxConns
		srcFull := !full && src.IsValid() && perSource[src] >= maxPerSource
		pfxFull := !full && !srcFull && src.IsValid() && perPrefix[pfx] >= maxPerPrefix
		if !full && !srcFull && !pfxFull {
			conns[c] = struct{}{}
			if src.IsValid() {
				perSource[src]++
				perPrefix[pfx]++
			}
		}
		mu.Unlock()
		if full || srcFull || pfxFull {
			c.Close()
			switch {
			case full:
				st.connsRefused.Add(1)
			case srcFull:
				st.sourceRefused.Add(1)
			default:
				st.prefixRefused.Add(1)
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			handle(c, quit)
			// The slot is free before the peer sees the close, so that
			// it can connect again at once.
			mu.Lock()
			delete(conns, c)
			if src.IsValid() {
				if perSource[src]--; perSource[src] == 0 {
					delete(perSource, src)
				}
				if perPrefix[pfx]--; perPrefix[pfx] == 0 {
					delete(perPrefix, pfx)
				}
			}
			mu.Unlock()
			c.Close()
		}()
	}
}

// sourceOf returns the address c comes from (unmapped), or the zero Addr
// if it is not a TCP address.
func sourceOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// prefixOf returns the prefix that MaxConnsPerPrefix bounds for src (from
// sourceOf): its /24 if IPv4, its /64 if IPv6; the zero Prefix if src is
// not valid.
func prefixOf(src netip.Addr) netip.Prefix {
	bits := 64
	if src.Is4() {
		bits = 24
	}
	p, _ := src.Prefix(bits) // no error: bits is in range, and src unmapped
	return p
}

// UDPDiscard reads datagrams from c until it is closed, counting
// datagrams and bytes if the counters are not nil.
func UDPDiscard(c net.PacketConn, datagrams, bytes *atomic.Uint64) error {
	buf := make([]byte, 65536)
	for {
		m, _, err := c.ReadFrom(buf)
		if err != nil {
			return ignoreClosed(err)
		}
		if datagrams != nil {
			datagrams.Add(1)
			bytes.Add(uint64(m))
		}
	}
}

// UDPEcho sends every datagram read from c back to where it came from,
// until c is closed.
func UDPEcho(c net.PacketConn) error {
	buf := make([]byte, 65536)
	for {
		m, from, err := c.ReadFrom(buf)
		if err != nil {
			return ignoreClosed(err)
		}
		if _, err := c.WriteTo(buf[:m], from); err != nil && errors.Is(err, net.ErrClosed) {
			return nil
		}
	}
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
