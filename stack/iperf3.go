package stack

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
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
	// MaxDuration bounds the running phase of a test without a time limit
	// (-n or -k). A timed test (-t) is ended StepTimeout after its -t and
	// -O have passed, as iperf3's server does. Default 10 minutes.
	MaxDuration time.Duration
}

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
	return 10 * time.Minute
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
)

// IPerf3Server serves the iperf3 protocol (the server side of `iperf3 -s`)
// over a Stack's own TCP and UDP sockets, so that an unmodified iperf3
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
	st   *Stack
	addr netip.AddrPort
	cfg  IPerf3Config
	l    net.Listener

	ctx       context.Context // done when the server closes
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup // every goroutine Serve started

	mu  sync.Mutex
	cur *iperf3Test // +checklocks:mu
}

// ListenIPerf3 listens on addr (TCP; UDP tests open the same port on UDP
// while they run) for iperf3 clients. Call Serve to serve them. An
// unspecified address serves every address of the stack's family, as
// ListenTCP does.
func (s *Stack) ListenIPerf3(addr netip.AddrPort, cfg IPerf3Config) (*IPerf3Server, error) {
	l, err := s.ListenTCP(addr)
	if err != nil {
		return nil, fmt.Errorf("iperf3: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &IPerf3Server{st: s, addr: addr, cfg: cfg, l: l, ctx: ctx, cancel: cancel}, nil
}

// ServeIPerf3 listens on addr and serves iperf3 clients until ctx is done.
// It returns nil then, once every connection is closed and every goroutine
// it started has ended; a test running at that moment ends with
// SERVER_TERMINATE to its client.
func (s *Stack) ServeIPerf3(ctx context.Context, addr netip.AddrPort, cfg IPerf3Config) error {
	srv, err := s.ListenIPerf3(addr, cfg)
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
		srv.wg.Add(1)
		go func() {
			defer srv.wg.Done()
			t.joinTCP(c)
		}()
	default:
		srv.wg.Add(1)
		go func() {
			defer srv.wg.Done()
			srv.deny(c)
		}()
	}
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
func (p *iperf3Params) settings() (iperf3Settings, int32, error) {
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
	}
	s.udp = p.UDP && !p.TCP
	s.streams = max(1, int(p.Parallel))
	s.reverse, s.bidir = p.Reverse, p.Bidirectional
	s.dur = time.Duration(p.Time * float64(time.Second))
	s.omit = time.Duration(p.Omit * float64(time.Second))
	s.bytes, s.blocks = uint64(p.Num), uint64(p.BlockCount)
	s.rate = p.Bandwidth
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

// iperf3Test is one test: its control connection, streams and goroutines.
type iperf3Test struct {
	srv    *IPerf3Server
	ctrl   net.Conn
	cookie [iperf3CookieSize]byte
	set    iperf3Settings // written before state becomes CREATE_STREAMS, read-only after

	// state is the protocol state (PARAM_EXCHANGE, ...): dispatch and the
	// stream goroutines read it.
	state atomic.Int32

	udp      net.PacketConn     // UDP tests: the stream socket
	tcpJoin  chan net.Conn      // TCP streams whose cookie matched
	udpJoin  chan *iperf3Stream // UDP streams that said hello
	ctrlMsgs chan iperf3CtrlMsg // from the control reader
	streams  []*iperf3Stream    // owned by run
	halt     chan struct{}      // closed when the streams must stop (haltOnce)
	haltOnce sync.Once
	stop     chan struct{}             // closed when the test ends
	wg       sync.WaitGroup            // the test's own goroutines
	swg      sync.WaitGroup            // stream goroutines and the omit timer (a subset of wg)
	sent     atomic.Uint64             // bytes sent over all streams
	blocks   atomic.Uint64             // blocks (writes, datagrams) sent
	start    time.Time                 // TEST_RUNNING
	cpuUser0 time.Duration             // the process's user CPU time at start
	cpuSys0  time.Duration             // and its system CPU time
	omitted  atomic.Pointer[time.Time] // end of the omitted seconds, once passed
}

type iperf3CtrlMsg struct {
	state int8
	err   error
}

// iperf3Stream is one data stream. Its counters are written by the one
// goroutine that moves its data and read by the omit timer and, after the
// streams have stopped, by the test.
type iperf3Stream struct {
	id   int
	send bool     // the server sends on it
	conn net.Conn // TCP stream
	peer net.Addr // UDP stream: the client's socket

	// retrans is the TCP endpoint's retransmit counter (nil: unknown).
	retrans *tcpip.StatCounter

	bytes   atomic.Uint64
	packets atomic.Uint64 // UDP: datagrams sent, or the highest sequence number received
	lost    atomic.Uint64 // UDP receive: sequence gaps, less late arrivals
	ooo     atomic.Uint64 // UDP receive: out-of-order datagrams
	jitter  atomic.Uint64 // UDP receive: float64 bits, seconds

	// At the start of the test (retransmits), and at the end of the
	// omitted seconds.
	retrans0                                               uint64
	omitBytes, omitPackets, omitLost, omitOOO, omitRetrans uint64

	// UDP receive state of the reading goroutine.
	seen        bool
	prevTransit float64
}

func newIPerf3Test(srv *IPerf3Server, c net.Conn) *iperf3Test {
	return &iperf3Test{
		srv:      srv,
		ctrl:     c,
		tcpJoin:  make(chan net.Conn),
		udpJoin:  make(chan *iperf3Stream),
		ctrlMsgs: make(chan iperf3CtrlMsg),
		halt:     make(chan struct{}),
		stop:     make(chan struct{}),
	}
}

// run runs the test to its end and returns its result. Every connection
// and goroutine of the test is gone when it returns.
func (t *iperf3Test) run() IPerf3Result {
	res := IPerf3Result{Client: addrPortOf(t.ctrl.RemoteAddr())}
	end := time.Time{}
	res.Err = t.serve(&res, &end)
	t.haltStreams()
	close(t.stop)
	t.ctrl.Close()
	if t.udp != nil {
		t.udp.Close()
	}
	t.wg.Wait()
	if !t.start.IsZero() {
		if end.IsZero() {
			end = time.Now()
		}
		t.fill(&res, end)
	}
	return res
}

// serve speaks the protocol; run cleans up after it. end is set to the
// time of TEST_END.
func (t *iperf3Test) serve(res *IPerf3Result, end *time.Time) error {
	step := t.srv.cfg.stepTimeout()
	wake := t.wakeOnClose()
	defer wake()
	t.armRead(step)
	if _, err := io.ReadFull(t.ctrl, t.cookie[:]); err != nil {
		return fmt.Errorf("iperf3: read cookie: %w", err)
	}
	if err := t.send(iperf3ParamExchange); err != nil {
		return err
	}
	var p iperf3Params
	if err := iperf3ReadJSON(t.ctrl, &p); err != nil {
		t.serverError(iperf3ErrRecvParams)
		return fmt.Errorf("iperf3: read parameters: %w", err)
	}
	// From here to TEST_END the protocol's waits watch ctx themselves.
	wake()
	t.ctrl.SetReadDeadline(time.Time{})
	set, code, err := p.settings()
	if err != nil {
		t.serverError(code)
		return err
	}
	t.set = set
	res.Protocol, res.Streams, res.Reverse, res.Bidir = "tcp", set.streams, set.reverse, set.bidir
	if set.udp {
		res.Protocol = "udp"
		if t.udp, err = t.srv.st.listenUDPBuffer(t.srv.addr, iperf3UDPBuffer); err != nil {
			t.serverError(iperf3ErrStreamListen)
			return fmt.Errorf("iperf3: %w", err)
		}
	}

	// From here on the control connection is read by readCtrl, up to
	// TEST_END, so that a client that goes away is noticed at once.
	t.state.Store(iperf3CreateStreams)
	t.wg.Add(1)
	go t.readCtrl()
	if set.udp {
		t.wg.Add(1)
		go t.readUDP()
	}
	if err := t.send(iperf3CreateStreams); err != nil {
		return err
	}
	if err := t.collectStreams(step); err != nil {
		return err
	}

	t.start = time.Now()
	t.cpuUser0, t.cpuSys0 = processCPU()
	t.state.Store(iperf3TestRunning)
	if err := t.send(iperf3TestStart); err != nil {
		return err
	}
	if err := t.send(iperf3TestRunning); err != nil {
		return err
	}
	for _, s := range t.streams {
		s.retrans0 = s.retransmits()
		t.startStream(s)
	}
	if set.omit > 0 {
		t.wg.Add(1)
		t.swg.Add(1)
		go t.omitTimer()
	}
	limit := set.dur + set.omit + step
	if set.dur == 0 {
		limit = t.srv.cfg.maxDuration()
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case m := <-t.ctrlMsgs:
		if err := t.ctrlError(m, iperf3TestEnd); err != nil {
			return err
		}
	case <-timer.C:
		return ErrIPerf3TimeLimit
	case <-t.srv.ctx.Done():
		t.send(iperf3ServerTerminate)
		return ErrIPerf3ServerClosed
	}
	*end = time.Now()
	t.state.Store(iperf3TestEnd)
	t.haltStreams()
	t.swg.Wait()

	// Results: the client's first, then ours (iperf_exchange_results).
	defer t.wakeOnClose()()
	if err := t.send(iperf3ExchangeResults); err != nil {
		return err
	}
	t.armRead(step)
	// Only the byte counts are kept; iperf3 writes -1 as 2^64-1, among
	// other things, so the rest is not decoded.
	var theirs struct {
		Streams []struct {
			Bytes float64 `json:"bytes"`
		} `json:"streams"`
	}
	if err := iperf3ReadJSON(t.ctrl, &theirs); err != nil {
		return fmt.Errorf("iperf3: read client results: %w", err)
	}
	for _, s := range theirs.Streams {
		res.ClientBytes += uint64(s.Bytes)
	}
	if err := t.writeJSON(t.results(*end)); err != nil {
		return err
	}
	if err := t.send(iperf3DisplayResults); err != nil {
		return err
	}
	var b [1]byte
	t.armRead(step)
	if _, err := io.ReadFull(t.ctrl, b[:]); err != nil {
		return fmt.Errorf("iperf3: waiting for IPERF_DONE: %w", err)
	}
	if int8(b[0]) != iperf3Done {
		return fmt.Errorf("iperf3: got message %d, want IPERF_DONE", int8(b[0]))
	}
	return nil
}

// wakeOnClose makes the server's closing end the control connection's
// reads (see armRead) until the returned function is called.
func (t *iperf3Test) wakeOnClose() (stop func() bool) {
	return context.AfterFunc(t.srv.ctx, func() { t.ctrl.SetReadDeadline(time.Now()) })
}

// armRead sets the control connection's read deadline d from now, or now
// if the server is closing.
func (t *iperf3Test) armRead(d time.Duration) {
	t.ctrl.SetReadDeadline(time.Now().Add(d))
	if t.srv.ctx.Err() != nil {
		t.ctrl.SetReadDeadline(time.Now())
	}
}

// collectStreams waits for the test's streams to connect, at most step.
func (t *iperf3Test) collectStreams(step time.Duration) error {
	timer := time.NewTimer(step)
	defer timer.Stop()
	for len(t.streams) < t.set.total() {
		select {
		case c := <-t.tcpJoin:
			i := len(t.streams)
			t.streams = append(t.streams, &iperf3Stream{id: iperf3StreamID(i), send: t.set.sender(i), conn: c, retrans: tcpRetransmits(c)})
		case s := <-t.udpJoin:
			t.streams = append(t.streams, s)
		case m := <-t.ctrlMsgs:
			return t.ctrlError(m, 0)
		case <-timer.C:
			return fmt.Errorf("iperf3: %d of %d streams connected in %v", len(t.streams), t.set.total(), step)
		case <-t.srv.ctx.Done():
			t.send(iperf3ServerTerminate)
			return ErrIPerf3ServerClosed
		}
	}
	return nil
}

// tcpRetransmits returns the retransmit counter of c's gVisor endpoint, or
// nil if c is not one of the stack's TCP connections.
func tcpRetransmits(c net.Conn) *tcpip.StatCounter {
	if tc, ok := c.(*TCPConn); ok {
		if st, ok := tc.ep.Stats().(*tcp.Stats); ok {
			return &st.SendErrors.Retransmits
		}
	}
	return nil
}

// iperf3StreamID is the id iperf3 gives its i-th stream (iperf_add_stream):
// 1, 3, 4, 5, ...
func iperf3StreamID(i int) int {
	if i == 0 {
		return 1
	}
	return i + 2
}

// ctrlError turns a control message into the error that ends the test,
// or nil if it is want.
func (t *iperf3Test) ctrlError(m iperf3CtrlMsg, want int8) error {
	switch {
	case m.err != nil:
		return fmt.Errorf("iperf3: control connection: %w", m.err)
	case m.state == want:
		return nil
	case m.state == iperf3ClientTerminate:
		return ErrIPerf3ClientTerminated
	default:
		return fmt.Errorf("iperf3: unexpected message %d", m.state)
	}
}

// readCtrl reads control messages and hands them to run, up to TEST_END
// (after which run reads the control connection itself) or an error.
func (t *iperf3Test) readCtrl() {
	defer t.wg.Done()
	var b [1]byte
	for {
		_, err := io.ReadFull(t.ctrl, b[:])
		m := iperf3CtrlMsg{state: int8(b[0]), err: err}
		select {
		case t.ctrlMsgs <- m:
		case <-t.stop:
			return
		}
		if err != nil || m.state == iperf3TestEnd {
			return
		}
	}
}

// joinTCP reads a new connection's cookie and hands it to the test as a
// stream if the cookie is the test's; a stranger gets ACCESS_DENIED
// (iperf_tcp_accept).
func (t *iperf3Test) joinTCP(c net.Conn) {
	var cookie [iperf3CookieSize]byte
	c.SetReadDeadline(time.Now().Add(t.srv.cfg.stepTimeout()))
	stop := context.AfterFunc(t.srv.ctx, func() { c.Close() })
	_, err := io.ReadFull(c, cookie[:])
	if !stop() || err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	if cookie != t.cookie || t.state.Load() != iperf3CreateStreams {
		t.srv.deny(c)
		return
	}
	select {
	case t.tcpJoin <- c:
	case <-t.stop:
		c.Close()
	}
}

// readUDP owns the UDP socket's reads: in CREATE_STREAMS a datagram from a
// new address is a stream's hello and is answered; while the test runs,
// datagrams of receiving streams are counted. It ends when the socket is
// closed.
func (t *iperf3Test) readUDP() {
	defer t.wg.Done()
	buf := make([]byte, 65536)
	peers := map[netip.AddrPort]*iperf3Stream{}
	for {
		m, from, err := t.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		ua, ok := from.(*net.UDPAddr)
		if !ok {
			continue
		}
		ap := ua.AddrPort()
		s := peers[ap]
		if s == nil {
			if t.state.Load() != iperf3CreateStreams || len(peers) == t.set.total() || m != 4 {
				continue
			}
			i := len(peers)
			s = &iperf3Stream{id: iperf3StreamID(i), send: t.set.sender(i), peer: from}
			peers[ap] = s
			reply := iperf3UDPReply([4]byte(buf[:4]))
			t.udp.WriteTo(reply[:], from)
			select {
			case t.udpJoin <- s:
			case <-t.stop:
				return
			}
			continue
		}
		if s.send || t.state.Load() != iperf3TestRunning {
			continue
		}
		s.receiveUDP(buf[:m], t.set.counters64, time.Now())
	}
}

// iperf3UDPReply returns the answer to a UDP stream's hello: the reply
// that goes with the message, in the byte order the client used.
func iperf3UDPReply(hello [4]byte) [4]byte {
	var out [4]byte
	for _, o := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		switch o.Uint32(hello[:]) {
		case iperf3UDPConnectMsg:
			o.PutUint32(out[:], iperf3UDPConnectReply)
			return out
		case iperf3LegacyUDPConnectMsg:
			o.PutUint32(out[:], iperf3LegacyUDPConnectReply)
			return out
		}
	}
	// Unknown: answer as to a little-endian client, which is what
	// iperf3's server does on the usual hosts.
	binary.LittleEndian.PutUint32(out[:], iperf3UDPConnectReply)
	return out
}

// receiveUDP counts one datagram (iperf_udp_recv): bytes, the sequence
// number's gaps and reversals, and the jitter of its transit time.
func (s *iperf3Stream) receiveUDP(b []byte, counters64 bool, now time.Time) {
	s.bytes.Add(uint64(len(b)))
	var seq uint64
	switch {
	case counters64 && len(b) >= 16:
		seq = binary.BigEndian.Uint64(b[8:])
	case !counters64 && len(b) >= 12:
		seq = uint64(binary.BigEndian.Uint32(b[8:]))
	default:
		return // too short to carry a header: bytes only
	}
	top := s.packets.Load()
	if seq > top {
		if seq > top+1 {
			s.lost.Add(seq - 1 - top)
		}
		s.packets.Store(seq)
	} else {
		// Late: it was counted lost when the gap opened.
		s.ooo.Add(1)
		if l := s.lost.Load(); l > 0 {
			s.lost.Store(l - 1)
		}
	}
	sent := int64(binary.BigEndian.Uint32(b[0:]))*1e6 + int64(binary.BigEndian.Uint32(b[4:]))
	transit := float64(now.UnixMicro()-sent) / 1e6
	if !s.seen {
		s.prevTransit, s.seen = transit, true
	}
	d := math.Abs(transit - s.prevTransit)
	s.prevTransit = transit
	j := math.Float64frombits(s.jitter.Load())
	s.jitter.Store(math.Float64bits(j + (d-j)/16))
}

// startStream starts the goroutine that moves s's data. UDP streams the
// server receives on are served by readUDP.
func (t *iperf3Test) startStream(s *iperf3Stream) {
	var fn func(*iperf3Stream)
	switch {
	case s.send && t.set.udp:
		fn = t.sendUDP
	case s.send:
		fn = t.sendTCP
	case !t.set.udp:
		fn = t.recvTCP
	default:
		return
	}
	t.wg.Add(1)
	t.swg.Add(1)
	go func() {
		defer t.wg.Done()
		defer t.swg.Done()
		fn(s)
	}()
}

// haltStreams stops the streams: the sending loops see halt, and closing
// the connections ends every blocked read and write. Idempotent.
func (t *iperf3Test) haltStreams() {
	t.haltOnce.Do(func() {
		close(t.halt)
		for _, s := range t.streams {
			if s.conn != nil {
				s.conn.Close()
			}
		}
		// The UDP socket stays open for readUDP until the test ends
		// (it counts only while the test runs); a deadline in the past
		// ends the senders' blocked writes.
		if t.udp != nil {
			t.udp.SetWriteDeadline(time.Now())
		}
	})
}

func (t *iperf3Test) recvTCP(s *iperf3Stream) {
	buf := make([]byte, serverBufSize)
	for {
		n, err := s.conn.Read(buf)
		s.bytes.Add(uint64(n))
		if err != nil {
			return
		}
	}
}

// sendDone reports whether the sending streams must stop: halted, or the
// byte or block count (-n, -k) reached.
func (t *iperf3Test) sendDone() bool {
	select {
	case <-t.halt:
		return true
	default:
	}
	return (t.set.bytes > 0 && t.sent.Load() >= t.set.bytes) ||
		(t.set.blocks > 0 && t.blocks.Load() >= t.set.blocks)
}

func (t *iperf3Test) sendTCP(s *iperf3Stream) {
	buf := iperf3Payload(t.set.blksize)
	p := newIPerf3Pacer(t.set.rate)
	defer p.stop()
	for !t.sendDone() && p.wait(len(buf), t.halt) {
		n, err := s.conn.Write(buf)
		s.bytes.Add(uint64(n))
		t.sent.Add(uint64(n))
		t.blocks.Add(1)
		if err != nil {
			return
		}
	}
}

func (t *iperf3Test) sendUDP(s *iperf3Stream) {
	buf := iperf3Payload(t.set.blksize)
	p := newIPerf3Pacer(t.set.rate)
	defer p.stop()
	for !t.sendDone() && p.wait(len(buf), t.halt) {
		now := time.Now()
		binary.BigEndian.PutUint32(buf[0:], uint32(now.Unix()))
		binary.BigEndian.PutUint32(buf[4:], uint32(now.Nanosecond()/1000))
		seq := s.packets.Load() + 1
		if t.set.counters64 {
			binary.BigEndian.PutUint64(buf[8:], seq)
		} else {
			binary.BigEndian.PutUint32(buf[8:], uint32(seq))
		}
		n, err := t.udp.WriteTo(buf, s.peer)
		if err != nil {
			return
		}
		s.packets.Store(seq)
		s.bytes.Add(uint64(n))
		t.sent.Add(uint64(n))
		t.blocks.Add(1)
	}
}

// iperf3Payload returns a block of n pseudo-random bytes, as iperf3 sends
// (compressible data would flatter a compressing path).
func iperf3Payload(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{'u', 's', 't', 'a', 'c', 'k'})
	r.Read(b)
	return b
}

