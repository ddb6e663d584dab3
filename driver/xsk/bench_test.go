package xsk

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/ustack/ustack/internal/testutil"
)

// txMode is what the application does per packet, after the seed's
// xskgen: plain (no metadata touched), fill (-M: metadata written, option
// not set) or request (-m: checksum and timestamp requested).
type txMode int

const (
	modePlain txMode = iota
	modeFill
	modeRequest
	modeRequestCsum // checksum only
	modeRequestTS   // timestamp only
	modeRequestNone // XDP_TX_METADATA with no flag set
)

// txBench is an application loop over a socket: a batch of descriptors
// submitted in a given mode, a Kick, and the completions reaped.
type txBench struct {
	s     *Socket
	descs []Desc // one per frame, cycled through
	next  int
	start uint16
	off   uint16
}

// newTxBench builds a socket over w whose frames all hold a UDP/IPv4
// frame with payload bytes of payload and a pseudo-header checksum.
func newTxBench(t testing.TB, cfg Config, w Wire, payload int) *txBench {
	s := newTestSocket(t, cfg, w)
	f := buildFrame(udp4, payload, 0, false)
	b := &txBench{s: s, start: f.csumStart, off: f.csumOffset}
	for i := range s.UMEM().NumFrames() {
		b.descs = append(b.descs, place(s, i, f.b))
	}
	return b
}

// round submits n descriptors in mode, kicks and reaps n completions. n
// must fit the TX and completion rings, and the socket must have metadata
// unless mode is modePlain.
func (b *txBench) round(mode txMode, n uint32) {
	s := b.s
	got, idx := s.TX().Reserve(n)
	for i := range got {
		d := b.descs[b.next]
		if b.next++; b.next == len(b.descs) {
			b.next = 0
		}
		switch mode {
		case modeFill:
			md := s.UMEM().Metadata(d.Addr)
			md.SetFlags(0)
			md.SetChecksumRequest(0, 0)
		case modeRequest, modeRequestCsum, modeRequestTS, modeRequestNone:
			md := s.UMEM().Metadata(d.Addr)
			md.SetFlags([...]uint64{modeRequest: TxmdChecksum | TxmdTimestamp, modeRequestCsum: TxmdChecksum, modeRequestTS: TxmdTimestamp, modeRequestNone: 0}[mode])
			md.SetChecksumRequest(b.start, b.off)
			d.Options = OptTxMetadata
		}
		*s.TX().Entry(idx + i) = d
	}
	s.TX().Submit(got)
	s.Kick()
	c, _ := s.Completion().Peek(n)
	s.Completion().Release(c)
}

// benchBatch is the descriptors per Kick in the benchmarks and allocation
// test.
const benchBatch = 64

// TestKickNoAllocs pins the steady TX path (submit, Kick with its wire
// write, reap) at zero allocations, with and without metadata.
func TestKickNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		mode txMode
	}{
		{"no-metadata", Config{NumFrames: 256, FrameSize: 2048}, modePlain},
		{"plain", Config{NumFrames: 256, FrameSize: 2048, TxMetadata: true}, modePlain},
		{"fill", Config{NumFrames: 256, FrameSize: 2048, TxMetadata: true}, modeFill},
		{"request-offload", Config{NumFrames: 256, FrameSize: 2048, TxMetadata: true, CsumOffload: true}, modeRequest},
		{"request-sw", Config{NumFrames: 256, FrameSize: 2048, TxMetadata: true}, modeRequest},
		{"request-multibuffer", Config{NumFrames: 256, FrameSize: 2048, TxMetadata: true, MultiBuffer: true}, modeRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := new(discardWire)
			b := newTxBench(t, tc.cfg, w, 1400)
			b.round(tc.mode, benchBatch) // warm up
			if a := testing.AllocsPerRun(100, func() { b.round(tc.mode, benchBatch) }); a != 0 {
				t.Errorf("allocations per round of %d packets: got %v, want 0", benchBatch, a)
			}
			if w.frames != 101*benchBatch+benchBatch {
				t.Errorf("frames written: got %d, want %d", w.frames, 102*benchBatch)
			}
		})
	}
}

// BenchmarkKick measures the application loop plus Kick per packet over a
// wire that discards, for the seed's three modes at 200 and 1400 bytes of
// UDP payload, plus a socket without any metadata reserved (the
// no-metadata path must cost the same as plain), the two requests of -m
// apart, the metadata option with no request (the cost of the metadata
// path itself), and -m with the checksum completed in software. On a
// shared machine compare cpu-ns/packet, the benchmark thread's CPU time.
func BenchmarkKick(b *testing.B) {
	for _, payload := range []int{200, 1400} {
		for _, tc := range []struct {
			name string
			cfg  Config
			mode txMode
		}{
			{"no-metadata", Config{}, modePlain},
			{"plain", Config{TxMetadata: true, CsumOffload: true}, modePlain},
			{"fill-M", Config{TxMetadata: true, CsumOffload: true}, modeFill},
			{"request-m", Config{TxMetadata: true, CsumOffload: true}, modeRequest},
			{"request-csum-only", Config{TxMetadata: true, CsumOffload: true}, modeRequestCsum},
			{"request-ts-only", Config{TxMetadata: true, CsumOffload: true}, modeRequestTS},
			{"request-none", Config{TxMetadata: true, CsumOffload: true}, modeRequestNone},
			{"request-m-sw-csum", Config{TxMetadata: true}, modeRequest},
		} {
			b.Run(fmt.Sprintf("%s/%d", tc.name, payload), func(b *testing.B) {
				tc.cfg.NumFrames = 1024
				bench := newTxBench(b, tc.cfg, new(discardWire), payload)
				b.ReportAllocs()
				b.SetBytes(int64(benchBatch * len(buildFrame(udp4, payload, 0, false).b)))
				// The thread's CPU time too, locked to it: on a shared
				// machine it moves far less with the load than ns/packet.
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				rounds := 0
				cpu0 := threadCPU()
				for b.Loop() {
					bench.round(tc.mode, benchBatch)
					rounds++
				}
				cpu1 := threadCPU()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(rounds*benchBatch), "ns/packet")
				if cpu0 >= 0 && cpu1 >= 0 {
					b.ReportMetric(float64(cpu1-cpu0)/float64(rounds*benchBatch), "cpu-ns/packet")
				}
			})
		}
	}
}

// TestReceiveNoAllocs pins Receive and ReceiveVec, with the application
// recycling the frame through the RX and fill rings, at zero allocations.
func TestReceiveNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	s := newTestSocket(t, Config{NumFrames: 4, FrameSize: 2048, FillSize: 4, RxSize: 4}, new(discardWire))
	got, idx := s.Fill().Reserve(1)
	*s.Fill().Entry(idx) = s.UMEM().FrameAddr(0)
	s.Fill().Submit(got)
	f := buildFrame(udp4, 1400, 1, true).b
	parts := [][]byte{f[:54], f[54:]}
	for _, tc := range []struct {
		name string
		recv func() bool
	}{
		{"Receive", func() bool { return s.Receive(f) }},
		{"ReceiveVec", func() bool { return s.ReceiveVec(parts) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := testing.AllocsPerRun(100, func() {
				if !tc.recv() {
					t.Fatal("dropped")
				}
				n, idx := s.RX().Peek(1)
				d := *s.RX().Entry(idx)
				s.RX().Release(n)
				got, fidx := s.Fill().Reserve(1)
				*s.Fill().Entry(fidx) = d.Addr
				s.Fill().Submit(got)
			})
			if a != 0 {
				t.Errorf("allocations per frame: got %v, want 0", a)
			}
		})
	}
}
