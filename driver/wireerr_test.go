package driver

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// errTestWire is what failingWire's Read returns once told to fail.
var errTestWire = errors.New("test: wire read failed")

// failingWire is a MemWire whose Read fails, with errTestWire, from the
// first frame after fail is set: a TAP whose device went away.
type failingWire struct {
	*MemWire
	fail atomic.Bool
}

func (w *failingWire) Read(b []byte, block bool) (int, error) {
	n, err := w.MemWire.Read(b, block)
	if err == nil && w.fail.Load() {
		return 0, errTestWire
	}
	return n, err
}

// syncBuf is a bytes.Buffer for a log handler written from the NIC
// goroutine and read by the test.
type syncBuf struct {
	mu sync.Mutex
	// +checklocks:mu
	b bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWireReadError checks that a failed wire read, which ends the NIC
// goroutine, does not go unnoticed: it is counted (rx_wire_errors), logged
// once, closes Done and is returned by Err and by Close. A clean Close
// closes Done with Err nil.
func TestWireReadError(t *testing.T) {
	var logs syncBuf
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	a, peer := NewMemPair(16, VirtioNetHdrLen+maxLROFrame)
	w := &failingWire{MemWire: a}
	pool := testutil.NewPool(t, bufpool.Config{Poison: true})
	var cfg Config
	copy(cfg.MAC[:], pkDstMAC)
	cfg.Pool = pool
	d, err := New(w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	d.Start(c)
	t.Cleanup(func() {
		d.Close()
		peer.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("pages in use after Close: got %d, want 0", n)
		}
	})
	frame := wireFrame(VirtioNetHdr{}, (&pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(100)}).build())
	if err := peer.Write(frame); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, 1)
	if err := d.Err(); err != nil {
		t.Errorf("Err while receiving: %v, want nil", err)
	}
	select {
	case <-d.Done():
		t.Fatal("Done closed while receiving")
	default:
	}

	w.fail.Store(true)
	if err := peer.Write(frame); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Done not closed 30 s after the wire read failed")
	}
	if err := d.Err(); !errors.Is(err, errTestWire) {
		t.Errorf("Err: got %v, want %v", err, errTestWire)
	}
	counters := map[string]uint64{}
	d.Stats().Each(func(name string, v uint64) { counters[name] = v })
	if got := counters["rx_wire_errors"]; got != 1 {
		t.Errorf("rx_wire_errors: got %d, want 1", got)
	}
	if got := strings.Count(logs.String(), errTestWire.Error()); got != 1 {
		t.Errorf("log records naming the error: got %d, want 1; log:\n%s", got, logs.String())
	}
	if err := d.Close(); !errors.Is(err, errTestWire) {
		t.Errorf("Close: got %v, want %v", err, errTestWire)
	}
}

// TestDoneAfterClose checks that a clean Close, started or not, closes
// Done and leaves Err nil and rx_wire_errors zero.
func TestDoneAfterClose(t *testing.T) {
	for _, start := range []bool{true, false} {
		a, peer := NewMemPair(4, VirtioNetHdrLen+maxLROFrame)
		pool := testutil.NewPool(t, bufpool.Config{})
		cfg := Config{Pool: pool}
		d, err := New(a, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if start {
			d.Start(&collector{})
		}
		if err := d.Close(); err != nil {
			t.Errorf("start %v: Close: %v", start, err)
		}
		peer.Close()
		select {
		case <-d.Done():
		default:
			t.Errorf("start %v: Done not closed after Close", start)
		}
		if err := d.Err(); err != nil {
			t.Errorf("start %v: Err after Close: %v, want nil", start, err)
		}
		if n := d.Stats().WireErrors.Load(); n != 0 {
			t.Errorf("start %v: rx_wire_errors after Close: got %d, want 0", start, n)
		}
	}
}
