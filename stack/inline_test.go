//go:build !stockgvisor

package stack

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// Config.InlineTCP: gVisor's TCP (patched, internal/gvisor) processes a
// connected socket's segment in the goroutine that delivers it, as
// tcp_v4_rcv runs tcp_v4_do_rcv in softirq, unless the application holds
// the socket: then the segment waits, as in the socket backlog, until
// UnlockUser hands it to a processor (release_sock).

// The inline rig's addresses and ports: the stack's, and the test's, which
// plays the peer with frames of its own.
var (
	inlineRxMAC   = tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 1})
	inlinePeerMAC = tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 2})
	inlineRx      = tcpip.AddrFrom4([4]byte{192, 0, 2, 1})
	inlinePeer    = tcpip.AddrFrom4([4]byte{192, 0, 2, 2})
)

const (
	inlinePort     = 7300  // the stack's listener
	inlinePeerPort = 40000 // the test's end
)

// inlineRig is a stack on one end of an in-memory wire, the test on the
// other, and one TCP connection the test opened with a SYN and an ACK of
// its own through the wire (so through the poll loop): the accepted
// TCPConn, its gVisor endpoint, and the sequence numbers of both sides.
type inlineRig struct {
	s        *Stack
	far      *driver.MemWire
	c        *TCPConn
	ep       *tcp.Endpoint
	seq, ack uint32 // the test's next sequence number; the stack's
	fbuf     []byte
	synOpts  []byte     // the test's SYN options (nil: MSS 1460)
	synAck   header.TCP // the stack's SYN-ACK
}

// batchData delivers the next 100 bytes of data (byte 'a'+i) into the
// inline batch inl, as a poll batch does, and returns them.
func (r *inlineRig) batchData(inl *inlineBatch, i int) []byte {
	p := bytes.Repeat([]byte{byte('a' + i)}, 100)
	r.s.ep.dispatch(buffer.MakeWithData(r.frame(header.TCPFlagAck|header.TCPFlagPsh, r.seq, r.ack, p)), rxMeta{inl: inl})
	r.seq += uint32(len(p))
	return p
}

// newInlineRig builds the rig, Config.InlineTCP set to inline. The TCP
// memory governor is off (TCPMemLimit < 0): only the test and gVisor touch
// the endpoint.
func newInlineRig(t *testing.T, inline bool) *inlineRig {
	t.Helper()
	return newInlineRigWith(t, Config{InlineTCP: inline}, nil)
}

// newInlineRigWith is newInlineRig with cfg (its wire, MAC, addresses and
// TCPMemLimit are the rig's) and the test's SYN carrying synOpts (nil: MSS
// 1460).
func newInlineRigWith(t *testing.T, cfg Config, synOpts []byte) *inlineRig {
	t.Helper()
	a, far := driver.NewMemPair(64, 0)
	cfg.Wire, cfg.MAC, cfg.TCPMemLimit = a, [6]byte([]byte(inlineRxMAC)), -1
	cfg.Addrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}
	s, err := New(cfg)
	if err != nil {
		far.Close()
		t.Fatal(err)
	}
	r := &inlineRig{s: s, far: far, fbuf: make([]byte, driver.VirtioNetHdrLen+65535+18), synOpts: synOpts}
	t.Cleanup(func() {
		s.Close()
		far.Close()
	})
	if e := s.ip.AddStaticNeighbor(nicID, ipv4.ProtocolNumber, inlinePeer, inlinePeerMAC); e != nil {
		t.Fatal(e)
	}
	l, err := s.ListenTCP(netip.MustParseAddrPort("192.0.2.1:7300"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const irs = 1000
	r.write(t, header.TCPFlagSyn, irs, 0, nil)
	var synAck header.TCP
	testutil.WaitFor(t, "the SYN-ACK", func() bool {
		synAck = r.next()
		return synAck != nil && synAck.Flags() == header.TCPFlagSyn|header.TCPFlagAck
	})
	r.synAck = append(header.TCP(nil), synAck...)
	r.seq, r.ack = irs+1, synAck.SequenceNumber()+1
	r.write(t, header.TCPFlagAck, r.seq, r.ack, nil)
	acc := make(chan *TCPConn, 1)
	go func() {
		c, err := l.(*TCPListener).AcceptTCP()
		if err != nil {
			close(acc)
			return
		}
		acc <- c
	}()
	var ok bool
	testutil.WaitFor(t, "the accepted connection", func() bool {
		select {
		case r.c, ok = <-acc:
			return true
		default:
			return false
		}
	})
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { r.c.Close() })
	r.ep = r.c.ep.(*tcp.Endpoint)
	r.drain()
	return r
}

