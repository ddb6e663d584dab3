package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/ustack/ustack/stack"
)

// The iperf3 protocol, as iperf3 (esnet/iperf: src/iperf_api.c,
// iperf_server_api.c, iperf_tcp.c, iperf_udp.c) speaks it. A test is one
// control connection and N stream connections, all to the server's port:
//
//	client                                        server
//	TCP connect, cookie (37 bytes) ------------->
//	                        <------------------- PARAM_EXCHANGE
//	length (4 bytes, big-endian) + JSON -------->  parameters
//	                        <------------------- CREATE_STREAMS
//	per stream: TCP connect + cookie, or a UDP
//	datagram of 4 bytes answered with 4 bytes
//	                        <------------------- TEST_START, TEST_RUNNING
//	data on the streams, either way (-R: the server sends)
//	TEST_END ----------------------------------->
//	                        <------------------- EXCHANGE_RESULTS
//	length + JSON results ---------------------->
//	                        <------------------- length + JSON results
//	                        <------------------- DISPLAY_RESULTS
//	IPERF_DONE --------------------------------->
//
// Control messages are single signed bytes. A UDP datagram starts with the
// sender's time (seconds and microseconds, 32 bits each, big-endian) and a
// sequence number counting from 1 (32 bits, or 64 with the
// "udp_counters_64bit" parameter), from which the receiver counts lost and
// out-of-order datagrams and the jitter (RFC 1889 section 6.3.1).
const (
	iperf3TestStart       = 1
	iperf3TestRunning     = 2
	iperf3TestEnd         = 4
	iperf3ParamExchange   = 9
	iperf3CreateStreams   = 10
	iperf3ServerTerminate = 11
	iperf3ClientTerminate = 12
	iperf3ExchangeResults = 13
	iperf3DisplayResults  = 14
	iperf3Done            = 16
	iperf3AccessDenied    = -1
	iperf3ServerError     = -2

	// iperf3CookieSize is the cookie's length: 36 random characters and
	// a NUL (COOKIE_SIZE).
	iperf3CookieSize = 37
	// Limits iperf3 itself sets (MAX_STREAMS, MAX_BLOCKSIZE,
	// MAX_UDP_BLOCKSIZE, MAX_TIME) and its default block sizes.
	iperf3MaxStreams      = 128
	iperf3MaxTCPBlock     = 1 << 20
	iperf3MaxUDPBlock     = 65507
	iperf3MaxTime         = 86400
	iperf3DefaultTCPBlock = 128 << 10
	iperf3DefaultUDPBlock = 1460
	// iperf3MaxJSON bounds a JSON message from a client.
	iperf3MaxJSON = 1 << 20
	// iperf3UDPBuffer is the UDP socket's receive buffer: a few
	// milliseconds of a fast UDP test, so that a reader that is
	// descheduled briefly loses nothing (gVisor caps it at its maximum).
	iperf3UDPBuffer = 4 << 20
)

// iperf3 error numbers (i_errno, iperf_api.h) the server sends after
// SERVER_ERROR; the client prints its message for them.
const (
	iperf3ErrDuration      = 5   // IEDURATION
	iperf3ErrNumStreams    = 6   // IENUMSTREAMS
	iperf3ErrBlockSize     = 7   // IEBLOCKSIZE
	iperf3ErrOmit          = 12  // IEOMIT
	iperf3ErrUnimplemented = 13  // IEUNIMP
	iperf3ErrNoSCTP        = 18  // IENOSCTP
	iperf3ErrUDPBlockSize  = 20  // IEUDPBLOCKSIZE
	iperf3ErrReverseBidir  = 25  // IEREVERSEBIDIR
	iperf3ErrMaxDuration   = 37  // IEMAXSERVERTESTDURATIONEXCEEDED
	iperf3ErrRecvParams    = 114 // IERECVPARAMS
	iperf3ErrStreamListen  = 202 // IESTREAMLISTEN
)

// The UDP stream handshake: the client sends UDP_CONNECT_MSG, the server
// answers UDP_CONNECT_REPLY, both as 32-bit integers in the client's byte
// order (iperf3 does not convert them). Clients before 3.11 use the legacy
// pair.
const (
	iperf3UDPConnectMsg         = 0x36373839
	iperf3UDPConnectReply       = 0x39383736
	iperf3LegacyUDPConnectMsg   = 123456789
	iperf3LegacyUDPConnectReply = 987654321
)

