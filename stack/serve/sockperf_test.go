package serve

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/stacktest"
)

// spMsg builds a sockperf message of n bytes (n >= 14, the header's
// length field n unless length is not 0) with flags and seq, its payload a
// pattern of seq.
func spMsg(seq uint64, flags uint16, n int, length uint32) []byte {
	if length == 0 {
		length = uint32(n)
	}
	b := make([]byte, n)
	binary.BigEndian.PutUint64(b[0:8], seq)
	binary.BigEndian.PutUint16(b[8:10], flags)
	binary.BigEndian.PutUint32(b[10:14], length)
	for i := sockperfHeaderSize; i < n; i++ {
		b[i] = byte(seq) + byte(i)
	}
	return b
}

// spHdr is a bare header whose length field is length.
func spHdr(seq uint64, flags uint16, length uint32) []byte {
	b := spMsg(seq, flags, sockperfHeaderSize, 0)
	binary.BigEndian.PutUint32(b[10:14], length)
	return b
}

// spReply is the reply sockperf's server sends to m: m, the client flag
// cleared.
func spReply(m []byte) []byte {
	r := bytes.Clone(m)
	r[9] &^= sockperfFlagClient
	return r
}

const (
	spPing   = sockperfFlagClient | sockperfFlagPong // asks for a reply
	spOneWay = sockperfFlagClient                    // throughput, under-load
)

func TestSockperfFrame(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		v    sockperfVerdict
		n    int
	}{
		{"empty", nil, sockperfMore, 0},
		{"13 bytes", spMsg(1, spPing, 14, 0)[:13], sockperfMore, 0},
		{"header only", spMsg(1, spPing, 14, 0), sockperfOK, 14},
		{"64 bytes", spMsg(1, spPing, 64, 0), sockperfOK, 64},
		{"64 of a longer stream", append(spMsg(1, spPing, 64, 0), 1, 2, 3), sockperfOK, 64},
		{"partial payload", spMsg(1, spPing, 64, 0)[:63], sockperfMore, 0},
		{"largest", spMsg(1, spPing, SockperfMaxMessage, 0), sockperfOK, SockperfMaxMessage},
		{"length field 0", spHdr(1, spPing, 0), sockperfBad, 0},
		{"length field below header", spMsg(1, spPing, 14, 13), sockperfBad, 0},
		{"length field past max", spMsg(1, spPing, 14, SockperfMaxMessage+1), sockperfBad, 0},
		{"length field 2^32-1", spMsg(1, spPing, 14, 0xffffffff), sockperfBad, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, n := sockperfFrame(tc.b)
			if v != tc.v || n != tc.n {
				t.Errorf("sockperfFrame: got (%d, %d), want (%d, %d)", v, n, tc.v, tc.n)
			}
		})
	}
}

// spServer serves sockperf on rx's 192.0.2.1:11111, TCP and UDP, counting
// into a fresh Stats; cleanup closes it and checks that Serve returns nil.
func spServer(t *testing.T, rx *stack.Stack, cfg Config) (*SockperfServer, *Stats) {
	t.Helper()
	return spServerOn(t, rx, spAddr, cfg, nil)
}

// spServerOn is spServer on ap, calling set, if not nil, on the server
// before it serves.
func spServerOn(t *testing.T, rx *stack.Stack, ap netip.AddrPort, cfg Config, set func(*SockperfServer)) (*SockperfServer, *Stats) {
	t.Helper()
	st := new(Stats)
	cfg.Stats = st
	srv, err := ListenSockperf(rx, ap, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if set != nil {
		set(srv)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		srv.Close()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Serve did not return within 30s of Close")
		}
	})
	return srv, st
}

var spAddr = netip.MustParseAddrPort("192.0.2.1:11111")

func spDial(t *testing.T, peer *stack.Stack) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := peer.DialTCP(ctx, spAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return c
}