// iperf3Pacer holds a sender to a rate in bits per second, in bursts of at
// most a millisecond's worth (iperf3's default pacing timer).
type iperf3Pacer struct {
	rate  float64
	start time.Time
	bits  float64
	timer *time.Timer
}

func newIPerf3Pacer(rate float64) *iperf3Pacer {
	return &iperf3Pacer{rate: rate, start: time.Now()}
}

// wait waits until n more bytes may go, and reports false if halt closed
// first.
func (p *iperf3Pacer) wait(n int, halt <-chan struct{}) bool {
	if p.rate > 0 {
		due := p.start.Add(time.Duration(p.bits / p.rate * float64(time.Second)))
		if d := time.Until(due); d > time.Millisecond {
			if p.timer == nil {
				p.timer = time.NewTimer(d)
			} else {
				p.timer.Reset(d)
			}
			select {
			case <-halt:
				return false
			case <-p.timer.C:
			}
		}
		p.bits += float64(n) * 8
	}
	return true
}

func (p *iperf3Pacer) stop() {
	if p.timer != nil {
		p.timer.Stop()
	}
}

// omitTimer marks the end of the omitted seconds: what the streams counted
// until then is left out of the results.
func (t *iperf3Test) omitTimer() {
	defer t.wg.Done()
	defer t.swg.Done()
	timer := time.NewTimer(t.set.omit)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-t.halt:
		return
	}
	now := time.Now()
	for _, s := range t.streams {
		// Races with the stream's own goroutine by at most a block,
		// as iperf3's reset of its counters at the same moment does.
		s.omitBytes = s.bytes.Load()
		s.omitPackets = s.packets.Load()
		s.omitLost = s.lost.Load()
		s.omitOOO = s.ooo.Load()
		s.omitRetrans = s.retransmits()
	}
	t.omitted.Store(&now)
}