// IPerf3Config configures an iperf3 server. The zero value is usable.
type IPerf3Config struct {
	// OnTest, if set, is called with the result of every test the server
	// ran, completed or not, once the test's connections are closed and
	// its goroutines have ended. It runs on a goroutine of the server
	// (Serve waits for it); another test may start meanwhile.
	OnTest func(IPerf3Result)
	// StepTimeout bounds every wait outside the running phase: the
	// cookie, the parameters, the stream connections, the client's
	// results and its IPERF_DONE, and every write on the control
	// connection. Default 10s.
	StepTimeout time.Duration
	// MaxDuration bounds a test's running phase: a timed test (-t) whose
	// -t and -O add up to more is refused (iperf3's --server-max-duration,
	// IEMAXSERVERTESTDURATIONEXCEEDED); one without a time limit (-n or
	// -k) is ended there. A timed test is ended StepTimeout after its -t
	// and -O have passed, as iperf3's server does. Default
	// DefaultIPerf3MaxDuration.
	MaxDuration time.Duration
	// MaxRate caps what the server sends in a test (-R, --bidir), in bits
	// per second over all its sending streams: each is paced at most at
	// its part of it, whatever -b asked (-b 0 too). 0:
	// DefaultIPerf3MaxRate; < 0: no cap.
	MaxRate float64
	// IdleTimeout ends a running test in which no stream moved a byte
	// for this long (iperf3_idle_timeouts), so that a client that went
	// silent gives the server's one test slot back. 0:
	// DefaultIPerf3IdleTimeout; < 0: none.
	IdleTimeout time.Duration
	// Stats, if not nil, gets the server's counters (iperf3_*); it may be
	// shared with other servers. nil: the server counts for itself only.
	Stats *Stats
}

// The IPerf3Config defaults, as a server operator would pick them. The
// server runs one test at a time, so MaxDuration is how long one client
// can keep everyone else out: 10 minutes is far more than a measurement
// needs (iperf3's default test is 10 s). 10 Gbit/s is above what ustack's
// sender reaches on the test machines, so it caps no measurement there,
// yet bounds what a client can make the server send (UDP is sent only to
// the control connection's own address). The idle timeout is that of the
// discard and echo servers: a minute without a byte is no measurement.
const (
	DefaultIPerf3MaxDuration = 10 * time.Minute
	DefaultIPerf3MaxRate     = 10e9
	DefaultIPerf3IdleTimeout = time.Minute
)

func (c *IPerf3Config) stepTimeout() time.Duration {
	if c.StepTimeout > 0 {
		return c.StepTimeout
	}
	return 10 * time.Second
}

func (c *IPerf3Config) maxDuration() time.Duration {
	if c.MaxDuration > 0 {
		return c.MaxDuration
	}
	return DefaultIPerf3MaxDuration
}

// maxRate returns the cap on what the server sends, 0 for none.
func (c *IPerf3Config) maxRate() float64 {
	switch {
	case c.MaxRate == 0:
		return DefaultIPerf3MaxRate
	case c.MaxRate < 0:
		return 0
	}
	return c.MaxRate
}

func (c *IPerf3Config) idleTimeout() time.Duration {
	return timeoutOr(c.IdleTimeout, DefaultIPerf3IdleTimeout)
}

// IPerf3Result is what the server saw of one test. Byte and packet counts
// leave out the omitted seconds (-O), as iperf3 does.
type IPerf3Result struct {
	// Client is the address of the client's control connection.
	Client netip.AddrPort
	// Protocol is "tcp" or "udp" (empty if the test ended before its
	// parameters arrived).
	Protocol string
	// Streams is the number of parallel streams (-P), in each direction.
	Streams int
	// Reverse (-R): the server sent. Bidir (--bidir): both sent.
	Reverse, Bidir bool
	// Duration is the measured time: from the start of the test (after
	// the omitted seconds) to TEST_END, or to the end of an aborted test.
	Duration time.Duration
	// BytesReceived and BytesSent are the server's payload bytes over
	// all streams.
	BytesReceived, BytesSent uint64
	// Packets, Lost and OutOfOrder count the UDP datagrams of the streams
	// the server received on: expected (the highest sequence number),
	// missing, and arrived out of order. Jitter is their mean jitter.
	Packets, Lost, OutOfOrder uint64
	Jitter                    time.Duration
	// Retransmits counts the TCP segments the server retransmitted on
	// the streams it sent on.
	Retransmits uint64
	// ClientBytes is the byte count the client reported in the results
	// exchange, over all its streams (sent and received; 0 before it).
	ClientBytes uint64
	// Err is nil if the test ran through to IPERF_DONE, else why it ended.
	Err error
}

