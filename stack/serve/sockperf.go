package serve

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/ustack/ustack/stack"
)

// The sockperf protocol, as sockperf 3.7 (Debian bookworm's; Mellanox/
// sockperf src/message.h, src/server.h server_receive_then_send) speaks
// it. Every message starts with a 14-byte header in network byte order
// (MsgHeader, packed; MsgHeader::EFFECTIVE_SIZE):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                 sequence number (64 bits) ...                 |
//	+                                                               +
//	|                          ... sequence number                  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|        flags (16 bits)        |  length (32 bits) ...         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|   ... length                  |  payload (length - 14 bytes)  :
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The length is the whole message's, header included (the client's -m,
// 14 up to MAX_PAYLOAD_SIZE). Flags: MASK_CLIENT (1) on what a client
// sends, MASK_PONG (2) on a message that asks for a reply (every one in
// ping-pong, one in --reply-every in under-load, none in throughput),
// MASK_WARMUP_MSG (4) on the warm-up messages a client sends before its
// test. The server answers a client's pong request that is not a warm-up
// with the same message, the client flag cleared (setServer); it answers
// nothing else. Over TCP the messages follow each other in the byte
// stream, framed by their length; over UDP a datagram is one message.
//
// A length past MAX_PAYLOAD_SIZE makes sockperf's server close the TCP
// connection ("Message received was larger than expected"), and ignore
// the datagram over UDP; so does this one. Two cases sockperf's server
// does not check are malformed here too: a length below the header's
// (sockperf's parser would not advance), and over UDP a datagram whose
// size is not its length (sockperf carries a partial message over to the
// next datagram, whoever sends it; its client never sends one).
const (
	sockperfHeaderSize = 14
	sockperfFlagClient = 1
	sockperfFlagPong   = 2
	sockperfFlagWarmup = 4
	// SockperfMaxMessage is the longest message the server takes, header
	// included: sockperf's MAX_PAYLOAD_SIZE_LIMIT (65507, the largest
	// UDP payload over IPv4), which is MAX_PAYLOAD_SIZE for a server
	// started without -m.
	SockperfMaxMessage = 65507
	// sockperfBufSize is a TCP connection's read buffer: one message of
	// the longest fits, so a partial message never needs more.
	sockperfBufSize = 64 << 10
	// sockperfUDPBuffer is the UDP socket's receive buffer, as the
	// iperf3 server's: a few milliseconds of a throughput test.
	sockperfUDPBuffer = iperf3UDPBuffer
)

// SockperfMessageTimeout is how long a TCP message may take from its
// first byte to its last: the server closes a connection whose message is
// not whole by then (sockperf_message_timeouts), however its bytes trickle
// in, so that no peer holds a read buffer longer. sockperf's client sends
// a message (at most 64 KiB) in one write, which arrives within
// microseconds, or a few round trips under loss; 10 s is generous.
const SockperfMessageTimeout = 10 * time.Second

// sockperfVerdict is what sockperfFrame makes of the start of a buffer.
type sockperfVerdict int

const (
	sockperfMore sockperfVerdict = iota // no whole message yet
	sockperfOK                          // a whole message
	sockperfBad                         // a malformed length
)

// sockperfFrame looks at the message at the start of b: sockperfOK and its
// length if b holds all of it, sockperfMore if b holds less (a header
// not yet whole, or a message not yet whole), sockperfBad if its length is
// below the header's or above SockperfMaxMessage. It only reads b.
func sockperfFrame(b []byte) (sockperfVerdict, int) {
	if len(b) < sockperfHeaderSize {
		return sockperfMore, 0
	}
	n := binary.BigEndian.Uint32(b[10:14])
	if n < sockperfHeaderSize || n > SockperfMaxMessage {
		return sockperfBad, 0
	}
	if uint32(len(b)) < n {
		return sockperfMore, 0
	}
	return sockperfOK, int(n)
}

// sockperfReply decides on the whole message m (as sockperfFrame framed
// it): it counts it and, if it asks for a reply, turns it into its reply
// in place (the client flag cleared, as sockperf's setServer) and returns
// true.
func sockperfReply(m []byte, st *Stats) bool {
	st.sockperfMessages.Add(1)
	flags := binary.BigEndian.Uint16(m[8:10])
	switch {
	case flags&sockperfFlagClient == 0:
		return false // another server's message: never answered
	case flags&sockperfFlagWarmup != 0:
		st.sockperfWarmups.Add(1)
		return false
	case flags&sockperfFlagPong == 0:
		return false
	}
	binary.BigEndian.PutUint16(m[8:10], flags&^sockperfFlagClient)
	st.sockperfReplies.Add(1)
	return true
}

