package xsk

import (
	"encoding/binary"
	"slices"
	"sync"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/internal/testutil"
)

// recordWire keeps a copy of every frame written (virtio-net header
// included). fail, when set, is returned by Write instead.
type recordWire struct {
	mu sync.Mutex
	// +checklocks:mu
	frames [][]byte
	// +checklocks:mu
	fail error
}

func (w *recordWire) Write(b []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail != nil {
		return w.fail
	}
	w.frames = append(w.frames, slices.Clone(b))
	return nil
}

func (w *recordWire) take() [][]byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	f := w.frames
	w.frames = nil
	return f
}

// discardWire counts frames and bytes and keeps nothing: the sink of the
// benchmarks and allocation tests. Kick calls Write under its mutex, so
// plain fields suffice.
type discardWire struct{ frames, bytes int }

func (w *discardWire) Write(b []byte) error {
	w.frames++
	w.bytes += len(b)
	return nil
}

// frameKind selects the headers buildFrame writes.
type frameKind int

const (
	udp4 frameKind = iota
	tcp4
	udp6
)

func (k frameKind) String() string { return [...]string{"udp4", "tcp4", "udp6"}[k] }

var (
	testSrcMAC = tcpip.LinkAddress("\x02\x00\x00\x00\x00\x02")
	testDstMAC = tcpip.LinkAddress("\x02\x00\x00\x00\x00\x01")
	testSrc4   = tcpip.AddrFrom4([4]byte{10, 77, 0, 2})
	testDst4   = tcpip.AddrFrom4([4]byte{10, 77, 0, 1})
	testSrc6   = tcpip.AddrFrom16([16]byte{0xfd, 0x77, 15: 2})
	testDst6   = tcpip.AddrFrom16([16]byte{0xfd, 0x77, 15: 1})
)

// builtFrame is a frame from buildFrame with where its L4 checksum lives.
type builtFrame struct {
	b          []byte
	csumStart  uint16 // start of the L4 header
	csumOffset uint16 // checksum field within it
}

// buildFrame returns an Ethernet frame of the given kind with payloadLen
// bytes of payload derived from seq. Its L4 checksum field holds only the
// folded pseudo-header sum (what CHECKSUM_PARTIAL expects) unless full is
// set, in which case it is the correct checksum. The IPv4 header checksum
// is always correct.
func buildFrame(kind frameKind, payloadLen int, seq uint32, full bool) builtFrame {
	payload := make([]byte, payloadLen)
	for i := range payload {
		payload[i] = byte(uint32(i)*7 + seq*13 + 1)
	}
	if len(payload) >= 4 {
		binary.BigEndian.PutUint32(payload, seq)
	}
	f := testutil.Frame{
		SrcMAC: testSrcMAC, DstMAC: testDstMAC, Src: testSrc4, Dst: testDst4,
		Proto: header.UDPProtocolNumber, SrcPort: 40000, DstPort: 5001,
		Payload: payload, Csum: testutil.CsumPartial,
	}
	switch kind {
	case tcp4:
		f.Proto, f.Seq, f.Flags, f.Window = header.TCPProtocolNumber, seq, header.TCPFlagAck, 1000
	case udp6:
		f.Src, f.Dst = testSrc6, testDst6
	}
	if full {
		f.Csum = testutil.CsumFull
	}
	return builtFrame{b: f.Build(), csumStart: uint16(f.L4Off()), csumOffset: uint16(f.CsumOffset())}
}

// newTestSocket returns a socket over w, failing the test on error.
func newTestSocket(t testing.TB, cfg Config, w Wire) *Socket {
	t.Helper()
	s, err := New(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// submit puts descs on the TX ring, failing the test if they do not fit,
// and returns the ring index of the first.
func submit(t testing.TB, s *Socket, descs ...Desc) uint32 {
	t.Helper()
	got, idx := s.TX().Reserve(uint32(len(descs)))
	if int(got) != len(descs) {
		t.Fatalf("TX Reserve(%d): got %d", len(descs), got)
	}
	for i, d := range descs {
		*s.TX().Entry(idx + uint32(i)) = d
	}
	s.TX().Submit(got)
	return idx
}

// reap takes every address on the completion ring.
func reap(s *Socket) []uint64 {
	var out []uint64
	for {
		n, idx := s.Completion().Peek(64)
		if n == 0 {
			return out
		}
		for i := range n {
			out = append(out, *s.Completion().Entry(idx + i))
		}
		s.Completion().Release(n)
	}
}

// counters returns the socket's counters by name.
func counters(s *Socket) map[string]uint64 {
	m := map[string]uint64{}
	s.Stats().Each(func(name string, v uint64) { m[name] = v })
	return m
}

// nonZero lists the non-zero counters, for messages.
func nonZero(s *Socket) map[string]uint64 {
	m := counters(s)
	for k, v := range m {
		if v == 0 {
			delete(m, k)
		}
	}
	return m
}

// place copies frame to frame i's data address and returns the TX
// descriptor for it.
func place(s *Socket, i int, frame []byte) Desc {
	addr := s.UMEM().DataAddr(i)
	copy(s.UMEM().Data(addr, len(frame)), frame)
	return Desc{Addr: addr, Len: uint32(len(frame))}
}