// ReceivedBitsPerSecond is BytesReceived over Duration in bits per second.
func (r IPerf3Result) ReceivedBitsPerSecond() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.BytesReceived) * 8 / r.Duration.Seconds()
}

// SentBitsPerSecond is BytesSent over Duration in bits per second.
func (r IPerf3Result) SentBitsPerSecond() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.BytesSent) * 8 / r.Duration.Seconds()
}

// Errors a test can end with (in IPerf3Result.Err).
var (
	// ErrIPerf3ClientTerminated: the client sent CLIENT_TERMINATE.
	ErrIPerf3ClientTerminated = errors.New("iperf3: client terminated the test")
	// ErrIPerf3ServerClosed: the server was closed during the test; the
	// client got SERVER_TERMINATE.
	ErrIPerf3ServerClosed = errors.New("iperf3: server closed")
	// ErrIPerf3TimeLimit: the test ran past its time limit.
	ErrIPerf3TimeLimit = errors.New("iperf3: test ran past its time limit")
	// ErrIPerf3Idle: no stream moved a byte for IdleTimeout; the client
	// got SERVER_TERMINATE.
	ErrIPerf3Idle = errors.New("iperf3: test idle")
)

// IPerf3Server serves the iperf3 protocol (the server side of `iperf3 -s`)
// over a stack.Stack's own TCP and UDP sockets, so that an unmodified iperf3
// client measures the stack. It runs one test at a time: a client that
// connects during a test gets ACCESS_DENIED, as from iperf3.
//
// Supported: TCP and UDP, -P, -R, --bidir, -t, -n, -k, -O, -b (per stream,
// paced in both protocols when the server sends), -l, 64-bit UDP counters.
// Accepted and ignored: -w, -M, -N, -C, -S, --fq-rate, --zerocopy and the
// like, which set options on the client's sockets or need socket options
// the stack's sockets do not have. Refused with SERVER_ERROR: SCTP,
// authentication. The retransmits of a TCP stream the server sends on are
// its gVisor endpoint's.
type IPerf3Server struct {
	st    *stack.Stack
	addr  netip.AddrPort
	cfg   IPerf3Config
	l     net.Listener
	stats *Stats

	ctx       context.Context // done when the server closes
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup // every goroutine Serve started

	// pending holds a token for every connection being handed to a
	// running test or refused (joinTCP, deny): with it, the goroutines of
	// a test are bounded whatever a client opens.
	pending chan struct{}

	mu sync.Mutex
	// +checklocks:mu
	cur *iperf3Test
}

// iperf3MaxPending bounds the connections a server reads a cookie from or
// refuses at once: every stream of the largest test (--bidir -P 128) and
// some to spare for the refused. One more is closed at once
// (iperf3_conns_dropped).
const iperf3MaxPending = 2*iperf3MaxStreams + 16