// spCounter returns the sockperf counter name of st.
func spCounter(st *Stats, name string) uint64 {
	var v uint64
	st.EachCounter(func(n string, x uint64) {
		if n == name {
			v = x
		}
	})
	return v
}

// spWaitCounter waits until st's counter name is want.
func spWaitCounter(t *testing.T, st *Stats, name string, want uint64) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("%s %d (now %d)", name, want, spCounter(st, name)), func() bool { return spCounter(st, name) == want })
}

// TestSockperfTCPReplies sends a stream of messages as sockperf's client
// would, cut at every awkward place (inside a header, inside a payload,
// several messages in one write), and checks that the server answers
// exactly the client's pong requests that are not warm-ups, each with the
// same bytes but the client flag, in order.
func TestSockperfTCPReplies(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	_, st := spServer(t, rx, Config{})
	c := spDial(t, peer)

	msgs := [][]byte{
		spMsg(1, spPing, 14, 0),
		spMsg(2, spPing, 64, 0),
		spMsg(3, spOneWay, 64, 0), // no reply asked
		spMsg(4, spPing|sockperfFlagWarmup, 64, 0),
		spMsg(5, sockperfFlagPong, 64, 0), // not a client's: never answered
		spMsg(6, spPing, 1400, 0),
		spMsg(7, spPing, SockperfMaxMessage, 0),
		spMsg(8, spPing|0x100, 100, 0), // unknown flags are echoed as they are
		spMsg(1<<60, spPing, 20000, 0),
	}
	var stream, want []byte
	replies := 0
	for _, m := range msgs {
		stream = append(stream, m...)
		f := binary.BigEndian.Uint16(m[8:10])
		if f&sockperfFlagClient != 0 && f&sockperfFlagPong != 0 && f&sockperfFlagWarmup == 0 {
			want = append(want, spReply(m)...)
			replies++
		}
	}
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(want))
		n, err := io.ReadFull(c, b)
		if err != nil {
			t.Errorf("reading replies: %v after %d of %d bytes", err, n, len(want))
		}
		got <- b[:n]
	}()
	// Cuts: one byte, the rest of the first header, into the next
	// one, past it into its payload, then odd sizes and the rest.
	for _, cut := range []int{1, 13, 8, 14 + 64 + 3, 777, 65536, 3, len(stream)} {
		n := min(cut, len(stream))
		if _, err := c.Write(stream[:n]); err != nil {
			t.Fatal(err)
		}
		stream = stream[n:]
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("replies: got %d bytes, want %d, first difference at %d", len(b), len(want), firstDiff(b, want))
	}
	spWaitCounter(t, st, "sockperf_messages", uint64(len(msgs)))
	if r := spCounter(st, "sockperf_replies"); r != uint64(replies) {
		t.Errorf("sockperf_replies: got %d, want %d", r, replies)
	}
	if w := spCounter(st, "sockperf_warmups"); w != 1 {
		t.Errorf("sockperf_warmups: got %d, want 1", w)
	}
	// A connection with nothing pending holds no buffer.
	spWaitCounter(t, st, "server_buf_bytes_current", 0)
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestSockperfTCPMalformed sends, after one good ping, a malformed message
// or the start of one and the end of the stream: the server answers the
// ping, then closes the connection and counts it.
func TestSockperfTCPMalformed(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	_, st := spServer(t, rx, Config{})
	ping := spMsg(9, spPing, 64, 0)
	for i, tc := range []struct {
		name  string
		bad   []byte
		close bool // the client ends its stream after bad
	}{
		{"length 0", spHdr(1, spPing, 0), false},
		{"length 13", spMsg(1, spPing, 14, 13), false},
		{"length past max", spMsg(1, spPing, 14, SockperfMaxMessage+1), false},
		{"length 2^32-1", spMsg(1, spPing, 64, 0xffffffff), false},
		{"truncated header", spMsg(1, spPing, 64, 0)[:9], true},
		{"truncated payload", spMsg(1, spPing, 64, 0)[:40], true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := spDial(t, peer)
			if _, err := c.Write(append(bytes.Clone(ping), tc.bad...)); err != nil {
				t.Fatal(err)
			}
			if tc.close {
				c.(interface{ CloseWrite() error }).CloseWrite()
			}
			b, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("reading to the server's close: %v", err)
			}
			if want := spReply(ping); !bytes.Equal(b, want) {
				t.Errorf("got %d bytes %x, want the ping's reply %x", len(b), b, want)
			}
			spWaitCounter(t, st, "sockperf_bad_conns", uint64(i+1))
		})
	}
	spWaitCounter(t, st, "server_buf_bytes_current", 0)
}

