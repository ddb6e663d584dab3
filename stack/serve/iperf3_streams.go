package serve

import (
	"context"
	"encoding/binary"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"
)

// joinTCP reads a new connection's cookie and hands it to the test as a
// stream if the cookie is the test's; a stranger gets ACCESS_DENIED
// (iperf_tcp_accept).
func (t *iperf3Test) joinTCP(c net.Conn, seq int) {
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
	case t.tcpJoin <- tcpJoin{c, seq}:
	case <-t.stop:
		c.Close()
	}
}

// readUDP owns the UDP socket's reads: in CREATE_STREAMS a datagram from a
// new address is a stream's hello and is answered; while the test runs,
// datagrams of receiving streams are counted. It ends when the socket is
// closed.
//
// A hello counts only from the control connection's own address (any
// port): UDP's source is not verified, and a hello is what makes the
// server send (with -R, a stream's worth for the test's duration), so a
// hello from elsewhere could aim the test at a third party. It is dropped
// and counted (iperf3_udp_hellos_rejected). The TCP handshake of the
// control connection is what proves the client's address.
func (t *iperf3Test) readUDP() {
	defer t.wg.Done()
	buf := make([]byte, 65536)
	peers := map[netip.AddrPort]*iperf3Stream{}
	client := addrPortOf(t.ctrl.RemoteAddr()).Addr().Unmap()
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
			if ap.Addr().Unmap() != client {
				t.srv.stats.iperf3HellosRejected.Add(1)
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