// SockperfServer is the server side of sockperf (`sockperf server`, and
// `sockperf server --tcp` on the same port), over a TCP listener and a UDP
// socket, so that an unmodified sockperf client measures the stack in its
// ping-pong, under-load and throughput modes. It serves any number of
// clients at once within its Config's connection bounds.
//
// What it holds is bounded: a TCP connection holds a 64 KiB read buffer
// only while it has data to look at, replies to write or a partial
// message, and those buffers come from a budget of Config.SockperfMemory
// its connections share (server_buf_bytes_current); one with data to read
// while the budget is taken waits for room, holding none
// (sockperf_buffer_waits). A message not whole within
// SockperfMessageTimeout of its first byte closes its connection
// (sockperf_message_timeouts), as does the idle timeout a peer silent in
// the middle of one. The UDP socket holds one buffer. Replies are written
// from the read buffer, under the write timeout. A malformed message
// closes its TCP connection (sockperf_bad_conns) or drops its datagram
// (sockperf_bad_datagrams).
type SockperfServer struct {
	l      net.Listener   // nil: no TCP
	u      net.PacketConn // nil: no UDP
	cfg    Config
	st     *Stats
	budget budget // a token for each TCP connection's read buffer
	// msgTimeout is SockperfMessageTimeout; tests shorten it before
	// Serve.
	msgTimeout time.Duration
	once       sync.Once
}

// ListenSockperf listens on addr of s, TCP and UDP, for sockperf clients.
// Call Serve to serve them. An unspecified address serves every address
// of the stack's family, as stack.Stack.ListenTCP does.
func ListenSockperf(s *stack.Stack, addr netip.AddrPort, cfg Config) (*SockperfServer, error) {
	l, err := s.ListenTCP(addr)
	if err != nil {
		return nil, err
	}
	u, err := s.ListenUDPBuffer(addr, sockperfUDPBuffer)
	if err != nil {
		l.Close()
		return nil, err
	}
	return NewSockperfServer(l, u, cfg), nil
}

// NewSockperfServer returns a server on l and u, either of which may be
// nil (no TCP, no UDP). It takes both: Close closes them.
func NewSockperfServer(l net.Listener, u net.PacketConn, cfg Config) *SockperfServer {
	return &SockperfServer{
		l: l, u: u, cfg: cfg, st: cfg.stats(),
		budget:     newBudget(cfg.sockperfMemory(), sockperfBufSize, 1),
		msgTimeout: SockperfMessageTimeout,
	}
}

// Addr is the TCP listening address (the UDP one if there is no TCP).
func (srv *SockperfServer) Addr() net.Addr {
	if srv.l != nil {
		return srv.l.Addr()
	}
	return srv.u.LocalAddr()
}

// Close stops the server: its listener and UDP socket are closed, and so
// is every connection. Serve returns once everything has ended. Close is
// idempotent and safe to call from any goroutine.
func (srv *SockperfServer) Close() error {
	srv.once.Do(func() {
		if srv.l != nil {
			srv.l.Close()
		}
		if srv.u != nil {
			srv.u.Close()
		}
	})
	return nil
}