// TestSockperfUDP sends datagrams as sockperf's UDP client does, and
// malformed ones, and checks the replies byte for byte and the counters.
func TestSockperfUDP(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	_, st := spServer(t, rx, Config{})
	pu, err := peer.ListenUDP(netip.MustParseAddrPort("192.0.2.2:5555"))
	if err != nil {
		t.Fatal(err)
	}
	defer pu.Close()
	dst := net.UDPAddrFromAddrPort(spAddr)
	send := func(b []byte) {
		t.Helper()
		if _, err := pu.WriteTo(b, dst); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 65536)
	recv := func() []byte {
		t.Helper()
		pu.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, _, err := pu.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		return buf[:n]
	}
	bad := [][]byte{
		spMsg(1, spPing, 14, 0)[:13],                                // truncated header
		spMsg(1, spPing, 64, 65),                                    // length past the datagram
		spMsg(1, spPing, 64, 63),                                    // length short of it
		spMsg(1, spPing, 64, 13),                                    // below the header's
		spMsg(1, spPing, 64, SockperfMaxMessage+1),                  // past max
		spMsg(1, spPing, 64, 0)[:0],                                 // empty
		append(spMsg(1, spPing, 64, 0), spMsg(2, spPing, 64, 0)...), // two in one
	}
	for _, b := range bad {
		send(b)
	}
	send(spMsg(3, spOneWay, 64, 0))
	send(spMsg(4, spPing|sockperfFlagWarmup, 64, 0))
	send(spMsg(5, sockperfFlagPong, 64, 0))
	for _, m := range [][]byte{spMsg(6, spPing, 14, 0), spMsg(7, spPing, 64, 0), spMsg(8, spPing, 1400, 0), spMsg(9, spPing, 9000, 0)} {
		send(m)
		// The one socket is served in order: a reply means every
		// datagram before it was looked at.
		if got, want := recv(), spReply(m); !bytes.Equal(got, want) {
			t.Fatalf("reply to %d bytes: got %x..., want %x...", len(m), got[:min(len(got), 16)], want[:16])
		}
	}
	for name, want := range map[string]uint64{
		"sockperf_bad_datagrams": uint64(len(bad)),
		"sockperf_messages":      7,
		"sockperf_replies":       4,
		"sockperf_warmups":       1,
		"sockperf_bad_conns":     0,
	} {
		if got := spCounter(st, name); got != want {
			t.Errorf("%s: got %d, want %d", name, got, want)
		}
	}
}

