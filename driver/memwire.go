package driver

import (
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// MemWire is one end of an in-memory Wire pair made by NewMemPair, for
// tests and benchmarks that need no TAP and no root. Frames are copied
// through preallocated buffers, so steady-state Read and Write do not
// allocate. Like every Wire, Read is for one goroutine at a time and Write
// may be called concurrently; MemWire does not look inside frames.
type MemWire struct {
	rx, tx *memQueue // rx: frames for this end; tx: frames for the peer
	pair   *memPair
	// Waiter: Wake's signal; Wait's timer (the reader's).
	kick  chan struct{}
	timer *time.Timer
}

// memPair is the state both ends share: closing either end closes both.
type memPair struct {
	once   sync.Once
	closed chan struct{}
}

// memQueue carries frames in one direction. Its depth buffers, of maxFrame
// bytes each, circulate between free (empty, owned by writers) and full
// (holding a frame, owned by the reader); full never blocks a sender since
// it can hold every buffer.
type memQueue struct {
	free     chan []byte
	full     chan []byte
	ready    chan struct{} // signalled after each frame put on full, for Wait
	maxFrame int
	// dropped counts the frames written to the queue and discarded: the
	// writer's Dropped, the reader's rx_wire_dropped.
	dropped atomic.Uint64
}

func newMemQueue(depth, maxFrame int) *memQueue {
	q := &memQueue{
		free:     make(chan []byte, depth),
		full:     make(chan []byte, depth),
		ready:    make(chan struct{}, 1),
		maxFrame: maxFrame,
	}
	backing := make([]byte, depth*maxFrame)
	for i := range depth {
		q.free <- backing[i*maxFrame : (i+1)*maxFrame : (i+1)*maxFrame]
	}
	return q
}

// Defaults of NewMemPair.
const (
	// memDefaultDepth is the frames a direction queues by default, what
	// the tests' stack pairs (stacktest) use.
	memDefaultDepth = 4096
	// memDefaultFrame is the longest frame by default: a 64 KB GSO
	// super-frame (an IP packet's 65535 bytes) behind an Ethernet header
	// with a VLAN tag and the virtio-net header, what a stack with
	// offloads sends.
	memDefaultFrame = VirtioNetHdrLen + maxLROFrame
)

// NewMemPair returns two connected in-memory wires: frames written to one
// are read from the other, in order for any one writer. depth is the number
// of frames each direction can queue; a Write to a full queue drops the
// frame (counted in the writer's Dropped) rather than blocking. Frames
// longer than maxFrame bytes (the virtio-net header included) are dropped
// and counted the same way. A depth or maxFrame of 0 or less takes the
// default: 4096 frames of up to VirtioNetHdrLen+65535+18 bytes, enough for
// a stack's GSO super-frames. Each direction allocates depth*maxFrame
// bytes (256 MiB with the defaults), of which the frames written touch
// their length's pages. Each end reports maxFrame (MaxFrame), so that
// stack.New refuses a wire too short for the stack's frames.
func NewMemPair(depth, maxFrame int) (*MemWire, *MemWire) {
	if depth <= 0 {
		depth = memDefaultDepth
	}
	if maxFrame <= 0 {
		maxFrame = memDefaultFrame
	}
	p := &memPair{closed: make(chan struct{})}
	ab, ba := newMemQueue(depth, maxFrame), newMemQueue(depth, maxFrame)
	return &MemWire{rx: ba, tx: ab, pair: p, kick: make(chan struct{}, 1)},
		&MemWire{rx: ab, tx: ba, pair: p, kick: make(chan struct{}, 1)}
}

// Read copies the oldest queued frame into b, truncating it to len(b), and
// returns its length. If none is queued it returns ErrNoFrame when block
// is false and otherwise waits for a frame or for Close. Once either end
// is closed it returns os.ErrClosed, even with frames still queued.
func (w *MemWire) Read(b []byte, block bool) (int, error) {
	buf, err := w.next(block)
	if err != nil {
		return 0, err
	}
	n := copy(b, buf)
	w.rx.free <- buf[:cap(buf)]
	return n, nil
}

// next takes the oldest queued frame, waiting for one if block is set;
// the caller returns it to w.rx.free.
func (w *MemWire) next(block bool) ([]byte, error) {
	if w.isClosed() {
		return nil, os.ErrClosed
	}
	select {
	case buf := <-w.rx.full:
		return buf, nil
	default:
		if !block {
			return nil, ErrNoFrame
		}
		select {
		case buf := <-w.rx.full:
			return buf, nil
		case <-w.pair.closed:
			return nil, os.ErrClosed
		}
	}
}

// Wait returns when a frame is queued, after timeout (negative: none), at
// Wake, or at Close (os.ErrClosed) (Waiter). It takes no frame: a busy
// reader may read the wire while the NIC model waits. For the reader only.
func (w *MemWire) Wait(timeout time.Duration) error {
	if w.isClosed() {
		return os.ErrClosed
	}
	// A signal left from frames already read would end this wait for
	// nothing: drop it, then look (a frame queued after the look signals
	// again).
	select {
	case <-w.rx.ready:
	default:
	}
	if len(w.rx.full) > 0 {
		return nil
	}
	var tc <-chan time.Time
	if timeout >= 0 {
		if w.timer == nil {
			w.timer = time.NewTimer(timeout)
		} else {
			w.timer.Reset(timeout)
		}
		defer w.timer.Stop()
		tc = w.timer.C
	}
	select {
	case <-w.rx.ready: // a frame was queued since the last look, maybe this one
	case <-w.kick:
	case <-tc:
	case <-w.pair.closed:
		return os.ErrClosed
	}
	return nil
}

// Wake makes a Wait in progress, or the next one, return (Waiter).
func (w *MemWire) Wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// ReadVec is Read over the concatenation of iov's buffers (VecReader).
func (w *MemWire) ReadVec(iov [][]byte, block bool) (int, error) {
	buf, err := w.next(block)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, b := range iov {
		n += copy(b, buf[n:])
	}
	w.rx.free <- buf[:cap(buf)]
	return n, nil
}

// Write queues a copy of b for the peer. A frame longer than maxFrame, or
// one that finds the queue full, is dropped and counted in Dropped; Write
// then still returns nil, as a link that loses a frame does. Once either
// end is closed it returns os.ErrClosed.
func (w *MemWire) Write(b []byte) error {
	if w.isClosed() {
		return os.ErrClosed
	}
	if len(b) > w.tx.maxFrame {
		w.tx.dropped.Add(1)
		return nil
	}
	select {
	case buf := <-w.tx.free:
		w.tx.full <- buf[:copy(buf, b)]
		select {
		case w.tx.ready <- struct{}{}:
		default:
		}
		return nil
	default:
		w.tx.dropped.Add(1)
		return nil
	}
}

// Close closes the pair: both ends' Reads, including blocked ones, and
// Writes return os.ErrClosed from then on. Close is idempotent and always
// returns nil.
func (w *MemWire) Close() error {
	w.pair.once.Do(func() { close(w.pair.closed) })
	return nil
}

// Dropped returns the number of frames this end's Write has dropped
// because the peer's queue was full or the frame too long.
func (w *MemWire) Dropped() uint64 { return w.tx.dropped.Load() }

// MaxFrame returns the longest frame the wire carries, its virtio-net
// header included: NewMemPair's maxFrame. Longer frames are dropped.
func (w *MemWire) MaxFrame() int { return w.tx.maxFrame }

// EachCounter calls fn with the wire's drops, as a stack on this end
// reports them among its counters: tx_wire_dropped, the frames this end
// wrote and the wire dropped (Dropped), and rx_wire_dropped, the frames
// the peer wrote to this end and the wire dropped (the peer's Dropped),
// because this end's queue was full or a frame longer than MaxFrame.
func (w *MemWire) EachCounter(fn func(name string, v uint64)) {
	fn("rx_wire_dropped", w.rx.dropped.Load())
	fn("tx_wire_dropped", w.tx.dropped.Load())
}

func (w *MemWire) isClosed() bool {
	select {
	case <-w.pair.closed:
		return true
	default:
		return false
	}
}
