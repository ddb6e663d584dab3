package stack

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
)

// TrainConn receives the UDP datagrams sent to one local port as GRO
// trains: one read returns the payloads of several same-size datagrams back
// to back, with their segment size, as a Linux UDP socket with the UDP_GRO
// option returns them with a UDP_GRO control message. Trains bypass gVisor's
// UDP endpoint (which takes one datagram per packet); a TrainConn only
// receives.
//
// The receive queue holds the trains themselves, zero-copy: their payload
// stays in the RX pages, and each queued train keeps its pages referenced
// until ReadTrain copies it out (that is what keeps a page in the pool's
// quarantine while a socket has not been read). The queue is bounded in
// bytes of RX memory, as __udp_enqueue_schedule_skb charges each skb's
// truesize against sk_rcvbuf: a train is charged what its packets pin
// (driver.Driver.Truesize: a 64-byte datagram on the linear RQ pins its
// 2 KB stride, a page with XDP), which a GRO train accumulates per merged
// frame, and is dropped and counted (Drops) if the queue already holds
// more than the receive buffer (SetReadBuffer; DefaultTrainReadBuffer), as
// a socket with a full receive buffer drops. So what an unread socket can
// pin is bounded in memory whatever the packets' layout, and with GRO off,
// one datagram per train, the socket holds as many bytes as with GRO on.
// The queue also holds at most trainQueueDatagrams trains.
type TrainConn struct {
	s      *Stack
	port   uint16
	addr   netip.Addr // the local address bound, or unspecified
	ready  chan queuedTrain
	done   chan struct{}
	closed sync.Once
	drops  atomic.Uint64
	// rmem is the truesize of the trains queued (sk_rmem_alloc): added
	// when a train is queued, taken off when it is read or released.
	rmem atomic.Int64
	// rcvbuf bounds rmem (sk_rcvbuf).
	rcvbuf atomic.Int64
	// segs is the datagrams queued, moved with rmem: what tests and
	// BenchmarkUDPRead wait on, since rmem counts bytes.
	segs atomic.Int64
	// b is ReadTrain's and the batch calls' state (udpbatch.go).
	b  batchState
	tx udpSender
}

// trainQueueDatagrams bounds the trains a TrainConn's queue holds (its
// channel's size): 64 full trains of UDP_GRO_CNT_MAX (64) datagrams.
const trainQueueDatagrams = 64 * 64

// Receive buffer sizes of a TrainConn, in bytes of truesize (sk_rcvbuf).
const (
	// DefaultTrainReadBuffer is a TrainConn's receive buffer until
	// SetReadBuffer: 4 MiB, what SO_RCVBUF of 2 MiB gives a Linux socket
	// (the kernel doubles it). Linux's own default, rmem_default, is
	// 208 KiB; a train socket is for bulk UDP, whose users raise it
	// (quic-go asks for 7 MiB).
	DefaultTrainReadBuffer = 4 << 20
	// MaxTrainReadBuffer bounds SetReadBuffer, as net.core.rmem_max
	// bounds SO_RCVBUF.
	MaxTrainReadBuffer = 256 << 20
	// minTrainReadBuffer is SOCK_MIN_RCVBUF.
	minTrainReadBuffer = 2304
)

// ListenUDPTrains binds a train socket to addr (an unspecified address
// takes every address of the stack, its subnets' broadcast addresses and
// the groups it joined, never another host's: see localAddrs). The port
// must not be bound by another TrainConn; a gVisor UDP socket on the same
// port receives nothing while the TrainConn is open but the datagrams that
// came as IP fragments, which gVisor reassembles.
func (s *Stack) ListenUDPTrains(addr netip.AddrPort) (*TrainConn, error) {
	if addr.Port() == 0 {
		return nil, errors.New("listen udp trains: port 0")
	}
	if s.drv == nil {
		return nil, errors.New("listen udp trains: the stack has no ustack driver")
	}
	c := &TrainConn{
		s: s, port: addr.Port(), addr: addr.Addr().Unmap(),
		ready: make(chan queuedTrain, trainQueueDatagrams),
		done:  make(chan struct{}),
	}
	c.b.rsem = make(chan struct{}, 1)
	c.rcvbuf.Store(DefaultTrainReadBuffer)
	if err := s.ep.trains.add(c); err != nil {
		return nil, fmt.Errorf("listen udp trains %s: %w", addr, err)
	}
	return c, nil
}

