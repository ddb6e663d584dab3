package serve

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ustack/ustack/stack"
)

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
	tcpJoin  chan tcpJoin       // TCP streams whose cookie matched
	accepts  int                // connections dispatch handed to joinTCP (under srv.mu)
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

// tcpJoin is a TCP stream whose cookie matched, with its place in the
// order the server accepted connections.
type tcpJoin struct {
	conn net.Conn
	seq  int
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
	seq  int      // TCP stream: its place in the server's accept order
	peer net.Addr // UDP stream: the client's socket

	// retrans is the TCP stream's connection, whose retransmit counter
	// the stream reports (nil: unknown).
	retrans *stack.TCPConn

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
		tcpJoin:  make(chan tcpJoin),
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
	set, code, err := p.settings(&t.srv.cfg)
	if err != nil {
		t.serverError(code)
		return err
	}
	t.set = set
	res.Protocol, res.Streams, res.Reverse, res.Bidir = "tcp", set.streams, set.reverse, set.bidir
	if set.udp {
		res.Protocol = "udp"
		if t.udp, err = t.srv.st.ListenUDPBuffer(t.srv.addr, iperf3UDPBuffer); err != nil {
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
	// The idle watch looks at the streams' bytes every quarter of the
	// idle timeout, so it ends an idle test within 1.25 timeouts.
	idle := t.srv.cfg.idleTimeout()
	var watch <-chan time.Time
	if idle > 0 {
		tick := time.NewTicker(idle / 4)
		defer tick.Stop()
		watch = tick.C
	}
	moved, movedAt := t.moved(), time.Now()
	for running := true; running; {
		select {
		case m := <-t.ctrlMsgs:
			if err := t.ctrlError(m, iperf3TestEnd); err != nil {
				return err
			}
			running = false
		case <-timer.C:
			return ErrIPerf3TimeLimit
		case now := <-watch:
			if n := t.moved(); n != moved {
				moved, movedAt = n, now
			} else if now.Sub(movedAt) >= idle {
				t.srv.stats.iperf3IdleTimeouts.Add(1)
				t.send(iperf3ServerTerminate)
				return ErrIPerf3Idle
			}
		case <-t.srv.ctx.Done():
			t.send(iperf3ServerTerminate)
			return ErrIPerf3ServerClosed
		}
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

// moved returns the bytes the streams have moved so far, both ways.
func (t *iperf3Test) moved() uint64 {
	var n uint64
	for _, s := range t.streams {
		n += s.bytes.Load()
	}
	return n
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
// TCP streams are numbered in the order the server accepted them, as
// iperf3's accept loop does (the client connects them one after the other),
// though their cookies are read concurrently.
func (t *iperf3Test) collectStreams(step time.Duration) error {
	timer := time.NewTimer(step)
	defer timer.Stop()
	defer func() {
		slices.SortStableFunc(t.streams, func(a, b *iperf3Stream) int { return cmp.Compare(a.seq, b.seq) })
		for i, s := range t.streams {
			if s.conn != nil {
				s.id, s.send = iperf3StreamID(i), t.set.sender(i)
			}
		}
	}()
	for len(t.streams) < t.set.total() {
		select {
		case j := <-t.tcpJoin:
			t.streams = append(t.streams, &iperf3Stream{conn: j.conn, seq: j.seq, retrans: tcpRetransmits(j.conn)})
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

// tcpRetransmits returns c if it is one of the stack's TCP connections,
// which count their retransmits, else nil.
func tcpRetransmits(c net.Conn) *stack.TCPConn {
	tc, _ := c.(*stack.TCPConn)
	return tc
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