// measured returns when the measured part of the test began: the start,
// or the end of the omitted seconds.
func (t *iperf3Test) measured() time.Time {
	if p := t.omitted.Load(); p != nil {
		return *p
	}
	return t.start
}

// results are the server's results for the client. Call only after the
// streams have stopped.
func (t *iperf3Test) results(end time.Time) iperf3Results {
	// As iperf3: -1 when the server only received, else whether it
	// knows its retransmits (UDP: no).
	r := iperf3Results{SenderHasRetransmits: -1}
	if t.set.reverse || t.set.bidir {
		r.SenderHasRetransmits = 0
		if !t.set.udp {
			r.SenderHasRetransmits = 1
			for _, s := range t.streams {
				if s.send && s.retrans == nil {
					r.SenderHasRetransmits = 0
				}
			}
		}
	}
	wall := end.Sub(t.start).Seconds()
	if u, s := processCPU(); wall > 0 {
		r.CPUUser = 100 * (u - t.cpuUser0).Seconds() / wall
		r.CPUSystem = 100 * (s - t.cpuSys0).Seconds() / wall
		r.CPUTotal = r.CPUUser + r.CPUSystem
	}
	secs := end.Sub(t.measured()).Seconds()
	for _, s := range t.streams {
		c := s.counts()
		retrans := int64(-1)
		if s.send && s.retrans != nil {
			retrans = int64(c.retrans)
		}
		r.Streams = append(r.Streams, iperf3StreamResult{
			ID:          s.id,
			Bytes:       c.bytes,
			Retransmits: retrans,
			Jitter:      c.jitter,
			Errors:      int64(c.lost),
			Packets:     int64(c.packets),
			StartTime:   0,
			EndTime:     secs,
		})
	}
	return r
}