// TestSockperfManyClients runs ping-pong from several TCP and UDP clients
// at once, each checking its own replies.
func TestSockperfManyClients(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	_, st := spServer(t, rx, Config{})
	const clients, rounds = 8, 50
	var wg sync.WaitGroup
	for i := range clients {
		c := spDial(t, peer)
		pu, err := peer.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr("192.0.2.2"), uint16(6000+i)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pu.Close() })
		pu.SetDeadline(time.Now().Add(60 * time.Second))
		wg.Go(func() {
			b := make([]byte, 2000)
			for r := range rounds {
				m := spMsg(uint64(i*rounds+r), spPing, 14+(i*97+r*31)%1400, 0)
				if _, err := c.Write(m); err != nil {
					t.Errorf("client %d: %v", i, err)
					return
				}
				if _, err := io.ReadFull(c, b[:len(m)]); err != nil || !bytes.Equal(b[:len(m)], spReply(m)) {
					t.Errorf("client %d round %d: tcp reply %x (%v), want %x", i, r, b[:min(16, len(m))], err, spReply(m)[:14])
					return
				}
				if _, err := pu.WriteTo(m, net.UDPAddrFromAddrPort(spAddr)); err != nil {
					t.Errorf("client %d: %v", i, err)
					return
				}
				n, _, err := pu.ReadFrom(b)
				if err != nil || !bytes.Equal(b[:n], spReply(m)) {
					t.Errorf("client %d round %d: udp reply %x (%v), want %x", i, r, b[:min(16, n)], err, spReply(m)[:14])
					return
				}
			}
		})
	}
	wg.Wait()
	if got, want := spCounter(st, "sockperf_replies"), uint64(2*clients*rounds); got != want {
		t.Errorf("sockperf_replies: got %d, want %d", got, want)
	}
}

// TestSockperfBuffers checks what a connection holds: a read buffer while
// a partial message is pending, none once it is whole; and that the idle
// timeout closes a connection whose peer stops in the middle of one.
func TestSockperfBuffers(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	_, st := spServer(t, rx, Config{IdleTimeout: 300 * time.Millisecond})
	c := spDial(t, peer)
	m := spMsg(1, spPing, 1000, 0)
	if _, err := c.Write(m[:500]); err != nil {
		t.Fatal(err)
	}
	spWaitCounter(t, st, "server_buf_bytes_current", sockperfBufSize)
	if _, err := c.Write(m[500:]); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, len(m))
	if _, err := io.ReadFull(c, b); err != nil || !bytes.Equal(b, spReply(m)) {
		t.Fatalf("reply: %v", err)
	}
	spWaitCounter(t, st, "server_buf_bytes_current", 0)
	// Stalled in a header: closed by the idle timeout, the buffer given
	// back.
	if _, err := c.Write(m[:7]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(b); !errors.Is(err, io.EOF) {
		t.Fatalf("read after stalling: got %v, want io.EOF (the server's close)", err)
	}
	if got := spCounter(st, "server_idle_timeouts"); got != 1 {
		t.Errorf("server_idle_timeouts: got %d, want 1", got)
	}
	spWaitCounter(t, st, "server_buf_bytes_current", 0)
}

// TestSockperfClose closes the server while clients are connected, one
// in the middle of a message: Serve returns nil, the connections are
// closed and (TestMain) no goroutine is left.
func TestSockperfClose(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	st := new(Stats)
	srv, err := ListenSockperf(rx, spAddr, Config{Stats: st})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	idle, partial := spDial(t, peer), spDial(t, peer)
	if _, err := partial.Write(spMsg(1, spPing, 100, 0)[:50]); err != nil {
		t.Fatal(err)
	}
	spWaitCounter(t, st, "server_buf_bytes_current", sockperfBufSize)
	srv.Close()
	srv.Close() // idempotent
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve after Close: got %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return within 30s of Close")
	}
	for _, c := range []net.Conn{idle, partial} {
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("read on a connection after the server's Close: got nil, want its end")
		}
	}
	if got := spCounter(st, "server_buf_bytes_current"); got != 0 {
		t.Errorf("server_buf_bytes_current after Close: got %d, want 0", got)
	}
}

// spRecorder records what tcpMessages writes.
type spRecorder struct{ bytes.Buffer }

func (*spRecorder) SetWriteDeadline(time.Time) error { return nil }