// ReadTrain waits for a train and copies its payload into b (truncated to
// len(b)). It returns the payload length, the size of each datagram in it
// (the last one may be shorter), and the sender. After Close it returns
// net.ErrClosed; past a deadline, os.ErrDeadlineExceeded. If a ReadBatch
// left a train read in part, ReadTrain returns the rest of it first.
func (c *TrainConn) ReadTrain(b []byte, deadline time.Time) (n, segSize int, from netip.AddrPort, err error) {
	if err := c.lockRead(deadline); err != nil {
		return 0, 0, netip.AddrPort{}, err
	}
	defer c.unlockRead()
	c.busyWait(deadline)
	if err := c.next(deadline, true); err != nil {
		return 0, 0, netip.AddrPort{}, err
	}
	t := &c.b
	left := t.total - t.off
	n = t.consume([][]byte{b}, left)
	segSize, from = min(t.segLen, max(left, 1)), t.from
	if left == 0 {
		segSize = 0
	}
	c.releaseCur()
	return n, segSize, from, nil
}

// SetReadBuffer sets the receive buffer to twice bytes, as SO_RCVBUF does
// on Linux (the doubling leaves room for the packets' overhead), between
// SOCK_MIN_RCVBUF and MaxTrainReadBuffer: the truesize of the trains the
// queue may hold before it drops. It is net.UDPConn.SetReadBuffer's
// counterpart.
func (c *TrainConn) SetReadBuffer(bytes int) error {
	if bytes < 0 {
		return fmt.Errorf("set read buffer %d: want >= 0", bytes)
	}
	rcvbuf := min(2*min(bytes, MaxTrainReadBuffer), MaxTrainReadBuffer)
	c.rcvbuf.Store(int64(max(rcvbuf, minTrainReadBuffer)))
	return nil
}

// Drops returns the trains dropped because the queue was full.
func (c *TrainConn) Drops() uint64 { return c.drops.Load() }

// Close unbinds the port, wakes a blocked ReadTrain and releases the
// trains still queued.
func (c *TrainConn) Close() error {
	c.closed.Do(func() {
		c.s.ep.trains.remove(c)
		close(c.done)
		for drained := false; !drained; {
			select {
			case q := <-c.ready:
				q.p.Release()
			default:
				drained = true
			}
		}
		// A reader holding the read lock sees done and lets it go.
		c.b.rsem <- struct{}{}
		c.releaseCur()
		<-c.b.rsem
		c.tx.close()
	})
	return nil
}

// trainTable maps local UDP ports to train sockets. It is read by the poll
// loop for every UDP packet, so reads take no lock: writers publish a new
// map, after the stack's local addresses (local), which a reader that
// found a map may read.
type trainTable struct {
	mu    sync.Mutex
	m     atomic.Pointer[map[uint16]*TrainConn]
	local atomic.Pointer[localAddrs]
	drv   *driver.Driver // the packets' driver, for their truesize; set before use
	l3    bool           // the packets are a TUN's, without an Ethernet header
	pcap  *PcapWriter    // Config.Pcap, or nil; set before use
	// malformed counts the UDP packets dropped for a UDP length under 8
	// or past the IP payload, or a train of more than
	// driver.UDPMaxSegments datagrams, by deliver and splitUDP
	// (udp_malformed, with gVisor's own).
	malformed atomic.Uint64
}

func (t *trainTable) l2Len() int { return linkLen(t.l3) }

func (t *trainTable) add(c *TrainConn) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.m.Load()
	m := map[uint16]*TrainConn{}
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	if _, ok := m[c.port]; ok {
		return errors.New("port in use")
	}
	m[c.port] = c
	// The addresses as they are now: those of Config (the wire's and the
	// tunnel's) and any added to gVisor since.
	t.local.Store(newLocalAddrs(c.s.ip.AllAddresses()))
	t.m.Store(&m)
	return nil
}

func (t *trainTable) remove(c *TrainConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.m.Load()
	if old == nil {
		return
	}
	m := map[uint16]*TrainConn{}
	for k, v := range *old {
		if v != c {
			m[k] = v
		}
	}
	t.m.Store(&m)
}

