package xsk

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
)

// seqWire records the sequence number in every frame written (the first
// four payload bytes of a buildFrame UDP/IPv4 frame) and verifies the
// checksum of frames whose fifth payload byte is 1 (those that requested
// one).
type seqWire struct {
	mu sync.Mutex
	// +checklocks:mu
	seqs []uint32
	// +checklocks:mu
	err error
}

const payloadOff = 14 + 20 + 8 // Ethernet, IPv4, UDP

func (w *seqWire) Write(b []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	frame := b[vnetHdrLen:]
	w.seqs = append(w.seqs, binary.BigEndian.Uint32(frame[payloadOff:]))
	if frame[payloadOff+4] == 1 && w.err == nil {
		var fi driver.FrameInfo
		if driver.ParseFrame(frame, &fi) != driver.DropNone || driver.VerifyChecksums(frame, &fi, true) != driver.DropNone {
			w.err = fmt.Errorf("frame %d: bad checksum", binary.BigEndian.Uint32(frame[payloadOff:]))
		}
	}
	return nil
}

// TestConcurrentKick runs an application goroutine that submits frames
// and reaps completions while two goroutines call Kick: every frame goes
// out once, in submission order, every address is completed once per
// submission, and a requested timestamp is there (and non-decreasing) as
// soon as its completion is visible. Run it under -race.
func TestConcurrentKick(t *testing.T) {
	const (
		total     = 30000
		numFrames = 128
		fs        = 2048
	)
	w := new(seqWire)
	s := newTestSocket(t, Config{NumFrames: numFrames, FrameSize: fs, TxMetadata: true, TxSize: 64, CompSize: 32,
		ringStart: math.MaxUint32 - 1000}, w)
	u := s.UMEM()
	template := buildFrame(udp4, 64, 0, false)
	for i := range numFrames {
		place(s, i, template.b)
	}

	var done atomic.Bool
	var wg sync.WaitGroup
	kickErr := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				if _, err := s.Kick(); err != nil {
					kickErr <- err
					return
				}
			}
		}()
	}

	var (
		free      []int
		requested [numFrames]bool
		busy      [numFrames]bool
		lastTS    uint64
		next      uint32
		completed int
		appErr    error
	)
	for i := range numFrames {
		free = append(free, i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	deadline := time.Now().Add(60 * time.Second)
	for completed < total && appErr == nil {
		if time.Now().After(deadline) {
			appErr = fmt.Errorf("timed out: %d of %d completed; counters %v", completed, total, nonZero(s))
			break
		}
		// Reap.
		n, idx := s.Completion().Peek(32)
		for i := range n {
			addr := *s.Completion().Entry(idx + i)
			f := int(addr / fs)
			if addr != u.DataAddr(f) || !busy[f] {
				appErr = fmt.Errorf("completion of address %d, frame %d not in flight", addr, f)
				break
			}
			busy[f] = false
			if requested[f] {
				ts := u.Metadata(addr).TxTimestamp()
				if ts < lastTS || ts > s.Now() {
					appErr = fmt.Errorf("frame %d: timestamp %d, previous %d", f, ts, lastTS)
				}
				lastTS = ts
			}
			free = append(free, f)
			completed++
		}
		s.Completion().Release(n)
		// Submit a batch of random size.
		k := min(uint32(1+rng.IntN(24)), uint32(len(free)), uint32(total)-next)
		if k == 0 {
			continue
		}
		got, tidx := s.TX().Reserve(k)
		for i := range got {
			f := free[len(free)-1]
			free = free[:len(free)-1]
			busy[f] = true
			addr := u.DataAddr(f)
			data := u.Data(addr, len(template.b))
			binary.BigEndian.PutUint32(data[payloadOff:], next)
			d := Desc{Addr: addr, Len: uint32(len(template.b))}
			requested[f] = next%3 == 0
			if requested[f] {
				data[payloadOff+4] = 1
				d.Options = OptTxMetadata
				md := u.Metadata(addr)
				md.SetFlags(TxmdTimestamp | TxmdChecksum)
				md.SetChecksumRequest(template.csumStart, template.csumOffset)
			} else {
				data[payloadOff+4] = 0
			}
			*s.TX().Entry(tidx + i) = d
			next++
		}
		s.TX().Submit(got)
	}
	done.Store(true)
	wg.Wait()
	close(kickErr)
	for err := range kickErr {
		t.Errorf("Kick: %v", err)
	}
	if appErr != nil {
		t.Fatal(appErr)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		t.Error(w.err)
	}
	if len(w.seqs) != total {
		t.Fatalf("frames written: got %d, want %d", len(w.seqs), total)
	}
	for i, seq := range w.seqs {
		if seq != uint32(i) {
			t.Fatalf("frame %d written has sequence number %d", i, seq)
		}
	}
	if c := counters(s); c["tx_packets"] != total || c["tx_timestamps"] != (total+2)/3 || c["tx_csum_sw"] != (total+2)/3 {
		t.Errorf("counters %v", nonZero(s))
	}
}

// TestConcurrentReceive has two goroutines Receive frames (one whole, one
// in parts through ReceiveVec) while the application refills the fill ring
// and consumes the RX ring, with ring indexes wrapping around 2^32: every
// frame is delivered intact at most once, or counted as dropped.
func TestConcurrentReceive(t *testing.T) {
	const (
		perSender = 5000
		numFrames = 64
	)
	s := newTestSocket(t, Config{NumFrames: numFrames, FrameSize: 2048, Headroom: 64, FillSize: 32, RxSize: 32,
		ringStart: math.MaxUint32 - 50}, new(discardWire))
	u := s.UMEM()
	var free []uint64
	for i := range numFrames {
		free = append(free, u.FrameAddr(i))
	}
	var wg sync.WaitGroup
	var sendersDone atomic.Int32
	var attempts atomic.Uint64
	deadline := time.Now().Add(10 * time.Second)
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer sendersDone.Add(1)
			parts := make([][]byte, 3)
			for i := range perSender {
				f := buildFrame(udp4, 20+i%100, uint32(g*perSender+i), true).b
				// The poll loop's way for one sender: a linear part
				// and frags.
				parts[0], parts[1], parts[2] = f[:14], f[14:40], f[40:]
				// Retried until it gets through (the indexes must
				// wrap), each failed try counted as a drop; a few
				// seconds at most in all.
				for time.Now().Before(deadline) {
					attempts.Add(1)
					var ok bool
					if g == 0 {
						ok = s.Receive(f)
					} else {
						ok = s.ReceiveVec(parts)
					}
					if ok {
						break
					}
					runtime.Gosched()
				}
			}
		}()
	}
	seen := map[uint32]bool{}
	var bad error
	for sendersDone.Load() < 2 || s.RX().Avail(1) > 0 {
		if k := min(uint32(len(free)), s.Fill().Free(uint32(len(free)))); k > 0 {
			got, idx := s.Fill().Reserve(k)
			for i := range got {
				*s.Fill().Entry(idx + i) = free[len(free)-1]
				free = free[:len(free)-1]
			}
			s.Fill().Submit(got)
		}
		n, idx := s.RX().Peek(16)
		for i := range n {
			d := *s.RX().Entry(idx + i)
			frame := u.Data(d.Addr, int(d.Len))
			seq := binary.BigEndian.Uint32(frame[payloadOff:])
			want := buildFrame(udp4, 20+int(seq%perSender)%100, seq, true).b
			if seen[seq] || string(frame) != string(want) {
				if bad == nil {
					bad = fmt.Errorf("frame %d: duplicate %v or corrupt", seq, seen[seq])
				}
			}
			seen[seq] = true
			free = append(free, d.Addr&^uint64(u.FrameSize()-1))
		}
		s.RX().Release(n)
	}
	wg.Wait()
	if bad != nil {
		t.Fatal(bad)
	}
	c := counters(s)
	if got := c["rx_packets"] + c["rx_dropped"] + c["rx_ring_full"]; got != attempts.Load() || c["rx_packets"] != uint64(len(seen)) {
		t.Errorf("delivered %d, counters %v; want %d attempts accounted for", len(seen), nonZero(s), attempts.Load())
	}
	// All of them, so the RX and fill ring indexes (from 2^32-51) wrapped.
	if len(seen) != 2*perSender {
		t.Errorf("%d frames delivered, want %d", len(seen), 2*perSender)
	}
}