// spModel is an independent reading of the rules over a whole stream: the
// replies, the number of whole messages before the first malformed one,
// and whether there is one.
func spModel(s []byte) (replies []byte, msgs int, bad bool) {
	for len(s) >= 14 {
		l := int(binary.BigEndian.Uint32(s[10:14]))
		if l < 14 || l > 65507 {
			return replies, msgs, true
		}
		if l > len(s) {
			break
		}
		msgs++
		if f := binary.BigEndian.Uint16(s[8:10]); f&1 != 0 && f&2 != 0 && f&4 == 0 {
			replies = append(replies, s[:l]...)
			replies[len(replies)-l+9] &^= 1
		}
		s = s[l:]
	}
	return replies, msgs, false
}

// FuzzSockperfStream feeds a byte stream, read in chunks of the given
// size as the TCP handler reads it (compacting its buffer between reads),
// to the server's framing, and checks it against spModel: the same
// replies, messages and verdict; no panic and nothing past the buffer
// whatever the stream says.
func FuzzSockperfStream(f *testing.F) {
	f.Add(spMsg(1, spPing, 64, 0), uint16(64))
	f.Add(append(spMsg(1, spPing, 14, 0), spMsg(2, spOneWay, 100, 0)...), uint16(3))
	f.Add(append(spMsg(1, spPing|sockperfFlagWarmup, 20, 0), spMsg(2, spPing, 14, 13)...), uint16(1000))
	f.Add(spMsg(1, spPing, 3000, 0), uint16(1))
	f.Fuzz(func(t *testing.T, stream []byte, chunk uint16) {
		if chunk == 0 {
			chunk = 1
		}
		st := new(Stats)
		srv := &SockperfServer{st: st}
		var w spRecorder
		buf := new([sockperfBufSize]byte)
		end, bad := 0, false
		for s := stream; len(s) > 0 && !bad; {
			n := copy(buf[end:min(end+int(chunk), len(buf))], s)
			s = s[n:]
			end += n
			var start int
			var err error
			start, bad, err = srv.tcpMessages(&w, buf[:end], 0)
			if err != nil {
				t.Fatal(err)
			}
			if start > end {
				t.Fatalf("start %d past end %d", start, end)
			}
			end = copy(buf[:], buf[start:end])
			if !bad && end >= SockperfMaxMessage+1 {
				t.Fatalf("%d bytes pending, more than a message", end)
			}
		}
		replies, msgs, wantBad := spModel(stream)
		if bad != wantBad {
			t.Errorf("malformed: got %v, want %v", bad, wantBad)
		}
		if !bytes.Equal(w.Bytes(), replies) {
			t.Errorf("replies: got %d bytes, want %d", w.Len(), len(replies))
		}
		if got := st.sockperfMessages.Load(); got != uint64(msgs) {
			t.Errorf("messages: got %d, want %d", got, msgs)
		}
	})
}

// spDiscard takes replies and drops them.
type spDiscard struct{ n int }

func (w *spDiscard) Write(b []byte) (int, error)    { w.n += len(b); return len(b), nil }
func (*spDiscard) SetWriteDeadline(time.Time) error { return nil }

// TestSockperfFramingAllocs pins the server's per-message work (framing,
// the reply rule, the reply's write) at zero heap allocations.
func TestSockperfFramingAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts need a build without -race and coverage")
	}
	srv := &SockperfServer{st: new(Stats)}
	var stream []byte
	for i := range 8 {
		stream = append(stream, spMsg(uint64(i), spPing, 64, 0)...)
		stream = append(stream, spMsg(uint64(i), spOneWay, 1400, 0)...)
	}
	buf := new([sockperfBufSize]byte)
	w := new(spDiscard)
	if a := testing.AllocsPerRun(500, func() {
		n := copy(buf[:], stream)
		if start, bad, err := srv.tcpMessages(w, buf[:n], time.Minute); start != n || bad || err != nil {
			t.Fatalf("tcpMessages: got (%d, %v, %v), want (%d, false, nil)", start, bad, err, n)
		}
	}); a != 0 {
		t.Errorf("tcpMessages: got %v allocations a run, want 0", a)
	}
	if w.n == 0 {
		t.Fatal("no replies written")
	}
}