// frame is a segment of the test's end of the connection: an Ethernet
// frame with full checksums.
func (r *inlineRig) frame(flags header.TCPFlags, seq, ack uint32, payload []byte) []byte {
	f := testutil.Frame{SrcMAC: inlinePeerMAC, DstMAC: inlineRxMAC, Src: inlinePeer, Dst: inlineRx,
		SrcPort: inlinePeerPort, DstPort: inlinePort, Seq: seq, Ack: ack, Flags: flags, Window: 0xffff, Payload: payload}
	if flags&header.TCPFlagSyn != 0 {
		f.TCPOptions = []byte{2, 4, 0x05, 0xb4} // MSS 1460
		if r.synOpts != nil {
			f.TCPOptions = r.synOpts
		}
	}
	return f.Build()
}

// write sends a segment through the wire, behind a virtio-net header of
// zeros: the poll loop delivers it.
func (r *inlineRig) write(t *testing.T, flags header.TCPFlags, seq, ack uint32, payload []byte) {
	t.Helper()
	b := append(make([]byte, driver.VirtioNetHdrLen), r.frame(flags, seq, ack, payload)...)
	if err := r.far.Write(b); err != nil {
		t.Fatal(err)
	}
}

// deliver hands a data segment to the link endpoint's delivery (Deliver's
// stage 10, the call to gVisor's NIC) in the calling goroutine, as the
// poll loop does, and advances the test's sequence number.
func (r *inlineRig) deliver(payload []byte) {
	r.s.ep.dispatch(buffer.MakeWithData(r.frame(header.TCPFlagAck|header.TCPFlagPsh, r.seq, r.ack, payload)), rxMeta{})
	r.seq += uint32(len(payload))
}

// next returns the next segment the stack wrote to the wire for the
// connection, or nil if none is there (frames of other flows are skipped).
func (r *inlineRig) next() header.TCP {
	for {
		n, err := r.far.Read(r.fbuf, false)
		if err != nil {
			return nil
		}
		f := r.fbuf[driver.VirtioNetHdrLen:n]
		if len(f) < header.EthernetMinimumSize+header.IPv4MinimumSize || header.Ethernet(f).Type() != ipv4.ProtocolNumber {
			continue
		}
		ip := header.IPv4(f[header.EthernetMinimumSize:])
		if ip.TransportProtocol() != tcp.ProtocolNumber || len(ip) < int(ip.HeaderLength())+header.TCPMinimumSize {
			continue
		}
		seg := header.TCP(ip[ip.HeaderLength():])
		if seg.SourcePort() == inlinePort && seg.DestinationPort() == inlinePeerPort {
			return seg
		}
	}
}

// drain drops what the stack wrote so far.
func (r *inlineRig) drain() {
	for r.next() != nil {
	}
}

// acked reports whether the stack wrote an ACK of the test's bytes up to
// r.seq (reading the wire's segments on the way).
func (r *inlineRig) acked() bool {
	for seg := r.next(); seg != nil; seg = r.next() {
		if seg.Flags().Contains(header.TCPFlagAck) && seg.AckNumber() == r.seq {
			return true
		}
	}
	return false
}