// ListenIPerf3 listens on addr of s (TCP; UDP tests open the same port on
// UDP while they run) for iperf3 clients. Call Serve to serve them. An
// unspecified address serves every address of the stack's family, as
// stack.Stack.ListenTCP does.
func ListenIPerf3(s *stack.Stack, addr netip.AddrPort, cfg IPerf3Config) (*IPerf3Server, error) {
	l, err := s.ListenTCP(addr)
	if err != nil {
		return nil, fmt.Errorf("iperf3: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stats := cfg.Stats
	if stats == nil {
		stats = new(Stats)
	}
	return &IPerf3Server{st: s, addr: addr, cfg: cfg, l: l, stats: stats, ctx: ctx, cancel: cancel, pending: make(chan struct{}, iperf3MaxPending)}, nil
}

// IPerf3 listens on addr of s and serves iperf3 clients until ctx is done.
// It returns nil then, once every connection is closed and every goroutine
// it started has ended; a test running at that moment ends with
// SERVER_TERMINATE to its client.
func IPerf3(ctx context.Context, s *stack.Stack, addr netip.AddrPort, cfg IPerf3Config) error {
	srv, err := ListenIPerf3(s, addr, cfg)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	return srv.Serve()
}

// Addr is the listening address.
func (srv *IPerf3Server) Addr() net.Addr { return srv.l.Addr() }

// Close stops the server: no more connections are accepted, and a running
// test ends with SERVER_TERMINATE to its client. Serve returns once
// everything has ended. Close is idempotent.
func (srv *IPerf3Server) Close() error {
	var err error
	srv.closeOnce.Do(func() {
		srv.cancel()
		err = srv.l.Close()
	})
	return err
}

// Serve accepts and serves clients until Close. It returns nil after
// Close, once every connection is closed and every goroutine it started
// has ended, or an accept error (after closing the server the same way).
func (srv *IPerf3Server) Serve() error {
	defer srv.wg.Wait()
	defer srv.Close()
	for {
		c, err := srv.l.Accept()
		if err != nil {
			select {
			case <-srv.ctx.Done():
				return nil
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("iperf3: accept: %w", err)
		}
		srv.dispatch(c)
	}
}

// dispatch hands a new connection to its handler: a new test when the
// server is idle, the running test while it waits for its TCP streams,
// ACCESS_DENIED otherwise (iperf_accept).
func (srv *IPerf3Server) dispatch(c net.Conn) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	t := srv.cur
	switch {
	case t == nil:
		t = newIPerf3Test(srv, c)
		srv.cur = t
		srv.wg.Add(1)
		go func() {
			defer srv.wg.Done()
			res := t.run()
			srv.mu.Lock()
			srv.cur = nil
			srv.mu.Unlock()
			if srv.cfg.OnTest != nil {
				srv.cfg.OnTest(res)
			}
		}()
	case t.state.Load() == iperf3CreateStreams && !t.set.udp:
		seq := t.accepts
		t.accepts++
		srv.goPending(c, func() { t.joinTCP(c, seq) })
	default:
		srv.goPending(c, func() { srv.deny(c) })
	}
}

// goPending runs fn for c on a goroutine of its own if fewer than
// iperf3MaxPending run, else closes c at once.
func (srv *IPerf3Server) goPending(c net.Conn, fn func()) {
	select {
	case srv.pending <- struct{}{}:
	default:
		c.Close()
		srv.stats.iperf3ConnsDropped.Add(1)
		return
	}
	srv.wg.Add(1)
	go func() {
		defer srv.wg.Done()
		defer func() { <-srv.pending }()
		fn()
	}()
}

// deny sends ACCESS_DENIED on c and closes it. What the client sent (its
// cookie) is read and dropped first, for at most StepTimeout or until the
// server closes, so that the close is an orderly one rather than a reset
// that could overtake the message.
func (srv *IPerf3Server) deny(c net.Conn) {
	defer context.AfterFunc(srv.ctx, func() { c.Close() })()
	c.SetDeadline(time.Now().Add(srv.cfg.stepTimeout()))
	c.Write([]byte{0xff}) // ACCESS_DENIED (-1)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		io.Copy(io.Discard, io.LimitReader(c, 1<<20))
	}
	c.Close()
}

// iperf3Params are the parameters a client sends (send_parameters). Numbers
// are JSON numbers; they are read as float64 and checked.
type iperf3Params struct {
	TCP           bool    `json:"tcp"`
	UDP           bool    `json:"udp"`
	SCTP          bool    `json:"sctp"`
	Omit          float64 `json:"omit"`
	Time          float64 `json:"time"`
	Num           float64 `json:"num"`
	BlockCount    float64 `json:"blockcount"`
	Parallel      float64 `json:"parallel"`
	Reverse       bool    `json:"reverse"`
	Bidirectional bool    `json:"bidirectional"`
	Len           float64 `json:"len"`
	Bandwidth     float64 `json:"bandwidth"`
	Counters64    float64 `json:"udp_counters_64bit"`
	AuthToken     string  `json:"authtoken"`
}

// iperf3Settings are a test's checked parameters.
type iperf3Settings struct {
	udp           bool
	streams       int // per direction
	reverse       bool
	bidir         bool
	blksize       int
	rate          float64 // bits per second per sending stream; 0: unlimited
	dur, omit     time.Duration
	bytes, blocks uint64 // end conditions of the sender (0: none)
	counters64    bool
}

// settings checks p and returns the test's settings, or the iperf3 error
// number to send the client and an error.
func (p *iperf3Params) settings(cfg *IPerf3Config) (iperf3Settings, int32, error) {
	var s iperf3Settings
	bad := func(code int32, format string, args ...any) (iperf3Settings, int32, error) {
		return iperf3Settings{}, code, fmt.Errorf("iperf3: "+format, args...)
	}
	switch {
	case p.SCTP:
		return bad(iperf3ErrNoSCTP, "SCTP is not supported")
	case p.AuthToken != "":
		return bad(iperf3ErrUnimplemented, "authentication is not supported")
	case p.Reverse && p.Bidirectional:
		return bad(iperf3ErrReverseBidir, "both reverse and bidirectional")
	case p.Parallel < 0 || p.Parallel > iperf3MaxStreams:
		return bad(iperf3ErrNumStreams, "%v parallel streams", p.Parallel)
	case p.Time < 0 || p.Time > iperf3MaxTime:
		return bad(iperf3ErrDuration, "time %v", p.Time)
	case p.Omit < 0 || p.Omit > iperf3MaxTime:
		return bad(iperf3ErrOmit, "omit %v", p.Omit)
	case p.Num < 0 || p.BlockCount < 0 || p.Bandwidth < 0 || p.Len < 0:
		return bad(iperf3ErrRecvParams, "negative parameter")
	case p.Time > 0 && time.Duration((p.Time+p.Omit)*float64(time.Second)) > cfg.maxDuration():
		return bad(iperf3ErrMaxDuration, "time %v and omit %v: more than the server's maximum of %v", p.Time, p.Omit, cfg.maxDuration())
	}
	s.udp = p.UDP && !p.TCP
	s.streams = max(1, int(p.Parallel))
	s.reverse, s.bidir = p.Reverse, p.Bidirectional
	s.dur = time.Duration(p.Time * float64(time.Second))
	s.omit = time.Duration(p.Omit * float64(time.Second))
	s.bytes, s.blocks = uint64(p.Num), uint64(p.BlockCount)
	s.rate = p.Bandwidth
	if limit := cfg.maxRate(); limit > 0 && (s.rate == 0 || s.rate > limit/float64(s.streams)) {
		// Every sending stream gets its part of the cap (-P streams
		// send, with -R and with --bidir alike).
		s.rate = limit / float64(s.streams)
	}
	s.counters64 = p.Counters64 != 0
	s.blksize = int(p.Len)
	if s.udp {
		if s.blksize == 0 {
			s.blksize = iperf3DefaultUDPBlock
		}
		if s.blksize < s.udpHeader() || s.blksize > iperf3MaxUDPBlock {
			return bad(iperf3ErrUDPBlockSize, "UDP block size %d", s.blksize)
		}
	} else {
		if s.blksize == 0 {
			s.blksize = iperf3DefaultTCPBlock
		}
		if s.blksize > iperf3MaxTCPBlock {
			return bad(iperf3ErrBlockSize, "TCP block size %d", s.blksize)
		}
	}
	return s, 0, nil
}

// udpHeader is the size of a UDP datagram's time and sequence header.
func (s *iperf3Settings) udpHeader() int {
	if s.counters64 {
		return 16
	}
	return 12
}

// total is the number of streams of the test.
func (s *iperf3Settings) total() int {
	if s.bidir {
		return 2 * s.streams
	}
	return s.streams
}

// sender reports whether the server sends on the i-th stream to connect.
// With --bidir the first half receive and the second half send, as
// iperf3's server assigns them.
func (s *iperf3Settings) sender(i int) bool {
	return s.reverse || (s.bidir && i >= s.streams)
}

// iperf3Results are the results each side sends the other
// (send_results, get_results).
type iperf3Results struct {
	CPUTotal             float64              `json:"cpu_util_total"`
	CPUUser              float64              `json:"cpu_util_user"`
	CPUSystem            float64              `json:"cpu_util_system"`
	SenderHasRetransmits int                  `json:"sender_has_retransmits"`
	Streams              []iperf3StreamResult `json:"streams"`
}

type iperf3StreamResult struct {
	ID          int     `json:"id"`
	Bytes       uint64  `json:"bytes"`
	Retransmits int64   `json:"retransmits"`
	Jitter      float64 `json:"jitter"`
	Errors      int64   `json:"errors"`
	Packets     int64   `json:"packets"`
	StartTime   float64 `json:"start_time"`
	EndTime     float64 `json:"end_time"`
}