// deliver hands p to a train socket if one is bound to its destination, and
// reports whether it did (then p has been released). The socket gets what
// udp4_lib_lookup would give it after ip_route_input: a UDP packet, not a
// fragment (udpHeaders), for one of the stack's addresses, broadcast
// addresses or groups (localAddrs), and the socket's address if it is
// bound to one. A packet for the socket whose UDP length is wrong
// (udpPayloadLen), or a train of more than driver.UDPMaxSegments
// datagrams, is dropped and counted instead.
func (t *trainTable) deliver(p *bufpool.Packet) bool {
	var u rxUDP
	return t.deliverUDP(p, &u)
}

// deliverUDP is deliver with the UDP headers found once for Deliver's
// stages (u, rxUDP: found here if nobody did yet).
func (t *trainTable) deliverUDP(p *bufpool.Packet, u *rxUDP) bool {
	mp := t.m.Load()
	if mp == nil || len(*mp) == 0 {
		return false
	}
	l3, l4, ok := u.headers(p, t.l2Len())
	if !ok {
		return false
	}
	l := p.Linear
	c := (*mp)[header.UDP(l[l4:]).DestinationPort()]
	if c == nil {
		return false
	}
	src, dst := ipAddrs(l[l3:])
	if !t.local.Load().has(src, dst) {
		return false // gVisor drops it: ip_invalid_dst
	}
	if c.addr.IsValid() && !c.addr.IsUnspecified() && c.addr != udpDest(l, l3) {
		return false
	}
	n, ok := udpPayloadLen(p, l3, l4)
	if !ok || udpSegments(p, n) > driver.UDPMaxSegments {
		t.malformed.Add(1)
		p.Release()
		return true
	}
	if t.pcap != nil {
		t.pcap.writeTrain(time.Now(), p, l4+header.UDPMinimumSize, n) // once, whole, as splitUDP
	}
	// __udp_enqueue_schedule_skb: drop the train if the queue already
	// holds more than the receive buffer, else charge it and queue it (so
	// the last one may overshoot, as in the kernel).
	if n := t.charge(p); c.rmem.Load() > c.rcvbuf.Load() {
		c.drops.Add(1)
		p.Release()
	} else {
		c.rmem.Add(n)
		c.segs.Add(int64(max(p.Segs, 1)))
		select {
		case c.ready <- queuedTrain{p: p, truesize: n}:
		default: // the channel is full: trainQueueDatagrams trains
			c.rmem.Add(-n)
			c.segs.Add(-int64(max(p.Segs, 1)))
			c.drops.Add(1)
			p.Release()
		}
	}
	// If Close ran meanwhile, its drain may have missed p: release what
	// is left, nobody will read it. (Each packet leaves the channel once.)
	select {
	case <-c.done:
		for {
			select {
			case q := <-c.ready:
				q.p.Release()
			default:
				return true
			}
		}
	default:
	}
	return true
}

// rxUDP is a received packet's UDP headers (udpHeaders' results), found
// at most once per packet for Deliver's stages that read them (the train
// sockets, the UDP split); the zero value has not looked yet.
type rxUDP struct {
	l3, l4     int
	ok, looked bool
}

// headers returns udpHeaders(p, l2), found on the first call.
func (u *rxUDP) headers(p *bufpool.Packet, l2 int) (l3, l4 int, ok bool) {
	if !u.looked {
		u.l3, u.l4, u.ok = udpHeaders(p, l2)
		u.looked = true
	}
	return u.l3, u.l4, u.ok
}

// charge is what a train is charged in the queue: its truesize.
func (t *trainTable) charge(p *bufpool.Packet) int64 { return int64(t.drv.Truesize(p)) }

// queuedTrain is an entry of a TrainConn's queue: a train, owned by the
// queue, with the truesize it was charged when queued, so that the reader
// gives back exactly that without walking the packet again. The walk at
// dequeue reads the packet's frags, cold by then (the queue holds
// thousands of packets): the cache miss Linux avoids by keeping the
// truesize beside the skb's list pointers (udp_set_dev_scratch at
// __udp_enqueue_schedule_skb, udp_skb_truesize in udp_rmem_release;
// "udp: avoid a cache miss on dequeue").
type queuedTrain struct {
	p        *bufpool.Packet
	truesize int64
}

// copyAfter copies the packet's bytes after skip, and its chain's payload
// (bufpool.Packet.Walk), into b, as far as b reaches, and returns the count.
func copyAfter(b []byte, p *bufpool.Packet, skip int) int {
	n := 0
	for w := p.Walk(skip); n < len(b) && w.Next(); {
		n += copy(b[n:], w.Bytes())
	}
	return n
}