// TestInlineTCPInDeliveringGoroutine: with gVisor's processor goroutines
// paused, a data segment handed to the link endpoint with InlineTCP on is
// readable, and acknowledged on the wire, when the delivering call
// returns: TCP ran in the caller. With it off the segment waits for a
// processor, and arrives once they resume.
func TestInlineTCPInDeliveringGoroutine(t *testing.T) {
	for _, inline := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[inline], func(t *testing.T) {
			r := newInlineRig(t, inline)
			want := []byte("in the softirq")
			r.s.ip.Pause() // every processor waits for Resume
			resumed := false
			resume := func() {
				if !resumed {
					r.s.ip.Resume()
					resumed = true
				}
			}
			defer resume() // before Close: a paused processor never ends
			r.deliver(want)
			buf := make([]byte, 64)
			n, err := r.c.TryRead(buf)
			if err != nil {
				t.Fatal(err)
			}
			if inline {
				if !bytes.Equal(buf[:n], want) {
					t.Fatalf("InlineTCP on, processors paused: read %q right after the delivery, want %q", buf[:n], want)
				}
				if !r.acked() {
					t.Errorf("InlineTCP on: no ACK of the data on the wire when the delivery returned")
				}
				return
			}
			if n != 0 || r.c.Readable() {
				t.Fatalf("InlineTCP off, processors paused: read %q, readable %v after the delivery, want nothing yet", buf[:n], r.c.Readable())
			}
			resume()
			testutil.WaitFor(t, "the processor's delivery", r.c.Readable)
			if n, err = r.c.TryRead(buf); err != nil || !bytes.Equal(buf[:n], want) {
				t.Fatalf("InlineTCP off, processors resumed: read %q, %v, want %q", buf[:n], err, want)
			}
		})
	}
}

// TestInlineTCPBatch: with processors paused, segments delivered with an
// inline batch are queued and not processed (nothing readable, no ACK)
// until the batch runs at its end (runInline, as Flush does); then all of
// them are readable in order and acknowledged by one ACK, where delivered
// one by one each gets its own.
func TestInlineTCPBatch(t *testing.T) {
	r := newInlineRig(t, true)
	r.s.ip.Pause()
	defer r.s.ip.Resume()
	r.drain()
	var inl inlineBatch
	var want []byte
	for i := range 4 {
		want = append(want, r.batchData(&inl, i)...)
	}
	if r.c.Readable() || inl.Len() != 1 {
		t.Fatalf("before the batch ran: readable %v, %d endpoints in the batch; want false, 1", r.c.Readable(), inl.Len())
	}
	if seg := r.next(); seg != nil {
		t.Fatalf("before the batch ran: a segment left (ack %d)", seg.AckNumber())
	}
	runInline(&inl)
	buf := make([]byte, 1024)
	n, err := r.c.TryRead(buf)
	if err != nil || !bytes.Equal(buf[:n], want) {
		t.Fatalf("after the batch ran: read %q, %v; want %q", buf[:n], err, want)
	}
	acks := 0
	for seg := r.next(); seg != nil; seg = r.next() {
		if seg.Flags().Contains(header.TCPFlagAck) {
			acks++
			if seg.AckNumber() != r.seq {
				t.Errorf("ACK of %d, want one of everything (%d)", seg.AckNumber(), r.seq)
			}
		}
	}
	if acks != 1 || inl.Len() != 0 {
		t.Errorf("%d ACKs after the batch, %d endpoints left in it; want 1 and 0", acks, inl.Len())
	}
}