// Serve serves clients until Close. It returns nil after Close, once every
// connection is closed and every goroutine it started has ended, or the
// first accept or read error (after closing the server the same way).
func (srv *SockperfServer) Serve() error {
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	if srv.l != nil {
		wg.Go(func() {
			errs <- serve(srv.l, &srv.cfg, srv.st, srv.tcp)
		})
	}
	if srv.u != nil {
		wg.Go(func() { errs <- srv.udp() })
	}
	var first error
	for range boolInt(srv.l != nil) + boolInt(srv.u != nil) {
		if err := <-errs; err != nil && first == nil {
			first = err
			srv.Close()
		}
	}
	wg.Wait()
	return first
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sockperfBufs are the TCP connections' read buffers.
var sockperfBufs = sync.Pool{New: func() any { return new([sockperfBufSize]byte) }}

// tcp serves one connection: it reads into a buffer taken, with a budget
// token, once data is there, frames the messages in it, writes the
// replies of each read in one write per run of adjacent replies, and
// keeps the buffer only while a partial message is left, at most
// msgTimeout from that message's first byte (the reader's cap).
func (srv *SockperfServer) tcp(c net.Conn, quit <-chan struct{}) {
	st := srv.st
	r := newServerReader(c, &srv.cfg, st, quit)
	defer r.close()
	var buf *[sockperfBufSize]byte
	put := func() {
		st.bufBytes.Add(-sockperfBufSize)
		sockperfBufs.Put(buf)
		buf = nil
		srv.budget.give()
	}
	defer func() {
		if buf != nil {
			put()
		}
	}()
	wt := srv.cfg.writeTimeout()
	end := 0 // buf[:end] holds a partial message
	for {
		if err := r.wait(); err != nil {
			if errors.Is(err, errServerCap) {
				st.sockperfMessageTimeouts.Add(1)
			}
			return
		}
		if buf == nil {
			if !srv.budget.tryTake() {
				st.sockperfBufferWaits.Add(1)
				if !srv.budget.take(r.stop, quit) {
					return
				}
			}
			buf = sockperfBufs.Get().(*[sockperfBufSize]byte)
			st.bufBytes.Add(sockperfBufSize)
		}
		prev := end
		n, rerr := r.read(buf[end:])
		if errors.Is(rerr, errServerCap) {
			st.sockperfMessageTimeouts.Add(1)
			return
		}
		end += n
		start, bad, werr := srv.tcpMessages(c, buf[:end], wt)
		if werr != nil {
			if isTimeoutErr(werr) {
				st.writeTimeouts.Add(1)
			}
			return
		}
		if bad {
			st.sockperfBadConns.Add(1)
			return
		}
		if rerr != nil {
			// io.EOF or an error. A message cut short by the end of
			// the stream (a truncated header or payload) is malformed.
			if errors.Is(rerr, io.EOF) && start < end {
				st.sockperfBadConns.Add(1)
			}
			return
		}
		if start < end && (start > 0 || prev == 0) {
			// A message started in this read and is partial: it has
			// msgTimeout to be whole. (One whole in its first read, as
			// a client's usually is, costs no clock read.)
			r.cap = time.Now().Add(srv.msgTimeout)
		}
		end = copy(buf[:], buf[start:end])
		if end == 0 {
			r.cap = time.Time{}
			put()
		}
	}
}

// tcpMessages frames the whole messages at the start of b and writes their
// replies to c, each run of adjacent replies (the message turned into its
// reply in place) in one write under the write timeout wt. It returns
// where the first message it could not frame whole starts, whether that
// one's length is malformed, and the first write error.
func (srv *SockperfServer) tcpMessages(c sockperfWriter, b []byte, wt time.Duration) (start int, bad bool, err error) {
	ws, we := 0, 0 // the run of replies not yet written: b[ws:we]
	flush := func() error {
		if we == ws {
			return nil
		}
		if wt > 0 {
			c.SetWriteDeadline(time.Now().Add(wt))
		}
		_, err := c.Write(b[ws:we])
		ws = we
		return err
	}
	for {
		v, n := sockperfFrame(b[start:])
		if v != sockperfOK {
			bad = v == sockperfBad
			break
		}
		m := b[start : start+n]
		if sockperfReply(m, srv.st) {
			if we != start {
				if err = flush(); err != nil {
					return start, false, err
				}
				ws = start
			}
			we = start + n
		}
		start += n
	}
	// The replies before a malformed message go out first, as sockperf's
	// server sends each before it looks at the next.
	return start, bad, flush()
}

// sockperfWriter is what tcpMessages writes replies to: a net.Conn.
type sockperfWriter interface {
	Write(b []byte) (int, error)
	SetWriteDeadline(t time.Time) error
}

// udp serves the UDP socket: one message per datagram, the reply sent to
// the datagram's source.
func (srv *SockperfServer) udp() error {
	buf := make([]byte, 65536)
	st := srv.st
	for {
		n, from, err := srv.u.ReadFrom(buf)
		if err != nil {
			return ignoreClosed(err)
		}
		m := buf[:n]
		if v, l := sockperfFrame(m); v != sockperfOK || l != n {
			st.sockperfBadDatagrams.Add(1)
			continue
		}
		if !sockperfReply(m, st) {
			continue
		}
		if _, err := srv.u.WriteTo(m, from); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			st.sockperfUDPSendErrors.Add(1)
		}
	}
}