// iperf3Counts are a stream's counters less the omitted seconds'.
type iperf3Counts struct {
	bytes, packets, lost, ooo, retrans uint64
	jitter                             float64
}

func (s *iperf3Stream) counts() iperf3Counts {
	return iperf3Counts{
		bytes:   s.bytes.Load() - s.omitBytes,
		packets: s.packets.Load() - s.omitPackets,
		lost:    s.lost.Load() - min(s.lost.Load(), s.omitLost),
		ooo:     s.ooo.Load() - s.omitOOO,
		retrans: s.retransmits() - max(s.retrans0, s.omitRetrans),
		jitter:  math.Float64frombits(s.jitter.Load()),
	}
}

// retransmits reads the stream's retransmit counter (0 if unknown).
func (s *iperf3Stream) retransmits() uint64 {
	if s.retrans == nil {
		return 0
	}
	return s.retrans.Value()
}

// fill adds the streams' counts to res.
func (t *iperf3Test) fill(res *IPerf3Result, end time.Time) {
	res.Duration = end.Sub(t.measured())
	var jitter float64
	var udpRecv int
	for _, s := range t.streams {
		c := s.counts()
		if s.send {
			res.BytesSent += c.bytes
			res.Retransmits += c.retrans
			continue
		}
		res.BytesReceived += c.bytes
		if t.set.udp {
			res.Packets += c.packets
			res.Lost += c.lost
			res.OutOfOrder += c.ooo
			jitter += c.jitter
			udpRecv++
		}
	}
	if udpRecv > 0 {
		res.Jitter = time.Duration(jitter / float64(udpRecv) * float64(time.Second))
	}
}