// TestInlineTCPBacklog: while the application holds the endpoint
// (LockUser, as gVisor's Read and Write do), a segment delivered with
// InlineTCP on is left queued: the delivery returns, nothing is readable
// and no ACK leaves. UnlockUser hands it to a processor, as release_sock
// processes the socket backlog, and the data arrives.
func TestInlineTCPBacklog(t *testing.T) {
	r := newInlineRig(t, true)
	want := []byte("to the backlog")
	func() {
		r.ep.LockUser() // the application's, until the segment was delivered
		defer r.ep.UnlockUser()
		done := make(chan struct{})
		go func() {
			r.deliver(want)
			close(done)
		}()
		testutil.WaitFor(t, "the delivery to return while the application holds the socket", func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		})
		if r.c.Readable() {
			t.Fatal("the segment was processed while the application held the socket")
		}
		if r.acked() {
			t.Fatal("the data was acknowledged while the application held the socket")
		}
	}()
	testutil.WaitFor(t, "the backlog's processing after UnlockUser", r.c.Readable)
	buf := make([]byte, 64)
	if n, err := r.c.TryRead(buf); err != nil || !bytes.Equal(buf[:n], want) {
		t.Fatalf("read %q, %v, want %q", buf[:n], err, want)
	}
	testutil.WaitFor(t, "the ACK of the data", r.acked)
}

