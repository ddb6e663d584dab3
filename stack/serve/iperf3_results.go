package serve

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"time"
)

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
	return s.retrans.Retransmits()
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