// send writes one control message.
func (t *iperf3Test) send(state int8) error {
	t.ctrl.SetWriteDeadline(time.Now().Add(t.srv.cfg.stepTimeout()))
	if _, err := t.ctrl.Write([]byte{byte(state)}); err != nil {
		return fmt.Errorf("iperf3: send message %d: %w", state, err)
	}
	return nil
}

// serverError sends SERVER_ERROR with an iperf3 error number and errno 0.
func (t *iperf3Test) serverError(code int32) {
	var b [9]byte
	b[0] = 0xfe // SERVER_ERROR (-2)
	binary.BigEndian.PutUint32(b[1:], uint32(code))
	t.ctrl.SetWriteDeadline(time.Now().Add(t.srv.cfg.stepTimeout()))
	t.ctrl.Write(b[:])
}

// writeJSON writes v as a length-prefixed JSON message (JSON_write).
func (t *iperf3Test) writeJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	msg := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(msg, uint32(len(b)))
	copy(msg[4:], b)
	t.ctrl.SetWriteDeadline(time.Now().Add(t.srv.cfg.stepTimeout()))
	if _, err := t.ctrl.Write(msg); err != nil {
		return fmt.Errorf("iperf3: send results: %w", err)
	}
	return nil
}

// iperf3ReadJSON reads a length-prefixed JSON message (JSON_read) into v.
func iperf3ReadJSON(r io.Reader, v any) error {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > iperf3MaxJSON {
		return fmt.Errorf("JSON message of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// listenUDPBuffer is ListenUDP with a receive buffer of size bytes.
func (s *Stack) listenUDPBuffer(addr netip.AddrPort, size int64) (net.PacketConn, error) {
	fa, proto := s.fullAddr(addr)
	if addr.Addr().IsUnspecified() {
		fa.Addr = tcpip.Address{}
	}
	var wq waiter.Queue
	ep, e := s.ip.NewEndpoint(udp.ProtocolNumber, proto, &wq)
	if e != nil {
		return nil, fmt.Errorf("listen udp %s: %s", addr, e)
	}
	ep.SocketOptions().SetReceiveBufferSize(size, true)
	if e := ep.Bind(fa); e != nil {
		ep.Close()
		return nil, fmt.Errorf("listen udp %s: %s", addr, e)
	}
	return &packetConn{PacketConn: gonet.NewUDPConn(&wq, ep)}, nil
}

// addrPortOf returns a's address and port if it is a TCP or UDP address.
func addrPortOf(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort()
	case *net.UDPAddr:
		return a.AddrPort()
	}
	return netip.AddrPort{}
}