// inlinePair is two stacks with InlineTCP on, on the two ends of an
// in-memory wire.
func inlinePair(t *testing.T) (rx, peer *Stack) {
	t.Helper()
	cfg := Config{InlineTCP: true, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64")}}
	return newPair(t, cfg, Config{InlineTCP: true, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24"), netip.MustParsePrefix("2001:db8::2/64")}})
}

// TestInlineTCPBulk: streams between two stacks with InlineTCP on, over
// IPv4 and IPv6, and over the loopback interface, whose sends deliver in
// the sender's goroutine (so one endpoint's processing nests the other's),
// arrive whole (SHA-256).
func TestInlineTCPBulk(t *testing.T) {
	rx, peer := inlinePair(t)
	var opt tcpip.TCPInlineProcessingOption
	if e := rx.ip.TransportProtocolOption(tcp.ProtocolNumber, &opt); e != nil || !opt {
		t.Fatalf("gVisor's TCPInlineProcessingOption: %v, %v; want true", opt, e)
	}
	bulkTo(t, rx, peer, netip.MustParseAddrPort("192.0.2.1:5001"), 16<<20)
	bulkTo(t, rx, peer, netip.MustParseAddrPort("[2001:db8::1]:5002"), 4<<20)
	bulkTo(t, rx, rx, netip.MustParseAddrPort("127.0.0.1:5003"), 8<<20)
	bulkTo(t, peer, rx, netip.MustParseAddrPort("192.0.2.2:5004"), 4<<20)
}

// TestInlineTCPTeardown: with InlineTCP on, segments that end a connection
// are processed inline too: the last ACK of a graceful close (LAST_ACK to
// CLOSED) and a RST both unregister the endpoint from gVisor's demuxer,
// which must not hold its lock meanwhile (the patch processes after the
// demuxer let go). Each is waited for on the endpoint that processes it,
// and a stream after it shows the stacks still deliver; over the wire and
// over the loopback interface.
func TestInlineTCPTeardown(t *testing.T) {
	rx, peer := inlinePair(t)
	for i, tc := range []struct {
		name   string
		dialer *Stack
		addr   netip.AddrPort
		abort  bool // the listener's side resets (linger 0); else the dialer closes first
	}{
		{"wire graceful", peer, netip.MustParseAddrPort("192.0.2.1:5101"), false},
		{"wire reset", peer, netip.MustParseAddrPort("192.0.2.1:5102"), true},
		{"loopback graceful", rx, netip.MustParseAddrPort("127.0.0.1:5103"), false},
		{"loopback reset", rx, netip.MustParseAddrPort("127.0.0.1:5104"), true},
	} {
		d, a := connectPairOn(t, tc.dialer, rx, tc.addr)
		if _, err := d.Write([]byte("bye")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 3)
		if _, err := io.ReadFull(a, buf); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.abort {
			// The dialer's endpoint processes the RST: resetConnectionLocked.
			a.(*TCPConn).SetLinger(0)
			a.Close()
			testutil.WaitFor(t, tc.name+": the dialer's endpoint reset", func() bool { return tcpState(d) == tcp.StateError })
			if _, err := d.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("%s: the dialer's read after the reset: %v, want ECONNRESET", tc.name, err)
			}
			d.Close()
		} else {
			// The listener's endpoint processes the last ACK: LAST_ACK
			// to CLOSED (transitionToStateCloseLocked).
			d.Close()
			a.SetReadDeadline(time.Now().Add(60 * time.Second))
			if _, err := a.Read(buf); !errors.Is(err, io.EOF) {
				t.Fatalf("%s: the listener's read after the FIN: %v, want EOF", tc.name, err)
			}
			a.Close()
			testutil.WaitFor(t, tc.name+": the listener's endpoint closed by the last ACK", func() bool { return tcpState(a) == tcp.StateClose })
		}
		bulkTo(t, rx, tc.dialer, netip.AddrPortFrom(tc.addr.Addr(), uint16(5200+i)), 1<<20)
	}
}

// tcpState is the state of c's gVisor endpoint.
func tcpState(c net.Conn) tcp.EndpointState {
	return c.(*TCPConn).ep.(*tcp.Endpoint).EndpointState()
}

// connectPairOn is connectPair (delack_ext_test.go) inside the package:
// a connection from dialer to a listener of lst at ap.
func connectPairOn(t *testing.T, dialer, lst *Stack, ap netip.AddrPort) (dialed, accepted net.Conn) {
	t.Helper()
	l, err := lst.ListenTCP(ap)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(acc)
			return
		}
		acc <- c
	}()
	dialed, err = dialer.DialTCP(t.Context(), ap)
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

// TestInlineTCPRound: a poll batch that used its budget with more in the
// ring (Flush(more)) leaves its connections in the inline batch, neither
// processed nor acknowledged, until the softirq round ends: the ring
// drained, or netdevBudget packets polled since the batch last ran.
func TestInlineTCPRound(t *testing.T) {
	r := newInlineRig(t, true)
	r.s.ip.Pause()
	defer r.s.ip.Resume()
	r.drain()
	var inl inlineBatch
	var want []byte
	send := func(i int) { want = append(want, r.batchData(&inl, i)...) }
	acks := func() (n int) {
		for seg := r.next(); seg != nil; seg = r.next() {
			if seg.Flags().Contains(header.TCPFlagAck) {
				n++
				if seg.AckNumber() != r.seq {
					t.Errorf("ACK of %d, want one of everything (%d)", seg.AckNumber(), r.seq)
				}
			}
		}
		return n
	}
	buf := make([]byte, 4096)
	for _, end := range []struct {
		name string
		pkts int
		more bool
	}{
		{"ring drained", 2, false},
		{"netdev_budget polled", netdevBudget - 1, true},
	} {
		send(0)
		left := 1
		if end.more {
			// Budget used, more waiting, fewer packets than a round.
			if left = endRound(&inl, end.pkts, true); left != end.pkts || r.c.Readable() || acks() != 0 {
				t.Fatalf("%s: a batch with more to poll ran the connection (left %d, want %d)", end.name, left, end.pkts)
			}
			send(1)
			left++
		}
		if got := endRound(&inl, left, end.more); got != 0 {
			t.Fatalf("%s: %d packets left after the round's end, want 0", end.name, got)
		}
		n, err := r.c.TryRead(buf)
		if err != nil || !bytes.Equal(buf[:n], want) {
			t.Fatalf("%s: read %q, %v; want %q", end.name, buf[:n], err, want)
		}
		want = want[:0]
		if got := acks(); got != 1 || inl.Len() != 0 {
			t.Errorf("%s: %d ACKs, %d endpoints left; want 1 and 0", end.name, got, inl.Len())
		}
	}
}
