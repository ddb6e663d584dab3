package stack_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/internal/testutil"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/stacktest"
)

var delackAddrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}

// delackPair is a receiver with Config.DelayedACK hold and a peer, and a
// connection from the peer to a listener of the receiver's, with the
// receiver's end of it.
func delackPair(t *testing.T, hold time.Duration) (rx, peer *stack.Stack, client, server net.Conn) {
	t.Helper()
	rx, peer = stacktest.NewPair(t, stack.Config{Addrs: delackAddrs, DelayedACK: hold},
		stack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
	client, server = connectPair(t, peer, rx, netip.MustParseAddrPort("192.0.2.1:7300"))
	client.SetDeadline(time.Now().Add(60 * time.Second))
	server.SetDeadline(time.Now().Add(60 * time.Second))
	return rx, peer, client, server
}

// connectPair connects dialer to a listener of lst's on ap and returns
// both ends; cleanup closes them and the listener.
func connectPair(t *testing.T, dialer, lst *stack.Stack, ap netip.AddrPort) (dialed, accepted net.Conn) {
	t.Helper()
	l, err := lst.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(acc)
			return
		}
		acc <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dialed, err = dialer.DialTCP(ctx, ap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dialed.Close() })
	accepted = <-acc
	if accepted == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { accepted.Close() })
	return dialed, accepted
}

func counter(s *stack.Stack, name string) uint64 {
	return stacktest.Counters(s.EachCounter)[name]
}

// TestDelayedACKRequestResponse: 200 request/response exchanges of 64
// bytes. Without delayed ACKs gVisor sends two segments per request (its
// ACK, then the reply); with them the reply carries the ACK: one.
func TestDelayedACKRequestResponse(t *testing.T) {
	const n = 200
	for _, hold := range []time.Duration{0, 5 * time.Millisecond} {
		rx, _, client, server := delackPair(t, hold)
		go func() {
			buf := make([]byte, 64)
			for {
				if _, err := io.ReadFull(server, buf); err != nil {
					return
				}
				if _, err := server.Write(buf); err != nil {
					return
				}
			}
		}()
		req, resp := make([]byte, 64), make([]byte, 64)
		sent0 := counter(rx, "tx_packets") // what went on the wire
		for i := 0; i < n; i++ {
			req[0] = byte(i)
			if _, err := client.Write(req); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(client, resp); err != nil {
				t.Fatal(err)
			}
			if resp[0] != byte(i) {
				t.Fatalf("reply %d: got %d", i, resp[0])
			}
		}
		per := float64(counter(rx, "tx_packets")-sent0) / n
		saved := counter(rx, "tcp_delack_saved")
		t.Logf("hold %v: %.2f segments sent per exchange, tcp_delack_saved %d", hold, per, saved)
		if hold == 0 && per < 1.8 {
			t.Errorf("without delayed ACKs: %.2f segments per exchange, want about 2 (ACK and reply)", per)
		}
		if hold > 0 && (per > 1.3 || saved < n/2) {
			t.Errorf("with delayed ACKs: %.2f segments per exchange, tcp_delack_saved %d; want about 1 and most of %d", per, saved, n)
		}
	}
}

// TestDelayedACKTimeout: a flow that has sent data (so its ACKs may be
// held) receives data it does not answer: the held ACKs go out when their
// time is up (tcp_delack_timeouts), and the peer, whose writes need them,
// keeps going: 64 KB arrive in 1 KB writes.
func TestDelayedACKTimeout(t *testing.T) {
	rx, _, client, server := delackPair(t, 2*time.Millisecond)
	if _, err := server.Write([]byte("hello")); err != nil { // pingpong: the server has sent data
		t.Fatal(err)
	}
	if _, err := io.ReadFull(client, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	seg0, tx0 := counter(rx, "tcp_segments_sent"), counter(rx, "tx_packets")
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(server, make([]byte, 64<<10))
		done <- err
	}()
	for i := 0; i < 64; i++ {
		if _, err := client.Write(make([]byte, 1024)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			testutil.WaitFor(t, "an ACK held", func() bool { return counter(rx, "tcp_delack_held") > 0 })
			testutil.WaitFor(t, "the held ACK sent by the timer", func() bool { return counter(rx, "tcp_delack_timeouts") > 0 })
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Every held ACK is resolved once the timer has run: then what went on
	// the wire is what gVisor sent less the ACKs a later segment made
	// redundant; a held ACK the timer dropped would be missing.
	resolved := func() bool {
		return counter(rx, "tcp_delack_held") == counter(rx, "tcp_delack_saved")+counter(rx, "tcp_delack_replaced")+
			counter(rx, "tcp_delack_flushed")+counter(rx, "tcp_delack_timeouts")
	}
	testutil.WaitFor(t, "every held ACK resolved", resolved)
	// gVisor counts a segment after the link endpoint wrote it, so a
	// window update still on its way out (sent at once) is on the wire
	// before it is in tcp_segments_sent: wait for the two to agree.
	testutil.WaitFor(t, "the wire to be gVisor's segments less the redundant ACKs", func() bool {
		seg, tx := counter(rx, "tcp_segments_sent")-seg0, counter(rx, "tx_packets")-tx0
		return tx == seg-(counter(rx, "tcp_delack_saved")+counter(rx, "tcp_delack_replaced"))
	})
	// (Not checked: the peer's retransmissions. gVisor's tail loss probe
	// fires after 2*SRTT, tens of microseconds here, with no floor, so a
	// delayed ACK makes it probe; Linux's probe waits at least 10 ms.)
	if counter(rx, "tcp_delack_held") == 0 || counter(rx, "tcp_delack_timeouts") == 0 {
		t.Errorf("tcp_delack_held %d, tcp_delack_timeouts %d: want ACKs held and sent by the timer",
			counter(rx, "tcp_delack_held"), counter(rx, "tcp_delack_timeouts"))
	}
}

// TestDelayedACKBulkReceiver: a flow that never sends data is never held.
func TestDelayedACKBulkReceiver(t *testing.T) {
	rx, _, client, server := delackPair(t, 5*time.Millisecond)
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(server, make([]byte, 4<<20))
		done <- err
	}()
	buf := make([]byte, 64<<10)
	for i := 0; i < 64; i++ {
		if _, err := client.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if h := counter(rx, "tcp_delack_held"); h != 0 {
		t.Errorf("tcp_delack_held %d on a receive-only flow, want 0", h)
	}
}
